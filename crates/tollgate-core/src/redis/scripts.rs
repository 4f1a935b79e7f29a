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
/// same way after a check's preludes, then runs `lua/rate_lease.lua`.
/// Every script is sent whole, so each carries its preludes.
macro_rules! rate_body {
    (check $file:literal $($state:literal)?) => {
        concat!(
            include_str!("../../lua/rate_args.lua"),
            include_str!("../../lua/rate_deadline.lua"),
            include_str!("../../lua/rate_prelude.lua"),
            $(include_str!(concat!("../../lua/", $state, ".lua")),)?
            include_str!("../../lua/rate_block.lua"),
            include_str!(concat!("../../lua/", $file, ".lua"))
        )
    };
    (settle $file:literal $($state:literal)?) => {
        concat!(
            include_str!("../../lua/rate_args.lua"),
            include_str!("../../lua/rate_prelude.lua"),
            $(include_str!(concat!("../../lua/", $state, ".lua")),)?
            "local function check(KEYS, ARGV)\n",
            include_str!(concat!("../../lua/", $file, ".lua")),
            "\nend\n",
            include_str!("../../lua/settle_prelude.lua"),
            include_str!(concat!("../../lua/", $file, "_settle.lua")),
            include_str!("../../lua/settle_reply.lua")
        )
    };
    (lease $file:literal $($state:literal)?) => {
        concat!(
            include_str!("../../lua/rate_args.lua"),
            include_str!("../../lua/rate_deadline.lua"),
            include_str!("../../lua/rate_prelude.lua"),
            $(include_str!(concat!("../../lua/", $state, ".lua")),)?
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

/// One row per algorithm: its file (and the file of its stored state's
/// helpers, shared with its lean script, if it has one), its check and
/// settle scripts, and its place in the batch script's `decide` table (the
/// row's order).
macro_rules! rate_scripts {
    ($($alg:ident => $file:literal $(+ $state:literal)?),* $(,)?) => {
        /// The batch script (`lua/rate_batch.lua`): many checks, any
        /// algorithms, one call. Its functions are the single scripts' own
        /// bodies, so a coalesced decision runs the very code a single call does.
        pub(crate) const BATCH_BODY: &str = concat!(
            "local now, cost, n\n",
            include_str!("../../lua/rate_prelude.lua"),
            $($(include_str!(concat!("../../lua/", $state, ".lua")),)?)*
            $(rate_body!(batched $file),)*
            "local decide = {", $($file, ", ",)* "}\n",
            include_str!("../../lua/rate_batch.lua"),
        );

        /// An algorithm's check script.
        pub(crate) fn check(algorithm: Algorithm) -> &'static LuaScript {
            match algorithm {
                $(Algorithm::$alg => {
                    static S: LazyLock<LuaScript> = LazyLock::new(|| LuaScript::new(rate_body!(check $file $($state)?)));
                    &S
                })*
            }
        }

        /// An algorithm's settle script (refunds too).
        pub(crate) fn settle(algorithm: Algorithm) -> &'static LuaScript {
            match algorithm {
                $(Algorithm::$alg => {
                    static S: LazyLock<LuaScript> = LazyLock::new(|| LuaScript::new(rate_body!(settle $file $($state)?)));
                    &S
                })*
            }
        }

        /// An algorithm's quota lease script (`lua/rate_lease.lua` over its check).
        pub(crate) fn lease(algorithm: Algorithm) -> &'static LuaScript {
            match algorithm {
                $(Algorithm::$alg => {
                    static S: LazyLock<LuaScript> = LazyLock::new(|| LuaScript::new(rate_body!(lease $file $($state)?)));
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

        /// The helpers of an algorithm's stored state its check script
        /// carries after the prelude (`""`: none).
        #[cfg(test)]
        pub(crate) fn state(algorithm: Algorithm) -> &'static str {
            match algorithm {
                $(Algorithm::$alg => concat!("", $(include_str!(concat!("../../lua/", $state, ".lua")))?),)*
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
    FixedWindow => "fixed_window" + "fixed_window_state",
    SlidingWindowLog => "sliding_window_log",
    SlidingWindowCounter => "sliding_window_counter",
    TokenBucket => "token_bucket" + "token_bucket_state",
    Gcra => "gcra" + "gcra_state",
}

/// The algorithms with a lean batch script (`lua/rate_lean.lua` after the
/// prelude, the algorithm's stored state's helpers `lua/<file>_state.lua`
/// and its step `lua/<file>_lean.lua`): many checks of one limiter, one
/// figure each.
macro_rules! lean_scripts {
    ($($alg:ident => $file:literal),* $(,)?) => {
        /// An algorithm's lean batch script, if it has one.
        pub(crate) fn lean(algorithm: Algorithm) -> Option<&'static LuaScript> {
            match algorithm {
                $(Algorithm::$alg => {
                    static S: LazyLock<LuaScript> = LazyLock::new(|| LuaScript::new(concat!(
                        "local now, cost, n\n",
                        include_str!("../../lua/rate_prelude.lua"),
                        include_str!(concat!("../../lua/", $file, "_state.lua")),
                        include_str!(concat!("../../lua/", $file, "_lean.lua")),
                        include_str!("../../lua/rate_lean.lua")
                    )));
                    Some(&S)
                })*
                #[allow(unreachable_patterns)]
                _ => None,
            }
        }
    };
}

lean_scripts! {
    FixedWindow => "fixed_window",
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
    RATE_UNBLOCK => "rate_unblock",
    RATE_RESET => "rate_reset",
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
            );
            let own = check(alg)
                .body
                .strip_prefix(preludes)
                .and_then(|rest| rest.strip_prefix(state(alg)))
                .and_then(|rest| rest.strip_prefix(include_str!("../../lua/rate_block.lua")))
                .expect("the preludes");
            // The state's helpers are defined once, before every function.
            assert!(BATCH_BODY.contains(state(alg)), "{alg:?}");
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
        );
        let block = include_str!("../../lua/rate_block.lua");
        for alg in Algorithm::ALL {
            let state = state(alg);
            let own = check(alg)
                .body
                .strip_prefix(preludes)
                .and_then(|rest| rest.strip_prefix(state))
                .and_then(|rest| rest.strip_prefix(block))
                .expect("the preludes");
            let expected = format!(
                "{preludes}{state}{block}local function check(KEYS, ARGV)\n{own}\nend\n{}",
                include_str!("../../lua/rate_lease.lua")
            );
            assert_eq!(lease(alg).body, expected, "{alg:?}");
        }
    }
}
