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

use super::admin::{block_family, family_index, in_block_family};
use crate::error::{Error, Result};
use crate::keyspace::quick_hash;
use crate::store::{Algorithm, Outcome, RateReply, RateRequest};

/// A lean reply's figures are exact integers below this (2^53, where a Lua
/// number stops being one): the scripts read no stored state 2^52 or more
/// from zero, and reply twice the state (plus one for an admission). From
/// here a figure is a blocked subject's: 2^53 + 2 × the ms left.
const EXACT: f64 = 9_007_199_254_740_992.0;

/// The figure of a check that came after its deadline (2^54).
const LATE: f64 = 18_014_398_509_481_984.0;

/// Whether no two checks have one key: then the script keeps no view of
/// the batch (`lua/rate_lean.lua`). By 64-bit hashes, sorted: two keys
/// with one hash are taken for one key, which only costs that table.
fn distinct(requests: &[RateRequest]) -> bool {
    let mut hashes: Vec<u64> = requests
        .iter()
        .map(|r| quick_hash(0, r.keys[0].as_bytes()))
        .collect();
    hashes.sort_unstable();
    hashes.windows(2).all(|w| w[0] != w[1])
}

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
        // A time a reply's double cannot hold exactly (a clock past 2^53
        // µs) goes where figures are integers: the batch script.
        let exact = request.now_micros.is_none_or(|now| (now as f64) < EXACT);
        if !lean || !exact || !(1..=2).contains(&request.keys.len()) {
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
    /// server's clock. `indexed`: the server keeps block indexes (one
    /// server; a cluster keeps none).
    pub(crate) fn fill(
        &self,
        cmd: &mut Cmd,
        requests: &[RateRequest],
        deadlines: &[Option<u64>],
        indexed: bool,
    ) {
        // Checks of one subject (a hot one fills a batch) send its keys once.
        let one = match requests {
            [first, rest @ ..] => rest.iter().all(|r| r.keys == first.keys),
            [] => false,
        };
        // Checks of many subjects of one limiter read its block marker (and
        // index), not each one's block key.
        let index = match requests {
            [first, rest @ ..] if indexed && !one && self.keys == 2 => block_family(&first.keys[1])
                .filter(|f| rest.iter().all(|r| in_block_family(&r.keys[1], f)))
                .map(family_index),
            _ => None,
        };
        if one {
            cmd.arg(self.keys);
            for key in &requests[0].keys {
                cmd.arg(key.as_str());
            }
        } else if let Some([marker, index]) = &index {
            cmd.arg(requests.len() + 2);
            for r in requests {
                cmd.arg(r.keys[0].as_str());
            }
            cmd.arg(marker.as_str()).arg(index.as_str());
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
        match index {
            Some(_) if distinct(requests) => cmd.arg("u"),
            Some(_) => cmd.arg("i"),
            None => cmd.arg(self.keys),
        };
        cmd.arg(requests.len());
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

    /// Each check's answer from the call's reply (little-endian doubles,
    /// see `lua/rate_lean.lua`), with the server time the call ran at. A
    /// check that came after its deadline took nothing: its answer is the
    /// timeout its caller already gave up on.
    pub(crate) fn parse(
        &self,
        value: Value,
        requests: &[RateRequest],
    ) -> Result<(u64, Vec<Result<RateReply>>)> {
        let Value::BulkString(bytes) = value else {
            return Err(Error::Protocol(format!("a lean batch replied {value:?}")));
        };
        if bytes.len() != 8 * (requests.len() + 1) {
            return Err(Error::Protocol(format!(
                "a lean batch of {} replied {} bytes",
                requests.len(),
                bytes.len()
            )));
        }
        let mut figures = bytes
            .chunks_exact(8)
            .map(|b| f64::from_le_bytes(b.try_into().expect("8 bytes")));
        let now = match figures.next() {
            Some(now) if (0.0..EXACT).contains(&now) && now.fract() == 0.0 => now as u64,
            other => return Err(Error::Protocol(format!("a lean batch's time: {other:?}"))),
        };
        // Filled in place: collecting a `Result` would grow the list from
        // empty, knowing no size.
        let mut replies = Vec::with_capacity(requests.len());
        for (v, r) in figures.zip(requests) {
            replies.push(match v {
                // Anything else is a figure no script gives: a state Lua
                // rounded would be re-derived wrongly.
                v if v.abs() < EXACT && v.fract() == 0.0 => {
                    let v = v as i64;
                    Ok(self.derive(now as i64, r.cost, v >> 1, v & 1 == 1))
                }
                v if v == LATE => Err(Error::Timeout(Duration::ZERO)),
                // Every double from 2^53 to 2^54 is even: a whole ms count.
                v if v > EXACT && v < LATE => {
                    let left_ms = ((v - EXACT) / 2.0) as u64;
                    Ok(RateReply::blocked(1, (left_ms * 1000).max(1)).at(now))
                }
                other => return Err(Error::Protocol(format!("a lean check replied {other}"))),
            });
        }
        Ok((now, replies))
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
                        ceil_us(unit_after(room, iv))
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
                        ceil_us(unit_after(room, iv))
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
                        ceil_us(unit_after(-empty, iv))
                    } else {
                        0.0
                    };
                    [tokens, ceil_us(empty + full), ceil_us(after), next]
                } else {
                    let left = tokens - cost;
                    let next = if left < a {
                        ceil_us(unit_after(-after, iv))
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

/// The scripts' `unit_after`, in doubles: until one more unit is
/// available, `room` (negative: a debt) into a quota of `iv` per unit.
fn unit_after(room: f64, iv: f64) -> f64 {
    if room < 0.0 {
        iv - room
    } else {
        // Lua 5.1's `room % iv`.
        iv - (room - (room / iv).floor() * iv)
    }
}

/// `values` as 'v1,v2,…', written in place (a deadline per check: no
/// string of its own each).
fn joined(values: impl ExactSizeIterator<Item = u64>) -> String {
    // A µs instant has 16 digits.
    let mut s = String::with_capacity(values.len() * 17);
    let mut digits = itoa::Buffer::new();
    for v in values {
        if !s.is_empty() {
            s.push(',');
        }
        s.push_str(digits.format(v));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::Quota;

    fn gcra() -> (LeanGroup, RateRequest) {
        let r = RateRequest {
            algorithm: Algorithm::Gcra,
            keys: vec!["tg:api:gcra:{a}".into()],
            quotas: vec![Quota::per_second(5)].into(),
            cost: 1,
            now_micros: None,
            store_clock: false,
            nonce: 0,
            max_wait_micros: 0,
            deadline: None,
            unclaimed: None,
        };
        (LeanGroup::of(&r).expect("lean"), r)
    }

    /// A key is in a family exactly when that is its family.
    #[test]
    fn a_key_is_in_its_block_family_only() {
        let keys = [
            "p:n:block:{u1}",
            "p:n:block:{a:{b}",
            "p:n:blocks:{u}",
            "p:n:block",
            "p:n:block:",
            ":{x}",
            "p::{u}",
            "p:n:block:{",
        ];
        for k in keys {
            for f in ["p:n:block", "p:n:blocks", "", "p:", "p", "p:n"] {
                assert_eq!(in_block_family(k, f), block_family(k) == Some(f), "{k} {f}");
            }
        }
        assert_eq!(block_family("p:n:block:{u:{v}}"), Some("p:n:block"));
        assert_eq!(block_family("p:n:block"), None);
    }

    #[test]
    fn joined_writes_each_value_in_decimal() {
        assert_eq!(
            joined([0, 7, 10, u64::MAX].into_iter()),
            "0,7,10,18446744073709551615"
        );
        assert_eq!(joined(std::iter::empty::<u64>()), "");
    }

    /// A reply as the lean script packs it.
    fn packed(figures: &[f64]) -> Value {
        Value::BulkString(figures.iter().flat_map(|f| f.to_le_bytes()).collect())
    }

    /// The decision is the script's (the low bit), never re-derived: an
    /// idle subject's state with the bit clear is a refusal.
    #[test]
    fn the_decision_is_the_scripts() {
        let (group, r) = gcra();
        let reply = |v| {
            let (_, mut got) = group
                .parse(packed(&[7.0, v]), std::slice::from_ref(&r))
                .unwrap();
            got.pop().unwrap().unwrap()
        };
        assert!(reply(1.0).allowed);
        assert!(!reply(0.0).allowed);
    }

    /// A blocked subject's figure carries the ms left; a late check's is a
    /// timeout (it took nothing).
    #[test]
    fn blocked_and_late_figures_are_read() {
        let (group, r) = gcra();
        let (now, got) = group
            .parse(
                packed(&[7.0, EXACT + 2.0 * 1500.0, LATE]),
                &[r.clone(), r.clone()],
            )
            .unwrap();
        assert_eq!(now, 7);
        let blocked = got[0].as_ref().unwrap();
        assert!(!blocked.allowed);
        assert_eq!(blocked.outcomes[0].retry_after_micros, 1_500_000);
        assert!(matches!(got[1], Err(Error::Timeout(_))));
    }

    /// A figure a Lua number could not hold exactly (beyond 2^53, between
    /// the markers, a fraction, not a number) is a protocol error, not a
    /// decision; so is a reply of the wrong size or shape.
    #[test]
    fn a_figure_no_script_gives_is_a_protocol_error() {
        let (group, r) = gcra();
        for v in [EXACT, LATE * 2.0, -EXACT, 0.5, f64::NAN, f64::INFINITY] {
            let got = group.parse(packed(&[7.0, v]), std::slice::from_ref(&r));
            assert!(matches!(got, Err(Error::Protocol(_))), "{v}: {got:?}");
        }
        let edge = EXACT - 1.0;
        assert!(group
            .parse(packed(&[7.0, edge]), std::slice::from_ref(&r))
            .is_ok());
        for bad in [
            packed(&[7.0]),
            packed(&[7.0, 1.0, 1.0]),
            packed(&[-1.0, 1.0]),
            Value::Array(vec![Value::Int(7), Value::Int(1)]),
        ] {
            let got = group.parse(bad, std::slice::from_ref(&r));
            assert!(matches!(got, Err(Error::Protocol(_))), "{got:?}");
        }
    }

    /// A call of distinct keys says so (the script then keeps no view of
    /// the batch); one key twice, anywhere in it, does not.
    #[test]
    fn distinct_keys_are_told_apart_from_a_repeated_one() {
        let (_, r) = gcra();
        let with_key = |k: &str| {
            let mut r = r.clone();
            r.keys[0] = k.to_owned();
            r
        };
        let (a, b, c) = (with_key("k:{a}"), with_key("k:{b}"), with_key("k:{c}"));
        assert!(distinct(&[a.clone(), b.clone(), c.clone()]));
        assert!(!distinct(&[a.clone(), b, c, a]));
    }
}
