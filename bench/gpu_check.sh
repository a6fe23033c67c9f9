#!/usr/bin/env bash
# The one GPU check (docs/gpu.md): on the GPU machine, in the repo root, with dist/gpu/ from
# bench/gpu_pack.sh carried along. At most 8 minutes. Writes exactly two files into the output
# directory (the first argument, else $OUT, else /tmp/gpu_check): gpu_check.tar.gz (every log,
# the junit XML, the benchmark JSON) and summary.json ("ok": true only when every check
# passed, with each check's figures); prints the summary as one line at the end.
#
#   1. installs the carried wheels into a private site dir, and a reference env (.refenv: the
#      llama.cpp v8 client, the real quantizer and the e2e client; Debian 13 libs);
#   2. `pytest -m gpu tests/test_cuda_gpu.py tests/test_cuda_gpu_device.py` (every CUDA kernel
#      against gguf/NumPy oracles; the backend's memory, capture and device seams);
#   3. the end to end run with the real v8 client on a cuda device (`tests/test_e2e_models.py
#      -m gpu`: prefill + decode, FA off and on, logits vs the client's local CPU run);
#   4. bench/gpu_bench.py: matvec GB/s per type and shape, upload GB/s, prefill TFLOP/s;
#   5. bench/gpu_speed.py: tg128 / pp512 of `rpcnet serve --device cuda` on the 1.1 B llama
#      (q8_0, Q4_K_M, f16) through the real v8 client, against the rpc-server baseline.
# Every test that skips fails (RPCNET_REQUIRE_REFENV=1).
#
# `--dry-run` (a CPU machine, the installed rpcnet and reference env; CI runs it): the same
# stages and summary with the CUDA kernels executed by the CPU emulator (tests/support/cuda_emu):
# the emulated kernel tests and the strict CuPy stand-in's (tests/support/strict_cupy), real
# client steps run by the cuda plans on the emulator against the CPU plans, no kernel benchmark, and the speed script's plumbing on a tiny model on the CPU.
set -uo pipefail
cd "$(dirname "$0")/.."
START=$SECONDS
DRY=false
if [ "${1:-}" = "--dry-run" ]; then DRY=true; shift; fi
DEST=${1:-${OUT:-/tmp/gpu_check}}
mkdir -p "$DEST"
WORK=$(mktemp -d /tmp/gpu_check.XXXXXX)
CARRY=dist/gpu
PY=${PYTHON:-python3}
SITE="$PWD/dist/gpu-site"  # dist/ is git-ignored
export RPCNET_REQUIRE_REFENV=1 PYTHONUNBUFFERED=1
BUDGET=${GPU_CHECK_BUDGET:-470}  # seconds for the checks; the summary is written after them
log() { printf '[gpu_check %3ds] %s\n' $((SECONDS - START)) "$*" | tee -a "$WORK/check.log"; }
left() { echo $((${1} - (SECONDS - START))); }  # seconds left before mark $1
cap() { local l; l=$(left "$BUDGET"); [ "$l" -lt "$1" ] && echo $((l > 1 ? l : 1)) || echo "$1"; }

GLIBC=$(ldd --version 2>&1 | sed -n 1p | grep -oE '[0-9]+\.[0-9]+$')
PYVER=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
log "python $PYVER, glibc $GLIBC, $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)"

# ---- 1. install ----------------------------------------------------------------------------
install_ok=true
if $DRY; then
    wheels=""
    "$PY" -c 'import rpcnet' >>"$WORK/check.log" 2>&1 || install_ok=false
else
rm -rf "$SITE" && mkdir -p "$SITE"
wheels=$(ls "$CARRY"/wheels/*.whl 2>/dev/null | grep -v -E '/numpy-' || true)
if [ -z "$wheels" ]; then
    log "no wheels in $CARRY/wheels: run bench/gpu_pack.sh on a CPU machine and carry dist/gpu"
    install_ok=false
elif ! "$PY" -m pip install --quiet --no-index --no-deps --target "$SITE" $wheels \
        >>"$WORK/install.log" 2>&1; then
    log "pip unusable here: unpacking the wheels directly"
    for w in $wheels; do "$PY" -m zipfile -e "$w" "$SITE" || install_ok=false; done
fi
export PYTHONPATH="$SITE"
"$PY" -c 'import rpcnet, cupy; print("rpcnet", rpcnet.__file__, "cupy", cupy.__version__)' \
    >>"$WORK/check.log" 2>&1 || install_ok=false
fi

# Reference env: the v8 client (cp312) and Debian 13's libc under .refenv.
REFENV="$PWD/.refenv"
if [ ! -f "$REFENV/v8/.done" ] && [ -n "$wheels" ]; then
    mkdir -p "$REFENV/v8" "$REFENV/trixie"
    ref_wheels=$(ls "$CARRY"/wheels/{llama_cpp_py_sync,cffi,pycparser}-*.whl 2>/dev/null)
    "$PY" -m pip install --quiet --no-index --no-deps --target "$REFENV/v8" $ref_wheels \
        >>"$WORK/install.log" 2>&1 || for w in $ref_wheels; do "$PY" -m zipfile -e "$w" "$REFENV/v8"; done
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
    if $DRY; then test_args=(tests/test_cuda_emulated.py tests/test_cuda_strict.py); else test_args=(-m gpu tests/test_cuda_gpu.py tests/test_cuda_gpu_device.py); fi
    timeout "$(cap 130)" "$PY" -m pytest -q -rfEs -p no:cacheprovider "${test_args[@]}" \
        --junitxml="$WORK/gpu_tests.xml" >"$WORK/gpu_tests.log" 2>&1
    tests_rc=$?
    log "pytest -m gpu: rc=$tests_rc, $(tail -1 "$WORK/gpu_tests.log")"
fi

# ---- 3. end to end with the real v8 client on cuda -------------------------------------------
e2e_rc=-1
if $install_ok; then
    if $DRY; then e2e_args=(-k "emulated or kernel_count"); else e2e_args=(-m gpu); fi
    RPCNET_E2E_REPORT="$WORK/gpu_e2e.json" timeout "$(cap 170)" "$PY" -m pytest -q -rfEs \
        "${e2e_args[@]}" -p no:cacheprovider tests/test_e2e_models.py \
        --junitxml="$WORK/gpu_e2e.xml" >"$WORK/gpu_e2e.log" 2>&1
    e2e_rc=$?
    log "e2e on cuda: rc=$e2e_rc, $(tail -1 "$WORK/gpu_e2e.log")"
fi

# ---- 4. kernel benchmark ---------------------------------------------------------------------
bench_rc=-1
if $install_ok && $DRY; then
    bench_rc=0
    log "gpu_bench: none without a GPU (dry run)"
elif $install_ok; then
    timeout "$(cap 60)" "$PY" bench/gpu_bench.py --out "$WORK/gpu_bench.json" >"$WORK/gpu_bench.log" 2>&1
    bench_rc=$?
    log "gpu_bench: rc=$bench_rc"
fi

# ---- 5. tg128 / pp512 through the server -----------------------------------------------------
speed_rc=-1
if $install_ok; then
    budget=$(left "$BUDGET")
    if [ "$budget" -gt 30 ]; then
        speed_args=(--profile q8_0)
        $DRY && speed_args+=(--tiny --device cpu --tg 16 --pp 64 --threads 2 --reps 1)
        timeout "$budget" "$PY" bench/gpu_speed.py --out "$WORK/gpu_speed.json" "${speed_args[@]}" \
            >"$WORK/gpu_speed.log" 2>&1
        speed_rc=$?
    fi
    log "gpu_speed: rc=$speed_rc, budget ${budget}s"
fi

# ---- summary ---------------------------------------------------------------------------------
GPU_CHECK_DRY=$($DRY && echo 1 || echo 0) "$PY" - "$WORK" "$DEST" "$install_ok" $((SECONDS - START)) "$tests_rc" "$e2e_rc" "$bench_rc" \
    "$speed_rc" <<'PYEOF'
import json, os, sys, xml.etree.ElementTree as ET
work, dest, install_ok, seconds, *rcs = sys.argv[1:]
rc = dict(zip(("tests", "e2e", "bench", "speed"), map(int, rcs)))
summary = {"ok": install_ok == "true" and all(v == 0 for v in rc.values()),
           "dry_run": os.environ.get("GPU_CHECK_DRY") == "1",
           "install_ok": install_ok == "true", "seconds": int(seconds), "rc": rc}

def junit(name):
    path = os.path.join(work, name)
    if not os.path.exists(path):
        return None
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    out = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    out["not_passed"] = [c.get("name") for s in suites for c in s.iter("testcase")
                         if any(c.find(t) is not None for t in ("failure", "error", "skipped"))][:40]
    return out

summary["tests"] = junit("gpu_tests.xml")
summary["e2e"] = junit("gpu_e2e.xml")
for name, key in (("gpu_e2e.json", "e2e_cases"),):
    path = os.path.join(work, name)
    if os.path.exists(path):
        data = json.load(open(path))
        summary[key] = [{k: r.get(k) for k in ("case", "rel", "tol", "steps", "argmax_differs")}
                        for r in data["cases"]] + [{"failed": f} for f in data["failures"]]
        gpu = [r for r in data["cases"] if r.get("gpu") and r.get("steps")]
        summary["argmax_agree"] = [sum(r["steps"] - r["argmax_differs"] for r in gpu),
                                   sum(r["steps"] for r in gpu)]
bench = os.path.join(work, "gpu_bench.json")
if os.path.exists(bench):
    b = json.load(open(bench))
    summary["gpu"] = b["gpu"]
    summary["matvec_GBps"] = {f'{r["type"]} {r["k"]}x{r["m"]}': r["GBps"] for r in b["matvec"]}
    summary["matvec_model_GBps"] = {
        f'{r["type"]} {r["k"]}x{r["m"]} {"split" if r["split"] else "warp"}': r["GBps"]
        for r in b.get("matvec_model", [])}
    summary["upload_GBps"] = {r["MiB"]: r["GBps"] for r in b["upload"]}
    summary["prefill_TFLOPs"] = {r["type"]: r["TFLOPs"] for r in b["prefill"]}
    summary["launch"] = b["launch"]
speed = os.path.join(work, "gpu_speed.json")
if os.path.exists(speed):
    data = json.load(open(speed))
    summary["speed"] = data["types"]
    summary["profile"] = data.get("profile")
with open(os.path.join(dest, "summary.json"), "w") as f:
    json.dump(summary, f, indent=1)
print(json.dumps(summary))
sys.exit(0 if summary["ok"] else 1)
PYEOF
ok=$?
tar -czf "$DEST/gpu_check.tar.gz" -C "$WORK" . 2>/dev/null
exit $ok
