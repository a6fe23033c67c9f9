"""Device arrays of the strict stand-in: NumPy arrays whose every use is an operation on the
current stream.

A ufunc, a NumPy function or an item assignment on them reads its array operands and writes
its `out=` (or the assigned-to array) on the calling thread's current stream, checked by the
timeline. One that makes a new array allocates device memory: refused while capturing. On a
capturing stream the operation is recorded into the graph instead of run (only operations
with every output given can be, as on a GPU).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from support.strict_cupy.api import StrictCupy


class _Pointer:
    """CuPy's MemoryPointer: an address in an allocation; `+ n` moves it."""

    def __init__(self, mem: Any, offset: int) -> None:
        self.mem = mem
        self.offset = offset
        self.ptr = int(mem.ptr) + offset

    def __add__(self, n: int) -> _Pointer:
        return _Pointer(self.mem, self.offset + int(n))


class StrictArray(np.ndarray):
    """A device array: `.data.ptr` is its address; it keeps its allocation (`_mem`) alive."""

    _mem: Any = None
    _owner: StrictCupy | None = None

    def __array_finalize__(self, obj: Any) -> None:
        self._mem = getattr(obj, "_mem", None)
        self._owner = getattr(obj, "_owner", None)

    @property
    def data(self) -> _Pointer:  # type: ignore[override]
        addr = int(self.__array_interface__["data"][0])
        return _Pointer(self._mem, addr - int(self._mem.ptr))

    # -- every computation goes through the owner --------------------------------------
    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        owner = _owner_of(inputs, kwargs.get("out"))
        fn = getattr(ufunc, method)
        return owner.compute(f"{ufunc.__name__}.{method}", fn, inputs, kwargs)

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        owner = _owner_of(args, kwargs.get("out"))
        return owner.compute(func.__name__, func, args, kwargs)

    def __setitem__(self, key: Any, value: Any) -> None:
        owner = self._owner
        assert owner is not None

        def assign(target_plain: np.ndarray, value_plain: Any) -> None:
            target_plain[key] = value_plain

        owner.assign(self, value, assign)

    def astype(self, dtype: Any, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        owner = self._owner
        assert owner is not None
        return owner.compute(
            "astype", lambda a: plain(a).astype(dtype, *args, **kwargs), [self], {}
        )

    def copy(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        owner = self._owner
        assert owner is not None
        return owner.compute("copy", lambda a: plain(a).copy(*args, **kwargs), [self], {})

    def get(self) -> np.ndarray:
        """To the host (CuPy's `get`): a read on the current stream, then a synchronize."""
        owner = self._owner
        assert owner is not None
        return owner.to_numpy(self)


def plain(a: Any) -> Any:
    return a.view(np.ndarray) if isinstance(a, StrictArray) else a


def _walk(obj: Any) -> Iterator[Any]:
    if isinstance(obj, list | tuple):
        for item in obj:
            yield from _walk(item)
    else:
        yield obj


def device_arrays(obj: Any) -> list[StrictArray]:
    return [a for a in _walk(obj) if isinstance(a, StrictArray)]


def unwrap(obj: Any) -> Any:
    if isinstance(obj, list):
        return [unwrap(x) for x in obj]
    if isinstance(obj, tuple):
        return tuple(unwrap(x) for x in obj)
    return plain(obj)


def _owner_of(args: Any, out: Any) -> StrictCupy:
    for a in [*device_arrays(args), *device_arrays(out)]:
        if a._owner is not None:
            return a._owner
    raise AssertionError("no device array among the operands")


def host_operands(args: Any) -> list[np.ndarray]:
    """NumPy arrays (host memory) mixed into device computations: CuPy refuses them."""
    return [
        a
        for a in _walk(args)
        if isinstance(a, np.ndarray) and not isinstance(a, StrictArray) and a.ndim > 0
    ]
