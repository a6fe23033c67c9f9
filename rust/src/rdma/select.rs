//! The RDMA environment and the choice of device, port and GID index for one connection.

use std::net::IpAddr;

use super::error::RdmaError;
use super::gid::{format_gid, target_gid, Gid};
use super::sysfs::{GidEntry, GidKind, PortInfo};

/// Environment variables, most specific first: `RPCNET_*` overrides `GGML_*`.
pub const NO_RDMA_VARS: [&str; 2] = ["RPCNET_NO_RDMA", "GGML_RPC_NO_RDMA"];
pub const DEV_VARS: [&str; 2] = ["RPCNET_RDMA_DEV", "GGML_RDMA_DEV"];
pub const GID_VARS: [&str; 2] = ["RPCNET_RDMA_GID", "GGML_RDMA_GID"];

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
