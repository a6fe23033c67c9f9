"""A MUL_MAT graph as a client sends it: three wire tensors in the client's buffers."""

from __future__ import annotations

from rpcnet import _native

F32, MUL_MAT, FLAG_COMPUTE = 0, 29, 16


def mul_mat_tensors(
    w_type: int,
    x_type: int,
    k: int,
    m: int,
    n: int,
    w_at: tuple[int, int],
    x_at: tuple[int, int],
    out_at: tuple[int, int],
) -> tuple[_native.RpcTensor, _native.RpcTensor, _native.RpcTensor]:
    """Weights [k, m] of `w_type` (id 1), activations [k, n] of `x_type` (id 2) and their f32
    product [m, n] (id 3), each placed at (buffer handle, address)."""
    w = _native.RpcTensor(id=1, type=w_type, buffer=w_at[0], data=w_at[1], ne=(k, m, 1, 1))
    x = _native.RpcTensor(id=2, type=x_type, buffer=x_at[0], data=x_at[1], ne=(k, n, 1, 1))
    out = _native.RpcTensor(
        id=3,
        type=F32,
        buffer=out_at[0],
        data=out_at[1],
        ne=(m, n, 1, 1),
        op=MUL_MAT,
        src=(1, 2),
        flags=FLAG_COMPUTE,
    )
    return w, x, out
