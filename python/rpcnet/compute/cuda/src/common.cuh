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
