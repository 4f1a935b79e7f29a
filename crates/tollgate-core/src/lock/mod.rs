//! Fenced distributed locks (being built).

pub(crate) mod memory;
