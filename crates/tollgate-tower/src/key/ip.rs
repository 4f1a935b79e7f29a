//! Keys by the socket peer's IP address.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use http::request::Parts;
use tollgate_core::Subject;

use super::{KeyError, KeyExtractor};

/// The socket peer's address, from the request extensions: axum's
/// `ConnectInfo<SocketAddr>` (feature `axum`; serve with
/// `into_make_service_with_connect_info::<SocketAddr>()`), tonic's
/// `TcpConnectInfo` (feature `grpc`), or a plain [`SocketAddr`] inserted by
/// any other server.
///
/// ```
/// use std::net::SocketAddr;
/// use http::Request;
/// use tollgate::tower::key::peer_addr;
///
/// let mut req = Request::get("/").body(()).unwrap().into_parts().0;
/// assert_eq!(peer_addr(&req), None);
/// let addr: SocketAddr = "192.0.2.7:50000".parse().unwrap();
/// req.extensions.insert(addr);
/// assert_eq!(peer_addr(&req), Some(addr));
/// ```
pub fn peer_addr(req: &Parts) -> Option<SocketAddr> {
    let ext = &req.extensions;
    #[cfg(feature = "axum")]
    if let Some(axum::extract::ConnectInfo(addr)) =
        ext.get::<axum::extract::ConnectInfo<SocketAddr>>()
    {
        return Some(*addr);
    }
    #[cfg(feature = "grpc")]
    if let Some(addr) = ext
        .get::<tonic::transport::server::TcpConnectInfo>()
        .and_then(|info| info.remote_addr())
    {
        return Some(addr);
    }
    ext.get::<SocketAddr>().copied()
}

pub(super) const NO_PEER: &str =
    "the peer address is not in the request extensions; with axum, serve with \
     `into_make_service_with_connect_info::<SocketAddr>()`; with tonic over TLS (its \
     `TlsConnectInfo` is not read), or any other server, insert a `SocketAddr` extension";

/// How IP addresses are grouped into keys: IPv4 addresses by a prefix of
/// `v4` bits (default 32: each address on its own), IPv6 addresses by a
/// prefix of `v6` bits (default 64: one key per /64, since a single IPv6
/// client usually owns a whole /64 and could rotate through it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct IpGrouping {
    v4: u8,
    v6: u8,
}

impl Default for IpGrouping {
    fn default() -> Self {
        IpGrouping { v4: 32, v6: 64 }
    }
}

impl IpGrouping {
    pub(super) fn subject(&self, ip: IpAddr) -> Subject {
        let (net, prefix, full) = match ip.to_canonical() {
            IpAddr::V4(v4) => (IpAddr::V4(mask_v4(v4, self.v4)), self.v4, 32),
            IpAddr::V6(v6) => (IpAddr::V6(mask_v6(v6, self.v6)), self.v6, 128),
        };
        if prefix >= full {
            Subject::from(net)
        } else {
            Subject::new(format!("{net}/{prefix}"))
        }
    }

    /// Groups IPv4 addresses by `prefix` bits; panics if `prefix > 32`.
    pub(super) fn with_v4(mut self, prefix: u8) -> Self {
        check_prefix("IPv4", prefix, 32);
        self.v4 = prefix;
        self
    }

    /// Groups IPv6 addresses by `prefix` bits; panics if `prefix > 128`.
    pub(super) fn with_v6(mut self, prefix: u8) -> Self {
        check_prefix("IPv6", prefix, 128);
        self.v6 = prefix;
        self
    }
}

pub(super) fn mask_v4(ip: Ipv4Addr, prefix: u8) -> Ipv4Addr {
    let bits = u32::from(ip);
    let mask = if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(prefix.min(32)))
    };
    Ipv4Addr::from(bits & mask)
}

pub(super) fn mask_v6(ip: Ipv6Addr, prefix: u8) -> Ipv6Addr {
    let bits = u128::from(ip);
    let mask = if prefix == 0 {
        0
    } else {
        u128::MAX << (128 - u32::from(prefix.min(128)))
    };
    Ipv6Addr::from(bits & mask)
}

/// The `ipv6_prefix` and `ipv4_prefix` builder methods of a key that holds
/// an [`IpGrouping`] in a field `grouping`. [`PeerIp`] and
/// [`ClientIp`](super::ClientIp) group addresses the same way, so they take
/// (and document) the grouping through the same two methods.
macro_rules! grouping_setters {
    () => {
        /// Groups IPv6 addresses by their first `prefix` bits (default 64;
        /// 128 keys each address on its own). Panics if `prefix > 128`.
        pub fn ipv6_prefix(mut self, prefix: u8) -> Self {
            self.grouping = self.grouping.with_v6(prefix);
            self
        }

        /// Groups IPv4 addresses by their first `prefix` bits (default 32:
        /// each address on its own). Panics if `prefix > 32`.
        pub fn ipv4_prefix(mut self, prefix: u8) -> Self {
            self.grouping = self.grouping.with_v4(prefix);
            self
        }
    };
}
pub(super) use grouping_setters;

fn check_prefix(family: &str, prefix: u8, max: u8) {
    assert!(
        prefix <= max,
        "tollgate: an {family} prefix length must be at most {max}, got {prefix}"
    );
}

/// Keys requests by the socket peer's IP address (see [`peer_addr`]),
/// IPv6 addresses grouped by their /64 (configurable).
///
/// Use it when clients connect directly. Behind a load balancer or reverse
/// proxy every request comes from the proxy: use [`ClientIp`](super::ClientIp) there.
///
/// A request without a recorded peer address is answered 500 (the server
/// is not set up to record it).
///
/// ```
/// use std::net::SocketAddr;
/// use http::Request;
/// use tollgate::Subject;
/// use tollgate::tower::key::{KeyExtractor, PeerIp};
///
/// let key = PeerIp::new();
/// let mut req = Request::get("/").body(()).unwrap().into_parts().0;
/// req.extensions.insert("[2001:db8:1:2:aaaa::1]:443".parse::<SocketAddr>().unwrap());
/// assert_eq!(key.extract(&req).unwrap(), Some(Subject::new("2001:db8:1:2::/64")));
///
/// let mut req = Request::get("/").body(()).unwrap().into_parts().0;
/// req.extensions.insert("192.0.2.7:50000".parse::<SocketAddr>().unwrap());
/// assert_eq!(key.extract(&req).unwrap(), Some(Subject::new("192.0.2.7")));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PeerIp {
    grouping: IpGrouping,
}

impl PeerIp {
    /// Keys by the peer address; IPv4 per address, IPv6 per /64.
    pub fn new() -> Self {
        Self::default()
    }

    grouping_setters!();
}

impl KeyExtractor for PeerIp {
    fn extract(&self, req: &Parts) -> Result<Option<Subject>, KeyError> {
        let peer = peer_addr(req).ok_or_else(|| KeyError::internal(NO_PEER))?;
        Ok(Some(self.grouping.subject(peer.ip())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::*;

    #[test]
    fn ipv6_grouping() {
        let k = PeerIp::new();
        let a = key(&k, &req_from("[2001:db8:0:1::1]:1", &[]));
        let b = key(&k, &req_from("[2001:db8:0:1:ffff:ffff:ffff:ffff]:1", &[]));
        let c = key(&k, &req_from("[2001:db8:0:2::1]:1", &[]));
        assert_eq!(a, b);
        assert_ne!(a, c);
        let k = PeerIp::new().ipv6_prefix(128);
        assert_ne!(
            key(&k, &req_from("[2001:db8::1]:1", &[])),
            key(&k, &req_from("[2001:db8::2]:1", &[]))
        );
        let k = PeerIp::new().ipv6_prefix(48).ipv4_prefix(24);
        assert_eq!(
            key(&k, &req_from("[2001:db8:1:2::1]:1", &[])),
            Subject::new("2001:db8:1::/48")
        );
        assert_eq!(
            key(&k, &req_from("192.0.2.77:1", &[])),
            Subject::new("192.0.2.0/24")
        );
        // IPv4-mapped addresses key as IPv4.
        assert_eq!(
            key(&PeerIp::new(), &req_from("[::ffff:192.0.2.1]:1", &[])),
            Subject::new("192.0.2.1")
        );
    }

    #[test]
    fn missing_peer_is_a_server_error() {
        let req = http::Request::get("/").body(()).unwrap().into_parts().0;
        let e = PeerIp::new().extract(&req).unwrap_err();
        assert_eq!(e.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert!(e.message().contains("connect_info"));
    }
}
