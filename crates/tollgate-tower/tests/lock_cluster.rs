//! The LockLayer suite on a real three-master Redis Cluster.

mod common;

lock_suite!(common::lock_cluster);
