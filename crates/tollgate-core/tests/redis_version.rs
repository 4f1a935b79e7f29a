//! The Redis version is checked once per connection setup (issue #16,
//! defect 7): the installed redis-server (7.x) passes on every kind of
//! connection, and a server that reports 4.x is refused with a clear error.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};

use tollgate_core::{Error, Quota, RateLimiter, RedisBackend};
use tollgate_testkit::{RedisCluster, RedisServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_server_passes() {
    let server = RedisServer::start().unwrap();
    let info = server.cli(&["INFO", "server"]);
    assert!(info.contains("redis_version:"), "{info}");

    let backend = RedisBackend::connect(&server.url()).await.unwrap();
    backend.check_server_version().await.unwrap();
    let limiter = RateLimiter::gcra(backend, Quota::per_second(5)).unwrap();
    assert!(limiter.check("v").await.unwrap().allowed);

    let lazy = RedisBackend::connect_lazy(&server.url()).unwrap();
    lazy.check_server_version().await.unwrap();

    let cluster = RedisCluster::start().unwrap();
    let backend = RedisBackend::connect_cluster(cluster.seeds())
        .await
        .unwrap();
    backend.check_server_version().await.unwrap();

    #[cfg(feature = "sentinel")]
    {
        let sentinel = RedisServer::start_sentinel(&server, "main").unwrap();
        let backend = RedisBackend::sentinel(&[sentinel.url()], "main").unwrap();
        backend.check_server_version().await.unwrap();
        let limiter = RateLimiter::gcra(backend, Quota::per_second(5)).unwrap();
        assert!(limiter.check("s").await.unwrap().allowed);
    }
}

/// A stand-in for an old Redis on a loopback port: answers `INFO` with
/// `redis_version:<version>` and every other command with `+OK`.
fn fake_redis(version: &'static str) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || serve(stream, version));
        }
    });
    port
}

fn serve(stream: TcpStream, version: &str) {
    let mut out = stream.try_clone().unwrap();
    let mut r = BufReader::new(stream);
    let mut line = String::new();
    let mut read_line = |r: &mut BufReader<TcpStream>| -> Option<String> {
        line.clear();
        (r.read_line(&mut line).ok()? > 0).then(|| line.trim_end().to_owned())
    };
    // Requests are arrays of bulk strings.
    while let Some(header) = read_line(&mut r) {
        let Ok(n) = header.trim_start_matches('*').parse::<usize>() else {
            return;
        };
        let mut args = Vec::new();
        for _ in 0..n {
            let Some(len) = read_line(&mut r).and_then(|l| l[1..].parse::<usize>().ok()) else {
                return;
            };
            let mut buf = vec![0; len + 2];
            if r.read_exact(&mut buf).is_err() {
                return;
            }
            args.push(String::from_utf8_lossy(&buf[..len]).to_uppercase());
        }
        let reply = if args.first().is_some_and(|a| a == "INFO") {
            let body = format!("# Server\r\nredis_version:{version}\r\nredis_mode:standalone\r\n");
            format!("${}\r\n{body}\r\n", body.len())
        } else {
            "+OK\r\n".to_owned()
        };
        if out.write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_server_is_refused_at_connect() {
    let url = format!("redis://127.0.0.1:{}", fake_redis("4.0.14"));
    let err = RedisBackend::connect(&url).await.unwrap_err();
    let Error::InvalidConfig(message) = &err else {
        panic!("expected InvalidConfig, got {err:?}");
    };
    assert!(
        message.contains("4.0.14") && message.contains("5.0 or newer"),
        "{message}"
    );
    assert!(!err.is_unavailable());

    // connect_lazy cannot check at construction; the explicit check does.
    let lazy = RedisBackend::connect_lazy(&url).unwrap();
    let err = lazy.check_server_version().await.unwrap_err();
    assert!(matches!(err, Error::InvalidConfig(_)), "{err:?}");

    // 5.0 is the oldest that passes.
    let url = format!("redis://127.0.0.1:{}", fake_redis("5.0.0"));
    RedisBackend::connect(&url).await.unwrap();
}

/// A server that may evict tollgate's keys is reported (and connecting
/// logs a warning): any maxmemory-policy but noeviction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicting_server_is_reported() {
    let safe = RedisServer::start().unwrap();
    let backend = RedisBackend::connect(&safe.url()).await.unwrap();
    assert_eq!(backend.eviction_policy().await.unwrap(), None);
    for policy in ["allkeys-lru", "volatile-ttl"] {
        let risky = RedisServer::start_with_args(&["--maxmemory-policy", policy]).unwrap();
        let backend = RedisBackend::connect(&risky.url()).await.unwrap();
        assert_eq!(
            backend.eviction_policy().await.unwrap().as_deref(),
            Some(policy)
        );
    }
}
