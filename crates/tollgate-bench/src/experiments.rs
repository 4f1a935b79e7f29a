//! Experimental variants of tollgate's scripts, measured side by side with
//! the originals (never used by tollgate itself).

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
            Algorithm::Gcra,
            RawScript::new(
                "exp_gcra_single.lua",
                include_str!("../lua/exp_gcra_single.lua"),
            ),
        ),
        (
            Algorithm::TokenBucket,
            RawScript {
                name: "token_bucket.lua (tollgate's, by raw EVALSHA)",
                ..crate::common::core_script(Algorithm::TokenBucket)
            },
        ),
        (
            Algorithm::TokenBucket,
            RawScript::new(
                "exp_token_bucket_single.lua",
                include_str!("../lua/exp_token_bucket_single.lua"),
            ),
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
