"""CPU kernels, one module per op family; importing this package registers them all."""

from rpcnet.compute.kernels import binary, matmul  # noqa: F401
