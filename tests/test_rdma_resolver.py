"""RoCE GID selection (rust/src/rdma.rs through rpcnet._native) on fake sysfs trees, the
pyverbs-query fallback (with a stand-in pyverbs module), and `rpcnet caps --local`."""

from __future__ import annotations

import ipaddress
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from rpcnet import _native
from rpcnet.cli import main
from rpcnet.transport.caps import decode_caps
from rpcnet.transport.rdma import verbs


class Sysfs:
    """A fake /sys/class/infiniband tree under tmp_path."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(exist_ok=True)

    def _write(self, rel: str, text: str) -> None:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")

    def port(self, dev, port=1, state="4: ACTIVE", link="Ethernet"):
        self._write(f"{dev}/ports/{port}/state", state)
        self._write(f"{dev}/ports/{port}/link_layer", link)
        (self.root / dev / "ports" / str(port) / "gids").mkdir(parents=True, exist_ok=True)
        return self

    def gid(self, dev, idx, addr, kind="RoCE v2", ndev="eth0", port=1):
        packed = ipaddress.ip_address(addr)
        if packed.version == 4:
            packed = ipaddress.IPv6Address("::ffff:" + addr)
        raw = packed.packed
        text = ":".join(raw[i : i + 2].hex() for i in range(0, 16, 2))
        base = f"{dev}/ports/{port}"
        self._write(f"{base}/gids/{idx}", text)
        if kind is not None:
            self._write(f"{base}/gid_attrs/types/{idx}", kind)
        self._write(f"{base}/gid_attrs/ndevs/{idx}", ndev)
        return self

    def scan(self):
        return _native.rdma_scan(str(self.root))


@pytest.fixture
def host(tmp_path) -> Sysfs:
    """Two RoCE NICs (dual-stack, v1 + v2 entries each), an empty slot, and an IB HCA."""
    fs = Sysfs(tmp_path / "infiniband")
    fs.port("mlx5_0")
    fs.gid("mlx5_0", 0, "fe80::a288:c2ff:fe00:1", "IB/RoCE v1")
    fs.gid("mlx5_0", 1, "fe80::a288:c2ff:fe00:1")
    fs.gid("mlx5_0", 2, "192.168.50.10", "IB/RoCE v1")
    fs.gid("mlx5_0", 3, "192.168.50.10")
    fs.gid("mlx5_0", 4, "::", None, "")
    fs.gid("mlx5_0", 5, "2001:db8::10", "IB/RoCE v1")
    fs.gid("mlx5_0", 6, "2001:db8::10")
    fs.port("mlx5_1")
    fs.gid("mlx5_1", 0, "10.20.0.5", "IB/RoCE v1", "eth1")
    fs.gid("mlx5_1", 1, "10.20.0.5", "RoCE v2", "eth1")
    fs.gid("mlx5_1", 2, "10.30.0.5", "IB/RoCE v1", "eth1")
    fs.port("ibp65s0", link="InfiniBand")
    fs.gid("ibp65s0", 0, "fe80::1", "IB/RoCE v1", "")
    return fs


def resolve(ports, addr, environ=None):
    return _native.rdma_resolve(ports, addr, _native.rdma_env(environ or {}))


def test_scan_lists_devices_ports_and_gids(host):
    ports = host.scan()
    assert [(p.device, p.port) for p in ports] == [("ibp65s0", 1), ("mlx5_0", 1), ("mlx5_1", 1)]
    mlx0 = ports[1]
    assert [g.index for g in mlx0.gids] == [0, 1, 2, 3, 5, 6]  # the empty slot 4 is skipped
    assert [g.kind for g in mlx0.gids] == ["RoCE v1", "RoCE v2"] * 3
    assert mlx0.gids[3].address == "192.168.50.10"
    assert mlx0.gids[3].gid_text == "0000:0000:0000:0000:0000:ffff:c0a8:320a"
    assert mlx0.active is True and mlx0.link_layer == "Ethernet" and mlx0.state == "4: ACTIVE"
    assert ports[0].gids[0].kind == "IB" and ports[0].gids[0].ndev is None


def test_missing_sysfs_says_why(tmp_path):
    with pytest.raises(_native.RdmaError, match="does not exist") as exc:
        _native.rdma_scan(str(tmp_path / "nothing"))
    assert "no RDMA driver" in exc.value.reason


@pytest.mark.parametrize(
    "addr, device, index, kind",
    [
        ("192.168.50.10", "mlx5_0", 3, "RoCE v2"),  # IPv4 as ::ffff:a.b.c.d, v2 preferred
        ("::ffff:192.168.50.10", "mlx5_0", 3, "RoCE v2"),  # an IPv4-mapped socket address
        ("2001:db8::10", "mlx5_0", 6, "RoCE v2"),  # IPv6 as is
        ("10.20.0.5", "mlx5_1", 1, "RoCE v2"),  # second device
        ("10.30.0.5", "mlx5_1", 2, "RoCE v1"),  # only v1 there
    ],
)
def test_address_selection(host, addr, device, index, kind):
    sel = resolve(host.scan(), addr)
    assert (sel.device, sel.port, sel.gid_index, sel.kind) == (device, 1, index, kind)
    assert sel.target == _native.rdma_target_gid(addr)
    assert sel.gid == sel.target


def test_no_match_and_no_devices_say_why(host):
    with pytest.raises(_native.RdmaError) as exc:
        resolve(host.scan(), "127.0.0.1")
    assert exc.value.reason == (
        "no RDMA GID matches local address 127.0.0.1 "
        "(0000:0000:0000:0000:0000:ffff:7f00:0001) on ibp65s0, mlx5_0, mlx5_1"
    )
    with pytest.raises(_native.RdmaError, match="^no RDMA devices$"):
        resolve([], "10.0.0.1")


def test_down_port_is_skipped(tmp_path):
    fs = Sysfs(tmp_path / "ib").port("mlx5_0", state="1: DOWN").gid("mlx5_0", 3, "10.0.0.1")
    with pytest.raises(_native.RdmaError, match="the port is 1: DOWN"):
        resolve(fs.scan(), "10.0.0.1")


@pytest.mark.parametrize("prefix", ["GGML_", "RPCNET_"])
def test_env_device_and_gid(host, prefix):
    dev_var = f"{prefix}RDMA_DEV"
    gid_var = f"{prefix}RDMA_GID"
    sel = resolve(host.scan(), "192.168.50.10", {dev_var: "mlx5_0", gid_var: "2"})
    assert (sel.device, sel.gid_index, sel.kind) == ("mlx5_0", 2, "RoCE v1")
    assert sel.how == f"{gid_var}=2 (RoCE v1, matches)"
    with pytest.raises(_native.RdmaError, match=f"^{dev_var}=mlx5_7: no such RDMA device"):
        resolve(host.scan(), "192.168.50.10", {dev_var: "mlx5_7"})
    with pytest.raises(_native.RdmaError, match="on mlx5_1$"):
        resolve(host.scan(), "192.168.50.10", {dev_var: "mlx5_1"})


def test_env_disable_and_precedence(host):
    for var in ("GGML_RPC_NO_RDMA", "RPCNET_NO_RDMA"):
        with pytest.raises(_native.RdmaError, match=f"RDMA disabled: {var} is set"):
            resolve(host.scan(), "192.168.50.10", {var: ""})
    env = _native.rdma_env({"GGML_RDMA_DEV": "mlx5_9", "RPCNET_RDMA_DEV": "mlx5_1"})
    assert (env.device, env.device_var) == ("mlx5_1", "RPCNET_RDMA_DEV")
    with pytest.raises(_native.RdmaError, match='GGML_RDMA_GID="x" is not a GID index'):
        _native.rdma_env({"GGML_RDMA_GID": "x"})
    assert _native.rdma_env({"GGML_RDMA_GID": "-1"}).gid_index is None


def test_env_defaults_to_os_environ(host, monkeypatch):
    monkeypatch.setenv("GGML_RDMA_DEV", "mlx5_1")
    monkeypatch.delenv("RPCNET_RDMA_DEV", raising=False)
    assert _native.rdma_env().device == "mlx5_1"
    with pytest.raises(_native.RdmaError, match="on mlx5_1"):
        _native.rdma_resolve(host.scan(), "192.168.50.10")


def test_caps_codec():
    caps = _native.rdma_encode_caps(0xABCDEF12, _native.rdma_target_gid("10.0.0.2"))
    assert caps[:8] == bytes.fromhex("12efcdab12efcd00")  # qpn, psn = qpn & 0xFFFFFF (LE)
    assert decode_caps(caps).gid_text == "::ffff:a00:2 (10.0.0.2)"
    assert _native.rdma_decode_caps(bytes(24)) is None
    with pytest.raises(ValueError, match="24 bytes"):
        decode_caps(bytes(23))
    with pytest.raises(ValueError):
        _native.rdma_encode_caps(1, b"short")


# ------------------------------------------------------------------ pyverbs fallback (stand-in)


def fake_pyverbs():
    """Just the calls pyverbs_ports makes, shaped like pyverbs' objects."""

    def gid_text(addr):
        raw = ipaddress.IPv6Address(addr).packed
        return ":".join(raw[i : i + 2].hex() for i in range(0, 16, 2))

    table = {
        0: ("fe80::1", 1),
        1: ("::ffff:10.0.0.9", 1),
        2: ("::ffff:10.0.0.9", 2),
        3: ("::", 0),
    }

    class Context:
        def __init__(self, name):
            self.name = name

        def query_device(self):
            return SimpleNamespace(phys_port_cnt=1)

        def query_port(self, port):
            return SimpleNamespace(gid_tbl_len=len(table), state=4, link_layer=2)

        def query_gid(self, port, idx):
            return SimpleNamespace(gid=gid_text(table[idx][0]))

        def query_gid_ex(self, port, idx):
            return SimpleNamespace(gid_type=table[idx][1], ndev_ifindex=0)

        def close(self):
            pass

    class Error(Exception):
        pass

    device = SimpleNamespace(
        get_device_list=lambda: [SimpleNamespace(name=b"rocep1s0")], Context=Context
    )
    return SimpleNamespace(device=device, Error=Error)


def test_pyverbs_queries_give_the_same_ports():
    ports = verbs.pyverbs_ports(fake_pyverbs())
    [port] = ports
    assert (port.device, port.port, port.state, port.link_layer) == (
        "rocep1s0",
        1,
        "4: ACTIVE",
        "Ethernet",
    )
    kinds = [(g.index, g.kind) for g in port.gids]
    assert kinds == [(0, "RoCE v1"), (1, "RoCE v1"), (2, "RoCE v2")]
    sel = resolve(ports, "10.0.0.9")
    assert (sel.device, sel.gid_index, sel.kind) == ("rocep1s0", 2, "RoCE v2")


def test_local_ports_falls_back_to_pyverbs_without_sysfs(monkeypatch):
    def no_sysfs(root=None):
        raise _native.RdmaError("/sys/class/infiniband does not exist (no RDMA driver loaded)")

    monkeypatch.setattr(_native, "rdma_scan", no_sysfs)
    monkeypatch.setattr(verbs, "_PYVERBS", fake_pyverbs())
    ports, source = verbs.local_ports()
    assert source == "pyverbs queries" and ports[0].device == "rocep1s0"
    monkeypatch.setattr(verbs, "_PYVERBS", None)
    monkeypatch.setitem(sys.modules, "pyverbs", None)
    with pytest.raises(verbs.RdmaUnavailable) as exc:
        verbs.local_ports()
    assert str(exc.value) == (
        "/sys/class/infiniband does not exist (no RDMA driver loaded); " + verbs.PYVERBS_MISSING
    )


# ------------------------------------------------------------------ rpcnet caps --local


def test_caps_local_lists_gids_and_the_choice(tmp_path, capsys, monkeypatch):
    for var in ("GGML_RDMA_DEV", "GGML_RDMA_GID", "GGML_RPC_NO_RDMA", "RPCNET_NO_RDMA"):
        monkeypatch.delenv(var, raising=False)
    fs = Sysfs(tmp_path / "ib").port("rxe0", link="Ethernet")
    fs.gid("rxe0", 0, "127.0.0.1", "IB/RoCE v1", "lo").gid("rxe0", 1, "127.0.0.1", "RoCE v2", "lo")
    assert main(["caps", "--local", "--sysfs", str(fs.root), "--to", "127.0.0.1"]) == 0
    out = capsys.readouterr().out
    assert f"RDMA devices    read from {fs.root}" in out
    assert "  rxe0 port 1  4: ACTIVE  Ethernet" in out
    assert "RoCE v2  lo   <= used for 127.0.0.1" in out
    assert (
        "connection to   127.0.0.1: local address 127.0.0.1 -> rxe0 port 1 GID 1 (RoCE v2): "
        "GID matching local address 127.0.0.1 (RoCE v2)" in out
    )
    monkeypatch.setenv("GGML_RPC_NO_RDMA", "1")
    assert main(["caps", "--local", "--sysfs", str(fs.root), "--to", "127.0.0.1", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["no_rdma"] == "RDMA disabled: GGML_RPC_NO_RDMA is set"
    assert info["environment"] == {"GGML_RPC_NO_RDMA": "set"}
    assert [g["kind"] for g in info["ports"][0]["gids"]] == ["RoCE v1", "RoCE v2"]


def test_caps_local_without_devices(tmp_path, capsys):
    assert main(["caps", "--local", "--sysfs", str(tmp_path / "none")]) == 0
    out = capsys.readouterr().out
    assert "RDMA devices    none: " in out and "does not exist" in out
    assert "give --to ADDR" in out
    assert main(["caps", "--local", "--sysfs", str(tmp_path / "none"), "--to", "127.0.0.1"]) == 0
    assert "connection to   127.0.0.1: no RDMA: " in capsys.readouterr().out


def test_caps_needs_an_endpoint_or_local(capsys):
    assert main(["caps"]) == 2
    assert "HOST:PORT, or --local" in capsys.readouterr().err
