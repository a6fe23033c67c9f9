"""The CUDA backend: CUDA C kernels (src/), loaded with CuPy when a GPU is served.

Importing this package never imports CuPy; only `rpcnet.compute.cuda.device` does, lazily.
"""
