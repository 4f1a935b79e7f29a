//! The claimed request's response on its way out: read in a task of its
//! own, copied for the record, passed on to the client, and settled at its
//! end.
//!
//! The handler has returned, so its side effect is done: the task goes on
//! when the client goes away, and the response is stored (a retry replays
//! it instead of running the handler again). A body of known length (its
//! size, or the `Content-Length` its head announces) that
//! fits the record is read whole and recorded before the client is
//! answered, as a client that has it all may retry at once. Any other
//! body — a stream of events, a download — reaches the client as it comes,
//! and only its end (and its trailers) waits for the record; it is read at
//! the handler's pace, not the client's, so a stalled client never keeps
//! the claim's lease waiting (what waits for it is held as its bytes, tiny
//! frames merged: see the pipe). A body that grows past `max_stored_body` is
//! recorded as not replayable at once and streams on, read as the client
//! reads it and no more once the client is gone.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::{Bytes, BytesMut};
use http::header::CONTENT_LENGTH;
use http::{HeaderMap, HeaderName, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::BodyExt;
use tokio::sync::{oneshot, Semaphore};
use tokio::task::JoinHandle;
use tollgate_core::idempotency::StoredResponse;

use super::holding::Holding;
use super::pipe::{pipe, Piece, Receiver, Sender};
use super::shared::Shared;
use crate::body::{BoxError, Tail};

const T: &str = "tollgate_tower::idempotency";

/// How many frames past what is stored the relay reads ahead of a slow
/// client (what is stored is read at the handler's pace, whatever the
/// client's: its lease must not wait on a stalled reader).
const FRAMES_AHEAD: usize = 8;

/// How the client is answered.
pub(super) enum Answer {
    /// Read whole and settled: the body, then its trailers or its error.
    Whole { data: Bytes, tail: Option<Tail> },
    /// As it comes: the relay's body.
    Streams(UnsyncBoxBody<Bytes, BoxError>),
}

/// A relay under way.
pub(super) struct Started {
    /// Says how to answer the client, once it may be.
    pub(super) answer: oneshot::Receiver<Answer>,
    /// The relay's task (a panic in it is the request's).
    pub(super) task: JoinHandle<()>,
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
/// a task that settles `holding` at its end.
pub(super) fn start(
    status: StatusCode,
    headers: &HeaderMap,
    body: UnsyncBoxBody<Bytes, BoxError>,
    holding: Holding,
    shared: &Arc<Shared>,
) -> Started {
    let head = Head {
        status,
        kept: kept(headers, shared),
        grpc_failed: grpc_failed(headers),
    };
    // Known to fit: by its size, or by the length its head announces (a
    // client that has that many bytes knows it has it all).
    let max = shared.max_stored_body as u64;
    let announced = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let size = body.size_hint().exact();
    let fits = size.or(announced).is_some_and(|n| n <= max);
    let (go, answer) = oneshot::channel();
    let relay = Relay {
        head,
        holding,
        shared: Arc::clone(shared),
        size,
        client: None,
        go: Some(go),
    };
    let task = tokio::spawn(relay.run(body, fits));
    Started { answer, task }
}

struct Relay {
    head: Head,
    holding: Holding,
    shared: Arc<Shared>,
    /// The handler's body's exact length, when known.
    size: Option<u64>,
    /// The client's body, once the answer streams.
    client: Option<Client>,
    go: Option<oneshot::Sender<Answer>>,
}

/// The relay's end of a streaming answer.
struct Client {
    tx: Sender,
    /// Room for frames past what is stored; closed when the client's body
    /// is dropped.
    room: Arc<Semaphore>,
}

impl Relay {
    /// Tells the request future how to answer (once; a future gone — the
    /// client left — is told nothing).
    fn answer(&mut self, answer: Answer) {
        if let Some(go) = self.go.take() {
            let _ = go.send(answer);
        }
    }

    /// Answers with a body that streams from here (once), passing on
    /// `read`: what was read and not passed on yet.
    fn stream(&mut self, read: impl IntoIterator<Item = Bytes>) {
        if self.client.is_some() {
            return;
        }
        let (tx, rx) = pipe();
        let room = Arc::new(Semaphore::new(FRAMES_AHEAD));
        let body = Relayed {
            rx,
            room: Arc::clone(&room),
            size: self.size,
            ended: false,
        };
        self.client = Some(Client { tx, room });
        self.answer(Answer::Streams(body.boxed_unsync()));
        read.into_iter()
            .filter(|c| !c.is_empty())
            .for_each(|c| self.send(Frame::data(c)));
    }

    /// Whether nobody waits for the answer any more: a streaming client
    /// dropped its body, or the request future that was to answer whole is
    /// gone.
    fn client_gone(&self) -> bool {
        match &self.client {
            Some(client) => client.room.is_closed(),
            None => self.go.as_ref().is_none_or(oneshot::Sender::is_closed),
        }
    }

    /// Passes `piece` on, when the answer streams (a client gone changes
    /// nothing).
    fn pass(&self, piece: Piece) {
        if let Some(client) = &self.client {
            client.tx.send(piece);
        }
    }

    fn send(&self, frame: Frame<Bytes>) {
        self.pass(Piece::Frame(frame, false));
    }

    /// Reads `body` to its end, copying it up to `max_stored_body`, and
    /// settles the claim ([`settle`]). A body that `fits` is answered
    /// whole once settled; any other streams from the start, its end
    /// waiting for the record. Past `max_stored_body` the record is
    /// written at once (not replayable), and the rest is read only as the
    /// client reads it, and no more once it is gone.
    async fn run(mut self, mut body: UnsyncBoxBody<Bytes, BoxError>, fits: bool) {
        let max = self.shared.max_stored_body;
        if !fits {
            self.stream([]);
        }
        // `None` once past what is stored: the record was written then.
        let mut copy = Some(Kept::default());
        let mut lost = self.holding.lost();
        let mut claim_lost = false;
        let tail = loop {
            // A claim lost while its response is copied (its hold cap, or
            // the store gone past its safe deadline) may still store: the
            // completion is fenced, so it lands while no later claim was
            // made, and the retries get this response rather than running
            // the handler again. But nobody waits for it once its client
            // has gone: then the claim is given up, and the body read no
            // further (an endless stream is not read for nobody).
            if claim_lost && copy.is_some() && self.client_gone() {
                self.holding
                    .abandon("lost", "the claim's lease was lost and its client has gone")
                    .await;
                return;
            }
            let frame = match &mut lost {
                Some(watch) if copy.is_some() => tokio::select! {
                    biased;
                    () = watch => {
                        lost = None;
                        claim_lost = true;
                        continue;
                    }
                    frame = body.frame() => frame,
                },
                _ => body.frame().await,
            };
            let chunk = match frame {
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
            let Some(kept) = &mut copy else {
                // Not stored: read as the client reads, while it does.
                let Some(room) = self.client.as_ref().map(|c| Arc::clone(&c.room)) else {
                    return;
                };
                let Ok(permit) = room.acquire().await else {
                    return;
                };
                permit.forget();
                self.pass(Piece::Frame(Frame::data(chunk), true));
                continue;
            };
            // Checked before it is copied: a chunk past the limit is not.
            if kept.len() + chunk.len() > max {
                let kept = copy.take().unwrap_or_default();
                if self.head.grpc_failed || !(self.shared.store_when)(self.head.status) {
                    // Not stored whatever its length: a retry runs again.
                    self.holding
                        .abandon("not_stored", "the status is not stored")
                        .await;
                } else {
                    tracing::debug!(target: T, record = %self.holding.digest, max, "response body too large to store; streamed");
                    let stored = StoredResponse::not_replayable(self.head.status.as_u16());
                    self.holding.complete(stored, &self.shared).await;
                }
                // A body longer than it said streams from here, this chunk
                // with it.
                if self.client.is_none() {
                    self.stream([kept.into_bytes(), chunk]);
                    continue;
                }
            } else {
                kept.push(&chunk);
            }
            self.send(Frame::data(chunk));
        };
        if let Some(kept) = copy {
            let data = kept.into_bytes();
            settle(
                &self.head,
                &data,
                tail.as_ref(),
                &mut self.holding,
                &self.shared,
            )
            .await;
            if self.client.is_none() {
                self.answer(Answer::Whole { data, tail });
                return;
            }
        }
        match tail {
            None => self.pass(Piece::End),
            Some(Tail::Trailers(trailers)) => {
                self.send(Frame::trailers(trailers));
                self.pass(Piece::End);
            }
            Some(Tail::Error(e)) => self.pass(Piece::Failed(e)),
        }
    }
}

/// What is kept of a body for its record: a lone chunk as it came (no
/// copy), more chunks in one buffer (tiny frames cost their bytes, not a
/// list entry each).
#[derive(Default)]
struct Kept {
    one: Option<Bytes>,
    many: BytesMut,
}

impl Kept {
    fn len(&self) -> usize {
        self.one.as_ref().map_or(0, Bytes::len) + self.many.len()
    }

    fn push(&mut self, chunk: &Bytes) {
        if let Some(first) = self.one.take() {
            self.many.reserve(first.len() + chunk.len());
            self.many.extend_from_slice(&first);
        } else if self.many.is_empty() {
            self.one = Some(chunk.clone());
            return;
        }
        self.many.extend_from_slice(chunk);
    }

    fn into_bytes(self) -> Bytes {
        self.one.unwrap_or_else(|| self.many.freeze())
    }
}

/// Settles the claim on a body read whole (`data`, then `tail`): abandoned
/// when it failed or is not stored (so a retry runs again), else completed
/// with its trailers.
async fn settle(
    head: &Head,
    data: &Bytes,
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
        None | Some(Tail::Trailers(_)) => {
            // Trailers (a gRPC call's status) replay after the body.
            let trailers = match tail {
                Some(Tail::Trailers(t)) => kept(t, shared),
                _ => Vec::new(),
            };
            let stored =
                StoredResponse::new(head.status.as_u16(), head.kept.clone(), data.to_vec())
                    .with_trailers(trailers);
            holding.complete(stored, shared).await;
        }
    }
}

/// The fields of a head or trailers a replay carries: the allow-list, and
/// a gRPC call's status.
fn kept(fields: &HeaderMap, shared: &Shared) -> Vec<(String, Vec<u8>)> {
    fields
        .iter()
        .filter(|(n, _)| shared.replays(n) || is_grpc_status(n))
        .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
        .collect()
}

/// Whether a head or trailers say a gRPC call failed: a `grpc-status`
/// other than 0.
fn grpc_failed(headers: &HeaderMap) -> bool {
    headers
        .get("grpc-status")
        .is_some_and(|s| s.as_bytes() != b"0")
}

/// `grpc-status`, `grpc-message` and `grpc-status-details-bin`: a gRPC
/// call's outcome, stored and replayed (in its head or its trailers),
/// whatever the allow-list.
pub(super) fn is_grpc_status(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "grpc-status" | "grpc-message" | "grpc-status-details-bin"
    )
}

/// The client's body when the answer streams: what the relay passes on.
/// Cut short (the relay's task gone without an end: a panic, a runtime
/// shutting down), it fails rather than end as if whole.
struct Relayed {
    rx: Receiver,
    room: Arc<Semaphore>,
    /// The handler's body's exact length, when known, less what was
    /// passed on.
    size: Option<u64>,
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
            Some(Piece::Frame(frame, took_room)) => {
                if took_room {
                    self.room.add_permits(1);
                }
                if let (Some(left), Some(data)) = (self.size, frame.data_ref()) {
                    self.size = Some(left.saturating_sub(data.len() as u64));
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
            .map_or_else(SizeHint::default, SizeHint::with_exact)
    }
}

impl Drop for Relayed {
    fn drop(&mut self) {
        // The client is gone: a relay past what is stored reads no more.
        self.room.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lone chunk is kept as it came (the same bytes, not a copy); more
    /// are joined in order.
    #[test]
    fn kept_chunks() {
        let first = Bytes::from(vec![1u8; 1000]);
        let mut kept = Kept::default();
        kept.push(&first);
        assert_eq!(kept.len(), 1000);
        assert_eq!(kept.into_bytes().as_ptr(), first.as_ptr(), "not copied");
        let mut kept = Kept::default();
        for c in [&b"ab"[..], b"c", b"def"] {
            kept.push(&Bytes::copy_from_slice(c));
        }
        assert_eq!(kept.len(), 6);
        assert_eq!(kept.into_bytes(), "abcdef");
        assert!(Kept::default().into_bytes().is_empty());
    }
}
