//! Rate limits on a [`RedisBackend`]: the five algorithms' scripts, their
//! settles (and refunds), and the batch scripts that decide coalesced
//! checks (a lean one per limiter, see [`lean`], and one for any mix) —
//! sent on the connection ([`Conn`]), which is the coalescer's [`Sender`].

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use redis::{Cmd, ErrorKind, ServerErrorKind, Value};

use super::coalesce::{owned_call, Sender};
use super::conn::Conn;
use super::lean::{LeanGroup, MAX_CHECKS};
use super::scripts::{self, RATE_BATCH};
use super::server_clock::ServerClock;
use super::unclaimed::Awaited;
use super::RedisBackend;
use crate::error::{redis_error, Error, Result};
use crate::quota::Quota;
use crate::store::{
    Algorithm, LeaseReply, LeaseSize, Outcome, Outcomes, RateBackend, RateReply, RateRequest,
    SettleReply, SettleRequest,
};

/// How rate checks are sent: on the connection, each with its deadline on
/// the server's clock as learned from earlier replies. The coalescer's
/// [`Sender`]; cheap to clone.
#[derive(Clone)]
pub(crate) struct RateCalls {
    pub(crate) conn: Conn,
    pub(crate) clock: Arc<ServerClock>,
}

impl RateCalls {
    /// One check, one call of its algorithm's script.
    async fn check_one(&self, req: &RateRequest) -> Result<RateReply> {
        let deadline = self.deadline(req);
        let value = self
            .conn
            .invoke(scripts::check(req.algorithm), |cmd| {
                fill_keys(cmd, req);
                fill_check(cmd, req, deadline);
            })
            .await?;
        self.reply(value, req)
    }

    /// The request's deadline on the server's clock, if both are known.
    pub(super) fn deadline(&self, req: &RateRequest) -> Option<u64> {
        // A check on the client's clock is decided at the time it carries:
        // the script reads no server time to compare a deadline with.
        if req.now_micros.is_some() {
            return None;
        }
        req.deadline.and_then(|at| self.clock.server_micros(at))
    }

    /// A check's reply, teaching the server's clock (a late one too: its
    /// `now` is a reading of that clock like any other).
    pub(super) fn reply(&self, value: Value, req: &RateRequest) -> Result<RateReply> {
        let (reply, now) = match parse_rate_reply(value, req.quotas.len())? {
            Parsed::Decided(reply) => {
                let now = reply.now_micros;
                (Ok(reply), now)
            }
            Parsed::Late(now) => (Err(Error::Timeout(Duration::ZERO)), now),
        };
        if req.now_micros.is_none() {
            self.clock.observe(now);
        }
        reply
    }

    /// [`RedisBackend::check_rate_batch`] with redis-rs's error: checks of
    /// one limiter in one call of its lean script, any others in one call
    /// of the batch script.
    /// `group`: the lean batch every check joins, if any.
    async fn check_batch(
        &self,
        requests: &[RateRequest],
        group: Option<LeanGroup>,
    ) -> redis::RedisResult<Vec<Result<RateReply>>> {
        let deadlines: Vec<Option<u64>> = requests.iter().map(|r| self.deadline(r)).collect();
        if let (Some(group), Some(script)) = (group, scripts::lean(requests[0].algorithm)) {
            if requests.len() <= MAX_CHECKS {
                let value = self
                    .conn
                    .invoke_raw(script, |cmd| {
                        let indexed = !matches!(self.conn, Conn::Cluster(_));
                        group.fill(cmd, requests, &deadlines, indexed)
                    })
                    .await?;
                return Ok(self.lean_replies(group, value, requests));
            }
        }
        let value = self
            .conn
            .invoke_raw(&RATE_BATCH, |cmd| {
                cmd.arg(requests.iter().map(|r| r.keys.len()).sum::<usize>());
                for r in requests {
                    for k in &r.keys {
                        cmd.arg(k.as_str());
                    }
                }
                cmd.arg(requests.len());
                for (r, deadline) in requests.iter().zip(&deadlines) {
                    cmd.arg(scripts::batch_id(r.algorithm))
                        .arg(r.keys.len())
                        .arg(3 + 2 * r.quotas.len() + usize::from(deadline.is_some()));
                    fill_check(cmd, r, *deadline);
                }
            })
            .await?;
        let Value::Array(items) = value else {
            return Ok(protocol_errors(
                requests,
                format!("a batch replied {value:?}"),
            ));
        };
        if items.len() != requests.len() {
            let got = items.len();
            return Ok(protocol_errors(
                requests,
                format!("a batch of {} replied {got} answers", requests.len()),
            ));
        }
        Ok(items
            .into_iter()
            .zip(requests)
            .map(|(item, r)| match item {
                Value::Array(_) => self.reply(item, r),
                Value::BulkString(bytes) => Err(script_error(&String::from_utf8_lossy(&bytes))),
                Value::SimpleString(s) => Err(script_error(&s)),
                other => Err(Error::Protocol(format!(
                    "a batched check replied {other:?}"
                ))),
            })
            .collect())
    }
}

impl RateCalls {
    /// Each check's answer from a lean call's reply, teaching the server's
    /// clock as [`reply`](Self::reply) does.
    fn lean_replies(
        &self,
        group: LeanGroup,
        value: Value,
        requests: &[RateRequest],
    ) -> Vec<Result<RateReply>> {
        match group.parse(value, requests) {
            Ok((now, replies)) => {
                if requests.iter().any(|r| r.now_micros.is_none()) {
                    self.clock.observe(now);
                }
                replies
            }
            Err(e) => protocol_errors(requests, e.to_string()),
        }
    }
}

impl Sender for RateCalls {
    fn lean_group(&self, request: &RateRequest) -> Option<LeanGroup> {
        LeanGroup::of(request)
    }

    fn one<'a>(&'a self, request: &'a RateRequest) -> BoxFuture<'a, Result<RateReply>> {
        self.check_one(request).boxed()
    }

    fn batch<'a>(
        &'a self,
        requests: &'a [RateRequest],
        group: Option<LeanGroup>,
    ) -> BoxFuture<'a, redis::RedisResult<Vec<Result<RateReply>>>> {
        self.check_batch(requests, group).boxed()
    }
}

impl RedisBackend {
    /// Decides `requests` in one call, in order (a later check of a key
    /// sees what an earlier one took): checks of one limiter (GCRA, token
    /// bucket or fixed window, one quota, no wait, one clock) in a call of
    /// its lean script, any other mix in a call of the batch script; each with its
    /// own outcome: one check's error (a script error, a key of another
    /// type) fails that check only. The outer error is the call's own
    /// (connection, timeout, a server refusing scripts), shared by all.
    ///
    /// Every key of every request must hash to one slot on a cluster (one
    /// hash tag: one subject), or the call fails with `CROSSSLOT`. Checks
    /// are coalesced on their own (see
    /// [`with_coalescing`](Self::with_coalescing)); this is for a caller
    /// that has many checks at hand, and it sends them whatever the
    /// coalescing settings (no turn, no size limit: one call).
    pub async fn check_rate_batch(
        &self,
        requests: &[RateRequest],
    ) -> Result<Vec<Result<RateReply>>> {
        // One lean call when every check joins the first one's group.
        let group = requests
            .first()
            .and_then(LeanGroup::of)
            .filter(|g| requests.iter().all(|r| LeanGroup::of(r) == Some(*g)));
        self.rate
            .check_batch(requests, group)
            .await
            .map_err(redis_error)
    }
}

/// A call's key count and keys, as a single call of a script takes them.
pub(super) fn fill_keys(cmd: &mut Cmd, req: &RateRequest) {
    cmd.arg(req.keys.len());
    for k in &req.keys {
        cmd.arg(k.as_str());
    }
}

/// A check's arguments after its keys (its `ARGV`), for a single call and
/// for its place in a batch alike.
fn fill_check(cmd: &mut Cmd, req: &RateRequest, deadline: Option<u64>) {
    // ARGV[3]: the sliding log's nonce; the buckets' wait for a slot ('' for
    // none, the plain check); the other windows read nothing there.
    fill_args(cmd, req, deadline, |cmd| {
        if req.algorithm == Algorithm::SlidingWindowLog {
            cmd.arg(format!("{:016x}", req.nonce));
        } else if req.max_wait_micros > 0 && req.algorithm.uses_burst() {
            cmd.arg(req.max_wait_micros);
        } else {
            cmd.arg("");
        }
    });
}

/// The arguments every rate script reads in one order: now (or '' for the
/// server's), the cost, ARGV[3] (`third` writes it: it differs by script),
/// each quota's two, then the deadline if any.
pub(super) fn fill_args(
    cmd: &mut Cmd,
    req: &RateRequest,
    deadline: Option<u64>,
    third: impl FnOnce(&mut Cmd),
) {
    match req.now_micros {
        Some(now) => cmd.arg(now),
        None => cmd.arg(""),
    };
    cmd.arg(req.cost);
    third(cmd);
    quota_args(cmd, req.algorithm, &req.quotas);
    if let Some(deadline) = deadline {
        cmd.arg(deadline);
    }
}

/// Each quota's two arguments, as the scripts' `interval_of` reads them:
/// the limit or burst, then the period or the exact emission interval
/// (`<ticks>` or `<ticks>/<per_micro>`).
pub(super) fn quota_args(cmd: &mut Cmd, algorithm: Algorithm, quotas: &[Quota]) {
    for q in quotas {
        let (a, b) = algorithm.params(q);
        cmd.arg(a);
        if b.per_micro == 1 {
            cmd.arg(b.ticks);
        } else {
            cmd.arg(format!("{}/{}", b.ticks, b.per_micro));
        }
    }
}

fn protocol_errors(requests: &[RateRequest], what: String) -> Vec<Result<RateReply>> {
    requests
        .iter()
        .map(|_| Err(Error::Protocol(what.clone())))
        .collect()
}

/// The error one batched check raised, as the server would have replied it
/// to a single call: a command's error (`WRONGTYPE …`, `READONLY …`,
/// `OOM …`) is parsed as redis-rs parses an error reply, so it gets the
/// same kind and code (the outage classification reads them); anything
/// else (a Lua runtime error) is a script error.
fn script_error(message: &str) -> Error {
    let message = message.trim().replace(['\r', '\n'], " ");
    let code = message.split(' ').next().unwrap_or_default();
    if code.len() >= 2 && code.bytes().all(|b| b.is_ascii_uppercase()) {
        match redis::parse_redis_value(format!("-{message}\r\n").as_bytes()) {
            Ok(Value::ServerError(e)) => return redis_error(e.into()),
            Err(e) => return redis_error(e),
            Ok(_) => {}
        }
    }
    redis_error(redis::RedisError::from((
        ErrorKind::Server(ServerErrorKind::ResponseError),
        "An error was signalled by the server",
        message,
    )))
}

/// What a check's script answered.
enum Parsed {
    Decided(RateReply),
    /// Too late to decide (past its deadline), at this server time.
    Late(u64),
}

fn parse_rate_reply(value: Value, quotas: usize) -> Result<Parsed> {
    let Value::Array(items) = value else {
        return Err(Error::Protocol(format!("expected an array, got {value:?}")));
    };
    let nums: Vec<i64> = items
        .iter()
        .map(|v| match v {
            Value::Int(n) => Ok(*n),
            other => Err(Error::Protocol(format!(
                "expected an integer, got {other:?}"
            ))),
        })
        .collect::<Result<_>>()?;
    // {-1, now}: it came after its deadline, so nothing was decided.
    if let [-1, now] = nums[..] {
        return Ok(Parsed::Late(now.max(0) as u64));
    }
    // {-2, now, µs left}: an operator blocked the subject.
    if let [-2, now, left] = nums[..] {
        let now = now.max(0) as u64;
        return Ok(Parsed::Decided(
            RateReply::blocked(quotas, left.max(1) as u64).at(now),
        ));
    }
    // {allowed, now, then four figures per quota}.
    if nums.len() != 2 + 4 * quotas {
        return Err(Error::Protocol(format!(
            "expected {} integers, got {}",
            2 + 4 * quotas,
            nums.len()
        )));
    }
    let figure = |n: i64| n.max(0) as u64;
    let outcomes: Outcomes = nums[2..]
        .chunks_exact(4)
        .map(|c| Outcome::from_reply(figure(c[0]), figure(c[1]), figure(c[2]), figure(c[3])))
        .collect();
    Ok(Parsed::Decided(
        RateReply::new(nums[0] == 1, outcomes).at(figure(nums[1])),
    ))
}

/// A settle's reply: `{applied, then a check's reply}`.
fn parse_settle_reply(value: Value, quotas: usize) -> Result<SettleReply> {
    let Value::Array(mut items) = value else {
        return Err(Error::Protocol(format!(
            "a settle replied {value:?}, not an array"
        )));
    };
    let applied = match items.first() {
        Some(Value::Int(n)) => *n == 1,
        other => {
            return Err(Error::Protocol(format!(
                "a settle replied {other:?} for applied"
            )))
        }
    };
    items.remove(0);
    match parse_rate_reply(Value::Array(items), quotas)? {
        Parsed::Decided(reply) => Ok(SettleReply::new(applied, reply)),
        Parsed::Late(_) => Err(Error::Protocol("a settle replied as a late check".into())),
    }
}

impl RateBackend for RedisBackend {
    fn check_rate<'a>(&'a self, req: &'a RateRequest) -> BoxFuture<'a, Result<RateReply>> {
        async move {
            match &self.coalescer {
                Some(coalescer) => coalescer.check(req).await,
                None => Awaited::new(owned_call(&self.rate, req), None).await,
            }
        }
        .boxed()
    }

    fn settle_rate<'a>(&'a self, req: &'a SettleRequest) -> BoxFuture<'a, Result<SettleReply>> {
        async move {
            let value = self
                .invoke(scripts::settle(req.algorithm), |cmd| {
                    cmd.arg(2 + req.keys.len()).arg(req.marker.as_str());
                    for k in &req.keys {
                        cmd.arg(k.as_str());
                    }
                    cmd.arg(req.reset_stamp.as_str());
                    match req.now_micros {
                        Some(now) => cmd.arg(now),
                        None => cmd.arg(""),
                    };
                    cmd.arg(req.cost)
                        .arg(format!("{:016x}", req.id))
                        .arg(req.at_micros)
                        .arg(req.span_micros)
                        .arg(req.actual);
                    match req.max_debt {
                        Some(debt) => cmd.arg(debt),
                        None => cmd.arg(""),
                    };
                    cmd.arg(req.marker_span_micros.max(req.span_micros));
                    quota_args(cmd, req.algorithm, &req.quotas);
                    cmd.arg(req.taken_micros);
                    for span in &req.quota_spans_micros {
                        cmd.arg(*span);
                    }
                })
                .await?;
            parse_settle_reply(value, req.quotas.len())
        }
        .boxed()
    }

    fn supports_leases(&self) -> bool {
        true
    }

    fn lease_rate<'a>(
        &'a self,
        req: &'a RateRequest,
        size: LeaseSize,
    ) -> BoxFuture<'a, Result<LeaseReply>> {
        self.lease(req, size).boxed()
    }

    fn local_rate(&self) -> std::sync::Arc<dyn RateBackend> {
        std::sync::Arc::new(crate::memory::MemoryBackend::new())
    }

    fn kind(&self) -> &'static str {
        self.kind
    }

    fn admin(&self) -> Option<Arc<dyn crate::store::AdminBackend>> {
        Some(Arc::new(self.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batched check's error is classified as the same error replied to a
    /// single call would be (the review found READONLY, NOPERM and
    /// MASTERDOWN read as data errors when rebuilt as extension errors).
    #[test]
    fn a_batched_checks_error_is_classified_as_a_single_calls() {
        let outage = |m: &str| match script_error(m) {
            Error::Backend(b) => b.is_outage(),
            other => panic!("{m}: {other:?}"),
        };
        for m in [
            "READONLY You can't write against a read only replica.",
            "NOPERM this user has no permissions to run the 'zadd' command",
            "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
            "OOM command not allowed when used memory > 'maxmemory'.",
            "BUSY Redis is busy running a script.",
            "CLUSTERDOWN The cluster is down",
            "TRYAGAIN Multiple keys request during rehashing of slot",
        ] {
            assert!(outage(m), "{m} is an outage");
        }
        for m in [
            "WRONGTYPE Operation against a key holding the wrong kind of value",
            "ERR value is not an integer or out of range",
            "user_script:12: attempt to perform arithmetic on a nil value",
            "",
        ] {
            assert!(!outage(m), "{m} is about the data");
        }
        let e = script_error("WRONGTYPE Operation against a key\r\nholding");
        assert!(e.to_string().contains("WRONGTYPE"), "{e}");
    }
}
