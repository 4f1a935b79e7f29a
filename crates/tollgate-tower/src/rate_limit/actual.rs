//! [`ResponseCost`]: what a request really cost, read from its response, so
//! that a reserved estimate can be settled to it.

use http::header::HeaderName;
use http::response::Parts;

/// The actual cost of a request, read from the head of its response: a
/// layer that reserved an estimate settles the charge to it (see
/// [`RateLimiter::settle`](tollgate_core::RateLimiter::settle)). `None`
/// leaves the estimate as it was reserved.
///
/// Implemented by [`CostHeader`] (a response header holding a decimal
/// count), [`CostExtension`] (an [`ActualCost`] the handler put in the
/// response's extensions) and closures `Fn(&Parts) -> Option<u64>`:
///
/// ```
/// use http::{response::Parts, Response};
/// use tollgate::tower::rate_limit::{ActualCost, CostExtension, CostHeader, ResponseCost};
///
/// let (res, ()) = Response::builder()
///     .header("x-tokens-used", "412")
///     .extension(ActualCost(40))
///     .body(())
///     .unwrap()
///     .into_parts();
/// assert_eq!(CostHeader::new("x-tokens-used").actual_cost(&res), Some(412));
/// assert_eq!(CostExtension.actual_cost(&res), Some(40));
/// let halved = |res: &Parts| CostExtension.actual_cost(res).map(|c| c / 2);
/// assert_eq!(halved.actual_cost(&res), Some(20));
/// ```
pub trait ResponseCost: Clone + Send + Sync + 'static {
    /// The cost of the request whose response has head `res`, if it says.
    fn actual_cost(&self, res: &Parts) -> Option<u64>;
}

impl<F> ResponseCost for F
where
    F: Fn(&Parts) -> Option<u64> + Clone + Send + Sync + 'static,
{
    fn actual_cost(&self, res: &Parts) -> Option<u64> {
        self(res)
    }
}

/// A request's actual cost, set by the handler in its response's
/// extensions; read by [`CostExtension`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ActualCost(pub u64);

/// Reads the [`ActualCost`] in the response's extensions.
#[derive(Debug, Clone, Copy, Default)]
pub struct CostExtension;

impl ResponseCost for CostExtension {
    fn actual_cost(&self, res: &Parts) -> Option<u64> {
        res.extensions.get::<ActualCost>().map(|c| c.0)
    }
}

/// Reads the actual cost from a response header holding a decimal count
/// (e.g. an upstream's `x-tokens-used`); a missing or malformed value says
/// nothing.
#[derive(Debug, Clone)]
pub struct CostHeader(HeaderName);

impl CostHeader {
    /// Reads the header `name`, in any case (`X-Tokens-Used` is
    /// `x-tokens-used`), as [`HeaderKey::new`](crate::key::HeaderKey::new)
    /// takes one.
    ///
    /// # Panics
    ///
    /// When `name` is not a valid header name (a programming error, as
    /// with `http`'s own constructors).
    ///
    /// ```
    /// use tollgate::tower::rate_limit::CostHeader;
    ///
    /// let _ = CostHeader::new("X-Tokens-Used");
    /// ```
    pub fn new(name: &str) -> Self {
        let header = HeaderName::from_bytes(name.as_bytes())
            .unwrap_or_else(|_| panic!("tollgate: {name:?} is not a valid header name"));
        CostHeader(header)
    }

    /// Reads the header `name`.
    pub fn from_name(name: HeaderName) -> Self {
        CostHeader(name)
    }
}

impl ResponseCost for CostHeader {
    fn actual_cost(&self, res: &Parts) -> Option<u64> {
        decimal(res.headers.get(&self.0)?.to_str().ok()?)
    }
}

/// A non-negative integer in plain digits, as a header states a count or a
/// number of seconds (`u64::from_str` would also take a leading `+`).
pub(crate) fn decimal(v: &str) -> Option<u64> {
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    v.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(value: &str) -> Parts {
        let res = http::Response::builder()
            .header("x-cost", value)
            .body(())
            .unwrap();
        res.into_parts().0
    }

    #[test]
    fn a_header_says_a_cost_only_in_plain_digits() {
        let h = CostHeader::new("x-cost");
        assert_eq!(h.actual_cost(&head("0")), Some(0));
        assert_eq!(h.actual_cost(&head("18446744073709551615")), Some(u64::MAX));
        for bad in ["", "+5", "-1", "1.5", " 7", "18446744073709551616", "ten"] {
            assert_eq!(h.actual_cost(&head(bad)), None, "{bad:?}");
        }
        let none = http::Response::new(()).into_parts().0;
        assert_eq!(h.actual_cost(&none), None);
        assert_eq!(CostExtension.actual_cost(&none), None);
    }
}
