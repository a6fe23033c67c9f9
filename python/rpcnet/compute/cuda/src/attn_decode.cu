// Decode attention without FLASH_ATTN_EXT, as one kernel: the K*Q product, SOFT_MAX (scale,
// f32/f16 mask, sinks) and the V*softmax product of ggml's unfused attention, written in the
// order of the CONT after it ([Dv, H, n_q], heads next to each other). Each step keeps the
// arithmetic of its own kernel (matvec.cuh's activation rounding for the K and V types,
// softmax.cu's max, exponent and normalization), so the result is the unfused one up to
// summation order. K is [D, n_kv, H_kv] (positions kb1 bytes apart), V the transposed cache
// [n_kv, Dv, H_kv] (row i of a head holds position j at element j), q [D, n_q, H] f32 with
// float strides; head h reads K/V head h / (H / H_kv). `q8` (optional, Dv a multiple of 32):
// the output also as q8_1 blocks for the projection after it.
// Launch: block RPC_AD_THREADS, grid (n_q, H); n_kv <= RPC_AD_MAX_KV, D and Dv <= 512.
#include "matvec.cuh"
#include "quantize.cuh"

#define RPC_AD_THREADS 128
#define RPC_AD_MAX_KV 4096
#define RPC_AD_MAX_D 512

template <int KT, int VT>
__device__ __forceinline__ void rpc_attn_decode(
    const float* q, const uint8_t* k, const uint8_t* v, const uint8_t* mask, int mask_type,
    const float* sinks, float* dst, uint8_t* q8, int d, int dv, int n_q, int n_kv, int n_head,
    int n_head_kv, long long qs1, long long qs2, long long kb1, long long kb2, long long vb1,
    long long vb2, long long ms1, float scale) {
    __shared__ float s_p[RPC_AD_MAX_KV];
    __shared__ float s_out[RPC_AD_MAX_D];
    __shared__ float s_red[32];
    const int iq = blockIdx.x, h = blockIdx.y, hk = h / (n_head / n_head_kv);
    const int lane = threadIdx.x % RPC_WARP, warp = threadIdx.x / RPC_WARP;
    const int nwarps = RPC_AD_THREADS / RPC_WARP;
    const float* qr = q + iq * qs1 + h * qs2;
    const uint8_t* kh = k + hk * kb2;
    const uint8_t* vh = v + hk * vb2;

    // K*Q: a warp per position, the lanes over D; Q as K's dot product sees it
    float qv[RPC_AD_MAX_D / RPC_WARP];
#pragma unroll
    for (int t = 0; t < RPC_AD_MAX_D / RPC_WARP; ++t) {
        const int i = lane + RPC_WARP * t;
        qv[t] = i < d ? rpc_act<KT>(qr[i]) : 0.0f;
    }
    for (int j = warp; j < n_kv; j += nwarps) {
        const uint8_t* kr = kh + j * kb1;
        float s = 0.0f;
#pragma unroll
        for (int t = 0; t < RPC_AD_MAX_D / RPC_WARP; ++t) {
            const int i = lane + RPC_WARP * t;
            if (i < d) s += Blk<KT>::value(kr + i * Blk<KT>::BYTES, 0) * qv[t];
        }
        s = rpc_warp_sum(s);
        if (lane == 0) {
            float m = 0.0f;
            if (mask_type == 1) m = ((const float*)mask)[iq * ms1 + j];
            if (mask_type == 2) m = rpc_half_to_float(((const uint16_t*)mask)[iq * ms1 + j]);
            s_p[j] = s * scale + m;
        }
    }
    __syncthreads();

    // SOFT_MAX over the positions (and the sink)
    const float inv = rpc_softmax_exp(
        n_kv, RPC_AD_THREADS, sinks, h, s_red, [&](int j) { return s_p[j]; },
        [&](int j, float e) { s_p[j] = e; });
    for (int j = threadIdx.x; j < n_kv; j += RPC_AD_THREADS) s_p[j] = rpc_act<VT>(s_p[j] * inv);
    __syncthreads();

    // V*softmax: a warp per output element, the lanes over the positions
    float* out = dst + ((long long)iq * n_head + h) * dv;
    for (int i = warp; i < dv; i += nwarps) {
        const uint8_t* vr = vh + i * vb1;
        float o = 0.0f;
        for (int j = lane; j < n_kv; j += RPC_WARP) o += Blk<VT>::value(vr + j * Blk<VT>::BYTES, 0) * s_p[j];
        o = rpc_warp_sum(o);
        if (lane == 0) {
            out[i] = o;
            s_out[i] = o;
        }
    }
    if (q8 == nullptr) return;
    __syncthreads();
    uint8_t* qb = q8 + (((long long)iq * n_head + h) * dv / 32) * RPC_Q8_1_BYTES;
    for (int b = warp; b < dv / 32; b += nwarps) {
        rpc_q8_1_block_warp(s_out[b * 32 + lane], qb + b * RPC_Q8_1_BYTES);
    }
}

#define RPC_AD_KERNEL(KT, VT, name)                                                              \
    extern "C" __global__ void __launch_bounds__(RPC_AD_THREADS) rpc_attn_decode_##name(         \
        const float* q, const uint8_t* k, const uint8_t* v, const uint8_t* mask, int mask_type,   \
        const float* sinks, float* dst, uint8_t* q8, int d, int dv, int n_q, int n_kv,            \
        int n_head, int n_head_kv, long long qs1, long long qs2, long long kb1, long long kb2,    \
        long long vb1, long long vb2, long long ms1, float scale) {                               \
        rpc_attn_decode<KT, VT>(q, k, v, mask, mask_type, sinks, dst, q8, d, dv, n_q, n_kv,       \
                                n_head, n_head_kv, qs1, qs2, kb1, kb2, vb1, vb2, ms1, scale);     \
    }
RPC_AD_KERNEL(RPC_F16, RPC_F16, f16_f16)
RPC_AD_KERNEL(RPC_BF16, RPC_BF16, bf16_bf16)
RPC_AD_KERNEL(RPC_F32, RPC_F32, f32_f32)
