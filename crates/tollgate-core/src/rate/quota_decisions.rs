//! [`QuotaDecisions`]: a decision's per-quota figures, held inline for the
//! common single quota so that a decision costs no allocation (issue #15).

use std::fmt;
use std::ops::{Deref, DerefMut};

use super::QuotaDecision;

/// Every quota's part of a [`Decision`](super::Decision), in configuration
/// order. Reads as a slice (`len`, indexing, `iter`, `iter_mut`, `for q in
/// &d.quotas`); one quota is held inline, several in a `Vec`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tollgate::Error> {
/// use tollgate::{MemoryBackend, Quota, RateLimiter};
///
/// let limiter = RateLimiter::gcra(MemoryBackend::new(), Quota::per_second(5))?;
/// let d = limiter.check("alice").await?;
/// assert_eq!(d.quotas.len(), 1);
/// assert_eq!(d.quotas[0].remaining, 4);
/// let as_vec: Vec<_> = d.quotas.into_iter().collect();
/// assert_eq!(as_vec.len(), 1);
/// # Ok(()) }
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct QuotaDecisions(Repr);

#[derive(Clone, PartialEq, Eq)]
enum Repr {
    One(QuotaDecision),
    Many(Vec<QuotaDecision>),
}

impl QuotaDecisions {
    /// The figures as a `Vec` (allocates for a single quota).
    pub fn into_vec(self) -> Vec<QuotaDecision> {
        match self.0 {
            Repr::One(q) => vec![q],
            Repr::Many(v) => v,
        }
    }
}

impl From<Vec<QuotaDecision>> for QuotaDecisions {
    fn from(mut v: Vec<QuotaDecision>) -> Self {
        match v.len() {
            1 => QuotaDecisions(Repr::One(v.pop().expect("one element"))),
            _ => QuotaDecisions(Repr::Many(v)),
        }
    }
}

impl FromIterator<QuotaDecision> for QuotaDecisions {
    #[inline]
    fn from_iter<I: IntoIterator<Item = QuotaDecision>>(iter: I) -> Self {
        let mut iter = iter.into_iter();
        let Some(first) = iter.next() else {
            return QuotaDecisions(Repr::Many(Vec::new()));
        };
        match iter.next() {
            None => QuotaDecisions(Repr::One(first)),
            Some(second) => {
                let mut v = Vec::with_capacity(2 + iter.size_hint().0);
                v.push(first);
                v.push(second);
                v.extend(iter);
                QuotaDecisions(Repr::Many(v))
            }
        }
    }
}

impl Deref for QuotaDecisions {
    type Target = [QuotaDecision];

    fn deref(&self) -> &[QuotaDecision] {
        match &self.0 {
            Repr::One(q) => std::slice::from_ref(q),
            Repr::Many(v) => v,
        }
    }
}

impl DerefMut for QuotaDecisions {
    fn deref_mut(&mut self) -> &mut [QuotaDecision] {
        match &mut self.0 {
            Repr::One(q) => std::slice::from_mut(q),
            Repr::Many(v) => v,
        }
    }
}

impl<'a> IntoIterator for &'a QuotaDecisions {
    type Item = &'a QuotaDecision;
    type IntoIter = std::slice::Iter<'a, QuotaDecision>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl<'a> IntoIterator for &'a mut QuotaDecisions {
    type Item = &'a mut QuotaDecision;
    type IntoIter = std::slice::IterMut<'a, QuotaDecision>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter_mut()
    }
}

impl IntoIterator for QuotaDecisions {
    type Item = QuotaDecision;
    type IntoIter = std::vec::IntoIter<QuotaDecision>;

    fn into_iter(self) -> Self::IntoIter {
        self.into_vec().into_iter()
    }
}

impl PartialEq<[QuotaDecision]> for QuotaDecisions {
    fn eq(&self, other: &[QuotaDecision]) -> bool {
        **self == *other
    }
}

impl PartialEq<Vec<QuotaDecision>> for QuotaDecisions {
    fn eq(&self, other: &Vec<QuotaDecision>) -> bool {
        **self == other[..]
    }
}

impl fmt::Debug for QuotaDecisions {
    // As the `Vec` it replaces printed: a list.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::Quota;

    fn qd(remaining: u64) -> QuotaDecision {
        QuotaDecision {
            quota: Quota::per_second(10),
            allowed: true,
            limit: 10,
            remaining,
            reset_after: Duration::ZERO,
            retry_after: None,
            next_after: Duration::ZERO,
        }
    }

    /// One, several or none: the same slice, the same equality and the same
    /// debug text as a `Vec`, whichever way it was made.
    #[test]
    fn reads_as_the_vec_it_replaces() {
        for n in 0..4u64 {
            let v: Vec<_> = (0..n).map(qd).collect();
            let collected: QuotaDecisions = (0..n).map(qd).collect();
            let from = QuotaDecisions::from(v.clone());
            assert_eq!(collected, from);
            assert_eq!(&collected[..], &v[..]);
            assert_eq!(collected, v);
            assert_eq!(format!("{collected:?}"), format!("{v:?}"));
            let mut m = from.clone();
            for q in &mut m {
                q.remaining += 1;
            }
            assert_eq!(
                m.iter().map(|q| q.remaining).collect::<Vec<_>>(),
                (1..=n).collect::<Vec<_>>()
            );
            assert_eq!(from.into_vec(), v);
        }
    }
}
