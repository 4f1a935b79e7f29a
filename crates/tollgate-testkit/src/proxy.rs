//! [`ReplyDelay`]: a TCP relay in front of a real server that can hold
//! back what the server sends, so a reply arrives after the server decided
//! — the case a paused server cannot make (it decides late too) — and that
//! can send new connections elsewhere, as a DNS name that moves to the
//! promoted replica on failover does.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Relays 127.0.0.1 connections to `upstream`; replies (server to client)
/// are held back by the delay set with [`ReplyDelay::set`] (none at first).
/// Requests pass at once. Stops accepting when dropped.
#[derive(Debug)]
pub struct ReplyDelay {
    addr: SocketAddr,
    delay_ms: Arc<AtomicU64>,
    /// Replies still to drop, each with its connection.
    cuts: Arc<AtomicU64>,
    upstream: Arc<Mutex<String>>,
    accept: tokio::task::JoinHandle<()>,
}

impl ReplyDelay {
    /// Starts relaying to `upstream` (`host:port`) on a free local port.
    pub async fn start(upstream: &str) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let delay_ms = Arc::new(AtomicU64::new(0));
        let upstream = Arc::new(Mutex::new(upstream.to_owned()));
        let cuts = Arc::new(AtomicU64::new(0));
        let delay = Arc::clone(&delay_ms);
        let cut = Arc::clone(&cuts);
        let target = Arc::clone(&upstream);
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let to = target.lock().unwrap_or_else(|e| e.into_inner()).clone();
                let Ok(server) = TcpStream::connect(&to).await else {
                    continue;
                };
                tokio::spawn(relay(client, server, Arc::clone(&delay), Arc::clone(&cut)));
            }
        });
        Ok(ReplyDelay {
            addr,
            delay_ms,
            cuts,
            upstream,
            accept,
        })
    }

    /// `redis://` URL of the relay.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Holds back every reply read from now on by `delay`.
    pub fn set(&self, delay: Duration) {
        self.delay_ms
            .store(delay.as_millis() as u64, Ordering::SeqCst);
    }

    /// Drops the next reply any server sends, and closes its connection:
    /// the server did the work, the client never hears of it.
    pub fn cut_next_reply(&self) {
        self.cuts.fetch_add(1, Ordering::SeqCst);
    }

    /// How many replies armed by [`cut_next_reply`](Self::cut_next_reply)
    /// are still to be dropped.
    pub fn cuts_left(&self) -> u64 {
        self.cuts.load(Ordering::SeqCst)
    }

    /// Relays connections opened from now on to `upstream` (`host:port`);
    /// open ones stay with their server, as after a DNS name moves.
    pub fn move_to(&self, upstream: &str) {
        *self.upstream.lock().unwrap_or_else(|e| e.into_inner()) = upstream.to_owned();
    }
}

impl Drop for ReplyDelay {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn relay(
    client: TcpStream,
    server: TcpStream,
    delay_ms: Arc<AtomicU64>,
    cuts: Arc<AtomicU64>,
) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let up = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
    });
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match server_read.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let cut = cuts.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |c| c.checked_sub(1));
        if cut.is_ok() {
            break;
        }
        let delay = delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        if client_write.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    up.abort();
}
