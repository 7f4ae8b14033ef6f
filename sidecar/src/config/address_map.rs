//! Rewrites endpoint addresses from one IPv4 prefix to another, for local
//! clusters whose simulated pods cannot have the loopback addresses their
//! processes listen on (the API server refuses loopback addresses in
//! EndpointSlices). `REPRISE_ENDPOINT_ADDRESS_MAP=10.244.0.0/16=127.1.0.0/16`
//! sends traffic for 10.244.a.b to 127.1.a.b. Unset in real clusters.

use std::net::{IpAddr, Ipv4Addr};

use reprise_crds::Config;

/// One prefix-to-prefix rewrite.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AddressMap {
    from: u32,
    to: u32,
    mask: u32,
}

impl AddressMap {
    /// Parses `FROM/LEN=TO/LEN` (both prefixes of the same length).
    pub fn parse(spec: &str) -> Result<AddressMap, String> {
        let err = || {
            format!(
                "address map \"{spec}\": expected FROM/LEN=TO/LEN, e.g. 10.244.0.0/16=127.1.0.0/16"
            )
        };
        let (from, to) = spec.split_once('=').ok_or_else(err)?;
        let prefix = |s: &str| -> Result<(u32, u32), String> {
            let (ip, len) = s.split_once('/').ok_or_else(err)?;
            let ip: Ipv4Addr = ip.trim().parse().map_err(|_| err())?;
            let len: u32 = len.trim().parse().map_err(|_| err())?;
            if len > 32 {
                return Err(err());
            }
            Ok((u32::from(ip), len))
        };
        let ((from, a), (to, b)) = (prefix(from)?, prefix(to)?);
        if a != b {
            return Err(format!(
                "address map \"{spec}\": both prefixes must have the same length"
            ));
        }
        let mask = if a == 0 { 0 } else { u32::MAX << (32 - a) };
        Ok(AddressMap {
            from: from & mask,
            to: to & mask,
            mask,
        })
    }

    /// The address `ip` maps to (unchanged outside the prefix).
    pub fn map(&self, ip: IpAddr) -> IpAddr {
        match ip {
            IpAddr::V4(v4) if u32::from(v4) & self.mask == self.from => {
                IpAddr::V4(Ipv4Addr::from(self.to | (u32::from(v4) & !self.mask)))
            }
            other => other,
        }
    }

    /// Rewrites every endpoint of `config`.
    pub fn apply(&self, config: &mut Config) {
        for u in &mut config.upstreams {
            for e in &mut u.endpoints {
                e.addr.set_ip(self.map(e.addr.ip()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_inside_the_prefix_only() {
        let m = AddressMap::parse("10.244.0.0/16=127.1.0.0/16").expect("valid");
        assert_eq!(
            m.map("10.244.3.21".parse().expect("ip")),
            "127.1.3.21".parse::<IpAddr>().expect("ip")
        );
        assert_eq!(
            m.map("10.245.0.1".parse().expect("ip")),
            "10.245.0.1".parse::<IpAddr>().expect("ip")
        );
        assert!(AddressMap::parse("10.244.0.0/16=127.1.0.0/24").is_err());
        assert!(AddressMap::parse("nonsense").is_err());
    }
}
