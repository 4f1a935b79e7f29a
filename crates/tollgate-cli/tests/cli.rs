//! The `tollgate` binary against real Redis processes: an application's
//! limiter (built here with the library) registers itself, and the binary,
//! knowing nothing but the store, lists it, sees who it throttles and
//! changes their state.

use std::process::{Command, Output};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;
use tollgate::admin::Admin;
use tollgate::idempotency::{Claim, Fingerprint, IdempotencyStore, StoredResponse};
use tollgate::{
    Algorithm, Backend, DecisionSource, LockOptions, Locker, Quota, RateLimiter, RedisBackend,
    Subject,
};
use tollgate_testkit::{eventually, unique, RedisCluster, RedisServer};

/// The application's key: it needs escaping, so its id differs from it.
const KEY: &str = "user:{7}";
const ID: &str = "user%3A%7B7%7D";

/// Runs the binary with `args`, the environment's stores removed so only
/// the flags count; off the runtime's threads (it blocks).
async fn tollgate(args: &[&str]) -> Output {
    tollgate_with(args, &[]).await
}

async fn tollgate_with(args: &[&str], env: &[(&str, &str)]) -> Output {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args(&args)
            .env_remove("REDIS_URL")
            .env_remove("REDIS_CLUSTER")
            .envs(env)
            .output()
            .expect("the binary runs")
    })
    .await
    .unwrap()
}

/// The binary pointed at one store and prefix.
struct Tollgate {
    base: Vec<String>,
}

impl Tollgate {
    fn redis(url: &str, prefix: &str) -> Self {
        Tollgate {
            base: vec![
                "--redis".into(),
                url.into(),
                "--prefix".into(),
                prefix.into(),
            ],
        }
    }

    async fn run(&self, rest: &[&str]) -> Output {
        let args: Vec<&str> = self
            .base
            .iter()
            .map(String::as_str)
            .chain(rest.iter().copied())
            .collect();
        tollgate(&args).await
    }
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The binary succeeded: its stdout.
fn ok(out: Output) -> String {
    assert!(
        out.status.success(),
        "tollgate failed ({}): {}",
        out.status,
        stderr(&out)
    );
    stdout(&out)
}

/// The binary succeeded: its stdout as JSON.
fn json(out: Output) -> Value {
    let text = ok(out);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// The application's `login` limiter: a sliding window log of 3 a minute;
/// with its deny cache (the default) or asking the store every time.
fn login(backend: impl Into<Backend>, prefix: &str, deny_cache: bool) -> RateLimiter {
    RateLimiter::builder(backend.into(), Algorithm::SlidingWindowLog)
        .quota(Quota::per_minute(3))
        .prefix(prefix)
        .name("login")
        .deny_cache(if deny_cache { 1024 } else { 0 })
        .build()
        .unwrap()
}

/// Takes the subject's whole quota and one more: denied.
async fn throttle(limiter: &RateLimiter) {
    for _ in 0..3 {
        assert!(limiter.check(KEY).await.unwrap().allowed);
    }
    assert!(!limiter.check(KEY).await.unwrap().allowed);
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_limiters_and_who_is_throttled_from_the_store_alone() {
    let redis = RedisServer::start().unwrap();
    let prefix = unique("cli");
    let app = login(
        RedisBackend::connect(&redis.url()).await.unwrap(),
        &prefix,
        false,
    );
    throttle(&app).await;
    assert_eq!(Subject::new(KEY).as_encoded(), ID);

    let cli = Tollgate::redis(&redis.url(), &prefix);

    // What the admin API serves: the core's views, as serde writes them
    // (but the traffic figures, which move from one call to the next).
    let listed = json(cli.run(&["limiters", "--json"]).await);
    let admin = Admin::new(RedisBackend::connect(&redis.url()).await.unwrap()).with_prefix(&prefix);
    let expected = serde_json::json!({ "limiters": admin.limiters().await.unwrap() });
    let without_traffic = |v: &Value| {
        let mut v = v.clone();
        for l in v["limiters"].as_array_mut().unwrap() {
            if let Some(t) = l.as_object_mut().unwrap().remove("traffic") {
                assert!(t["allowed_per_second"].is_number(), "{t}");
                assert!(t["denied_per_second"].is_number(), "{t}");
            }
        }
        v
    };
    assert_eq!(without_traffic(&listed), without_traffic(&expected));
    let login = &listed["limiters"][0];
    assert_eq!(login["name"], "login", "{listed}");
    assert_eq!(login["algorithm"], "sliding_window_log");
    assert_eq!(login["quotas"][0]["limit"], 3);
    assert_eq!(login["quotas"][0]["period_seconds"], 60);
    assert_eq!(listed["limiters"].as_array().unwrap().len(), 1, "{listed}");

    let table = ok(cli.run(&["limiters"]).await);
    let mut lines = table.lines();
    let header = lines.next().unwrap();
    assert!(
        header.starts_with("NAME") && header.contains("ALGORITHM") && header.contains("QUOTAS"),
        "{table}"
    );
    let row = lines.next().unwrap();
    assert!(
        row.starts_with("login ") && row.contains("sliding_window_log"),
        "{table}"
    );
    assert!(row.contains("3 per 1m"), "{table}");

    // Instances report their denials about once a second.
    let subjects = eventually(
        Duration::from_secs(5),
        "the denial in `throttled`",
        || async {
            let listed = json(cli.run(&["throttled", "--json"]).await);
            let subjects = listed["subjects"].as_array().unwrap().clone();
            subjects
                .iter()
                .any(|s| s["subject"] == ID)
                .then_some(subjects)
        },
    )
    .await;
    let ours = subjects.iter().find(|s| s["subject"] == ID).unwrap();
    assert_eq!(ours["limiter"], "login");
    assert!(ours["denied"].as_u64().unwrap() >= 1, "{ours}");
    assert!(
        ours["last_denied_ms"].as_u64().unwrap() <= now_ms(),
        "{ours}"
    );
    assert!(ours.get("label").is_some(), "{ours}");

    let table = ok(cli.run(&["throttled", "--limit", "5"]).await);
    let mut lines = table.lines();
    let header = lines.next().unwrap();
    for column in ["LIMITER", "SUBJECT", "LABEL", "DENIED", "LAST DENIED"] {
        assert!(header.contains(column), "{table}");
    }
    assert!(
        lines.any(|l| l.starts_with("login ") && l.contains(ID)),
        "{table}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_reset_block_and_unblock_reach_every_instance() {
    let redis = RedisServer::start().unwrap();
    let prefix = unique("cli");
    // Two instances of one application, each with its own connection; the
    // second repeats denials from its deny cache.
    let plain = login(
        RedisBackend::connect(&redis.url()).await.unwrap(),
        &prefix,
        false,
    );
    let cached = login(
        RedisBackend::connect(&redis.url()).await.unwrap(),
        &prefix,
        true,
    );
    throttle(&plain).await;
    assert!(!cached.check(KEY).await.unwrap().allowed);
    let again = cached.check(KEY).await.unwrap();
    assert!(!again.allowed);
    assert_eq!(again.source, DecisionSource::DenyCache);

    let cli = Tollgate::redis(&redis.url(), &prefix);

    // inspect: the exhausted subject.
    let state = json(cli.run(&["inspect", "login", ID, "--json"]).await);
    assert_eq!(state["limiter"], "login");
    assert_eq!(state["subject"], ID);
    assert_eq!(state["remaining"], 0);
    assert_eq!(state["limit"], 3);
    let retry = state["retry_after_ms"].as_u64().expect("a retry-after");
    assert!(retry > 0 && retry <= 60_000, "{state}");
    assert!(state["blocked_until_ms"].is_null(), "{state}");
    let table = ok(cli.run(&["inspect", "login", ID]).await);
    let lines: Vec<&str> = table.lines().collect();
    assert!(
        lines[0].starts_with("LIMITER") && lines[0].contains("REMAINING"),
        "{table}"
    );
    assert!(
        lines[1].starts_with("login ") && lines[1].contains("0/3"),
        "{table}"
    );

    // reset: both instances admit again, the cached one within a second.
    let said = ok(cli.run(&["reset", "login", ID]).await);
    assert!(said.contains("reset") && said.contains(ID), "{said}");
    eventually(
        Duration::from_secs(1),
        "the deny-cached instance admits",
        || async { cached.check(KEY).await.unwrap().allowed.then_some(()) },
    )
    .await;
    assert!(plain.check(KEY).await.unwrap().allowed);
    let state = json(cli.run(&["inspect", "login", ID, "--json"]).await);
    assert_eq!(state["remaining"], 1, "{state}");

    // block: refused everywhere, with an honest retry-after, whatever the quota.
    let before = now_ms();
    assert_eq!(
        json(cli.run(&["block", "login", ID, "60", "--json"]).await),
        serde_json::json!({"ok": true})
    );
    let refused = plain.check(KEY).await.unwrap();
    assert!(!refused.allowed);
    let wait = refused.retry_after.expect("a retry-after");
    assert!(
        wait > Duration::ZERO && wait <= Duration::from_secs(60),
        "{wait:?}"
    );
    eventually(
        Duration::from_secs(1),
        "the deny-cached instance refuses",
        || async { (!cached.check(KEY).await.unwrap().allowed).then_some(()) },
    )
    .await;
    let state = json(cli.run(&["inspect", "login", ID, "--json"]).await);
    let until = state["blocked_until_ms"].as_u64().expect("blocked");
    assert!(
        until >= before + 59_000 && until <= now_ms() + 60_000,
        "{state}"
    );
    let said = ok(cli.run(&["block", "login", ID, "30"]).await);
    assert!(said.contains("blocked") && said.contains("30s"), "{said}");

    // unblock: admitted again everywhere (one unit is left).
    let said = ok(cli.run(&["unblock", "login", ID]).await);
    assert!(said.contains("unblocked") && said.contains(ID), "{said}");
    eventually(
        Duration::from_secs(1),
        "the deny-cached instance admits",
        || async { cached.check(KEY).await.unwrap().allowed.then_some(()) },
    )
    .await;
    let state = json(cli.run(&["inspect", "login", ID, "--json"]).await);
    assert!(state["blocked_until_ms"].is_null(), "{state}");
    assert_eq!(
        json(cli.run(&["unblock", "login", ID, "--json"]).await),
        serde_json::json!({"ok": true})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holders_lists_a_held_lock_with_this_process_as_holder() {
    let redis = RedisServer::start().unwrap();
    let prefix = unique("cli");
    let backend = RedisBackend::connect(&redis.url()).await.unwrap();
    let locker = Locker::builder(backend).prefix(&prefix).build().unwrap();
    let options = LockOptions::new().ttl(Duration::from_secs(30));
    let lease = locker.acquire("orders", &options).await.unwrap();

    let url = redis.url();
    let listed = json(tollgate(&["--redis", &url, "--prefix", &prefix, "holders", "--json"]).await);
    let holders = listed["holders"].as_array().unwrap();
    let ours = holders
        .iter()
        .find(|h| h["subject"] == "orders")
        .unwrap_or_else(|| panic!("the lock in {listed}"));
    assert_eq!(ours["kind"], "lock");
    assert_eq!(ours["fence"], lease.fence().get());
    let holder = ours["holder"].as_str().unwrap();
    assert!(
        holder.ends_with(&format!(":{}", std::process::id())),
        "{holder}"
    );
    let ttl = ours["ttl_ms"].as_u64().unwrap();
    assert!(ttl > 0 && ttl <= 30_000, "{ours}");

    let table = ok(tollgate(&["--redis", &url, "--prefix", &prefix, "holders"]).await);
    let mut lines = table.lines();
    let header = lines.next().unwrap();
    assert!(
        header.starts_with("KIND") && header.contains("HOLDER"),
        "{table}"
    );
    assert!(
        lines.any(|l| l.starts_with("lock ") && l.contains("orders")),
        "{table}"
    );

    // A stuck lock broken from the CLI: another holder gets it at once,
    // with a higher fence, and the broken lease learns it is lost.
    let broke = ok(tollgate(&[
        "--redis",
        &url,
        "--prefix",
        &prefix,
        "break-lock",
        "lock",
        "orders",
    ])
    .await);
    assert!(broke.contains("broke lock lock orders"), "{broke}");
    let next = locker.try_acquire("orders", &options).await.unwrap();
    assert!(next.fence() > lease.fence());
    assert!(!lease.extend(Duration::from_secs(30)).await.unwrap());
    let again = ok(tollgate(&[
        "--redis",
        &url,
        "--prefix",
        &prefix,
        "break-lock",
        "lock",
        "nothing",
    ])
    .await);
    assert!(again.contains("was not held"), "{again}");
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_lists_a_running_idempotency_key_until_it_completes() {
    let redis = RedisServer::start().unwrap();
    let prefix = unique("cli");
    let backend = RedisBackend::connect(&redis.url()).await.unwrap();
    let records = IdempotencyStore::builder(backend)
        .prefix(&prefix)
        .lease(LockOptions::new().ttl(Duration::from_secs(30)))
        .build()
        .unwrap();
    let key = Subject::compound(["tenant-7", "POST /orders", "order-4411"]);
    let payload = Fingerprint::of(b"{\"qty\":2}");
    let Claim::Claimed(claim) = records.claim(key.clone(), payload).await.unwrap() else {
        panic!("claimed");
    };
    let cli = Tollgate::redis(&redis.url(), &prefix);

    let out = ok(cli.run(&["in-flight", "--json"]).await);
    assert!(!out.contains(&payload.to_hex()[..16]), "{out}");
    let listed: Value = serde_json::from_str(&out).unwrap();
    let keys = listed["in_flight"].as_array().unwrap();
    assert_eq!(keys.len(), 1, "{listed}");
    assert_eq!(keys[0]["name"], "idem");
    assert_eq!(keys[0]["key"], key.as_encoded());
    assert_eq!(keys[0]["fence"], claim.fence().get());
    assert!(keys[0]["held_ms"].is_u64(), "{listed}");
    let ttl = keys[0]["ttl_ms"].as_u64().unwrap();
    assert!(ttl > 0 && ttl <= 30_000, "{listed}");

    let table = ok(cli.run(&["in-flight"]).await);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 2, "{table}");
    assert!(
        lines[0].starts_with("STORE") && lines[0].contains("LEASE LEFT"),
        "{table}"
    );
    assert!(
        lines[1].starts_with("idem ") && lines[1].contains(key.as_encoded()),
        "{table}"
    );
    assert!(
        lines[1].contains(&claim.fence().get().to_string()),
        "{table}"
    );

    let done = StoredResponse::new(201, vec![], b"{}".to_vec());
    assert!(claim.complete(&done).await.unwrap());
    assert_eq!(
        ok(cli.run(&["in-flight", "--json"]).await).trim_end(),
        r#"{"in_flight":[]}"#
    );
    assert_eq!(ok(cli.run(&["in-flight"]).await).lines().count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_lists_and_resets() {
    let cluster = RedisCluster::start().unwrap();
    let prefix = unique("cli");
    let seeds = cluster.seeds();
    let app = login(
        RedisBackend::connect_cluster(&seeds).await.unwrap(),
        &prefix,
        true,
    );
    throttle(&app).await;
    let again = app.check(KEY).await.unwrap();
    assert_eq!(again.source, DecisionSource::DenyCache);

    let seeds = seeds.join(",");
    let listed = json(
        tollgate(&[
            "--cluster",
            &seeds,
            "--prefix",
            &prefix,
            "limiters",
            "--json",
        ])
        .await,
    );
    assert_eq!(listed["limiters"][0]["name"], "login", "{listed}");
    assert_eq!(listed["limiters"][0]["algorithm"], "sliding_window_log");

    // REDIS_CLUSTER is read as --cluster is.
    let said = ok(tollgate_with(
        &["--prefix", &prefix, "reset", "login", ID],
        &[("REDIS_CLUSTER", &seeds)],
    )
    .await);
    assert!(said.contains("reset"), "{said}");
    eventually(
        Duration::from_secs(1),
        "the deny-cached instance admits",
        || async { app.check(KEY).await.unwrap().allowed.then_some(()) },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mistakes_exit_non_zero_with_a_message() {
    let redis = RedisServer::start().unwrap();
    let url = redis.url();

    // Nothing listens on port 1: said at once, not after the timeout.
    let started = Instant::now();
    let out = tollgate(&["--redis", "redis://127.0.0.1:1", "limiters"]).await;
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("refused"), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("cannot connect to Redis at redis://127.0.0.1:1"),
        "{}",
        stderr(&out)
    );
    assert!(stdout(&out).is_empty());

    let out = tollgate(&["--redis", "no-such-scheme://x", "limiters"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).starts_with("tollgate: cannot connect"),
        "{}",
        stderr(&out)
    );

    // A password never shows in a message.
    let out = tollgate(&["--redis", "redis://:s3cret@127.0.0.1:1", "limiters"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(!stderr(&out).contains("s3cret"), "{}", stderr(&out));

    // No store at all.
    let out = tollgate(&["limiters"]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--redis"), "{}", stderr(&out));

    // A prefix no application uses: an empty table and a hint.
    let out = tollgate(&["--redis", &url, "--prefix", "nobody", "limiters"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out).trim_end(),
        "NAME  ALGORITHM  QUOTAS  ALLOWED/S  DENIED/S"
    );
    assert!(stderr(&out).contains("\"nobody\""), "{}", stderr(&out));

    // An unknown limiter.
    let out = tollgate(&["--redis", &url, "inspect", "nope", "alice"]).await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("nope") && stderr(&out).contains("registered"),
        "{}",
        stderr(&out)
    );

    // Invalid arguments: the parser's own errors.
    for args in [
        &["--redis", &url, "block", "login", "alice", "soon"][..],
        &["--redis", &url, "block", "login", "alice", "0"][..],
        // Past the longest block the store takes (366 days).
        &["--redis", &url, "block", "login", "alice", "31622401"][..],
        &["--redis", &url, "inspect", "login", "a{b"][..],
        // `@` escaped by hand: no subject encodes to it, so the block
        // would land on a key nobody checks.
        &[
            "--redis",
            &url,
            "block",
            "login",
            "alice%40example.com",
            "600",
        ][..],
        &["--redis", &url, "throttled", "--limit", "0"][..],
        &["--redis", &url, "frobnicate"][..],
    ] {
        let out = tollgate(args).await;
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("error:"),
            "{args:?}: {}",
            stderr(&out)
        );
    }

    // A name the store's keys cannot carry, or one the operator plane
    // keeps for itself, refused by the library: a usage error too, not a
    // store that failed.
    for args in [
        &["--redis", &url, "break-lock", "a{b", "x"][..],
        &["--redis", &url, "break-permits", "throttled", "x"][..],
    ] {
        let out = tollgate(args).await;
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_does_not_answer_times_out() {
    let redis = RedisServer::start().unwrap();
    redis.pause();
    let started = Instant::now();
    let out = tollgate(&["--redis", &redis.url(), "--timeout", "1", "limiters"]).await;
    redis.resume();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("within 1s"), "{}", stderr(&out));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn help_speaks_to_an_operator() {
    let out = tollgate(&["--help"]).await;
    let help = ok(out);
    for word in [
        "limiters",
        "inspect",
        "reset",
        "block",
        "unblock",
        "throttled",
        "holders",
        "in-flight",
        "--redis",
        "REDIS_URL",
        "--cluster",
        "REDIS_CLUSTER",
        "--json",
        "Exit status",
    ] {
        assert!(help.contains(word), "{word} in {help}");
    }
    let help = ok(tollgate(&["block", "--help"]).await);
    assert!(
        help.contains("SECONDS") && help.contains("Retry-After"),
        "{help}"
    );
}
