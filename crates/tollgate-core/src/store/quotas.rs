//! [`Quotas`]: a request's quotas, inline when there is one.

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use crate::quota::Quota;

/// The quotas of a [`RateRequest`](super::RateRequest), read as a slice. One quota (the
/// common case) is held inline, so that making and dropping a request
/// touches no reference count; several are shared with the limiter.
///
/// ```
/// use tollgate::store::Quotas;
/// use tollgate::Quota;
///
/// let one = Quotas::from(vec![Quota::per_second(5)]);
/// assert_eq!(one.len(), 1);
/// assert_eq!(one[0], Quota::per_second(5));
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Quotas(Repr);

#[derive(Clone, PartialEq, Eq)]
enum Repr {
    One([Quota; 1]),
    Shared(Arc<[Quota]>),
}

impl Quotas {
    /// The quotas of `shared`: copied when there is one, else shared.
    #[inline]
    pub fn of(shared: &Arc<[Quota]>) -> Self {
        match &shared[..] {
            [only] => Quotas(Repr::One([*only])),
            _ => Quotas(Repr::Shared(Arc::clone(shared))),
        }
    }
}

impl Deref for Quotas {
    type Target = [Quota];

    #[inline]
    fn deref(&self) -> &[Quota] {
        match &self.0 {
            Repr::One(one) => one,
            Repr::Shared(all) => all,
        }
    }
}

impl From<Vec<Quota>> for Quotas {
    fn from(all: Vec<Quota>) -> Self {
        match all[..] {
            [only] => Quotas(Repr::One([only])),
            _ => Quotas(Repr::Shared(Arc::from(all))),
        }
    }
}

impl fmt::Debug for Quotas {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_is_inline_and_several_are_shared() {
        let one: Arc<[Quota]> = Arc::from([Quota::per_second(1)]);
        assert!(matches!(Quotas::of(&one).0, Repr::One(_)));
        assert_eq!(&Quotas::of(&one)[..], &one[..]);
        let two: Arc<[Quota]> = Arc::from([Quota::per_second(1), Quota::per_minute(10)]);
        let q = Quotas::of(&two);
        assert!(matches!(&q.0, Repr::Shared(a) if Arc::ptr_eq(a, &two)));
        assert_eq!(&q[..], &two[..]);
        assert!(Quotas::from(Vec::new()).is_empty());
        assert!(matches!(
            Quotas::from(vec![Quota::per_second(1)]).0,
            Repr::One(_)
        ));
    }
}
