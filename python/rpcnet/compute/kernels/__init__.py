"""CPU kernels, one module per op family.

Importing this package registers the kernel modules listed below, in one place; which kernel
serves a node is decided by the priorities given at registration (registry.py), not by this order.
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


def register_all() -> None:
    """Import every kernel module; their ``@kernel`` decorators fill the registry."""
    for name in KERNEL_MODULES:
        importlib.import_module(f"{__name__}.{name}")


register_all()
