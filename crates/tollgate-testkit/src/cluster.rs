//! A real three-master Redis Cluster on loopback.

use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use crate::error::{missing, require_binaries, Result, TestkitError};
use crate::resp;
use crate::server::RedisServer;

/// Number of masters.
const MASTERS: usize = 3;
/// How long to wait for every node to agree the cluster is healthy.
const CLUSTER_READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How often the cluster state is polled.
const CLUSTER_POLL_INTERVAL: Duration = Duration::from_millis(25);

/// Arguments that make a node cluster-enabled. `nodes.conf` is relative to
/// the node's own `--dir` (redis-server changes into it).
const CLUSTER_ARGS: &[&str] = &[
    "--cluster-enabled",
    "yes",
    "--cluster-config-file",
    "nodes.conf",
    "--cluster-node-timeout",
    "2000",
];

/// A Redis Cluster of three masters (and, from
/// [`RedisCluster::start_with_replicas`], replicas), each node a
/// [`RedisServer`] (with its own temporary directory and `nodes.conf`),
/// created with `redis-cli --cluster create`. Dropping it kills every node.
/// Failover controls are in [`RedisCluster::kill_master`] and
/// [`RedisCluster::force_failover`].
#[derive(Debug)]
pub struct RedisCluster {
    pub(crate) nodes: Vec<RedisServer>,
    /// Replicas per master.
    pub(crate) replicas: usize,
}

impl RedisCluster {
    /// Starts three cluster-enabled nodes (`cluster-node-timeout 2000`),
    /// assigns all 16384 slots with `redis-cli --cluster create`, and returns
    /// once every node reports `cluster_state:ok`,
    /// `cluster_slots_assigned:16384` and `cluster_known_nodes:3` (or a
    /// [`TestkitError::Startup`] after 30 s). Takes about 2 s (redis keeps a
    /// fresh master's state `fail` for 2 s), occasionally up to about 4 s.
    pub fn start() -> Result<RedisCluster> {
        Self::start_with_replicas(0)
    }

    /// Like [`RedisCluster::start`], with `replicas` replicas per master
    /// (`3 × (1 + replicas)` nodes); returns once every replica's link to its
    /// master is up, so a failover has a synced replica to promote. Which
    /// nodes are masters is up to `redis-cli`: ask
    /// [`masters`](RedisCluster::masters) and
    /// [`replicas_of`](RedisCluster::replicas_of).
    pub fn start_with_replicas(replicas: usize) -> Result<RedisCluster> {
        require_binaries()?;
        let nodes = (0..MASTERS * (1 + replicas))
            .map(|_| RedisServer::start_with_args(CLUSTER_ARGS))
            .collect::<Result<Vec<_>>>()?;
        let cluster = RedisCluster { nodes, replicas };
        cluster.create_and_wait()?;
        Ok(cluster)
    }

    /// The nodes, in the order given to `redis-cli --cluster create`.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// Mutable access to the nodes, e.g. to [`RedisServer::stop`] or
    /// [`RedisServer::restart`] one of them.
    pub fn nodes_mut(&mut self) -> &mut [RedisServer] {
        &mut self.nodes
    }

    /// The nodes' urls (`redis://127.0.0.1:PORT/`), as cluster client seeds.
    pub fn seeds(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// A `ClusterClient` seeded with every node.
    pub fn client(&self) -> redis::cluster::ClusterClient {
        redis::cluster::ClusterClient::new(self.seeds()).unwrap_or_else(|e| {
            panic!(
                "tollgate-testkit: invalid cluster seeds {:?}: {e}",
                self.seeds()
            )
        })
    }

    /// A connected async cluster connection; panics with a clear message on
    /// failure.
    pub async fn connection(&self) -> redis::cluster_async::ClusterConnection {
        self.client()
            .get_async_connection()
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "tollgate-testkit: cannot connect to the cluster {:?}: {e}",
                    self.seeds()
                )
            })
    }

    /// Runs `redis-cli --cluster create` and waits until every node is
    /// healthy. The health polling runs while redis-cli is still going:
    /// redis-cli's "waiting for the cluster to join" loop sleeps in whole
    /// seconds, and once every node reports all slots assigned and all nodes
    /// known, all its mutating steps (ADDSLOTS, SET-CONFIG-EPOCH, MEET) are
    /// done and only its read-only final check remains, so it is killed then.
    fn create_and_wait(&self) -> Result<()> {
        let mut cli = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(self.nodes.iter().map(RedisServer::addr))
            .args([
                "--cluster-replicas",
                &self.replicas.to_string(),
                "--cluster-yes",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => missing("redis-cli"),
                _ => TestkitError::Io(e),
            })?;
        let output_of = |mut cli: Child| {
            let _ = cli.kill();
            match cli.wait_with_output() {
                Ok(out) => format!(
                    "{}\n{}",
                    String::from_utf8_lossy(&out.stdout).trim(),
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
                Err(e) => format!("<cannot read redis-cli output: {e}>"),
            }
        };
        let deadline = Instant::now() + CLUSTER_READY_TIMEOUT;
        let mut cli_done = false;
        loop {
            if !cli_done {
                match cli.try_wait() {
                    Ok(None) => {}
                    Ok(Some(status)) if status.success() => cli_done = true,
                    Ok(Some(status)) => {
                        return Err(TestkitError::Startup(format!(
                            "`redis-cli --cluster create` failed with {status}:\n{}",
                            output_of(cli)
                        )))
                    }
                    Err(e) => {
                        let _ = output_of(cli);
                        return Err(TestkitError::Io(e));
                    }
                }
            }
            let known = self.nodes.len();
            let states: Vec<std::result::Result<(), String>> = self
                .nodes
                .iter()
                .map(|node| node_healthy(node, known).and_then(|()| replica_synced(node)))
                .collect();
            // redis-cli makes the replicas replicate only after the nodes
            // have joined: wait for exactly MASTERS masters too.
            let masters = self.nodes.iter().filter(|n| is_master(n)).count();
            if states.iter().all(std::result::Result::is_ok) && masters == MASTERS {
                // Reap redis-cli (killing it if it is still in its final check).
                let _ = output_of(cli);
                return Ok(());
            }
            if Instant::now() >= deadline {
                let details: Vec<String> = self
                    .nodes
                    .iter()
                    .zip(&states)
                    .filter_map(|(node, state)| {
                        state
                            .as_ref()
                            .err()
                            .map(|e| format!("{}: {e}", node.addr()))
                    })
                    .collect();
                return Err(TestkitError::Startup(format!(
                    "cluster not healthy after {CLUSTER_READY_TIMEOUT:?}: {}\nredis-cli output:\n{}",
                    details.join("; "),
                    output_of(cli)
                )));
            }
            sleep(CLUSTER_POLL_INTERVAL);
        }
    }
}

/// Whether `node` answers `INFO replication` with `role:master`.
pub(crate) fn is_master(node: &RedisServer) -> bool {
    resp::command(
        node.port(),
        &["INFO", "replication"],
        Duration::from_millis(500),
    )
    .is_ok_and(|info| resp::info_field(&info, "role") == Some("master"))
}

/// `Ok` if `node` is a master, or a replica whose link to its master is up.
pub(crate) fn replica_synced(node: &RedisServer) -> std::result::Result<(), String> {
    let info = resp::command(
        node.port(),
        &["INFO", "replication"],
        Duration::from_millis(500),
    )
    .map_err(|e| format!("INFO replication failed: {e}"))?;
    match resp::info_field(&info, "role") {
        Some("master") => Ok(()),
        _ => match resp::info_field(&info, "master_link_status") {
            Some("up") => Ok(()),
            other => Err(format!("replica link {other:?}")),
        },
    }
}

/// `Ok` if `node` reports a fully assigned, healthy cluster of `known` nodes.
pub(crate) fn node_healthy(node: &RedisServer, known: usize) -> std::result::Result<(), String> {
    let info = resp::command(
        node.port(),
        &["CLUSTER", "INFO"],
        Duration::from_millis(500),
    )
    .map_err(|e| format!("CLUSTER INFO failed: {e}"))?;
    let expected = [
        ("cluster_state", "ok".to_owned()),
        ("cluster_slots_assigned", "16384".to_owned()),
        ("cluster_known_nodes", known.to_string()),
    ];
    for (field, want) in expected {
        let got = resp::info_field(&info, field).unwrap_or("<missing>");
        if got != want {
            return Err(format!("{field}:{got} (want {want})"));
        }
    }
    Ok(())
}
