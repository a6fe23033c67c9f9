"""The kernel table: explicit module list, priorities that do not depend on import order."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from rpcnet.compute import kernels
from rpcnet.compute.kernels import kernel_table
from rpcnet.compute.ops import Op
from rpcnet.compute.tensor import Tensor

KERNELS_DIR = Path(kernels.__file__).parent
FAKE_OP = 10_000  # no ggml op has this id


def _registers_kernels(path: Path) -> bool:
    """The module declares an op family or registers kernels by decorator."""
    tree = ast.parse(path.read_text())
    declares = any(
        isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "FAMILY" for t in node.targets)
        for node in tree.body
    )
    return declares or any(
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "kernel"
        for node in ast.walk(tree)
    )


def test_every_module_with_kernels_is_listed():
    with_kernels = {
        p.stem
        for p in KERNELS_DIR.glob("*.py")
        if p.stem not in ("kernel_table", "native_args") and _registers_kernels(p)
    }
    assert with_kernels == set(kernels.KERNEL_MODULES)


def test_every_op_has_distinct_priorities_and_native_first():
    rows = kernel_table.table("cpu")
    assert rows, "no kernel registered"
    by_op: dict[int, list[kernel_table.Kernel]] = {}
    for k in rows:
        by_op.setdefault(k.op, []).append(k)
    for op, ks in by_op.items():
        assert len({k.priority for k in ks}) == len(ks), op
    mul_mat = kernel_table._KERNELS[(Op.MUL_MAT, "cpu")]
    assert [k.name for k in mul_mat] == ["mul_mat_hadamard", "mul_mat_native", "mul_mat"]
    assert [k.priority for k in mul_mat] == [
        kernel_table.HINT,
        kernel_table.NATIVE,
        kernel_table.GENERIC,
    ]


def _node() -> Tensor:
    return Tensor(0, 0, (1, 1, 1, 1), (4, 4, 4, 4), FAKE_OP, b"", 0, "n", None, 0)


def _builder(name: str) -> kernel_table.Builder:
    def build(node: Tensor) -> kernel_table.Step:
        return lambda: None

    build.__name__ = name
    return build


@pytest.fixture
def fake_op():
    yield FAKE_OP
    kernel_table._KERNELS.pop((FAKE_OP, "cpu"), None)


@pytest.mark.parametrize("native_first", [True, False])
def test_priority_not_registration_order_decides(fake_op, native_first):
    def register(name: str, priority: int) -> None:
        kernel_table.kernel(fake_op, name, lambda n: True, priority=priority)(_builder(name))

    order = [("fast", kernel_table.NATIVE), ("generic", kernel_table.GENERIC)]
    for name, priority in order if native_first else order[::-1]:
        register(name, priority)
    assert kernel_table.select(_node()).name == "fast"


def test_fast_path_that_declines_falls_back(fake_op):
    kernel_table.kernel(fake_op, "fast", lambda n: False, priority=kernel_table.NATIVE)(
        _builder("fast")
    )
    kernel_table.kernel(fake_op, "generic", lambda n: True)(_builder("generic"))
    assert kernel_table.select(_node()).name == "generic"


def test_same_priority_twice_is_refused(fake_op):
    kernel_table.kernel(fake_op, "a", lambda n: True)(_builder("a"))
    with pytest.raises(ValueError, match="priority 0 is taken by a"):
        kernel_table.kernel(fake_op, "b", lambda n: True)(_builder("b"))


def test_each_family_names_the_cuda_modules_of_its_ops():
    """A family's `cuda` lists exactly the modules whose builders serve its ops on cuda."""
    for family in kernel_table.FAMILIES.values():
        serving = {
            k.build.__module__
            for op in family.ops
            for k in kernel_table._KERNELS.get((op, "cuda"), ())
        }
        assert serving == set(family.cuda), family.name


def test_each_cpu_op_is_declared_by_one_family():
    owners: dict[int, list[str]] = {}
    for family in kernel_table.FAMILIES.values():
        for op in family.ops:
            owners.setdefault(op, []).append(family.name)
    assert all(len(names) == 1 for names in owners.values()), owners
    assert set(owners) == {k.op for k in kernel_table.table("cpu")}
    declarations = [k for family in kernel_table.FAMILIES.values() for k in family.kernels]
    outside = [k.name for k in kernel_table.table("cpu") if k not in declarations]
    assert not outside, outside
