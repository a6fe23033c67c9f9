//! RDMA (RoCE) support that needs no verbs library: the 24-byte HELLO `conn_caps` codec and the
//! choice of local device, port and GID index for a TCP connection (spec §2, §12).
//!
//! The GID tables are read from the kernel's sysfs tree
//! (`<root>/<dev>/ports/<port>/gids/<idx>`, `gid_attrs/types/<idx>`, `gid_attrs/ndevs/<idx>`,
//! `state`, `link_layer`); the root is a parameter so tests use fake trees. Where sysfs is not
//! available the Python side builds the same [`PortInfo`] values from pyverbs queries and calls
//! [`resolve`] on them. Environment lookups are injected ([`RdmaEnv::from_lookup`]).
//!
//! Selection rule (the reference's, spec §12, with the differences noted):
//! * `GGML_RPC_NO_RDMA` / `RPCNET_NO_RDMA` set (any value) ⇒ no RDMA.
//! * `GGML_RDMA_DEV` / `RPCNET_RDMA_DEV` ⇒ only that device.
//! * `GGML_RDMA_GID` / `RPCNET_RDMA_GID` ⇒ that index on the first device that has it.
//! * otherwise the GID equal to the socket's local address (IPv4 as `::ffff:a.b.c.d`), RoCE v2
//!   preferred over v1; devices in name order, the first device with a match wins.
//! * Differences: every port is considered (the reference looks at port 1 only; port 1 still
//!   comes first), ports whose `state` says they are not ACTIVE are skipped, and a non-numeric
//!   GID index is an error instead of index 0 (`atoi`).

use std::fmt;
use std::fs;
use std::net::IpAddr;
use std::path::Path;

/// Size of `conn_caps` in HELLO (request and response).
pub const CAPS_SIZE: usize = 24;
/// Size of a GID (RoCE and IB alike).
pub const GID_SIZE: usize = 16;
/// Where the kernel publishes RDMA devices.
pub const SYSFS_ROOT: &str = "/sys/class/infiniband";
/// The PSN advertised in caps is the QP number's low 24 bits.
pub const PSN_MASK: u32 = 0x00FF_FFFF;

/// Environment variables, most specific first: `RPCNET_*` overrides `GGML_*`.
pub const NO_RDMA_VARS: [&str; 2] = ["RPCNET_NO_RDMA", "GGML_RPC_NO_RDMA"];
pub const DEV_VARS: [&str; 2] = ["RPCNET_RDMA_DEV", "GGML_RDMA_DEV"];
pub const GID_VARS: [&str; 2] = ["RPCNET_RDMA_GID", "GGML_RDMA_GID"];

pub type Gid = [u8; GID_SIZE];

/// Why there is no RDMA (or why caps / environment values are unusable).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RdmaError {
    pub reason: String,
}

impl RdmaError {
    pub fn new(reason: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
        }
    }
}

impl fmt::Display for RdmaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

impl std::error::Error for RdmaError {}

// ------------------------------------------------------------------------------------------------
// conn_caps (Linux verbs layout)

/// Non-zero `conn_caps`: `qpn` u32 @0, `psn` u32 @4, `gid[16]` @8 (little-endian).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Caps {
    pub qpn: u32,
    pub psn: u32,
    pub gid: Gid,
}

impl Caps {
    /// Caps for a queue pair, with the reference's PSN rule (`qpn & 0xFFFFFF`).
    pub fn for_qp(qpn: u32, gid: Gid) -> Self {
        Self {
            qpn,
            psn: qpn & PSN_MASK,
            gid,
        }
    }

    pub fn encode(&self) -> [u8; CAPS_SIZE] {
        let mut out = [0u8; CAPS_SIZE];
        out[0..4].copy_from_slice(&self.qpn.to_le_bytes());
        out[4..8].copy_from_slice(&self.psn.to_le_bytes());
        out[8..24].copy_from_slice(&self.gid);
        out
    }

    /// `None` for the all-zero "no RDMA" caps; an error unless exactly 24 bytes.
    pub fn decode(bytes: &[u8]) -> Result<Option<Self>, RdmaError> {
        if bytes.len() != CAPS_SIZE {
            return Err(RdmaError::new(format!(
                "conn_caps must be {CAPS_SIZE} bytes, got {}",
                bytes.len()
            )));
        }
        if bytes.iter().all(|&b| b == 0) {
            return Ok(None);
        }
        let word = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
        let mut gid = [0u8; GID_SIZE];
        gid.copy_from_slice(&bytes[8..24]);
        Ok(Some(Self {
            qpn: word(0),
            psn: word(4),
            gid,
        }))
    }
}

// ------------------------------------------------------------------------------------------------
// GIDs and addresses

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

// ------------------------------------------------------------------------------------------------
// GID tables

/// RoCE version of a GID entry (sysfs `gid_attrs/types/<idx>`, or verbs' `gid_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GidKind {
    RoceV2,
    RoceV1,
    Ib,
    Unknown,
}

impl GidKind {
    /// Interpret sysfs text ("RoCE v2", "IB/RoCE v1") knowing the port's link layer: the
    /// kernel spells v1 "IB/RoCE v1" for both; on an InfiniBand port it is a plain IB GID.
    pub fn from_sysfs(text: &str, link_layer: Option<&str>) -> Self {
        let t = text.trim().to_ascii_lowercase();
        let ib_port = link_layer.is_some_and(|l| l.trim().eq_ignore_ascii_case("infiniband"));
        if t.contains("v2") {
            GidKind::RoceV2
        } else if t.contains("v1") || t == "ib" {
            if ib_port || t == "ib" {
                GidKind::Ib
            } else {
                GidKind::RoceV1
            }
        } else {
            GidKind::Unknown
        }
    }

    /// Accepts the labels below (case-insensitive) and the sysfs spellings.
    pub fn from_label(text: &str) -> Option<Self> {
        let t = text.trim().to_ascii_lowercase().replace(['-', '_'], " ");
        match t.as_str() {
            "roce v2" | "rocev2" | "v2" => Some(GidKind::RoceV2),
            "roce v1" | "rocev1" | "v1" | "ib/roce v1" => Some(GidKind::RoceV1),
            "ib" | "infiniband" => Some(GidKind::Ib),
            "unknown" | "" => Some(GidKind::Unknown),
            _ => None,
        }
    }

    pub fn label(&self) -> &'static str {
        match self {
            GidKind::RoceV2 => "RoCE v2",
            GidKind::RoceV1 => "RoCE v1",
            GidKind::Ib => "IB",
            GidKind::Unknown => "unknown",
        }
    }

    /// Preference among address matches: lower is better; `None` = never chosen automatically.
    fn rank(&self) -> Option<u8> {
        match self {
            GidKind::RoceV2 => Some(0),
            GidKind::RoceV1 => Some(1),
            GidKind::Unknown => Some(2),
            GidKind::Ib => None,
        }
    }
}

/// One non-empty GID table entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GidEntry {
    pub index: u32,
    pub gid: Gid,
    pub kind: GidKind,
    /// The network device the entry belongs to (`gid_attrs/ndevs/<idx>`), if known.
    pub ndev: Option<String>,
}

/// One port of one device with its non-empty GIDs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortInfo {
    pub device: String,
    pub port: u32,
    /// sysfs `state`, e.g. "4: ACTIVE"; `None` when unknown.
    pub state: Option<String>,
    /// "Ethernet" (RoCE) or "InfiniBand"; `None` when unknown.
    pub link_layer: Option<String>,
    pub gids: Vec<GidEntry>,
}

impl PortInfo {
    /// `Some(false)` only when the state is known and is not ACTIVE.
    pub fn is_active(&self) -> Option<bool> {
        let state = self.state.as_deref()?.trim();
        let name = state.rsplit(':').next().unwrap_or(state).trim();
        let code = state
            .split(':')
            .next()
            .and_then(|c| c.trim().parse::<u32>().ok());
        Some(name.eq_ignore_ascii_case("active") || code == Some(4))
    }

    pub fn gid(&self, index: u32) -> Option<&GidEntry> {
        self.gids.iter().find(|g| g.index == index)
    }
}

fn read_trimmed(path: &Path) -> Option<String> {
    fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}

/// Numeric entries of a directory, sorted (`gids/0..N`, `ports/1..N`).
fn numeric_entries(dir: &Path) -> Vec<u32> {
    let mut out: Vec<u32> = match fs::read_dir(dir) {
        Ok(rd) => rd
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect(),
        Err(_) => Vec::new(),
    };
    out.sort_unstable();
    out
}

/// Read every device's ports and non-empty GIDs under `root` (normally [`SYSFS_ROOT`]).
///
/// Devices come in name order, ports and GIDs in numeric order. Unreadable or malformed
/// entries are skipped (the kernel refuses to read the type of an empty slot, for example);
/// only a missing or unreadable root is an error.
pub fn scan_sysfs(root: &Path) -> Result<Vec<PortInfo>, RdmaError> {
    let entries = fs::read_dir(root).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            RdmaError::new(format!(
                "{} does not exist (no RDMA driver loaded)",
                root.display()
            ))
        } else {
            RdmaError::new(format!("cannot read {}: {e}", root.display()))
        }
    })?;
    let mut devices: Vec<String> = entries
        .filter_map(|e| e.ok()?.file_name().to_str().map(str::to_string))
        .collect();
    devices.sort();
    let mut ports = Vec::new();
    for device in devices {
        let dev_dir = root.join(&device);
        for port in numeric_entries(&dev_dir.join("ports")) {
            let port_dir = dev_dir.join("ports").join(port.to_string());
            let state = read_trimmed(&port_dir.join("state"));
            let link_layer = read_trimmed(&port_dir.join("link_layer"));
            let mut gids = Vec::new();
            for index in numeric_entries(&port_dir.join("gids")) {
                let name = index.to_string();
                let Some(gid) =
                    read_trimmed(&port_dir.join("gids").join(&name)).and_then(|t| parse_gid(&t))
                else {
                    continue;
                };
                if gid == [0u8; GID_SIZE] {
                    continue; // empty slot
                }
                let attrs = port_dir.join("gid_attrs");
                let kind = read_trimmed(&attrs.join("types").join(&name))
                    .map(|t| GidKind::from_sysfs(&t, link_layer.as_deref()))
                    .unwrap_or(GidKind::Unknown);
                let ndev = read_trimmed(&attrs.join("ndevs").join(&name)).filter(|s| !s.is_empty());
                gids.push(GidEntry {
                    index,
                    gid,
                    kind,
                    ndev,
                });
            }
            ports.push(PortInfo {
                device: device.clone(),
                port,
                state,
                link_layer,
                gids,
            });
        }
    }
    Ok(ports)
}

// ------------------------------------------------------------------------------------------------
// environment

/// The RDMA-related environment, already parsed. Each value remembers the variable it came from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RdmaEnv {
    /// The variable that disables RDMA, when one is set.
    pub disabled_by: Option<String>,
    /// (variable, device name)
    pub device: Option<(String, String)>,
    /// (variable, GID index)
    pub gid_index: Option<(String, u32)>,
}

impl RdmaEnv {
    /// Build from any lookup (`std::env::var` in production, a map in tests).
    ///
    /// `*_NO_RDMA` counts when set at all (as in the reference). Empty device / index values are
    /// ignored; a negative index means "automatic" (the reference's `atoi` gives -1 for it); a
    /// non-numeric index is an error.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, RdmaError> {
        let first = |names: &[&str]| {
            names
                .iter()
                .find_map(|n| lookup(n).map(|v| (n.to_string(), v.trim().to_string())))
        };
        let disabled_by = first(&NO_RDMA_VARS).map(|(n, _)| n);
        let device = first(&DEV_VARS).filter(|(_, v)| !v.is_empty());
        let gid_index = match first(&GID_VARS).filter(|(_, v)| !v.is_empty()) {
            None => None,
            Some((name, value)) => match value.parse::<i64>() {
                Ok(i) if i < 0 => None,
                Ok(i) if i <= u32::MAX as i64 => Some((name, i as u32)),
                _ => {
                    return Err(RdmaError::new(format!(
                        "{name}={value:?} is not a GID index"
                    )))
                }
            },
        };
        Ok(Self {
            disabled_by,
            device,
            gid_index,
        })
    }

    pub fn from_process() -> Result<Self, RdmaError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }
}

// ------------------------------------------------------------------------------------------------
// selection

/// The local end an RDMA queue pair for one connection would use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    pub device: String,
    pub port: u32,
    pub gid_index: u32,
    pub gid: Gid,
    pub kind: GidKind,
    pub ndev: Option<String>,
    /// The local address the choice was made for, in GID form.
    pub target: Gid,
    /// How it was chosen, for logs ("GID matching local address 10.0.0.1", "GGML_RDMA_GID=3").
    pub how: String,
}

fn device_names<'a>(ports: impl IntoIterator<Item = &'a PortInfo>) -> String {
    let mut names: Vec<&str> = ports.into_iter().map(|p| p.device.as_str()).collect();
    names.dedup();
    if names.is_empty() {
        "none".to_string()
    } else {
        names.join(", ")
    }
}

fn select(port: &PortInfo, entry: &GidEntry, target: Gid, how: String) -> Selection {
    Selection {
        device: port.device.clone(),
        port: port.port,
        gid_index: entry.index,
        gid: entry.gid,
        kind: entry.kind,
        ndev: entry.ndev.clone(),
        target,
        how,
    }
}

/// Choose the device, port and GID index for a connection whose local address is `local`.
/// The error says plainly why there is none.
pub fn resolve(ports: &[PortInfo], local: IpAddr, env: &RdmaEnv) -> Result<Selection, RdmaError> {
    if let Some(var) = &env.disabled_by {
        return Err(RdmaError::new(format!("RDMA disabled: {var} is set")));
    }
    if ports.is_empty() {
        return Err(RdmaError::new("no RDMA devices"));
    }
    let target = target_gid(local);
    let candidates: Vec<&PortInfo> = match &env.device {
        Some((var, name)) => {
            let c: Vec<&PortInfo> = ports.iter().filter(|p| &p.device == name).collect();
            if c.is_empty() {
                return Err(RdmaError::new(format!(
                    "{var}={name}: no such RDMA device (have: {})",
                    device_names(ports)
                )));
            }
            c
        }
        None => ports.iter().collect(),
    };
    let usable = |p: &PortInfo| p.is_active() != Some(false);

    if let Some((var, index)) = &env.gid_index {
        for port in candidates.iter().copied().filter(|p| usable(p)) {
            if let Some(entry) = port.gid(*index) {
                let relation = if entry.gid == target {
                    "matches".to_string()
                } else {
                    format!("does not match local address {local}")
                };
                let how = format!("{var}={index} ({}, {relation})", entry.kind.label());
                return Ok(select(port, entry, target, how));
            }
        }
        return Err(RdmaError::new(format!(
            "{var}={index}: no active port of {} has a GID at index {index}",
            device_names(candidates.iter().copied())
        )));
    }

    let mut inactive_match: Option<String> = None;
    let mut devices: Vec<&str> = candidates.iter().map(|p| p.device.as_str()).collect();
    devices.dedup();
    for device in devices {
        let mut best: Option<(u8, &PortInfo, &GidEntry)> = None;
        for port in candidates.iter().filter(|p| p.device == device) {
            for entry in port.gids.iter().filter(|g| g.gid == target) {
                let Some(rank) = entry.kind.rank() else {
                    continue;
                };
                if !usable(port) {
                    inactive_match.get_or_insert_with(|| {
                        format!(
                            "{} port {} GID {} matches but the port is {}",
                            port.device,
                            port.port,
                            entry.index,
                            port.state.as_deref().unwrap_or("down")
                        )
                    });
                    continue;
                }
                if best.is_none_or(|(r, _, _)| rank < r) {
                    best = Some((rank, port, entry));
                }
            }
        }
        if let Some((_, port, entry)) = best {
            let how = format!(
                "GID matching local address {local} ({})",
                entry.kind.label()
            );
            return Ok(select(port, entry, target, how));
        }
    }
    let mut reason = format!(
        "no RDMA GID matches local address {local} ({}) on {}",
        format_gid(&target),
        device_names(candidates.iter().copied())
    );
    if let Some(extra) = inactive_match {
        reason.push_str("; ");
        reason.push_str(&extra);
    }
    Err(RdmaError::new(reason))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A throw-away directory tree, removed on drop.
    struct FakeSysfs {
        root: PathBuf,
    }

    static COUNTER: AtomicUsize = AtomicUsize::new(0);

    impl FakeSysfs {
        fn new() -> Self {
            let root = std::env::temp_dir().join(format!(
                "rpcnet-sysfs-{}-{}",
                std::process::id(),
                COUNTER.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = fs::remove_dir_all(&root);
            fs::create_dir_all(&root).unwrap();
            Self { root }
        }

        fn write(&self, rel: &str, text: &str) {
            let path = self.root.join(rel);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, format!("{text}\n")).unwrap();
        }

        fn port(&self, dev: &str, port: u32, state: &str, link: &str) {
            self.write(&format!("{dev}/ports/{port}/state"), state);
            self.write(&format!("{dev}/ports/{port}/link_layer"), link);
            fs::create_dir_all(self.root.join(format!("{dev}/ports/{port}/gids"))).unwrap();
        }

        fn gid(&self, dev: &str, port: u32, idx: u32, addr: &str, kind: Option<&str>, ndev: &str) {
            let gid = match addr.parse::<IpAddr>() {
                Ok(a) => target_gid(a),
                Err(_) => parse_gid(addr).unwrap(),
            };
            let base = format!("{dev}/ports/{port}");
            self.write(&format!("{base}/gids/{idx}"), &format_gid(&gid));
            if let Some(kind) = kind {
                self.write(&format!("{base}/gid_attrs/types/{idx}"), kind);
            }
            self.write(&format!("{base}/gid_attrs/ndevs/{idx}"), ndev);
        }

        fn scan(&self) -> Vec<PortInfo> {
            scan_sysfs(&self.root).unwrap()
        }
    }

    impl Drop for FakeSysfs {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.root);
        }
    }

    fn env(pairs: &[(&str, &str)]) -> RdmaEnv {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        RdmaEnv::from_lookup(|k| map.get(k).cloned()).unwrap()
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    /// Two RoCE NICs and one IB HCA, typical of a mlx5 host: every address appears once as
    /// RoCE v1 and once as RoCE v2, plus the link-local fe80 GIDs.
    fn typical() -> FakeSysfs {
        let fs = FakeSysfs::new();
        fs.port("mlx5_0", 1, "4: ACTIVE", "Ethernet");
        fs.gid(
            "mlx5_0",
            1,
            0,
            "fe80::a288:c2ff:fe00:1",
            Some("IB/RoCE v1"),
            "eth0",
        );
        fs.gid(
            "mlx5_0",
            1,
            1,
            "fe80::a288:c2ff:fe00:1",
            Some("RoCE v2"),
            "eth0",
        );
        fs.gid("mlx5_0", 1, 2, "10.0.0.1", Some("IB/RoCE v1"), "eth0");
        fs.gid("mlx5_0", 1, 3, "10.0.0.1", Some("RoCE v2"), "eth0");
        fs.gid(
            "mlx5_0",
            1,
            4,
            "0000:0000:0000:0000:0000:0000:0000:0000",
            None,
            "",
        );
        fs.gid("mlx5_0", 1, 5, "fd00::1", Some("IB/RoCE v1"), "eth0");
        fs.gid("mlx5_0", 1, 6, "fd00::1", Some("RoCE v2"), "eth0");
        fs.port("mlx5_1", 1, "4: ACTIVE", "Ethernet");
        fs.gid("mlx5_1", 1, 0, "10.0.1.1", Some("IB/RoCE v1"), "eth1");
        fs.gid("mlx5_1", 1, 1, "10.0.1.1", Some("RoCE v2"), "eth1");
        fs.gid("mlx5_1", 1, 2, "192.168.7.1", Some("IB/RoCE v1"), "eth1");
        fs.port("ibp1s0", 1, "4: ACTIVE", "InfiniBand");
        fs.gid("ibp1s0", 1, 0, "fe80::1", Some("IB/RoCE v1"), "");
        fs
    }

    #[test]
    fn caps_roundtrip_and_psn_rule() {
        let gid = target_gid(ip("10.0.0.2"));
        let caps = Caps::for_qp(0x0123_4567, gid);
        assert_eq!(caps.psn, 0x23_4567);
        let bytes = caps.encode();
        assert_eq!(&bytes[0..4], &[0x67, 0x45, 0x23, 0x01]);
        assert_eq!(&bytes[4..8], &[0x67, 0x45, 0x23, 0x00]);
        assert_eq!(&bytes[18..24], &[0xff, 0xff, 10, 0, 0, 2]);
        assert_eq!(Caps::decode(&bytes).unwrap(), Some(caps));
        assert_eq!(Caps::decode(&[0u8; 24]).unwrap(), None);
        assert!(Caps::decode(&[1u8; 23]).is_err());
        assert!(Caps::decode(&[1u8; 25]).is_err());
    }

    #[test]
    fn gid_text_forms() {
        let g = target_gid(ip("10.0.0.1"));
        assert_eq!(format_gid(&g), "0000:0000:0000:0000:0000:ffff:0a00:0001");
        assert_eq!(parse_gid(&format_gid(&g)), Some(g));
        assert_eq!(parse_gid("::ffff:10.0.0.1"), Some(g));
        assert_eq!(
            parse_gid("FE80:0000:0000:0000:0202:C9FF:FE00:0001").unwrap()[0],
            0xfe
        );
        assert_eq!(parse_gid("nonsense"), None);
        assert_eq!(parse_gid("1:2:3"), None);
        assert_eq!(gid_addr(&g), ip("10.0.0.1"));
        assert_eq!(target_gid(ip("::ffff:10.0.0.1")), g);
        assert_eq!(parse_addr("[fe80::1%eth0]").unwrap(), ip("fe80::1"));
        assert!(parse_addr("host.example").is_err());
    }

    #[test]
    fn gid_kinds() {
        assert_eq!(
            GidKind::from_sysfs("RoCE v2", Some("Ethernet")),
            GidKind::RoceV2
        );
        assert_eq!(
            GidKind::from_sysfs("IB/RoCE v1", Some("Ethernet")),
            GidKind::RoceV1
        );
        assert_eq!(
            GidKind::from_sysfs("IB/RoCE v1", Some("InfiniBand")),
            GidKind::Ib
        );
        assert_eq!(GidKind::from_sysfs("IB/RoCE v1", None), GidKind::RoceV1);
        assert_eq!(GidKind::from_sysfs("???", None), GidKind::Unknown);
        for k in [
            GidKind::RoceV2,
            GidKind::RoceV1,
            GidKind::Ib,
            GidKind::Unknown,
        ] {
            assert_eq!(GidKind::from_label(k.label()), Some(k));
        }
        assert_eq!(GidKind::from_label("IB/RoCE v1"), Some(GidKind::RoceV1));
        assert_eq!(GidKind::from_label("carrier pigeon"), None);
    }

    #[test]
    fn scan_reads_the_tree() {
        let fs = typical();
        let ports = fs.scan();
        let names: Vec<(&str, u32)> = ports.iter().map(|p| (p.device.as_str(), p.port)).collect();
        assert_eq!(names, vec![("ibp1s0", 1), ("mlx5_0", 1), ("mlx5_1", 1)]);
        let mlx0 = &ports[1];
        assert_eq!(mlx0.gids.len(), 6, "the empty slot 4 is skipped");
        assert_eq!(mlx0.gid(3).unwrap().kind, GidKind::RoceV2);
        assert_eq!(mlx0.gid(2).unwrap().kind, GidKind::RoceV1);
        assert_eq!(mlx0.gid(3).unwrap().ndev.as_deref(), Some("eth0"));
        assert_eq!(mlx0.is_active(), Some(true));
        assert_eq!(ports[0].gid(0).unwrap().kind, GidKind::Ib);
        assert_eq!(ports[0].gid(0).unwrap().ndev, None);
    }

    #[test]
    fn scan_of_missing_root_says_why() {
        let err = scan_sysfs(Path::new("/nonexistent/rpcnet/infiniband")).unwrap_err();
        assert!(err.reason.contains("does not exist"), "{err}");
        let fs = FakeSysfs::new();
        assert!(fs.scan().is_empty());
    }

    #[test]
    fn ipv4_prefers_roce_v2() {
        let fs = typical();
        let sel = resolve(&fs.scan(), ip("10.0.0.1"), &RdmaEnv::default()).unwrap();
        assert_eq!(
            (sel.device.as_str(), sel.port, sel.gid_index),
            ("mlx5_0", 1, 3)
        );
        assert_eq!(sel.kind, GidKind::RoceV2);
        assert_eq!(sel.ndev.as_deref(), Some("eth0"));
        assert!(
            sel.how.contains("10.0.0.1") && sel.how.contains("RoCE v2"),
            "{}",
            sel.how
        );
        // second NIC
        let sel = resolve(&fs.scan(), ip("10.0.1.1"), &RdmaEnv::default()).unwrap();
        assert_eq!((sel.device.as_str(), sel.gid_index), ("mlx5_1", 1));
    }

    #[test]
    fn ipv4_falls_back_to_roce_v1() {
        let fs = typical();
        let sel = resolve(&fs.scan(), ip("192.168.7.1"), &RdmaEnv::default()).unwrap();
        assert_eq!((sel.device.as_str(), sel.gid_index), ("mlx5_1", 2));
        assert_eq!(sel.kind, GidKind::RoceV1);
    }

    #[test]
    fn ipv6_matches_as_is() {
        let fs = typical();
        let sel = resolve(&fs.scan(), ip("fd00::1"), &RdmaEnv::default()).unwrap();
        assert_eq!((sel.device.as_str(), sel.gid_index), ("mlx5_0", 6));
        // an IPv4-mapped IPv6 socket address is the IPv4 GID
        let sel = resolve(&fs.scan(), ip("::ffff:10.0.0.1"), &RdmaEnv::default()).unwrap();
        assert_eq!(sel.gid_index, 3);
    }

    #[test]
    fn no_match_says_why() {
        let fs = typical();
        let err = resolve(&fs.scan(), ip("127.0.0.1"), &RdmaEnv::default()).unwrap_err();
        assert!(err.reason.contains("127.0.0.1"), "{err}");
        assert!(err.reason.contains("mlx5_0, mlx5_1"), "{err}");
        let err = resolve(&[], ip("10.0.0.1"), &RdmaEnv::default()).unwrap_err();
        assert_eq!(err.reason, "no RDMA devices");
    }

    #[test]
    fn ib_gids_are_not_address_matches() {
        let fs = FakeSysfs::new();
        fs.port("ib0dev", 1, "4: ACTIVE", "InfiniBand");
        fs.gid("ib0dev", 1, 0, "10.9.9.9", Some("IB/RoCE v1"), "");
        assert!(resolve(&fs.scan(), ip("10.9.9.9"), &RdmaEnv::default()).is_err());
    }

    #[test]
    fn first_device_with_a_match_wins_and_later_ports_count() {
        let fs = FakeSysfs::new();
        fs.port("a_dev", 1, "4: ACTIVE", "Ethernet");
        fs.port("a_dev", 2, "4: ACTIVE", "Ethernet");
        fs.gid("a_dev", 2, 7, "10.1.1.1", Some("IB/RoCE v1"), "p2");
        fs.port("b_dev", 1, "4: ACTIVE", "Ethernet");
        fs.gid("b_dev", 1, 1, "10.1.1.1", Some("RoCE v2"), "q1");
        let sel = resolve(&fs.scan(), ip("10.1.1.1"), &RdmaEnv::default()).unwrap();
        assert_eq!(
            (sel.device.as_str(), sel.port, sel.gid_index),
            ("a_dev", 2, 7)
        );
        assert_eq!(
            sel.kind,
            GidKind::RoceV1,
            "device order beats RoCE version across devices"
        );
        // within a device, v2 on a later port beats v1 on port 1
        fs.gid("a_dev", 1, 0, "10.1.1.1", Some("IB/RoCE v1"), "p1");
        fs.gid("a_dev", 2, 8, "10.1.1.1", Some("RoCE v2"), "p2");
        let sel = resolve(&fs.scan(), ip("10.1.1.1"), &RdmaEnv::default()).unwrap();
        assert_eq!((sel.port, sel.gid_index), (2, 8));
    }

    #[test]
    fn inactive_ports_are_skipped_and_reported() {
        let fs = FakeSysfs::new();
        fs.port("mlx5_0", 1, "1: DOWN", "Ethernet");
        fs.gid("mlx5_0", 1, 3, "10.0.0.1", Some("RoCE v2"), "eth0");
        let err = resolve(&fs.scan(), ip("10.0.0.1"), &RdmaEnv::default()).unwrap_err();
        assert!(err.reason.contains("1: DOWN"), "{err}");
        fs.port("mlx5_1", 1, "4: ACTIVE", "Ethernet");
        fs.gid("mlx5_1", 1, 3, "10.0.0.1", Some("IB/RoCE v1"), "eth0");
        let sel = resolve(&fs.scan(), ip("10.0.0.1"), &RdmaEnv::default()).unwrap();
        assert_eq!(sel.device, "mlx5_1");
    }

    #[test]
    fn unknown_state_and_type_still_usable() {
        let fs = FakeSysfs::new();
        fs.write(
            "rxe0/ports/1/gids/0",
            "0000:0000:0000:0000:0000:ffff:0a00:0005",
        );
        let sel = resolve(&fs.scan(), ip("10.0.0.5"), &RdmaEnv::default()).unwrap();
        assert_eq!((sel.device.as_str(), sel.kind), ("rxe0", GidKind::Unknown));
    }

    #[test]
    fn env_device_filter() {
        let fs = typical();
        let e = env(&[("GGML_RDMA_DEV", "mlx5_1")]);
        let err = resolve(&fs.scan(), ip("10.0.0.1"), &e).unwrap_err();
        assert!(err.reason.contains("on mlx5_1"), "{err}");
        let e = env(&[("GGML_RDMA_DEV", "mlx5_9")]);
        let err = resolve(&fs.scan(), ip("10.0.0.1"), &e).unwrap_err();
        assert!(
            err.reason
                .starts_with("GGML_RDMA_DEV=mlx5_9: no such RDMA device"),
            "{err}"
        );
        assert!(err.reason.contains("have: ibp1s0, mlx5_0, mlx5_1"), "{err}");
        // RPCNET_ overrides GGML_
        let e = env(&[("GGML_RDMA_DEV", "mlx5_9"), ("RPCNET_RDMA_DEV", "mlx5_0")]);
        assert_eq!(
            resolve(&fs.scan(), ip("10.0.0.1"), &e).unwrap().device,
            "mlx5_0"
        );
    }

    #[test]
    fn env_explicit_gid_index() {
        let fs = typical();
        let e = env(&[("GGML_RDMA_DEV", "mlx5_0"), ("GGML_RDMA_GID", "2")]);
        let sel = resolve(&fs.scan(), ip("10.0.0.1"), &e).unwrap();
        assert_eq!(
            (sel.device.as_str(), sel.gid_index, sel.kind),
            ("mlx5_0", 2, GidKind::RoceV1)
        );
        assert!(sel.how.starts_with("GGML_RDMA_GID=2"), "{}", sel.how);
        assert!(sel.how.contains("matches"), "{}", sel.how);
        // an index that does not carry the local address is still honoured, and said so
        let e = env(&[("RPCNET_RDMA_GID", "1"), ("GGML_RDMA_DEV", "mlx5_1")]);
        let sel = resolve(&fs.scan(), ip("10.0.0.1"), &e).unwrap();
        assert_eq!((sel.device.as_str(), sel.gid_index), ("mlx5_1", 1));
        assert!(
            sel.how.contains("does not match local address 10.0.0.1"),
            "{}",
            sel.how
        );
        // the first device (name order) with that index wins without a device filter
        let e = env(&[("GGML_RDMA_GID", "0")]);
        assert_eq!(
            resolve(&fs.scan(), ip("10.0.0.1"), &e).unwrap().device,
            "ibp1s0"
        );
        let e = env(&[("GGML_RDMA_GID", "99")]);
        let err = resolve(&fs.scan(), ip("10.0.0.1"), &e).unwrap_err();
        assert!(err.reason.contains("no active port"), "{err}");
        // negative means automatic, like the reference's atoi(-1)
        let e = env(&[("GGML_RDMA_GID", "-1")]);
        assert_eq!(
            resolve(&fs.scan(), ip("10.0.0.1"), &e).unwrap().gid_index,
            3
        );
    }

    #[test]
    fn env_parsing() {
        let bad = RdmaEnv::from_lookup(|k| (k == "GGML_RDMA_GID").then(|| "three".to_string()));
        assert!(bad.unwrap_err().reason.contains("GGML_RDMA_GID=\"three\""));
        assert_eq!(env(&[]), RdmaEnv::default());
        assert_eq!(
            env(&[("GGML_RDMA_DEV", ""), ("GGML_RDMA_GID", " ")]),
            RdmaEnv::default()
        );
        let e = env(&[("GGML_RPC_NO_RDMA", "")]);
        assert_eq!(e.disabled_by.as_deref(), Some("GGML_RPC_NO_RDMA"));
        let e = env(&[("GGML_RPC_NO_RDMA", "1"), ("RPCNET_NO_RDMA", "1")]);
        assert_eq!(e.disabled_by.as_deref(), Some("RPCNET_NO_RDMA"));
    }

    #[test]
    fn env_disable_wins() {
        let fs = typical();
        for var in ["GGML_RPC_NO_RDMA", "RPCNET_NO_RDMA"] {
            let e = env(&[(var, "1"), ("GGML_RDMA_GID", "3")]);
            let err = resolve(&fs.scan(), ip("10.0.0.1"), &e).unwrap_err();
            assert_eq!(err.reason, format!("RDMA disabled: {var} is set"));
        }
    }
}
