"""rpcnet: a multi-client remote ggml device server for llama.cpp (ggml RPC protocol 8.0.0 / 7.0.0)."""

__version__ = "0.1.0"
