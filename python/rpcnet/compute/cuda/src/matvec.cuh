// Device pieces of the decode matvecs, shared by matvec.cu (one product per launch) and
// matvec_group.cu (products that share an input, in one launch): one thread's share of a weight
// row against up to RPC_MV_MAXCOLS activation columns, and the reductions over a warp or block.
#pragma once
#include "blocks.cuh"
#include "common.cuh"

#define RPC_MV_WARPS 4
#define RPC_MV_MAXCOLS 8

// One thread's share of a weight row times up to RPC_MV_MAXCOLS q8_1 activation columns: the
// row's 32-groups first, first + stride, ... (a warp's lanes, or a whole block's threads).
template <int T>
__device__ __forceinline__ void rpc_mmvq_lane(const uint8_t* wrow, const uint8_t* y, int k,
                                              int ncols, long long y_col_bytes, int first,
                                              int stride, float* acc) {
    const int subs_per_block = Blk<T>::QK / 32;
#pragma unroll
    for (int c = 0; c < RPC_MV_MAXCOLS; ++c) acc[c] = 0.0f;
    for (int s = first; s < k / 32; s += stride) {
        const RpcSub sub = Blk<T>::sub(wrow + (s / subs_per_block) * Blk<T>::BYTES,
                                       s % subs_per_block);
#pragma unroll
        for (int c = 0; c < RPC_MV_MAXCOLS; ++c) {
            if (c < ncols) {
                acc[c] += rpc_dot_sub_q8_1<rpc_act_q8_k(T)>(
                    sub, y + c * y_col_bytes + s * RPC_Q8_1_BYTES);
            }
        }
    }
}

template <int T>
__device__ __forceinline__ void rpc_mmvq(const uint8_t* __restrict__ w, const uint8_t* __restrict__ yq,
                                         float* dst, const float* add,
                                         int k, int m, int ncols,
                                         long long w_row_bytes, long long w_chan_bytes,
                                         long long y_col_bytes, long long y_chan_bytes,
                                         long long dst_col, long long dst_chan, int ratio) {
    const int row = blockIdx.x * RPC_MV_WARPS + threadIdx.y;
    if (row >= m) return;
    const int chan = blockIdx.y;
    const uint8_t* wrow = w + (chan / ratio) * w_chan_bytes + row * w_row_bytes;
    float acc[RPC_MV_MAXCOLS];
    rpc_mmvq_lane<T>(wrow, yq + chan * y_chan_bytes, k, ncols, y_col_bytes, threadIdx.x,
                     RPC_WARP, acc);
#pragma unroll
    for (int c = 0; c < RPC_MV_MAXCOLS; ++c) {
        if (c < ncols) {
            const float v = rpc_warp_sum(acc[c]);
            const long long at = chan * dst_chan + c * dst_col + row;
            if (threadIdx.x == 0) dst[at] = add != nullptr ? v + add[at] : v;
        }
    }
}

// The 16 bytes of a float-type weight vector as floats (4 f32 or 8 f16/bf16).
template <int T> __device__ __forceinline__ void rpc_unpack16(uint4 v, float* out);
template <> __device__ __forceinline__ void rpc_unpack16<RPC_F32>(uint4 v, float* out) {
    out[0] = __int_as_float((int)v.x);
    out[1] = __int_as_float((int)v.y);
    out[2] = __int_as_float((int)v.z);
    out[3] = __int_as_float((int)v.w);
}
template <> __device__ __forceinline__ void rpc_unpack16<RPC_F16>(uint4 v, float* out) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        out[2 * i] = rpc_half_to_float((uint16_t)(w[i] & 0xffffu));
        out[2 * i + 1] = rpc_half_to_float((uint16_t)(w[i] >> 16));
    }
}
template <> __device__ __forceinline__ void rpc_unpack16<RPC_BF16>(uint4 v, float* out) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        out[2 * i] = rpc_bf16_to_float((uint16_t)(w[i] & 0xffffu));
        out[2 * i + 1] = rpc_bf16_to_float((uint16_t)(w[i] >> 16));
    }
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
__device__ __forceinline__ void rpc_mmv_float_lane(const uint8_t* wrow, const float* yc, int k,
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

template <int T>
__device__ __forceinline__ void rpc_mmv_float(const uint8_t* __restrict__ w, const float* __restrict__ y,
                                              float* dst, const float* add,
                                              int k, int m, int ncols,
                                              long long w_row_bytes, long long w_chan_bytes,
                                              long long y_col, long long y_chan,
                                              long long dst_col, long long dst_chan, int ratio) {
    const int row = blockIdx.x * RPC_MV_WARPS + threadIdx.y;
    if (row >= m) return;
    const int chan = blockIdx.y;
    const uint8_t* wrow = w + (chan / ratio) * w_chan_bytes + row * w_row_bytes;
    float acc[RPC_MV_MAXCOLS];
    rpc_mmv_float_lane<T>(wrow, y + chan * y_chan, k, ncols, y_col, threadIdx.x, RPC_WARP, acc);
#pragma unroll
    for (int c = 0; c < RPC_MV_MAXCOLS; ++c) {
        if (c < ncols) {
            const float v = rpc_warp_sum(acc[c]);
            const long long at = chan * dst_chan + c * dst_col + row;
            if (threadIdx.x == 0) dst[at] = add != nullptr ? v + add[at] : v;
        }
    }
}

// Wide rows (many 32-groups): the block's RPC_MV_WARPS warps split one row, so a thread walks
// a quarter of the groups a warp-per-row thread would, with its loads in flight together.
// Launch: block (32, RPC_MV_WARPS), grid (M, channels).
__device__ __forceinline__ void rpc_mv_block_reduce(float* acc, int ncols, float* dst,
                                                    const float* add, long long dst_col) {
    __shared__ float s_red[RPC_MV_MAXCOLS][RPC_MV_WARPS];
#pragma unroll
    for (int c = 0; c < RPC_MV_MAXCOLS; ++c) {
        if (c < ncols) {
            const float v = rpc_warp_sum(acc[c]);
            if (threadIdx.x == 0) s_red[c][threadIdx.y] = v;
        }
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

