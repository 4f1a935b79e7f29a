//! The LockLayer suite on the in-memory backend.

mod common;

lock_suite!(common::lock_memory);
