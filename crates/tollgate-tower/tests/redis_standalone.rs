//! The behaviour suite on a real standalone Redis.

mod common;

backend_suite!(common::redis);
