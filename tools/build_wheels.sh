#!/usr/bin/env bash
# Build rpcnet wheels for CPython 3.10-3.13 (x86_64 Linux, manylinux_2_28) with maturin.
#
#   tools/build_wheels.sh [OUT_DIR]            (default: dist/)
#   VERSIONS="3.12" COMPAT=manylinux_2_28 tools/build_wheels.sh
#
# An interpreter that is installed is built against directly; one that is not is cross-built
# (PYO3_CROSS: pyo3 needs only the version, the extension is not abi3). Installing a wheel needs
# no Rust toolchain. manylinux_2_28 works without zig as long as the build host's glibc symbols
# used by the extension are <= 2.28 (maturin audits this and fails otherwise; set
# COMPAT=linux to build an untagged wheel for this host only).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-dist}
VERSIONS=${VERSIONS:-"3.10 3.11 3.12 3.13"}
COMPAT=${COMPAT:-manylinux_2_28}
TARGET=x86_64-unknown-linux-gnu
MATURIN=${MATURIN:-maturin}

for v in $VERSIONS; do
    if command -v "python$v" >/dev/null 2>&1 && "python$v" -c 'import sys' >/dev/null 2>&1; then
        echo "== CPython $v (installed)"
        "$MATURIN" build --release --strip -i "python$v" --compatibility "$COMPAT" --out "$OUT"
    else
        echo "== CPython $v (cross: interpreter not installed)"
        PYO3_CROSS=1 PYO3_CROSS_PYTHON_VERSION="$v" "$MATURIN" build --release --strip \
            -i "python$v" --target "$TARGET" --compatibility "$COMPAT" --out "$OUT"
    fi
done
ls -l "$OUT"/rpcnet-*.whl
