//! `tollgate`: the operator's command line for tollgate's rate limiters.
//!
//! It works from the store alone — applications' limiters register their
//! name, algorithm and quotas in Redis — through
//! [`tollgate::admin::Admin`], so it needs none of the application's code:
//!
//! ```text
//! $ tollgate --redis redis://127.0.0.1:6379 throttled
//! LIMITER  SUBJECT  LABEL  DENIED  LAST DENIED
//! login    alice    ali…       41  2s ago
//! $ tollgate --redis redis://127.0.0.1:6379 reset login alice
//! reset alice on login: its whole quota is back on every instance
//! ```
//!
//! | command | does |
//! |---|---|
//! | `limiters` | lists the registered limiters: name, algorithm, quotas, checks per second |
//! | `inspect LIMITER SUBJECT` | a subject's remaining quota, retry-after, block |
//! | `reset LIMITER SUBJECT` | gives the subject its whole quota back |
//! | `block LIMITER SUBJECT SECONDS` | refuses the subject for that long, whatever its quota |
//! | `unblock LIMITER SUBJECT` | lifts a block |
//! | `throttled [--limit N]` | the most denied subjects over every limiter (default 20) |
//! | `holders` | who holds a lock or a semaphore permit |
//! | `in-flight` | the idempotency keys claimed and not completed |
//!
//! Reset, block and unblock reach every running instance within a second.
//! SUBJECT is a subject id as `throttled`, `inspect` and the admin API
//! print it ([`tollgate::Subject::as_encoded`]).
//!
//! The store: `--redis URL` (or `REDIS_URL`) for a standalone Redis,
//! `--cluster host:port,...` (or `REDIS_CLUSTER`) for a Cluster; a flag
//! beats the environment, and with both variables set the cluster wins.
//! `--prefix` is the applications' key prefix (the library's default
//! unless they set one). `--timeout SECONDS` (default 5) bounds connecting
//! and then the command; a reset, block or unblock each of its round trips
//! instead (one whose write fails still tells the other instances).
//!
//! Output: a table by default, with a header line even when empty.
//! `--json` prints the admin API's JSON on one line: `{"limiters":[...]}`,
//! the subject object for `inspect`, `{"subjects":[...]}` for `throttled`,
//! `{"holders":[...]}` for `holders`, `{"in_flight":[...]}` for
//! `in-flight`, and `{"ok":true}` for `reset`,
//! `block` and `unblock`, which otherwise print one line saying what they
//! did.
//!
//! Exit status: 0 done; 1 the store failed or did not answer in time; 2 a
//! usage error (from the argument parser: an invalid SUBJECT or SECONDS,
//! say) or a limiter that is not registered. Errors go to stderr.
#![forbid(unsafe_code)]

mod args;
mod connect;
mod output;

use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use clap::{CommandFactory, FromArgMatches};
use tollgate::admin::Admin;
use tollgate::{Error, Subject};

use crate::args::{Cli, Command};
use crate::connect::Target;

/// Why a command did not run to the end, and so the exit status.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The command line does not say what to do (exit 2, as the parser's
    /// own errors).
    Usage(String),
    /// The limiter named is not registered (exit 2).
    Unknown(String),
    /// The store failed or did not answer in time (exit 1).
    Store(String),
}

impl Failure {
    fn exit_code(&self) -> ExitCode {
        match self {
            Failure::Store(_) => ExitCode::from(1),
            Failure::Usage(_) | Failure::Unknown(_) => ExitCode::from(2),
        }
    }

    fn message(&self) -> &str {
        match self {
            Failure::Usage(m) | Failure::Unknown(m) | Failure::Store(m) => m,
        }
    }
}

fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let outcome = Target::from_args(&cli.store, &matches).and_then(|target| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Failure::Store(format!("cannot start the runtime: {e}")))?
            .block_on(run(&cli, &target))
    });
    match outcome {
        // A reader that went away (`| head`) is no failure to report.
        Ok(out) => match writeln!(std::io::stdout().lock(), "{out}") {
            Ok(()) => ExitCode::SUCCESS,
            Err(_) => ExitCode::from(1),
        },
        Err(failure) => {
            eprintln!("tollgate: {}", failure.message());
            failure.exit_code()
        }
    }
}

/// Connects and runs the command; what to print on success.
async fn run(cli: &Cli, target: &Target) -> Result<String, Failure> {
    let timeout = cli.store.timeout;
    let backend = target.connect(timeout).await?;
    let admin = Admin::new(backend)
        .with_prefix(cli.store.prefix.clone())
        .with_timeout(timeout);
    let json = cli.json;
    let bounded = async {
        Ok(match &cli.command {
            Command::Limiters => {
                let limiters = admin.limiters().await?;
                if limiters.is_empty() && !json {
                    // The usual cause is a prefix other than the applications'.
                    eprintln!(
                        "tollgate: no limiter is registered under the prefix {:?} \
                         (--prefix sets the applications' prefix)",
                        admin.prefix()
                    );
                }
                output::limiters(&limiters, json)
            }
            Command::Inspect { limiter, subject } => {
                let state = admin.inspect(limiter, subject).await?;
                output::subject(&state, SystemTime::now(), json)
            }
            Command::Reset { limiter, subject } => {
                admin.reset(limiter, subject).await?;
                let msg = format!(
                    "reset {} on {limiter}: its whole quota is back on every instance",
                    id(subject)
                );
                output::done(&msg, json)
            }
            Command::Block {
                limiter,
                subject,
                seconds,
            } => {
                let duration = Duration::from_secs(*seconds);
                admin.block(limiter, subject, duration).await?;
                let until = output::instant(SystemTime::now() + duration);
                let msg = format!(
                    "blocked {} on {limiter} for {} (until {until}) on every instance",
                    id(subject),
                    output::span(duration)
                );
                output::done(&msg, json)
            }
            Command::Unblock { limiter, subject } => {
                admin.unblock(limiter, subject).await?;
                let msg = format!("unblocked {} on {limiter} on every instance", id(subject));
                output::done(&msg, json)
            }
            Command::Throttled { limit } => {
                let n = usize::try_from(*limit).unwrap_or(usize::MAX);
                output::throttled(&admin.throttled(n).await?, SystemTime::now(), json)
            }
            Command::Holders => output::holders(&admin.holders().await?, json),
            Command::InFlight => output::in_flight(&admin.idempotency_in_flight().await?, json),
            Command::BreakLock { name, subject } => {
                let broken = admin.break_lock(name, subject).await?;
                let msg = if broken {
                    format!("broke lock {name} {}; its fence key stays", id(subject))
                } else {
                    format!("lock {name} {} was not held", id(subject))
                };
                output::done(&msg, json)
            }
            Command::BreakPermits { name, subject } => {
                let n = admin.break_permits(name, subject).await?;
                let msg = format!("broke {n} permit(s) of {name} {}", id(subject));
                output::done(&msg, json)
            }
        })
    };
    // A reset, block or unblock is not bounded as a whole: each of its
    // round trips is (by `timeout`), and one whose write fails still tells
    // the other instances, which a bound around the whole would cut short.
    let acts = matches!(
        cli.command,
        Command::Reset { .. } | Command::Block { .. } | Command::Unblock { .. }
    );
    let result = if acts {
        bounded.await
    } else {
        match tokio::time::timeout(timeout, bounded).await {
            Ok(result) => result,
            Err(_) => {
                return Err(Failure::Store(format!(
                    "{target} did not answer within {}",
                    humantime::format_duration(timeout)
                )))
            }
        }
    };
    result.map_err(|e| failure(e, &admin, target))
}

fn id(subject: &Subject) -> &str {
    subject.as_encoded()
}

/// An error of the operator plane as the operator should read it.
fn failure(e: Error, admin: &Admin, target: &Target) -> Failure {
    match e {
        Error::NotRegistered(what) => Failure::Unknown(format!(
            "no {what} is registered under the prefix {:?} (see `tollgate limiters`; \
             --prefix sets the applications' prefix)",
            admin.prefix()
        )),
        // A name or subject the keys cannot carry, or a registry entry this
        // version cannot act on: what was asked cannot be done as asked.
        Error::InvalidConfig(m) => Failure::Usage(m),
        e if e.is_unavailable() => Failure::Store(format!("{target}: {e}")),
        e => Failure::Store(e.to_string()),
    }
}
