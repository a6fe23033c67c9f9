// Decode products that share one input, in one launch (N <= RPC_MV_MAXCOLS columns, one
// channel, contiguous columns):
// - rpc_mv_group_*: up to three weights with the same row length and type (attention's Q, K
//   and V): the grid's blocks go to the rows of w0, then w1, then w2, and each product is
//   written to its own destination;
// - rpc_mv_glu_*: the gate (w0) and up (w1) products of a feed-forward block and the GLU after
//   them: dst = act(w0 y) * (w1 y) (glu.cuh's op codes); neither product is written; with `q8`,
//   dst is also quantized (q8_1 or q8_K blocks) for the product after it, each group by the
//   block that completes it (quantize.cuh, rpc_quantize_when_complete);
// - rpc_mv_qkv_rope_*: attention's Q, K and V products with the RoPE of Q and K (NORMAL or NEOX
//   over whole heads of head_dim rows, position pos[c] for column c): a block's warp (or the
//   block, in the split form) takes one pair of rows, rotates it and writes Q and K rotated;
//   V's rows go in pairs too, unrotated. The unrotated Q and K are never written. K and V may
//   go straight into the KV cache's rows instead of their outputs (the SET_ROWS after them:
//   RpcRowStore).
// Activations: q8_1 blocks for quantized weights (quantized by the input's producer or by
// quantize.cu), f32 for float weights; y_col is a column's stride in bytes (q8_1) or floats.
// Launch: block (32, RPC_MV_WARPS); grid (blocks of w0 + w1 + w2 rows) for a group, (blocks of
// w0 rows) for a GLU, (blocks of (mq + mk + mv) / 2 row pairs) for Q/K/V with RoPE, with
// RPC_MV_WARPS rows (pairs) a block, or one a block in the *_split_* kernels (wide rows, the
// block's warps splitting each row).
#include "glu.cuh"
#include "matvec.cuh"
#include "quantize.cuh"
#include "rope.cuh"

// The activations' element behind the untyped y: q8_1 blocks (QUANT) or f32.
template <bool QUANT> struct RpcMvAct { typedef float T; };
template <> struct RpcMvAct<true> { typedef uint8_t T; };

template <int T, bool QUANT>
__device__ __forceinline__ void rpc_mv_lane_of(const uint8_t* wrow, const void* y, int k,
                                               int ncols, long long y_col, int first, int stride,
                                               float* acc) {
    typedef typename RpcMvAct<QUANT>::T Y;
    rpc_mv_lane<T>(wrow, (const Y*)y, k, ncols, y_col, first, stride, acc);
}

// Sum over the warp (one row a warp) or over the block (SPLIT: one row a block); in the block
// case every thread must call it, and the sum is valid in thread (0, 0).
template <bool SPLIT>
__device__ __forceinline__ float rpc_mv_row_sum(float v) {
    v = rpc_warp_sum(v);
    if (!SPLIT) return v;
    __shared__ float s_part[RPC_MV_WARPS];
    __syncthreads();  // an earlier call's readers are done with s_part
    if (threadIdx.x == 0) s_part[threadIdx.y] = v;
    __syncthreads();
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < RPC_MV_WARPS; ++w) total += s_part[w];
    return total;
}

template <int T, bool QUANT, bool SPLIT>
__device__ __forceinline__ void rpc_mv_group(const uint8_t* w0, const uint8_t* w1,
                                             const uint8_t* w2, float* d0, float* d1, float* d2,
                                             int m0, int m1, int m2, const void* y, int k,
                                             int ncols, long long w_row_bytes, long long y_col) {
    const int per_block = SPLIT ? 1 : RPC_MV_WARPS;
    const int nb0 = (m0 + per_block - 1) / per_block, nb1 = (m1 + per_block - 1) / per_block;
    int b = blockIdx.x;
    const uint8_t* w = w0;
    float* d = d0;
    int m = m0;
    if (b >= nb0 + nb1) {
        b -= nb0 + nb1;
        w = w2;
        d = d2;
        m = m2;
    } else if (b >= nb0) {
        b -= nb0;
        w = w1;
        d = d1;
        m = m1;
    }
    const int row = b * per_block + (SPLIT ? 0 : (int)threadIdx.y);
    if (!SPLIT && row >= m) return;  // SPLIT blocks always hold a row (the grid counts rows)
    const int first = rpc_mv_first<SPLIT>(), stride = rpc_mv_stride<SPLIT>();
    float acc[RPC_MV_MAXCOLS];
    rpc_mv_lane_of<T, QUANT>(w + row * w_row_bytes, y, k, ncols, y_col, first, stride, acc);
    RPC_MV_FOR_COLS(c, ncols) {
        const float v = rpc_mv_row_sum<SPLIT>(acc[c]);
        if (threadIdx.x == 0 && (!SPLIT || threadIdx.y == 0)) d[c * m + row] = v;
    }
}

template <int T, bool QUANT, bool SPLIT>
__device__ __forceinline__ void rpc_mv_glu(const uint8_t* gate, const uint8_t* up, float* dst,
                                           int m, const void* y, int k, int ncols,
                                           long long w_row_bytes, long long y_col, int op,
                                           float alpha, float limit, uint8_t* q8, int q8_block,
                                           unsigned* counters) {
    const int row = SPLIT ? (int)blockIdx.x : (int)(blockIdx.x * RPC_MV_WARPS + threadIdx.y);
    if (!SPLIT && row >= m) return;
    const int first = rpc_mv_first<SPLIT>(), stride = rpc_mv_stride<SPLIT>();
    float g[RPC_MV_MAXCOLS], u[RPC_MV_MAXCOLS];
    rpc_mv_lane_of<T, QUANT>(gate + row * w_row_bytes, y, k, ncols, y_col, first, stride, g);
    rpc_mv_lane_of<T, QUANT>(up + row * w_row_bytes, y, k, ncols, y_col, first, stride, u);
    RPC_MV_FOR_COLS(c, ncols) {
        const float gv = rpc_mv_row_sum<SPLIT>(g[c]);
        const float uv = rpc_mv_row_sum<SPLIT>(u[c]);
        if (threadIdx.x == 0 && (!SPLIT || threadIdx.y == 0)) {
            dst[c * m + row] = rpc_glu(op, gv, uv, alpha, limit);
        }
        if (q8 != nullptr && (!SPLIT || threadIdx.y == 0)) {
            rpc_quantize_when_complete(dst + c * m, row, q8 + (long long)c * (m / 32) * RPC_Q8_1_BYTES,
                                       q8_block, counters + c * (m / q8_block));
        }
    }
}

// The rows one pair of the Q/K/V-with-RoPE launch covers: its segment's output, the two rows,
// and for Q and K the pair index within the head that sets the angle (-1 for V).
struct RpcQkvPair {
    const uint8_t* w;
    float* d;
    int m, r0, r1, p, seg;  // seg: 0 Q, 1 K, 2 V
};

// Where a segment's values go instead of its output when a SET_ROWS copies it into a cache
// (dst == nullptr: to the output). Value L (= column * m + row) of the segment is element
// L % s0 of the SET_ROWS source's row L / s0, which lands in destination row ids[L / s0]
// (skipped outside [0, dst_rows)) at element L % s0; dtype 0 f32, 1 f16, 2 bf16.
struct RpcRowStore {
    uint8_t* dst;
    const uint8_t* ids;
    int ids_i64, dtype;
    long long s0, row_bytes, dst_rows;
};

__device__ __forceinline__ void rpc_store_value(const RpcRowStore& st, float* out, long long at,
                                                float v) {
    if (st.dst == nullptr) {
        out[at] = v;
        return;
    }
    const long long i = at / st.s0, e = at % st.s0;
    const long long row = st.ids_i64 ? ((const long long*)st.ids)[i] : ((const int*)st.ids)[i];
    if (row < 0 || row >= st.dst_rows) return;  // a client's bad id writes nothing
    uint8_t* p = st.dst + row * st.row_bytes;
    if (st.dtype == 1) ((uint16_t*)p)[e] = rpc_float_to_half(v);
    else if (st.dtype == 2) ((uint16_t*)p)[e] = rpc_float_to_bf16(v);
    else ((float*)p)[e] = v;
}

__device__ __forceinline__ RpcQkvPair rpc_qkv_pair(int pair, const uint8_t* wq, const uint8_t* wk,
                                                   const uint8_t* wv, float* dq, float* dk,
                                                   float* dv, int mq, int mk, int mv, int head_dim,
                                                   int mode) {
    RpcQkvPair out = {wv, dv, mv, 0, 0, -1, 2};
    int local = pair;
    if (local < mq / 2) {
        out = {wq, dq, mq, 0, 0, 0, 0};
    } else if ((local -= mq / 2) < mk / 2) {
        out = {wk, dk, mk, 0, 0, 0, 1};
    } else {
        local -= mk / 2;
        out.r0 = 2 * local;
        out.r1 = 2 * local + 1;
        return out;
    }
    const int half = head_dim / 2, head = local / half, p = local % half;
    out.p = p;
    out.r0 = head * head_dim + (mode == 0 ? 2 * p : p);
    out.r1 = head * head_dim + (mode == 0 ? 2 * p + 1 : p + half);
    return out;
}

template <int T, int TV, bool QUANT, bool SPLIT>
__device__ __forceinline__ void rpc_mv_qkv_rope(
    const uint8_t* wq, const uint8_t* wk, const uint8_t* wv, float* dq, float* dk, float* dv,
    int mq, int mk, int mv, const void* y, int k, int ncols, long long w_row_bytes,
    long long v_row_bytes, long long y_col, const int* pos, const float* ff, int head_dim, int mode, RpcRopeFreq f,
    RpcRowStore k_store, RpcRowStore v_store) {
    const int pair = SPLIT ? (int)blockIdx.x : (int)(blockIdx.x * RPC_MV_WARPS + threadIdx.y);
    if (!SPLIT && pair >= (mq + mk + mv) / 2) return;
    const RpcQkvPair q = rpc_qkv_pair(pair, wq, wk, wv, dq, dk, dv, mq, mk, mv, head_dim, mode);
    const int first = rpc_mv_first<SPLIT>(), stride = rpc_mv_stride<SPLIT>();
    float a0[RPC_MV_MAXCOLS], a1[RPC_MV_MAXCOLS];
    if (q.seg == 2) {  // V: weights of type TV (K-quant mixes keep more bits for V)
        rpc_mv_lane_of<TV, QUANT>(q.w + q.r0 * v_row_bytes, y, k, ncols, y_col, first, stride, a0);
        rpc_mv_lane_of<TV, QUANT>(q.w + q.r1 * v_row_bytes, y, k, ncols, y_col, first, stride, a1);
    } else {
        rpc_mv_lane_of<T, QUANT>(q.w + q.r0 * w_row_bytes, y, k, ncols, y_col, first, stride, a0);
        rpc_mv_lane_of<T, QUANT>(q.w + q.r1 * w_row_bytes, y, k, ncols, y_col, first, stride, a1);
    }
    RPC_MV_FOR_COLS(c, ncols) {
        const float x0 = rpc_mv_row_sum<SPLIT>(a0[c]);
        const float x1 = rpc_mv_row_sum<SPLIT>(a1[c]);
        if (threadIdx.x == 0 && (!SPLIT || threadIdx.y == 0)) {
            RpcRowStore st = {nullptr, nullptr, 0, 0, 1, 0, 0};  // a copy: no stack
            if (q.seg == 1) st = k_store;
            if (q.seg == 2) st = v_store;
            const long long at = (long long)c * q.m;
            if (q.p < 0) {
                rpc_store_value(st, q.d, at + q.r0, x0);
                rpc_store_value(st, q.d, at + q.r1, x1);
            } else {
                float cs, sn;
                rpc_rope_cs(f, (float)pos[c], q.p, q.p, ff ? ff[q.p] : 1.0f, &cs, &sn);
                rpc_store_value(st, q.d, at + q.r0, x0 * cs - x1 * sn);
                rpc_store_value(st, q.d, at + q.r1, x0 * sn + x1 * cs);
            }
        }
    }
}

#define RPC_MV_QKV_ARGS                                                                          \
    const uint8_t *wq, const uint8_t *wk, const uint8_t *wv, float *dq, float *dk, float *dv,     \
        int mq, int mk, int mv, const void *y, int k, int ncols, long long w_row_bytes,          \
        long long v_row_bytes, long long y_col, const int *pos, const float *ff, int head_dim,   \
        int mode,                                                                                 \
        float theta_scale, float freq_scale, float ext_factor, float mscale, float corr_lo,       \
        float corr_hi, uint8_t *ks_dst, const uint8_t *ks_ids, int ks_ids_i64, int ks_dtype,      \
        long long ks_s0, long long ks_row_bytes, long long ks_rows, uint8_t *vs_dst,              \
        const uint8_t *vs_ids, int vs_ids_i64, int vs_dtype, long long vs_s0,                     \
        long long vs_row_bytes, long long vs_rows
#define RPC_MV_QKV_PASS                                                                          \
    wq, wk, wv, dq, dk, dv, mq, mk, mv, y, k, ncols, w_row_bytes, v_row_bytes, y_col, pos, ff,    \
        head_dim, mode,                                                                           \
        RpcRopeFreq{theta_scale, freq_scale, ext_factor, mscale, corr_lo, corr_hi},               \
        RpcRowStore{ks_dst, ks_ids, ks_ids_i64, ks_dtype, ks_s0, ks_row_bytes, ks_rows},          \
        RpcRowStore{vs_dst, vs_ids, vs_ids_i64, vs_dtype, vs_s0, vs_row_bytes, vs_rows}

#define RPC_MV_GROUP_ARGS                                                                        \
    const uint8_t *w0, const uint8_t *w1, const uint8_t *w2, float *d0, float *d1, float *d2,     \
        int m0, int m1, int m2, const void *y, int k, int ncols, long long w_row_bytes,          \
        long long y_col
#define RPC_MV_GROUP_PASS w0, w1, w2, d0, d1, d2, m0, m1, m2, y, k, ncols, w_row_bytes, y_col
#define RPC_MV_GLU_ARGS                                                                          \
    const uint8_t *gate, const uint8_t *up, float *dst, int m, const void *y, int k, int ncols,   \
        long long w_row_bytes, long long y_col, int op, float alpha, float limit, uint8_t *q8,    \
        int q8_block, unsigned *counters
#define RPC_MV_GLU_PASS                                                                          \
    gate, up, dst, m, y, k, ncols, w_row_bytes, y_col, op, alpha, limit, q8, q8_block, counters

#define RPC_MV_GROUP_KERNELS(T, name, QUANT)                                                     \
    RPC_MV_KERNEL_PAIR(rpc_mv_group, name, RPC_MV_GROUP_ARGS, RPC_MV_GROUP_PASS, rpc_mv_group, T, \
                       QUANT)                                                                     \
    RPC_MV_KERNEL_PAIR(rpc_mv_glu, name, RPC_MV_GLU_ARGS, RPC_MV_GLU_PASS, rpc_mv_glu, T, QUANT)
#define RPC_MV_QKV_KERNEL_PAIR(T, TV, name, QUANT)                                               \
    RPC_MV_KERNEL_PAIR(rpc_mv_qkv_rope, name, RPC_MV_QKV_ARGS, RPC_MV_QKV_PASS, rpc_mv_qkv_rope, \
                       T, TV, QUANT)
#define RPC_MV_QKV_KERNELS(T, name, QUANT) RPC_MV_QKV_KERNEL_PAIR(T, T, name, QUANT)
#define RPC_MV_GROUP_QUANT(T, name)                                                              \
    RPC_MV_GROUP_KERNELS(T, name, true)                                                           \
    RPC_MV_QKV_KERNELS(T, name, true)
#define RPC_MV_GROUP_FLOAT(T, name)                                                              \
    RPC_MV_GROUP_KERNELS(T, name, false)                                                          \
    RPC_MV_QKV_KERNELS(T, name, false)
RPC_FOR_QUANT_TYPES(RPC_MV_GROUP_QUANT)
RPC_FOR_FLOAT_TYPES(RPC_MV_GROUP_FLOAT)

// V of another K-quant than Q and K, as llama.cpp's _M mixes quantize it (sources.QKV_MIXES)
RPC_MV_QKV_KERNEL_PAIR(RPC_Q2_K, RPC_Q4_K, q2_K_v_q4_K, true)
RPC_MV_QKV_KERNEL_PAIR(RPC_Q3_K, RPC_Q4_K, q3_K_v_q4_K, true)
RPC_MV_QKV_KERNEL_PAIR(RPC_Q3_K, RPC_Q5_K, q3_K_v_q5_K, true)
RPC_MV_QKV_KERNEL_PAIR(RPC_Q4_K, RPC_Q6_K, q4_K_v_q6_K, true)
RPC_MV_QKV_KERNEL_PAIR(RPC_Q5_K, RPC_Q6_K, q5_K_v_q6_K, true)
