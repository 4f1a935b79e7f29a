//! Tests of the in-memory steps' shortcuts (issue #15): the 64-bit
//! division and the single committing step.

use std::time::Duration;

use super::*;
use crate::store::Algorithm;

/// Where `commit_decides` holds, one committing step leaves the same
/// state and reports the same outcome as a peek followed (when it
/// admits) by a committing step, over random costs, gaps, clock steps
/// back and quotas (exact fractions included).
#[test]
fn one_committing_step_equals_peek_then_commit() {
    let quotas = [
        Quota::per_second(3),
        Quota::per_second(10).with_burst(4).unwrap(),
        Quota::new(6, Duration::from_micros(14)).unwrap(),
        Quota::per_minute(100),
    ];
    let mut seed = 0x2545_F491_4F6C_DD1Du64;
    let mut rand = |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    for alg in Algorithm::ALL.into_iter().filter(Algorithm::commit_decides) {
        for q in &quotas {
            let (mut a, mut b): (Option<Slot>, Option<Slot>) = (None, None);
            let mut now = 1_700_000_000_000_000u64;
            for _ in 0..2_000 {
                now = match rand(10) {
                    0 => now - rand(1_000_000),
                    _ => now + rand(400_000),
                };
                let cost = rand(alg.capacity(q) + 1);
                let step = |commit| Step {
                    now,
                    cost,
                    commit,
                    wait: 0,
                };
                let one = alg.step(&mut a, now, cost, q, true);
                let peek = alg.step_with(&mut b, step(false), alg.params(q));
                let two = if peek.retry_after_micros == 0 {
                    alg.step_with(&mut b, step(true), alg.params(q))
                } else {
                    peek
                };
                assert_eq!(one, two, "{alg:?} {q:?} at {now} cost {cost}");
                assert_eq!(format!("{a:?}"), format!("{b:?}"), "{alg:?} {q:?}");
            }
        }
    }
}

/// The 64-bit shortcut gives the 128-bit quotient and remainder, signs
/// and edges included.
#[test]
fn euclid_shortcut_matches_i128() {
    let edges = [
        0i128,
        1,
        -1,
        2,
        -2,
        7,
        -7,
        999_999,
        i128::from(i64::MAX),
        i128::from(i64::MIN),
        i128::from(i64::MAX) + 1,
        i128::from(i64::MIN) - 1,
        i128::MAX / 3,
        i128::MIN / 3,
    ];
    for &a in &edges {
        for &b in edges.iter().filter(|&&b| b != 0) {
            if a == i128::MIN && b == -1 {
                continue;
            }
            assert_eq!(div_euclid(a, b), a.div_euclid(b), "{a} / {b}");
            assert_eq!(rem_euclid(a, b), a.rem_euclid(b), "{a} % {b}");
        }
    }
}
