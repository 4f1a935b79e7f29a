//! Replies nobody waits for: a check whose caller stopped waiting (its
//! timeout, a dropped future) after the check was sent may still be decided
//! by Redis, and its reply arrives later. The caller was answered by the
//! failure policy, so an admission in that reply is given back
//! ([`Unclaimed`]): the call is kept to its end by a task of its own.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use futures_util::future::{join_all, BoxFuture};
use futures_util::FutureExt;
use tokio::sync::oneshot;

use crate::error::Result;
use crate::store::{LeaseReply, RateReply, RateRequest, Unclaimed};

/// The longest a call nobody waits for is kept: a connection that hangs
/// longer takes its replies with it (the charges stay). Also how long the
/// connections themselves await a reply ([`super::standalone::config`]):
/// every call is bounded by its caller's own timeout first.
pub(super) const KEPT_AT_MOST: Duration = Duration::from_secs(60);

/// One call sent for a caller; dropped before its reply, it is finished by
/// a task that gives back what it took (see the module).
pub(crate) struct Awaited<T: Taken = RateReply> {
    call: Option<OwnedCall<T>>,
    home: Option<tokio::runtime::Handle>,
}

/// A call that owns its request and gives it back with the reply.
pub(crate) type OwnedCall<T = RateReply> = BoxFuture<'static, (RateRequest, Result<T>)>;

/// A reply that may have taken units, which go back when nobody received
/// it.
pub(crate) trait Taken: Send + 'static {
    /// What gives back what `self`, the reply to `request`, took.
    fn give_back(&self, request: &RateRequest) -> Option<BoxFuture<'static, ()>>;
}

impl Taken for RateReply {
    fn give_back(&self, request: &RateRequest) -> Option<BoxFuture<'static, ()>> {
        Unclaimed::give_back(request, self)
    }
}

impl Taken for LeaseReply {
    /// A take charged the units it granted under the check's id; with none
    /// granted, the reply is the check's own, of its cost.
    fn give_back(&self, request: &RateRequest) -> Option<BoxFuture<'static, ()>> {
        if self.granted == 0 {
            return Unclaimed::give_back(request, &self.reply);
        }
        let taken = RateRequest {
            cost: self.granted,
            ..request.clone()
        };
        Unclaimed::give_back(&taken, &self.reply)
    }
}

impl<T: Taken> Awaited<T> {
    /// Awaits `call` for its caller; `home`: where a call left by its
    /// caller is finished (else the current runtime).
    pub(crate) fn new(call: OwnedCall<T>, home: Option<tokio::runtime::Handle>) -> Self {
        Awaited {
            call: Some(call),
            home,
        }
    }
}

impl<T: Taken> Future for Awaited<T> {
    type Output = Result<T>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let call = self.call.as_mut().expect("polled after completion");
        let (_, reply) = ready!(call.poll_unpin(cx));
        self.call = None;
        Poll::Ready(reply)
    }
}

impl<T: Taken> Drop for Awaited<T> {
    fn drop(&mut self) {
        let Some(call) = self.call.take() else {
            return;
        };
        spawn_at_home(self.home.take(), async move {
            if let Ok((request, Ok(reply))) = tokio::time::timeout(KEPT_AT_MOST, call).await {
                if let Some(back) = reply.give_back(&request) {
                    back.await;
                }
            }
        });
    }
}

/// A queued check's reply, awaited for its caller. A reply that came but
/// was never read (the caller left between the two) is an admission nobody
/// received: dropped, it is given back, as one that came later is.
pub(crate) struct QueuedReply<'a> {
    reply: oneshot::Receiver<Result<RateReply>>,
    request: &'a RateRequest,
    home: Option<tokio::runtime::Handle>,
}

impl<'a> QueuedReply<'a> {
    /// Awaits `reply` to `request`; `home`: where a give-back runs (else
    /// the current runtime).
    pub(crate) fn new(
        reply: oneshot::Receiver<Result<RateReply>>,
        request: &'a RateRequest,
        home: Option<tokio::runtime::Handle>,
    ) -> Self {
        QueuedReply {
            reply,
            request,
            home,
        }
    }
}

impl Future for QueuedReply<'_> {
    type Output = std::result::Result<Result<RateReply>, oneshot::error::RecvError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.get_mut().reply).poll(cx)
    }
}

impl Drop for QueuedReply<'_> {
    fn drop(&mut self) {
        // Closed first: a reply sent from now on fails and stays with its
        // sender (which gives it back); one sent before is read here. A
        // reply already read leaves nothing.
        self.reply.close();
        let Ok(Ok(reply)) = self.reply.try_recv() else {
            return;
        };
        if let Some(refund) = Unclaimed::give_back(self.request, &reply) {
            spawn_at_home(self.home.take(), refund);
        }
    }
}

/// Runs `task` on `home`, the backend's runtime, else on the current one;
/// without either (a runtime shutting down) it is dropped.
pub(crate) fn spawn_at_home(
    home: Option<tokio::runtime::Handle>,
    task: impl Future<Output = ()> + Send + 'static,
) {
    if let Some(runtime) = home.or_else(|| tokio::runtime::Handle::try_current().ok()) {
        runtime.spawn(task);
    }
}

/// Finishes `call`, whose callers are all gone, on a task of its own:
/// each admission in its replies is given back.
pub(crate) fn finish_detached(
    call: BoxFuture<'static, (Vec<RateRequest>, Vec<Result<RateReply>>)>,
    runtime: Option<tokio::runtime::Handle>,
) {
    spawn_at_home(runtime, async move {
        if let Ok((requests, replies)) = tokio::time::timeout(KEPT_AT_MOST, call).await {
            let admitted = requests.iter().zip(replies).filter_map(|(r, reply)| {
                let reply = reply.ok()?;
                Unclaimed::give_back(r, &reply)
            });
            join_all(admitted).await;
        }
    });
}
