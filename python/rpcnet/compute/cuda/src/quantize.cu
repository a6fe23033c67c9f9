// Activation quantization to q8_1, once per activation vector before the MMVQ matvec.
// One warp per 32-value block, one value per lane; same rounding as ggml's reference quantizer
// (and as rpc_quantize_q8_1_block, which the host tests check): d = amax/127, q = round(x/d
// computed as x * (1/d)), s = d * sum(q).
// Launch: block (32, 8), grid (ceil(k/32/8), ncols); x column stride x_col floats, output column
// stride (k/32) blocks.
#include "quantize.cuh"

extern "C" __global__ void rpc_quantize_q8_1(const float* __restrict__ x, uint8_t* __restrict__ out,
                                             int k, long long x_col) {
    const int blk = blockIdx.x * blockDim.y + threadIdx.y;
    if (blk >= k / 32) return;
    const int col = blockIdx.y;
    rpc_q8_1_block_warp(x[col * x_col + blk * 32 + threadIdx.x],
                        out + ((long long)col * (k / 32) + blk) * RPC_Q8_1_BYTES);
}

// Prefill activations of a quantized weight, rounded as ggml's CPU dot product quantizes them
// for that weight type (its vec_dot_type), and written back as the values the integer dot
// product multiplies (d * q) in f16 for cuBLAS: the GPU's prefill then differs from the CPU
// backend by f16 rounding, not by one side's activation quantization.
// Blocks of 32 (q8_0 and q8_1: d = amax / 127 stored as half, q = round(x / d)), one warp each.
// Launch: block (32, 8), grid (ceil(k/32/8), min(rows, 65535)); x and out are [rows, k].
extern "C" __global__ void rpc_act_round_q8_32(const float* __restrict__ x,
                                               uint16_t* __restrict__ out, int k,
                                               long long rows) {
    const int blk = blockIdx.x * blockDim.y + threadIdx.y;
    if (blk >= k / 32) return;
    RPC_FOR_ROWS_Y(r, rows) {
        const long long i = r * k + blk * 32 + threadIdx.x;
        const float v = x[i];
        const float d = rpc_warp_max(fabsf(v)) / 127.0f;
        const float q = roundf(v * (d != 0.0f ? 1.0f / d : 0.0f));
        out[i] = rpc_float_to_half(rpc_half_to_float(rpc_float_to_half(d)) * q);
    }
}

// q8_K's block extreme over a block (32, 8) of threads holding one value each: the value of
// largest magnitude (the first in index order on ties), with that magnitude in *amax. The
// caller's shared s_abs/s_val[8] must be free (a barrier before a second use).
__device__ __forceinline__ float rpc_signed_max_256(float v, float* s_abs, float* s_val,
                                                    float* amax) {
    const int lane = threadIdx.x, warp = threadIdx.y;
    float a = fabsf(v), m = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const float a2 = __shfl_down_sync(RPC_FULL_MASK, a, o);
        const float m2 = __shfl_down_sync(RPC_FULL_MASK, m, o);
        if (lane + o < 32 && a2 > a) {
            a = a2;
            m = m2;
        }
    }
    if (lane == 0) {
        s_abs[warp] = a;
        s_val[warp] = m;
    }
    __syncthreads();
    float best = s_abs[0], max = s_val[0];
    for (int w = 1; w < 8; ++w) {
        if (s_abs[w] > best) {
            best = s_abs[w];
            max = s_val[w];
        }
    }
    *amax = best;
    return max;
}

// Blocks of 256 (q8_K): the value of largest magnitude m (the first one on ties), scale
// -127 / m, q = min(127, nearest_int(x * scale)), d = 1 / scale kept in f32.
// Launch: block (32, 8) (one 256-block), grid (k/256, min(rows, 65535)).
extern "C" __global__ void rpc_act_round_q8_k(const float* __restrict__ x,
                                              uint16_t* __restrict__ out, int k, long long rows) {
    __shared__ float s_abs[8], s_val[8];
    const int lane = threadIdx.x, warp = threadIdx.y;
    RPC_FOR_ROWS_Y(r, rows) {
        const long long i = r * k + blockIdx.x * 256 + warp * 32 + lane;
        const float v = x[i];
        __syncthreads();  // the previous row's readers are done with s_abs / s_val
        float amax;
        const float max = rpc_signed_max_256(v, s_abs, s_val, &amax);
        float value = 0.0f;
        if (amax != 0.0f) {
            const float iscale = -127.0f / max;
            const float q = fminf(127.0f, rintf(iscale * v));
            value = (1.0f / iscale) * q;
        }
        out[i] = rpc_float_to_half(value);
    }
}

// q8_1 blocks holding ggml's q8_K quantization (for the decode products of K-quant and IQ4_XS
// weights, whose CPU dot product quantizes activations to q8_K): per 256 values the value of
// largest magnitude m (first on ties), scale -127 / m, q = min(127, nearest_int(x * scale)),
// d = 1 / scale; each of the eight 32-blocks stores that d as an f32 in place of q8_1's half
// scale and sum (blocks.cuh, rpc_act_q8_k).
// Launch: block (32, 8) (one 256-block, a warp per 32-block), grid (k/256, ncols); x column
// stride x_col floats, output column stride (k/32) blocks.
extern "C" __global__ void rpc_quantize_q8_1_as_q8_k(const float* __restrict__ x,
                                                    uint8_t* __restrict__ out, int k,
                                                    long long x_col) {
    __shared__ float s_abs[8], s_val[8];
    const int lane = threadIdx.x, warp = threadIdx.y, col = blockIdx.y;
    const int blk = blockIdx.x * 8 + warp;  // 32-block index in the column
    const float v = x[col * x_col + blk * 32 + lane];
    float amax;
    const float max = rpc_signed_max_256(v, s_abs, s_val, &amax);
    const float iscale = amax != 0.0f ? -127.0f / max : 0.0f;
    const int q = amax != 0.0f ? (int)fminf(127.0f, rintf(iscale * v)) : 0;
    const float d = amax != 0.0f ? 1.0f / iscale : 0.0f;
    uint8_t* b = out + ((long long)col * (k / 32) + blk) * RPC_Q8_1_BYTES;
    b[4 + lane] = (uint8_t)(int8_t)q;
    if (lane == 0) *(float*)b = d;  // blocks are 36 bytes: 4-byte aligned
}
