"""Kernels, one module per op family: the CPU's here, other backends' in their packages.

Importing this package registers the kernel modules listed below, in one place; which kernel
serves a node is decided by the device and the priorities given at registration (kernel_table.py),
not by this order. Registering the cuda kernels imports no CuPy.
"""

import importlib

KERNEL_MODULES = (
    "attention",
    "attention_native",
    "binary",
    "binary_native",
    "copy",
    "glu",
    "glu_native",
    "matmul",
    "fwht",
    "matmul_native",
    "moe",
    "moe_native",
    "norm",
    "norm_native",
    "reduce",
    "rope",
    "rope_native",
    "rows",
    "rows_native",
    "shape",
    "softmax",
    "softmax_native",
    "unary",
)

BACKEND_KERNEL_MODULES = ("rpcnet.compute.cuda.kernels",)


def register_all() -> None:
    """Import every kernel module; their ``@kernel`` decorators fill the registry."""
    for name in KERNEL_MODULES:
        importlib.import_module(f"{__name__}.{name}")
    for name in BACKEND_KERNEL_MODULES:
        importlib.import_module(name)


register_all()
