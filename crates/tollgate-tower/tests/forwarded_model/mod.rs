//! What `prop_forwarded.rs` checks [`ClientIp`] with: the reference model of
//! the walk over the hops, the strategies that generate trusted blocks,
//! addresses, hops and garbage, and the rendering of hops into header lines
//! the way proxies write them.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use http::request::Parts;
use http::HeaderValue;
use proptest::prelude::*;
use tollgate_tower::key::{Cidr, ClientIp, ForwardedHeader};

// ---------------------------------------------------------------- model --

/// A trusted block, as the model sees it (its own containment test, not
/// [`Cidr::contains`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Net {
    pub(crate) addr: IpAddr,
    pub(crate) prefix: u8,
}

impl Net {
    pub(crate) fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip.to_canonical()) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let shift = 32 - u32::from(self.prefix);
                self.prefix == 0 || u32::from(n) >> shift == u32::from(a) >> shift
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let shift = 128 - u32::from(self.prefix);
                self.prefix == 0 || u128::from(n) >> shift == u128::from(a) >> shift
            }
            _ => false,
        }
    }

    pub(crate) fn cidr(&self) -> Cidr {
        Cidr::new(self.addr, self.prefix).unwrap()
    }
}

/// The reference: an untrusted peer is the client; otherwise walk the hops
/// right to left, skipping trusted ones; the first untrusted address is the
/// client; an unreadable hop stops the walk at the nearest trusted proxy.
pub(crate) fn model(trusted: &[Net], peer: IpAddr, hops: &[Option<IpAddr>]) -> IpAddr {
    let is_trusted = |ip: IpAddr| trusted.iter().any(|n| n.contains(ip));
    if !is_trusted(peer) {
        return peer.to_canonical();
    }
    let mut nearest = peer.to_canonical();
    for hop in hops.iter().rev() {
        match hop {
            Some(ip) if is_trusted(*ip) => nearest = ip.to_canonical(),
            Some(ip) => return ip.to_canonical(),
            None => return nearest,
        }
    }
    nearest
}

// ----------------------------------------------------------- strategies --

pub(crate) fn net() -> impl Strategy<Value = Net> {
    net_of_at_least(0)
}

/// A block of at least `min` prefix bits (of either family).
pub(crate) fn net_of_at_least(min: u8) -> impl Strategy<Value = Net> {
    (any::<bool>(), any::<u128>(), any::<u8>()).prop_map(move |(v4, bits, p)| {
        if v4 {
            let prefix = min + p % (33 - min);
            let addr = Ipv4Addr::from(mask(bits as u32 as u128, 32, prefix) as u32);
            Net {
                addr: IpAddr::V4(addr),
                prefix,
            }
        } else {
            let prefix = min + p % (129 - min);
            let mut addr = Ipv6Addr::from(mask(bits, 128, prefix));
            if addr.to_ipv4_mapped().is_some() {
                addr = Ipv6Addr::from(u128::from(addr) ^ (1 << 100));
            }
            Net {
                addr: IpAddr::V6(addr),
                prefix,
            }
        }
    })
}

fn mask(bits: u128, width: u32, prefix: u8) -> u128 {
    if prefix == 0 {
        0
    } else {
        let all = if width == 128 {
            u128::MAX
        } else {
            (1 << width) - 1
        };
        bits & (all << (width - u32::from(prefix))) & all
    }
}

/// An address: inside one of the trusted blocks (`within`), or anywhere;
/// IPv4 sometimes written as IPv4-mapped IPv6.
#[derive(Debug, Clone, Copy)]
pub(crate) struct IpSpec {
    pub(crate) family: u8,
    pub(crate) bits: u128,
    pub(crate) within: Option<u8>,
}

pub(crate) fn ip_spec() -> impl Strategy<Value = IpSpec> {
    (
        0u8..3,
        any::<u128>(),
        prop::option::weighted(0.6, any::<u8>()),
    )
        .prop_map(|(family, bits, within)| IpSpec {
            family,
            bits,
            within,
        })
}

/// `spec` moved (if need be) to an address outside every trusted block;
/// the blocks must leave room (at least /8 each, at most a few).
pub(crate) fn untrusted(mut spec: IpSpec, trusted: &[Net]) -> IpSpec {
    spec.within = None;
    // An odd step: the low 32 (IPv4) or all 128 bits cycle through every value.
    while trusted.iter().any(|n| n.contains(resolve(spec, trusted))) {
        spec.bits = spec
            .bits
            .wrapping_add(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835);
    }
    spec
}

pub(crate) fn resolve(spec: IpSpec, trusted: &[Net]) -> IpAddr {
    let ip = match spec.within.filter(|_| !trusted.is_empty()) {
        Some(k) => {
            let n = trusted[usize::from(k) % trusted.len()];
            match n.addr {
                IpAddr::V4(a) => {
                    let host = !mask(u128::MAX, 32, n.prefix) & u128::from(u32::MAX);
                    IpAddr::V4(Ipv4Addr::from(
                        (u128::from(u32::from(a)) | (spec.bits & host)) as u32,
                    ))
                }
                IpAddr::V6(a) => {
                    let host = !mask(u128::MAX, 128, n.prefix);
                    IpAddr::V6(Ipv6Addr::from(u128::from(a) | (spec.bits & host)))
                }
            }
        }
        None if spec.family == 1 => IpAddr::V6(Ipv6Addr::from(spec.bits)),
        None => IpAddr::V4(Ipv4Addr::from(spec.bits as u32)),
    };
    match ip {
        IpAddr::V4(v4) if spec.family == 2 => IpAddr::V6(v4.to_ipv6_mapped()),
        ip => ip,
    }
}

/// One hop a proxy recorded: an address in some notation, or a token that
/// is no address (`unknown`, an obfuscated RFC 7239 identifier).
#[derive(Debug, Clone)]
pub(crate) enum Hop {
    Ip { ip: IpSpec, style: u8, port: u16 },
    Opaque(String),
}

pub(crate) fn hop() -> impl Strategy<Value = Hop> {
    prop_oneof![
        4 => (ip_spec(), any::<u8>(), any::<u16>())
            .prop_map(|(ip, style, port)| Hop::Ip { ip, style, port }),
        1 => opaque().prop_map(Hop::Opaque),
    ]
}

/// Tokens no address parser accepts (letters past `f`, `_`).
fn opaque() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("unknown".to_owned()),
        prop::collection::vec(
            prop::sample::select(b"ghijklmnopqrstuvwxyz_".to_vec()),
            1..8
        )
        .prop_map(|v| String::from_utf8(v).unwrap()),
    ]
}

/// Printable text for quoted RFC 7239 values, rich in separators.
fn quoted_text() -> impl Strategy<Value = String> {
    let frag = prop_oneof![
        prop::sample::select(vec![
            ";",
            ",",
            "=",
            "for=",
            "for=6.6.6.6",
            ";for=6.6.6.6",
            ", for=6.6.6.6",
            "\"",
            "\\",
            " ",
            "[::1]",
            "by=",
            "a"
        ])
        .prop_map(str::to_owned),
        prop::collection::vec(0x20u8..0x7f, 0..4).prop_map(|v| String::from_utf8(v).unwrap()),
    ];
    prop::collection::vec(frag, 0..5).prop_map(|v| v.concat())
}

fn sf_quote(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

/// `ip` as an `X-Forwarded-For` element in one of its notations.
fn xff_node(ip: IpAddr, style: u8, port: u16) -> String {
    let text = match (ip, style % 4) {
        (IpAddr::V4(a), 1) => format!("{a}:{port}"),
        (IpAddr::V6(a), 1) => format!("[{a}]:{port}"),
        (IpAddr::V6(a), 2) => format!("[{a}]"),
        (ip, _) => ip.to_string(),
    };
    if style & 0x10 != 0 {
        format!("\"{text}\"")
    } else {
        text
    }
}

/// `ip` as an RFC 7239 node (IPv6 in brackets and quotes, as the RFC says).
fn forwarded_node(ip: IpAddr, style: u8, port: u16) -> String {
    match (ip, style % 3) {
        (IpAddr::V4(a), 0) => a.to_string(),
        (IpAddr::V4(a), 1) => format!("\"{a}\""),
        (IpAddr::V4(a), _) => format!("\"{a}:{port}\""),
        (IpAddr::V6(a), 0 | 1) => format!("\"[{a}]\""),
        (IpAddr::V6(a), _) => format!("\"[{a}]:{port}\""),
    }
}

/// The other parameters of one `Forwarded` element, in a random order.
#[derive(Debug, Clone)]
pub(crate) struct Extras {
    proto: bool,
    by: Option<IpSpec>,
    host: Option<String>,
    order: [u8; 4],
    for_name: u8,
    omit_for: bool,
}

pub(crate) fn extras() -> impl Strategy<Value = Extras> {
    (
        any::<bool>(),
        prop::option::of(ip_spec()),
        prop::option::of(quoted_text()),
        any::<[u8; 4]>(),
        0u8..3,
        prop::bool::weighted(0.2),
    )
        .prop_map(|(proto, by, host, order, for_name, omit_for)| Extras {
            proto,
            by,
            host,
            order,
            for_name,
            omit_for,
        })
}

/// Separators between elements.
pub(crate) const SEPS: [&str; 5] = [",", ", ", " , ", ",\t", ",  "];

/// Bytes that are valid in a header value, whatever `b` is.
fn visible(b: u8) -> u8 {
    match b {
        b'\t' => b,
        0..=0x1f => b + 0x20,
        0x7f => b'~',
        _ => b,
    }
}

/// Arbitrary header-value bytes, rich in what the parsers look at.
pub(crate) fn garbage() -> impl Strategy<Value = Vec<u8>> {
    let frag = prop_oneof![
        prop::sample::select(vec![
            "for=",
            "For=",
            "\"",
            ",",
            ", ",
            ";",
            "\\",
            "[",
            "]",
            ":",
            "=",
            " ",
            "\t",
            "unknown",
            "_h",
            "proto=https",
            "by=",
            "1.2.3.4",
            "10.0.0.1",
            "::1",
            "[2001:db8::1]:80",
            "::ffff:10.1.2.3",
            "203.0.113.9:443",
            "é",
            "%",
            "%25",
        ])
        .prop_map(|s| s.as_bytes().to_vec()),
        (ip_spec(), any::<u8>(), any::<u16>()).prop_map(|(ip, style, port)| xff_node(
            resolve(ip, &[]),
            style,
            port
        )
        .into_bytes()),
        prop::collection::vec(any::<u8>().prop_map(visible), 0..6),
    ];
    prop::collection::vec(frag, 0..12).prop_map(|v| v.concat())
}

pub(crate) fn header_kind() -> impl Strategy<Value = ForwardedHeader> {
    prop::sample::select(vec![
        ForwardedHeader::XForwardedFor,
        ForwardedHeader::Forwarded,
        ForwardedHeader::XRealIp,
    ])
}

pub(crate) fn header_name(h: ForwardedHeader) -> &'static str {
    match h {
        ForwardedHeader::XForwardedFor => "x-forwarded-for",
        ForwardedHeader::Forwarded => "forwarded",
        _ => "x-real-ip",
    }
}

// -------------------------------------------------------------- helpers --

pub(crate) fn request(peer: IpAddr, name: &'static str, lines: &[Vec<u8>]) -> Parts {
    let mut req = http::Request::get("/").body(()).unwrap();
    for line in lines {
        let value = HeaderValue::from_bytes(line).expect("generated bytes are a header value");
        req.headers_mut().append(name, value);
    }
    req.extensions_mut().insert(SocketAddr::new(peer, 40_000));
    req.into_parts().0
}

pub(crate) fn client_ip(trusted: &[Net], header: ForwardedHeader) -> ClientIp {
    ClientIp::new(trusted.iter().map(Net::cidr))
        .header(header)
        .ipv6_prefix(128)
}

/// Every address written anywhere in `lines`: each substring of a run of
/// address characters that parses, canonical.
pub(crate) fn written(lines: &[Vec<u8>]) -> Vec<IpAddr> {
    let is_addr_char = |b: &u8| b.is_ascii_hexdigit() || matches!(b, b':' | b'.');
    let mut out = Vec::new();
    for line in lines {
        for run in line.split(|b| !is_addr_char(b)) {
            for i in 0..run.len() {
                for j in i + 1..=run.len().min(i + 45) {
                    let text = std::str::from_utf8(&run[i..j]).unwrap();
                    if let Ok(ip) = text.parse::<IpAddr>() {
                        out.push(ip.to_canonical());
                    }
                }
            }
        }
    }
    out
}

/// Splits `elements` over one to three header lines, joined with `seps`.
pub(crate) fn lines_of(elements: &[String], seps: &[u8], cuts: &[u8]) -> Vec<Vec<u8>> {
    let mut lines = vec![String::new()];
    for (i, e) in elements.iter().enumerate() {
        let line = lines.last_mut().unwrap();
        if !line.is_empty() {
            line.push_str(SEPS[usize::from(seps[i % seps.len()]) % SEPS.len()]);
        }
        line.push_str(e);
        if i + 1 < elements.len() && lines.len() < 3 && cuts[i % cuts.len()].is_multiple_of(4) {
            lines.push(String::new());
        }
    }
    lines.into_iter().map(String::into_bytes).collect()
}

/// Hops rendered for `header`, with what each one means to the model.
pub(crate) fn render(
    header: ForwardedHeader,
    hops: &[(Hop, Extras)],
    trusted: &[Net],
) -> (Vec<String>, Vec<Option<IpAddr>>) {
    hops.iter()
        .map(|(hop, x)| match header {
            ForwardedHeader::Forwarded => forwarded_element(hop, x, trusted),
            _ => match hop {
                Hop::Ip { ip, style, port } => {
                    let ip = resolve(*ip, trusted);
                    (xff_node(ip, *style, *port), Some(ip))
                }
                Hop::Opaque(t) => (t.clone(), None),
            },
        })
        .unzip()
}

fn forwarded_element(hop: &Hop, x: &Extras, trusted: &[Net]) -> (String, Option<IpAddr>) {
    let (node, meaning) = match hop {
        Hop::Ip { ip, style, port } => {
            let ip = resolve(*ip, trusted);
            (Some(forwarded_node(ip, *style, *port)), Some(ip))
        }
        Hop::Opaque(_) if x.omit_for => (None, None),
        Hop::Opaque(t) if x.order[0].is_multiple_of(2) => (Some(sf_quote(t)), None),
        Hop::Opaque(t) => (Some(t.clone()), None),
    };
    let mut params: Vec<(u8, String)> = Vec::new();
    if let Some(node) = node {
        let name = ["for", "For", "FOR"][usize::from(x.for_name)];
        params.push((x.order[0], format!("{name}={node}")));
    }
    if x.proto {
        params.push((x.order[1], "proto=https".to_owned()));
    }
    if let Some(by) = x.by {
        params.push((
            x.order[2],
            format!("by={}", forwarded_node(resolve(by, trusted), 1, 80)),
        ));
    }
    if let Some(host) = &x.host {
        params.push((x.order[3], format!("host={}", sf_quote(host))));
    }
    if params.is_empty() {
        params.push((0, "proto=http".to_owned()));
    }
    params.sort_by_key(|(k, _)| *k);
    let element = params
        .into_iter()
        .map(|(_, p)| p)
        .collect::<Vec<_>>()
        .join(";");
    (element, meaning)
}
