// Decode products that share one input, in one launch (N <= RPC_MV_MAXCOLS columns, one
// channel, contiguous columns):
// - rpc_mv_group_*: up to three weights with the same row length and type (attention's Q, K
//   and V): the grid's blocks go to the rows of w0, then w1, then w2, and each product is
//   written to its own destination;
// - rpc_mv_glu_*: the gate (w0) and up (w1) products of a feed-forward block and the GLU after
//   them: dst = act(w0 y) * (w1 y) (glu.cuh's op codes); neither product is written.
// Activations: q8_1 blocks for quantized weights (quantized by the input's producer or by
// quantize.cu), f32 for float weights; y_col is a column's stride in bytes (q8_1) or floats.
// Launch: block (32, RPC_MV_WARPS); grid (blocks of w0 + w1 + w2 rows) for a group, (blocks of
// w0 rows) for a GLU, with RPC_MV_WARPS rows a block, or one row a block in the *_split_*
// kernels (wide rows, the block's warps splitting each row).
#include "glu.cuh"
#include "matvec.cuh"

template <int T, bool QUANT> struct RpcMvLane;
template <int T> struct RpcMvLane<T, true> {
    static __device__ __forceinline__ void run(const uint8_t* wrow, const void* y, int k, int ncols,
                                               long long y_col, int first, int stride,
                                               float* acc) {
        rpc_mmvq_lane<T>(wrow, (const uint8_t*)y, k, ncols, y_col, first, stride, acc);
    }
};
template <int T> struct RpcMvLane<T, false> {
    static __device__ __forceinline__ void run(const uint8_t* wrow, const void* y, int k, int ncols,
                                               long long y_col, int first, int stride,
                                               float* acc) {
        rpc_mmv_float_lane<T>(wrow, (const float*)y, k, ncols, y_col, first, stride, acc);
    }
};

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
    const int first = SPLIT ? (int)(threadIdx.y * RPC_WARP + threadIdx.x) : (int)threadIdx.x;
    const int stride = SPLIT ? RPC_WARP * RPC_MV_WARPS : RPC_WARP;
    float acc[RPC_MV_MAXCOLS];
    RpcMvLane<T, QUANT>::run(w + row * w_row_bytes, y, k, ncols, y_col, first, stride, acc);
#pragma unroll
    for (int c = 0; c < RPC_MV_MAXCOLS; ++c) {
        if (c < ncols) {
            const float v = rpc_mv_row_sum<SPLIT>(acc[c]);
            if (threadIdx.x == 0 && (!SPLIT || threadIdx.y == 0)) d[c * m + row] = v;
        }
    }
}

template <int T, bool QUANT, bool SPLIT>
__device__ __forceinline__ void rpc_mv_glu(const uint8_t* gate, const uint8_t* up, float* dst,
                                           int m, const void* y, int k, int ncols,
                                           long long w_row_bytes, long long y_col, int op,
                                           float alpha, float limit) {
    const int row = SPLIT ? (int)blockIdx.x : (int)(blockIdx.x * RPC_MV_WARPS + threadIdx.y);
    if (!SPLIT && row >= m) return;
    const int first = SPLIT ? (int)(threadIdx.y * RPC_WARP + threadIdx.x) : (int)threadIdx.x;
    const int stride = SPLIT ? RPC_WARP * RPC_MV_WARPS : RPC_WARP;
    float g[RPC_MV_MAXCOLS], u[RPC_MV_MAXCOLS];
    RpcMvLane<T, QUANT>::run(gate + row * w_row_bytes, y, k, ncols, y_col, first, stride, g);
    RpcMvLane<T, QUANT>::run(up + row * w_row_bytes, y, k, ncols, y_col, first, stride, u);
#pragma unroll
    for (int c = 0; c < RPC_MV_MAXCOLS; ++c) {
        if (c < ncols) {
            const float gv = rpc_mv_row_sum<SPLIT>(g[c]);
            const float uv = rpc_mv_row_sum<SPLIT>(u[c]);
            if (threadIdx.x == 0 && (!SPLIT || threadIdx.y == 0)) {
                dst[c * m + row] = rpc_glu(op, gv, uv, alpha, limit);
            }
        }
    }
}

#define RPC_MV_GROUP_ARGS                                                                        \
    const uint8_t *w0, const uint8_t *w1, const uint8_t *w2, float *d0, float *d1, float *d2,     \
        int m0, int m1, int m2, const void *y, int k, int ncols, long long w_row_bytes,          \
        long long y_col
#define RPC_MV_GROUP_PASS w0, w1, w2, d0, d1, d2, m0, m1, m2, y, k, ncols, w_row_bytes, y_col
#define RPC_MV_GLU_ARGS                                                                          \
    const uint8_t *gate, const uint8_t *up, float *dst, int m, const void *y, int k, int ncols,   \
        long long w_row_bytes, long long y_col, int op, float alpha, float limit
#define RPC_MV_GLU_PASS gate, up, dst, m, y, k, ncols, w_row_bytes, y_col, op, alpha, limit

#define RPC_MV_GROUP_KERNELS(T, name, QUANT)                                                     \
    extern "C" __global__ void __launch_bounds__(RPC_WARP * RPC_MV_WARPS)                         \
        rpc_mv_group_##name(RPC_MV_GROUP_ARGS) {                                                  \
        rpc_mv_group<T, QUANT, false>(RPC_MV_GROUP_PASS);                                         \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(RPC_WARP * RPC_MV_WARPS)                         \
        rpc_mv_group_split_##name(RPC_MV_GROUP_ARGS) {                                            \
        rpc_mv_group<T, QUANT, true>(RPC_MV_GROUP_PASS);                                          \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(RPC_WARP * RPC_MV_WARPS)                         \
        rpc_mv_glu_##name(RPC_MV_GLU_ARGS) {                                                      \
        rpc_mv_glu<T, QUANT, false>(RPC_MV_GLU_PASS);                                             \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(RPC_WARP * RPC_MV_WARPS)                         \
        rpc_mv_glu_split_##name(RPC_MV_GLU_ARGS) {                                                \
        rpc_mv_glu<T, QUANT, true>(RPC_MV_GLU_PASS);                                              \
    }
#define RPC_MV_GROUP_QUANT(T, name) RPC_MV_GROUP_KERNELS(T, name, true)
#define RPC_MV_GROUP_FLOAT(T, name) RPC_MV_GROUP_KERNELS(T, name, false)
RPC_FOR_QUANT_TYPES(RPC_MV_GROUP_QUANT)
RPC_FOR_FLOAT_TYPES(RPC_MV_GROUP_FLOAT)
