//! GIDs and the addresses they stand for, in sysfs and user spellings.

use std::net::IpAddr;

use super::error::RdmaError;

/// Size of a GID (RoCE and IB alike).
pub const GID_SIZE: usize = 16;

pub type Gid = [u8; GID_SIZE];

/// The GID a local address appears as in a RoCE GID table: IPv4 as `::ffff:a.b.c.d`, IPv6 as is.
pub fn target_gid(addr: IpAddr) -> Gid {
    match addr {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// Parse an address as written by users or `getsockname` (an IPv6 scope `%eth0` is dropped).
pub fn parse_addr(text: &str) -> Result<IpAddr, RdmaError> {
    let bare = text.trim().trim_start_matches('[').trim_end_matches(']');
    let bare = bare.split('%').next().unwrap_or(bare);
    bare.parse()
        .map_err(|_| RdmaError::new(format!("not an IP address: {text:?}")))
}

/// The address a GID stands for, if it is an IPv4-mapped or global/link-local IPv6 GID.
pub fn gid_addr(gid: &Gid) -> IpAddr {
    let v6 = std::net::Ipv6Addr::from(*gid);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

/// sysfs spelling: eight groups of four lowercase hex digits.
pub fn format_gid(gid: &Gid) -> String {
    gid.chunks(2)
        .map(|p| format!("{:02x}{:02x}", p[0], p[1]))
        .collect::<Vec<_>>()
        .join(":")
}

/// Parse a GID in sysfs spelling (`fe80:0000:...`, 8 groups) or any IPv6 text form.
pub fn parse_gid(text: &str) -> Option<Gid> {
    let text = text.trim();
    let groups: Vec<&str> = text.split(':').collect();
    if groups.len() == 8 && groups.iter().all(|g| !g.is_empty() && g.len() <= 4) {
        let mut out = [0u8; GID_SIZE];
        for (i, g) in groups.iter().enumerate() {
            let v = u16::from_str_radix(g, 16).ok()?;
            out[2 * i..2 * i + 2].copy_from_slice(&v.to_be_bytes());
        }
        return Some(out);
    }
    text.parse::<std::net::Ipv6Addr>().ok().map(|a| a.octets())
}
