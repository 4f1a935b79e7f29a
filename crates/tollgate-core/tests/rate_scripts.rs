//! The five rate scripts called directly (EVALSHA over a raw connection, the
//! text the crate loads: the arguments, the prelude, then the script), with every cost from
//! 0 to capacity + 2 and several quotas, bypassing the client's own cost
//! check (issue #16, defect 6: the sliding log did arithmetic on nil and the
//! sliding counter divided by zero for a cost above the limit). Every reply is
//! a well-formed admission or denial, never a script error, and nothing over
//! the limit is admitted.

use std::sync::atomic::{AtomicU64, Ordering};

use redis::{Connection, Value};
use tollgate_testkit::RedisServer;

const PRELUDE: &str = concat!(
    include_str!("../lua/rate_args.lua"),
    include_str!("../lua/rate_prelude.lua")
);

/// The algorithms' scripts (after their stored state's helpers, as the
/// loader puts them), and whether their quota figures are (burst,
/// interval per unit) rather than (limit, period).
const SCRIPTS: [(&str, &str, bool); 5] = [
    (
        "fixed_window",
        concat!(
            include_str!("../lua/fixed_window_state.lua"),
            include_str!("../lua/fixed_window.lua")
        ),
        false,
    ),
    (
        "sliding_window_log",
        include_str!("../lua/sliding_window_log.lua"),
        false,
    ),
    (
        "sliding_window_counter",
        include_str!("../lua/sliding_window_counter.lua"),
        false,
    ),
    (
        "token_bucket",
        concat!(
            include_str!("../lua/token_bucket_state.lua"),
            include_str!("../lua/token_bucket.lua")
        ),
        true,
    ),
    (
        "gcra",
        concat!(
            include_str!("../lua/gcra_state.lua"),
            include_str!("../lua/gcra.lua")
        ),
        true,
    ),
];

const SECOND: u64 = 1_000_000;

static NONCE: AtomicU64 = AtomicU64::new(1);

/// Quota sets as (limit or burst, period or interval in µs).
fn quota_sets(per_unit: bool) -> Vec<Vec<(u64, u64)>> {
    if per_unit {
        vec![
            vec![(1, SECOND)],
            vec![(4, SECOND / 4)],
            vec![(5, 2 * SECOND), (3, SECOND / 3)],
        ]
    } else {
        vec![
            vec![(1, SECOND)],
            vec![(4, SECOND)],
            vec![(5, 60 * SECOND), (3, SECOND)],
        ]
    }
}

/// A call of one script: the reply, or the script's error.
struct Call<'a> {
    script: &'a redis::Script,
    key: &'a str,
    quotas: &'a [(u64, u64)],
}

impl Call<'_> {
    fn run(&self, con: &mut Connection, now: Option<u64>, cost: u64) -> Vec<i64> {
        let mut inv = self.script.prepare_invoke();
        for i in 0..self.quotas.len() {
            inv.key(format!("{{{}}}:q{i}", self.key));
        }
        inv.arg(now.map_or(String::new(), |n| n.to_string()))
            .arg(cost);
        // ARGV[3], as the client sends it: a fresh nonce per call for the
        // log's members; for the others no wait for a slot (a plain check).
        if self.key.starts_with("sliding_window_log:") {
            inv.arg(format!("{:016x}", NONCE.fetch_add(1, Ordering::Relaxed)));
        } else {
            inv.arg("");
        }
        for (a, b) in self.quotas {
            inv.arg(*a).arg(*b);
        }
        let value: Value = inv
            .invoke(con)
            .unwrap_or_else(|e| panic!("{} cost {cost}: script error {e}", self.key));
        let Value::Array(items) = value else {
            panic!("{} cost {cost}: not an array: {value:?}", self.key)
        };
        items
            .iter()
            .map(|v| match v {
                Value::Int(n) => *n,
                other => panic!("{} cost {cost}: not an integer: {other:?}", self.key),
            })
            .collect()
    }
}

/// Checks one reply: shape, flags and figures; returns whether it admitted.
fn check_reply(
    what: &str,
    reply: &[i64],
    quotas: &[(u64, u64)],
    per_unit: bool,
    cost: u64,
) -> bool {
    // {allowed, now, then four figures per quota}.
    assert_eq!(reply.len(), 2 + 4 * quotas.len(), "{what}: {reply:?}");
    assert!(reply[0] == 0 || reply[0] == 1, "{what}: {reply:?}");
    let capacity = quotas.iter().map(|q| q.0).min().unwrap();
    // The longest a quota can ask anyone to wait for `cost`.
    let span = quotas
        .iter()
        .map(|&(a, b)| if per_unit { a * b } else { b })
        .max()
        .unwrap();
    let bound = (cost + 2) * span;
    let allowed = reply[0] == 1;
    let mut waits = false;
    assert!(reply[1] > 0, "{what}: the time decided at: {reply:?}");
    for c in reply[2..].chunks_exact(4) {
        let (remaining, reset, retry, next) = (c[0], c[1], c[2], c[3]);
        assert!(
            remaining >= 0 && reset >= 0 && retry >= 0 && next >= 0,
            "{what}: {reply:?}"
        );
        assert!(
            reset as u64 <= bound && retry as u64 <= bound && next as u64 <= bound,
            "{what}: {reply:?}"
        );
        // Draft-10: a Retry-After never points before more quota comes.
        if retry > 0 {
            assert!(retry >= next, "{what}: retry before t: {reply:?}");
        }
        if allowed {
            assert_eq!(retry, 0, "{what}: {reply:?}");
        }
        waits |= retry > 0;
    }
    if cost == 0 {
        assert!(allowed, "{what}: a peek is always admitted: {reply:?}");
    }
    if cost > capacity {
        assert!(!allowed, "{what}: over the limit admitted: {reply:?}");
    }
    if !allowed {
        assert!(waits, "{what}: a denial without a retry-after: {reply:?}");
    }
    allowed
}

#[test]
fn scripts_are_safe_for_any_cost() {
    let server = RedisServer::start().unwrap();
    let mut con = server.client().get_connection().unwrap();
    let mut n = 0u64;
    for (name, body, per_unit) in SCRIPTS {
        let script = redis::Script::new(&format!("{PRELUDE}{body}"));
        for quotas in quota_sets(per_unit) {
            let capacity = quotas.iter().map(|q| q.0).min().unwrap();
            // The longest period or interval: a shift by it moves every quota
            // into a later window (or refills some of every bucket).
            let long = quotas.iter().map(|q| q.1).max().unwrap();
            let now = 1_700_000_000 * SECOND;
            for cost in 0..=capacity + 2 {
                for prefill in 0..=capacity + 1 {
                    for shift in [0, long / 2, long + 1] {
                        n += 1;
                        let key = format!("{name}:{n}");
                        let call = Call {
                            script: &script,
                            key: &key,
                            quotas: &quotas,
                        };
                        let what =
                            format!("{name} {quotas:?} cost {cost} after {prefill} + {shift} µs");
                        // Units taken at `now`; the clock then stands still
                        // (shift 0) or moves on, and `cost` is asked for.
                        let mut taken = 0;
                        for _ in 0..prefill {
                            let r = call.run(&mut con, Some(now), 1);
                            taken += u64::from(check_reply(&what, &r, &quotas, per_unit, 1));
                        }
                        assert_eq!(taken, prefill.min(capacity), "{what}");
                        let r = call.run(&mut con, Some(now + shift), cost);
                        let admitted = check_reply(&what, &r, &quotas, per_unit, cost);
                        if shift == 0 && admitted {
                            assert!(taken + cost <= capacity, "{what}: over the limit: {r:?}");
                        }
                        // The server's clock, right after (a fresh key too).
                        let r = call.run(&mut con, None, cost);
                        check_reply(&what, &r, &quotas, per_unit, cost);
                        let fresh = Call {
                            key: &format!("{key}:fresh"),
                            ..call
                        };
                        let r = fresh.run(&mut con, None, cost);
                        check_reply(&what, &r, &quotas, per_unit, cost);
                    }
                }
            }
        }
    }
    // Every key written has a TTL.
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut con).unwrap();
    for key in keys {
        let pttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut con).unwrap();
        assert!(pttl != -1, "{key} has no TTL");
    }
}
