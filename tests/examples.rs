//! The other examples run to completion on the memory backend (and on
//! Redis) and show what they promise.

mod common;

use std::process::Output;
use std::time::Duration;

use tokio::process::Command;
use tollgate_testkit::RedisServer;

use common::example_bin;

async fn run(name: &str, env: &[(&str, &str)]) -> String {
    let mut cmd = Command::new(example_bin(name));
    cmd.env_remove("REDIS_URL").kill_on_drop(true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out: Output = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .unwrap_or_else(|_| panic!("example {name} did not finish within 60 s"))
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "example {name} failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn check_fenced_write(out: &str, backend: &str) {
    assert!(out.starts_with(&format!("backend: {backend}\n")), "{out}");
    assert!(out.contains("A's lease is lost (is_held = false)"), "{out}");
    assert!(out.contains("B wrote: \"written by B\""), "{out}");
    assert!(out.contains("A's write: refused: fencing token"), "{out}");
    assert!(
        out.contains("the record still says \"written by B\""),
        "{out}"
    );
    assert!(out.contains("A's release: still ours = false"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_write_rejects_the_stale_holder_memory() {
    check_fenced_write(&run("fenced_write", &[]).await, "memory");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_write_rejects_the_stale_holder_redis() {
    let server = RedisServer::start().unwrap();
    check_fenced_write(
        &run("fenced_write", &[("REDIS_URL", &server.url())]).await,
        "redis",
    );
}

fn check_tonic(out: &str, backend: &str) {
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], format!("backend: {backend}"), "{out}");
    assert_eq!(lines.len(), 7, "{out}");
    for (i, line) in lines.iter().enumerate().take(4).skip(1) {
        assert_eq!(*line, format!("call {i}: OK, status Serving"), "{out}");
    }
    for (i, line) in lines.iter().enumerate().take(6).skip(4) {
        let denied = format!("call {i}: ResourceExhausted (rate limit exceeded; retry in ");
        assert!(line.starts_with(&denied), "{out}");
        assert!(line.ends_with(", retry after 1 s"), "{out}");
    }
    assert_eq!(lines[6], "after waiting: OK", "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tonic_example_limits_grpc_calls_memory() {
    check_tonic(&run("tonic", &[]).await, "memory");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tonic_example_limits_grpc_calls_redis() {
    let server = RedisServer::start().unwrap();
    check_tonic(
        &run("tonic", &[("REDIS_URL", &server.url())]).await,
        "redis",
    );
}
