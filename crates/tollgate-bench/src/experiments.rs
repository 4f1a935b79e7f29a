//! Reference rows for the CPU table: tollgate's own scripts sent by raw
//! EVALSHA (no tollgate client) and the floor any server-clocked one-integer
//! limiter pays (`TIME` + `GET` + `SET PX`, no logic). The single-quota
//! experiments that used to sit here are now the shipped scripts' fast paths.

use tollgate_core::Algorithm;

use crate::common::RawScript;

/// The variants, each with the algorithm whose arguments it takes.
pub(crate) fn variants() -> Vec<(Algorithm, RawScript)> {
    vec![
        (
            Algorithm::Gcra,
            RawScript {
                name: "gcra.lua (tollgate's, by raw EVALSHA)",
                ..crate::common::core_script(Algorithm::Gcra)
            },
        ),
        (
            Algorithm::TokenBucket,
            RawScript {
                name: "token_bucket.lua (tollgate's, by raw EVALSHA)",
                ..crate::common::core_script(Algorithm::TokenBucket)
            },
        ),
        (
            Algorithm::Gcra,
            RawScript::new(
                "exp_floor_time_get_set.lua",
                include_str!("../lua/exp_floor_time_get_set.lua"),
            ),
        ),
    ]
}
