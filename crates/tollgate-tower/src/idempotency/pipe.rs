//! The relay's pipe to the client's body: pieces in order, with the data
//! a slow client has not read yet merged into frames of up to
//! [`MERGED`] bytes. A handler that writes tiny frames (a token at a
//! time) to a client that stalls then costs the bytes it waits with, not a
//! queue slot and an allocation per frame; a client that keeps up gets
//! every frame as it comes.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use http_body::Frame;

use crate::body::BoxError;

/// The most bytes unread data frames are merged into.
const MERGED: usize = 64 * 1024;

/// What the relay hands the client's body: a frame (`true`: one that took
/// room, past what is stored), the body's error, or its end.
pub(super) enum Piece {
    Frame(Frame<Bytes>, bool),
    Failed(BoxError),
    End,
}

/// A piece in the pipe: as sent, or data frames merged while unread.
enum Queued {
    Piece(Piece),
    Merged(BytesMut),
}

impl Queued {
    /// Adds `data` to this piece if both are data that took no room and
    /// the sum fits in [`MERGED`].
    fn merge(&mut self, data: &Bytes) -> bool {
        match self {
            Queued::Merged(buf) if buf.len() + data.len() <= MERGED => {
                buf.extend_from_slice(data);
                true
            }
            Queued::Piece(Piece::Frame(frame, false)) => {
                let Some(first) = frame.data_ref() else {
                    return false;
                };
                if first.len() + data.len() > MERGED {
                    return false;
                }
                let mut buf = BytesMut::with_capacity((first.len() + data.len()) * 2);
                buf.extend_from_slice(first);
                buf.extend_from_slice(data);
                *self = Queued::Merged(buf);
                true
            }
            _ => false,
        }
    }
}

#[derive(Default)]
struct State {
    queue: VecDeque<Queued>,
    waker: Option<Waker>,
    sender_gone: bool,
    receiver_gone: bool,
}

type Shared = Arc<Mutex<State>>;

fn lock(state: &Shared) -> MutexGuard<'_, State> {
    // A panic while holding it leaves the queue whole: go on with it.
    state.lock().unwrap_or_else(|e| e.into_inner())
}

/// A pipe: the relay's end and the client body's.
pub(super) fn pipe() -> (Sender, Receiver) {
    let state = Shared::default();
    (Sender(Arc::clone(&state)), Receiver(state))
}

/// The relay's end: dropped, the pipe ends (cut short, unless an
/// [`Piece::End`] or [`Piece::Failed`] was sent).
pub(super) struct Sender(Shared);

impl Sender {
    /// Sends `piece` (nothing once the client's body is gone).
    pub(super) fn send(&self, piece: Piece) {
        let mut s = lock(&self.0);
        if s.receiver_gone {
            return;
        }
        let merged = match (&piece, s.queue.back_mut()) {
            (Piece::Frame(frame, false), Some(last)) => {
                frame.data_ref().is_some_and(|data| last.merge(data))
            }
            _ => false,
        };
        if !merged {
            s.queue.push_back(Queued::Piece(piece));
        }
        if let Some(waker) = s.waker.take() {
            waker.wake();
        }
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        let mut s = lock(&self.0);
        s.sender_gone = true;
        if let Some(waker) = s.waker.take() {
            waker.wake();
        }
    }
}

/// The client body's end.
pub(super) struct Receiver(Shared);

impl Receiver {
    /// The next piece; `None` once the relay's end is gone and every piece
    /// was read.
    pub(super) fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Piece>> {
        let mut s = lock(&self.0);
        match s.queue.pop_front() {
            Some(Queued::Piece(piece)) => Poll::Ready(Some(piece)),
            Some(Queued::Merged(buf)) => {
                Poll::Ready(Some(Piece::Frame(Frame::data(buf.freeze()), false)))
            }
            None if s.sender_gone => Poll::Ready(None),
            None => {
                s.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let mut s = lock(&self.0);
        s.receiver_gone = true;
        s.queue.clear();
    }
}

#[cfg(test)]
mod tests {
    use std::task::Waker;

    use super::*;

    fn recv(rx: &mut Receiver) -> Option<Option<Piece>> {
        match rx.poll_recv(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(p) => Some(p),
            Poll::Pending => None,
        }
    }

    fn data(piece: Option<Option<Piece>>) -> Bytes {
        match piece {
            Some(Some(Piece::Frame(frame, _))) => {
                frame.into_data().unwrap_or_else(|_| panic!("not data"))
            }
            _ => panic!("no data frame"),
        }
    }

    /// Frames read as they come pass one by one; unread ones merge, in
    /// order and up to the bound, never across a frame that took room or
    /// a non-data frame.
    #[test]
    fn unread_data_frames_merge_in_order() {
        let (tx, mut rx) = pipe();
        tx.send(Piece::Frame(Frame::data(Bytes::from_static(b"a")), false));
        assert_eq!(data(recv(&mut rx)), "a");
        assert!(recv(&mut rx).is_none(), "nothing more yet");
        // 200 000 one-byte frames unread: merged into frames of the bound.
        for i in 0..200_000u32 {
            let byte = Bytes::copy_from_slice(&[b'0' + (i % 10) as u8]);
            tx.send(Piece::Frame(Frame::data(byte), false));
        }
        tx.send(Piece::Frame(Frame::data(Bytes::from_static(b"r")), true));
        tx.send(Piece::Frame(Frame::data(Bytes::from_static(b"s")), false));
        tx.send(Piece::Frame(Frame::trailers(http::HeaderMap::new()), false));
        tx.send(Piece::Frame(Frame::data(Bytes::from_static(b"t")), false));
        tx.send(Piece::End);
        drop(tx);
        let mut all = Vec::new();
        for _ in 0..4 {
            let chunk = data(recv(&mut rx));
            assert!(chunk.len() <= MERGED);
            all.extend_from_slice(&chunk);
        }
        assert_eq!(all.len(), 200_000);
        assert!(all
            .iter()
            .enumerate()
            .all(|(i, b)| *b == b'0' + (i % 10) as u8));
        match recv(&mut rx) {
            Some(Some(Piece::Frame(frame, true))) => assert_eq!(frame.into_data().unwrap(), "r"),
            _ => panic!("the frame that took room, on its own"),
        }
        assert_eq!(data(recv(&mut rx)), "s");
        assert!(matches!(recv(&mut rx), Some(Some(Piece::Frame(f, false))) if f.is_trailers()));
        assert_eq!(data(recv(&mut rx)), "t");
        assert!(matches!(recv(&mut rx), Some(Some(Piece::End))));
        assert!(matches!(recv(&mut rx), Some(None)), "ended");
    }

    /// A pipe whose relay end is dropped without an end is cut short; one
    /// whose client is gone takes nothing more.
    #[test]
    fn ends_are_seen() {
        let (tx, mut rx) = pipe();
        tx.send(Piece::Frame(Frame::data(Bytes::from_static(b"a")), false));
        drop(tx);
        assert_eq!(data(recv(&mut rx)), "a");
        assert!(matches!(recv(&mut rx), Some(None)));
        let (tx, rx) = pipe();
        drop(rx);
        tx.send(Piece::Frame(Frame::data(Bytes::from_static(b"a")), false));
        assert!(lock(&tx.0).queue.is_empty());
    }
}
