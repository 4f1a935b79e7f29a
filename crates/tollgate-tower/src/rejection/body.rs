//! [`RejectionBody`]: a response body type a rejection can be written in.

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::combinators::{BoxBody, UnsyncBoxBody};
use http_body_util::{BodyExt, Full};

use crate::body::ResponseBody;

/// A response body type that can hold a rejection: the
/// [rate limit](crate::rate_limit::RateLimit)'s responses keep the inner
/// service's body type, and its own answers (a problem document, a gRPC
/// trailers-only response's empty body) are written in that type.
///
/// So an admitted response passes through untouched: an axum router gets
/// back the very `axum::body::Body` its handler made, and does not box it
/// again.
///
/// Implemented for axum's `Body` (feature `axum`), tonic's `Body` (feature
/// `grpc`), [`Full<Bytes>`], the boxed bodies of `http-body-util`, and
/// [`ResponseBody`] (the body of tollgate's other layers, so a rate limit
/// wraps a lock or an idempotency layer as it is). An inner service with
/// another body type can have it wrapped first, with
/// `tower_http::map_response_body::MapResponseBodyLayer::new(ResponseBody::new)`.
///
/// ```
/// use bytes::Bytes;
/// use http_body::Body as _;
/// use http_body_util::Full;
/// use tollgate::tower::rejection::RejectionBody;
///
/// let body = Full::<Bytes>::from_rejection(Bytes::from_static(b"{}"));
/// assert_eq!(body.size_hint().exact(), Some(2));
/// ```
pub trait RejectionBody: Sized {
    /// A body of `bytes`, in one frame (none when empty).
    fn from_rejection(bytes: Bytes) -> Self;
}

impl RejectionBody for Full<Bytes> {
    fn from_rejection(bytes: Bytes) -> Self {
        Full::new(bytes)
    }
}

impl<B> RejectionBody for ResponseBody<B> {
    fn from_rejection(bytes: Bytes) -> Self {
        ResponseBody::full(bytes)
    }
}

impl<E: 'static> RejectionBody for UnsyncBoxBody<Bytes, E> {
    fn from_rejection(bytes: Bytes) -> Self {
        Full::new(bytes)
            .map_err(|never: Infallible| match never {})
            .boxed_unsync()
    }
}

impl<E: 'static> RejectionBody for BoxBody<Bytes, E> {
    fn from_rejection(bytes: Bytes) -> Self {
        Full::new(bytes)
            .map_err(|never: Infallible| match never {})
            .boxed()
    }
}

#[cfg(feature = "axum")]
impl RejectionBody for axum_core::body::Body {
    fn from_rejection(bytes: Bytes) -> Self {
        axum_core::body::Body::from(bytes)
    }
}

#[cfg(feature = "grpc")]
impl RejectionBody for tonic::body::Body {
    fn from_rejection(bytes: Bytes) -> Self {
        if bytes.is_empty() {
            tonic::body::Body::empty()
        } else {
            tonic::body::Body::new(Full::new(bytes))
        }
    }
}

#[cfg(test)]
mod tests {
    use http_body::Body as _;
    use http_body_util::BodyExt as _;

    use super::*;

    async fn read<B>(body: B) -> Bytes
    where
        B: http_body::Body<Data = Bytes>,
        B::Error: std::fmt::Debug,
    {
        body.collect().await.expect("a rejection body").to_bytes()
    }

    /// Every body type holds the bytes whole, and an empty rejection (a
    /// gRPC trailers-only response) is an ended body.
    #[tokio::test]
    async fn every_body_type_holds_the_rejection() {
        let doc = Bytes::from_static(br#"{"status":429}"#);
        assert_eq!(read(Full::<Bytes>::from_rejection(doc.clone())).await, doc);
        assert_eq!(
            read(ResponseBody::<Full<Bytes>>::from_rejection(doc.clone())).await,
            doc
        );
        assert_eq!(
            read(UnsyncBoxBody::<Bytes, std::io::Error>::from_rejection(
                doc.clone()
            ))
            .await,
            doc
        );
        assert_eq!(
            read(BoxBody::<Bytes, std::io::Error>::from_rejection(
                doc.clone()
            ))
            .await,
            doc
        );
        assert!(ResponseBody::<Full<Bytes>>::from_rejection(Bytes::new()).is_end_stream());
        assert!(Full::<Bytes>::from_rejection(Bytes::new()).is_end_stream());
    }

    #[cfg(feature = "axum")]
    #[tokio::test]
    async fn axum_bodies_hold_the_rejection() {
        let doc = Bytes::from_static(br#"{"status":429}"#);
        assert_eq!(
            read(axum_core::body::Body::from_rejection(doc.clone())).await,
            doc
        );
        assert!(axum_core::body::Body::from_rejection(Bytes::new()).is_end_stream());
    }

    #[cfg(feature = "grpc")]
    #[tokio::test]
    async fn tonic_bodies_hold_the_rejection() {
        let doc = Bytes::from_static(br#"{"status":429}"#);
        assert_eq!(
            read(tonic::body::Body::from_rejection(doc.clone())).await,
            doc
        );
        assert!(tonic::body::Body::from_rejection(Bytes::new()).is_end_stream());
    }
}
