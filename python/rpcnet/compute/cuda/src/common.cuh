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

// Block-wide sum for blocks of up to 1024 threads (a multiple of 32); every thread gets it.
__device__ __forceinline__ float rpc_block_sum(float v, float* scratch32) {
    v = rpc_warp_sum(v);
    const int warp = threadIdx.x / RPC_WARP, lane = threadIdx.x % RPC_WARP;
    __syncthreads();
    if (lane == 0) scratch32[warp] = v;
    __syncthreads();
    const int nwarps = blockDim.x / RPC_WARP;
    v = lane < nwarps ? scratch32[lane] : 0.0f;
    return rpc_warp_sum(v);
}

__device__ __forceinline__ float rpc_block_max(float v, float* scratch32) {
    v = rpc_warp_max(v);
    const int warp = threadIdx.x / RPC_WARP, lane = threadIdx.x % RPC_WARP;
    __syncthreads();
    if (lane == 0) scratch32[warp] = v;
    __syncthreads();
    const int nwarps = blockDim.x / RPC_WARP;
    v = lane < nwarps ? scratch32[lane] : -3.402823466e38f;
    return rpc_warp_max(v);
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
