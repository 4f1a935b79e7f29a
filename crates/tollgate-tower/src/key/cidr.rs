//! [`Cidr`]: blocks of IP addresses, for trusted proxies.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use super::ip::{mask_v4, mask_v6};

/// A block of IP addresses, `10.0.0.0/8` or `2001:db8::/32`; a bare address
/// is a block of one.
///
/// ```
/// use tollgate::tower::key::Cidr;
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
/// use tollgate::tower::key::Cidr;
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
