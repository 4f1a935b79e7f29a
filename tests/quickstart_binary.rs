//! The quickstart contract against the example binary itself
//! (`target/<profile>/examples/quickstart`, as `cargo run --example
//! quickstart` runs it): its startup line, its environment variables
//! (`TOLLGATE_ADDR`, `REDIS_URL`, `REDIS_CLUSTER`), and several processes
//! sharing one Redis.

mod common;

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;
use tollgate_testkit::{RedisCluster, RedisServer};

use common::{
    assert_hello, check_down, check_jobs, check_rate_limit, check_recovered, example_bin, get,
    job_fence, post, Example,
};

async fn launch(env: &[(&str, &str)]) -> Example {
    common::launch("quickstart", env).await
}

fn assert_line(e: &Example, backend: &str) {
    assert_eq!(
        e.line,
        format!("listening on http://{} (backend: {backend})", e.addr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_memory_by_default() {
    let a = launch(&[]).await;
    assert_line(&a, "memory");
    assert_hello(&get(a.addr, "/").await, 4);
    job_fence(&post(a.addr, "/jobs/1").await, "1");
}

/// Without `TOLLGATE_ADDR` the example listens on 127.0.0.1:3000 (checked
/// when that port is free on this machine).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_default_address_is_3000() {
    if std::net::TcpListener::bind("127.0.0.1:3000").is_err() {
        eprintln!("127.0.0.1:3000 is in use here; the default address is not checked");
        return;
    }
    let mut cmd = Command::new(example_bin("quickstart"));
    cmd.env_remove("REDIS_URL")
        .env_remove("REDIS_CLUSTER")
        .env_remove("TOLLGATE_ADDR")
        .stdout(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().unwrap();
    let mut line = String::new();
    tokio::time::timeout(
        Duration::from_secs(30),
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(
        line.trim_end(),
        "listening on http://127.0.0.1:3000 (backend: memory)"
    );
    let addr: SocketAddr = "127.0.0.1:3000".parse().unwrap();
    assert_eq!(get(addr, "/").await.body, "hello");
}

/// Two processes on one Redis (`REDIS_URL`) share the limit and the job
/// locks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_two_processes_share_redis() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let a = launch(&[("REDIS_URL", &url)]).await;
    let b = launch(&[("REDIS_URL", &url)]).await;
    assert_line(&a, "redis");
    assert_line(&b, "redis");
    check_rate_limit(a.addr, b.addr).await;
    check_jobs(a.addr, b.addr).await;
}

/// `REDIS_CLUSTER` takes comma-separated `host:port` seeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_two_processes_share_a_cluster() {
    let cluster = RedisCluster::start().unwrap();
    let seeds = cluster
        .nodes()
        .iter()
        .map(|n| n.addr())
        .collect::<Vec<_>>()
        .join(",");
    let a = launch(&[("REDIS_CLUSTER", &seeds)]).await;
    let b = launch(&[("REDIS_CLUSTER", &seeds)]).await;
    assert_line(&a, "cluster");
    check_rate_limit(a.addr, b.addr).await;
    check_jobs(a.addr, b.addr).await;
}

/// The example starts while Redis is down, serves `GET /` and answers 503
/// to jobs, and recovers when Redis comes up — no restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_starts_while_redis_is_down_and_recovers() {
    let mut server = RedisServer::start().unwrap();
    server.stop();
    let a = launch(&[("REDIS_URL", &server.url())]).await;
    assert_line(&a, "redis");
    check_down(a.addr).await;
    server.restart().unwrap();
    check_recovered(a.addr, "late").await;
    // And through a pause.
    server.pause();
    check_down(a.addr).await;
    server.resume();
    check_recovered(a.addr, "after-pause").await;
}

/// An unreachable cluster is a clear startup error, not a hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_unreachable_cluster_fails_clearly() {
    // A port nobody listens on: bind one, note it, and close it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        Command::new(example_bin("quickstart"))
            .env("REDIS_CLUSTER", format!("127.0.0.1:{port}"))
            .env("TOLLGATE_ADDR", "127.0.0.1:0")
            .output(),
    )
    .await
    .expect("the example gives up within 60 s")
    .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with("quickstart: cannot set up the backend: "),
        "{stderr}"
    );
    assert!(out.stdout.is_empty(), "no listening line");
}
