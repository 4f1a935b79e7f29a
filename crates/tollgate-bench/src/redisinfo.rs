//! Reading Redis's own accounting: `INFO commandstats`, `INFO cpu`,
//! `MEMORY USAGE`, through a separate admin connection.

use std::collections::BTreeMap;

use redis::aio::MultiplexedConnection;

use crate::common::BenchResult;

/// One line of `INFO commandstats`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct CmdStat {
    pub(crate) calls: u64,
    pub(crate) usec: u64,
}

/// `INFO commandstats`, by lower-case command name (`evalsha`, `get`, …).
#[derive(Debug, Clone, Default)]
pub(crate) struct CommandStats(pub(crate) BTreeMap<String, CmdStat>);

/// Commands that run a script: their time includes the commands the script calls.
pub(crate) const SCRIPT_COMMANDS: &[&str] = &["evalsha", "eval", "evalsha_ro", "eval_ro", "fcall"];

impl CommandStats {
    /// Parses the text of `INFO commandstats`.
    pub(crate) fn parse(info: &str) -> Self {
        let mut map = BTreeMap::new();
        for line in info.lines() {
            let Some(rest) = line.strip_prefix("cmdstat_") else {
                continue;
            };
            let Some((name, fields)) = rest.split_once(':') else {
                continue;
            };
            let mut s = CmdStat::default();
            for kv in fields.split(',') {
                match kv.split_once('=') {
                    Some(("calls", v)) => s.calls = v.parse().unwrap_or(0),
                    Some(("usec", v)) => s.usec = v.parse().unwrap_or(0),
                    _ => {}
                }
            }
            map.insert(name.to_ascii_lowercase(), s);
        }
        CommandStats(map)
    }

    /// Calls and µs of the script commands together.
    pub(crate) fn scripts(&self) -> CmdStat {
        let mut total = CmdStat::default();
        for c in SCRIPT_COMMANDS {
            if let Some(s) = self.0.get(*c) {
                total.calls += s.calls;
                total.usec += s.usec;
            }
        }
        total
    }

    /// The commands other than the admin ones this harness sends itself.
    pub(crate) fn workload(&self) -> impl Iterator<Item = (&String, &CmdStat)> {
        self.0.iter().filter(|(name, _)| {
            !matches!(
                name.as_str(),
                "info"
                    | "config|resetstat"
                    | "config"
                    | "client|setinfo"
                    | "client"
                    | "hello"
                    | "ping"
                    | "memory|usage"
                    | "select"
                    | "script|load"
                    | "script"
            )
        })
    }

    /// `get×1.00 set×1.00` — calls per decision of every workload command.
    pub(crate) fn per_decision(&self, decisions: u64) -> String {
        let d = decisions.max(1) as f64;
        self.workload()
            .map(|(name, s)| format!("{name}×{:.2}", s.calls as f64 / d))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// A separate connection for `INFO`, `CONFIG RESETSTAT` and `MEMORY USAGE`.
#[derive(Clone)]
pub(crate) struct Admin {
    conn: MultiplexedConnection,
}

impl std::fmt::Debug for Admin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Admin")
    }
}

impl Admin {
    pub(crate) async fn connect(url: &str) -> BenchResult<Self> {
        let client = redis::Client::open(url)?;
        Ok(Admin {
            conn: client.get_multiplexed_async_connection().await?,
        })
    }

    async fn info(&self, section: &str) -> BenchResult<String> {
        let mut c = self.conn.clone();
        Ok(redis::cmd("INFO").arg(section).query_async(&mut c).await?)
    }

    /// `CONFIG RESETSTAT`.
    pub(crate) async fn reset_stats(&self) -> BenchResult<()> {
        let mut c = self.conn.clone();
        redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async::<()>(&mut c)
            .await?;
        Ok(())
    }

    /// `INFO commandstats`.
    pub(crate) async fn commandstats(&self) -> BenchResult<CommandStats> {
        Ok(CommandStats::parse(&self.info("commandstats").await?))
    }

    /// The server process's CPU time so far (user + system), in µs.
    pub(crate) async fn cpu_micros(&self) -> BenchResult<f64> {
        let info = self.info("cpu").await?;
        let mut total = 0.0;
        for line in info.lines() {
            if let Some(v) = line
                .strip_prefix("used_cpu_sys:")
                .or_else(|| line.strip_prefix("used_cpu_user:"))
            {
                total += v.trim().parse::<f64>().unwrap_or(0.0);
            }
        }
        Ok(total * 1e6)
    }

    /// A field of `INFO <section>`.
    pub(crate) async fn info_field(&self, section: &str, field: &str) -> BenchResult<String> {
        let info = self.info(section).await?;
        let prefix = format!("{field}:");
        Ok(info
            .lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .unwrap_or("")
            .trim()
            .to_owned())
    }

    /// `used_memory` in bytes.
    pub(crate) async fn used_memory(&self) -> BenchResult<u64> {
        Ok(self
            .info_field("memory", "used_memory")
            .await?
            .parse()
            .unwrap_or(0))
    }

    /// `MEMORY USAGE key SAMPLES 0` (every element counted).
    pub(crate) async fn memory_usage(&self, key: &str) -> BenchResult<Option<u64>> {
        let mut c = self.conn.clone();
        Ok(redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(key)
            .arg("SAMPLES")
            .arg(0)
            .query_async(&mut c)
            .await?)
    }

    /// Deletes every key matching `pattern` (SCAN + UNLINK).
    pub(crate) async fn delete_matching(&self, pattern: &str) -> BenchResult<u64> {
        let mut c = self.conn.clone();
        let mut cursor: u64 = 0;
        let mut n = 0;
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut c)
                .await?;
            if !keys.is_empty() {
                n += keys.len() as u64;
                redis::cmd("UNLINK")
                    .arg(&keys)
                    .query_async::<()>(&mut c)
                    .await?;
            }
            if next == 0 {
                return Ok(n);
            }
            cursor = next;
        }
    }
}

/// Redis's accounting across one measured run: reset before, read after.
#[derive(Debug)]
pub(crate) struct Accounting {
    cpu_before: f64,
}

/// What Redis spent on one measured run.
#[derive(Debug, Clone, Default)]
pub(crate) struct Spent {
    /// Server CPU (user + system) over the run, µs.
    pub(crate) cpu_micros: f64,
    /// Command statistics of the run.
    pub(crate) stats: CommandStats,
}

impl Accounting {
    pub(crate) async fn start(admin: &Admin) -> BenchResult<Self> {
        admin.reset_stats().await?;
        Ok(Accounting {
            cpu_before: admin.cpu_micros().await?,
        })
    }

    pub(crate) async fn finish(self, admin: &Admin) -> BenchResult<Spent> {
        let cpu = admin.cpu_micros().await? - self.cpu_before;
        Ok(Spent {
            cpu_micros: cpu,
            stats: admin.commandstats().await?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_commandstats() {
        let s = CommandStats::parse(
            "# Commandstats\r\ncmdstat_evalsha:calls=10,usec=25,usec_per_call=2.50,rejected_calls=0,failed_calls=0\r\ncmdstat_config|resetstat:calls=1,usec=3,usec_per_call=3.00,rejected_calls=0,failed_calls=0\r\n",
        );
        assert_eq!(
            s.0["evalsha"],
            CmdStat {
                calls: 10,
                usec: 25
            }
        );
        assert_eq!(
            s.scripts(),
            CmdStat {
                calls: 10,
                usec: 25
            }
        );
        assert_eq!(s.workload().count(), 1);
        assert_eq!(s.per_decision(10), "evalsha×1.00");
    }
}
