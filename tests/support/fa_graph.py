"""FLASH_ATTN_EXT cases: their sizes, and the node of an OpGraph with ggml's optional sources,
the mask and the attention sinks (which take the 5th source: a missing mask leaves a 0 there)."""

from __future__ import annotations

from support.opgraph import OpGraph, pack_params

FLASH_ATTN_EXT = 74
F32 = 0


def flash_attn_node(
    g: OpGraph,
    qkv: list[int],
    mask: int | None,
    sinks: int | None,
    out_ne: tuple[int, int, int, int],
    scale: float,
    max_bias: float,
    softcap: float,
) -> int:
    """The node over q, k, v (`qkv`): f32 [dv, n_head, n_q, n3], f32 precision requested (10)."""
    srcs = list(qkv)
    if mask is not None:
        srcs.append(mask)
    elif sinks is not None:
        srcs.append(0)
    if sinks is not None:
        srcs.append(sinks)
    params = pack_params(float(scale), float(max_bias), float(softcap), 10)
    return g.op(FLASH_ATTN_EXT, F32, out_ne, srcs, params=params)


#: a case's sizes and their defaults: K and V head sizes, query rows, KV positions, query and KV
#: heads, independent sequences (ne3), and the heads the mask holds (a divisor of n_head)
FA_DIMS = dict(dk=64, dv=64, n_q=2, n_kv=40, n_head=4, n_head_kv=2, n3=1, mask_heads=1)


def fa_dims(**given: int) -> tuple[int, ...]:
    """FA_DIMS' values in its order, those `given` in place of the defaults."""
    unknown = set(given) - set(FA_DIMS)
    if unknown:
        raise TypeError(f"not a size of a FLASH_ATTN_EXT case: {sorted(unknown)}")
    return tuple({**FA_DIMS, **given}.values())
