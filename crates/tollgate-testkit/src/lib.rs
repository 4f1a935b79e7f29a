//! Real `redis-server` processes for tollgate's tests: no mocks.
//!
//! * [`RedisServer`] starts a standalone server on a free 127.0.0.1 port
//!   (safe with parallel test threads and parallel test processes), with
//!   persistence off and its files in a fresh temporary directory, and offers
//!   fault controls: [`RedisServer::stop`], [`RedisServer::pause`] /
//!   [`RedisServer::resume`] (SIGSTOP / SIGCONT) and [`RedisServer::restart`]
//!   (same port, empty data set).
//! * [`RedisCluster`] starts a three-master Redis Cluster, with replicas if
//!   asked, and fails a master over ([`RedisCluster::kill_master`],
//!   [`RedisCluster::force_failover`]).
//! * [`RedisServer::start_sentinels`] starts a quorum of Sentinels;
//!   [`RedisServer::pause_for`] is a bounded blip.
//! * [`require_binaries`] checks that `redis-server` and `redis-cli` are
//!   installed.
//! * [`ReplyDelay`] relays to a server and holds its replies back (a reply
//!   that arrives after the server decided), or sends new connections to
//!   another server (a DNS name that moves on failover).
//! * [`unique`] names keys apart; [`eventually`] polls until a condition
//!   holds.
//! * `http` (feature `http`): sending HTTP requests over loopback or
//!   through a tower service in process, and reading the `http::Reply`
//!   whole.
//! * `metrics` (feature `metrics`): a recorder of counters, installed once
//!   per test binary.
//!
//! ```no_run
//! # async fn example() -> tollgate_testkit::Result<()> {
//! let server = tollgate_testkit::RedisServer::start()?;
//! let mut con = server.multiplexed().await;
//! let pong: String = redis::cmd("PING").query_async(&mut con).await.unwrap();
//! assert_eq!(pong, "PONG");
//! # Ok(()) }
//! ```
//!
//! Servers are SIGKILLed on drop. Servers that are never dropped (kept in a
//! static, or when the test process is killed) are cleaned up by a small
//! per-process `sh` watchdog once the test process exits.
#![forbid(unsafe_code)]

mod cluster;
mod error;
mod failover;
mod helpers;
#[cfg(feature = "http")]
pub mod http;
#[cfg(feature = "metrics")]
pub mod metrics;
mod ports;
mod proxy;
mod resp;
mod server;
mod watchdog;

pub use cluster::RedisCluster;
pub use error::{require_binaries, Result, TestkitError};
pub use helpers::{eventually, unique};
pub use proxy::ReplyDelay;
pub use server::RedisServer;
