// Activation quantization as device functions, shared by the quantizer kernels (quantize.cu)
// and the producers that quantize what they write (norm.cu): the q8_1 blocks the MMVQ kernels
// read, with the rounding of ggml's reference quantizers.
#pragma once
#include "blocks.cuh"
#include "common.cuh"

// One q8_1 block by one warp, lane i holding value i: d = amax / 127, q = round(x * (1 / d)),
// s = d * sum(q), both stored as half.
__device__ __forceinline__ void rpc_q8_1_block_warp(float v, uint8_t* b) {
    const float d = rpc_warp_max(fabsf(v)) / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const int q = (int)roundf(v * id);
    const int sum = rpc_warp_sum_int(q);
    b[4 + threadIdx.x % RPC_WARP] = (uint8_t)(int8_t)q;
    if (threadIdx.x % RPC_WARP == 0) {
        const uint32_t dh = rpc_float_to_half(d), sh = rpc_float_to_half((float)sum * d);
        *(uint32_t*)b = dh | (sh << 16);  // blocks are 36 bytes: 4-byte aligned
    }
}

// One q8_K block of 256 values by one warp, stored as eight q8_1 blocks whose first four bytes
// hold q8_K's f32 d (blocks.cuh, rpc_act_q8_k): the value of largest magnitude m (the first in
// index order on ties), scale -127 / m, q = min(127, nearest_int(x * scale)), d = 1 / scale.
// Lane i holds x[8i .. 8i+7], so lane order is index order. x is read as volatile: it may have
// been written by other blocks of the same launch (matvec_group.cu's GLU).
__device__ __forceinline__ void rpc_q8_k_block_warp(const volatile float* x, uint8_t* out) {
    const int lane = threadIdx.x % RPC_WARP;
    float v[8];
    float a = -1.0f, m = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        v[j] = x[lane * 8 + j];
        if (fabsf(v[j]) > a) {
            a = fabsf(v[j]);
            m = v[j];
        }
    }
    int at = lane;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float a2 = __shfl_xor_sync(RPC_FULL_MASK, a, o);
        const float m2 = __shfl_xor_sync(RPC_FULL_MASK, m, o);
        const int at2 = __shfl_xor_sync(RPC_FULL_MASK, at, o);
        if (a2 > a || (a2 == a && at2 < at)) {
            a = a2;
            m = m2;
            at = at2;
        }
    }
    const float iscale = a != 0.0f ? -127.0f / m : 0.0f;
    const float d = a != 0.0f ? 1.0f / iscale : 0.0f;
    uint8_t* b = out + (lane / 4) * RPC_Q8_1_BYTES;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const int q = a != 0.0f ? (int)fminf(127.0f, rintf(iscale * v[j])) : 0;
        b[4 + (lane % 4) * 8 + j] = (uint8_t)(int8_t)q;
    }
    if (lane % 4 == 0) *(float*)b = d;
}

// A row of k values (k a multiple of 32, or of 256 when `as_q8_k`) to q8_1 blocks by the
// calling block's warps; every thread of the block must call it.
__device__ __forceinline__ void rpc_quantize_row_block(const float* x, uint8_t* out, int k,
                                                       bool as_q8_k) {
    const int warp = threadIdx.x / RPC_WARP, nwarps = blockDim.x / RPC_WARP;
    if (as_q8_k) {
        for (int b = warp; b < k / 256; b += nwarps) {
            rpc_q8_k_block_warp(x + b * 256, out + b * 8 * RPC_Q8_1_BYTES);
        }
    } else {
        for (int b = warp; b < k / 32; b += nwarps) {
            rpc_q8_1_block_warp(x[b * 32 + threadIdx.x % RPC_WARP], out + b * RPC_Q8_1_BYTES);
        }
    }
}

// A producer that writes a row's values from many blocks (one row a block) quantizes each
// group of `block` values (32: q8_1; 256: q8_K) when its last value is written: the writer of
// value `row` calls this with its whole warp after storing it; the warp whose store completes
// a group (a per-group counter, which that warp sets back to 0 for the next launch) reads the
// group, written by other blocks and made visible by their fences, and quantizes it into `q`.
__device__ __forceinline__ void rpc_quantize_when_complete(const float* x, int row, uint8_t* q,
                                                           int block, unsigned* counters) {
    const int lane = threadIdx.x % RPC_WARP;
    const int group = row / block;
    int last = 0;
    if (lane == 0) {
        __threadfence();  // this value is visible before the count says so
        last = atomicAdd(&counters[group], 1u) == (unsigned)(block - 1);
        if (last) counters[group] = 0u;
    }
    last = __shfl_sync(RPC_FULL_MASK, last, 0);
    if (!last) return;
    __threadfence();
    const volatile float* g = x + (long long)group * block;
    if (block == 32) {
        rpc_q8_1_block_warp(g[lane], q + group * RPC_Q8_1_BYTES);
    } else {
        rpc_q8_k_block_warp(g, q + group * 8 * RPC_Q8_1_BYTES);
    }
}
