// Decode-path matrix-vector products (MUL_MAT with N <= 8 activation columns), ggml layout:
// W is [K, M] (rows of K elements, row stride in bytes), activations are N columns of K.
//
// Quantized weights: MMVQ-style. The activations are quantized once to q8_1 (quantize.cu);
// each warp owns one weight row and its lanes walk the row's 32-element groups, unpacking each
// group once and dotting it with all N activation columns with dp4a. Weights are read once, in
// their block form.
//
// Float weights (F32/F16/BF16): the activations stay f32 so results keep float accuracy.
//
// Launch (both kinds): block (32, RPC_MV_WARPS), grid (ceil(M / RPC_MV_WARPS), channels).
// Channels cover ne2*ne3 of dst; the weight channel is channel / ratio (ggml broadcasting).
#include "blocks.cuh"
#include "common.cuh"

#define RPC_MV_WARPS 4
#define RPC_MV_MAXCOLS 8

template <int T>
__device__ __forceinline__ void rpc_mmvq(const uint8_t* __restrict__ w, const uint8_t* __restrict__ yq,
                                         float* __restrict__ dst, int k, int m, int ncols,
                                         long long w_row_bytes, long long w_chan_bytes,
                                         long long y_col_bytes, long long y_chan_bytes,
                                         long long dst_col, long long dst_chan, int ratio) {
    const int row = blockIdx.x * RPC_MV_WARPS + threadIdx.y;
    if (row >= m) return;
    const int chan = blockIdx.y;
    const uint8_t* wrow = w + (chan / ratio) * w_chan_bytes + row * w_row_bytes;
    const uint8_t* y = yq + chan * y_chan_bytes;
    const int subs_per_block = Blk<T>::QK / 32;
    const int nsub = k / 32;

    float acc[RPC_MV_MAXCOLS];
#pragma unroll
    for (int c = 0; c < RPC_MV_MAXCOLS; ++c) acc[c] = 0.0f;

    for (int s = threadIdx.x; s < nsub; s += RPC_WARP) {
        const int blk = s / subs_per_block;
        const RpcSub sub = Blk<T>::sub(wrow + blk * Blk<T>::BYTES, s % subs_per_block);
#pragma unroll
        for (int c = 0; c < RPC_MV_MAXCOLS; ++c) {
            if (c < ncols) acc[c] += rpc_dot_sub_q8_1(sub, y + c * y_col_bytes + s * RPC_Q8_1_BYTES);
        }
    }
#pragma unroll
    for (int c = 0; c < RPC_MV_MAXCOLS; ++c) {
        if (c < ncols) {
            const float v = rpc_warp_sum(acc[c]);
            if (threadIdx.x == 0) dst[chan * dst_chan + c * dst_col + row] = v;
        }
    }
}

template <int T>
__device__ __forceinline__ void rpc_mmv_float(const uint8_t* __restrict__ w, const float* __restrict__ y,
                                              float* __restrict__ dst, int k, int m, int ncols,
                                              long long w_row_bytes, long long w_chan_bytes,
                                              long long y_col, long long y_chan,
                                              long long dst_col, long long dst_chan, int ratio) {
    const int row = blockIdx.x * RPC_MV_WARPS + threadIdx.y;
    if (row >= m) return;
    const int chan = blockIdx.y;
    const uint8_t* wrow = w + (chan / ratio) * w_chan_bytes + row * w_row_bytes;
    const float* yc = y + chan * y_chan;

    float acc[RPC_MV_MAXCOLS];
#pragma unroll
    for (int c = 0; c < RPC_MV_MAXCOLS; ++c) acc[c] = 0.0f;
    for (int i = threadIdx.x; i < k; i += RPC_WARP) {
        const float wv = Blk<T>::value(wrow + i * Blk<T>::BYTES, 0);
#pragma unroll
        for (int c = 0; c < RPC_MV_MAXCOLS; ++c) {
            if (c < ncols) acc[c] += wv * yc[c * y_col + i];
        }
    }
#pragma unroll
    for (int c = 0; c < RPC_MV_MAXCOLS; ++c) {
        if (c < ncols) {
            const float v = rpc_warp_sum(acc[c]);
            if (threadIdx.x == 0) dst[chan * dst_chan + c * dst_col + row] = v;
        }
    }
}

#define RPC_MMVQ_KERNEL(T, name)                                                                 \
    extern "C" __global__ void __launch_bounds__(RPC_WARP * RPC_MV_WARPS)                         \
        rpc_mmvq_##name(const uint8_t* w, const uint8_t* yq, float* dst, int k, int m, int ncols, \
                        long long w_row_bytes, long long w_chan_bytes, long long y_col_bytes,     \
                        long long y_chan_bytes, long long dst_col, long long dst_chan, int ratio) { \
        rpc_mmvq<T>(w, yq, dst, k, m, ncols, w_row_bytes, w_chan_bytes, y_col_bytes, y_chan_bytes, \
                    dst_col, dst_chan, ratio);                                                    \
    }
RPC_FOR_QUANT_TYPES(RPC_MMVQ_KERNEL)

#define RPC_MMV_FLOAT_KERNEL(T, name)                                                            \
    extern "C" __global__ void __launch_bounds__(RPC_WARP * RPC_MV_WARPS)                         \
        rpc_mmv_##name(const uint8_t* w, const float* y, float* dst, int k, int m, int ncols,     \
                       long long w_row_bytes, long long w_chan_bytes, long long y_col,            \
                       long long y_chan, long long dst_col, long long dst_chan, int ratio) {      \
        rpc_mmv_float<T>(w, y, dst, k, m, ncols, w_row_bytes, w_chan_bytes, y_col, y_chan,        \
                         dst_col, dst_chan, ratio);                                               \
    }
RPC_FOR_FLOAT_TYPES(RPC_MMV_FLOAT_KERNEL)
