//! Lean batches: many checks of one limiter (one algorithm, one quota, no
//! wait) in one call of its lean script (`lua/rate_lean.lua`), which sends
//! back one figure per check — the script's decision and the state it was
//! decided from. The figures a single call replies (remaining, reset,
//! retry, next) are derived here from that state and the quota, with the
//! very arithmetic of the algorithm's script (in doubles, as Lua computes),
//! so they are the same; the decision itself is the script's, never
//! derived here.

use std::time::Duration;

use redis::{Cmd, Value};

use crate::error::{Error, Result};
use crate::store::{Algorithm, Outcome, RateReply, RateRequest};

/// States a lean reply carries exactly: the scripts read no stored state
/// 2^52 or more from zero, and reply twice the state (plus one for an
/// admission), below 2^53 where a Lua number is an exact integer.
const STATE_BOUND: i64 = 1 << 52;

/// The most checks in one lean call (Lua's `unpack` returns at most about
/// 8000 values); more go to the batch script.
pub(crate) const MAX_CHECKS: usize = 4000;

/// What checks must share to go in one lean call: the algorithm, the
/// quota's two parameters, how many keys each has (a block key or not) and
/// their time (`None`: the server's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LeanGroup {
    algorithm: Algorithm,
    first: u64,
    ticks: u64,
    per: u64,
    keys: usize,
    now: Option<u64>,
}

impl LeanGroup {
    /// The lean batch `request` can join, if any: GCRA, token bucket or
    /// fixed window, one quota, no wait for a slot.
    pub(crate) fn of(request: &RateRequest) -> Option<LeanGroup> {
        let algorithm = request.algorithm;
        let [quota] = &request.quotas[..] else {
            return None;
        };
        let lean = match algorithm {
            Algorithm::Gcra | Algorithm::TokenBucket => request.max_wait_micros == 0,
            // The windows ignore the wait.
            Algorithm::FixedWindow => true,
            _ => false,
        };
        if !lean || !(1..=2).contains(&request.keys.len()) {
            return None;
        }
        let (first, interval) = algorithm.params(quota);
        Some(LeanGroup {
            algorithm,
            first,
            ticks: interval.ticks,
            per: interval.per_micro,
            keys: request.keys.len(),
            now: request.now_micros,
        })
    }

    /// The call's arguments after `EVALSHA sha`: its keys, then its `ARGV`
    /// (see `lua/rate_lean.lua`). `deadlines`: each check's, on the
    /// server's clock.
    pub(crate) fn fill(&self, cmd: &mut Cmd, requests: &[RateRequest], deadlines: &[Option<u64>]) {
        // Checks of one subject (a hot one fills a batch) send its keys once.
        let one = match requests {
            [first, rest @ ..] => rest.iter().all(|r| r.keys == first.keys),
            [] => false,
        };
        if one {
            cmd.arg(self.keys);
            for key in &requests[0].keys {
                cmd.arg(key.as_str());
            }
        } else {
            cmd.arg(requests.len() * self.keys);
            // Every check's key, then every check's block key.
            for at in 0..self.keys {
                for r in requests {
                    cmd.arg(r.keys[at].as_str());
                }
            }
        }
        match self.now {
            Some(now) => cmd.arg(now),
            None => cmd.arg(""),
        };
        cmd.arg(self.first);
        if self.per == 1 {
            cmd.arg(self.ticks);
        } else {
            cmd.arg(format!("{}/{}", self.ticks, self.per));
        }
        cmd.arg(self.keys).arg(requests.len());
        let cost = requests.first().map_or(0, |r| r.cost);
        if requests.iter().all(|r| r.cost == cost) {
            cmd.arg(cost);
        } else {
            cmd.arg(joined(requests.iter().map(|r| r.cost)));
        }
        match deadlines.iter().flatten().min() {
            Some(earliest) => cmd
                .arg(*earliest)
                .arg(joined(deadlines.iter().map(|d| d.unwrap_or(0)))),
            None => cmd.arg(""),
        };
    }

    /// Each check's answer from the call's reply, with the server time the
    /// call ran at. A check that came after its deadline took nothing: its
    /// answer is the timeout its caller already gave up on.
    pub(crate) fn parse(
        &self,
        value: Value,
        requests: &[RateRequest],
    ) -> Result<(u64, Vec<Result<RateReply>>)> {
        let Value::Array(items) = value else {
            return Err(Error::Protocol(format!("a lean batch replied {value:?}")));
        };
        if items.len() != requests.len() + 1 {
            return Err(Error::Protocol(format!(
                "a lean batch of {} replied {} figures",
                requests.len(),
                items.len()
            )));
        }
        let mut items = items.into_iter();
        let now = match items.next() {
            Some(Value::Int(now)) => now,
            other => return Err(Error::Protocol(format!("a lean batch's time: {other:?}"))),
        };
        // Filled in place: collecting a `Result` would grow the list from
        // empty, knowing no size.
        let mut replies = Vec::with_capacity(requests.len());
        for (item, r) in items.zip(requests) {
            replies.push(match item {
                // Anything else is a reply no script gives: a state Redis
                // cut to an integer would be re-derived wrongly.
                Value::Int(v) if (-STATE_BOUND..STATE_BOUND).contains(&(v >> 1)) => {
                    Ok(self.derive(now, r.cost, v >> 1, v & 1 == 1))
                }
                Value::Array(a) if a.is_empty() => Err(Error::Timeout(Duration::ZERO)),
                Value::Array(a) => match a.as_slice() {
                    [Value::Int(left)] => {
                        Ok(RateReply::blocked(1, (*left).max(1) as u64).at(now.max(0) as u64))
                    }
                    _ => return Err(Error::Protocol(format!("a lean check replied {a:?}"))),
                },
                other => return Err(Error::Protocol(format!("a lean check replied {other:?}"))),
            });
        }
        Ok((now.max(0) as u64, replies))
    }

    /// The reply a single call of the algorithm's script gives for a check
    /// of `cost` that found `state` at `now` and was `allowed` or not (see
    /// the scripts for each figure; Lua numbers are doubles, and so is this
    /// arithmetic).
    pub(crate) fn derive(&self, now: i64, cost: u64, state: i64, allowed: bool) -> RateReply {
        let (now_f, cost, state) = (now as f64, cost as f64, state as f64);
        let (a, iv, per) = (self.first as f64, self.ticks as f64, self.per as f64);
        let ceil_us = |x: f64| (x / per).ceil();
        let figures = match self.algorithm {
            Algorithm::Gcra => {
                let (tat, limit_at) = (state, a * iv);
                let nt = tat + cost * iv;
                if !allowed {
                    let room = limit_at - tat;
                    let next = if tat > 0.0 {
                        ceil_us(iv - lua_mod(room, iv))
                    } else {
                        0.0
                    };
                    [
                        (room / iv).floor(),
                        ceil_us(tat),
                        ceil_us(nt - limit_at),
                        next,
                    ]
                } else {
                    let room = limit_at - nt;
                    let next = if nt > 0.0 {
                        ceil_us(iv - lua_mod(room, iv))
                    } else {
                        0.0
                    };
                    [(room / iv).floor(), ceil_us(nt), 0.0, next]
                }
            }
            Algorithm::TokenBucket => {
                let (empty, full) = (state, a * iv);
                let tokens = (-empty / iv).floor();
                let after = empty + cost * iv;
                if !allowed {
                    let next = if tokens < a {
                        ceil_us(iv - lua_mod(-empty, iv))
                    } else {
                        0.0
                    };
                    [tokens, ceil_us(empty + full), ceil_us(after), next]
                } else {
                    let left = tokens - cost;
                    let next = if left < a {
                        ceil_us(iv - lua_mod(-after, iv))
                    } else {
                        0.0
                    };
                    [left, ceil_us(after + full), 0.0, next]
                }
            }
            _ => {
                let (count, limit, period) = (state, a, iv);
                let w = (now_f / period).floor();
                let reset = (w + 1.0) * period - now_f;
                if !allowed {
                    [limit - count, reset, reset, reset]
                } else {
                    [limit - count - cost, reset, 0.0, reset]
                }
            }
        };
        // Redis replies a Lua number as an integer (truncated); the parser
        // reads a negative figure as 0.
        let figure = |x: f64| (x as i64).max(0) as u64;
        let [r, reset, retry, next] = figures.map(figure);
        RateReply::new(allowed, [Outcome::from_reply(r, reset, retry, next)]).at(now.max(0) as u64)
    }
}

/// Lua 5.1's `a % b`: `a - floor(a / b) * b`, in doubles.
fn lua_mod(a: f64, b: f64) -> f64 {
    a - (a / b).floor() * b
}

/// `values` as 'v1,v2,…', written in place (a deadline per check: no
/// string of its own each).
fn joined(values: impl ExactSizeIterator<Item = u64>) -> String {
    use std::fmt::Write;

    // A µs instant has 16 digits.
    let mut s = String::with_capacity(values.len() * 17);
    for v in values {
        if !s.is_empty() {
            s.push(',');
        }
        let _ = write!(s, "{v}");
    }
    s
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::quota::Quota;

    fn gcra() -> (LeanGroup, RateRequest) {
        let r = RateRequest {
            algorithm: Algorithm::Gcra,
            keys: vec!["tg:api:gcra:{a}".into()],
            quotas: Arc::from([Quota::per_second(5)]),
            cost: 1,
            now_micros: None,
            nonce: 0,
            max_wait_micros: 0,
            deadline: None,
            unclaimed: None,
        };
        (LeanGroup::of(&r).expect("lean"), r)
    }

    #[test]
    fn joined_writes_each_value_in_decimal() {
        assert_eq!(
            joined([0, 7, 10, u64::MAX].into_iter()),
            "0,7,10,18446744073709551615"
        );
        assert_eq!(joined(std::iter::empty::<u64>()), "");
    }

    /// The decision is the script's (the low bit), never re-derived: an
    /// idle subject's state with the bit clear is a refusal.
    #[test]
    fn the_decision_is_the_scripts() {
        let (group, r) = gcra();
        let reply = |v| {
            let (_, mut got) = group
                .parse(
                    Value::Array(vec![Value::Int(7), Value::Int(v)]),
                    std::slice::from_ref(&r),
                )
                .unwrap();
            got.pop().unwrap().unwrap()
        };
        assert!(reply(1).allowed);
        assert!(!reply(0).allowed);
    }

    /// A state a Lua number cut to an integer could give (beyond ±2^52, or
    /// i64::MIN for one beyond 2^63) is a protocol error, not a decision.
    #[test]
    fn a_state_beyond_exact_integers_is_a_protocol_error() {
        let (group, r) = gcra();
        for v in [i64::MIN, i64::MAX, 1 << 53, -(1 << 53) - 1] {
            let got = group.parse(
                Value::Array(vec![Value::Int(7), Value::Int(v)]),
                std::slice::from_ref(&r),
            );
            assert!(matches!(got, Err(Error::Protocol(_))), "{v}: {got:?}");
        }
        let edge = (1 << 53) - 1;
        assert!(group
            .parse(
                Value::Array(vec![Value::Int(7), Value::Int(edge)]),
                std::slice::from_ref(&r)
            )
            .is_ok());
    }
}
