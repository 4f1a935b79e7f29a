//! Key extractors: who or what a request is limited (or locked) under.
//!
//! A [`KeyExtractor`] looks at a request and answers one of three things:
//!
//! - `Ok(Some(subject))`: limit this request under `subject`;
//! - `Ok(None)`: this request is not limited (it passes straight through);
//! - `Err(KeyError)`: the request cannot be keyed; it is answered with the
//!   error's status (400, 401, 500, …) and message, and never reaches the
//!   inner service.
//!
//! Built-ins: [`GlobalKey`] (one shared budget), [`PeerIp`] (the socket
//! peer), [`ClientIp`] (the client behind trusted proxies), [`HeaderKey`] (an
//! API key), [`ExtensionKey`] (an authenticated user id put in the request
//! extensions by an earlier layer), [`RouteKey`] (the matched route), tuples
//! `(A, B)`, `(A, B, C)`, `(A, B, C, D)` (a compound key, e.g. user + route)
//! and [`Or`] (the first extractor that yields a key). Any closure
//! `Fn(&Request<B>) -> Result<Option<Subject>, KeyError>` that is `Clone +
//! Send + Sync + 'static` is an extractor too.
//!
//! Subjects end up in Redis keys, escaped by [`Subject`]; traces only ever
//! show [`Subject::digest`].

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;
use std::sync::Arc;

use http::{HeaderName, Request, StatusCode};
use sha2::{Digest, Sha256};
use tollgate_core::Subject;

/// Yields the key a request is limited or locked under.
///
/// Implemented by every built-in extractor of this module, by tuples of
/// extractors (compound keys) and by closures:
///
/// ```
/// use http::Request;
/// use tollgate_core::Subject;
/// use tollgate_tower::key::{KeyError, KeyExtractor};
///
/// // Limit by tenant, taken from the path; `/health` is not limited.
/// let by_tenant = |req: &Request<()>| -> Result<Option<Subject>, KeyError> {
///     if req.uri().path() == "/health" {
///         return Ok(None);
///     }
///     match req.uri().path().split('/').nth(1) {
///         Some(tenant) if !tenant.is_empty() => Ok(Some(Subject::new(tenant))),
///         _ => Err(KeyError::bad_request("no tenant in the path")),
///     }
/// };
///
/// let req = Request::get("/acme/orders").body(()).unwrap();
/// assert_eq!(by_tenant.extract(&req).unwrap(), Some(Subject::new("acme")));
/// let req = Request::get("/health").body(()).unwrap();
/// assert_eq!(by_tenant.extract(&req).unwrap(), None);
/// let req = Request::get("/").body(()).unwrap();
/// assert_eq!(by_tenant.extract(&req).unwrap_err().status(), 400);
/// ```
pub trait KeyExtractor<B>: Clone + Send + Sync + 'static {
    /// The key for `req`: `Some` to limit it under that key, `None` to let it
    /// through unlimited, `Err` to refuse it.
    fn extract(&self, req: &Request<B>) -> Result<Option<Subject>, KeyError>;
}

impl<B, F> KeyExtractor<B> for F
where
    F: Fn(&Request<B>) -> Result<Option<Subject>, KeyError> + Clone + Send + Sync + 'static,
{
    fn extract(&self, req: &Request<B>) -> Result<Option<Subject>, KeyError> {
        self(req)
    }
}

/// Why a request could not be keyed; the request is answered with
/// [`KeyError::status`] (mapped to a gRPC status for gRPC requests) and a
/// short text body carrying [`KeyError::message`].
///
/// ```
/// use http::StatusCode;
/// use tollgate_tower::key::KeyError;
///
/// let e = KeyError::unauthorized("missing API key");
/// assert_eq!(e.status(), StatusCode::UNAUTHORIZED);
/// assert_eq!(e.message(), "missing API key");
/// assert_eq!(e.to_string(), "missing API key");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyError {
    status: StatusCode,
    message: Cow<'static, str>,
}

impl KeyError {
    /// An error answered with `status`.
    pub fn new(status: StatusCode, message: impl Into<Cow<'static, str>>) -> Self {
        KeyError {
            status,
            message: message.into(),
        }
    }

    /// 400: the request itself is malformed (an unparsable header, …).
    pub fn bad_request(message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    /// 401: the request lacks the credential the key is made of.
    pub fn unauthorized(message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, message)
    }

    /// 500: the server is misconfigured (a layer that should have run first
    /// did not, the peer address was not recorded, …).
    pub fn internal(message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }

    /// The HTTP status the request is answered with.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The message sent in the response body.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for KeyError {}

/// One key for every request: a single budget shared by all clients (or one
/// mutex, for a lock).
///
/// ```
/// use http::Request;
/// use tollgate_core::Subject;
/// use tollgate_tower::key::{GlobalKey, KeyExtractor};
///
/// let req = Request::get("/").body(()).unwrap();
/// assert_eq!(GlobalKey.extract(&req).unwrap(), Some(Subject::new("global")));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GlobalKey;

impl<B> KeyExtractor<B> for GlobalKey {
    fn extract(&self, _req: &Request<B>) -> Result<Option<Subject>, KeyError> {
        Ok(Some(Subject::new("global")))
    }
}

/// The socket peer's address, from the request extensions: axum's
/// `ConnectInfo<SocketAddr>` (feature `axum`; serve with
/// `into_make_service_with_connect_info::<SocketAddr>()`), tonic's
/// `TcpConnectInfo` (feature `grpc`), or a plain [`SocketAddr`] inserted by
/// any other server.
///
/// ```
/// use std::net::SocketAddr;
/// use http::Request;
/// use tollgate_tower::key::peer_addr;
///
/// let mut req = Request::get("/").body(()).unwrap();
/// assert_eq!(peer_addr(&req), None);
/// let addr: SocketAddr = "192.0.2.7:50000".parse().unwrap();
/// req.extensions_mut().insert(addr);
/// assert_eq!(peer_addr(&req), Some(addr));
/// ```
pub fn peer_addr<B>(req: &Request<B>) -> Option<SocketAddr> {
    let ext = req.extensions();
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

const NO_PEER: &str = "the peer address is not in the request extensions; with axum, serve with \
     `into_make_service_with_connect_info::<SocketAddr>()`, or insert a `SocketAddr` extension";

/// How IP addresses are grouped into keys: IPv4 addresses by a prefix of
/// `v4` bits (default 32: each address on its own), IPv6 addresses by a
/// prefix of `v6` bits (default 64: one key per /64, since a single IPv6
/// client usually owns a whole /64 and could rotate through it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct IpGrouping {
    v4: u8,
    v6: u8,
}

impl Default for IpGrouping {
    fn default() -> Self {
        IpGrouping { v4: 32, v6: 64 }
    }
}

impl IpGrouping {
    fn subject(&self, ip: IpAddr) -> Subject {
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
    fn with_v4(mut self, prefix: u8) -> Self {
        check_prefix("IPv4", prefix, 32);
        self.v4 = prefix;
        self
    }

    /// Groups IPv6 addresses by `prefix` bits; panics if `prefix > 128`.
    fn with_v6(mut self, prefix: u8) -> Self {
        check_prefix("IPv6", prefix, 128);
        self.v6 = prefix;
        self
    }
}

fn mask_v4(ip: Ipv4Addr, prefix: u8) -> Ipv4Addr {
    let bits = u32::from(ip);
    let mask = if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(prefix.min(32)))
    };
    Ipv4Addr::from(bits & mask)
}

fn mask_v6(ip: Ipv6Addr, prefix: u8) -> Ipv6Addr {
    let bits = u128::from(ip);
    let mask = if prefix == 0 {
        0
    } else {
        u128::MAX << (128 - u32::from(prefix.min(128)))
    };
    Ipv6Addr::from(bits & mask)
}

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
/// proxy every request comes from the proxy: use [`ClientIp`] there.
///
/// A request without a recorded peer address is answered 500 (the server
/// is not set up to record it).
///
/// ```
/// use std::net::SocketAddr;
/// use http::Request;
/// use tollgate_core::Subject;
/// use tollgate_tower::key::{KeyExtractor, PeerIp};
///
/// let key = PeerIp::new();
/// let mut req = Request::get("/").body(()).unwrap();
/// req.extensions_mut().insert("[2001:db8:1:2:aaaa::1]:443".parse::<SocketAddr>().unwrap());
/// assert_eq!(key.extract(&req).unwrap(), Some(Subject::new("2001:db8:1:2::/64")));
///
/// let mut req = Request::get("/").body(()).unwrap();
/// req.extensions_mut().insert("192.0.2.7:50000".parse::<SocketAddr>().unwrap());
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

    /// Groups IPv6 addresses by their first `prefix` bits (default 64; 128
    /// keys each address on its own). Panics if `prefix > 128`.
    pub fn ipv6_prefix(mut self, prefix: u8) -> Self {
        self.grouping = self.grouping.with_v6(prefix);
        self
    }

    /// Groups IPv4 addresses by their first `prefix` bits (default 32: each
    /// address on its own). Panics if `prefix > 32`.
    pub fn ipv4_prefix(mut self, prefix: u8) -> Self {
        self.grouping = self.grouping.with_v4(prefix);
        self
    }
}

impl<B> KeyExtractor<B> for PeerIp {
    fn extract(&self, req: &Request<B>) -> Result<Option<Subject>, KeyError> {
        let peer = peer_addr(req).ok_or_else(|| KeyError::internal(NO_PEER))?;
        Ok(Some(self.grouping.subject(peer.ip())))
    }
}

/// A block of IP addresses, `10.0.0.0/8` or `2001:db8::/32`; a bare address
/// is a block of one.
///
/// ```
/// use tollgate_tower::key::Cidr;
///
/// let net: Cidr = "10.0.0.0/8".parse().unwrap();
/// assert!(net.contains("10.1.2.3".parse().unwrap()));
/// assert!(!net.contains("11.0.0.1".parse().unwrap()));
/// // IPv4-mapped IPv6 addresses match IPv4 blocks.
/// assert!(net.contains("::ffff:10.9.9.9".parse().unwrap()));
/// let one: Cidr = "2001:db8::1".parse().unwrap();
/// assert_eq!(one.prefix_len(), 128);
/// assert!("10.0.0.0/33".parse::<Cidr>().is_err());
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// The block of `prefix` bits starting at `addr` (host bits are cleared).
    pub fn new(addr: IpAddr, prefix: u8) -> Result<Self, InvalidCidr> {
        let addr = addr.to_canonical();
        let network = match addr {
            IpAddr::V4(v4) if prefix <= 32 => IpAddr::V4(mask_v4(v4, prefix)),
            IpAddr::V6(v6) if prefix <= 128 => IpAddr::V6(mask_v6(v6, prefix)),
            _ => {
                return Err(InvalidCidr(format!(
                    "prefix length {prefix} is too long for {addr}"
                )))
            }
        };
        Ok(Cidr { network, prefix })
    }

    /// The first address of the block.
    pub fn network(&self) -> IpAddr {
        self.network
    }

    /// The prefix length in bits.
    pub fn prefix_len(&self) -> u8 {
        self.prefix
    }

    /// Whether `ip` is in the block (IPv4-mapped IPv6 addresses count as
    /// IPv4).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.network, ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => mask_v4(ip, self.prefix) == net,
            (IpAddr::V6(net), IpAddr::V6(ip)) => mask_v6(ip, self.prefix) == net,
            _ => false,
        }
    }
}

impl fmt::Debug for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

impl FromStr for Cidr {
    type Err = InvalidCidr;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| InvalidCidr(format!("{s:?} is not an IP address or block")))?;
        let prefix = match prefix {
            None => match addr.to_canonical() {
                IpAddr::V4(_) => 32,
                IpAddr::V6(_) => 128,
            },
            Some(p) => p
                .parse::<u8>()
                .map_err(|_| InvalidCidr(format!("{s:?} has an invalid prefix length")))?,
        };
        // `::ffff:10.0.0.0/104` is the IPv4 block 10.0.0.0/8.
        let prefix = match addr {
            IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some() => {
                prefix.checked_sub(96).ok_or_else(|| {
                    InvalidCidr(format!("{s:?}: an IPv4-mapped block needs a prefix ≥ 96"))
                })?
            }
            _ => prefix,
        };
        Cidr::new(addr, prefix).map_err(|e| InvalidCidr(format!("{s:?}: {}", e.0)))
    }
}

impl From<IpAddr> for Cidr {
    fn from(ip: IpAddr) -> Self {
        let ip = ip.to_canonical();
        let prefix = if ip.is_ipv4() { 32 } else { 128 };
        Cidr {
            network: ip,
            prefix,
        }
    }
}

/// A string that is not an IP address block.
///
/// ```
/// use tollgate_tower::key::Cidr;
///
/// let err = "not-an-ip".parse::<Cidr>().unwrap_err();
/// assert!(err.to_string().contains("not-an-ip"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidCidr(String);

impl fmt::Display for InvalidCidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid address block: {}", self.0)
    }
}

impl std::error::Error for InvalidCidr {}

/// Which header a trusted proxy records the client address in.
///
/// Exactly one is read: a proxy that appends to one header passes the
/// others through from the client untouched, so reading a header the proxy
/// does not manage would let clients choose their own key.
///
/// ```
/// use tollgate_tower::key::{ClientIp, ForwardedHeader};
///
/// let key = ClientIp::trusted_proxies(["10.0.0.0/8"])
///     .unwrap()
///     .header(ForwardedHeader::Forwarded);
/// # let _ = key;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ForwardedHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2` (the default).
    #[default]
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=client, for="[2001:db8::1]:4711"`.
    Forwarded,
    /// `X-Real-IP: client`, set (not appended) by the nearest proxy.
    XRealIp,
}

/// Keys requests by the client's IP address behind trusted reverse proxies.
///
/// The forwarding header ([`ForwardedHeader`], default `X-Forwarded-For`)
/// is believed **only** when the socket peer is in the trusted set. It is
/// then read right to left, skipping addresses that are themselves trusted
/// proxies; the first untrusted address is the client. A client that is not
/// behind a trusted proxy is keyed by its own socket address, whatever
/// headers it sends, so it cannot choose its key. An unparsable hop (`unknown`,
/// an obfuscated RFC 7239 identifier) ends the walk: the request is keyed by
/// the trusted proxy that reported it, which is conservative (all such
/// clients share that proxy's budget).
///
/// What the client sent can only sit **left** of what the trusted proxies
/// appended, and the walk stops at the first untrusted address, so nothing
/// the client puts there changes its key. In particular a stray quote cannot
/// swallow the appended hops: `X-Forwarded-For` and `X-Real-IP` are split on
/// every comma (their elements never hold one), and `Forwarded` elements are
/// split from the right, so `X-Forwarded-For: ", 203.0.113.9` and
/// `Forwarded: for="x, for=203.0.113.9` (a client's `"` and the proxy's
/// addition on one line) both key `203.0.113.9`.
///
/// IPv6 addresses are grouped by their /64 by default
/// ([`ClientIp::ipv6_prefix`]).
///
/// ```
/// use std::net::SocketAddr;
/// use http::Request;
/// use tollgate_core::Subject;
/// use tollgate_tower::key::{ClientIp, KeyExtractor};
///
/// let key = ClientIp::trusted_proxies(["10.0.0.0/8", "fd00::/8"]).unwrap();
///
/// // Through the load balancer 10.0.0.2: the header is believed.
/// let mut req = Request::get("/")
///     .header("x-forwarded-for", "203.0.113.9, 10.0.0.7")
///     .body(())
///     .unwrap();
/// req.extensions_mut().insert("10.0.0.2:1234".parse::<SocketAddr>().unwrap());
/// assert_eq!(key.extract(&req).unwrap(), Some(Subject::new("203.0.113.9")));
///
/// // Straight from the internet: the header is ignored.
/// let mut req = Request::get("/")
///     .header("x-forwarded-for", "1.2.3.4")
///     .body(())
///     .unwrap();
/// req.extensions_mut().insert("198.51.100.1:1234".parse::<SocketAddr>().unwrap());
/// assert_eq!(key.extract(&req).unwrap(), Some(Subject::new("198.51.100.1")));
/// ```
#[derive(Debug, Clone)]
pub struct ClientIp {
    trusted: Arc<[Cidr]>,
    header: ForwardedHeader,
    grouping: IpGrouping,
}

impl ClientIp {
    /// Trusts the proxies in `cidrs` (`"10.0.0.0/8"`, `"::1"`, …).
    pub fn trusted_proxies<I, S>(cidrs: I) -> Result<Self, InvalidCidr>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let trusted = cidrs
            .into_iter()
            .map(|s| s.as_ref().parse::<Cidr>())
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self::new(trusted))
    }

    /// Trusts the proxies in the given blocks.
    pub fn new(trusted: impl IntoIterator<Item = Cidr>) -> Self {
        ClientIp {
            trusted: trusted.into_iter().collect(),
            header: ForwardedHeader::default(),
            grouping: IpGrouping::default(),
        }
    }

    /// Reads `header` (default `X-Forwarded-For`); see [`ForwardedHeader`].
    pub fn header(mut self, header: ForwardedHeader) -> Self {
        self.header = header;
        self
    }

    /// Groups IPv6 addresses by their first `prefix` bits (default 64).
    /// Panics if `prefix > 128`.
    pub fn ipv6_prefix(mut self, prefix: u8) -> Self {
        self.grouping = self.grouping.with_v6(prefix);
        self
    }

    /// Groups IPv4 addresses by their first `prefix` bits (default 32).
    /// Panics if `prefix > 32`.
    pub fn ipv4_prefix(mut self, prefix: u8) -> Self {
        self.grouping = self.grouping.with_v4(prefix);
        self
    }

    fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|c| c.contains(ip))
    }

    /// The client address of a request that came from `peer`.
    pub fn client_ip<B>(&self, req: &Request<B>, peer: IpAddr) -> IpAddr {
        if !self.is_trusted(peer) {
            return peer;
        }
        let hops = self.hops(req);
        let mut nearest_trusted = peer;
        for hop in hops.iter().rev() {
            match hop {
                Some(ip) if self.is_trusted(*ip) => nearest_trusted = *ip,
                Some(ip) => return *ip,
                // We cannot see past an unparsable hop: the trusted proxy
                // that reported it is the best key we have.
                None => return nearest_trusted,
            }
        }
        // Every hop is a trusted proxy (or there is no header): the
        // leftmost hop is as far as the chain goes.
        nearest_trusted
    }

    /// The hops recorded in the configured header, left (client side) to
    /// right (nearest proxy); `None` for a hop that is not an address.
    ///
    /// Each header line is split on its own. `X-Forwarded-For` and
    /// `X-Real-IP` never carry commas inside an element, so they are split on
    /// every comma with no quote handling: a stray `"` sent by the client
    /// stays inside the client's own element. `Forwarded` elements may hold
    /// quoted strings, so its lines are split from the right (see
    /// [`split_forwarded`]): what the proxies appended is parsed the same
    /// whatever the client put before it.
    fn hops<B>(&self, req: &Request<B>) -> Vec<Option<IpAddr>> {
        let headers = req.headers();
        match self.header {
            ForwardedHeader::XForwardedFor => headers
                .get_all("x-forwarded-for")
                .iter()
                .flat_map(|v| split_commas(v.as_bytes()))
                .map(|hop| parse_node(trim_quotes(hop)))
                .collect(),
            ForwardedHeader::Forwarded => headers
                .get_all(http::header::FORWARDED)
                .iter()
                .flat_map(|v| split_forwarded(v.as_bytes()))
                .map(forwarded_for)
                .collect(),
            // Set, not appended, by the nearest proxy: only its value counts,
            // the last element of the last line.
            ForwardedHeader::XRealIp => headers
                .get_all("x-real-ip")
                .iter()
                .next_back()
                .and_then(|v| split_commas(v.as_bytes()).next_back())
                .map(|hop| vec![parse_node(trim_quotes(hop))])
                .unwrap_or_default(),
        }
    }
}

impl<B> KeyExtractor<B> for ClientIp {
    fn extract(&self, req: &Request<B>) -> Result<Option<Subject>, KeyError> {
        let peer = peer_addr(req).ok_or_else(|| KeyError::internal(NO_PEER))?;
        Ok(Some(self.grouping.subject(self.client_ip(req, peer.ip()))))
    }
}

/// Splits a comma-separated header value on every comma, with no quote
/// handling (`X-Forwarded-For`, `X-Real-IP`: no element holds a comma);
/// empty elements are dropped.
fn split_commas(value: &[u8]) -> impl DoubleEndedIterator<Item = &[u8]> {
    value
        .split(|&b| b == b',')
        .map(<[u8]>::trim_ascii)
        .filter(|s| !s.is_empty())
}

/// Splits an RFC 7239 `Forwarded` value into its elements (left to right),
/// respecting quoted strings, but **reading from the right**.
///
/// Proxies append their elements on the right, after whatever the client
/// sent. Read left to right, an unbalanced `"` from the client (`for="x`)
/// would open a quoted string that swallows every element appended after it,
/// including the client's real address. Read right to left, the appended,
/// well-formed elements are split exactly as they would be on their own; an
/// unbalanced quote can only merge elements further left, which the client
/// controls anyway (and which the walk never reaches once it has found the
/// first untrusted address). Empty elements are dropped.
fn split_forwarded(value: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let (mut end, mut quoted) = (value.len(), false);
    for i in (0..value.len()).rev() {
        match value[i] {
            // The opening quote of the string; an escaped `\"` is content.
            b'"' if quoted => quoted = escaped(value, i),
            // The closing quote of a string, seen first from the right.
            b'"' => quoted = true,
            b',' if !quoted => {
                out.push(value[i + 1..end].trim_ascii());
                end = i;
            }
            _ => {}
        }
    }
    out.push(value[..end].trim_ascii());
    out.retain(|s| !s.is_empty());
    out.reverse();
    out
}

/// Whether the byte at `i` of a quoted string is escaped: preceded by an odd
/// number of backslashes.
fn escaped(value: &[u8], i: usize) -> bool {
    value[..i].iter().rev().take_while(|&&b| b == b'\\').count() % 2 == 1
}

fn trim_quotes(s: &[u8]) -> &[u8] {
    let s = s.trim_ascii();
    match s {
        [b'"', inner @ .., b'"'] => inner.trim_ascii(),
        _ => s,
    }
}

/// The `for=` node of one RFC 7239 element.
fn forwarded_for(element: &[u8]) -> Option<IpAddr> {
    element
        .split(|&b| b == b';')
        .filter_map(|pair| {
            let eq = pair.iter().position(|&b| b == b'=')?;
            let (name, value) = (pair[..eq].trim_ascii(), &pair[eq + 1..]);
            name.eq_ignore_ascii_case(b"for").then_some(value)
        })
        .next()
        .and_then(|v| parse_node(trim_quotes(v)))
}

/// An address, possibly with a port: `1.2.3.4`, `1.2.3.4:80`, `2001:db8::1`,
/// `[2001:db8::1]`, `[2001:db8::1]:80`. Anything else (`unknown`, `_hidden`)
/// is `None`.
fn parse_node(node: &[u8]) -> Option<IpAddr> {
    let s = std::str::from_utf8(node).ok()?.trim();
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(ip.to_canonical());
    }
    if let Ok(sa) = s.parse::<SocketAddr>() {
        return Some(sa.ip().to_canonical());
    }
    let inner = s.strip_prefix('[')?;
    let end = inner.find(']')?;
    inner[..end]
        .parse::<Ipv6Addr>()
        .ok()
        .map(|ip| IpAddr::V6(ip).to_canonical())
}

/// Keys requests by a header's value: an API key, a tenant id.
///
/// Values are hashed (SHA-256) before they become part of a Redis key, since
/// header values are often secrets; [`HeaderKey::plain`] keeps them readable.
/// A request without the header (or with an empty one) is answered 401,
/// unless the key is [`optional`](HeaderKey::optional) (then it is not
/// limited by this key — combine with [`HeaderKey::or`] to fall back to
/// another key).
///
/// ```
/// use http::Request;
/// use tollgate_core::Subject;
/// use tollgate_tower::key::{HeaderKey, KeyExtractor};
///
/// let key = HeaderKey::new("x-tenant").plain();
/// let req = Request::get("/").header("x-tenant", "acme").body(()).unwrap();
/// assert_eq!(key.extract(&req).unwrap(), Some(Subject::new("acme")));
///
/// let req = Request::get("/").body(()).unwrap();
/// assert_eq!(key.extract(&req).unwrap_err().status(), 401);
/// assert_eq!(key.clone().optional().extract(&req).unwrap(), None);
///
/// // Hashed by default: the raw API key never reaches Redis.
/// let req = Request::get("/").header("x-api-key", "s3cr3t").body(()).unwrap();
/// let subject = HeaderKey::new("x-api-key").extract(&req).unwrap().unwrap();
/// assert!(!subject.as_encoded().contains("s3cr3t"));
/// ```
#[derive(Debug, Clone)]
pub struct HeaderKey {
    name: HeaderName,
    optional: bool,
    hashed: bool,
}

impl HeaderKey {
    /// Keys by the first value of header `name` (case-insensitive). Panics
    /// if `name` is not a valid header name.
    pub fn new(name: &str) -> Self {
        let name = HeaderName::from_bytes(name.as_bytes())
            .unwrap_or_else(|_| panic!("tollgate: {name:?} is not a valid header name"));
        HeaderKey {
            name,
            optional: false,
            hashed: true,
        }
    }

    /// Requests without the header are not limited by this key (instead of
    /// being answered 401).
    pub fn optional(mut self) -> Self {
        self.optional = true;
        self
    }

    /// Uses the value as it is (escaped), without hashing it.
    pub fn plain(mut self) -> Self {
        self.hashed = false;
        self
    }

    /// Falls back to `other` when this header is absent; implies
    /// [`optional`](HeaderKey::optional).
    pub fn or<O>(self, other: O) -> Or<Self, O> {
        Or::new(self.optional(), other)
    }
}

impl<B> KeyExtractor<B> for HeaderKey {
    fn extract(&self, req: &Request<B>) -> Result<Option<Subject>, KeyError> {
        let value = req
            .headers()
            .get(&self.name)
            .map(|v| v.as_bytes())
            .filter(|v| !v.is_empty());
        match value {
            Some(v) if self.hashed => Ok(Some(Subject::new(hash_hex(v)))),
            Some(v) => Ok(Some(Subject::new(v))),
            None if self.optional => Ok(None),
            None => Err(KeyError::unauthorized(format!(
                "missing {} header",
                self.name.as_str()
            ))),
        }
    }
}

/// `h:` and the first 16 bytes of the value's SHA-256, in lower-case hex,
/// written into one pre-sized String (this runs on every request of a
/// hashed `HeaderKey`; `Subject::new` then escapes it into its own).
fn hash_hex(value: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digest = Sha256::digest(value);
    let mut s = String::with_capacity(34);
    s.push_str("h:");
    for &b in &digest[..16] {
        s.push(char::from(HEX[usize::from(b >> 4)]));
        s.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    s
}

/// Keys requests by a value an earlier layer put in the request extensions,
/// typically the authenticated user's id.
///
/// [`ExtensionKey::new`] formats the value with `Display`;
/// [`ExtensionKey::with`] maps it with a function. A request without the
/// extension is answered 500 (the layer that inserts it did not run first —
/// check the layer order), unless the key is
/// [`optional`](ExtensionKey::optional): then it is not limited by this key
/// (combine with [`ExtensionKey::or`] to fall back, e.g. to the client IP
/// for anonymous requests).
///
/// ```
/// use http::Request;
/// use tollgate_core::Subject;
/// use tollgate_tower::key::{ExtensionKey, KeyExtractor, PeerIp};
///
/// #[derive(Clone)]
/// struct UserId(u64);
///
/// let key = ExtensionKey::<UserId>::with(|u| Subject::from(u.0));
/// let mut req = Request::get("/").body(()).unwrap();
/// req.extensions_mut().insert(UserId(42));
/// assert_eq!(key.extract(&req).unwrap(), Some(Subject::new("42")));
///
/// // Anonymous requests fall back to the peer address.
/// let key = ExtensionKey::<UserId>::with(|u| Subject::from(u.0)).or(PeerIp::new());
/// let mut req = Request::get("/").body(()).unwrap();
/// req.extensions_mut().insert("192.0.2.1:80".parse::<std::net::SocketAddr>().unwrap());
/// assert_eq!(key.extract(&req).unwrap(), Some(Subject::new("192.0.2.1")));
/// ```
pub struct ExtensionKey<T> {
    map: Arc<dyn Fn(&T) -> Subject + Send + Sync>,
    optional: bool,
    _marker: PhantomData<fn() -> T>,
}

impl<T> ExtensionKey<T>
where
    T: fmt::Display + Clone + Send + Sync + 'static,
{
    /// Keys by the extension's `Display` form.
    pub fn new() -> Self {
        Self::with(|t: &T| Subject::new(t.to_string()))
    }
}

impl<T> Default for ExtensionKey<T>
where
    T: fmt::Display + Clone + Send + Sync + 'static,
{
    fn default() -> Self {
        Self::new()
    }
}

impl<T> ExtensionKey<T>
where
    T: Clone + Send + Sync + 'static,
{
    /// Keys by `map(extension)`.
    pub fn with(map: impl Fn(&T) -> Subject + Send + Sync + 'static) -> Self {
        ExtensionKey {
            map: Arc::new(map),
            optional: false,
            _marker: PhantomData,
        }
    }

    /// Requests without the extension are not limited by this key (instead
    /// of being answered 500).
    pub fn optional(mut self) -> Self {
        self.optional = true;
        self
    }

    /// Falls back to `other` when the extension is absent; implies
    /// [`optional`](ExtensionKey::optional).
    pub fn or<O>(self, other: O) -> Or<Self, O> {
        Or::new(self.optional(), other)
    }
}

impl<T> Clone for ExtensionKey<T> {
    fn clone(&self) -> Self {
        ExtensionKey {
            map: Arc::clone(&self.map),
            optional: self.optional,
            _marker: PhantomData,
        }
    }
}

impl<T> fmt::Debug for ExtensionKey<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExtensionKey")
            .field("type", &std::any::type_name::<T>())
            .field("optional", &self.optional)
            .finish()
    }
}

impl<B, T> KeyExtractor<B> for ExtensionKey<T>
where
    T: Clone + Send + Sync + 'static,
{
    fn extract(&self, req: &Request<B>) -> Result<Option<Subject>, KeyError> {
        match req.extensions().get::<T>() {
            Some(t) => Ok(Some((self.map)(t))),
            None if self.optional => Ok(None),
            None => Err(KeyError::internal(format!(
                "request extension {} is missing; the layer that inserts it must run before this one",
                std::any::type_name::<T>()
            ))),
        }
    }
}

/// Keys requests by their route: axum's `MatchedPath` (`/users/{id}`, with
/// feature `axum`), else the URI path. Optionally prefixed by the method.
///
/// Combine it with a client key for per-client, per-route limits:
/// `(PeerIp::new(), RouteKey::new())`. Note that without a `MatchedPath`
/// (outside an axum router, or in a fallback) the raw path is used, whose
/// values the client chooses.
///
/// ```
/// use http::Request;
/// use tollgate_core::Subject;
/// use tollgate_tower::key::{KeyExtractor, RouteKey};
///
/// let req = Request::post("/orders?x=1").body(()).unwrap();
/// assert_eq!(RouteKey::new().extract(&req).unwrap(), Some(Subject::new("/orders")));
/// assert_eq!(
///     RouteKey::new().with_method().extract(&req).unwrap(),
///     Some(Subject::compound(["POST", "/orders"])),
/// );
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RouteKey {
    method: bool,
}

impl RouteKey {
    /// Keys by the route (or path).
    pub fn new() -> Self {
        Self::default()
    }

    /// Keys by method and route, so `GET /x` and `POST /x` are apart.
    pub fn with_method(mut self) -> Self {
        self.method = true;
        self
    }
}

impl<B> KeyExtractor<B> for RouteKey {
    fn extract(&self, req: &Request<B>) -> Result<Option<Subject>, KeyError> {
        #[cfg(feature = "axum")]
        let path = req
            .extensions()
            .get::<axum::extract::MatchedPath>()
            .map(|m| m.as_str())
            .unwrap_or_else(|| req.uri().path());
        #[cfg(not(feature = "axum"))]
        let path = req.uri().path();
        Ok(Some(if self.method {
            Subject::compound([req.method().as_str(), path])
        } else {
            Subject::new(path)
        }))
    }
}

/// The first of two extractors that yields a key: `a`, or `b` when `a`
/// says "not limited". Errors of `a` are not masked.
///
/// ```
/// use http::Request;
/// use tollgate_core::Subject;
/// use tollgate_tower::key::{GlobalKey, HeaderKey, KeyExtractor, Or};
///
/// let key = Or::new(HeaderKey::new("x-tenant").plain().optional(), GlobalKey);
/// let req = Request::get("/").body(()).unwrap();
/// assert_eq!(key.extract(&req).unwrap(), Some(Subject::new("global")));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Or<A, B> {
    first: A,
    second: B,
}

impl<A, B> Or<A, B> {
    /// `first`, falling back to `second`.
    pub fn new(first: A, second: B) -> Self {
        Or { first, second }
    }

    /// Falls back further to `other`.
    pub fn or<O>(self, other: O) -> Or<Self, O> {
        Or::new(self, other)
    }
}

impl<Body, A, B> KeyExtractor<Body> for Or<A, B>
where
    A: KeyExtractor<Body>,
    B: KeyExtractor<Body>,
{
    fn extract(&self, req: &Request<Body>) -> Result<Option<Subject>, KeyError> {
        match self.first.extract(req)? {
            Some(s) => Ok(Some(s)),
            None => self.second.extract(req),
        }
    }
}

macro_rules! tuple_key {
    ($($name:ident),+) => {
        /// A compound key: all parts must yield a key (a part that says "not
        /// limited" makes the whole request not limited); the parts are
        /// combined with [`Subject::compound`], so no two splits collide.
        impl<Body, $($name),+> KeyExtractor<Body> for ($($name,)+)
        where
            $($name: KeyExtractor<Body>,)+
        {
            #[allow(non_snake_case)]
            fn extract(&self, req: &Request<Body>) -> Result<Option<Subject>, KeyError> {
                let ($($name,)+) = self;
                $(
                    let Some($name) = $name.extract(req)? else { return Ok(None) };
                )+
                Ok(Some(Subject::compound([$($name.as_encoded()),+])))
            }
        }
    };
}

tuple_key!(A, B);
tuple_key!(A, B, C);
tuple_key!(A, B, C, D);

#[cfg(test)]
mod tests {
    use super::*;

    fn req_from(peer: &str, headers: &[(&str, &str)]) -> Request<()> {
        let mut b = Request::get("/");
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        let mut req = b.body(()).unwrap();
        req.extensions_mut()
            .insert(peer.parse::<SocketAddr>().unwrap());
        req
    }

    fn key(k: &impl KeyExtractor<()>, req: &Request<()>) -> Subject {
        k.extract(req).unwrap().unwrap()
    }

    /// The key of a request that reached us through the trusted proxy
    /// 10.0.0.1 with one forwarding header line.
    fn via_proxy(k: &ClientIp, header: &str, value: &str) -> Subject {
        key(k, &req_from("10.0.0.1:1", &[(header, value)]))
    }

    #[test]
    fn cidr_parsing_and_matching() {
        let c: Cidr = "192.168.1.77/24".parse().unwrap();
        assert_eq!(c.to_string(), "192.168.1.0/24");
        assert!(c.contains("192.168.1.1".parse().unwrap()));
        assert!(!c.contains("192.168.2.1".parse().unwrap()));
        assert!(!c.contains("::1".parse().unwrap()));
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains("8.8.8.8".parse().unwrap()));
        let v6: Cidr = "2001:db8::/32".parse().unwrap();
        assert!(v6.contains("2001:db8:ffff::1".parse().unwrap()));
        assert!(!v6.contains("2001:db9::1".parse().unwrap()));
        let mapped: Cidr = "::ffff:10.0.0.0/104".parse().unwrap();
        assert_eq!(mapped.to_string(), "10.0.0.0/8");
        for bad in [
            "",
            "10.0.0.0/",
            "10.0.0.0/33",
            "::/129",
            "x/8",
            "10.0.0/8",
            "::ffff:1.2.3.4/90",
        ] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad}");
        }
    }

    #[test]
    fn node_parsing() {
        let p = |s: &str| parse_node(s.as_bytes());
        assert_eq!(p("1.2.3.4"), Some("1.2.3.4".parse().unwrap()));
        assert_eq!(p("1.2.3.4:80"), Some("1.2.3.4".parse().unwrap()));
        assert_eq!(p("2001:db8::1"), Some("2001:db8::1".parse().unwrap()));
        assert_eq!(p("[2001:db8::1]"), Some("2001:db8::1".parse().unwrap()));
        assert_eq!(p("[2001:db8::1]:443"), Some("2001:db8::1".parse().unwrap()));
        assert_eq!(p("::ffff:1.2.3.4"), Some("1.2.3.4".parse().unwrap()));
        assert_eq!(p("unknown"), None);
        assert_eq!(p("_hidden"), None);
        assert_eq!(p(""), None);
    }

    #[test]
    fn forwarded_header_parsing() {
        assert_eq!(
            forwarded_for(b"for=192.0.2.60;proto=http;by=203.0.113.43"),
            Some("192.0.2.60".parse().unwrap())
        );
        assert_eq!(
            forwarded_for(br#"proto=https; For="[2001:db8:cafe::17]:4711""#),
            Some("2001:db8:cafe::17".parse().unwrap())
        );
        assert_eq!(forwarded_for(b"for=unknown"), None);
        assert_eq!(forwarded_for(b"by=1.2.3.4"), None);
        let parts = split_forwarded(br#"for="[::1]:1,x", for=1.2.3.4 ,, "#);
        assert_eq!(parts, [&br#"for="[::1]:1,x""#[..], b"for=1.2.3.4"]);
        // Escaped quotes stay inside their string; an escaped backslash
        // does not escape the closing quote.
        let parts = split_forwarded(br#"a="x\",y", b="z\\", c=1"#);
        assert_eq!(parts, [&br#"a="x\",y""#[..], br#"b="z\\""#, b"c=1"]);
        // An unbalanced quote only swallows what is to its left.
        let parts = split_forwarded(br#"for=1.1.1.1, for="x, for=2.2.2.2, for=3.3.3.3"#);
        assert_eq!(
            parts,
            [
                &br#"for=1.1.1.1, for="x"#[..],
                b"for=2.2.2.2",
                b"for=3.3.3.3"
            ]
        );
        let parts: Vec<&[u8]> = split_commas(br#"", 1.2.3.4,, "5.6.7.8" "#).collect();
        assert_eq!(parts, [&b"\""[..], b"1.2.3.4", b"\"5.6.7.8\""]);
    }

    /// A client cannot move itself into a trusted proxy's bucket (or another
    /// client's) with an unbalanced quote: the proxies append to the same
    /// line, after what the client sent.
    #[test]
    fn client_ip_is_not_fooled_by_an_unbalanced_quote() {
        let k = ClientIp::trusted_proxies(["10.0.0.0/8"]).unwrap();
        // The client sent `X-Forwarded-For: "`; nginx, ALB and Envoy append
        // `, <client>` on the same line.
        assert_eq!(
            via_proxy(&k, "x-forwarded-for", "\", 203.0.113.9"),
            Subject::new("203.0.113.9")
        );
        assert_eq!(
            via_proxy(&k, "x-forwarded-for", "\"6.6.6.6, 203.0.113.9, 10.1.1.1"),
            Subject::new("203.0.113.9")
        );
        assert_eq!(
            via_proxy(&k, "x-forwarded-for", "6.6.6.6\", 203.0.113.9"),
            Subject::new("203.0.113.9")
        );

        let k = k.header(ForwardedHeader::Forwarded);
        assert_eq!(
            via_proxy(&k, "forwarded", r#"for="x, for=203.0.113.9"#),
            Subject::new("203.0.113.9")
        );
        assert_eq!(
            via_proxy(&k, "forwarded", r#"for=", for=203.0.113.9"#),
            Subject::new("203.0.113.9")
        );
        let req = req_from(
            "10.0.0.1:1",
            &[(
                "forwarded",
                r#"for="6.6.6.6, for=203.0.113.9;proto=https, for="[fd00::1]:80";by=x"#,
            )],
        );
        let k6 = ClientIp::trusted_proxies(["10.0.0.0/8", "fd00::/8"])
            .unwrap()
            .header(ForwardedHeader::Forwarded);
        assert_eq!(key(&k6, &req), Subject::new("203.0.113.9"));
        // A trailing backslash or a stray quote left of the appended
        // elements changes nothing either.
        assert_eq!(
            via_proxy(&k, "forwarded", r#"for=x\, for=203.0.113.9"#),
            Subject::new("203.0.113.9")
        );
        assert_eq!(
            via_proxy(&k, "forwarded", r#"x", for=203.0.113.9"#),
            Subject::new("203.0.113.9")
        );

        // X-Real-IP: the value the nearest proxy set is the last element.
        let k = k.header(ForwardedHeader::XRealIp);
        assert_eq!(
            via_proxy(&k, "x-real-ip", "\", 203.0.113.9"),
            Subject::new("203.0.113.9")
        );
    }

    /// Whatever garbage the client puts left of the first untrusted address
    /// the proxies recorded, the key is that address.
    #[test]
    fn garbage_left_of_the_client_never_changes_the_key() {
        let xff = ClientIp::trusted_proxies(["10.0.0.0/8"]).unwrap();
        let fwd = xff.clone().header(ForwardedHeader::Forwarded);
        for garbage in [
            "",
            "\"",
            "\"\"",
            "\\",
            "\\\"",
            "unknown",
            "for=",
            "for=\"",
            "for=\"[::1",
            ";",
            "=",
            "\"a,b",
            "a\"b,c\"",
            "1.2.3.4\"",
            "\"10.0.0.9",
            "_x",
            ",,,",
        ] {
            let req = req_from(
                "10.0.0.1:1",
                &[(
                    "x-forwarded-for",
                    format!("{garbage}, 203.0.113.9, 10.2.2.2").as_str(),
                )],
            );
            assert_eq!(key(&xff, &req), Subject::new("203.0.113.9"), "{garbage:?}");
            let req = req_from(
                "10.0.0.1:1",
                &[(
                    "forwarded",
                    format!("{garbage}, for=203.0.113.9, for=10.2.2.2").as_str(),
                )],
            );
            assert_eq!(key(&fwd, &req), Subject::new("203.0.113.9"), "{garbage:?}");
        }
    }

    #[test]
    fn client_ip_ignores_headers_from_untrusted_peers() {
        let k = ClientIp::trusted_proxies(["10.0.0.0/8"]).unwrap();
        let req = req_from("203.0.113.5:1", &[("x-forwarded-for", "1.1.1.1")]);
        assert_eq!(key(&k, &req), Subject::new("203.0.113.5"));
        let k = k.header(ForwardedHeader::Forwarded);
        let req = req_from("203.0.113.5:1", &[("forwarded", "for=1.1.1.1")]);
        assert_eq!(key(&k, &req), Subject::new("203.0.113.5"));
    }

    #[test]
    fn client_ip_walks_right_to_left_skipping_trusted_hops() {
        let k = ClientIp::trusted_proxies(["10.0.0.0/8"]).unwrap();
        // The client prepended a fake hop; the proxies appended the real one.
        assert_eq!(
            via_proxy(&k, "x-forwarded-for", "6.6.6.6, 198.51.100.4, 10.1.1.1"),
            Subject::new("198.51.100.4")
        );
        // Split over several header lines.
        let req = req_from(
            "10.0.0.1:1",
            &[
                ("x-forwarded-for", "6.6.6.6"),
                ("x-forwarded-for", "198.51.100.4, 10.2.2.2"),
            ],
        );
        assert_eq!(key(&k, &req), Subject::new("198.51.100.4"));
        // All trusted: the leftmost.
        assert_eq!(
            via_proxy(&k, "x-forwarded-for", "10.3.3.3, 10.1.1.1"),
            Subject::new("10.3.3.3")
        );
        // No header: the proxy itself.
        let req = req_from("10.0.0.1:1", &[]);
        assert_eq!(key(&k, &req), Subject::new("10.0.0.1"));
        // An unknown hop: keyed by the trusted proxy that reported it.
        assert_eq!(
            via_proxy(&k, "x-forwarded-for", "6.6.6.6, unknown, 10.1.1.1"),
            Subject::new("10.1.1.1")
        );
    }

    #[test]
    fn client_ip_reads_only_the_configured_header() {
        let k = ClientIp::trusted_proxies(["10.0.0.0/8"]).unwrap();
        // The proxy manages X-Forwarded-For; a client-sent Forwarded is ignored.
        let req = req_from(
            "10.0.0.1:1",
            &[
                ("forwarded", "for=6.6.6.6"),
                ("x-forwarded-for", "198.51.100.4"),
            ],
        );
        assert_eq!(key(&k, &req), Subject::new("198.51.100.4"));
        let k = k.header(ForwardedHeader::Forwarded);
        assert_eq!(
            via_proxy(
                &k,
                "forwarded",
                r#"for=6.6.6.6, for="[2001:db8::5]:99";proto=https"#
            ),
            Subject::new("2001:db8::/64")
        );
        let k = k.header(ForwardedHeader::XRealIp);
        assert_eq!(
            via_proxy(&k, "x-real-ip", "198.51.100.9"),
            Subject::new("198.51.100.9")
        );
        assert_eq!(
            via_proxy(&k, "x-real-ip", "garbage"),
            Subject::new("10.0.0.1")
        );
    }

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
        let req = Request::get("/").body(()).unwrap();
        let e = PeerIp::new().extract(&req).unwrap_err();
        assert_eq!(e.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert!(e.message().contains("connect_info"));
    }

    #[test]
    fn compound_keys() {
        let req = req_from("192.0.2.1:1", &[("x-user", "alice")]);
        let k = (HeaderKey::new("x-user").plain(), RouteKey::new());
        assert_eq!(
            key(&k, &req),
            Subject::compound([Subject::new("alice").as_encoded(), "/"])
        );
        let k3 = (GlobalKey, PeerIp::new(), RouteKey::new());
        assert_eq!(
            key(&k3, &req),
            Subject::compound(["global", "192.0.2.1", "/"])
        );
        // A part that is not limited makes the whole not limited.
        let k = (HeaderKey::new("x-missing").optional(), RouteKey::new());
        assert_eq!(k.extract(&req).unwrap(), None);
        // Errors propagate.
        let k = (HeaderKey::new("x-missing"), RouteKey::new());
        assert!(k.extract(&req).is_err());
    }

    /// Hashed header keys are stable across releases: they name counters
    /// on a shared backend.
    #[test]
    fn hashed_header_values_are_a_sha256_prefix() {
        assert_eq!(hash_hex(b"abc"), "h:ba7816bf8f01cfea414140de5dae2223");
        let req = req_from("192.0.2.1:1", &[("x-api-key", "abc")]);
        assert_eq!(
            key(&HeaderKey::new("x-api-key"), &req),
            Subject::new("h:ba7816bf8f01cfea414140de5dae2223")
        );
    }

    #[test]
    fn extension_key_missing_is_a_server_error_unless_optional() {
        let req = Request::get("/").body(()).unwrap();
        let k = ExtensionKey::<String>::new();
        assert_eq!(k.extract(&req).unwrap_err().status(), 500);
        assert_eq!(k.optional().extract(&req).unwrap(), None);
    }
}
