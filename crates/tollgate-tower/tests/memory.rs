//! The behaviour suite on the in-memory backend.

mod common;

backend_suite!(common::memory);
