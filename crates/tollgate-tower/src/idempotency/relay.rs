//! The claimed request's response on its way out: read in a task of its
//! own, copied for the record, passed on to the client, and settled at its
//! end.
//!
//! The handler has returned, so its side effect is done: the task goes on
//! when the client goes away, and the response is stored (a retry replays
//! it instead of running the handler again). A body of known length that
//! fits the record is read whole and recorded before the client is
//! answered, as a client that has it all may retry at once. Any other
//! body — a stream of events, a download — reaches the client as it comes,
//! and only its end (and its trailers) waits for the record. A body that
//! grows past `max_stored_body` is recorded as not replayable at once and
//! streams on.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderName, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::BodyExt;
use tokio::sync::{mpsc, oneshot};
use tollgate_core::idempotency::StoredResponse;

use super::future::Holding;
use super::service::Shared;
use crate::body::{BoxError, Tail};

const T: &str = "tollgate_tower::idempotency";

/// How many frames the relay reads ahead of a slow client.
const FRAMES_AHEAD: usize = 8;

/// What the relay hands the client's body.
enum Piece {
    Frame(Frame<Bytes>),
    Failed(BoxError),
    End,
}

/// What the record keeps of the response head.
struct Head {
    status: StatusCode,
    /// The headers a replay carries (the allow-list, and `grpc-status`).
    kept: Vec<(String, Vec<u8>)>,
    /// A `grpc-status` other than 0 in the head (a trailers-only answer).
    grpc_failed: bool,
}

/// Starts relaying `body` (the handler's, under `status` and `headers`) in
/// a task that settles `holding` at its end. Returns the client's body,
/// and what says the client may be answered.
pub(super) fn start(
    status: StatusCode,
    headers: &HeaderMap,
    body: UnsyncBoxBody<Bytes, BoxError>,
    holding: Holding,
    shared: &Arc<Shared>,
) -> (UnsyncBoxBody<Bytes, BoxError>, oneshot::Receiver<()>) {
    let kept = headers
        .iter()
        .filter(|(n, _)| shared.replays(n) || is_grpc_status(n))
        .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
        .collect();
    let head = Head {
        status,
        kept,
        grpc_failed: grpc_failed(headers),
    };
    let size = body.size_hint();
    let (tx, rx) = mpsc::channel(FRAMES_AHEAD);
    let (go, answer) = oneshot::channel();
    tokio::spawn(relay(head, body, holding, Arc::clone(shared), tx, go));
    let body = Relayed {
        rx,
        size,
        ended: false,
    };
    (body.boxed_unsync(), answer)
}

/// Reads `body` to its end, passing it on through `tx` (a client gone
/// changes nothing) once `go` has let the client be answered, copying it
/// up to `max_stored_body`, and settles the claim: stored, not
/// replayable, or abandoned — as [`settle`] decides.
async fn relay(
    head: Head,
    mut body: UnsyncBoxBody<Bytes, BoxError>,
    mut holding: Holding,
    shared: Arc<Shared>,
    tx: mpsc::Sender<Piece>,
    go: oneshot::Sender<()>,
) {
    let send = |piece: Piece| {
        let tx = tx.clone();
        // A client that went away reads nothing more; the body is still read.
        async move { drop(tx.send(piece).await) }
    };
    let max = shared.max_stored_body;
    let mut go = Some(go);
    let mut answer = || {
        if let Some(go) = go.take() {
            // A request future gone (the client left) is told nothing.
            let _ = go.send(());
        }
    };
    let fits = body.size_hint().exact().is_some_and(|n| n <= max as u64);
    let mut streaming = !fits;
    if streaming {
        answer();
    }
    // `None` once past what is stored: the record was written then.
    let mut copy = Some(VecDeque::new());
    let mut copied = 0usize;
    // Read while the client waits for the record.
    let mut waiting = VecDeque::new();
    let tail = loop {
        let chunk = match body.frame().await {
            None => break None,
            Some(Err(e)) => break Some(Tail::Error(e)),
            Some(Ok(frame)) => match frame.into_data() {
                Ok(chunk) => chunk,
                Err(frame) => match frame.into_trailers() {
                    Ok(trailers) => break Some(Tail::Trailers(trailers)),
                    Err(_) => continue,
                },
            },
        };
        if chunk.is_empty() {
            continue;
        }
        if let Some(kept) = &mut copy {
            copied = copied.saturating_add(chunk.len());
            kept.push_back(chunk.clone());
            if copied > max {
                copy = None;
                tracing::debug!(target: T, record = %holding.digest, max, "response body too large to store; streamed");
                let stored = StoredResponse::not_replayable(head.status.as_u16());
                holding.complete(stored, &shared).await;
                // A body longer than it said: it streams from here.
                if !streaming {
                    streaming = true;
                    answer();
                    for chunk in waiting.drain(..) {
                        send(Piece::Frame(Frame::data(chunk))).await;
                    }
                }
            }
        }
        if streaming {
            send(Piece::Frame(Frame::data(chunk))).await;
        } else {
            waiting.push_back(chunk);
        }
    };
    if let Some(chunks) = copy {
        settle(&head, chunks, copied, tail.as_ref(), &mut holding, &shared).await;
    }
    answer();
    for chunk in waiting {
        send(Piece::Frame(Frame::data(chunk))).await;
    }
    match tail {
        None => send(Piece::End).await,
        Some(Tail::Trailers(trailers)) => {
            send(Piece::Frame(Frame::trailers(trailers))).await;
            send(Piece::End).await;
        }
        Some(Tail::Error(e)) => send(Piece::Failed(e)).await,
    }
}

/// Settles the claim on a body read whole (`chunks`, `len` bytes, then
/// `tail`): abandoned when it failed or is not stored (so a retry runs
/// again), else completed — replayable, or not when it has trailers.
async fn settle(
    head: &Head,
    chunks: VecDeque<Bytes>,
    len: usize,
    tail: Option<&Tail>,
    holding: &mut Holding,
    shared: &Shared,
) {
    let trailers_failed = matches!(tail, Some(Tail::Trailers(t)) if grpc_failed(t));
    match tail {
        Some(Tail::Error(_)) => {
            holding
                .abandon("abandoned", "the response body failed")
                .await;
        }
        // A gRPC call's outcome is its `grpc-status`, not its HTTP 200: a
        // failed call is not stored (a retry runs again), as a 5xx is not.
        _ if head.grpc_failed || trailers_failed => {
            holding
                .abandon("not_stored", "the gRPC status is not OK")
                .await;
        }
        _ if !(shared.store_when)(head.status) => {
            holding
                .abandon("not_stored", "the status is not stored")
                .await;
        }
        None => {
            let data = match chunks.len() {
                1 => chunks.into_iter().next().expect("one chunk"),
                _ => {
                    let mut data = BytesMut::with_capacity(len);
                    chunks.iter().for_each(|c| data.extend_from_slice(c));
                    data.freeze()
                }
            };
            let stored =
                StoredResponse::new(head.status.as_u16(), head.kept.clone(), data.to_vec());
            holding.complete(stored, shared).await;
        }
        Some(Tail::Trailers(_)) => {
            // Trailers are not stored: the response cannot be replayed.
            let stored = StoredResponse::not_replayable(head.status.as_u16());
            holding.complete(stored, shared).await;
        }
    }
}

/// Whether a head or trailers say a gRPC call failed: a `grpc-status`
/// other than 0.
fn grpc_failed(headers: &HeaderMap) -> bool {
    headers
        .get("grpc-status")
        .is_some_and(|s| s.as_bytes() != b"0")
}

/// `grpc-status` and `grpc-message`: stored and replayed with a
/// trailers-only gRPC answer, whatever the allow-list.
pub(super) fn is_grpc_status(name: &HeaderName) -> bool {
    name.as_str() == "grpc-status" || name.as_str() == "grpc-message"
}

/// The client's body: what the relay passes on. Cut short (the relay's
/// task gone without an end: a panic, a runtime shutting down), it fails
/// rather than end as if whole.
struct Relayed {
    rx: mpsc::Receiver<Piece>,
    /// The handler's body's size hint, less what was passed on.
    size: SizeHint,
    ended: bool,
}

impl Body for Relayed {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.ended {
            return Poll::Ready(None);
        }
        let piece = ready!(self.rx.poll_recv(cx));
        Poll::Ready(match piece {
            Some(Piece::Frame(frame)) => {
                if let Some(data) = frame.data_ref() {
                    let n = data.len() as u64;
                    let size = match self.size.exact() {
                        Some(exact) => SizeHint::with_exact(exact.saturating_sub(n)),
                        None => SizeHint::default(),
                    };
                    self.size = size;
                }
                Some(Ok(frame))
            }
            Some(Piece::Failed(e)) => {
                self.ended = true;
                Some(Err(e))
            }
            Some(Piece::End) => {
                self.ended = true;
                None
            }
            None => {
                self.ended = true;
                Some(Err("the response body was cut short".into()))
            }
        })
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }

    fn size_hint(&self) -> SizeHint {
        self.size
    }
}
