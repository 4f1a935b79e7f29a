//! A small upstream HTTP server for the pacing tests: it answers its first
//! request with a scripted response (a 429 with `Retry-After`, a 200 with
//! an exhausted `RateLimit`, …) and 200 afterwards, and records each
//! arrival: when, from which instance, and what it answered.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::Router;

/// One request as the upstream saw it.
#[derive(Debug, Clone)]
pub(crate) struct Arrival {
    /// When the handler ran.
    pub(crate) at: Instant,
    /// The `x-instance` header of the request.
    pub(crate) instance: String,
    /// The status answered.
    pub(crate) status: u16,
    /// When the answer was made (just before it was written back).
    pub(crate) answered: Instant,
}

/// The first answer: status and headers.
#[derive(Clone)]
pub(crate) struct First {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, String)>,
}

impl First {
    pub(crate) fn new(status: u16, headers: &[(&str, &str)]) -> Self {
        First {
            status,
            headers: headers
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        }
    }
}

#[derive(Clone)]
struct Shared {
    first: First,
    /// Headers of every later (200) answer.
    after: Vec<(String, String)>,
    log: Arc<Mutex<Vec<Arrival>>>,
}

pub(crate) struct Upstream {
    pub(crate) addr: SocketAddr,
    log: Arc<Mutex<Vec<Arrival>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Upstream {
    /// Answers the first request with `first`, then 200 with `after`'s
    /// headers.
    pub(crate) async fn start(first: First, after: &[(&str, &str)]) -> Upstream {
        let log = Arc::new(Mutex::new(Vec::new()));
        let shared = Shared {
            first,
            after: First::new(200, after).headers,
            log: Arc::clone(&log),
        };
        let app = Router::new().fallback(any(answer)).with_state(shared);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Upstream { addr, log, task }
    }

    pub(crate) fn uri(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Every arrival so far, in order.
    pub(crate) fn arrivals(&self) -> Vec<Arrival> {
        self.log.lock().unwrap().clone()
    }
}

async fn answer(State(shared): State<Shared>, headers: HeaderMap) -> Response {
    let at = Instant::now();
    let instance = headers
        .get("x-instance")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let mut log = shared.log.lock().unwrap();
    let (status, extra) = if log.is_empty() {
        (shared.first.status, &shared.first.headers)
    } else {
        (200, &shared.after)
    };
    let mut response = (StatusCode::from_u16(status).unwrap(), "answer").into_response();
    for (k, v) in extra {
        response.headers_mut().append(
            axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            v.parse().unwrap(),
        );
    }
    log.push(Arrival {
        at,
        instance,
        status,
        answered: Instant::now(),
    });
    response
}
