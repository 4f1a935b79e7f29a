//! What the rate-limit and hold middleware share: taking the readied inner
//! service, answering a refused request, and handing out a response the
//! middleware made itself.
//!
//! Both services and both response futures follow one shape (key the
//! request, decide, then call the inner service or answer); these are the
//! parts of that shape whose logic is the same, kept here so that a fix to
//! one middleware's answers reaches the other's.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::request::Parts;
use http::Response;

use crate::body::ResponseBody;
use crate::grpc::Protocol;
use crate::rejection::Rejection;
use crate::rejection::RejectionBody;

/// Takes the inner service that `poll_ready` readied, leaving a clone in
/// its place: tower's contract is that the readied service is the one that
/// gets called, and the clone is readied again before the next call.
pub(crate) fn take_readied<S: Clone>(inner: &mut S) -> S {
    let clone = inner.clone();
    std::mem::replace(inner, clone)
}

/// A custom rejection responder: the rejection and the refused request's
/// head in, the response out.
pub(crate) type Responder = Arc<dyn Fn(&Rejection, &Parts) -> Response<Bytes> + Send + Sync>;

/// How a layer answers the requests it refuses: the protocol a rejection is
/// shaped for, and the custom responder, if one was set, that replaces the
/// default response.
#[derive(Clone, Default)]
pub(crate) struct Answer {
    pub(crate) protocol: Protocol,
    pub(crate) responder: Option<Responder>,
}

impl fmt::Debug for Answer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // A responder is a closure: only whether one is set can be shown.
        f.debug_struct("Answer")
            .field("protocol", &self.protocol)
            .field("responder", &self.responder.is_some())
            .finish()
    }
}

impl Answer {
    /// The response for `rejection` of the request `parts`.
    pub(crate) fn reject(&self, parts: &Parts, rejection: Rejection) -> Response<Bytes> {
        // Shaped first, so that a custom responder sees the gRPC form of a
        // gRPC request's rejection, as the default response would.
        let rejection = rejection.for_protocol(self.protocol, &parts.headers);
        match &self.responder {
            // A custom answer is a refusal all the same: marked as one.
            Some(r) => {
                let mut res = r(&rejection, parts);
                res.extensions_mut().insert(rejection.refused());
                res
            }
            None => rejection.default_response(),
        }
    }
}

/// The last state of a response future that answers by itself (a
/// rejection, before or instead of the inner service's response): the
/// response, handed out once.
///
/// A future answering mid-way moves into this state and polls it, so that
/// whatever the earlier state held (the inner service's future, a lease) is
/// dropped before the answer leaves, and so that a made response becomes a
/// [`ResponseBody`] in this one place.
pub(crate) struct Reply(Option<Response<Bytes>>);

impl Reply {
    pub(crate) fn new(response: Response<Bytes>) -> Self {
        Reply(Some(response))
    }

    /// The response; panics if it was handed out already (the future was
    /// polled after completion).
    pub(crate) fn take<B>(&mut self) -> Response<ResponseBody<B>> {
        self.answer()
    }

    /// The response in the body type `B`.
    pub(crate) fn answer<B: RejectionBody>(&mut self) -> Response<B> {
        let response = self.0.take().expect("polled after completion");
        response.map(B::from_rejection)
    }
}
