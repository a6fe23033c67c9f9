"""The cuda node group of ggml's unfused decode attention: K*Q, SOFT_MAX and V*softmax with the
permuting CONT after it, as one launch (attn_decode.cu) that also offers the attention
projection its input's q8_1 blocks. The rules for moving nodes are groups.py's."""

from __future__ import annotations

from typing import Any

from rpcnet.compute.cuda.kernels import common
from rpcnet.compute.cuda.kernels.groups import (
    _consumers,
    _members_movable,
    _outputs_clear,
    _readers,
)
from rpcnet.compute.kernels.kernel_table import NodeGroup, Step, group_finder
from rpcnet.compute.ops import Op
from rpcnet.compute.tensor import FLAG_OUTPUT, Tensor
from rpcnet.ggml_types import type_name

#: n_kv and head sizes the kernel holds in shared memory (launch_attention.AD_MAX_*)
_MAX_KV, _MAX_D = 4096, 512


def _parts(sm: Tensor, readers: dict[int, int], consumers: dict[int, list[Tensor]]) -> Any:
    """(kq, kqv, cont) around SOFT_MAX `sm` when they form a decode attention the kernel takes,
    each intermediate read once, else None."""
    from rpcnet.compute.cuda.kernels.attention import _soft_max_ok
    from rpcnet.compute.cuda.kernels.matmul import (
        _strided_cont_ok,
        _strided_matvec_ok,
    )

    kq = sm.src[0]
    if sm.op != Op.SOFT_MAX or kq is None or kq.op != Op.MUL_MAT or not _soft_max_ok(sm):
        return None
    users = consumers.get(sm.id, [])
    if len(users) != 1 or users[0].op != Op.MUL_MAT or users[0].src[1] is not sm:
        return None
    kqv = users[0]
    after = consumers.get(kqv.id, [])
    if len(after) != 1 or not after[0].src or after[0].src[0] is not kqv:
        return None
    conts = consumers.get(after[0].id, [])
    if len(conts) != 1 or not _strided_cont_ok(kqv, conts[0]):
        return None
    cont = conts[0]
    k, q, v = kq.src[0], kq.src[1], kqv.src[0]
    if k is None or q is None or v is None or not _strided_matvec_ok(kq):
        return None
    n_kv, n_q, n_head = kq.ne[0], kq.ne[1], kq.ne[2]
    ok = (
        k.type == v.type
        and k.type in (common.F32, common.F16, common.BF16)
        and v.nb[0] == k.nb[0]
        and kqv.ne == (v.ne[1], n_q, n_head, 1)
        and v.ne[0] == n_kv
        and v.ne[2] == k.ne[2]
        and n_kv <= _MAX_KV
        and max(k.ne[0], v.ne[1]) <= _MAX_D
        and q.nb[1] % 4 == 0
        and q.nb[2] % 4 == 0
        and all(readers.get(t.id, 0) == 1 for t in (kq, sm, kqv, after[0]))
        and not any(t.flags & FLAG_OUTPUT for t in (kq, sm, kqv))
    )
    return (kq, kqv, cont) if ok else None


def _unfused_attention(computed: list[Tensor], nodes: list[Tensor]) -> list[NodeGroup]:
    readers, consumers = _readers(nodes), _consumers(nodes)
    at = {id(n): i for i, n in enumerate(computed)}
    groups: list[NodeGroup] = []
    for sm in computed:
        parts = _parts(sm, readers, consumers)
        if parts is None or any(id(t) not in at for t in parts):
            continue
        kq, kqv, cont = parts
        members = sorted((kq, sm, kqv, cont), key=lambda t: at[id(t)])
        movable = _members_movable(members, computed, at)
        reads = [t for t in (*kq.src[:2], kqv.src[0], *sm.src[1:3]) if t is not None]
        if movable and _outputs_clear([cont], reads):
            groups.append(NodeGroup(tuple(members), _builder(kq, sm, kqv, cont)))
    return groups


def _builder(kq: Tensor, sm: Tensor, kqv: Tensor, cont: Tensor):  # noqa: ANN202
    def build() -> Step:
        from rpcnet.compute.cuda import launch_attention

        k_t, q_t, v_t = kq.src[0], kq.src[1], kqv.src[0]
        assert k_t is not None and q_t is not None and v_t is not None
        mask_t = sm.src[1] if len(sm.src) > 1 else None
        sinks_t = sm.src[2] if len(sm.src) > 2 else None
        be = common._backend(cont)
        n_kv, n_q, n_head = kq.ne[0], kq.ne[1], kq.ne[2]
        d, dv = k_t.ne[0], v_t.ne[1]
        kv_types = (type_name(k_t.type).upper(), type_name(v_t.type).upper())
        mask = None if mask_t is None else common._view(mask_t, (mask_t.ne[1], mask_t.ne[0]))
        sinks = None if sinks_t is None else common._view(sinks_t, (sinks_t.ne[0],))
        dst = common._view(cont, (n_q, n_head, dv))
        q8 = None
        request = None
        if dv % 32 == 0 and n_q <= 8:  # offer the projection after it its q8_1 blocks
            request, q8 = common.offer_quantized(be, cont, (32,), writes=4)  # the group's 4 nodes
        ptrs = (common._view(q_t), common._raw(k_t), common._raw(v_t), mask, sinks, dst)
        dims = (d, dv, n_q, n_kv, n_head, k_t.ne[2])
        strides = (
            q_t.nb[1] // 4,
            q_t.nb[2] // 4,
            k_t.nb[1],
            k_t.nb[2],
            v_t.nb[1],
            v_t.nb[2],
            0 if mask_t is None else mask_t.ne[0],
        )
        scale = sm.f32(0)

        def run() -> None:
            wanted = q8 if request is not None and request.block == 32 else None
            launch_attention.attn_decode(be, kv_types, (*ptrs, wanted), dims, strides, scale)

        return run

    return build


group_finder(common.CUDA)(_unfused_attention)
