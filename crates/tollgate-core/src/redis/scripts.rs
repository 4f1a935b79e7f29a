//! Every script tollgate sends to Redis, named once: which `lua/*.lua` file
//! each operation runs, and each algorithm's place in the batch script.

use std::sync::LazyLock;

use crate::rate::Algorithm;

/// A Lua script and its SHA1, computed once.
#[derive(Debug)]
pub(crate) struct LuaScript {
    pub(crate) sha: String,
    pub(crate) body: &'static str,
}

impl LuaScript {
    /// A script from its source (use with `include_str!`).
    pub(crate) fn new(body: &'static str) -> Self {
        LuaScript {
            sha: redis::Script::new(body).get_hash().to_owned(),
            body,
        }
    }
}

/// A script's body as it is sent: a rate algorithm's arguments
/// (`lua/rate_args.lua`), then for a check its deadline
/// (`lua/rate_deadline.lua`), the shared prelude, for a check its block
/// (`lua/rate_block.lua`), then the algorithm. A settle (and a refund, a
/// settle to 0) wraps the algorithm's check script as a function `check`,
/// then runs the settle prelude, the algorithm's settle part and the
/// epilogue that calls `check` with a cost of 0 (`lua/settle_reply.lua`):
/// its figures come from the check's own code. A quota lease wraps it the
/// same way after a check's preludes, then runs `lua/rate_lease.lua`. Every script is sent whole,
/// so each carries its preludes.
macro_rules! rate_body {
    (check $file:literal) => {
        concat!(
            include_str!("../../lua/rate_args.lua"),
            include_str!("../../lua/rate_deadline.lua"),
            include_str!("../../lua/rate_prelude.lua"),
            include_str!("../../lua/rate_block.lua"),
            include_str!(concat!("../../lua/", $file, ".lua"))
        )
    };
    (settle $file:literal) => {
        concat!(
            include_str!("../../lua/rate_args.lua"),
            include_str!("../../lua/rate_prelude.lua"),
            "local function check(KEYS, ARGV)\n",
            include_str!(concat!("../../lua/", $file, ".lua")),
            "\nend\n",
            include_str!("../../lua/settle_prelude.lua"),
            include_str!(concat!("../../lua/", $file, "_settle.lua")),
            include_str!("../../lua/settle_reply.lua")
        )
    };
    (lease $file:literal) => {
        concat!(
            include_str!("../../lua/rate_args.lua"),
            include_str!("../../lua/rate_deadline.lua"),
            include_str!("../../lua/rate_prelude.lua"),
            include_str!("../../lua/rate_block.lua"),
            "local function check(KEYS, ARGV)\n",
            include_str!(concat!("../../lua/", $file, ".lua")),
            "\nend\n",
            include_str!("../../lua/rate_lease.lua")
        )
    };
    (batched $file:literal) => {
        concat!(
            "local function ",
            $file,
            "(KEYS, ARGV)\n",
            include_str!(concat!("../../lua/", $file, ".lua")),
            "\nend\n"
        )
    };
}

/// One row per algorithm: its file, its check and settle scripts, and its
/// place in the batch script's `decide` table (the row's order).
macro_rules! rate_scripts {
    ($($alg:ident => $file:literal),* $(,)?) => {
        /// The batch script (`lua/rate_batch.lua`): many checks, any
        /// algorithms, one call. Its functions are the single scripts' own
        /// bodies, so a coalesced decision runs the very code a single call does.
        pub(crate) const BATCH_BODY: &str = concat!(
            "local now, cost, n\n",
            include_str!("../../lua/rate_prelude.lua"),
            $(rate_body!(batched $file),)*
            "local decide = {", $($file, ", ",)* "}\n",
            include_str!("../../lua/rate_batch.lua"),
        );

        /// An algorithm's check script.
        pub(crate) fn check(algorithm: Algorithm) -> &'static LuaScript {
            match algorithm {
                $(Algorithm::$alg => {
                    static S: LazyLock<LuaScript> = LazyLock::new(|| LuaScript::new(rate_body!(check $file)));
                    &S
                })*
            }
        }

        /// An algorithm's settle script (refunds too).
        pub(crate) fn settle(algorithm: Algorithm) -> &'static LuaScript {
            match algorithm {
                $(Algorithm::$alg => {
                    static S: LazyLock<LuaScript> = LazyLock::new(|| LuaScript::new(rate_body!(settle $file)));
                    &S
                })*
            }
        }

        /// An algorithm's quota lease script (`lua/rate_lease.lua` over its check).
        pub(crate) fn lease(algorithm: Algorithm) -> &'static LuaScript {
            match algorithm {
                $(Algorithm::$alg => {
                    static S: LazyLock<LuaScript> = LazyLock::new(|| LuaScript::new(rate_body!(lease $file)));
                    &S
                })*
            }
        }

        /// An algorithm's file, `lua/<file>.lua`.
        #[cfg(test)]
        pub(crate) fn file(algorithm: Algorithm) -> &'static str {
            match algorithm {
                $(Algorithm::$alg => $file,)*
            }
        }

        /// An algorithm's place (from 1) in the batch script's `decide` table.
        pub(crate) fn batch_id(algorithm: Algorithm) -> u8 {
            let rows = [$(Algorithm::$alg),*];
            let at = rows.iter().position(|a| *a == algorithm);
            at.map_or(0, |i| i as u8 + 1)
        }
    };
}

rate_scripts! {
    FixedWindow => "fixed_window",
    SlidingWindowLog => "sliding_window_log",
    SlidingWindowCounter => "sliding_window_counter",
    TokenBucket => "token_bucket",
    Gcra => "gcra",
}

/// Declares the scripts of the other operations, one `lua/<file>.lua` each.
macro_rules! scripts {
    ($($name:ident => $file:literal),* $(,)?) => {
        $(
            #[doc = concat!("`lua/", $file, ".lua`.")]
            pub(crate) static $name: LazyLock<LuaScript> =
                LazyLock::new(|| LuaScript::new(include_str!(concat!("../../lua/", $file, ".lua"))));
        )*
    };
}

/// The batch script, loaded.
pub(crate) static RATE_BATCH: LazyLock<LuaScript> = LazyLock::new(|| LuaScript::new(BATCH_BODY));

scripts! {
    LOCK_ACQUIRE => "lock_acquire",
    LOCK_RELEASE => "lock_release",
    LOCK_EXTEND => "lock_extend",
    LOCK_FENCE_RAISE => "lock_fence_raise",
    LOCK_HOLDERS => "lock_holders",
    LOCK_BREAK => "lock_break",
    PERMIT_ACQUIRE => "permit_acquire",
    PERMIT_RELEASE => "permit_release",
    PERMIT_EXTEND => "permit_extend",
    PERMIT_COUNT => "permit_count",
    IDEM_CLAIM => "idem_claim",
    IDEM_COMPLETE => "idem_complete",
    IDEM_ABANDON => "idem_abandon",
    IDEM_IN_FLIGHT => "idem_in_flight",
    RATE_BLOCK_SET => "rate_block_set",
    THROTTLED_ADD => "throttled_add",
    ADMIN_ANNOUNCE => "admin_announce",
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each algorithm's batch id picks, in the batch script, a function
    /// whose body is that algorithm's check script.
    #[test]
    fn batch_ids_pick_each_algorithms_own_function() {
        let table = BATCH_BODY
            .lines()
            .find_map(|l| l.strip_prefix("local decide = {"))
            .expect("the decide table");
        for alg in Algorithm::ALL {
            let id = usize::from(batch_id(alg));
            assert!(id >= 1, "{alg:?}");
            let name = table.split(", ").nth(id - 1).expect("a row");
            assert_eq!(name, file(alg));
            // The single script is the preludes then the algorithm's own body;
            // the batch wraps that same body in the function it picks.
            let preludes = concat!(
                include_str!("../../lua/rate_args.lua"),
                include_str!("../../lua/rate_deadline.lua"),
                include_str!("../../lua/rate_prelude.lua"),
                include_str!("../../lua/rate_block.lua")
            );
            let own = check(alg)
                .body
                .strip_prefix(preludes)
                .expect("the preludes");
            let function = format!("local function {name}(KEYS, ARGV)\n{own}\nend\n");
            assert!(BATCH_BODY.contains(&function), "{alg:?}");
        }
    }

    /// A quota lease runs the algorithm's own check script (no second copy
    /// of its arithmetic), after a check's preludes, then rate_lease.lua.
    #[test]
    fn a_lease_wraps_each_algorithms_own_check() {
        let preludes = concat!(
            include_str!("../../lua/rate_args.lua"),
            include_str!("../../lua/rate_deadline.lua"),
            include_str!("../../lua/rate_prelude.lua"),
            include_str!("../../lua/rate_block.lua")
        );
        for alg in Algorithm::ALL {
            let own = check(alg)
                .body
                .strip_prefix(preludes)
                .expect("the preludes");
            let expected = format!(
                "{preludes}local function check(KEYS, ARGV)\n{own}\nend\n{}",
                include_str!("../../lua/rate_lease.lua")
            );
            assert_eq!(lease(alg).body, expected, "{alg:?}");
        }
    }
}
