#!/usr/bin/env bash
# Build the reference environment used by tests and bench scripts: REAL llama.cpp (PyPI wheels of
# llama-cpp-py-sync) as RPC client and reference rpc server, protocol v8.0.0 and v7.0.0.
#
# The wheels' native libraries need glibc >= 2.38; Debian 12 has 2.36. We therefore fetch
# Debian 13 (trixie) libc6/libstdc++6/libgcc-s1/libgomp1 with `apt-get download` (private apt
# config and state: the host's apt setup is not changed), unpack them with `dpkg -x`, and run the
# host's python3 through trixie's dynamic loader (see tests/support/refenv.py and
# docs/reference-env.md).
#
# Layout of ${RPCNET_REFENV:-<repo>/.refenv}:
#   trixie/   unpacked trixie libs (loader: trixie/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2)
#   v8/       pip --target of llama-cpp-py-sync==0.11739 and its runtime deps (protocol v8.0.0)
#   v7/       pip --target of llama-cpp-py-sync==0.11413 and its runtime deps (protocol v7.0.0)
#   python    real path of the python interpreter the targets were installed for
#   apt/      private apt lists/cache/.debs (may be deleted after a successful build)
#
# Idempotent: each step leaves a marker file (.done) and is skipped when it exists.
# Environment:
#   RPCNET_REFENV         install location (default <repo>/.refenv)
#   PYTHON                interpreter to use (default: python3 on PATH; its real binary is used)
#   RPCNET_TRIXIE_MIRROR  Debian mirror URI (default: the host's own Debian URI from apt sources)
#   RPCNET_REFENV_FORCE=1 redo all steps
#   RPCNET_REQUIRE_REFENV=1  fail when an optional part (pyverbs) cannot be installed (CI)
set -euo pipefail

V8_VERSION="0.11739"
V7_VERSION="0.11413"
TRIXIE_PACKAGES=(libc6 libstdc++6 libgcc-s1 libgomp1)

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REFENV="${RPCNET_REFENV:-$REPO/.refenv}"
PYTHON_CMD="${PYTHON:-python3}"

log() { printf '[refenv] %s\n' "$*"; }
die() { printf '[refenv] ERROR: %s\n' "$*" >&2; exit 1; }

[ "$(uname -m)" = "x86_64" ] || die "only x86_64 is supported (wheels are manylinux x86_64)"
command -v apt-get >/dev/null || die "apt-get not found (Debian/Ubuntu host required)"
command -v dpkg >/dev/null || die "dpkg not found"

mkdir -p "$REFENV"
START=$SECONDS
# Serialize concurrent runs (e.g. parallel test workers installing on demand).
if command -v flock >/dev/null; then
    exec 9>"$REFENV/.lock"
    flock -w 900 9 || die "timed out waiting for another refenv.sh ($REFENV/.lock)"
fi

if [ "${RPCNET_REFENV_FORCE:-0}" = "1" ]; then
    log "RPCNET_REFENV_FORCE=1: removing markers"
    rm -f "$REFENV/trixie/.done" "$REFENV/v8/.done" "$REFENV/v7/.done"
fi

# --- python: resolve the real interpreter binary (pyenv's python3 is a shim) --------------------
PY_REAL="$("$PYTHON_CMD" -c 'import os, sys; print(os.path.realpath(sys.executable))')"
[ -x "$PY_REAL" ] || die "cannot resolve the real python binary from '$PYTHON_CMD'"
PY_TAG="$("$PY_REAL" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
if [ -f "$REFENV/python" ] && [ "$(cat "$REFENV/python")" != "$PY_REAL" ]; then
    log "python changed ($(cat "$REFENV/python") -> $PY_REAL): reinstalling wheels"
    rm -f "$REFENV/v8/.done" "$REFENV/v7/.done"
fi
log "python: $PY_REAL (Python $PY_TAG)"

TRIXIE="$REFENV/trixie"
LIBDIR="$TRIXIE/usr/lib/x86_64-linux-gnu"
LOADER="$LIBDIR/ld-linux-x86-64.so.2"

# --- step 1: trixie runtime libraries -------------------------------------------------------------
host_debian_mirror() {
    # Print "URI<TAB>SIGNED_BY" of the host's main Debian entry (not the security archive).
    local codename f
    # shellcheck disable=SC1091
    codename="$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")"
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        # deb822: blank-line separated stanzas; first URI of a stanza whose Suites has the codename.
        awk -v code="$codename" '
            function flush() {
                if (types ~ /(^| )deb( |$)/ && uri != "" && suites ~ ("(^| )" code "( |$)") && uri !~ /security/) {
                    print uri "\t" signed; found = 1; exit
                }
                types = ""; uri = ""; suites = ""; signed = ""
            }
            /^[ \t]*#/ { next }
            /^[ \t]*$/ { flush(); next }
            tolower($1) == "types:"     { types = substr($0, index($0, ":") + 1); gsub(/^[ \t]+/, "", types) }
            tolower($1) == "uris:"      { uri = $2 }
            tolower($1) == "suites:"    { suites = substr($0, index($0, ":") + 1); gsub(/^[ \t]+/, "", suites) }
            tolower($1) == "signed-by:" { if (NF >= 2 && $2 ~ /^\//) signed = $2 }
            END { if (!found) flush() }
        ' "$f"
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -f "$f" ] || continue
        # one-line format: deb [opts] URI suite components...
        awk -v code="$codename" '
            $1 != "deb" { next }
            {
                i = 2; signed = ""
                if ($i ~ /^\[/) {
                    while (i <= NF) {
                        if ($i ~ /signed-by=/) { s = $i; sub(/.*signed-by=/, "", s); sub(/\]$/, "", s); signed = s }
                        if ($i ~ /\]$/) { i++; break }
                        i++
                    }
                }
                if ($(i + 1) == code && $i !~ /security/) { print $i "\t" signed; exit }
            }
        ' "$f"
    done
}

if [ -f "$TRIXIE/.done" ]; then
    log "trixie libs: already installed ($TRIXIE)"
else
    if [ -n "${RPCNET_TRIXIE_MIRROR:-}" ]; then
        MIRROR="$RPCNET_TRIXIE_MIRROR"; SIGNED_BY=""
    else
        LINE="$(host_debian_mirror | head -n 1 || true)"
        MIRROR="$(printf '%s' "$LINE" | cut -f 1)"
        SIGNED_BY="$(printf '%s' "$LINE" | cut -s -f 2)"
        if [ -z "$MIRROR" ]; then
            MIRROR="http://deb.debian.org/debian"
            log "no Debian entry found in the host's apt sources; using $MIRROR"
        fi
    fi
    if [ -z "$SIGNED_BY" ] && [ -f /usr/share/keyrings/debian-archive-keyring.gpg ]; then
        SIGNED_BY=/usr/share/keyrings/debian-archive-keyring.gpg
    fi
    log "trixie libs: mirror $MIRROR (keyring: ${SIGNED_BY:-apt default})"

    APT="$REFENV/apt"
    rm -rf "$APT"
    mkdir -p "$APT/lists/partial" "$APT/cache/archives/partial" "$APT/debs"
    write_sources() {  # $1 = mirror URI
        if [ -n "$SIGNED_BY" ]; then
            echo "deb [signed-by=$SIGNED_BY] $1 trixie main" >"$APT/sources.list"
        else
            echo "deb $1 trixie main" >"$APT/sources.list"
        fi
    }
    write_sources "$MIRROR"
    # Read after the host config (apt-get -c): keeps host settings such as proxies, but uses a
    # private source list/state/cache and drops host hooks (e.g. appstream refresh after update).
    cat >"$APT/apt.conf" <<EOF
Dir::Etc::sourcelist "$APT/sources.list";
Dir::Etc::sourceparts "/dev/null";
Dir::Etc::preferences "/dev/null";
Dir::Etc::preferencesparts "/dev/null";
Dir::State::Lists "$APT/lists";
Dir::Cache "$APT/cache";
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
APT::Architecture "amd64";
APT::Architectures { "amd64"; };
Acquire::Languages "none";
Acquire::IndexTargets::deb::DEP-11::DefaultEnabled "false";
Acquire::IndexTargets::deb::DEP-11-icons::DefaultEnabled "false";
Acquire::IndexTargets::deb::DEP-11-icons-small::DefaultEnabled "false";
Acquire::IndexTargets::deb::DEP-11-icons-hidpi::DefaultEnabled "false";
Acquire::IndexTargets::deb::CNF::DefaultEnabled "false";
Acquire::Retries "3";
Acquire::http::Timeout "60";
APT::Sandbox::User "root";
#clear APT::Update::Pre-Invoke;
#clear APT::Update::Post-Invoke;
#clear APT::Update::Post-Invoke-Success;
EOF
    trixie_update() {  # apt-get update may exit 0 after failed fetches: check the index too
        rm -rf "$APT/lists" && mkdir -p "$APT/lists/partial"
        apt-get -q -c "$APT/apt.conf" update >"$APT/update.log" 2>&1 \
            && compgen -G "$APT/lists/*_dists_trixie_main_binary-amd64_Packages*" >/dev/null
    }
    log "apt-get update (trixie main, private state in $APT)"
    if ! trixie_update; then
        FALLBACK="http://deb.debian.org/debian"
        [ "$MIRROR" != "$FALLBACK" ] || { cat "$APT/update.log" >&2; die "apt-get update failed"; }
        log "apt-get update failed with $MIRROR (see $APT/update.log); trying $FALLBACK"
        write_sources "$FALLBACK"
        trixie_update || { cat "$APT/update.log" >&2; die "apt-get update failed"; }
    fi
    log "apt-get download ${TRIXIE_PACKAGES[*]}"
    (cd "$APT/debs" && apt-get -q -c "$APT/apt.conf" download "${TRIXIE_PACKAGES[@]/%//trixie}") \
        >"$APT/download.log" 2>&1 || { cat "$APT/download.log" >&2; die "apt-get download failed"; }

    rm -rf "$TRIXIE.tmp"
    mkdir -p "$TRIXIE.tmp"
    for deb in "$APT"/debs/*.deb; do
        log "  unpack $(basename "$deb")"
        dpkg -x "$deb" "$TRIXIE.tmp"
    done
    [ -x "$TRIXIE.tmp/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" ] \
        || die "trixie loader missing after unpacking"
    rm -rf "$TRIXIE"
    mv "$TRIXIE.tmp" "$TRIXIE"
    # Sanity check: the host python starts under the trixie loader and sees glibc >= 2.38.
    GLIBC="$("$LOADER" --library-path "$LIBDIR" "$PY_REAL" -c \
        'import platform; print(platform.libc_ver()[1])')" || die "python does not start under the trixie loader"
    log "trixie libs: python runs with glibc $GLIBC"
    ls "$APT"/debs >"$TRIXIE/.packages"
    rm -rf "$APT/lists" "$APT/cache"  # ~25 MB of indexes; the .debs and logs stay
    touch "$TRIXIE/.done"
fi

# --- steps 2/3: the two wheels (+ runtime deps: cffi, numpy, certifi) ------------------------------
install_wheel() {  # $1 = v8|v7, $2 = llama-cpp-py-sync version
    local name="$1" version="$2" dest="$REFENV/$1"
    if [ -f "$dest/.done" ]; then
        log "$name: llama-cpp-py-sync==$version already installed ($dest)"
        return
    fi
    log "$name: pip install --target $dest llama-cpp-py-sync==$version"
    rm -rf "$dest.tmp"
    PIP_ROOT_USER_ACTION=ignore "$PY_REAL" -m pip install --quiet --disable-pip-version-check \
        --no-input --no-compile \
        --target "$dest.tmp" "llama-cpp-py-sync==$version" \
        || die "pip install of llama-cpp-py-sync==$version failed"
    # Sanity check: the native library loads under the trixie loader and has RPC support.
    PYTHONPATH="$dest.tmp" "$LOADER" --library-path "$LIBDIR" "$PY_REAL" -c '
import llama_cpp_py_sync._cffi_bindings as b, llama_cpp_py_sync._version as v
assert b.get_lib().llama_supports_rpc(), "no RPC support"
b.get_rpc_lib()
print("  llama.cpp", v.__llama_cpp_tag__, "loaded; RPC supported")' \
        || die "llama-cpp-py-sync==$version does not load under the trixie loader"
    rm -rf "$dest"
    mv "$dest.tmp" "$dest"
    echo "$version" >"$dest/.version"
    touch "$dest/.done"
}

install_wheel v8 "$V8_VERSION"
install_wheel v7 "$V7_VERSION"
echo "$PY_REAL" >"$REFENV/python"

# pyverbs (rdma-core's Python binding, Debian's python3-pyverbs) for the RDMA transport tests that
# build real verbs objects without a device. Only the pyverbs package is exposed to the tests
# (through $REFENV/pyverbs-path), not the rest of Debian's dist-packages.
if [ ! -e "$REFENV/pyverbs-path/pyverbs" ]; then
    if ! dpkg -s python3-pyverbs >/dev/null 2>&1; then
        log "installing python3-pyverbs (Debian)"
        apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
            python3-pyverbs >/dev/null || log "python3-pyverbs unavailable"
    fi
    if [ -d /usr/lib/python3/dist-packages/pyverbs ]; then
        mkdir -p "$REFENV/pyverbs-path"
        ln -sfn /usr/lib/python3/dist-packages/pyverbs "$REFENV/pyverbs-path/pyverbs"
    elif [ "${RPCNET_REQUIRE_REFENV:-0}" = "1" ]; then
        die "pyverbs is required (RPCNET_REQUIRE_REFENV=1) but python3-pyverbs could not be installed"
    else
        log "no pyverbs: the RDMA object tests will skip"
    fi
fi

log "done in $((SECONDS - START))s: $REFENV"
