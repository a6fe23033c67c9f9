"""Kernels, one module per op family: each declares its op whole in a `FAMILY` (kernel_table.py's
`OpFamily`): shape and type rules, scratch, the CPU kernels, the modules of its CUDA builders.

Importing this package enters the families listed below into the kernel table, in one place;
which kernel serves a node is decided by the device and the priorities of the declarations, not
by this order. Registering the cuda kernels imports no CuPy.
"""

import importlib

from rpcnet.compute.kernels import kernel_table

KERNEL_MODULES = (
    "attention",
    "binary",
    "copy",
    "glu",
    "matmul",
    "moe",
    "norm",
    "reduce",
    "rope",
    "rows",
    "shape",
    "softmax",
    "unary",
)

BACKEND_KERNEL_MODULES = ("rpcnet.compute.cuda.kernels",)


def register_all() -> None:
    """Import every kernel module and declare its family; the cuda modules register their
    entries themselves."""
    for name in KERNEL_MODULES:
        module = importlib.import_module(f"{__name__}.{name}")
        family = getattr(module, "FAMILY", None)
        if family is not None:
            kernel_table.declare(family)
    for name in BACKEND_KERNEL_MODULES:
        importlib.import_module(name)


register_all()
