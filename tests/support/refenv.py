"""Run REAL llama.cpp (PyPI ``llama-cpp-py-sync`` wheels) as the reference peer.

The environment is built by ``tools/refenv.sh`` into ``$RPCNET_REFENV`` (default
``<repo>/.refenv``): Debian 13 runtime libraries (the wheels need glibc >= 2.38) plus one
``pip --target`` directory per protocol version. Reference processes run the host's python
binary through trixie's dynamic loader, so nothing on the host changes. See
``docs/reference-env.md``.

This module has no pytest dependency; tests and bench scripts both use it. Versions are the keys
of :data:`VERSIONS` (``"v8"``: protocol 8.0.0, ``"v7"``: protocol 7.0.0).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = [
    "PROTOCOL",
    "VERSIONS",
    "ProbeError",
    "available",
    "free_port",
    "install",
    "loader_path",
    "probe_path",
    "python_command",
    "refenv_dir",
    "run_probe",
    "start_reference_server",
    "stop_process",
]

#: llama-cpp-py-sync version installed for each protocol dialect.
VERSIONS: dict[str, str] = {"v8": "0.11739", "v7": "0.11413"}
#: RPC protocol version (major, minor, patch) spoken by each wheel.
PROTOCOL: dict[str, tuple[int, int, int]] = {"v8": (8, 0, 0), "v7": (7, 0, 0)}

REPO_ROOT = Path(__file__).resolve().parents[2]
PROBES_DIR = Path(__file__).resolve().parent / "probes"
INSTALL_SCRIPT = REPO_ROOT / "tools" / "refenv.sh"
_LIB_SUBDIRS = ("usr/lib/x86_64-linux-gnu", "lib/x86_64-linux-gnu")


class ProbeError(RuntimeError):
    """A reference-env subprocess failed, timed out, or printed no JSON result."""

    def __init__(
        self,
        message: str,
        *,
        returncode: int | None = None,
        stdout: str = "",
        stderr: str = "",
        timed_out: bool = False,
    ) -> None:
        tail = stderr.strip().splitlines()[-15:]
        super().__init__(message + ("\n--- stderr (tail) ---\n" + "\n".join(tail) if tail else ""))
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        self.timed_out = timed_out


def refenv_dir() -> Path:
    """Install location of the reference environment (``$RPCNET_REFENV`` or ``<repo>/.refenv``)."""
    value = os.environ.get("RPCNET_REFENV")
    return Path(value).resolve() if value else REPO_ROOT / ".refenv"


def _check_version(version: str) -> None:
    if version not in VERSIONS:
        raise ValueError(f"unknown reference version {version!r}; expected one of {list(VERSIONS)}")


def _lib_dirs() -> list[Path]:
    root = refenv_dir() / "trixie"
    return [root / sub for sub in _LIB_SUBDIRS if (root / sub).is_dir()]


def loader_path() -> Path:
    """Trixie's dynamic loader, used to start the host python with glibc 2.41."""
    return refenv_dir() / "trixie" / _LIB_SUBDIRS[0] / "ld-linux-x86-64.so.2"


def _python_binary() -> Path:
    # The target dirs hold CPython-version-specific wheels (cffi, numpy): use the interpreter
    # that tools/refenv.sh installed them for.
    recorded = refenv_dir() / "python"
    return Path(recorded.read_text().strip())


def available(version: str | None = None) -> bool:
    """True when the environment (and the given version, or all versions) is installed."""
    base = refenv_dir()
    versions = list(VERSIONS) if version is None else [version]
    for item in versions:
        _check_version(item)
        if not (base / item / ".done").is_file():
            return False
    if not (base / "trixie" / ".done").is_file() or not loader_path().is_file():
        return False
    try:
        return _python_binary().is_file()
    except OSError:
        return False


def install(timeout: float = 900.0) -> None:
    """Run ``tools/refenv.sh`` (idempotent). Raises ``subprocess.CalledProcessError`` on failure."""
    subprocess.run(["bash", str(INSTALL_SCRIPT)], check=True, timeout=timeout)


def python_command(
    version: str, extra_env: Mapping[str, str] | None = None
) -> tuple[list[str], dict[str, str]]:
    """Return ``(argv_prefix, env)`` to run Python inside the reference environment.

    ``argv_prefix`` is ``[loader, "--library-path", <trixie libs>, <real python>]``; append a
    script path (or ``-c CODE``) and its arguments. ``env`` is a full environment for
    ``subprocess`` (a copy of ``os.environ`` plus ``extra_env``) with the version's target dir
    on ``PYTHONPATH``. The loader's ``--library-path`` only affects that process: children it
    spawns run with the host's glibc again.
    """
    _check_version(version)
    if not available(version):
        raise RuntimeError(
            f"reference environment {version} is not installed in {refenv_dir()}; "
            f"run {INSTALL_SCRIPT}"
        )
    argv = [
        str(loader_path()),
        "--library-path",
        ":".join(str(d) for d in _lib_dirs()),
        str(_python_binary()),
    ]
    env = dict(os.environ)
    env.update(
        {
            "PYTHONPATH": str(refenv_dir() / version),
            "PYTHONNOUSERSITE": "1",
            "PYTHONUNBUFFERED": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            # ggml_abort() would otherwise attach gdb to print a backtrace (slow, noisy).
            "GGML_NO_BACKTRACE": "1",
        }
    )
    # Keep host-library overrides away from a process that runs another glibc.
    env.pop("LD_PRELOAD", None)
    env.pop("LD_LIBRARY_PATH", None)
    if extra_env:
        env.update(extra_env)
    return argv, env


def probe_path(script: str | os.PathLike[str]) -> Path:
    """Resolve a probe: an existing path, or ``"devices"``/``"devices.py"`` in ``probes/``."""
    path = Path(script)
    if path.is_file():
        return path.resolve()
    name = path.name if path.suffix == ".py" else path.name + ".py"
    candidate = PROBES_DIR / name
    if candidate.is_file():
        return candidate
    raise FileNotFoundError(f"probe script not found: {script}")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (bind to port 0; racy by nature)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def run_probe(
    version: str,
    script: str | os.PathLike[str],
    *args: str | os.PathLike[str] | int | float,
    timeout: float = 120.0,
    extra_env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> dict:
    """Run a probe script under the reference env and return the JSON object on its last line.

    ``script`` is a path or the name of a file in ``tests/support/probes``. Raises
    :class:`ProbeError` when the process exits non-zero (e.g. SIGABRT from a ggml assertion:
    ``returncode == -6``), exceeds ``timeout`` seconds (it is killed), or prints no JSON.
    """
    argv, env = python_command(version, extra_env)
    argv = [*argv, str(probe_path(script)), *(str(a) for a in args)]
    try:
        result = subprocess.run(
            argv,
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:  # subprocess.run has killed the child
        raise ProbeError(
            f"probe {script} ({version}) timed out after {timeout}s",
            stdout=_text(exc.stdout),
            stderr=_text(exc.stderr),
            timed_out=True,
        ) from None
    if result.returncode != 0:
        raise ProbeError(
            f"probe {script} ({version}) exited with {result.returncode}",
            returncode=result.returncode,
            stdout=result.stdout,
            stderr=result.stderr,
        )
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    try:
        value = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        raise ProbeError(
            f"probe {script} ({version}) printed no JSON on its last line",
            returncode=result.returncode,
            stdout=result.stdout,
            stderr=result.stderr,
        ) from None
    if not isinstance(value, dict):
        raise ProbeError(f"probe {script} ({version}) printed JSON that is not an object")
    return value


def _text(data: str | bytes | None) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data


def start_reference_server(
    version: str,
    host: str = "127.0.0.1",
    *,
    port: int,
    cache_dir: str | os.PathLike[str] | None = None,
    threads: int = 2,
    devices: Sequence[str] = ("CPU",),
    log_path: str | os.PathLike[str] | None = None,
    startup_timeout: float = 30.0,
    extra_env: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start the REAL reference rpc server (``ggml_backend_rpc_start_server``) and wait for it.

    Returns once ``host:port`` is listening (checked through ``/proc`` without connecting, so the
    single-client reference server sees no extra connection). ``cache_dir`` enables the hash
    cache (``SET_TENSOR_HASH``); it is created if missing. Output (banner, per-connection lines)
    goes to ``log_path`` if given, else is discarded. The server exits by itself when its parent
    process dies. Stop it with :func:`stop_process`. Raises ``RuntimeError`` if it exits during
    startup and ``TimeoutError`` if it does not listen within ``startup_timeout`` seconds.
    """
    argv, env = python_command(version, extra_env)
    argv = [*argv, str(PROBES_DIR / "rpc_server.py"), f"{host}:{port}", "--threads", str(threads)]
    argv += ["--devices", ",".join(devices)]
    if cache_dir is not None:
        argv += ["--cache-dir", str(Path(cache_dir).resolve())]
    log = open(log_path, "ab") if log_path is not None else None  # noqa: SIM115
    try:
        proc = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log if log is not None else subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
    finally:
        if log is not None:
            log.close()  # the child holds its own descriptor
    deadline = time.monotonic() + startup_timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(
                f"reference {version} server exited with {proc.returncode} during startup"
                + _log_tail(log_path)
            )
        if _is_listening(proc.pid, host, port):
            return proc
        if time.monotonic() > deadline:
            stop_process(proc)
            raise TimeoutError(
                f"reference {version} server not listening on {host}:{port} after "
                f"{startup_timeout}s" + _log_tail(log_path)
            )
        time.sleep(0.05)


def stop_process(proc: subprocess.Popen, timeout: float = 10.0) -> int | None:
    """Terminate one process we started (SIGTERM, then SIGKILL); return its exit status."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout)
    return proc.returncode


def _log_tail(log_path: str | os.PathLike[str] | None) -> str:
    if log_path is None:
        return ""
    try:
        text = Path(log_path).read_text(errors="replace")
    except OSError:
        return ""
    return "\n--- server log (tail) ---\n" + "\n".join(text.splitlines()[-20:])


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    try:
        for fd in os.scandir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(fd.path)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        pass
    return inodes


def _is_listening(pid: int, host: str, port: int) -> bool:
    """Whether process ``pid`` owns a socket listening on ``port`` (Linux ``/proc``)."""
    if not Path("/proc/net/tcp").exists():  # non-Linux fallback: plain connect
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return True
        except OSError:
            return False
    owned = _socket_inodes(pid)
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            # fields: sl local_address rem_address st ... uid timeout inode
            if len(fields) < 10 or fields[3] != "0A":  # 0A = TCP_LISTEN
                continue
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[9] in owned:
                return True
    return False
