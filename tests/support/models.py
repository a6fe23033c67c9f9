"""A zoo of tiny random GGUF models for end-to-end tests (runs under the HOST python + ``gguf``).

Every model is small (n_embd 64-256, 2 layers, vocab 384) and deterministic (fixed seeds),
yet it runs the real llama.cpp graph of its architecture:

=====================  ========  =====================================================
name                   arch      what it exercises
=====================  ========  =====================================================
``llama-gqa-f32``      llama     RMS norm, normal RoPE, GQA (4 heads / 2 KV), SwiGLU
``llama-mha-f16``      llama     MHA (4/4), f16 matrices
``llama-gqa-bf16``     llama     bf16 matrices
``qwen3-f32``          qwen3     NEOX RoPE, q/k RMS norms, head_dim != n_embd / n_head
``qwen3-f16``          qwen3     the same with f16 matrices
``qwen3moe-f32``       qwen3moe  4 experts, 2 used: MUL_MAT_ID, top-k routing, softmax
``bert-f32``           bert      embedding model: non-causal, LayerNorm, GELU, biases,
                                 position/token-type embeddings, MEAN pooling
``llama256-<q>``       llama     n_embd/n_ff multiples of 256, quantized by the REAL
                                 ``llama_model_quantize`` (``probes/quantize.py``):
                                 q8_0, q4_0, Q4_K_M, Q5_K_M, Q6_K, IQ4_XS
``qwen3moe256-Q4_K_M`` qwen3moe  quantized experts (MUL_MAT_ID on K-quants)
=====================  ========  =====================================================

Use :func:`ensure_model` (writes once into a cache directory, keyed by a digest of the spec)::

    from support.models import ZOO, ensure_model, tensor_types
    path = ensure_model(ZOO["qwen3-f32"], cache_dir)

Quantized variants need the reference env (``tools/refenv.sh``); the base f32 model is written
first and then quantized with default parameters (no imatrix: IQ4_XS does not need one).
``python tests/support/models.py DIR [NAME ...]`` writes models from the command line.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # ``python tests/support/models.py``
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from support.tinymodel import add_spm_vocab  # noqa: E402

#: gemma2's sliding window (tokens)
GEMMA2_WINDOW = 5

#: bump when the writers change in a way that changes the files
WRITER_VERSION = 2

#: ggml type names the quantizer is expected to produce for the big matrices of each ftype
QUANT_MAIN_TYPE = {
    "q8_0": "Q8_0",
    "q4_0": "Q4_0",
    "Q4_K_M": "Q4_K",
    "Q5_K_M": "Q5_K",
    "Q6_K": "Q6_K",
    "IQ4_XS": "IQ4_XS",
}


@dataclass(frozen=True)
class ModelSpec:
    name: str
    arch: str = "llama"  # llama | qwen3 | qwen3moe | bert | gemma2 | phi3
    dtype: str = "f32"  # f32 | f16 | bf16 (matrices; norms, biases, router stay f32)
    n_vocab: int = 384
    n_embd: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int | None = None  # None: n_embd // n_head
    n_ff: int = 128
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0
    n_ctx_train: int = 512
    seed: int = 0
    quant: str | None = None  # llama_ftype name for the real quantizer (base spec: ``base``)
    base: ModelSpec | None = None
    tags: tuple[str, ...] = field(default=())

    @property
    def embedding(self) -> bool:
        return self.arch == "bert"

    @property
    def dtype_class(self) -> str:
        """Tolerance class: ``f32``, ``f16`` (f16/bf16) or ``quant``."""
        if self.quant is not None:
            return "quant"
        return "f32" if self.dtype == "f32" else "f16"

    def digest(self) -> str:
        data = dataclasses.asdict(self)
        data["writer"] = WRITER_VERSION
        text = json.dumps(data, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:12]


def _llama256(quant: str | None, seed: int = 7) -> ModelSpec:
    base = ModelSpec(
        "llama256-f32", n_embd=256, n_head=4, n_head_kv=2, n_ff=512, n_vocab=384, seed=seed
    )
    if quant is None:
        return base
    return dataclasses.replace(base, name=f"llama256-{quant}", quant=quant, base=base)


_QWEN3MOE = ModelSpec(
    "qwen3moe-f32",
    arch="qwen3moe",
    n_embd=64,
    n_head=4,
    n_head_kv=2,
    n_ff=128,
    n_expert=4,
    n_expert_used=2,
    n_ff_exp=64,
    seed=6,
)
_QWEN3MOE_256 = dataclasses.replace(
    _QWEN3MOE, name="qwen3moe256-f32", n_embd=256, n_ff=256, n_ff_exp=256, seed=11
)

_SPECS = [
    ModelSpec("llama-gqa-f32", n_embd=128, n_head=4, n_head_kv=2, n_ff=256, seed=1),
    ModelSpec("llama-mha-f16", dtype="f16", n_embd=128, n_head=4, n_head_kv=4, n_ff=256, seed=2),
    ModelSpec("llama-gqa-bf16", dtype="bf16", seed=3),
    ModelSpec("qwen3-f32", arch="qwen3", n_embd=128, n_head=4, n_head_kv=2, head_dim=64, seed=4),
    ModelSpec("qwen3-f16", arch="qwen3", dtype="f16", n_embd=64, n_head=4, n_head_kv=2, seed=5),
    _QWEN3MOE,
    ModelSpec("bert-f32", arch="bert", n_embd=64, n_head=4, n_head_kv=4, n_ff=128, seed=8),
    *(_llama256(q) for q in QUANT_MAIN_TYPE),
    dataclasses.replace(
        _QWEN3MOE_256, name="qwen3moe256-Q4_K_M", quant="Q4_K_M", base=_QWEN3MOE_256
    ),
]

#: every model of the zoo by name
ZOO: dict[str, ModelSpec] = {spec.name: spec for spec in _SPECS}

#: The benchmarks' f16 llama family (32000-token vocabulary, 4096 context); each benchmark sets
#: its sizes with ``dataclasses.replace``.
BENCH_LLAMA = ModelSpec("bench", dtype="f16", n_vocab=32000, n_ctx_train=4096, seed=42)

#: The layer sizes of an n_embd 1024 llama (``ModelSpec`` and ``write_tiny_llama`` keywords):
#: matrices of MiBs; with a 16384-token vocabulary the output matrix is above the 10 MiB from
#: which a client names a tensor by its hash first.
LLAMA_1024 = {"n_embd": 1024, "n_head": 16, "n_head_kv": 4, "n_ff": 2816}


def harness_model(base: ModelSpec, name: str) -> ModelSpec:
    """A tiny model of ``base``'s family: for checking a benchmark's harness, not for numbers."""
    return dataclasses.replace(
        base, name=name, n_vocab=1024, n_embd=256, n_layer=2, n_head=4, n_head_kv=2, n_ff=512
    )


# --------------------------------------------------------------------------- writing


def _bf16_bits(a: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), round to nearest even."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return bits.astype(np.uint16)


class _Weights:
    def __init__(self, writer, spec: ModelSpec) -> None:
        self.writer = writer
        self.spec = spec
        self.rng = np.random.default_rng(spec.seed)

    def mat(self, name: str, *shape: int, scale: float = 1.0, f32: bool = False) -> None:
        """A matrix with numpy shape ``shape`` (ggml ne reversed), fan-in = the last dim."""
        data = self.rng.standard_normal(shape) * (scale / np.sqrt(shape[-1]))
        self._add(name, data.astype(np.float32), keep_f32=f32)

    def norm(self, name: str, n: int, gain: float = 1.0) -> None:
        data = gain * (1.0 + 0.1 * self.rng.standard_normal(n))
        self._add(name, data.astype(np.float32), True)

    def bias(self, name: str, n: int, scale: float = 0.05) -> None:
        self._add(name, (scale * self.rng.standard_normal(n)).astype(np.float32), True)

    def _add(self, name: str, data: np.ndarray, keep_f32: bool) -> None:
        import gguf

        dtype = "f32" if keep_f32 or data.ndim == 1 else self.spec.dtype
        if dtype == "f32":
            self.writer.add_tensor(name, data)
        elif dtype == "f16":
            self.writer.add_tensor(name, data.astype(np.float16))
        elif dtype == "bf16":
            bits = _bf16_bits(data)
            self.writer.add_tensor(
                name, bits, raw_shape=bits.shape, raw_dtype=gguf.GGMLQuantizationType.BF16
            )
        else:
            raise ValueError(f"unknown dtype {dtype!r}")


def _file_type(spec: ModelSpec):
    import gguf

    return {
        "f32": gguf.LlamaFileType.ALL_F32,
        "f16": gguf.LlamaFileType.MOSTLY_F16,
        "bf16": gguf.LlamaFileType.MOSTLY_BF16,
    }[spec.dtype]


def _add_wpm_vocab(writer, n_vocab: int) -> None:
    """BERT WordPiece vocabulary: [PAD]=0, [UNK]=100, [CLS]=101, [SEP]=102, [MASK]=103."""
    special = {0: "[PAD]", 100: "[UNK]", 101: "[CLS]", 102: "[SEP]", 103: "[MASK]"}
    tokens, types = [], []
    letters = "abcdefghijklmnopqrstuvwxyz"
    k = 0
    for i in range(n_vocab):
        if i in special:
            tokens.append(special[i])
            types.append(3)  # control
            continue
        a, b = divmod(k, 26)
        k += 1
        word = letters[b] if a == 0 else letters[(a - 1) % 26] + letters[b] + "x" * ((a - 1) // 26)
        tokens.append(word if i % 2 else "##" + word)
        types.append(1)
    if len(set(tokens)) != len(tokens):
        raise AssertionError("duplicate WPM tokens")
    writer.add_tokenizer_model("bert")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_unk_token_id(100)
    writer.add_bos_token_id(101)
    writer.add_sep_token_id(102)
    writer.add_pad_token_id(0)
    writer.add_mask_token_id(103)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(True)


def write_model(spec: ModelSpec, path: str | os.PathLike[str]) -> Path:
    """Write an unquantized model (``spec.quant`` must be None) to ``path``."""
    import gguf

    if spec.quant is not None:
        raise ValueError("quantized specs are produced by quantize_model()")
    head_dim = spec.head_dim or spec.n_embd // spec.n_head
    n_q, n_kv = spec.n_head * head_dim, spec.n_head_kv * head_dim
    path = Path(path)
    writer = gguf.GGUFWriter(str(path), spec.arch)
    writer.add_name(f"rpcnet-{spec.name}")
    writer.add_context_length(spec.n_ctx_train)
    writer.add_embedding_length(spec.n_embd)
    writer.add_block_count(spec.n_layer)
    writer.add_feed_forward_length(spec.n_ff)
    writer.add_head_count(spec.n_head)
    writer.add_head_count_kv(spec.n_head_kv)
    writer.add_file_type(_file_type(spec))
    writer.add_vocab_size(spec.n_vocab)
    if spec.arch == "bert":
        writer.add_layer_norm_eps(1e-12)
        writer.add_causal_attention(False)
        writer.add_pooling_type(gguf.PoolingType.MEAN)
        writer.add_token_type_count(2)
        _add_wpm_vocab(writer, spec.n_vocab)
    else:
        rms_eps = 1e-6 if spec.arch.startswith("qwen3") or spec.arch == "gemma2" else 1e-5
        writer.add_layer_norm_rms_eps(rms_eps)
        if spec.arch == "gemma2":
            writer.add_sliding_window(GEMMA2_WINDOW)  # < the 8 test tokens: the SWA mask matters
            writer.add_attn_logit_softcapping(50.0)
            writer.add_final_logit_softcapping(30.0)
        writer.add_rope_freq_base(1e6 if spec.arch.startswith("qwen3") else 1e4)
        if spec.head_dim is not None:
            writer.add_key_length(head_dim)
            writer.add_value_length(head_dim)
        else:
            writer.add_rope_dimension_count(head_dim)
        if spec.n_expert:
            writer.add_expert_count(spec.n_expert)
            writer.add_expert_used_count(spec.n_expert_used)
            writer.add_expert_feed_forward_length(spec.n_ff_exp)
        add_spm_vocab(writer, spec.n_vocab)

    w = _Weights(writer, spec)
    E, V = spec.n_embd, spec.n_vocab
    # rows ~ N(0, 1); gemma2's tied head wants the output scale (logits std ~2)
    w.mat("token_embd.weight", V, E, scale=2.0 if spec.arch == "gemma2" else np.sqrt(E))
    if spec.arch == "bert":
        w.mat("position_embd.weight", spec.n_ctx_train, E, scale=0.1 * np.sqrt(E), f32=True)
        w.mat("token_types.weight", 2, E, scale=0.1 * np.sqrt(E), f32=True)
        w.norm("token_embd_norm.weight", E)
        w.bias("token_embd_norm.bias", E)
    for i in range(spec.n_layer):
        p = f"blk.{i}."
        if spec.arch == "bert":
            for t, n in (("attn_q", n_q), ("attn_k", n_kv), ("attn_v", n_kv)):
                w.mat(p + t + ".weight", n, E)
                w.bias(p + t + ".bias", n)
            w.mat(p + "attn_output.weight", E, n_q)
            w.bias(p + "attn_output.bias", E)
            w.norm(p + "attn_output_norm.weight", E)
            w.bias(p + "attn_output_norm.bias", E)
            w.mat(p + "ffn_up.weight", spec.n_ff, E)
            w.bias(p + "ffn_up.bias", spec.n_ff)
            w.mat(p + "ffn_down.weight", E, spec.n_ff)
            w.bias(p + "ffn_down.bias", E)
            w.norm(p + "layer_output_norm.weight", E)
            w.bias(p + "layer_output_norm.bias", E)
            continue
        w.norm(p + "attn_norm.weight", E)
        if spec.arch == "phi3":  # fused QKV and gate|up (GLU over the halves of one matmul)
            w.mat(p + "attn_qkv.weight", n_q + 2 * n_kv, E)
            w.mat(p + "attn_output.weight", E, n_q)
            w.norm(p + "ffn_norm.weight", E)
            w.mat(p + "ffn_up.weight", 2 * spec.n_ff, E)
            w.mat(p + "ffn_down.weight", E, spec.n_ff)
            continue
        w.mat(p + "attn_q.weight", n_q, E)
        w.mat(p + "attn_k.weight", n_kv, E)
        w.mat(p + "attn_v.weight", n_kv, E)
        w.mat(p + "attn_output.weight", E, n_q)
        if spec.arch == "gemma2":
            # the residual starts as the (tied) output embedding of the input token: large post
            # norms keep the logits from peaking on that token
            w.norm(p + "post_attention_norm.weight", E, gain=16.0)
            w.norm(p + "post_ffw_norm.weight", E, gain=16.0)
        if spec.arch.startswith("qwen3"):
            w.norm(p + "attn_q_norm.weight", head_dim)
            w.norm(p + "attn_k_norm.weight", head_dim)
        w.norm(p + "ffn_norm.weight", E)
        if spec.n_expert:
            X, F = spec.n_expert, spec.n_ff_exp
            w.mat(p + "ffn_gate_inp.weight", X, E, scale=2.0, f32=True)
            w.mat(p + "ffn_gate_exps.weight", X, F, E)
            w.mat(p + "ffn_up_exps.weight", X, F, E)
            w.mat(p + "ffn_down_exps.weight", X, E, F)
        else:
            w.mat(p + "ffn_gate.weight", spec.n_ff, E)
            w.mat(p + "ffn_up.weight", spec.n_ff, E)
            w.mat(p + "ffn_down.weight", E, spec.n_ff)
    if spec.arch != "bert":
        w.norm("output_norm.weight", E)
    if spec.arch not in ("bert", "gemma2"):  # gemma2 ties the output head to token_embd
        w.mat("output.weight", V, E, scale=2.0)  # logits std ~2: fewer near-ties at the top

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def quantize_model(src: Path, dst: Path, ftype: str, version: str = "v8") -> dict:
    """Quantize ``src`` into ``dst`` with the REAL llama.cpp (reference env ``version``)."""
    from support import refenv

    tmp = dst.with_suffix(f".tmp{os.getpid()}")
    result = refenv.run_probe(
        version, "quantize", "--model", src, "--out", tmp, "--type", ftype, timeout=300
    )
    os.replace(tmp, dst)
    result["out"] = str(dst)
    return result


def ensure_model(spec: ModelSpec | str, cache_dir: str | os.PathLike[str]) -> Path:
    """Path of ``spec``'s GGUF in ``cache_dir``, writing (or quantizing) it on first use."""
    if isinstance(spec, str):
        spec = ZOO[spec]
    cache = Path(cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / f"{spec.name}-{spec.digest()}.gguf"
    if path.is_file():
        return path
    if spec.quant is None:
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        write_model(spec, tmp)
        os.replace(tmp, path)
    else:
        assert spec.base is not None
        quantize_model(ensure_model(spec.base, cache), path, spec.quant)
        main = QUANT_MAIN_TYPE.get(spec.quant)
        types = tensor_types(path)
        if main is not None and main not in types.values():
            raise AssertionError(f"quantizer produced no {main} tensor for {spec.name}: {types}")
    return path


def tensor_types(path: str | os.PathLike[str]) -> dict[str, str]:
    """``{tensor name: ggml type name}`` of a GGUF file (gguf.GGUFReader)."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    return {t.name: t.tensor_type.name for t in reader.tensors}


def type_summary(path: str | os.PathLike[str]) -> dict[str, int]:
    """How many tensors of each ggml type the file holds."""
    counts: dict[str, int] = {}
    for name in tensor_types(path).values():
        counts[name] = counts.get(name, 0) + 1
    return dict(sorted(counts.items()))


def ensure_all(cache_dir: str | os.PathLike[str], names: Iterable[str] | None = None) -> dict:
    return {name: ensure_model(ZOO[name], cache_dir) for name in (names or ZOO)}


def main() -> None:
    parser = argparse.ArgumentParser(description="write the rpcnet e2e model zoo")
    parser.add_argument("out", type=Path, help="cache directory")
    parser.add_argument("names", nargs="*", help=f"models (default all): {', '.join(ZOO)}")
    args = parser.parse_args()
    for name, path in ensure_all(args.out, args.names or None).items():
        print(f"{name:22s} {path}  {type_summary(path)}")


if __name__ == "__main__":
    main()
