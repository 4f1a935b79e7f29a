//! Shared helpers of the end-to-end tests: the quickstart's contract checked
//! over a real HTTP client on loopback (`tollgate_testkit::http::loopback`),
//! and the example binaries.

#![allow(dead_code)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use http::{Method, StatusCode};
use tokio::io::AsyncBufReadExt;

pub(crate) use tollgate_testkit::eventually;
#[allow(unused_imports)] // used by some of the test binaries that include this module
pub(crate) use tollgate_testkit::http::loopback::send;
pub(crate) use tollgate_testkit::http::loopback::{get, post, send_from};
pub(crate) use tollgate_testkit::http::Reply;

/// What these tests read off a [`Reply`] beyond plain HTTP.
pub(crate) trait RateLimitReply {
    /// The `r=` of the `RateLimit` header.
    fn remaining(&self) -> u64;
}

impl RateLimitReply for Reply {
    fn remaining(&self) -> u64 {
        let v = self.expect_header("ratelimit");
        let r = v
            .split(';')
            .find_map(|p| p.trim().strip_prefix("r="))
            .unwrap_or_else(|| panic!("no r= in RateLimit {v:?}"));
        r.parse().unwrap()
    }
}

/// The `fence` of a `POST /jobs/{id}` answer, after checking the JSON is
/// exactly `{"job":"<id>","fence":<integer>}`.
pub(crate) fn job_fence(reply: &Reply, id: &str) -> u64 {
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    let v: serde_json::Value = serde_json::from_str(&reply.body)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", reply.body));
    let obj = v.as_object().expect("a JSON object");
    assert_eq!(obj.len(), 2, "exactly job and fence: {v}");
    assert_eq!(obj["job"], serde_json::Value::String(id.to_owned()), "{v}");
    obj["fence"]
        .as_u64()
        .unwrap_or_else(|| panic!("fence is not an integer: {v}"))
}

// ------------------------------------------------------------------------
// The quickstart's contract, checked against running instances (the router
// in-process, or the example binary).

pub(crate) const POLICY: &str = r#""quickstart";q=5;w=10"#;

pub(crate) fn assert_hello(r: &Reply, remaining: u64) {
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(r.body, "hello");
    assert_eq!(r.expect_header("ratelimit-policy"), POLICY);
    assert_eq!(r.remaining(), remaining, "{r:?}");
}

pub(crate) fn assert_limited(r: &Reply) -> u64 {
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{r:?}");
    assert_eq!(r.expect_header("ratelimit-policy"), POLICY);
    assert_eq!(r.remaining(), 0);
    let wait = r.retry_after();
    // The next token comes within 2 s; rounded up to whole seconds, never 0.
    assert!((1..=2).contains(&wait), "Retry-After {wait}");
    wait
}

/// A 429's body: draft-10's quota-exceeded problem (RFC 9457) naming the
/// quickstart's policy, its detail the wait of `Retry-After` (`wait`).
pub(crate) fn assert_quota_exceeded(r: &Reply, wait: u64) {
    assert_eq!(r.expect_header("content-type"), "application/problem+json");
    let v: serde_json::Value =
        serde_json::from_str(&r.body).unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", r.body));
    assert_eq!(
        v["type"], "https://iana.org/assignments/http-problem-types#quota-exceeded",
        "{v}"
    );
    assert_eq!(v["status"], 429, "{v}");
    assert_eq!(
        v["violated-policies"],
        serde_json::json!(["quickstart"]),
        "{v}"
    );
    assert_eq!(
        v["detail"],
        format!("rate limit exceeded; retry in {wait} s"),
        "{v}"
    );
}

/// `GET /`: a bucket of 5 per client IP shared by both instances, refilled
/// one token every 2 s; headers on every answer; 429 + `Retry-After`.
pub(crate) async fn check_rate_limit(a: SocketAddr, b: SocketAddr) {
    // A wrong method is a plain 405 and takes no token.
    let r = send_from(None, a, Method::POST, "/").await;
    assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED, "{r:?}");
    // Five in a row, spread over both instances: one shared bucket.
    let full = std::time::Instant::now();
    assert_hello(&get(a, "/").await, 4);
    assert_hello(&get(a, "/").await, 3);
    assert_hello(&get(b, "/").await, 2);
    assert_hello(&get(a, "/").await, 1);
    assert_hello(&get(b, "/").await, 0);
    // The sixth is refused by either instance.
    assert_limited(&get(a, "/").await);
    let wait = assert_limited(&get(b, "/").await);
    let r = get(a, "/").await;
    let w = assert_limited(&r);
    assert_quota_exceeded(&r, w);
    // Another client IP has its own bucket.
    let other = Some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)));
    assert_hello(&send_from(other, b, Method::GET, "/").await, 4);
    // After the advertised wait, one more token at least, and no more than
    // one per 2 s since the bucket was full (however slow this machine is).
    tokio::time::sleep(Duration::from_secs(wait)).await;
    let r = get(b, "/").await;
    let refilled = full.elapsed().as_secs() / 2;
    assert_eq!(
        (r.status, r.body.as_str()),
        (StatusCode::OK, "hello"),
        "{r:?}"
    );
    let left = r.remaining();
    assert!(left < refilled, "{left} left of {refilled} refilled: {r:?}");
    if left == 0 {
        assert_limited(&get(a, "/").await);
    }
}

/// `POST /jobs/{id}`: 500 ms under the job's lock, JSON answer, 409 +
/// `Retry-After` from either instance meanwhile, fences strictly increasing
/// across instances; different jobs run side by side.
pub(crate) async fn check_jobs(a: SocketAddr, b: SocketAddr) {
    let job = |addr: SocketAddr, id: &'static str| {
        tokio::spawn(async move { post(addr, &format!("/jobs/{id}")).await })
    };
    // Two requests for one job at once, on two instances: one runs (500 ms
    // of work), the other is refused at once with 409 + Retry-After.
    let (x, y) = tokio::join!(job(a, "7"), job(b, "7"));
    let (x, y) = (x.unwrap(), y.unwrap());
    let (ran, refused) = if x.status == StatusCode::OK {
        (x, y)
    } else {
        (y, x)
    };
    assert_eq!(refused.status, StatusCode::CONFLICT, "{refused:?}");
    let wait = refused.retry_after();
    assert!((1..=10).contains(&wait), "Retry-After {wait}");
    assert!(ran.elapsed >= Duration::from_millis(500), "{ran:?}");
    let f1 = job_fence(&ran, "7");

    // Then one after the other, alternating instances.
    let f2 = job_fence(&post(b, "/jobs/7").await, "7");
    let f3 = job_fence(&post(a, "/jobs/7").await, "7");
    assert!(
        f1 < f2 && f2 < f3,
        "fences must strictly increase: {f1} {f2} {f3}"
    );

    // Different jobs do not exclude each other.
    let (x, y) = tokio::join!(job(a, "8"), job(b, "9"));
    job_fence(&x.unwrap(), "8");
    job_fence(&y.unwrap(), "9");

    // Ids are taken as they are, escaped in the key.
    let r = post(a, "/jobs/a%7Bb%7D%3Ac").await;
    job_fence(&r, "a{b}:c");
}

/// With Redis unreachable, `GET /` answers (fail-open: `RateLimit-Policy`
/// but no `RateLimit`) within the limiter's 100 ms timeout — the bound asserted leaves room for a loaded CI machine —
/// and `POST /jobs/{id}` answers 503.
pub(crate) async fn check_down(a: SocketAddr) {
    for _ in 0..3 {
        let r = get(a, "/").await;
        assert_eq!(r.status, StatusCode::OK, "{r:?}");
        assert_eq!(r.body, "hello");
        // Fail-open answers name the policy but make up no remaining counts.
        assert_eq!(r.expect_header("ratelimit-policy"), POLICY);
        assert!(!r.headers.contains_key("ratelimit"), "{r:?}");
        assert!(
            r.elapsed < Duration::from_secs(1),
            "GET took {:?}",
            r.elapsed
        );
    }
    let r = post(a, "/jobs/d").await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{r:?}");
    assert!(
        r.elapsed < Duration::from_secs(3),
        "POST took {:?}",
        r.elapsed
    );
}

/// Redis back: the limit is enforced again (real `RateLimit` figures) and
/// jobs run, without restarting the instance.
pub(crate) async fn check_recovered(a: SocketAddr, job: &str) {
    eventually(Duration::from_secs(10), "GET / recovers", || async {
        let r = get(a, "/").await;
        (r.status == StatusCode::OK && r.headers.contains_key("ratelimit")).then_some(())
    })
    .await;
    // The job whose acquire failed during the outage is not left locked
    // (the 10 s TTL has not passed: it was cleaned up).
    let start = Instant::now();
    eventually(
        Duration::from_secs(5),
        "the job tried during the outage is free",
        || async {
            let r = post(a, "/jobs/d").await;
            (r.status == StatusCode::OK).then(|| job_fence(&r, "d"))
        },
    )
    .await;
    assert!(start.elapsed() < Duration::from_secs(8));
    let path = format!("/jobs/{job}");
    eventually(Duration::from_secs(10), "POST /jobs recovers", || async {
        let r = post(a, &path).await;
        (r.status == StatusCode::OK).then(|| job_fence(&r, job))
    })
    .await;
}

// ------------------------------------------------------------------------
// Example binaries.

/// A running example process; killed on drop.
pub(crate) struct Example {
    pub(crate) addr: SocketAddr,
    pub(crate) line: String,
    pub(crate) child: tokio::process::Child,
}

/// Starts the example `name` with `env` on a free port and reads its
/// `listening on http://<addr> …` line.
pub(crate) async fn launch(name: &str, env: &[(&str, &str)]) -> Example {
    let mut cmd = tokio::process::Command::new(example_bin(name));
    cmd.env_remove("REDIS_URL")
        .env_remove("REDIS_CLUSTER")
        .env("TOLLGATE_ADDR", "127.0.0.1:0")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("the example starts");
    let stdout = child.stdout.take().unwrap();
    let mut line = String::new();
    tokio::time::timeout(
        Duration::from_secs(30),
        tokio::io::BufReader::new(stdout).read_line(&mut line),
    )
    .await
    .expect("the example prints its address within 30 s")
    .unwrap();
    let line = line.trim_end().to_owned();
    let addr = line
        .strip_prefix("listening on http://")
        .and_then(|rest| rest.split(' ').next())
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .parse()
        .unwrap_or_else(|e| panic!("no address in {line:?}: {e}"));
    Example { addr, line, child }
}

/// The path of the built example `name` (`<target>/<profile>/examples/name`).
///
/// `cargo test` builds every example before it runs the tests, so the binary
/// is there and fresh. When only this test target was built (`cargo test
/// --test …`) and the binary is missing or older than the sources, it is
/// built here with `cargo build --example name`.
pub(crate) fn example_bin(name: &str) -> std::path::PathBuf {
    use std::sync::Mutex;
    // Names already checked (and built if need be) by this test process.
    static CHECKED: Mutex<Vec<String>> = Mutex::new(Vec::new());

    let exe = std::env::current_exe().expect("the test binary's path");
    // <target>/<profile>/deps/<test>-<hash>
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("the test binary lives in <target>/<profile>/deps");
    let bin = profile_dir
        .join("examples")
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    let mut checked = CHECKED.lock().unwrap_or_else(|e| e.into_inner());
    if !checked.iter().any(|n| n == name) && (!bin.exists() || is_stale(&bin)) {
        let target_dir = profile_dir.parent().expect("<target>");
        let mut cmd = std::process::Command::new(env!("CARGO"));
        cmd.args(["build", "--example", name, "--manifest-path"])
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"))
            .env("CARGO_TARGET_DIR", target_dir);
        if profile_dir.file_name().is_some_and(|p| p == "release") {
            cmd.arg("--release");
        }
        let status = cmd.status().expect("cargo runs");
        assert!(status.success(), "cargo build --example {name} failed");
    }
    checked.push(name.to_owned());
    assert!(bin.exists(), "{} was not built", bin.display());
    bin
}

/// The path of the `tollgate` CLI binary (`<target>/<profile>/tollgate`),
/// built here with `cargo build -p tollgate-cli` when missing or older than
/// the sources (a root test target does not build other packages' binaries).
pub(crate) fn cli_bin() -> std::path::PathBuf {
    use std::sync::Once;
    static BUILT: Once = Once::new();
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("the test binary lives in <target>/<profile>/deps");
    let bin = profile_dir.join(format!("tollgate{}", std::env::consts::EXE_SUFFIX));
    BUILT.call_once(|| {
        let cli_src = concat!(env!("CARGO_MANIFEST_DIR"), "/crates/tollgate-cli/src");
        let stale = is_stale(&bin)
            || std::fs::metadata(&bin)
                .and_then(|b| b.modified())
                .ok()
                .zip(newest_in(std::path::Path::new(cli_src)))
                .is_some_and(|(built, src)| src > built);
        if !stale {
            return;
        }
        let target_dir = profile_dir.parent().expect("<target>");
        let mut cmd = std::process::Command::new(env!("CARGO"));
        cmd.args(["build", "-p", "tollgate-cli", "--manifest-path"])
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"))
            .env("CARGO_TARGET_DIR", target_dir);
        if profile_dir.file_name().is_some_and(|p| p == "release") {
            cmd.arg("--release");
        }
        let status = cmd.status().expect("cargo runs");
        assert!(status.success(), "cargo build -p tollgate-cli failed");
    });
    assert!(bin.exists(), "{} was not built", bin.display());
    bin
}

/// The newest modification time of a file under `dir`.
fn newest_in(dir: &std::path::Path) -> Option<std::time::SystemTime> {
    let mut latest = None;
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        let t = if path.is_dir() {
            newest_in(&path)
        } else {
            entry.metadata().and_then(|m| m.modified()).ok()
        };
        latest = latest.max(t);
    }
    latest
}

/// Whether a source file of the workspace is newer than `bin`.
fn is_stale(bin: &std::path::Path) -> bool {
    fn newest(dir: &std::path::Path, acc: &mut std::time::SystemTime) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                newest(&path, acc);
            } else if let Ok(m) = entry.metadata().and_then(|m| m.modified()) {
                *acc = (*acc).max(m);
            }
        }
    }
    let Ok(built) = std::fs::metadata(bin).and_then(|m| m.modified()) else {
        return true;
    };
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut latest = std::time::SystemTime::UNIX_EPOCH;
    newest(&root.join("examples"), &mut latest);
    newest(&root.join("src"), &mut latest);
    for krate in ["tollgate-core", "tollgate-tower", "tollgate-axum"] {
        newest(&root.join("crates").join(krate).join("src"), &mut latest);
        newest(&root.join("crates").join(krate).join("lua"), &mut latest);
    }
    latest > built
}
