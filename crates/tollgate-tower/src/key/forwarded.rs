//! [`ClientIp`]: the client behind trusted proxies, from `X-Forwarded-For`,
//! `Forwarded` or `X-Real-IP`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use http::request::Parts;
use tollgate_core::Subject;

use super::cidr::{Cidr, InvalidCidr};
use super::ip::{grouping_setters, peer_addr, IpGrouping, NO_PEER};
use super::{KeyError, KeyExtractor};

/// Which header a trusted proxy records the client address in.
///
/// Exactly one is read: a proxy that appends to one header passes the
/// others through from the client untouched, so reading a header the proxy
/// does not manage would let clients choose their own key.
///
/// ```
/// use tollgate::tower::key::{ClientIp, ForwardedHeader};
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
/// use tollgate::Subject;
/// use tollgate::tower::key::{ClientIp, KeyExtractor};
///
/// let key = ClientIp::trusted_proxies(["10.0.0.0/8", "fd00::/8"]).unwrap();
///
/// // Through the load balancer 10.0.0.2: the header is believed.
/// let mut req = Request::get("/")
///     .header("x-forwarded-for", "203.0.113.9, 10.0.0.7")
///     .body(())
///     .unwrap()
///     .into_parts()
///     .0;
/// req.extensions.insert("10.0.0.2:1234".parse::<SocketAddr>().unwrap());
/// assert_eq!(key.extract(&req).unwrap(), Some(Subject::new("203.0.113.9")));
///
/// // Straight from the internet: the header is ignored.
/// let mut req = Request::get("/")
///     .header("x-forwarded-for", "1.2.3.4")
///     .body(())
///     .unwrap()
///     .into_parts()
///     .0;
/// req.extensions.insert("198.51.100.1:1234".parse::<SocketAddr>().unwrap());
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

    grouping_setters!();

    fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|c| c.contains(ip))
    }

    /// The client address of a request that came from `peer`.
    pub fn client_ip(&self, req: &Parts, peer: IpAddr) -> IpAddr {
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
    fn hops(&self, req: &Parts) -> Vec<Option<IpAddr>> {
        let headers = &req.headers;
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

impl KeyExtractor for ClientIp {
    fn extract(&self, req: &Parts) -> Result<Option<Subject>, KeyError> {
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
    split_pairs(element)
        .filter_map(|pair| {
            let eq = pair.iter().position(|&b| b == b'=')?;
            let (name, value) = (pair[..eq].trim_ascii(), &pair[eq + 1..]);
            name.eq_ignore_ascii_case(b"for").then_some(value)
        })
        .next()
        .and_then(|v| parse_node(trim_quotes(v)))
}

/// The `name=value` pairs of one RFC 7239 element, split on `;` outside
/// quoted strings (with `\` escapes). A proxy copies some values from the
/// request (`host` is the client's `Host`), quoted: a `;for=…` inside one
/// is part of that value, not a parameter of its own.
fn split_pairs(element: &[u8]) -> impl Iterator<Item = &[u8]> {
    let (mut quoted, mut escape) = (false, false);
    element.split(move |&b| {
        if escape {
            escape = false;
            return false;
        }
        match b {
            b'\\' if quoted => escape = true,
            b'"' => quoted = !quoted,
            b';' => return !quoted,
            _ => {}
        }
        false
    })
}

/// An address, possibly with a port, plain or obfuscated (RFC 7239's
/// `_`-prefixed `obfport`): `1.2.3.4`, `1.2.3.4:80`, `1.2.3.4:_p1`,
/// `2001:db8::1`, `[2001:db8::1]`, `[2001:db8::1]:80`. Anything else
/// (`unknown`, `_hidden`) is `None`.
fn parse_node(node: &[u8]) -> Option<IpAddr> {
    let s = std::str::from_utf8(node).ok()?.trim();
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(ip.to_canonical());
    }
    if let Ok(sa) = s.parse::<SocketAddr>() {
        return Some(sa.ip().to_canonical());
    }
    if let Some((host, port)) = s.split_once(':') {
        if is_obfport(port) {
            if let Ok(v4) = host.parse::<Ipv4Addr>() {
                return Some(IpAddr::V4(v4));
            }
        }
    }
    let inner = s.strip_prefix('[')?;
    let end = inner.find(']')?;
    inner[..end]
        .parse::<Ipv6Addr>()
        .ok()
        .map(|ip| IpAddr::V6(ip).to_canonical())
}

/// RFC 7239's `obfport`: `_` then letters, digits, `.`, `_` or `-`.
fn is_obfport(port: &str) -> bool {
    port.strip_prefix('_').is_some_and(|rest| {
        !rest.is_empty()
            && rest
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::*;

    fn via_proxy(k: &ClientIp, header: &str, value: &str) -> Subject {
        key(k, &req_from("10.0.0.1:1", &[(header, value)]))
    }

    #[test]
    fn node_parsing() {
        let p = |s: &str| parse_node(s.as_bytes());
        assert_eq!(p("1.2.3.4"), Some("1.2.3.4".parse().unwrap()));
        assert_eq!(p("1.2.3.4:80"), Some("1.2.3.4".parse().unwrap()));
        assert_eq!(p("2001:db8::1"), Some("2001:db8::1".parse().unwrap()));
        assert_eq!(p("[2001:db8::1]"), Some("2001:db8::1".parse().unwrap()));
        assert_eq!(p("[2001:db8::1]:443"), Some("2001:db8::1".parse().unwrap()));
        // An obfuscated port hides the port, not the address: either family.
        assert_eq!(p("1.2.3.4:_p1"), Some("1.2.3.4".parse().unwrap()));
        assert_eq!(p("[2001:db8::1]:_p1"), Some("2001:db8::1".parse().unwrap()));
        assert_eq!(p("1.2.3.4:_"), None);
        assert_eq!(p("1.2.3.4:_a b"), None);
        assert_eq!(p("_hidden:_p1"), None);
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

    /// A proxy that obfuscates ports (RFC 7239 `obfport`) still names the
    /// client: it is keyed by its address, not the proxy's.
    #[test]
    fn an_obfuscated_port_keeps_the_client() {
        let k = ClientIp::trusted_proxies(["10.0.0.0/8"])
            .unwrap()
            .header(ForwardedHeader::Forwarded);
        assert_eq!(
            via_proxy(&k, "forwarded", r#"for="203.0.113.9:_p1""#),
            Subject::new("203.0.113.9")
        );
        assert_eq!(
            via_proxy(&k, "forwarded", r#"for="[2001:db8::9]:_p1""#),
            via_proxy(&k, "forwarded", r#"for="[2001:db8::9]""#),
        );
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

    /// A quoted parameter value the proxy copied from the request (`host`
    /// is the client's `Host` header) cannot smuggle a `for=` in: `;`
    /// inside a quoted string does not end the parameter.
    #[test]
    fn a_quoted_parameter_cannot_smuggle_a_for() {
        assert_eq!(
            forwarded_for(br#"host="a;for=6.6.6.6;b=";for=203.0.113.9"#),
            Some("203.0.113.9".parse().unwrap())
        );
        assert_eq!(
            forwarded_for(br#"host="x\";for=6.6.6.6;y=\"";for=203.0.113.9"#),
            Some("203.0.113.9".parse().unwrap())
        );
        assert_eq!(
            forwarded_for(br#"host=";for=6.6.6.6";For="[2001:db8::1]:80";proto=https"#),
            Some("2001:db8::1".parse().unwrap())
        );
        let k = ClientIp::trusted_proxies(["10.0.0.0/8"])
            .unwrap()
            .header(ForwardedHeader::Forwarded);
        assert_eq!(
            via_proxy(
                &k,
                "forwarded",
                r#"host="a;for=6.6.6.6;b=";for=203.0.113.9;proto=https"#
            ),
            Subject::new("203.0.113.9")
        );
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
}
