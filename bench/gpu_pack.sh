#!/usr/bin/env bash
# Prepare dist/gpu/ on a CPU machine: everything bench/gpu_check.sh installs on the GPU machine,
# which has CuPy, NumPy, uvloop and threadpoolctl but no package registry. Carry `dist/gpu`
# (under 64 MiB) with the run, then run `bash bench/gpu_check.sh` there.
#
#   wheels/  rpcnet built for CPython 3.12 (the GPU machine's Python), the llama.cpp v8 client
#            (llama-cpp-py-sync, the reference quantizer for the oracles), gguf, pytest & co.
#   debs/    Debian 13 libc6/libstdc++6/libgcc-s1/libgomp1 (llama-cpp-py-sync needs glibc >= 2.38)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=dist/gpu
PY=${PYTHON:-python3}
rm -rf "$OUT"
mkdir -p "$OUT/wheels" "$OUT/debs"

PYO3_CROSS=1 PYO3_CROSS_PYTHON_VERSION=3.12 maturin build --release -i python3.12 \
    --target x86_64-unknown-linux-gnu -o "$OUT/wheels"

# Binary wheels for cp312 manylinux; --no-deps with the full list, so NumPy (already on the GPU
# machine) is not carried.
"$PY" -m pip download --quiet --no-deps --only-binary :all: --python-version 3.12 \
    --implementation cp --abi cp312 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 -d "$OUT/wheels" \
    llama-cpp-py-sync==0.11739 cffi pycparser gguf pyyaml tqdm requests urllib3 idna certifi \
    charset-normalizer pytest pluggy iniconfig packaging pygments pytest-timeout \
    pytest-asyncio typing-extensions

# The Debian 13 libraries tools/refenv.sh fetched (run it first if .refenv/apt is missing).
[ -d .refenv/apt/debs ] || bash tools/refenv.sh
cp .refenv/apt/debs/*.deb "$OUT/debs/"

du -sh "$OUT"
ls "$OUT/wheels" "$OUT/debs"
