//! The GID tables of every local RDMA port, read from sysfs (or built from verbs queries).

use std::fs;
use std::path::Path;

use super::error::RdmaError;
use super::gid::{parse_gid, Gid, GID_SIZE};

/// Where the kernel publishes RDMA devices.
pub const SYSFS_ROOT: &str = "/sys/class/infiniband";

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
    pub(super) fn rank(&self) -> Option<u8> {
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
