#!/usr/bin/env bash
# Build rpcnet wheels for CPython 3.10-3.13 (x86_64 Linux, manylinux_2_28) with maturin.
#
#   tools/build_wheels.sh [OUT_DIR]            (default: dist/)
#   VERSIONS="3.12" CROSS=1 tools/build_wheels.sh
#   PYTHON=/path/to/python   the interpreter whose `ziglang` package provides zig (if not on PATH)
#
# Needs Rust, maturin and zig on the build host only (zig: `pip install ziglang` is enough; it
# links against glibc 2.28 symbols, so the wheel really is manylinux_2_28 whatever the host's
# glibc). An interpreter that is installed is built against directly; one that is not (or all,
# with CROSS=1) is cross-built: PYO3_CROSS needs only the version, the extension is not abi3.
# Without zig, COMPAT=linux builds an untagged wheel for this host only.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-dist}
VERSIONS=${VERSIONS:-"3.10 3.11 3.12 3.13"}
COMPAT=${COMPAT:-manylinux_2_28}
TARGET=x86_64-unknown-linux-gnu
PY=${PYTHON:-python3}
if [ -n "${MATURIN:-}" ]; then
    MATURIN_CMD=("$MATURIN")
elif "$PY" -c 'import maturin' >/dev/null 2>&1; then
    MATURIN_CMD=("$PY" -m maturin)  # the one installed with '.[test]'
else
    MATURIN_CMD=(maturin)
fi

ZIG_ARGS=()
if [ "$COMPAT" != linux ]; then
    if ! command -v zig >/dev/null 2>&1; then
        # The ziglang wheel ships the zig binary; maturin wants `zig` on PATH.
        zig_bin=$("$PY" -c 'import os, ziglang; print(os.path.join(os.path.dirname(ziglang.__file__), "zig"))' 2>/dev/null || true)
        if [ -z "$zig_bin" ] || [ ! -x "$zig_bin" ]; then
            echo "build_wheels: zig not found (pip install ziglang), needed for $COMPAT" >&2
            exit 1
        fi
        zig_dir=$(mktemp -d)
        trap 'rm -rf "$zig_dir"' EXIT
        ln -s "$zig_bin" "$zig_dir/zig"
        export PATH="$zig_dir:$PATH"
    fi
    ZIG_ARGS=(--zig)
fi

for v in $VERSIONS; do
    common=(build --release --strip --target "$TARGET" --compatibility "$COMPAT" --out "$OUT")
    if [ -z "${CROSS:-}" ] && command -v "python$v" >/dev/null 2>&1 \
        && "python$v" -c 'import sys' >/dev/null 2>&1; then
        echo "== CPython $v (installed interpreter)"
        "${MATURIN_CMD[@]}" "${common[@]}" "${ZIG_ARGS[@]}" -i "python$v"
    else
        echo "== CPython $v (cross-built: no interpreter needed)"
        PYO3_CROSS=1 PYO3_CROSS_PYTHON_VERSION="$v" \
            "${MATURIN_CMD[@]}" "${common[@]}" "${ZIG_ARGS[@]}" -i "python$v"
    fi
done
ls -l "$OUT"/rpcnet-*.whl
