"""Sans-I/O codec and checks of the ggml RPC protocol (rpcnet's native core, built from rust/src).

Integers are Python ints; arguments typed ``int`` for wire fields must fit their unsigned wire
width (u64 unless noted) or ``OverflowError`` is raised. ``Buffer`` arguments accept any
C-contiguous object exporting the buffer protocol (bytes, bytearray, memoryview, numpy arrays),
read-only ones included.
"""

import sys
from collections.abc import Mapping
from typing import Final, TypeAlias, final

if sys.version_info >= (3, 12):
    from collections.abc import Buffer
else:
    from typing_extensions import Buffer

import numpy as np

# numpy declares ndarray.__buffer__ only for Python >= 3.12; arrays export the buffer protocol on
# every version.
_ArrayBuffer: TypeAlias = Buffer | np.ndarray

__all__ = [
    "PROTO_V8",
    "PROTO_V7",
    "RPC_TENSOR_SIZE",
    "MAX_CHUNK",
    "GGML_TYPE_COUNT",
    "RDMA_CAPS_SIZE",
    "RDMA_SYSFS_ROOT",
    "NativeError",
    "FrameError",
    "TensorError",
    "GraphError",
    "RdmaError",
    "RpcTensor",
    "Graph",
    "Fnv1a64",
    "RdmaGid",
    "RdmaPort",
    "RdmaEnv",
    "RdmaSelection",
    "command_name",
    "check_header",
    "request_size",
    "response_size",
    "type_info",
    "type_table",
    "tensor_nbytes",
    "nelements",
    "check_tensor_in_buffer",
    "check_region",
    "check_memset",
    "check_region_2d",
    "chunk_plan",
    "decode_tensor",
    "decode_tensors",
    "decode_graph",
    "fnv1a64",
    "matmul_quant",
    "matmul_quant_supports",
    "matmul_quant_block",
    "matmul_activation_block",
    "set_portable_kernels",
    "kernels_simd",
    "set_avx512_kernels",
    "NativeStep",
    "pool_rest",
    "run_steps",
    "run_joint",
    "same_weights",
    "native_ops_portable",
    "flash_attn_ext_step",
    "rms_norm_step",
    "rope_step",
    "swiglu_step",
    "set_rows_step",
    "get_rows_step",
    "copy_step",
    "binary_step",
    "soft_max_step",
    "mul_mat_step",
    "mul_mat_id_step",
    "argsort_step",
    "sum_rows_step",
    "clamp_step",
    "scale_step",
    "tanh_step",
    "gelu_step",
    "geglu_step",
    "rdma_scan",
    "rdma_env",
    "rdma_resolve",
    "rdma_target_gid",
    "rdma_format_gid",
    "rdma_parse_gid",
    "rdma_encode_caps",
    "rdma_decode_caps",
]

PROTO_V8: Final[int]  # 8
PROTO_V7: Final[int]  # 7
RPC_TENSOR_SIZE: Final[int]  # 296
MAX_CHUNK: Final[int]  # 1 << 30
GGML_TYPE_COUNT: Final[int]  # 43

class NativeError(Exception):
    """Base class of every error raised by rpcnet._native."""

class FrameError(NativeError):
    """Bad request header."""

    cmd: int
    size: int
    reason: str

class TensorError(NativeError):
    """Bad rpc_tensor, type, size computation or region."""

    reason: str

class GraphError(NativeError):
    """Malformed GRAPH_COMPUTE payload."""

    reason: str

# --- framing (spec §1.2, §3, §14); proto must be 7 or 8, else ValueError ---------------------

def command_name(proto: int, cmd: int) -> str:
    """The command's name ("SET_TENSOR", ...) in the dialect, else "UNKNOWN(<cmd>)"."""

def check_header(proto: int, cmd: int, size: int, max_data: int, max_graph: int) -> None:
    """Validate a request header before reading the payload; FrameError on failure.

    Rejects unknown commands (>= RPC_CMD_NONE: 23 in v8, 18 in v7), fixed-size commands with
    another size, SET_TENSOR < 305, SET_TENSOR_2D < 328, GRAPH_COMPUTE < 16 (v8) / < 8 (v7),
    SET_TENSOR / SET_TENSOR_2D above max_data and GRAPH_COMPUTE above max_graph. HELLO (24 bytes)
    passes; "first and only once" is the caller's rule.
    """

def request_size(proto: int, cmd: int) -> int | None:
    """Fixed request payload size, None if variable. FrameError for an unknown command."""

def response_size(proto: int, cmd: int) -> int | None:
    """Fixed response payload size; None = no response; -1 = variable (GET_TENSOR, GET_TENSOR_2D).

    FrameError for an unknown command.
    """

# --- ggml types (spec Appendix A, §5.1) ------------------------------------------------------

def type_info(type_id: int) -> tuple[str, int, int, bool]:
    """(name, block_size, type_size, is_quantized); TensorError for ids >= 43 or removed ids."""

def type_table() -> list[tuple[int, str, int, int, bool]]:
    """Every type id 0..42 as (id, name, block_size, type_size, is_quantized); block_size 0 marks
    a removed id."""

def tensor_nbytes(
    type_id: int, ne: tuple[int, int, int, int], nb: tuple[int, int, int, int]
) -> int:
    """ggml_nbytes with u64 overflow checks; 0 if any ne is 0. TensorError on bad type/overflow."""

def nelements(ne: tuple[int, ...] | list[int]) -> int:
    """Product of ne; TensorError past i64::MAX."""

# --- rpc_tensor (spec §4) --------------------------------------------------------------------

@final
class RpcTensor:
    """One 296-byte rpc_tensor. Immutable, hashable, compared by value (all 296 bytes)."""

    id: Final[int]
    type: Final[int]
    buffer: Final[int]
    ne: Final[tuple[int, int, int, int]]
    nb: Final[tuple[int, int, int, int]]
    op: Final[int]
    op_params: Final[bytes]
    """The 64 raw bytes."""
    flags: Final[int]
    """i32."""
    src: Final[tuple[int, int, int, int, int, int, int, int, int, int]]
    view_src: Final[int]
    view_offs: Final[int]
    data: Final[int]
    name: Final[str]
    """Bytes up to the first NUL, decoded as UTF-8 with replacement."""
    use_count: Final[int]
    """i32."""
    def __new__(
        cls,
        *,
        id: int = 0,
        type: int = 0,
        buffer: int = 0,
        ne: tuple[int, int, int, int] = ...,  # (1, 1, 1, 1)
        nb: tuple[int, int, int, int] | None = None,
        op: int = 0,
        op_params: Buffer | None = None,
        flags: int = 0,
        src: tuple[int, ...] | list[int] = ...,  # ()
        view_src: int = 0,
        view_offs: int = 0,
        data: int = 0,
        name: str = "",
        use_count: int = 0,
    ) -> RpcTensor:
        """Keyword-only. ne/nb/type/op are u32, flags/use_count i32.

        nb None => contiguous strides of the type (TensorError for an invalid type or a stride
        beyond u32). op_params is zero-padded to 64 bytes and src to 10 ids (ValueError when
        longer); name must be at most 63 UTF-8 bytes without NUL (ValueError).
        """
    def to_bytes(self) -> bytes:
        """The exact 296-byte encoding (decode_tensor(t.to_bytes()) == t)."""
    def nbytes(self) -> int:
        """tensor_nbytes(self.type, self.ne, self.nb)."""
    def nelements(self) -> int: ...
    def op_param_i32(self, i: int) -> int:
        """op_params slot i (0..15) as i32; IndexError outside."""
    def op_param_f32(self, i: int) -> float:
        """op_params slot i (0..15) as f32 bits; IndexError outside."""
    def __eq__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...

def decode_tensor(data: Buffer, offset: int = 0) -> RpcTensor:
    """Decode 296 bytes at offset (no field validation); TensorError if fewer remain."""

def decode_tensors(data: Buffer, offset: int, count: int) -> list[RpcTensor]:
    """Decode count consecutive tensors at offset; TensorError if the buffer is too short."""

# --- graphs (spec §8.1, §14) -----------------------------------------------------------------

@final
class Graph:
    """A decoded GRAPH_COMPUTE payload (lists are built once; treat them as read-only)."""

    device: Final[int]
    uid: Final[int]
    """0 for v7."""
    nodes: Final[list[int]]
    """Node tensor ids in execution order."""
    tensors: Final[list[RpcTensor]]
    def walk(
        self, regions: dict[int, tuple[int, int]], check_empty: bool
    ) -> list[tuple[int, tuple[int | None, ...]]]:
        """Check every tensor the nodes reach through src and view_src (the first tensor sent
        with an id wins): ids sent, no cycle, no node listed twice, valid type and size, and a
        tensor whose buffer handle is in `regions` (handle -> (base, size)) inside that buffer
        (an empty one only when `check_empty`). Returns the nodes to run, in order (id 0
        skipped): (index into `tensors`, the indices of its 10 source slots, None where empty).
        GraphError for ids, cycles and repeated nodes; TensorError for a bad tensor."""

def decode_graph(proto: int, payload: Buffer) -> Graph:
    """Decode a GRAPH_COMPUTE payload; GraphError when truncated. Trailing bytes are ignored."""

# --- region checks (overflow-checked u64; TensorError with a reason on failure) ---------------

def check_tensor_in_buffer(data: int, nbytes: int, base: int, size: int) -> None:
    """Spec §5.1 rule 5: data >= base and data + nbytes <= base + size, without overflow."""

def check_region(
    base: int, size: int, data: int, offset: int, length: int, tensor_nbytes: int
) -> None:
    """SET/GET_TENSOR, SET_TENSOR_HASH (spec §5.2); also offset + length <= tensor_nbytes."""

def check_memset(
    base: int, size: int, data: int, offset: int, length: int, tensor_nbytes: int
) -> None:
    """MEMSET_TENSOR checks in the order of spec §7.14."""

def check_region_2d(
    base: int,
    size: int,
    data: int,
    tensor_nbytes: int,
    offset: int,
    row: int,
    n_copies: int,
    stride: int,
    payload: int | None,
) -> None:
    """SET_TENSOR_2D (payload = request size - 328) or GET_TENSOR_2D (payload None).

    Spec §7.16 items 2 and 4-6, §7.17.
    """

# --- compute kernels (the GIL is released during the arithmetic) -----------------------------

def matmul_quant(
    type_id: int,
    w: _ArrayBuffer,
    row_stride: int,
    x: _ArrayBuffer,
    out: _ArrayBuffer,
    threads: int = 1,
    llamafile: bool = False,
    each_row: bool = False,
) -> None:
    """out[n, m] = sum_k w[m, k] * x[n, k] for weights of ggml type ``type_id`` in block form.

    ``w``: M rows, row i at byte ``i * row_stride``. ``x``: C-contiguous float32 (N, K),
    converted like ggml's x86 CPU backend to the type's vec_dot type (q8_0, q8_1, q8_K, f16,
    bf16 or f32), then each row pair is dotted in the order of ggml's AVX2 vec_dot. ``out``:
    writable C-contiguous float32 (N, M). Weight rows split over up to ``threads`` threads.
    ``llamafile``: follow ggml's MUL_MAT dispatch, where f32/f16/bf16 weights with N >= 2 and
    M % 4 == 0 go to llamafile's tinyBLAS (one 8-lane FMA accumulator per output); leave False
    for MUL_MAT_ID. ``each_row``: every row by the single-row kernels over cached weight tiles
    (each row's bits as alone; the joint decode of several clients). ValueError on an
    unsupported type or inconsistent shapes or sizes.
    """

def matmul_quant_supports(type_id: int) -> bool:
    """Whether ``matmul_quant`` handles ggml type ``type_id``."""

def matmul_quant_block(type_id: int) -> tuple[int, int, int] | None:
    """(elements per block, bytes per block, K multiple) of a supported type, else None."""

def matmul_activation_block(type_id: int) -> int | None:
    """Elements per block of the activation format ggml's CPU dot product uses for the weight
    type (32: q8_0/q8_1, 256: q8_K, 1: float), else None."""

def set_portable_kernels(on: bool) -> bool:
    """Force (True) or release (False) the portable kernel build; returns whether SIMD is used.

    ``RPCNET_PORTABLE_KERNELS=1`` in the environment forces it too.
    """

def kernels_simd() -> bool:
    """Whether the matmul kernels take their SIMD (AVX2+FMA+F16C) build on this CPU."""

def set_avx512_kernels(on: bool) -> bool:
    """Allow (True) or disable (False) the AVX-512 kernels (prompt tiles for q8_0 / q4_0 /
    q5_0, K-quants and f16, the Q4_K decode dot, the f16 decode prefetch; same bits as the AVX2
    ones); returns whether they now run on this CPU (AVX-512 F + BW + VNNI).

    ``RPCNET_NO_AVX512=1`` in the environment disables them too.
    """

# --- native non-matmul ops as prepared steps (checked against their buffers when built) -------

# (buffer, byte offset of element 0, ne, nb)
_TensorArg: TypeAlias = tuple[_ArrayBuffer, int, tuple[int, ...], tuple[int, ...]]

@final
class NativeStep:
    """One prepared kernel call; holds its buffers alive. Calling it runs it (GIL released)."""

    # pyo3 exposes __call__ as (*args, **kwargs); it takes none and raises on any
    def __call__(self, /, *args: object, **kwargs: object) -> None: ...

def pool_rest() -> None:
    """Park the kernel pool's spinning workers now (a plan is done)."""

def run_steps(steps: list[NativeStep]) -> None:
    """Run consecutive steps in one call with the GIL released; IndexError on a bad row index."""

def run_joint(plans: list[list[NativeStep]], joint: list[int]) -> list[bool]:
    """Run several clients' plans (step lists of equal length) together, the single-row
    MUL_MATs at the `joint` indices (weights vouched equal by `same_weights`) as one product;
    per plan, whether it ran to the end."""

def same_weights(a: NativeStep, b: NativeStep) -> bool:
    """Whether both steps are single-row MUL_MATs of one layout over equal weight bytes."""

def native_ops_portable(on: bool) -> None:
    """Force (True) or release (False) the portable build of the native non-matmul ops."""

def flash_attn_ext_step(
    q: _TensorArg,
    k: _TensorArg,
    v: _TensorArg,
    mask: _TensorArg | None,
    sinks: _TensorArg | None,
    out: _TensorArg,
    scale: float,
    max_bias: float,
    softcap: float,
    threads: int = 1,
    kv_f32: bool = False,
) -> NativeStep: ...
def rms_norm_step(x: _TensorArg, out: _TensorArg, eps: float, threads: int = 1) -> NativeStep: ...
def rope_step(
    x: _TensorArg,
    pos: _TensorArg,
    freq_factors: _TensorArg | None,
    out: _TensorArg,
    params: tuple[int, int, int, int, float, float, float, float, float, float],
    threads: int = 1,
) -> NativeStep: ...
def swiglu_step(x: _TensorArg, g: _TensorArg, out: _TensorArg, threads: int = 1) -> NativeStep: ...
def set_rows_step(
    src: _TensorArg,
    idx: _TensorArg,
    idx_type: int,
    dst: _TensorArg,
    dst_type: int,
    threads: int = 1,
) -> NativeStep: ...
def get_rows_step(
    src: _TensorArg, src_type: int, idx: _TensorArg, out: _TensorArg, threads: int = 1
) -> NativeStep: ...
def copy_step(
    src: _TensorArg, src_type: int, dst: _TensorArg, dst_type: int, threads: int = 1
) -> NativeStep: ...
def binary_step(
    a: _TensorArg, b: _TensorArg, out: _TensorArg, op: int, threads: int = 1
) -> NativeStep: ...
def soft_max_step(
    x: _TensorArg,
    mask: _TensorArg | None,
    mask_type: int,
    sinks: _TensorArg | None,
    out: _TensorArg,
    scale: float,
    max_bias: float,
    threads: int = 1,
) -> NativeStep: ...
def mul_mat_step(
    type_id: int,
    w: _TensorArg,
    x: _TensorArg,
    out: _TensorArg,
    threads: int = 1,
    llamafile: bool = False,
) -> NativeStep:
    """MUL_MAT of block weights (`w` ne[0] counted in blocks) and f32 activations into f32 `out`,
    any row strides, src0 broadcast over batches like ggml; `llamafile` as for matmul_quant."""

def mul_mat_id_step(
    type_id: int,
    w: _TensorArg,
    x: _TensorArg,
    ids: _TensorArg,
    out: _TensorArg,
    threads: int = 1,
) -> NativeStep:
    """MUL_MAT_ID in one call: experts of block type `type_id` (`w` [blocks, M, experts, 1]),
    f32 `x` [K, rows per token, tokens, 1] routed by i32 `ids` [slots, tokens, 1, 1] into f32
    `out` [M, slots, tokens, 1]; each token's row converted once, each selected expert read
    once; running it raises ValueError for an expert id out of range."""

def argsort_step(x: _TensorArg, out: _TensorArg, descending: bool, threads: int = 1) -> NativeStep:
    """ARGSORT of f32 rows into i32 indices of the same shape (stable; NaNs last)."""

def sum_rows_step(x: _TensorArg, out: _TensorArg, threads: int = 1) -> NativeStep:
    """SUM_ROWS of f32 rows into f32 [1, rows...], summed in f64 like ggml."""

def clamp_step(
    x: _TensorArg, out: _TensorArg, min: float, max: float, threads: int = 1
) -> NativeStep:
    """CLAMP of f32 values with ggml's MAX(MIN(x, max), min) (in place allowed)."""

def scale_step(x: _TensorArg, out: _TensorArg, s: float, b: float, threads: int = 1) -> NativeStep:
    """SCALE: x*s, or fma(x, s, b) when b is not 0 (in place allowed)."""

def tanh_step(x: _TensorArg, out: _TensorArg, threads: int = 1) -> NativeStep:
    """UNARY TANH, correctly rounded as the reference's tanhf (in place allowed)."""

def gelu_step(x: _TensorArg, out: _TensorArg, table: Buffer, threads: int = 1) -> NativeStep:
    """UNARY GELU through ggml's f16 table (65536 float32 values; in place allowed)."""

def geglu_step(
    x: _TensorArg, g: _TensorArg, out: _TensorArg, table: Buffer, threads: int = 1
) -> NativeStep:
    """GLU GEGLU: gelu(x)*g through ggml's f16 table."""

# --- FNV-1a 64 (spec §7.12); large inputs are hashed with the GIL released --------------------

def fnv1a64(data: Buffer) -> int: ...

@final
class Fnv1a64:
    def __init__(self) -> None: ...
    def update(self, data: Buffer) -> None: ...
    def digest(self) -> int: ...
    def hexdigest(self) -> str:
        """16 lowercase hex digits, zero padded (the hash-cache file name)."""

# --- chunking (spec §1.2) --------------------------------------------------------------------

def chunk_plan(total: int, chunk: int = ...) -> list[tuple[int, int]]:
    """(offset, length) pieces of at most chunk bytes (default MAX_CHUNK).

    ValueError if chunk == 0.
    """

# --- RDMA: HELLO conn_caps codec and RoCE GID selection (spec §2, §12) ------------------------

RDMA_CAPS_SIZE: Final[int]  # 24
RDMA_SYSFS_ROOT: Final[str]  # "/sys/class/infiniband"

class RdmaError(NativeError):
    """No usable RDMA (the reason says why), unreadable GID tables, or bad caps / environment."""

    reason: str

@final
class RdmaGid:
    """One non-empty GID table entry. kind: "RoCE v2", "RoCE v1", "IB" or "unknown"."""

    def __new__(
        cls, index: int, gid: Buffer | str, kind: str = "unknown", ndev: str | None = None
    ) -> RdmaGid:
        """gid: 16 bytes, sysfs text or IPv6 text; kind also accepts "IB/RoCE v1" (ValueError
        for anything else)."""
    index: Final[int]
    gid: Final[bytes]
    gid_text: Final[str]
    """sysfs spelling: eight groups of four hex digits."""
    address: Final[str]
    """The address the GID carries ("10.0.0.1" for ::ffff:10.0.0.1, IPv6 text otherwise)."""
    kind: Final[str]
    ndev: Final[str | None]
    def __eq__(self, other: object, /) -> bool: ...

@final
class RdmaPort:
    """One port of one RDMA device with its non-empty GIDs."""

    def __new__(
        cls,
        device: str,
        port: int,
        gids: list[RdmaGid] = ...,
        state: str | None = None,
        link_layer: str | None = None,
    ) -> RdmaPort: ...
    device: Final[str]
    port: Final[int]
    state: Final[str | None]
    """sysfs text, e.g. "4: ACTIVE"."""
    active: Final[bool | None]
    """False only when the state is known and is not ACTIVE (such ports are skipped)."""
    link_layer: Final[str | None]
    """Link layer: "Ethernet" (RoCE) or "InfiniBand"."""
    gids: Final[list[RdmaGid]]

@final
class RdmaEnv:
    """The RDMA environment variables found (RPCNET_* before GGML_* names)."""

    disabled_by: Final[str | None]
    """GGML_RPC_NO_RDMA / RPCNET_NO_RDMA when set (any value)."""
    device: Final[str | None]
    device_var: Final[str | None]
    gid_index: Final[int | None]
    gid_var: Final[str | None]

@final
class RdmaSelection:
    """The device, port and GID index a connection would use."""

    device: Final[str]
    port: Final[int]
    gid_index: Final[int]
    gid: Final[bytes]
    gid_text: Final[str]
    kind: Final[str]
    ndev: Final[str | None]
    target: Final[bytes]
    """The local address the selection was made for, in GID form."""
    how: Final[str]
    """How it was chosen, e.g. "GID matching local address 10.0.0.1 (RoCE v2)"."""

def rdma_scan(root: str | None = None) -> list[RdmaPort]:
    """Every device port and its non-empty GIDs under root (default RDMA_SYSFS_ROOT), devices in
    name order. RdmaError when root is missing or unreadable."""

def rdma_env(environ: Mapping[str, str] | None = None) -> RdmaEnv:
    """Parse GGML_RPC_NO_RDMA, GGML_RDMA_DEV, GGML_RDMA_GID and their RPCNET_* forms from environ
    (default os.environ). RdmaError for a non-numeric GID index."""

def rdma_resolve(
    ports: list[RdmaPort], local_addr: str, env: RdmaEnv | None = None
) -> RdmaSelection:
    """Choose device/port/GID for a TCP connection whose local address is local_addr (spec §12:
    the GID equal to the address, IPv4 as ::ffff:a.b.c.d, RoCE v2 before v1, first device in name
    order; explicit index / device filter / disable from env, default rdma_env()). RdmaError with
    the reason when there is none; ValueError when local_addr is not an IP address."""

def rdma_target_gid(addr: str) -> bytes:
    """A local address in GID form (16 bytes)."""

def rdma_format_gid(gid: Buffer | str) -> str:
    """sysfs spelling of a GID."""

def rdma_parse_gid(text: str) -> bytes:
    """sysfs or IPv6 text to 16 bytes; ValueError otherwise."""

def rdma_encode_caps(qpn: int, gid: Buffer | str, psn: int | None = None) -> bytes:
    """24-byte conn_caps: qpn u32, psn u32 (default qpn & 0xFFFFFF), gid[16]."""

def rdma_decode_caps(caps: bytes) -> tuple[int, int, bytes] | None:
    """(qpn, psn, gid), or None for all-zero caps; RdmaError unless exactly 24 bytes."""
