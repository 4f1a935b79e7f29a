//! Lock state of the memory backend.

/// Locks held in memory.
#[derive(Debug, Default)]
pub(crate) struct MemoryLocks {}
