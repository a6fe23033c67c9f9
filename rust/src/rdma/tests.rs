//! The RDMA codec and selection against fake sysfs trees and environments.

use super::*;
use std::collections::HashMap;
use std::fs;
use std::net::IpAddr;
use std::path::Path;
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
