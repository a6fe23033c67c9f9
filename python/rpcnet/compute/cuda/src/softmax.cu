// SOFT_MAX (f32) with ggml's extras: scale, an optional f32/f16 mask broadcast over heads and
// sequences, ALiBi slopes (max_bias) and optional per-head attention sinks (a logit that joins
// the normalization but has no output column). One block per row; rows over ne1 (rows per
// head), ne2 (heads), ne3. The mask row for (i1, i2, i3) is i1 of plane (i2 % mne2, i3 % mne3).
#include "common.cuh"

__device__ __forceinline__ float rpc_alibi_slope(float max_bias, int h, int n_head_log2, float m0,
                                                 float m1) {
    if (max_bias <= 0.0f) return 1.0f;
    return h < n_head_log2 ? powf(m0, h + 1) : powf(m1, 2 * (h - n_head_log2) + 1);
}

__device__ __forceinline__ float rpc_mask_at(const uint8_t* mask, int mask_type, long long i) {
    if (mask_type == 1) return ((const float*)mask)[i];
    if (mask_type == 2) return rpc_half_to_float(((const uint16_t*)mask)[i]);
    return 0.0f;
}

extern "C" __global__ void rpc_soft_max_f32(const float* x, const uint8_t* mask, int mask_type,
                                            const float* sinks, float* dst, int ncols, int ne1,
                                            int ne2, long long xs1, long long xs2, long long xs3,
                                            long long ds1, long long ds2, long long ds3,
                                            long long ms1, long long ms2, long long ms3, int mne2,
                                            int mne3, float scale, float max_bias, float m0,
                                            float m1, int n_head_log2) {
    __shared__ float scratch[32];
    const long long r = blockIdx.x;
    const int i1 = (int)(r % ne1), i2 = (int)((r / ne1) % ne2), i3 = (int)(r / ((long long)ne1 * ne2));
    const float* xr = x + i1 * xs1 + i2 * xs2 + i3 * xs3;
    float* dr = dst + i1 * ds1 + i2 * ds2 + i3 * ds3;
    const long long mrow = i1 * ms1 + (long long)(i2 % mne2) * ms2 + (long long)(i3 % mne3) * ms3;
    const float slope = rpc_alibi_slope(max_bias, i2, n_head_log2, m0, m1);

    const float inv = rpc_softmax_exp(
        ncols, blockDim.x, sinks, i2, scratch,
        [&](int i) { return xr[i] * scale + slope * rpc_mask_at(mask, mask_type, mrow + i); },
        [&](int i, float e) { dr[i] = e; });
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) dr[i] *= inv;
}
