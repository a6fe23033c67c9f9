"""rpcnet: a multi-client remote ggml device server for llama.cpp.

Speaks the ggml RPC protocol 8.0.0 (default) and 7.0.0.
"""

__version__ = "0.1.0"
