"""Sans-I/O description of the ggml RPC wire protocol: command ids and payload layouts."""
