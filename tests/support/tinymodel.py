"""Write a tiny llama-architecture GGUF with random weights (runs under the HOST python).

Uses the PyPI ``gguf`` package. The model is small enough to load in well under a second, yet it
exercises the real llama graph (RMS norm, RoPE, GQA attention, SwiGLU FFN, output head), so it is
a cheap end-to-end workload for the reference client against rpcnet or the reference server::

    from support.tinymodel import write_tiny_llama
    path = write_tiny_llama(tmp_path / "tiny.gguf")            # f32 weights
    path = write_tiny_llama(tmp_path / "tiny16.gguf", dtype="f16")

or ``python tests/support/tinymodel.py OUT.gguf [--dtype f16] [--layers 2] ...``.

The tokenizer is a SentencePiece-style ("llama") vocabulary: ``<unk> <s> </s>``, the 256 byte
tokens ``<0x00>..<0xFF>`` (byte fallback) and filler pieces, which llama.cpp accepts. Token ids
for teacher forcing can be any ids in ``range(n_vocab)``.
"""

from __future__ import annotations

import argparse
import itertools
import string
from pathlib import Path

import numpy as np

# SentencePiece token types as stored in tokenizer.ggml.token_type
_NORMAL, _UNKNOWN, _CONTROL, _BYTE = 1, 2, 3, 6


def _vocab(n_vocab: int) -> tuple[list[str], list[float], list[int]]:
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [_UNKNOWN, _CONTROL, _CONTROL] + [_BYTE] * 256
    if n_vocab < len(tokens) + 1:
        raise ValueError(f"n_vocab must be at least {len(tokens) + 1}")
    letters = string.ascii_lowercase
    fillers = itertools.chain(
        ["\u2581"],
        ("\u2581" + c for c in letters),
        letters,
        ("\u2581" + a + b for a, b in itertools.product(letters, repeat=2)),
        (a + b for a, b in itertools.product(letters, repeat=2)),
        ("\u2581" + "".join(p) for p in itertools.product(letters, repeat=3)),
        ("".join(p) for p in itertools.product(letters, repeat=3)),  # up to 36816: 32000 fits
    )
    for piece in itertools.islice(fillers, n_vocab - len(tokens)):
        tokens.append(piece)
        types.append(_NORMAL)
    if len(tokens) != n_vocab:
        raise ValueError(f"n_vocab too large for the filler vocabulary ({len(tokens)})")
    scores = [0.0] * 259 + [-float(i) for i in range(n_vocab - 259)]
    return tokens, scores, types


def add_spm_vocab(writer, n_vocab: int) -> None:
    """The filler SentencePiece vocabulary and its special tokens, on a gguf.GGUFWriter."""
    tokens, scores, types = _vocab(n_vocab)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)


def write_tiny_llama(
    path: str | Path,
    *,
    n_vocab: int = 384,
    n_embd: int = 64,
    n_layer: int = 2,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int = 128,
    n_ctx: int = 512,
    dtype: str = "f32",
    seed: int = 0,
) -> Path:
    """Write the model to ``path`` and return it. ``dtype``: ``"f32"`` or ``"f16"`` matrices
    (norm weights stay f32, as llama.cpp's converters do)."""
    import gguf  # host-only dependency (pip install gguf)

    if n_embd % n_head or n_head % n_head_kv:
        raise ValueError("n_embd must divide by n_head and n_head by n_head_kv")
    mat_dtype = {"f32": np.float32, "f16": np.float16}[dtype]
    head_dim = n_embd // n_head
    rng = np.random.default_rng(seed)

    def mat(rows: int, cols: int) -> np.ndarray:
        # numpy (rows, cols) is ggml ne = [cols, rows]: y = W x maps cols -> rows
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(mat_dtype)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    path = Path(path)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("rpcnet-tiny-llama")
    writer.add_context_length(n_ctx)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(
        gguf.LlamaFileType.ALL_F32 if dtype == "f32" else gguf.LlamaFileType.MOSTLY_F16
    )

    add_spm_vocab(writer, n_vocab)

    writer.add_tensor("token_embd.weight", mat(n_vocab, n_embd))
    for i in range(n_layer):
        p = f"blk.{i}."
        writer.add_tensor(p + "attn_norm.weight", norm(n_embd))
        writer.add_tensor(p + "attn_q.weight", mat(n_embd, n_embd))
        writer.add_tensor(p + "attn_k.weight", mat(n_head_kv * head_dim, n_embd))
        writer.add_tensor(p + "attn_v.weight", mat(n_head_kv * head_dim, n_embd))
        writer.add_tensor(p + "attn_output.weight", mat(n_embd, n_embd))
        writer.add_tensor(p + "ffn_norm.weight", norm(n_embd))
        writer.add_tensor(p + "ffn_gate.weight", mat(n_ff, n_embd))
        writer.add_tensor(p + "ffn_up.weight", mat(n_ff, n_embd))
        writer.add_tensor(p + "ffn_down.weight", mat(n_embd, n_ff))
    writer.add_tensor("output_norm.weight", norm(n_embd))
    writer.add_tensor("output.weight", mat(n_vocab, n_embd))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description="write a tiny random llama GGUF")
    parser.add_argument("out", type=Path)
    parser.add_argument("--dtype", choices=["f32", "f16"], default="f32")
    parser.add_argument("--vocab", type=int, default=384)
    parser.add_argument("--embd", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--heads-kv", type=int, default=2)
    parser.add_argument("--ff", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    out = write_tiny_llama(
        args.out,
        n_vocab=args.vocab,
        n_embd=args.embd,
        n_layer=args.layers,
        n_head=args.heads,
        n_head_kv=args.heads_kv,
        n_ff=args.ff,
        dtype=args.dtype,
        seed=args.seed,
    )
    print(out)


if __name__ == "__main__":
    main()
