"""`--device` with cuda in it: check the machine, then build the protocol devices."""

from __future__ import annotations

from rpcnet.compute.cuda.probe import CudaUnavailable, parse_device_spec


def make_cuda_devices(spec: str, capacity: int | None, threads: int | None) -> list:
    """Devices for a `--device` spec naming cuda (e.g. `cuda`, `cuda:0,cuda:1`, `cuda:0,cpu`).

    Raises CudaUnavailable (a ValueError: the CLI prints its one line and exits 2) when CuPy,
    the driver or the GPUs are missing, and ValueError for a malformed spec.
    """
    from rpcnet.compute.cuda.device import SERVING_READY, probe_devices

    wanted = parse_device_spec(spec)
    gpus = probe_devices([index for kind, index in wanted if kind == "cuda"])
    if not SERVING_READY:
        names = ", ".join(f"CUDA{g.index} ({g.name})" for g in gpus)
        raise CudaUnavailable(
            f"--device cuda: found {names}, but graph execution on cuda is not wired into the "
            "server yet (docs/gpu.md); serve --device cpu meanwhile"
        )
    raise NotImplementedError("cuda protocol devices")  # replaced when SERVING_READY flips
