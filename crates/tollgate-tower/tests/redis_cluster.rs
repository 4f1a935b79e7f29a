//! The behaviour suite on a real three-master Redis Cluster.

mod common;

backend_suite!(common::cluster);
