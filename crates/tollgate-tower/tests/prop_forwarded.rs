//! Property tests of [`ClientIp`]: the `X-Forwarded-For`, `Forwarded` and
//! `X-Real-IP` parsers, trusted-proxy selection and [`Cidr`].
//!
//! - any bytes in any of the three headers, from any peer, never panic, and
//!   the chosen address is the peer or one written in the header;
//! - a peer outside the trusted set is always its own key;
//! - headers written the way proxies write them (ports, brackets, quotes,
//!   IPv4-mapped IPv6, `unknown` and obfuscated hops, RFC 7239 parameters in
//!   any order with quoted values, several lines) give exactly what a
//!   reference model gives: walk right to left, skip trusted hops, stop at
//!   the first untrusted address (or at an unreadable hop: the nearest
//!   trusted proxy);
//! - any bytes left of the client's element never change its key;
//! - `Cidr` displays and parses back to itself, and never panics.
//!
//! Case count: proptest's default (256), or `PROPTEST_CASES`.
//!
//! The model, the strategies and the rendering are in `forwarded_model/`.

mod forwarded_model;

use proptest::prelude::*;
use tollgate_core::Subject;
use tollgate_tower::key::{Cidr, ForwardedHeader, KeyExtractor};

use forwarded_model::{
    client_ip, extras, garbage, header_kind, header_name, hop, ip_spec, lines_of, model, net,
    net_of_at_least, render, request, resolve, untrusted, written, Extras, Hop, IpSpec, SEPS,
};

// ----------------------------------------------------------- properties --

proptest! {
    /// Any bytes, any header, any peer: no panic; an untrusted peer is its
    /// own key; otherwise the key is the peer or an address written in the
    /// header; `extract` agrees with `client_ip`.
    #[test]
    fn any_bytes_choose_the_peer_or_a_written_address(
        header in header_kind(),
        trusted in prop::collection::vec(net(), 0..4),
        peer in ip_spec(),
        lines in prop::collection::vec(garbage(), 0..3),
    ) {
        let peer = resolve(peer, &trusted);
        let key = client_ip(&trusted, header);
        let req = request(peer, header_name(header), &lines);
        let chosen = key.client_ip(&req, peer).to_canonical();
        if !trusted.iter().any(|n| n.contains(peer)) {
            prop_assert_eq!(chosen, peer.to_canonical());
        } else if chosen != peer.to_canonical() {
            prop_assert!(
                written(&lines).contains(&chosen),
                "{chosen} is neither the peer {peer} nor written in {:?}",
                lines.iter().map(|l| String::from_utf8_lossy(l)).collect::<Vec<_>>()
            );
        }
        prop_assert_eq!(key.extract(&req).unwrap(), Some(Subject::from(chosen)));
    }

    /// Headers as proxies write them: `ClientIp` gives what the reference
    /// model gives.
    #[test]
    fn the_walk_matches_the_reference_model(
        header in header_kind(),
        trusted in prop::collection::vec(net(), 0..4),
        peer in ip_spec(),
        hops in prop::collection::vec((hop(), extras()), 0..7),
        seps in prop::collection::vec(any::<u8>(), 1..4),
        cuts in prop::collection::vec(any::<u8>(), 1..4),
    ) {
        let peer = resolve(peer, &trusted);
        let (elements, meaning) = render(header, &hops, &trusted);
        let (lines, meaning) = match header {
            // Set, not appended: only the last element of the last line.
            ForwardedHeader::XRealIp => (
                elements.last().map(|e| vec![e.clone().into_bytes()]).unwrap_or_default(),
                meaning.last().copied().into_iter().collect::<Vec<_>>(),
            ),
            _ => (lines_of(&elements, &seps, &cuts), meaning),
        };
        let req = request(peer, header_name(header), &lines);
        let chosen = client_ip(&trusted, header).client_ip(&req, peer).to_canonical();
        prop_assert_eq!(
            chosen,
            model(&trusted, peer, &meaning),
            "{:?}",
            lines.iter().map(|l| String::from_utf8_lossy(l)).collect::<Vec<_>>()
        );
    }

    /// Whatever the client puts left of the first untrusted address the
    /// proxies recorded (on the same line or on lines of its own), the key
    /// is that address.
    #[test]
    fn garbage_left_of_the_client_never_changes_the_key(
        header in header_kind(),
        trusted in prop::collection::vec(net_of_at_least(8), 1..4),
        peer in 0u8..4,
        client in (ip_spec(), any::<u8>(), any::<u16>(), extras()),
        proxies in prop::collection::vec((ip_spec(), any::<u8>(), any::<u16>(), extras()), 0..3),
        left in garbage(),
        own_line in any::<bool>(),
        sep in 0..SEPS.len(),
    ) {
        let peer = resolve(IpSpec { family: 0, bits: u128::from(peer) * 7919, within: Some(peer) }, &trusted);
        let client_spec = untrusted(client.0, &trusted);
        let client_ip_addr = resolve(client_spec, &trusted);
        // The proxies' own hops are trusted.
        let mut recorded: Vec<(Hop, Extras)> = vec![(
            Hop::Ip { ip: client_spec, style: client.1, port: client.2 },
            client.3,
        )];
        for (ip, style, port, x) in proxies {
            let ip = IpSpec { within: Some(ip.within.unwrap_or(0)), ..ip };
            recorded.push((Hop::Ip { ip, style, port }, x));
        }
        let (elements, _) = render(header, &recorded, &trusted);
        let appended = elements.join(", ");
        let lines = if own_line {
            vec![left.clone(), appended.into_bytes()]
        } else {
            let mut line = left.clone();
            line.extend_from_slice(SEPS[sep].as_bytes());
            line.extend_from_slice(appended.as_bytes());
            vec![line]
        };
        let lines = match header {
            // X-Real-IP holds the client alone, after whatever came first.
            ForwardedHeader::XRealIp => {
                let (e, _) = render(header, &recorded[..1], &trusted);
                let mut line = left;
                line.extend_from_slice(SEPS[sep].as_bytes());
                line.extend_from_slice(e[0].as_bytes());
                vec![line]
            }
            _ => lines,
        };
        let req = request(peer, header_name(header), &lines);
        let k = client_ip(&trusted, header);
        prop_assert!(trusted.iter().any(|n| n.contains(peer)));
        prop_assert_eq!(
            k.client_ip(&req, peer).to_canonical(),
            client_ip_addr.to_canonical(),
            "{:?}",
            lines.iter().map(|l| String::from_utf8_lossy(l)).collect::<Vec<_>>()
        );
    }

    /// A block displays as `network/prefix` and parses back to itself;
    /// its network is in it; a prefix too long for the family is an error.
    #[test]
    fn cidr_round_trips(n in net(), extra in any::<u8>(), probe in ip_spec()) {
        let c = n.cidr();
        prop_assert_eq!(c.to_string().parse::<Cidr>(), Ok(c));
        prop_assert!(c.contains(n.addr));
        let probe = resolve(probe, &[n]);
        prop_assert_eq!(c.contains(probe), n.contains(probe));
        let max = if n.addr.is_ipv4() { 32 } else { 128 };
        prop_assert_eq!(Cidr::new(n.addr, extra).is_ok(), extra <= max);
    }

    /// `Cidr`'s parser never panics on any text.
    #[test]
    fn cidr_parser_never_panics(s in "\\PC{0,40}", bytes in garbage()) {
        let _ = s.parse::<Cidr>();
        let _ = String::from_utf8_lossy(&bytes).parse::<Cidr>();
    }
}
