// RoPE's rotation of one pair, shared by rope.cu and the fused Q/K products of matvec_group.cu:
// theta = position * theta_scale^fidx / ff (frequency factor), scaled by freq_scale and mixed
// with the unscaled angle by YaRN's ramp over the pair index p; cos and sin times mscale.
#pragma once
#include "common.cuh"

struct RpcRopeFreq {
    float theta_scale, freq_scale, ext_factor, mscale, corr_lo, corr_hi;
};

__device__ __forceinline__ void rpc_rope_cs(const RpcRopeFreq& f, float position, int fidx, int p,
                                            float ff, float* c, float* s) {
    const float theta_extrap = position * powf(f.theta_scale, (float)fidx) / ff;
    float theta = f.freq_scale * theta_extrap;
    if (f.ext_factor != 0.0f) {
        const float y = (p - f.corr_lo) / fmaxf(0.001f, f.corr_hi - f.corr_lo);
        const float ramp = (1.0f - fminf(1.0f, fmaxf(0.0f, y))) * f.ext_factor;
        theta = theta * (1.0f - ramp) + theta_extrap * ramp;
    }
    *c = cosf(theta) * f.mscale;
    *s = sinf(theta) * f.mscale;
}
