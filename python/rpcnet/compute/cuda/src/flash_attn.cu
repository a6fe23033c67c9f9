// FLASH_ATTN_EXT for few query rows (decode), K/V as f16, bf16 or q8_0 views, f32 Q, optional f16
// mask, ALiBi, logit softcap and per-head sinks. ggml layouts:
//   q [D, n_q, H, B] f32, k [D, n_kv, H_kv, B], v [Dv, n_kv, H_kv, B], f16 mask
//   [n_kv, >=n_q, 1|H, 1|B] (broadcast over heads and sequences),
//   dst [Dv, H, n_q, B] f32 (contiguous), head h reads K/V head h / (H / H_kv).
// One block per (query row, head, batch). f16 V: one warp walks the kv positions in order as
// ggml's CPU kernel does (Q rounded to f16, the V sums kept in f16, the sink merged last).
// Otherwise RPC_FA_WARPS warps: warp w takes kv positions w, w + RPC_FA_WARPS, ... with an
// online softmax (running max m, sum l, accumulator of Dv spread over the lanes), and the
// warps' partial results are merged through shared memory.
// D and Dv up to 32 * RPC_FA_PER_LANE (512). `q8` (optional, Dv a multiple of 32): the output
// also as q8_1 blocks, in the order of dst, for the product that reads it (quantize.cuh).
#include "quantize.cuh"

#define RPC_FA_WARPS 4
#define RPC_FA_PER_LANE 16

template <int T>
__device__ __forceinline__ float rpc_fa_load(const uint8_t* row, int i) {
    return Blk<T>::value(row + (i / Blk<T>::QK) * Blk<T>::BYTES, i % Blk<T>::QK);
}

template <int KT, int VT>
__device__ __forceinline__ void rpc_flash_attn(
    const float* q, const uint8_t* k, const uint8_t* v, const uint16_t* mask, const float* sinks,
    float* dst, int d, int dv, int n_q, int n_kv, int n_head, int n_head_kv, long long qs1,
    long long qs2, long long qs3, long long kb1, long long kb2, long long kb3, long long vb1,
    long long vb2, long long vb3, long long ms1, long long ms2, long long ms3, int mne2,
    int mne3, float scale,
    float max_bias, float m0, float m1, int n_head_log2, float softcap, uint8_t* q8) {
    __shared__ float s_m[RPC_FA_WARPS], s_l[RPC_FA_WARPS];
    __shared__ float s_acc[RPC_FA_WARPS][32 * RPC_FA_PER_LANE];

    const int iq = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int warp = threadIdx.y, lane = threadIdx.x;
    const int hk = h / (n_head / n_head_kv);
    const float* qr = q + iq * qs1 + h * qs2 + b * qs3;
    const uint8_t* kh = k + hk * kb2 + b * kb3;
    const uint8_t* vh = v + hk * vb2 + b * vb3;
    const uint16_t* mr = mask != nullptr ? mask + iq * ms1 + (h % mne2) * ms2 + (b % mne3) * ms3
                                         : nullptr;
    float slope = 1.0f;
    if (max_bias > 0.0f) {
        slope = h < n_head_log2 ? powf(m0, h + 1) : powf(m1, 2 * (h - n_head_log2) + 1);
    }

    float qv[RPC_FA_PER_LANE], acc[RPC_FA_PER_LANE];
#pragma unroll
    for (int t = 0; t < RPC_FA_PER_LANE; ++t) {
        const int i = lane + 32 * t;
        // f16 (bf16) K: Q rounded to f16 (bf16) first, as ggml's CPU kernel converts it for
        // the K type's dot product
        const float qi = i < d ? qr[i] : 0.0f;
        qv[t] = KT == RPC_F16    ? rpc_half_to_float(rpc_float_to_half(qi))
                : KT == RPC_BF16 ? rpc_bf16_to_float(rpc_float_to_bf16(qi))
                                 : qi;
        acc[t] = 0.0f;
    }
    // f16 V: one warp walks the positions in order with the accumulator kept in f16, exactly
    // as ggml's CPU kernel does (the launcher gives such blocks one warp); else the block's
    // warps take every nw-th position and merge at the end.
    const bool seq = VT == RPC_F16;
    const int nw = seq ? 1 : RPC_FA_WARPS;  // the launcher's block: (32, nw)
    float m = seq ? -__int_as_float(0x7f800000) : -3.402823466e38f, l = 0.0f;
    for (int j = warp; j < n_kv; j += nw) {
        const float mv = mr != nullptr ? slope * rpc_half_to_float(mr[j]) : 0.0f;
        if (mv == -__int_as_float(0x7f800000)) continue;  // masked out
        const uint8_t* kr = kh + j * kb1;
        float s = 0.0f;
#pragma unroll
        for (int t = 0; t < RPC_FA_PER_LANE; ++t) {
            const int i = lane + 32 * t;
            if (i < d) s += qv[t] * rpc_fa_load<KT>(kr, i);
        }
        s = rpc_warp_sum(s) * scale;  // scale already divided by softcap (launch.py)
        if (softcap != 0.0f) s = softcap * tanhf(s);
        s += mv;
        const uint8_t* vr = vh + j * vb1;
        if (seq) {
            float ms = 1.0f, vs = 1.0f;
            if (s > m) {  // a new maximum: the f16 sums scaled down, this position weighs 1
                ms = expf(m - s);
                m = s;
#pragma unroll
                for (int t = 0; t < RPC_FA_PER_LANE; ++t) {
                    acc[t] = rpc_half_to_float(rpc_float_to_half(acc[t] * ms));
                }
            } else {
                vs = expf(s - m);
            }
#pragma unroll
            for (int t = 0; t < RPC_FA_PER_LANE; ++t) {
                const int i = lane + 32 * t;
                if (i < dv) {
                    const float vi = rpc_fa_load<VT>(vr, i);
                    acc[t] = rpc_half_to_float(rpc_float_to_half(fmaf(vi, vs, acc[t])));
                }
            }
            l = fmaf(l, ms, vs);
            continue;
        }
        const float m_new = fmaxf(m, s);
        const float corr = expf(m - m_new), p = expf(s - m_new);
        l = l * corr + p;
#pragma unroll
        for (int t = 0; t < RPC_FA_PER_LANE; ++t) {
            const int i = lane + 32 * t;
            if (i < dv) acc[t] = acc[t] * corr + p * rpc_fa_load<VT>(vr, i);
        }
        m = m_new;
    }
    if (seq) {  // one warp: the sink merged in f32 as the CPU does, then 1/S
        if (sinks != nullptr) {
            const float ss = sinks[h];
            float ms = 1.0f, vs = 1.0f;
            if (ss > m) {
                ms = expf(m - ss);
#pragma unroll
                for (int t = 0; t < RPC_FA_PER_LANE; ++t) acc[t] *= ms;
            } else {
                vs = expf(ss - m);
            }
            l = l * ms + vs;
        }
        const float inv = l == 0.0f ? 0.0f : 1.0f / l;
        const long long at = (((long long)b * n_q + iq) * n_head + h) * dv;
#pragma unroll
        for (int t = 0; t < RPC_FA_PER_LANE; ++t) {
            const int i = lane + 32 * t;
            if (i < dv) dst[at + i] = acc[t] * inv;
            if (q8 != nullptr && 32 * t < dv) {  // warp-uniform: dv is a multiple of 32
                rpc_q8_1_block_warp(acc[t] * inv, q8 + (at / 32 + t) * RPC_Q8_1_BYTES);
            }
        }
        return;
    }
    if (lane == 0) {
        s_m[warp] = m;
        s_l[warp] = l;
    }
#pragma unroll
    for (int t = 0; t < RPC_FA_PER_LANE; ++t) s_acc[warp][lane + 32 * t] = acc[t];
    __syncthreads();
    if (warp != 0) return;

    float mx = sinks != nullptr ? sinks[h] : -3.402823466e38f;
    for (int w = 0; w < nw; ++w) mx = fmaxf(mx, s_m[w]);
    float total = sinks != nullptr ? expf(sinks[h] - mx) : 0.0f;
    for (int w = 0; w < nw; ++w) total += s_l[w] * expf(s_m[w] - mx);
    const float inv = total > 0.0f ? 1.0f / total : 0.0f;
    const long long at = (((long long)b * n_q + iq) * n_head + h) * dv;
#pragma unroll
    for (int t = 0; t < RPC_FA_PER_LANE; ++t) {
        const int i = lane + 32 * t;
        if (32 * t >= dv) break;  // warp-uniform; lanes past dv (dv not a multiple of 32) idle
        float o = 0.0f;
        if (i < dv) {
            for (int w = 0; w < nw; ++w) o += s_acc[w][i] * expf(s_m[w] - mx);
            dst[at + i] = o * inv;
        }
        if (q8 != nullptr) rpc_q8_1_block_warp(o * inv, q8 + (at / 32 + t) * RPC_Q8_1_BYTES);
    }
}

#define RPC_FA_KERNEL(KT, VT, name)                                                              \
    extern "C" __global__ void __launch_bounds__(32 * RPC_FA_WARPS) rpc_flash_attn_##name(        \
        const float* q, const uint8_t* k, const uint8_t* v, const uint16_t* mask,                \
        const float* sinks, float* dst, int d, int dv, int n_q, int n_kv, int n_head,             \
        int n_head_kv, long long qs1, long long qs2, long long qs3, long long kb1, long long kb2, \
        long long kb3, long long vb1, long long vb2, long long vb3, long long ms1, long long ms2, \
        long long ms3, int mne2, int mne3, float scale, float max_bias, float m0, float m1,      \
        int n_head_log2, float softcap, uint8_t* q8) {                                            \
        rpc_flash_attn<KT, VT>(q, k, v, mask, sinks, dst, d, dv, n_q, n_kv, n_head, n_head_kv,    \
                               qs1, qs2, qs3, kb1, kb2, kb3, vb1, vb2, vb3, ms1, ms2, ms3, mne2,  \
                               mne3, scale, max_bias, m0, m1, n_head_log2, softcap, q8);          \
    }
RPC_FA_KERNEL(RPC_F16, RPC_F16, f16_f16)
RPC_FA_KERNEL(RPC_Q8_0, RPC_Q8_0, q8_0_q8_0)
RPC_FA_KERNEL(RPC_F16, RPC_Q8_0, f16_q8_0)
RPC_FA_KERNEL(RPC_Q8_0, RPC_F16, q8_0_f16)
RPC_FA_KERNEL(RPC_BF16, RPC_BF16, bf16_bf16)
