//! The operator plane's vocabulary, shared by the capabilities it oversees
//! (a limiter or a semaphore registers, tallies its decisions and hears
//! admin notices) and by [`Admin`](crate::admin::Admin), which reads and acts
//! on them. Below both, so neither imports the other's folder.

pub(crate) mod notices;
pub(crate) mod registry;
pub(crate) mod tally;
pub(crate) mod views;
