#!/usr/bin/env bash
# The one GPU check (docs/gpu.md): on the GPU machine, in the repo root, with dist/gpu/ from
# bench/gpu_pack.sh carried along. At most 8 minutes; prints one JSON summary line at the end
# and leaves logs and results in $OUT (or /tmp/gpu_check).
#
#   1. installs the carried wheels into a private site dir, and a reference env (.refenv: the
#      llama.cpp v8 client for the real quantizer, Debian 13 libs) for the test oracles;
#   2. runs `pytest -m gpu` (every CUDA kernel against gguf/NumPy oracles, buffers, staging);
#   3. runs bench/gpu_bench.py (matvec GB/s per type and shape, upload GB/s, prefill TFLOP/s);
#   4. the end-to-end run with the real v8 client on a cuda device (tests/test_e2e_models.py
#      test_backends[cuda]: prefill + decode, logits vs the client's local CPU run). The server
#      is built with make_cuda_devices(ready=True) since SERVING_READY is still False.
set -uo pipefail
cd "$(dirname "$0")/.."
START=$SECONDS
RESULTS=${OUT:-/tmp/gpu_check}
mkdir -p "$RESULTS"
CARRY=dist/gpu
PY=${PYTHON:-python3}
SITE="$PWD/dist/gpu-site"  # dist/ is git-ignored
log() { printf '[gpu_check %3ds] %s\n' $((SECONDS - START)) "$*" | tee -a "$RESULTS/check.log"; }

GLIBC=$(ldd --version 2>&1 | sed -n 1p | grep -oE '[0-9]+\.[0-9]+$')
PYVER=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
log "python $PYVER, glibc $GLIBC, $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)"

# ---- 1. install ----------------------------------------------------------------------------
install_ok=true
rm -rf "$SITE" && mkdir -p "$SITE"
wheels=$(ls "$CARRY"/wheels/*.whl 2>/dev/null | grep -v -E '/numpy-' || true)
if [ -z "$wheels" ]; then
    log "no wheels in $CARRY/wheels: run bench/gpu_pack.sh on a CPU machine and carry dist/gpu"
    install_ok=false
elif ! "$PY" -m pip install --quiet --no-index --no-deps --target "$SITE" $wheels \
        >>"$RESULTS/install.log" 2>&1; then
    log "pip unusable here: unpacking the wheels directly"
    for w in $wheels; do "$PY" -m zipfile -e "$w" "$SITE" || install_ok=false; done
fi
export PYTHONPATH="$SITE"
"$PY" -c 'import rpcnet, cupy; print("rpcnet", rpcnet.__file__, "cupy", cupy.__version__)' \
    >>"$RESULTS/check.log" 2>&1 || install_ok=false

# Reference env for the oracles: the v8 client (cp312) and Debian 13's libc under .refenv.
REFENV="$PWD/.refenv"
if [ ! -f "$REFENV/v8/.done" ] && [ -n "$wheels" ]; then
    mkdir -p "$REFENV/v8" "$REFENV/trixie"
    ref_wheels=$(ls "$CARRY"/wheels/{llama_cpp_py_sync,cffi,pycparser}-*.whl 2>/dev/null)
    "$PY" -m pip install --quiet --no-index --no-deps --target "$REFENV/v8" $ref_wheels \
        >>"$RESULTS/install.log" 2>&1 || for w in $ref_wheels; do "$PY" -m zipfile -e "$w" "$REFENV/v8"; done
    for deb in "$CARRY"/debs/*.deb; do
        if command -v dpkg >/dev/null; then dpkg -x "$deb" "$REFENV/trixie"
        else (tmp=$(mktemp -d) && cd "$tmp" && ar x "$OLDPWD/$deb" && tar -xf data.tar.* -C "$REFENV/trixie"); fi
    done
    "$PY" -c 'import os, sys; print(os.path.realpath(sys.executable))' >"$REFENV/python"
    # The probes run with PYTHONPATH=.refenv/v8 and no user site: give them this machine's NumPy.
    np_dir=$("$PY" -c 'import numpy, os; print(os.path.dirname(numpy.__file__))')
    ln -sfn "$np_dir" "$REFENV/v8/numpy"
    [ -d "$np_dir.libs" ] && ln -sfn "$np_dir.libs" "$REFENV/v8/numpy.libs"
    touch "$REFENV/v8/.done" "$REFENV/trixie/.done"
fi
log "install: $install_ok"

# ---- 2. GPU tests ----------------------------------------------------------------------------
tests_rc=-1
if $install_ok; then
    timeout 300 "$PY" -m pytest -m gpu -q -p no:cacheprovider tests/test_cuda_gpu.py \
        --junitxml="$RESULTS/gpu_tests.xml" >"$RESULTS/gpu_tests.log" 2>&1
    tests_rc=$?
    log "pytest -m gpu: rc=$tests_rc, $(tail -1 "$RESULTS/gpu_tests.log")"
fi

# ---- 2b. end to end with the real v8 client on cuda ---------------------------------------------
e2e_rc=-1
if $install_ok; then
    timeout 150 "$PY" -m pytest -m gpu -q -p no:cacheprovider tests/test_e2e_models.py \
        -k test_backends --junitxml="$RESULTS/gpu_e2e.xml" >"$RESULTS/gpu_e2e.log" 2>&1
    e2e_rc=$?
    log "e2e on cuda: rc=$e2e_rc, $(tail -1 "$RESULTS/gpu_e2e.log")"
fi

# ---- 3. benchmark ----------------------------------------------------------------------------
bench_rc=-1
if $install_ok; then
    budget=$((450 - (SECONDS - START)))
    if [ "$budget" -gt 30 ]; then
        timeout "$budget" "$PY" bench/gpu_bench.py --out "$RESULTS/gpu_bench.json" \
            >"$RESULTS/gpu_bench.log" 2>&1
        bench_rc=$?
    fi
    log "gpu_bench: rc=$bench_rc"
fi

# ---- summary ---------------------------------------------------------------------------------
"$PY" - "$RESULTS" "$tests_rc" "$bench_rc" "$install_ok" $((SECONDS - START)) "$e2e_rc" <<'PYEOF'
import json, os, sys, xml.etree.ElementTree as ET
results, tests_rc, bench_rc, install_ok, seconds, e2e_rc = sys.argv[1:]
summary = {"install_ok": install_ok == "true", "seconds": int(seconds),
           "tests_rc": int(tests_rc), "bench_rc": int(bench_rc), "e2e_rc": int(e2e_rc)}
e2e_log = os.path.join(results, "gpu_e2e.log")
if os.path.exists(e2e_log):
    summary["e2e"] = open(e2e_log).read().strip().splitlines()[-1:]
xml = os.path.join(results, "gpu_tests.xml")
if os.path.exists(xml):
    suite = ET.parse(xml).getroot()
    suite = suite if suite.tag == "testsuite" else suite[0]
    summary["tests"] = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    summary["failed"] = [c.get("name") for c in suite.iter("testcase")
                         if c.find("failure") is not None or c.find("error") is not None][:20]
bench = os.path.join(results, "gpu_bench.json")
if os.path.exists(bench):
    b = json.load(open(bench))
    summary["gpu"] = b["gpu"]
    summary["matvec_GBps"] = {f'{r["type"]} {r["k"]}x{r["m"]}': r["GBps"] for r in b["matvec"]}
    summary["upload_GBps"] = {r["MiB"]: r["GBps"] for r in b["upload"]}
    summary["prefill_TFLOPs"] = {r["type"]: r["TFLOPs"] for r in b["prefill"]}
    summary["launch"] = b["launch"]
with open(os.path.join(results, "summary.json"), "w") as f:
    json.dump(summary, f, indent=1)
print(json.dumps(summary))
PYEOF
[ "$install_ok" = true ] && [ "$tests_rc" = 0 ] && [ "$e2e_rc" = 0 ] && [ "$bench_rc" = 0 ]
