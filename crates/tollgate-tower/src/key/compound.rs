//! Compound keys: [`Or`] and tuples of extractors.

use http::request::Parts;
use tollgate_core::Subject;

use super::{KeyError, KeyExtractor};

/// The first of two extractors that yields a key: `a`, or `b` when `a`
/// says "not limited". Errors of `a` are not masked.
///
/// ```
/// use http::Request;
/// use tollgate::Subject;
/// use tollgate::tower::key::{GlobalKey, HeaderKey, KeyExtractor, Or};
///
/// let key = Or::new(HeaderKey::new("x-tenant").plain().optional(), GlobalKey);
/// let req = Request::get("/").body(()).unwrap().into_parts().0;
/// assert_eq!(key.extract(&req).unwrap(), Some(Subject::new("global")));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Or<A, B> {
    first: A,
    second: B,
}

impl<A, B> Or<A, B> {
    /// `first`, falling back to `second`.
    pub fn new(first: A, second: B) -> Self {
        Or { first, second }
    }

    /// Falls back further to `other`.
    pub fn or<O>(self, other: O) -> Or<Self, O> {
        Or::new(self, other)
    }
}

impl<A, B> KeyExtractor for Or<A, B>
where
    A: KeyExtractor,
    B: KeyExtractor,
{
    fn extract(&self, req: &Parts) -> Result<Option<Subject>, KeyError> {
        match self.first.extract(req)? {
            Some(s) => Ok(Some(s)),
            None => self.second.extract(req),
        }
    }
}

macro_rules! tuple_key {
    ($($name:ident),+) => {
        /// A compound key: all parts must yield a key (a part that says "not
        /// limited" makes the whole request not limited); the parts are
        /// combined with [`Subject::compound`], so no two splits collide.
        impl<$($name),+> KeyExtractor for ($($name,)+)
        where
            $($name: KeyExtractor,)+
        {
            #[allow(non_snake_case)]
            fn extract(&self, req: &Parts) -> Result<Option<Subject>, KeyError> {
                let ($($name,)+) = self;
                $(
                    let Some($name) = $name.extract(req)? else { return Ok(None) };
                )+
                Ok(Some(Subject::compound([$($name.as_encoded()),+])))
            }
        }
    };
}

tuple_key!(A, B);
tuple_key!(A, B, C);
tuple_key!(A, B, C, D);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::*;

    #[test]
    fn compound_keys() {
        let req = req_from("192.0.2.1:1", &[("x-user", "alice")]);
        let k = (HeaderKey::new("x-user").plain(), RouteKey::new());
        assert_eq!(
            key(&k, &req),
            Subject::compound([Subject::new("alice").as_encoded(), "/"])
        );
        let k3 = (GlobalKey, PeerIp::new(), RouteKey::new());
        assert_eq!(
            key(&k3, &req),
            Subject::compound(["global", "192.0.2.1", "/"])
        );
        // A part that is not limited makes the whole not limited.
        let k = (HeaderKey::new("x-missing").optional(), RouteKey::new());
        assert_eq!(k.extract(&req).unwrap(), None);
        // Errors propagate.
        let k = (HeaderKey::new("x-missing"), RouteKey::new());
        assert!(k.extract(&req).is_err());
    }
}
