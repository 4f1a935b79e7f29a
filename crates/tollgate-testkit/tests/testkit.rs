//! Tests of the testkit against real redis-server processes.

use std::collections::HashSet;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::process::Command;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use tollgate_testkit::{RedisCluster, RedisServer, TestkitError};

fn accepts_connections(port: u16) -> bool {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
}

/// Whether `pid` is a live (not zombie) process.
fn process_exists(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state is the first field after the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

async fn ping(con: &mut impl redis::aio::ConnectionLike) -> redis::RedisResult<String> {
    redis::cmd("PING").query_async(con).await
}

#[tokio::test]
async fn start_ping_stop() {
    let mut server = RedisServer::start().expect("start redis-server");
    let port = server.port();
    assert!((20_000..55_535).contains(&port), "port {port}");
    assert_eq!(server.addr(), format!("127.0.0.1:{port}"));
    assert_eq!(server.url(), format!("redis://127.0.0.1:{port}/"));
    assert!(server.is_running());
    assert!(server.pid().is_some());

    assert_eq!(server.cli(&["PING"]), "PONG");
    assert_eq!(
        server.cli(&["CONFIG", "GET", "appendonly"]),
        "appendonly\nno"
    );
    assert_eq!(server.cli(&["CONFIG", "GET", "save"]), "save");

    let mut con = server.multiplexed().await;
    assert_eq!(ping(&mut con).await.unwrap(), "PONG");
    let mut manager = server.connection_manager().await;
    let _: () = manager.set("k", "v").await.unwrap();
    assert_eq!(server.cli(&["DBSIZE"]), "1");
    let sync_con = server.client().get_connection();
    assert!(sync_con.is_ok());

    server.stop();
    assert!(!server.is_running());
    assert_eq!(server.pid(), None);
    assert!(!accepts_connections(port));
    server.stop(); // idempotent
    assert!(!server.is_running());
}

#[test]
fn drop_kills_process_even_when_paused() {
    let server = RedisServer::start().expect("start redis-server");
    let pid = server.pid().unwrap();
    let port = server.port();
    assert!(process_exists(pid));
    server.pause();
    let started = Instant::now();
    drop(server);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "drop took {:?}",
        started.elapsed()
    );
    assert!(!process_exists(pid), "pid {pid} survived drop");
    assert!(!accepts_connections(port));
}

#[test]
fn extra_args_are_applied_and_bad_args_report_the_log() {
    let server = RedisServer::start_with_args(&["--maxmemory", "12mb"]).expect("start");
    assert_eq!(
        server.cli(&["CONFIG", "GET", "maxmemory"]),
        "maxmemory\n12582912"
    );
    drop(server);

    let err = RedisServer::start_with_args(&["--no-such-directive", "1"]).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, TestkitError::Startup(_)), "{err:?}");
    assert!(msg.contains("no-such-directive"), "log not included: {msg}");
}

#[tokio::test]
async fn pause_times_out_and_resume_recovers() {
    let server = RedisServer::start().expect("start redis-server");
    let mut con = server.multiplexed().await;
    assert_eq!(ping(&mut con).await.unwrap(), "PONG");

    server.pause();
    let started = Instant::now();
    // The multiplexed connection's 500 ms response timeout fires; the outer
    // timeout only guards the test against hanging.
    let paused = tokio::time::timeout(Duration::from_secs(5), ping(&mut con))
        .await
        .expect("redis-rs response timeout should fire before 5 s");
    let err = paused.expect_err("a paused server must not answer");
    assert!(err.is_timeout(), "expected a timeout, got {err:?}");
    assert!(started.elapsed() >= Duration::from_millis(400));

    server.resume();
    let mut recovered = None;
    for _ in 0..20 {
        if let Ok(pong) = ping(&mut con).await {
            recovered = Some(pong);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(recovered.as_deref(), Some("PONG"));
    assert_eq!(server.cli(&["PING"]), "PONG");
}

#[tokio::test]
async fn restart_loses_data_and_keeps_port() {
    let mut server = RedisServer::start().expect("start redis-server");
    let port = server.port();
    let old_pid = server.pid().unwrap();
    let mut con = server.connection_manager().await;
    let _: () = con.set("doomed", "1").await.unwrap();
    assert_eq!(server.cli(&["GET", "doomed"]), "1");

    server.restart().expect("restart");
    assert_eq!(server.port(), port);
    assert!(server.is_running());
    assert_ne!(server.pid(), Some(old_pid));
    assert!(!process_exists(old_pid));
    assert_eq!(server.cli(&["DBSIZE"]), "0");

    // The ConnectionManager reconnects to the same address.
    let mut value: Option<String> = Some("stale".into());
    for _ in 0..50 {
        if let Ok(v) = con.get("doomed").await {
            value = v;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(value, None);

    // Restarting a stopped server works too, and a paused one can be restarted.
    server.stop();
    server.restart().expect("restart after stop");
    server.pause();
    server.restart().expect("restart while paused");
    assert_eq!(server.port(), port);
    assert_eq!(server.cli(&["PING"]), "PONG");
}

#[test]
fn concurrent_starts_get_distinct_ports() {
    const THREADS: usize = 8;
    let barrier = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|_| {
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                barrier.wait();
                RedisServer::start().expect("start redis-server")
            })
        })
        .collect();
    let servers: Vec<RedisServer> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let ports: HashSet<u16> = servers.iter().map(RedisServer::port).collect();
    assert_eq!(ports.len(), THREADS, "ports {ports:?}");
    let pids: HashSet<u32> = servers.iter().filter_map(RedisServer::pid).collect();
    assert_eq!(pids.len(), THREADS);
    for server in &servers {
        // Each port is served by its own process.
        let info = server.cli(&["INFO", "server"]);
        let expected = format!("process_id:{}", server.pid().unwrap());
        assert!(info.lines().any(|l| l.trim() == expected), "{info}");
    }
}

#[tokio::test]
async fn cluster_starts_and_routes_across_nodes() {
    let started = Instant::now();
    let cluster = RedisCluster::start().expect("start cluster");
    let startup = started.elapsed();
    eprintln!("cluster started in {startup:?}");
    assert!(
        startup < Duration::from_secs(15),
        "cluster start took {startup:?}"
    );

    assert_eq!(cluster.nodes().len(), 3);
    assert_eq!(
        cluster.seeds(),
        cluster
            .nodes()
            .iter()
            .map(RedisServer::url)
            .collect::<Vec<_>>()
    );
    for node in cluster.nodes() {
        let info = node.cli(&["CLUSTER", "INFO"]);
        assert!(info.contains("cluster_state:ok"), "{info}");
        assert!(info.contains("cluster_known_nodes:3"), "{info}");
    }

    let mut con = cluster.connection().await;
    let keys: Vec<String> = (0..30).map(|i| format!("key-{i}")).collect();
    for key in &keys {
        let _: () = con.set(key, format!("v-{key}")).await.unwrap();
    }
    for key in &keys {
        let value: String = con.get(key).await.unwrap();
        assert_eq!(value, format!("v-{key}"));
    }
    // The keys really are spread over all three masters.
    let sizes: Vec<u64> = cluster
        .nodes()
        .iter()
        .map(|n| n.cli(&["DBSIZE"]).parse().unwrap())
        .collect();
    assert_eq!(sizes.iter().sum::<u64>(), keys.len() as u64, "{sizes:?}");
    assert!(sizes.iter().all(|&n| n > 0), "{sizes:?}");
}

#[test]
fn cluster_node_restart_rejoins() {
    let mut cluster = RedisCluster::start().expect("start cluster");
    let node = &mut cluster.nodes_mut()[1];
    let port = node.port();
    node.restart().expect("restart node");
    assert_eq!(node.port(), port);
    // It reloads its nodes.conf and keeps its slots.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let info = cluster.nodes()[1].cli(&["CLUSTER", "INFO"]);
        if info.contains("cluster_state:ok") && info.contains("cluster_known_nodes:3") {
            break;
        }
        assert!(Instant::now() < deadline, "node did not rejoin: {info}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A killed master whose replica will not hold an election
/// (`cluster-replica-no-failover`) is still failed over: after the stalled
/// election's bound the replica takes over, and `kill_master` returns it.
#[test]
fn a_stalled_election_ends_in_a_takeover() {
    let mut cluster = RedisCluster::start_with_replicas(1).expect("start cluster");
    let master = cluster.masters()[0];
    let replica = cluster.replicas_of(master)[0];
    assert_eq!(
        cluster.nodes()[replica].cli(&["CONFIG", "SET", "cluster-replica-no-failover", "yes"]),
        "OK"
    );
    let promoted = cluster
        .kill_master(master)
        .expect("promoted by the takeover");
    assert_eq!(promoted, replica);
    assert!(cluster.nodes()[replica]
        .cli(&["ROLE"])
        .starts_with("master"));
}

#[test]
fn require_binaries_succeeds_here() {
    tollgate_testkit::require_binaries().expect("redis-server and redis-cli are installed");
}

/// Run in a child process by `leaked_servers_die_with_the_test_process`.
#[test]
#[ignore = "helper: only does something when run by another test"]
fn leak_helper() {
    if std::env::var_os("TOLLGATE_TESTKIT_LEAK_HELPER").is_none() {
        return;
    }
    let server = RedisServer::start().expect("start redis-server");
    println!("LEAKED {} {}", server.pid().unwrap(), server.port());
    // Never dropped, like a server kept in a static.
    std::mem::forget(server);
}

#[test]
fn leaked_servers_die_with_the_test_process() {
    let output = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "leak_helper",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("TOLLGATE_TESTKIT_LEAK_HELPER", "1")
        .output()
        .expect("run helper");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "helper failed: {stdout}");
    let line = stdout
        .lines()
        .find_map(|l| l.split_once("LEAKED ").map(|(_, rest)| rest))
        .unwrap_or_else(|| panic!("no LEAKED line in {stdout}"));
    let mut parts = line.split_whitespace().map(|p| p.parse::<u32>().unwrap());
    let (pid, port) = (parts.next().unwrap(), parts.next().unwrap());
    let deadline = Instant::now() + Duration::from_secs(5);
    while process_exists(pid) {
        assert!(
            Instant::now() < deadline,
            "leaked redis-server {pid} still alive"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The port may since have gone to a server another test started (ports
    // are shared between processes); what must hold is that the leaked
    // server no longer answers there.
    let port = u16::try_from(port).unwrap();
    if accepts_connections(port) {
        let info = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &port.to_string(), "INFO", "server"])
            .output()
            .expect("run redis-cli");
        let info = String::from_utf8_lossy(&info.stdout);
        assert!(
            !info
                .lines()
                .any(|l| l.trim() == format!("process_id:{pid}")),
            "the leaked server {pid} still answers on {port}"
        );
    }
}
