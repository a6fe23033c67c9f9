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

mod caps;
mod error;
mod gid;
mod select;
mod sysfs;
#[cfg(test)]
mod tests;

pub use caps::{Caps, CAPS_SIZE, PSN_MASK};
pub use error::RdmaError;
pub use gid::{format_gid, gid_addr, parse_addr, parse_gid, target_gid, Gid, GID_SIZE};
pub use select::{resolve, RdmaEnv, Selection, DEV_VARS, GID_VARS, NO_RDMA_VARS};
pub use sysfs::{scan_sysfs, GidEntry, GidKind, PortInfo, SYSFS_ROOT};
