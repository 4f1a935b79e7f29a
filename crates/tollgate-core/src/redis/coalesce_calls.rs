//! How a turn's batch goes out: split into calls (a lean call per limiter,
//! the batch script or single calls for the rest), sent together, and
//! split by hash tag when the server refuses a call of several.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use futures_util::future::join_all;

use super::{tag_of, Coalescer, Sender, LEAN_BATCH};
use crate::error::{redis_error, Result};
use crate::redis::lean::LeanGroup;
use crate::store::{RateReply, RateRequest};

/// Decides `requests` in order; split by hash tag once the server has
/// refused a call of several tags.
pub(super) async fn decide<S: Sender>(
    coalescer: &Coalescer<S>,
    requests: &[RateRequest],
) -> Vec<Result<RateReply>> {
    if coalescer.shared.split.load(Ordering::Relaxed) && !one_tag(requests) {
        return decide_by_tag(coalescer, requests).await;
    }
    decide_together(coalescer, requests).await
}

pub(super) fn one_tag(requests: &[RateRequest]) -> bool {
    let first = requests.first().map_or("", tag_of);
    requests.iter().all(|r| tag_of(r) == first)
}

/// How a batch's checks go out: the checks of each limiter with a lean
/// script in one call of it (a part of one goes alone), the others in one
/// call of the batch script when there are enough of them, else alone.
/// Parts are listed by their first check; each part keeps arrival order.
fn parts<S: Sender>(sender: &S, requests: &[RateRequest]) -> Vec<(Option<LeanGroup>, Vec<usize>)> {
    let mut parts: Vec<(Option<LeanGroup>, Vec<usize>)> = Vec::new();
    for (i, r) in requests.iter().enumerate() {
        let group = sender.lean_group(r);
        match parts.iter_mut().find(|(g, _)| *g == group) {
            Some((_, members)) => members.push(i),
            None => parts.push((group, vec![i])),
        }
    }
    if parts.len() > 1 {
        // Calls sent together run in the order sent, not in arrival order:
        // a state key (any quota's) in two parts keeps its order only in
        // one call.
        let mut part_of: HashMap<&str, usize> = HashMap::new();
        for (p, (_, members)) in parts.iter().enumerate() {
            for &i in members {
                let r = &requests[i];
                for key in &r.keys[..r.quotas.len().min(r.keys.len())] {
                    if *part_of.entry(key.as_str()).or_insert(p) != p {
                        return vec![(None, (0..requests.len()).collect())];
                    }
                }
            }
        }
    }
    parts
}

/// Decides `requests` in the calls [`parts`] chooses, sent together; each
/// part's own failure is its checks' only.
async fn decide_together<S: Sender>(
    coalescer: &Coalescer<S>,
    requests: &[RateRequest],
) -> Vec<Result<RateReply>> {
    let parts = parts(&coalescer.sender, requests);
    if let [(group, _)] = &parts[..] {
        return decide_part(coalescer, requests, *group).await;
    }
    let groups: Vec<Option<LeanGroup>> = parts.iter().map(|(g, _)| *g).collect();
    let members: Vec<Vec<usize>> = parts.into_iter().map(|(_, m)| m).collect();
    let groups = &groups;
    scatter(requests, &members, |p, part| async move {
        decide_part(coalescer, &part, groups[p]).await
    })
    .await
}

/// One part: one call (a lean part of two or more, or enough checks for
/// the batch script), else single calls sent together (pipelined by the
/// connection). A call of several tags the server refuses (`CROSSSLOT`,
/// before it ran: nothing was decided) is decided again one call per tag.
async fn decide_part<S: Sender>(
    coalescer: &Coalescer<S>,
    requests: &[RateRequest],
    group: Option<LeanGroup>,
) -> Vec<Result<RateReply>> {
    match decide_part_once(coalescer, requests, group).await {
        Ok(answers) => answers,
        Err(e)
            if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::CrossSlot)
                && !one_tag(requests) =>
        {
            tracing::info!("a call of several hash tags was refused (CROSSSLOT): coalesced checks go one call per tag from now on");
            coalescer.shared.split.store(true, Ordering::Relaxed);
            scatter(requests, &by_tag(requests), |_, part| async move {
                decide_part_once(coalescer, &part, group)
                    .await
                    .unwrap_or_else(|e| part.iter().map(|_| Err(redis_error(e.clone()))).collect())
            })
            .await
        }
        Err(e) => requests
            .iter()
            .map(|_| Err(redis_error(e.clone())))
            .collect(),
    }
}

/// [`decide_part`] without the fallback: the call's own error is returned
/// whole.
async fn decide_part_once<S: Sender>(
    coalescer: &Coalescer<S>,
    requests: &[RateRequest],
    group: Option<LeanGroup>,
) -> redis::RedisResult<Vec<Result<RateReply>>> {
    let sender = &coalescer.sender;
    let threshold = if group.is_some() {
        LEAN_BATCH
    } else {
        coalescer.shared.config.script_threshold()
    };
    if requests.len() < threshold {
        return Ok(join_all(requests.iter().map(|r| sender.one(r))).await);
    }
    sender.batch(requests, group).await
}

/// One call per hash tag (each in arrival order), sent together.
async fn decide_by_tag<S: Sender>(
    coalescer: &Coalescer<S>,
    requests: &[RateRequest],
) -> Vec<Result<RateReply>> {
    scatter(requests, &by_tag(requests), |_, group| async move {
        decide_together(coalescer, &group).await
    })
    .await
}

/// The checks of each hash tag (indices, in arrival order).
fn by_tag(requests: &[RateRequest]) -> Vec<Vec<usize>> {
    let mut groups: Vec<(&str, Vec<usize>)> = Vec::new();
    for (i, r) in requests.iter().enumerate() {
        let t = tag_of(r);
        match groups.iter_mut().find(|(g, _)| *g == t) {
            Some((_, members)) => members.push(i),
            None => groups.push((t, vec![i])),
        }
    }
    groups.into_iter().map(|(_, m)| m).collect()
}

/// Decides each group of `requests` (its indices) with `decide`, all sent
/// together, and puts the answers back in the requests' order.
async fn scatter<F, Fut>(
    requests: &[RateRequest],
    groups: &[Vec<usize>],
    decide: F,
) -> Vec<Result<RateReply>>
where
    F: Fn(usize, Vec<RateRequest>) -> Fut,
    Fut: std::future::Future<Output = Vec<Result<RateReply>>>,
{
    let decided = join_all(
        groups
            .iter()
            .enumerate()
            .map(|(g, members)| decide(g, members.iter().map(|&i| requests[i].clone()).collect())),
    )
    .await;
    let mut answers: Vec<Option<Result<RateReply>>> = requests.iter().map(|_| None).collect();
    for (members, group) in groups.iter().zip(decided) {
        for (&i, answer) in members.iter().zip(group) {
            answers[i] = Some(answer);
        }
    }
    answers
        .into_iter()
        .map(|a| a.expect("every check is in one group"))
        .collect()
}
