//! A single real `redis-server` process.

use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::sleep;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::error::{missing, require_binaries, Result, TestkitError};
use crate::{ports, resp, watchdog};

/// How long a server may take to answer PING after being spawned.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How often readiness is polled.
const POLL_INTERVAL: Duration = Duration::from_millis(10);
/// Timeout of one readiness probe (connect, write, read).
const PROBE_TIMEOUT: Duration = Duration::from_millis(250);
/// Fresh ports tried by `start` when the chosen port turns out to be taken.
const START_ATTEMPTS: usize = 5;
/// How long `restart` keeps retrying while the old port is unavailable.
const RESTART_PORT_TIMEOUT: Duration = Duration::from_secs(10);

/// File (in the server's directory) that receives redis-server's log.
const LOG_FILE: &str = "redis.log";
/// File (in the server's directory) that receives stdout/stderr, where
/// redis-server reports configuration errors.
const STDIO_FILE: &str = "stdio.log";

/// A real `redis-server` process on a free 127.0.0.1 port, with its working
/// directory and log in a fresh temporary directory and persistence disabled.
///
/// Dropping it SIGKILLs the process (even when paused), reaps it and removes
/// the temporary directory.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    /// For a sentinel: its config file (Sentinel must have one on disk).
    sentinel_conf: Option<PathBuf>,
    extra_args: Vec<String>,
    dir: PathBuf,
    child: Option<Child>,
}

/// Why one launch attempt failed.
enum LaunchError {
    /// The port was taken by someone else; retrying (elsewhere or later) may help.
    PortBusy(String),
    /// Anything else.
    Fatal(TestkitError),
}

impl RedisServer {
    /// Starts a standalone server (`--save "" --appendonly no`, bound to
    /// 127.0.0.1 on a free port) and returns once it answers `PING`.
    pub fn start() -> Result<RedisServer> {
        Self::start_with_args(&[])
    }

    /// Like [`RedisServer::start`], appending `extra` to the `redis-server`
    /// command line (e.g. `&["--maxmemory", "10mb"]`). The extra arguments are
    /// kept and reused by [`RedisServer::restart`].
    pub fn start_with_args(extra: &[&str]) -> Result<RedisServer> {
        require_binaries()?;
        let dir = create_temp_dir()?;
        let server = RedisServer {
            port: 0,
            sentinel_conf: None,
            extra_args: extra.iter().map(|s| (*s).to_owned()).collect(),
            dir,
            child: None,
        };
        server.start_on_free_port()
    }

    /// Starts a Redis Sentinel monitoring `master` under the name `service`
    /// (quorum 1, down after 1 s, failover timeout 3 s), on a free port.
    pub fn start_sentinel(master: &RedisServer, service: &str) -> Result<RedisServer> {
        Self::start_sentinel_with_quorum(master, service, 1)
    }

    /// Starts `count` Sentinels monitoring `master` under the name
    /// `service` with a majority quorum (`count / 2 + 1`; down after 1 s,
    /// failover timeout 3 s). They find each other through the master.
    pub fn start_sentinels(
        master: &RedisServer,
        service: &str,
        count: usize,
    ) -> Result<Vec<RedisServer>> {
        (0..count)
            .map(|_| Self::start_sentinel_with_quorum(master, service, count / 2 + 1))
            .collect()
    }

    fn start_sentinel_with_quorum(
        master: &RedisServer,
        service: &str,
        quorum: usize,
    ) -> Result<RedisServer> {
        require_binaries()?;
        let dir = create_temp_dir()?;
        let conf = dir.join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "sentinel monitor {service} 127.0.0.1 {port} {quorum}\n\
                 sentinel down-after-milliseconds {service} 1000\n\
                 sentinel failover-timeout {service} 3000\n",
                port = master.port()
            ),
        )?;
        let server = RedisServer {
            port: 0,
            sentinel_conf: Some(conf),
            extra_args: Vec::new(),
            dir,
            child: None,
        };
        server.start_on_free_port()
    }

    fn start_on_free_port(mut self) -> Result<RedisServer> {
        let server = &mut self;
        let mut last_busy = String::new();
        for _ in 0..START_ATTEMPTS {
            let Some(port) = ports::next_free_port() else {
                return Err(TestkitError::Startup(
                    "no free loopback port found (with port+10000 free as well)".to_owned(),
                ));
            };
            server.port = port;
            match server.launch() {
                Ok(()) => return Ok(self),
                Err(LaunchError::PortBusy(msg)) => last_busy = msg,
                Err(LaunchError::Fatal(err)) => return Err(err),
            }
        }
        Err(TestkitError::Startup(format!(
            "gave up after {START_ATTEMPTS} ports were taken concurrently; last: {last_busy}"
        )))
    }

    /// The TCP port the server listens on (stable across [`RedisServer::restart`]).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `"127.0.0.1:PORT"`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `"redis://127.0.0.1:PORT/"`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// A `redis::Client` for this server.
    pub fn client(&self) -> redis::Client {
        let url = self.url();
        redis::Client::open(url.as_str())
            .unwrap_or_else(|e| panic!("tollgate-testkit: invalid redis url {url}: {e}"))
    }

    /// A connected `ConnectionManager`; panics with a clear message on failure.
    pub async fn connection_manager(&self) -> redis::aio::ConnectionManager {
        self.client()
            .get_connection_manager()
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "tollgate-testkit: cannot create a ConnectionManager to {}: {e}",
                    self.url()
                )
            })
    }

    /// A connected `MultiplexedConnection` (redis-rs default timeouts:
    /// 500 ms per response); panics with a clear message on failure.
    pub async fn multiplexed(&self) -> redis::aio::MultiplexedConnection {
        self.client()
            .get_multiplexed_async_connection()
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "tollgate-testkit: cannot open a multiplexed connection to {}: {e}",
                    self.url()
                )
            })
    }

    /// The process id, or `None` once stopped.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the process with SIGKILL (works when paused too) and waits for it.
    /// Idempotent.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let pid = child.id();
            // SIGKILL; an error only means it already exited.
            let _ = child.kill();
            let _ = child.wait();
            watchdog::unregister(pid);
        }
    }

    /// Freezes the process with SIGSTOP: connections stay open, but no command
    /// gets a reply until [`RedisServer::resume`]. No-op when stopped.
    pub fn pause(&self) {
        self.signal("STOP");
    }

    /// Thaws a paused process with SIGCONT. No-op when stopped.
    pub fn resume(&self) {
        self.signal("CONT");
    }

    /// A bounded blip: pauses the server now and resumes it after `blip`
    /// from a thread of its own (join the handle to wait for the end). No-op
    /// when stopped.
    pub fn pause_for(&self, blip: Duration) -> std::thread::JoinHandle<()> {
        self.pause();
        let pid = self.pid();
        std::thread::spawn(move || {
            sleep(blip);
            if let Some(pid) = pid {
                let _ = Command::new("kill")
                    .arg("-CONT")
                    .arg(pid.to_string())
                    .stdin(Stdio::null())
                    .status();
            }
        })
    }

    /// Stops the server if running and starts it again on the same port with
    /// the same arguments (data is lost: there is no persistence; a cluster
    /// node keeps its `nodes.conf` and rejoins). Retries for a bounded time if
    /// the port is briefly unavailable, then waits for `PING`.
    pub fn restart(&mut self) -> Result<()> {
        self.stop();
        let deadline = Instant::now() + RESTART_PORT_TIMEOUT;
        loop {
            let busy = if ports::can_bind(self.port) {
                match self.launch() {
                    Ok(()) => return Ok(()),
                    Err(LaunchError::Fatal(err)) => return Err(err),
                    Err(LaunchError::PortBusy(msg)) => msg,
                }
            } else {
                format!("port {} is not bindable", self.port)
            };
            if Instant::now() >= deadline {
                return Err(TestkitError::Startup(format!(
                    "restart on port {} failed for {RESTART_PORT_TIMEOUT:?}: {busy}",
                    self.port
                )));
            }
            sleep(Duration::from_millis(50));
        }
    }

    /// Whether the process is alive (a paused process counts as running).
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut().map(Child::try_wait) {
            Some(Ok(None)) => true,
            Some(Ok(Some(_))) | Some(Err(_)) | None => false,
        }
    }

    /// Runs `redis-cli -h 127.0.0.1 -p PORT args...` synchronously and returns
    /// its stdout, trimmed (e.g. `cli(&["DBSIZE"])` gives `"0"`). Error
    /// replies are returned as text (`"ERR ..."`). Blocks while the server is
    /// paused. Panics if `redis-cli` cannot be run.
    pub fn cli(&self, args: &[&str]) -> String {
        let output = Command::new("redis-cli")
            .arg("-h")
            .arg("127.0.0.1")
            .arg("-p")
            .arg(self.port.to_string())
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| {
                panic!(
                    "tollgate-testkit: cannot run redis-cli ({e}); {}",
                    missing("redis-cli")
                )
            });
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }

    /// How many times `command` (lower case, e.g. `"evalsha"`) ran since the
    /// server's stats were last reset (`CONFIG RESETSTAT`), from `INFO
    /// commandstats`; 0 when it never ran.
    pub fn command_calls(&self, command: &str) -> u64 {
        let stats = self.cli(&["INFO", "commandstats"]);
        let prefix = format!("cmdstat_{command}:calls=");
        stats
            .lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .and_then(|rest| rest.split(',').next()?.parse().ok())
            .unwrap_or(0)
    }

    fn signal(&self, signal: &str) {
        let Some(pid) = self.pid() else { return };
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .stdin(Stdio::null())
            .status()
            .unwrap_or_else(|e| panic!("tollgate-testkit: cannot run `kill -{signal} {pid}`: {e}"));
        assert!(
            status.success(),
            "tollgate-testkit: `kill -{signal} {pid}` failed with {status}"
        );
    }

    /// Spawns redis-server on `self.port` and waits until it answers PING.
    fn launch(&mut self) -> std::result::Result<(), LaunchError> {
        debug_assert!(self.child.is_none());
        let fatal = |e: std::io::Error| LaunchError::Fatal(TestkitError::Io(e));
        let stdio = File::create(self.dir.join(STDIO_FILE)).map_err(fatal)?;
        let stderr = stdio.try_clone().map_err(fatal)?;
        let mut command = Command::new("redis-server");
        match &self.sentinel_conf {
            Some(conf) => {
                command.arg(conf).arg("--sentinel");
            }
            None => {
                command.args(["--save", "", "--appendonly", "no"]);
            }
        }
        let child = command
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--daemonize", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .arg("--logfile")
            .arg(self.dir.join(LOG_FILE))
            .args(&self.extra_args)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(stdio)
            .stderr(stderr)
            .spawn()
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => LaunchError::Fatal(missing("redis-server")),
                _ => fatal(e),
            })?;
        watchdog::register(child.id(), &self.dir);
        self.child = Some(child);
        let result = self.wait_ready();
        if result.is_err() {
            self.stop();
        }
        result
    }

    fn wait_ready(&mut self) -> std::result::Result<(), LaunchError> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let port = self.port;
        loop {
            let child = self.child.as_mut().expect("child was just spawned");
            let pid = child.id();
            match child.try_wait() {
                Ok(Some(status)) => {
                    let logs = self.logs();
                    let msg = format!(
                        "redis-server on port {port} exited with {status} during startup; {logs}"
                    );
                    return Err(if logs.contains("Address already in use") {
                        LaunchError::PortBusy(msg)
                    } else {
                        LaunchError::Fatal(TestkitError::Startup(msg))
                    });
                }
                Ok(None) => {}
                Err(e) => return Err(LaunchError::Fatal(TestkitError::Io(e))),
            }
            if resp::command(port, &["PING"], PROBE_TIMEOUT).is_ok_and(|r| r == "PONG") {
                // Make sure it is *our* server that answered, not another
                // process's that won the race for this port.
                let info = resp::command(port, &["INFO", "server"], PROBE_TIMEOUT);
                match info
                    .as_deref()
                    .ok()
                    .and_then(|i| resp::info_field(i, "process_id"))
                {
                    Some(id) if id == pid.to_string() => return Ok(()),
                    Some(other) => {
                        return Err(LaunchError::PortBusy(format!(
                            "port {port} is served by another redis-server (pid {other})"
                        )))
                    }
                    None => {} // not ready yet; poll again
                }
            }
            if Instant::now() >= deadline {
                return Err(LaunchError::Fatal(TestkitError::Startup(format!(
                    "redis-server on port {port} did not answer PING within {READY_TIMEOUT:?}; {}",
                    self.logs()
                ))));
            }
            sleep(POLL_INTERVAL);
        }
    }

    /// The tail of the server's log and stdout/stderr, for error messages.
    fn logs(&self) -> String {
        let read = |name: &str| {
            let text = std::fs::read_to_string(self.dir.join(name)).unwrap_or_default();
            let start = text.char_indices().rev().nth(4000).map_or(0, |(i, _)| i);
            text[start..].trim().to_owned()
        };
        format!(
            "log ({}):\n{}\nstdout/stderr:\n{}",
            self.dir.join(LOG_FILE).display(),
            read(LOG_FILE),
            read(STDIO_FILE)
        )
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A suffix that is unique within this process and very likely across processes.
pub(crate) fn unique_suffix() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    format!("{n}-{nanos:08x}")
}

/// Creates a fresh, empty temporary directory for one server.
fn create_temp_dir() -> Result<PathBuf> {
    let base = std::env::temp_dir();
    loop {
        let dir = base.join(format!(
            "tollgate-testkit-{}-{}",
            std::process::id(),
            unique_suffix()
        ));
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(TestkitError::Io(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launch_on_a_taken_port_is_port_busy() {
        let first = RedisServer::start().expect("start redis-server");
        let mut second = RedisServer {
            port: first.port(),
            sentinel_conf: None,
            extra_args: Vec::new(),
            dir: create_temp_dir().unwrap(),
            child: None,
        };
        match second.launch() {
            Err(LaunchError::PortBusy(msg)) => {
                assert!(msg.contains(&first.port().to_string()), "{msg}");
            }
            Err(LaunchError::Fatal(err)) => panic!("expected PortBusy, got {err}"),
            Ok(()) => panic!("second server started on a taken port"),
        }
        assert!(second.child.is_none(), "failed launch must reap its child");
        assert_eq!(first.cli(&["PING"]), "PONG");
    }

    #[test]
    fn temp_dirs_are_fresh_and_removed_on_drop() {
        let server = RedisServer::start().expect("start redis-server");
        let dir = server.dir.clone();
        assert!(dir.join(LOG_FILE).exists());
        assert!(server.logs().contains("Ready to accept connections"));
        drop(server);
        assert!(!dir.exists(), "{} not removed", dir.display());
    }
}
