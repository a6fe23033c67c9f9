// Shared pieces of the rpcnet CUDA kernels: warp reductions and launch conventions.
#pragma once
#include "host_shim.h"

#define RPC_WARP 32
#define RPC_FULL_MASK 0xffffffffu

__device__ __forceinline__ float rpc_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(RPC_FULL_MASK, v, o);
    return v;
}

__device__ __forceinline__ float rpc_warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(RPC_FULL_MASK, v, o));
    return v;
}

__device__ __forceinline__ int rpc_warp_sum_int(int v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(RPC_FULL_MASK, v, o);
    return v;
}

// Block-wide reduction for blocks of up to 1024 threads (a multiple of 32); every thread gets
// it. `empty` fills the lanes past the block's warps (the reduction's identity).
template <float (*WARP_REDUCE)(float)>
__device__ __forceinline__ float rpc_block_reduce(float v, float* scratch32, float empty) {
    v = WARP_REDUCE(v);
    const int warp = threadIdx.x / RPC_WARP, lane = threadIdx.x % RPC_WARP;
    __syncthreads();
    if (lane == 0) scratch32[warp] = v;
    __syncthreads();
    const int nwarps = blockDim.x / RPC_WARP;
    v = lane < nwarps ? scratch32[lane] : empty;
    return WARP_REDUCE(v);
}

__device__ __forceinline__ float rpc_block_sum(float v, float* scratch32) {
    return rpc_block_reduce<rpc_warp_sum>(v, scratch32, 0.0f);
}

__device__ __forceinline__ float rpc_block_max(float v, float* scratch32) {
    return rpc_block_reduce<rpc_warp_max>(v, scratch32, -3.402823466e38f);
}

// SOFT_MAX of a row whose n logits value(i) are spread over the block's threads (i = threadIdx.x,
// + stride, ...; S is the stride's type, as the caller's loop had it), with the sink logit
// sinks[head] when sinks is given: write(i, e) keeps each exp(logit - max) and the result is
// 1 / their sum (0 for an empty sum). Every thread must call it.
template <typename S, typename V, typename W>
__device__ __forceinline__ float rpc_softmax_exp(int n, S stride, const float* sinks, int head,
                                                 float* scratch32, V value, W write) {
    float mx = -3.402823466e38f;
    for (int i = threadIdx.x; i < n; i += stride) mx = fmaxf(mx, value(i));
    const float sink = sinks != nullptr ? sinks[head] : -3.402823466e38f;
    mx = fmaxf(rpc_block_max(mx, scratch32), sink);
    float sum = 0.0f;
    for (int i = threadIdx.x; i < n; i += stride) {
        const float e = expf(value(i) - mx);
        write(i, e);
        sum += e;
    }
    sum = rpc_block_sum(sum, scratch32);
    if (sinks != nullptr) sum += expf(sink - mx);
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    __syncthreads();
    return inv;
}

// Rows on grid.y, which holds at most 65535 blocks: the launcher clamps grid.y and each block
// walks rows blockIdx.y, blockIdx.y + gridDim.y, ... (launch.rows_grid).
#define RPC_FOR_ROWS_Y(r, nrows) for (long long r = blockIdx.y; r < (nrows); r += gridDim.y)

// ggml rows: a row index r over ne1*ne2*ne3 rows -> element offset with strides s1..s3.
__device__ __forceinline__ long long rpc_row_offset(long long r, int ne1, int ne2, long long s1,
                                                    long long s2, long long s3) {
    const long long i1 = r % ne1, i2 = (r / ne1) % ne2, i3 = r / ((long long)ne1 * ne2);
    return i1 * s1 + i2 * s2 + i3 * s3;
}

// Element type adapters for kernels that run on f32, f16 and bf16 data.
struct RpcF32 {
    typedef float T;
    static __device__ __forceinline__ float load(const float* p) { return *p; }
    static __device__ __forceinline__ void store(float* p, float v) { *p = v; }
};
struct RpcF16 {
    typedef uint16_t T;
    static __device__ __forceinline__ float load(const uint16_t* p) { return rpc_half_to_float(*p); }
    static __device__ __forceinline__ void store(uint16_t* p, float v) { *p = rpc_float_to_half(v); }
};
struct RpcBF16 {
    typedef uint16_t T;
    static __device__ __forceinline__ float load(const uint16_t* p) { return rpc_bf16_to_float(*p); }
    static __device__ __forceinline__ void store(uint16_t* p, float v) { *p = rpc_float_to_bf16(v); }
};
