"""cuda node groups of a decode step: products that share an input in one launch (attention's
Q, K and V), and the gate and up products with the GLU that consumes them.

A group runs where its first member stood; the other members move up to it. A member may move
only past nodes it does not depend on or disturb: none of the nodes it passes writes what the
member reads or writes, or reads what it writes (byte ranges, as ggml-alloc reuses memory).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from typing import Any

from rpcnet.compute.cuda.kernels import common
from rpcnet.compute.cuda.kernels.matmul import _mul_mat_ok, q8_1_input
from rpcnet.compute.kernels.kernel_table import NodeGroup, Step, group_finder
from rpcnet.compute.ops import VIEW_OPS, Glu, Op
from rpcnet.compute.tensor import FLAG_OUTPUT, Tensor


def _overlap(a: Tensor, b: Tensor) -> bool:
    return (
        a.buffer is not None
        and a.buffer is b.buffer
        and a.offset < b.offset + b.nbytes
        and b.offset < a.offset + a.nbytes
    )


def _reads(node: Tensor, inside: Iterable[Tensor]) -> list[Tensor]:
    """What `node` reads from outside its group (sources made by members are not read)."""
    made = {id(m) for m in inside}
    return [s for s in node.src if s is not None and id(s) not in made]


def _may_move(member: Tensor, passed: list[Tensor], group: list[Tensor]) -> bool:
    """Whether `member` may run before the nodes `passed` (which stood between the group's
    first member and it)."""
    reads = _reads(member, group)
    for n in passed:
        n_reads = [s for s in n.src if s is not None]
        if _overlap(n, member) or any(_overlap(n, r) for r in reads):
            return False
        if any(_overlap(r, member) for r in n_reads):
            return False
    return True


def _members_movable(members: list[Tensor], computed: list[Tensor], at: dict[int, int]) -> bool:
    """Whether every member after the first (`members` in plan order, `at` their positions in
    `computed`) may move up to the first one's place."""
    first = at[id(members[0])]
    return all(
        _may_move(
            m,
            [n for n in computed[first + 1 : at[id(m)]] if all(n is not x for x in members)],
            members,
        )
        for m in members[1:]
    )


def _outputs_clear(outputs: list[Tensor], reads: list[Tensor]) -> bool:
    """Whether the group's written outputs overlap neither each other nor what the launch
    reads: its blocks run in no order, so one block's write must not reach another's input."""
    for i, out in enumerate(outputs):
        if any(_overlap(out, r) for r in reads) or any(_overlap(out, o) for o in outputs[i + 1 :]):
            return False
    return True


def _launch_reads(products: list[Tensor], wt: str) -> list[Tensor]:
    """What a launch of `products` reads from memory: the weights, and their input unless the
    weights are quantized (the launch then reads the input's q8_1 blocks in the scratch)."""
    reads = [p.src[0] for p in products if p.src[0] is not None]
    y = products[0].src[1]
    if wt in _float_types() and y is not None:
        reads.append(y)
    return reads


def _decode_product(node: Tensor) -> str | None:
    """The weight type of a decode product one group launch can take, else None."""
    if node.op != Op.MUL_MAT or not _mul_mat_ok(node) or node.ne[1] > common.MATVEC_MAX_COLS:
        return None
    return common._weight_type(node.src[0])  # type: ignore[arg-type]


def _same_input_products(computed: list[Tensor], nodes: list[Tensor]) -> list[NodeGroup]:
    """Runs of 2 or 3 decode products of one input with weights of one type and row length."""
    from rpcnet.compute.cuda.launch_fused import GROUP_MAX

    groups: list[NodeGroup] = []
    taken: set[int] = set()
    for i, first in enumerate(computed):
        wt = _decode_product(first) if id(first) not in taken else None
        if wt is None:
            continue
        y, k = first.src[1], first.src[0].ne[0]  # type: ignore[union-attr]
        members, last = [first], i
        for j in range(i + 1, len(computed)):
            other = computed[j]
            if len(members) == GROUP_MAX:
                break
            if id(other) in taken or len(other.src) < 2:
                continue
            if other.op != Op.MUL_MAT or other.src[1] is not y or _decode_product(other) != wt:
                continue
            if other.src[0].ne[0] != k:  # type: ignore[union-attr]
                continue
            passed = [n for n in computed[i + 1 : j] if all(n is not m for m in members)]
            candidate = [*members, other]
            clear = _outputs_clear(candidate, _launch_reads(candidate, wt))
            if clear and _may_move(other, passed, candidate):
                members.append(other)
                last = j
        if len(members) > 1 and last > i:
            taken.update(id(m) for m in members)
            groups.append(NodeGroup(tuple(members), _group_builder(tuple(members), wt)))
    return groups


def _group_builder(members: tuple[Tensor, ...], wt: str):  # noqa: ANN202
    def build() -> Step:
        first = members[0]
        y_t = first.src[1]
        assert y_t is not None
        be, launch_fused = common._backend(first), _fused_module()
        k, n = first.src[0].ne[0], y_t.ne[1]  # type: ignore[union-attr]
        weights = [common._raw(m.src[0]) for m in members]  # type: ignore[arg-type]
        dsts = [common._view(m, (n, m.ne[0])) for m in members]
        rows = [m.ne[0] for m in members]
        y = common._view(y_t, (n, k))
        yq, quantized = (None, False)
        if wt not in _float_types():
            yq, quantized = q8_1_input(be, y_t, wt, k, n)

        def run() -> None:
            launch_fused.matvec_group(be, wt, weights, y, dsts, k, rows, n, yq, quantized)

        return run

    return build


def _two_source_nodes(computed: list[Tensor], op: int) -> Iterator[tuple[Tensor, Tensor, Tensor]]:
    """(node, first source, second source) of each node of `op` with two sources."""
    for n in computed:
        if n.op == op and len(n.src) >= 2 and n.src[0] is not None and n.src[1] is not None:
            yield n, n.src[0], n.src[1]


def _glu_products(computed: list[Tensor], nodes: list[Tensor]) -> list[NodeGroup]:
    """A GLU of two sources, each a decode product of the same input read by nothing else."""
    readers = _readers(nodes)
    at = {id(n): i for i, n in enumerate(computed)}
    groups: list[NodeGroup] = []
    for g, gate, up in _two_source_nodes(computed, Op.GLU):
        if g.i32(0) not in common._GLU_IDS or g.i32(0) == Glu.SWIGLU_OAI or g.i32(1) != 0:
            continue
        if (
            id(gate) not in at
            or id(up) not in at
            or g.type != common.F32
            or not common._contiguous(g)
        ):
            continue
        wt = _decode_product(gate)
        if wt is None or _decode_product(up) != wt or gate.src[1] is not up.src[1]:
            continue
        if gate.ne != up.ne or gate.ne != g.ne or gate.src[0].ne != up.src[0].ne:  # type: ignore[union-attr]
            continue
        if any(readers.get(p.id, 0) != 1 or p.flags & FLAG_OUTPUT for p in (gate, up)):
            continue
        members = sorted((gate, up, g), key=lambda t: at[id(t)])
        ok = _members_movable(members, computed, at)
        if ok and _outputs_clear([g], _launch_reads([gate, up], wt)):
            groups.append(NodeGroup(tuple(members), _glu_builder(gate, up, g, wt)))
    return groups


def _glu_builder(gate: Tensor, up: Tensor, g: Tensor, wt: str):  # noqa: ANN202
    def build() -> Step:
        y_t = gate.src[1]
        assert y_t is not None
        be, launch_fused = common._backend(g), _fused_module()
        k, m, n = gate.src[0].ne[0], gate.ne[0], y_t.ne[1]  # type: ignore[union-attr]
        wg, wu = common._raw(gate.src[0]), common._raw(up.src[0])  # type: ignore[arg-type]
        y, dst = common._view(y_t, (n, k)), common._view(g, (n, m))
        op = common._GLU_IDS[Glu(g.i32(0))]
        yq, quantized = (None, False)
        if wt not in _float_types():
            yq, quantized = q8_1_input(be, y_t, wt, k, n)
        offer = _offer_glu_blocks(be, g, m, n)

        def run() -> None:
            q8 = None
            if offer is not None and offer[0].block is not None:
                request, blocks, counters = offer
                q8 = (blocks, request.block, counters)
            launch_fused.matvec_glu(
                be, wt, wg, wu, y, dst, k, m, n, op, 1.702, 7.0, yq, quantized, q8
            )

        return run

    return build


def _offer_glu_blocks(be: Any, g: Tensor, m: int, n: int) -> tuple[Any, Any, Any] | None:
    """Offer the product after the GLU (the down projection) its input's blocks, quantized by
    the GLU launch as its groups complete: (request, blocks, counters), or None. The blocks
    have their own scratch: the launch still reads its own input's q8_1 blocks."""
    if m % 32:
        return None
    from rpcnet.compute.cuda.kernels.common import offer_quantized

    counters = be.scratch("glu_counters", 4 * n * (m // 32), zeroed=True)
    if counters is None:
        return None
    blocks_sizes = (32, 256) if m % 256 == 0 else (32,)
    request, blocks = offer_quantized(be, g, blocks_sizes, writes=3, kind="q8_1_glu")
    return request, blocks, counters


def _readers(nodes: list[Tensor]) -> dict[int, int]:
    readers: dict[int, int] = {}
    for n in nodes:
        for src in n.src:
            if src is not None:
                readers[src.id] = readers.get(src.id, 0) + 1
    return readers


def _roped_product(rope: Tensor, readers: dict[int, int]) -> Tensor | None:
    """The decode product whose rows `rope` rotates as whole heads, when nothing else reads the
    product (so it need never be written), else None."""
    from rpcnet.compute.cuda.kernels.elementwise import _ROPE_NEOX, _ROPE_NORMAL, _rope_ok
    from rpcnet.compute.kernels.rope import RopeParams

    x = rope.src[0]
    if rope.op != Op.ROPE or x is None or not _rope_ok(rope) or x.op not in VIEW_OPS:
        return None
    mm = x.src[0] if x.src else None
    if mm is None or mm.op != Op.MUL_MAT or _decode_product(mm) is None:
        return None
    p = RopeParams(rope)
    return (
        mm
        if (
            p.mode in (_ROPE_NORMAL, _ROPE_NEOX)
            and p.n_dims == x.ne[0]
            and x.offset == mm.offset
            and x.ne[0] * x.ne[1] == mm.ne[0]
            and x.ne[2] == mm.ne[1]
            and readers.get(mm.id, 0) == 1
            and readers.get(x.id, 0) == 1
            and not mm.flags & FLAG_OUTPUT
            and not x.flags & FLAG_OUTPUT
        )
        else None
    )


def _consumers(nodes: list[Tensor]) -> dict[int, list[Tensor]]:
    out: dict[int, list[Tensor]] = {}
    for n in nodes:
        for src in n.src:
            if src is not None:
                out.setdefault(src.id, []).append(n)
    return out


def _cache_store(t: Tensor, consumers: dict[int, list[Tensor]]) -> Tensor | None:
    """The SET_ROWS that is the only reader of `t` (through views each read once), copying it
    into a float cache in a form the product can write itself, else None."""
    from rpcnet.compute.cuda.kernels.rows import _set_rows_ok

    cur = t
    while True:
        readers = consumers.get(cur.id, [])
        if len(readers) != 1 or cur.flags & FLAG_OUTPUT:
            return None
        nxt = readers[0]
        if nxt.op in VIEW_OPS and nxt.src and nxt.src[0] is cur:
            cur = nxt
            continue
        ok = (
            nxt.op == Op.SET_ROWS
            and nxt.src[0] is cur
            and _set_rows_ok(nxt)
            and nxt.type in (common.F32, common.F16, common.BF16)
            and common._contiguous(cur)
            and cur.offset == t.offset
            and cur.nelements == t.nelements
        )
        return nxt if ok else None


def _row_store(s: Tensor):  # noqa: ANN202
    """The launch's RowStore for SET_ROWS `s` (at build time)."""
    from rpcnet.compute.cuda import launch_fused
    from rpcnet.ggml_types import type_name

    src, ids = s.src[0], s.src[1]
    assert src is not None and ids is not None
    return launch_fused.RowStore(
        common._raw(s),
        common._view(ids, (ids.ne[0],)),
        type_name(s.type).upper(),
        src.ne[0],
        s.nb[1],
        s.ne[1],
    )


def _v_type_fits(qk_type: str | None, v_type: str | None) -> bool:
    from rpcnet.compute.cuda import sources

    return v_type is not None and (v_type == qk_type or (qk_type, v_type) in sources.QKV_MIXES)


def _same_rope(a: Tensor, b: Tensor) -> bool:
    return (
        a.op_params == b.op_params
        and all(x is y for x, y in zip(a.src[1:3], b.src[1:3], strict=False))
        and len(a.src) == len(b.src)
    )


def _qkv_with_rope(computed: list[Tensor], nodes: list[Tensor]) -> list[NodeGroup]:
    """Q and K products rotated by the same RoPE, and a V product of the same input: one launch
    that writes Q and K rotated (the products themselves are never written)."""
    readers = _readers(nodes)
    at = {id(n): i for i, n in enumerate(computed)}
    roped: dict[int, list[tuple[Tensor, Tensor]]] = {}  # id(input) -> [(product, rope)]
    for r in computed:
        mm = _roped_product(r, readers)
        if mm is not None and id(mm) in at:
            roped.setdefault(id(mm.src[1]), []).append((mm, r))
    groups: list[NodeGroup] = []
    for pairs in roped.values():
        if len(pairs) != 2:
            continue
        (mq, rq), (mk, rk) = pairs
        wt = _decode_product(mq)
        y = mq.src[1]
        assert y is not None and mq.src[0] is not None
        k = mq.src[0].ne[0]
        if _decode_product(mk) != wt or not _same_rope(rq, rk):
            continue
        v = next(
            (
                n
                for n in computed
                if n is not mq
                and n is not mk
                and n.op == Op.MUL_MAT
                and len(n.src) > 1
                and n.src[1] is y
                and _v_type_fits(wt, _decode_product(n))
                and n.src[0] is not None
                and n.src[0].ne[0] == k
                and n.ne[0] % 2 == 0
            ),
            None,
        )
        if v is None or wt is None:
            continue
        consumers = _consumers(nodes)
        sk, sv = _cache_store(rk, consumers), _cache_store(v, consumers)
        stores = [x for x in (sk, sv) if x is not None and id(x) in at]
        sk, sv = (sk if sk in stores else None), (sv if sv in stores else None)
        members = sorted((mq, rq, mk, rk, v, *stores), key=lambda t: at[id(t)])
        movable = _members_movable(members, computed, at)
        rope_reads = [t for t in rq.src[1:3] if t is not None]
        store_reads = [t for x in stores for t in x.src[1:2] if t is not None]
        reads = [*_launch_reads([mq, mk, v], wt), *rope_reads, *store_reads]
        written = [rq, rk if sk is None else sk, v if sv is None else sv]
        if movable and _outputs_clear(written, reads):
            build = _qkv_rope_builder(mq, rq, mk, rk, v, wt, (sk, sv))
            groups.append(NodeGroup(tuple(members), build))
    return groups


def _qkv_rope_builder(  # noqa: ANN202
    mq: Tensor,
    rq: Tensor,
    mk: Tensor,
    rk: Tensor,
    v: Tensor,
    wt: str,
    cache_stores: tuple[Tensor | None, Tensor | None],
):
    def build() -> Step:
        from rpcnet.compute.kernels.rope import RopeParams, corr_dims, rope_mscale

        y_t = mq.src[1]
        assert y_t is not None
        be, launch_fused = common._backend(v), _fused_module()
        k, n = mq.src[0].ne[0], y_t.ne[1]  # type: ignore[union-attr]
        products = (mq, mk, v)
        weights = [common._raw(m.src[0]) for m in products]  # type: ignore[arg-type]
        dsts = [common._view(out, (n, m.ne[0])) for out, m in ((rq, mq), (rk, mk), (v, v))]
        rows = [m.ne[0] for m in products]
        pos_t, freq_t = rq.src[1], rq.src[2] if len(rq.src) > 2 else None
        assert pos_t is not None
        p = RopeParams(rq)
        lo, hi = corr_dims(p.n_dims, p.n_ctx_orig, p.freq_base, p.beta_fast, p.beta_slow)
        rope = launch_fused.RopeArgs(
            common._view(pos_t, (pos_t.ne[0],)),
            p.n_dims,
            p.mode,
            p.freq_base,
            p.freq_scale,
            p.ext_factor,
            float(rope_mscale(p)),
            (float(lo), float(hi)),
            None if freq_t is None else common._view(freq_t, (freq_t.ne[0],)),
        )
        y = common._view(y_t, (n, k))
        yq, quantized = (None, False)
        if wt not in _float_types():
            yq, quantized = q8_1_input(be, y_t, wt, k, n)

        stores = tuple(None if x is None else _row_store(x) for x in cache_stores)
        v_type = common._weight_type(v.src[0])  # type: ignore[arg-type]

        def run() -> None:
            launch_fused.matvec_qkv_rope(
                be, wt, weights, y, dsts, k, rows, n, rope, yq, quantized, stores, v_type
            )

        return run

    return build


def _single_row(t: Tensor) -> bool:
    return t.ne[1] * t.ne[2] * t.ne[3] == 1


def _row_of_one(g: Tensor, readers: dict[int, int]) -> Tensor | None:
    """The source of a GET_ROWS that picks the only row of a one-row f32 tensor (a decode
    step's last layer keeping its one output row), read by nothing else: the GET_ROWS is that
    source itself. (An id other than 0 has no row to name; it gets the row there is.)"""
    src, ids = (g.src[0], g.src[1]) if len(g.src) > 1 else (None, None)
    if g.op != Op.GET_ROWS or src is None or ids is None or ids.nelements != 1:
        return None
    ok = (
        src.type == common.F32
        and g.type == common.F32
        and _single_row(src)
        and g.ne == src.ne
        and common._contiguous(src)
        and common._contiguous(g)
        and readers.get(g.id, 0) == 1
        and not g.flags & FLAG_OUTPUT
    )
    return src if ok else None


def _output_row_products(computed: list[Tensor], nodes: list[Tensor]) -> list[NodeGroup]:
    """ADD(GET_ROWS(product), GET_ROWS(residual)) of one-row tensors: the product with the
    residual added as it writes (the GET_ROWS pick the only row there is)."""
    from rpcnet.compute.cuda.kernels.matmul import _mul_mat_step

    readers = _readers(nodes)
    at = {id(n): i for i, n in enumerate(computed)}
    groups: list[NodeGroup] = []
    for add, g1, g2 in _two_source_nodes(computed, Op.ADD):
        mm, res = _row_of_one(g1, readers), _row_of_one(g2, readers)
        if mm is None or res is None or mm.op != Op.MUL_MAT:
            mm, res, g1, g2 = res, mm, g2, g1  # the product may be either operand
        if mm is None or res is None or mm.op != Op.MUL_MAT or readers.get(mm.id, 0) != 1:
            continue
        if any(id(t) not in at for t in (mm, g1, g2)) or mm.flags & FLAG_OUTPUT:
            continue
        shaped = all(
            t.type == common.F32 and common._contiguous(t) and t.ne == mm.ne for t in (add, res)
        )
        if not (shaped and _mul_mat_ok(mm) and mm.ne[1] <= common.MATVEC_CHUNKED_MAX):
            continue
        members = sorted((mm, g1, g2, add), key=lambda t: at[id(t)])
        movable = _members_movable(members, computed, at)
        reads = [*_launch_reads([mm], _decode_product(mm) or "F32"), res]
        if movable and _outputs_clear([add], reads):
            build = functools.partial(_mul_mat_step, mm, add, res)
            groups.append(NodeGroup(tuple(members), build))
    return groups


def _fused_module():  # noqa: ANN202
    from rpcnet.compute.cuda import launch_fused  # at build time only

    return launch_fused


def _float_types() -> dict[str, str]:
    from rpcnet.compute.cuda import sources

    return sources.FLOAT_TYPES


group_finder(common.CUDA)(_qkv_with_rope)
group_finder(common.CUDA)(_output_row_products)
group_finder(common.CUDA)(_glu_products)
group_finder(common.CUDA)(_same_input_products)
