// Device pieces of the decode matvecs, shared by matvec.cu (one product per launch) and
// matvec_group.cu (products that share an input, in one launch): one thread's share of a weight
// row against up to RPC_MV_MAXCOLS activation columns, and the reductions over a warp or block.
#pragma once
#include "blocks.cuh"
#include "common.cuh"

#define RPC_MV_WARPS 4
#define RPC_MV_MAXCOLS 8

// The activation columns c < ncols of a launch, the loop unrolled over RPC_MV_MAXCOLS:
// RPC_MV_FOR_COLS(c, ncols) { ... }.
#define RPC_MV_FOR_COLS(c, ncols)                                                               \
    _Pragma("unroll") for (int c = 0; c < RPC_MV_MAXCOLS; ++c) if (c < (ncols))

// One thread's share of a weight row times up to RPC_MV_MAXCOLS q8_1 activation columns: the
// row's 32-groups first, first + stride, ... (a warp's lanes, or a whole block's threads).
template <int T>
__device__ __forceinline__ void rpc_mv_lane(const uint8_t* wrow, const uint8_t* y, int k,
                                            int ncols, long long y_col_bytes, int first,
                                            int stride, float* acc) {
    const int subs_per_block = Blk<T>::QK / 32;
#pragma unroll
    for (int c = 0; c < RPC_MV_MAXCOLS; ++c) acc[c] = 0.0f;
    for (int s = first; s < k / 32; s += stride) {
        const RpcSub sub = Blk<T>::sub(wrow + (s / subs_per_block) * Blk<T>::BYTES,
                                       s % subs_per_block);
        RPC_MV_FOR_COLS(c, ncols) {
            acc[c] += rpc_dot_sub_q8_1<rpc_act_q8_k(T)>(
                sub, y + c * y_col_bytes + s * RPC_Q8_1_BYTES);
        }
    }
}

// A 16-bit float of type T (F16 or BF16) as a float.
template <int T> __device__ __forceinline__ float rpc_float16_value(uint16_t h) {
    return T == RPC_BF16 ? rpc_bf16_to_float(h) : rpc_half_to_float(h);
}

// The 16 bytes of a float-type weight vector as floats (4 f32 or 8 f16/bf16).
template <int T> __device__ __forceinline__ void rpc_unpack16(uint4 v, float* out) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        out[2 * i] = rpc_float16_value<T>((uint16_t)(w[i] & 0xffffu));
        out[2 * i + 1] = rpc_float16_value<T>((uint16_t)(w[i] >> 16));
    }
}
template <> __device__ __forceinline__ void rpc_unpack16<RPC_F32>(uint4 v, float* out) {
    out[0] = __int_as_float((int)v.x);
    out[1] = __int_as_float((int)v.y);
    out[2] = __int_as_float((int)v.z);
    out[3] = __int_as_float((int)v.w);
}

// An activation as ggml's CPU dot product sees it for float weights of type T: rounded to f16
// (F16) or bf16 (BF16) first, kept (F32). Matching that rounding keeps the quantization of
// later activations on the CPU's side of every rounding boundary.
template <int T> __device__ __forceinline__ float rpc_act(float y);
template <> __device__ __forceinline__ float rpc_act<RPC_F32>(float y) { return y; }
template <> __device__ __forceinline__ float rpc_act<RPC_F16>(float y) {
    return rpc_half_to_float(rpc_float_to_half(y));
}
template <> __device__ __forceinline__ float rpc_act<RPC_BF16>(float y) {
    return rpc_bf16_to_float(rpc_float_to_bf16(y));
}

// One thread's share of a float weight row times up to RPC_MV_MAXCOLS f32 activation columns
// (elements first, first + stride, ...; 16-byte vectors of them when the row is aligned).
template <int T>
__device__ __forceinline__ void rpc_mv_lane(const uint8_t* wrow, const float* yc, int k,
                                            int ncols, long long y_col, int first,
                                            int stride, float* acc) {
#pragma unroll
    for (int c = 0; c < RPC_MV_MAXCOLS; ++c) acc[c] = 0.0f;
    const int per = 16 / Blk<T>::BYTES;  // elements per 16-byte load
    const bool vec = ((((unsigned long long)wrow) & 15) == 0) && (k % per == 0);
    if (vec) {  // 16 bytes of weights per thread per step
        for (int v = first; v < k / per; v += stride) {
            float wf[8];
            rpc_unpack16<T>(((const uint4*)wrow)[v], wf);
#pragma unroll
            for (int c = 0; c < RPC_MV_MAXCOLS; ++c) {
                if (c >= ncols) continue;
                const float* yv = yc + c * y_col + v * per;
#pragma unroll
                for (int e = 0; e < 16 / Blk<T>::BYTES; ++e) acc[c] += wf[e] * rpc_act<T>(yv[e]);
            }
        }
    } else {
        for (int i = first; i < k; i += stride) {
            const float wv = Blk<T>::value(wrow + i * Blk<T>::BYTES, 0);
#pragma unroll
            for (int c = 0; c < RPC_MV_MAXCOLS; ++c) {
                if (c < ncols) acc[c] += wv * rpc_act<T>(yc[c * y_col + i]);
            }
        }
    }
}

// Wide rows (many 32-groups): the block's RPC_MV_WARPS warps split one row, so a thread walks
// a quarter of the groups a warp-per-row thread would, with its loads in flight together.
// Launch: block (32, RPC_MV_WARPS), grid (M, channels).
__device__ __forceinline__ void rpc_mv_block_reduce(float* acc, int ncols, float* dst,
                                                    const float* add, long long dst_col) {
    __shared__ float s_red[RPC_MV_MAXCOLS][RPC_MV_WARPS];
    RPC_MV_FOR_COLS(c, ncols) {
        const float v = rpc_warp_sum(acc[c]);
        if (threadIdx.x == 0) s_red[c][threadIdx.y] = v;
    }
    __syncthreads();
    if (threadIdx.y == 0 && (int)threadIdx.x < ncols) {
        float v = 0.0f;
#pragma unroll
        for (int w = 0; w < RPC_MV_WARPS; ++w) v += s_red[threadIdx.x][w];
        const long long at = threadIdx.x * dst_col;
        dst[at] = add != nullptr ? v + add[at] : v;
    }
}


// Where a thread starts along a row (its first 32-group or element) and its stride: a warp's
// lanes share a row (one row a warp), or all the block's threads do (SPLIT: one row a block).
template <bool SPLIT> __device__ __forceinline__ int rpc_mv_first() {
    return SPLIT ? (int)(threadIdx.y * RPC_WARP + threadIdx.x) : (int)threadIdx.x;
}
template <bool SPLIT> __device__ __forceinline__ int rpc_mv_stride() {
    return SPLIT ? RPC_WARP * RPC_MV_WARPS : RPC_WARP;
}

// dst = W y (+ add) for one product: a warp a row (row blockIdx.x * RPC_MV_WARPS + threadIdx.y)
// or, SPLIT, a block a row (row blockIdx.x); channel blockIdx.y. Y is the activations' element:
// uint8_t for q8_1 blocks (y strides in bytes), float for f32 (strides in floats).
template <int T, typename Y, bool SPLIT>
__device__ __forceinline__ void rpc_mv_rows(const uint8_t* __restrict__ w, const Y* __restrict__ y,
                                            float* dst, const float* add, int k, int m, int ncols,
                                            long long w_row_bytes, long long w_chan_bytes,
                                            long long y_col, long long y_chan, long long dst_col,
                                            long long dst_chan, int ratio) {
    const int row = SPLIT ? (int)blockIdx.x : (int)(blockIdx.x * RPC_MV_WARPS + threadIdx.y);
    if (!SPLIT && row >= m) return;
    const int chan = blockIdx.y;
    const uint8_t* wrow = w + (chan / ratio) * w_chan_bytes + row * w_row_bytes;
    float acc[RPC_MV_MAXCOLS];
    rpc_mv_lane<T>(wrow, y + chan * y_chan, k, ncols, y_col, rpc_mv_first<SPLIT>(),
                   rpc_mv_stride<SPLIT>(), acc);
    if (SPLIT) {
        const long long at = chan * dst_chan + row;
        rpc_mv_block_reduce(acc, ncols, dst + at, add != nullptr ? add + at : nullptr, dst_col);
    } else {
        RPC_MV_FOR_COLS(c, ncols) {
            const float v = rpc_warp_sum(acc[c]);
            const long long at = chan * dst_chan + c * dst_col + row;
            if (threadIdx.x == 0) dst[at] = add != nullptr ? v + add[at] : v;
        }
    }
}

// A kernel prefix_name and its wide-row form prefix_split_name: fn<..., false> and
// fn<..., true> (the template arguments before SPLIT follow fn).
#define RPC_MV_KERNEL_PAIR(prefix, name, ARGS, PASS, fn, ...)                                     \
    extern "C" __global__ void __launch_bounds__(RPC_WARP * RPC_MV_WARPS)                         \
        prefix##_##name(ARGS) {                                                                   \
        fn<__VA_ARGS__, false>(PASS);                                                             \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(RPC_WARP * RPC_MV_WARPS)                         \
        prefix##_split_##name(ARGS) {                                                             \
        fn<__VA_ARGS__, true>(PASS);                                                              \
    }
