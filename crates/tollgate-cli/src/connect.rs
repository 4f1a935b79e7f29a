//! Which store to reach, from the flags or the environment, and reaching it
//! within the timeout.

use std::time::Duration;

use clap::parser::ValueSource;
use clap::ArgMatches;
use tollgate::{Backend, RedisBackend};

use crate::args::StoreArgs;
use crate::Failure;

/// The store the command line names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Target {
    /// A standalone Redis at this URL.
    Redis(String),
    /// A Redis Cluster through these seeds.
    Cluster(Vec<String>),
}

impl Target {
    /// Picks the store: a flag beats an environment variable (an operator
    /// with `REDIS_URL` exported may still point at a cluster with
    /// `--cluster`); with both from the environment the cluster wins, as in
    /// `tollgate::Backend::from_env`.
    pub(crate) fn from_args(store: &StoreArgs, matches: &ArgMatches) -> Result<Target, Failure> {
        let redis = store
            .redis
            .as_deref()
            .map(str::trim)
            .filter(|u| !u.is_empty());
        let cluster: Option<Vec<String>> = store
            .cluster
            .as_ref()
            .map(|seeds| {
                seeds
                    .iter()
                    .map(|s| s.trim().to_owned())
                    .filter(|s| !s.is_empty())
                    .collect::<Vec<_>>()
            })
            .filter(|seeds| !seeds.is_empty());
        let flag = |id: &str| matches.value_source(id) == Some(ValueSource::CommandLine);
        match (redis, cluster) {
            (None, None) => Err(Failure::Usage(
                "no store given: pass --redis URL or --cluster HOST:PORT,... \
                 (or set REDIS_URL or REDIS_CLUSTER)"
                    .into(),
            )),
            (Some(url), None) => Ok(Target::Redis(url.to_owned())),
            (None, Some(seeds)) => Ok(Target::Cluster(seeds)),
            (Some(url), Some(seeds)) => match (flag("redis"), flag("cluster")) {
                (true, true) => Err(Failure::Usage("give --redis or --cluster, not both".into())),
                (true, false) => Ok(Target::Redis(url.to_owned())),
                _ => Ok(Target::Cluster(seeds)),
            },
        }
    }

    /// Connects, giving up after `timeout`.
    pub(crate) async fn connect(&self, timeout: Duration) -> Result<Backend, Failure> {
        let connecting = async {
            match self {
                Target::Redis(url) => {
                    probe(url).await?;
                    RedisBackend::connect(url).await.map_err(|e| e.to_string())
                }
                Target::Cluster(seeds) => RedisBackend::connect_cluster(seeds)
                    .await
                    .map_err(|e| e.to_string()),
            }
        };
        match tokio::time::timeout(timeout, connecting).await {
            Ok(Ok(redis)) => Ok(redis.into()),
            Ok(Err(e)) => Err(Failure::Store(format!("cannot connect to {self}: {e}"))),
            Err(_) => Err(Failure::Store(format!(
                "cannot connect to {self}: no answer within {}",
                humantime::format_duration(timeout)
            ))),
        }
    }
}

/// One plain connection first: the backend's connection manager retries a
/// refused connection until the timeout, where an operator wants the
/// refusal itself, at once.
async fn probe(url: &str) -> Result<(), String> {
    let client = redis::Client::open(url).map_err(|e| {
        format!("{e} (--redis takes a URL such as redis://127.0.0.1:6379 or redis://:password@host:6379/0)")
    })?;
    // No bound of the client's own: --timeout bounds the whole attempt.
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(None)
        .set_response_timeout(None);
    client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .map(drop)
        .map_err(|e| e.to_string())
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Redis(url) => write!(f, "Redis at {}", redact(url)),
            Target::Cluster(seeds) => {
                let seeds: Vec<String> = seeds.iter().map(|s| redact(s)).collect();
                write!(f, "the Redis Cluster at {}", seeds.join(","))
            }
        }
    }
}

/// The URL without its password, for messages: they end up in terminals
/// and logs.
fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_owned();
    };
    let rest = &url[scheme_end..];
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return url.to_owned();
    };
    let userinfo = &rest[..at];
    let user = userinfo.split(':').next().unwrap_or("");
    let hidden = if userinfo.contains(':') {
        format!("{user}:***")
    } else {
        "***".to_owned()
    };
    format!("{}{hidden}{}", &url[..scheme_end], &rest[at..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_never_show_a_password() {
        assert_eq!(
            redact("redis://:s3cret@db:6379/0"),
            "redis://:***@db:6379/0"
        );
        assert_eq!(
            redact("redis://ops:s3cret@db:6379"),
            "redis://ops:***@db:6379"
        );
        assert_eq!(redact("redis://s3cret@db"), "redis://***@db");
        assert_eq!(redact("redis://db:6379"), "redis://db:6379");
        assert_eq!(redact("db:6379"), "db:6379");
    }
}
