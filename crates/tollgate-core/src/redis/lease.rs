//! Quota leases on a [`RedisBackend`]: one call of `lua/rate_lease.lua`
//! over the algorithm's own check script (see [`scripts::lease`]).

use futures_util::FutureExt;
use redis::Value;

use super::rate::{fill_args, fill_keys};
use super::scripts;
use super::unclaimed::Awaited;
use super::RedisBackend;
use crate::error::{Error, Result};
use crate::store::{LeaseReply, LeaseSize, RateRequest};

impl RedisBackend {
    /// Takes up to `size.want` units of the request's quotas (see
    /// [`RateBackend::lease_rate`](crate::store::RateBackend::lease_rate)).
    /// The call owns a copy of its request: a caller that stops waiting
    /// leaves it to a task that gives back what the take got, as a check's
    /// round trip does.
    pub(super) async fn lease(&self, req: &RateRequest, size: LeaseSize) -> Result<LeaseReply> {
        let (backend, request) = (self.clone(), req.clone());
        let call = async move {
            let reply = backend.take(&request, size).await;
            (request, reply)
        }
        .boxed();
        let home = self.coalescer.as_ref().and_then(|c| c.home());
        Awaited::new(call, home).await
    }

    /// The take's round trip.
    async fn take(&self, req: &RateRequest, size: LeaseSize) -> Result<LeaseReply> {
        let deadline = self.rate.deadline(req);
        let value = self
            .invoke(scripts::lease(req.algorithm), |cmd| {
                fill_keys(cmd, req);
                // ARGV[3]: the units wanted and the least worth a lease.
                fill_args(cmd, req, deadline, |cmd| {
                    cmd.arg(format!("{}:{}", size.want, size.least));
                });
            })
            .await?;
        let Value::Array(mut items) = value else {
            return Err(Error::Protocol(format!("a lease replied {value:?}")));
        };
        // {granted, then a check's reply}; a refusal before any take (late,
        // blocked) is a check's reply alone, and starts below zero.
        match items.first() {
            Some(Value::Int(n)) if *n < 0 => {
                let reply = self.rate.reply(Value::Array(items), req)?;
                Ok(LeaseReply::new(0, reply))
            }
            Some(Value::Int(n)) => {
                let granted = *n as u64;
                items.remove(0);
                let reply = self.rate.reply(Value::Array(items), req)?;
                Ok(LeaseReply::new(granted, reply))
            }
            other => Err(Error::Protocol(format!(
                "a lease replied {other:?} for granted"
            ))),
        }
    }
}
