//! The command line: what an operator types, with the help they read.

use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use tollgate::keyspace::DEFAULT_PREFIX;
use tollgate::Subject;

/// Operate tollgate from its store: list the rate limiters the applications
/// registered, inspect, reset, block and unblock a subject, see who is
/// throttled, who holds a lock or a permit and which idempotency keys are
/// in flight.
#[derive(Parser, Debug)]
#[command(
    name = "tollgate",
    version,
    about = "Operate tollgate's rate limiters from their store: who is throttled, inspect, \
reset, block and unblock a subject, who holds a lock or a permit, idempotency keys in flight",
    long_about = "Operate tollgate from its store: list the rate limiters the applications \
registered, inspect, reset, block and unblock a subject, see who is throttled, who holds \
a lock or a permit and which idempotency keys are in flight.

Works from Redis alone: the applications' limiters describe themselves there, so no \
application code is needed. Reset, block and unblock reach every running instance within a \
second (their deny caches and local state included).",
    after_help = AFTER_HELP,
    after_long_help = AFTER_HELP
)]
pub(crate) struct Cli {
    #[command(flatten)]
    pub(crate) store: StoreArgs,

    /// Print the admin API's JSON instead of a table (for scripts)
    #[arg(long, global = true)]
    pub(crate) json: bool,

    #[command(subcommand)]
    pub(crate) command: Command,
}

const AFTER_HELP: &str = "\
Examples:
  tollgate --redis redis://127.0.0.1:6379 throttled
  tollgate --redis redis://127.0.0.1:6379 inspect login alice
  tollgate --cluster redis-a:7000,redis-b:7000 reset login alice
  tollgate block login alice 600 --json

SUBJECT is a subject id as `throttled`, `inspect` and the admin API print it.

Exit status: 0 done; 1 the store failed or did not answer in time; 2 a usage error or an
unknown limiter.";

/// Where the store is.
#[derive(Args, Debug)]
pub(crate) struct StoreArgs {
    /// A standalone Redis, e.g. redis://127.0.0.1:6379 or redis://:password@host:6379/0
    #[arg(
        long,
        value_name = "URL",
        env = "REDIS_URL",
        hide_env_values = true,
        global = true
    )]
    pub(crate) redis: Option<String>,

    /// A Redis Cluster, through some of its nodes: host:port,host:port,...
    #[arg(
        long,
        value_name = "SEEDS",
        env = "REDIS_CLUSTER",
        hide_env_values = true,
        value_delimiter = ',',
        global = true
    )]
    pub(crate) cluster: Option<Vec<String>>,

    /// The key prefix the applications' limiters use
    #[arg(long, value_name = "PREFIX", default_value = DEFAULT_PREFIX, global = true)]
    pub(crate) prefix: String,

    /// Give up on the store after this many seconds (to connect, then to run the command; a reset, block or unblock: per round trip)
    #[arg(
        long,
        value_name = "SECONDS",
        default_value = "5",
        value_parser = parse_timeout,
        global = true
    )]
    pub(crate) timeout: Duration,
}

/// What to do.
#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// List the registered rate limiters: name, algorithm, quotas, checks per second
    Limiters,

    /// Show a subject's state on a limiter: remaining, when it may retry, a block
    Inspect {
        /// The limiter's name (see `tollgate limiters`)
        limiter: String,
        /// The subject id (as `tollgate throttled` prints it)
        #[arg(value_parser = parse_subject)]
        subject: Subject,
    },

    /// Give a subject its whole quota back on a limiter, on every instance
    Reset {
        /// The limiter's name (see `tollgate limiters`)
        limiter: String,
        /// The subject id (as `tollgate throttled` prints it)
        #[arg(value_parser = parse_subject)]
        subject: Subject,
    },

    /// Refuse a subject on a limiter for SECONDS, whatever its quota says
    #[command(
        long_about = "Refuse a subject on a limiter for SECONDS, whatever its quota says: every \
instance answers it with 429 and a Retry-After until the block ends. A later block replaces \
this one; `tollgate unblock` lifts it early."
    )]
    Block {
        /// The limiter's name (see `tollgate limiters`)
        limiter: String,
        /// The subject id (as `tollgate throttled` prints it)
        #[arg(value_parser = parse_subject)]
        subject: Subject,
        /// How long the block lasts, in whole seconds (at least 1)
        #[arg(value_parser = clap::value_parser!(u64).range(1..=MAX_BLOCK_SECONDS))]
        seconds: u64,
    },

    /// Lift a subject's block on a limiter, on every instance
    Unblock {
        /// The limiter's name (see `tollgate limiters`)
        limiter: String,
        /// The subject id (as `tollgate throttled` prints it)
        #[arg(value_parser = parse_subject)]
        subject: Subject,
    },

    /// List the most throttled subjects over every limiter, most denied first
    #[command(
        long_about = "List the most throttled subjects over every limiter, most denied first, \
merged from every instance (each reports its denials about once a second). The SUBJECT column \
is the id the other commands take; LABEL is what the application chose to show (never a secret)."
    )]
    Throttled {
        /// Show at most N subjects
        #[arg(
            long,
            value_name = "N",
            default_value_t = 20,
            value_parser = clap::value_parser!(u64).range(1..=10_000)
        )]
        limit: u64,
    },

    /// List who holds a lock or a semaphore permit now: host:pid, fence, for how long
    Holders,

    /// List the idempotency keys in flight: claimed, their handler running, not completed
    #[command(
        name = "in-flight",
        long_about = "List the idempotency keys in flight: claimed, their handler running, not \
completed, on every instance. KEY is the key's id as stored (the application's scope, route and \
Idempotency-Key; never the request's payload); RUNNING FOR counts from the claim, LEASE LEFT is \
how long the claim holds unless its instance renews it. A key whose instance died leaves the \
list when its lease runs out."
    )]
    InFlight,

    /// Break a stuck lock: its holder is forgotten, its fence key stays
    #[command(
        name = "break-lock",
        long_about = "Break a stuck lock: its holder is forgotten at once (waiters take over) and its fence key stays, so the next holder's fence is higher than every earlier one. The broken holder finds out at its next renewal. NAME and SUBJECT as `tollgate holders` prints them."
    )]
    BreakLock {
        /// The locker's name (`lock` unless the application named it)
        name: String,
        /// The lock's subject id
        #[arg(value_parser = parse_subject)]
        subject: Subject,
    },

    /// Break a semaphore's permits on a subject: every holder is forgotten, the fence stays
    #[command(name = "break-permits")]
    BreakPermits {
        /// The semaphore's name (`sem` unless the application named it)
        name: String,
        /// The subject id
        #[arg(value_parser = parse_subject)]
        subject: Subject,
    },
}

/// The longest block the store takes: longer is a usage error, said by the
/// parser (exit 2), not a store failure.
const MAX_BLOCK_SECONDS: u64 = tollgate::admin::LONGEST_BLOCK.as_secs();

fn parse_subject(id: &str) -> Result<Subject, String> {
    Subject::from_encoded(id).map_err(|e| e.to_string())
}

fn parse_timeout(s: &str) -> Result<Duration, String> {
    let secs: f64 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if !(secs > 0.0 && secs <= 3600.0) {
        return Err("the timeout must be more than 0 and at most 3600 seconds".into());
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn timeouts_are_positive_and_bounded() {
        assert_eq!(parse_timeout("0.5"), Ok(Duration::from_millis(500)));
        assert!(parse_timeout("0").is_err());
        assert!(parse_timeout("-1").is_err());
        assert!(parse_timeout("nan").is_err());
        assert!(parse_timeout("soon").is_err());
    }
}
