//! Tests that run their own binary again as child processes: each child
//! runs one ignored test, connects to the Redis its parent names, starts at
//! an agreed instant and prints tagged report lines.

#![allow(dead_code)]

use std::process::Stdio;
use std::time::{SystemTime, UNIX_EPOCH};

use tollgate_core::RedisBackend;

/// Set in a child: the Redis url, or a cluster's seeds (comma-separated).
pub(crate) const CHILD_URL: &str = "TOLLGATE_CHILD_URL";
pub(crate) const CHILD_SEEDS: &str = "TOLLGATE_CHILD_SEEDS";
/// The agreed start (µs since the epoch) and the key prefix.
pub(crate) const CHILD_START: &str = "TOLLGATE_CHILD_START";
pub(crate) const CHILD_PREFIX: &str = "TOLLGATE_CHILD_PREFIX";

pub(crate) fn epoch_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

/// In a child: the agreed start, the key prefix and a backend on the
/// Redis its parent named. `None` when not run by a parent.
pub(crate) async fn child_setup() -> Option<(u64, String, RedisBackend)> {
    let start: u64 = std::env::var(CHILD_START).ok()?.parse().unwrap();
    let backend = match std::env::var(CHILD_URL) {
        Ok(url) => RedisBackend::connect(&url).await.unwrap(),
        Err(_) => {
            let seeds = std::env::var(CHILD_SEEDS).unwrap();
            RedisBackend::connect_cluster(seeds.split(',').map(str::to_owned))
                .await
                .unwrap()
        }
    };
    Some((start, std::env::var(CHILD_PREFIX).unwrap(), backend))
}

/// Where the children connect: a standalone url or a cluster's seeds.
pub(crate) enum Target {
    Url(String),
    Seeds(Vec<String>),
}

/// Runs `processes` children of the ignored test `child` against
/// `target`, starting 3 s from now, with `env` set too; returns every line
/// the children printed (a child that fails fails the test).
pub(crate) fn run_children(
    child: &str,
    processes: usize,
    target: &Target,
    env: &[(&str, String)],
) -> Vec<String> {
    let exe = std::env::current_exe().unwrap();
    // Far enough ahead for every child to be up and connected.
    let start = epoch_micros() + 3_000_000;
    let prefix = format!("{child}{}x{start}", std::process::id());
    let children: Vec<_> = (0..processes)
        .map(|_| {
            let mut cmd = std::process::Command::new(&exe);
            cmd.args(["--ignored", "--exact", child, "--nocapture"])
                .args(["--test-threads", "1"])
                .env(CHILD_START, start.to_string())
                .env(CHILD_PREFIX, &prefix)
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit());
            match target {
                Target::Url(url) => cmd.env(CHILD_URL, url),
                Target::Seeds(seeds) => cmd.env(CHILD_SEEDS, seeds.join(",")),
            };
            for (k, v) in env {
                cmd.env(k, v);
            }
            cmd.spawn().unwrap()
        })
        .collect();
    let mut lines = Vec::new();
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "child failed: {}", out.status);
        lines.extend(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(str::to_owned),
        );
    }
    lines
}

/// The numbers of each line tagged `tag` (`"<tag>1 2 3"`; the harness's own
/// "test … " may precede a report on its line).
pub(crate) fn reports<'a>(
    lines: &'a [String],
    tag: &'a str,
) -> impl Iterator<Item = Vec<u64>> + 'a {
    lines.iter().filter_map(move |line| {
        let (_, rest) = line.split_once(tag)?;
        Some(rest.split(' ').map(|x| x.parse().unwrap()).collect())
    })
}
