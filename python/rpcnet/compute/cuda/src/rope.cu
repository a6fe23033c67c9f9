// ROPE on f32/f16 rows, modes NORMAL (0: pairs 2k, 2k+1), NEOX (2: pairs k, k + n_dims/2),
// MROPE (8) and IMROPE (40) (neox pairs, the position stream chosen per pair by the sections),
// and VISION (24: pairs k, k + n_dims, each section restarting the frequency index), with YaRN.
// x is [ne0, ne1 (heads), ne2 (tokens), ne3]; positions are int32 [ne2] or [4 * ne2] (streams
// t, h, w, e for the multi-position modes). Dimensions past the rotated ones are copied.
// The host passes theta_scale = freq_base^(-2/n_dims), the YaRN corr dims, and mscale
// (attn_factor, already corrected for ext_factor as ggml does).
// Launch: block 256, grid (ceil(ne0/2 / 256), min(nrows, 65535)), nrows = ne1*ne2*ne3; element strides for x and dst.
#include "rope.cuh"

#define RPC_ROPE_NORMAL 0
#define RPC_ROPE_NEOX 2
#define RPC_ROPE_MROPE 8
#define RPC_ROPE_VISION 24
#define RPC_ROPE_IMROPE 40

struct RpcRopeArgs {
    int ne0, ne1, ne2, n_dims, mode, s0, s1, s2, s3;
    float theta_scale, freq_scale, ext_factor, mscale, corr_lo, corr_hi;
};

// Which position stream pair k reads and its frequency index.
__device__ __forceinline__ void rpc_rope_stream(const RpcRopeArgs& a, int k, int* stream, int* fidx) {
    *stream = 0;
    *fidx = k;
    if (!(a.mode & RPC_ROPE_MROPE)) return;
    const int sect_dims = a.s0 + a.s1 + a.s2 + a.s3;
    const int sector = k % sect_dims;
    if (a.mode == RPC_ROPE_IMROPE) {
        if (sector % 3 == 1 && sector < 3 * a.s1) *stream = 1;
        else if (sector % 3 == 2 && sector < 3 * a.s2) *stream = 2;
        else if (sector % 3 == 0 && sector < 3 * a.s0) *stream = 0;
        else *stream = 3;
        return;
    }
    const int w0 = a.s0, w1 = a.s0 + a.s1, w2 = a.s0 + a.s1 + a.s2;
    *stream = sector < w0 ? 0 : sector < w1 ? 1 : sector < w2 ? 2 : 3;
    if (a.mode == RPC_ROPE_VISION) {
        const int start = *stream == 0 ? 0 : *stream == 1 ? w0 : *stream == 2 ? w1 : w2;
        *fidx = sector - start;
    }
}

template <typename E>
__device__ __forceinline__ void rpc_rope_row(const typename E::T* x, const int* pos,
                                             const float* ff, typename E::T* dst,
                                             const RpcRopeArgs& a, long long xs1, long long xs2,
                                             long long xs3, long long ds1, long long ds2,
                                             long long ds3, int p, long long r) {
    const int i1 = (int)(r % a.ne1), i2 = (int)((r / a.ne1) % a.ne2);
    const long long i3 = r / ((long long)a.ne1 * a.ne2);
    const typename E::T* xr = x + i1 * xs1 + i2 * xs2 + i3 * xs3;
    typename E::T* dr = dst + i1 * ds1 + i2 * ds2 + i3 * ds3;

    const bool vision = a.mode == RPC_ROPE_VISION;
    const int n_rot = vision ? a.n_dims : a.n_dims / 2;
    if (p >= n_rot) {  // past the rotated pairs: copy (vision has none: ne0 == 2 * n_dims)
        if (vision) return;
        const int j = 2 * p;
        E::store(dr + j, E::load(xr + j));
        E::store(dr + j + 1, E::load(xr + j + 1));
        return;
    }
    int j0, j1;
    if (a.mode == RPC_ROPE_NORMAL) {
        j0 = 2 * p;
        j1 = 2 * p + 1;
    } else {
        j0 = p;
        j1 = p + n_rot;
    }
    int stream, fidx;
    rpc_rope_stream(a, p, &stream, &fidx);
    const float position = (float)pos[i2 + (long long)a.ne2 * stream];
    const RpcRopeFreq f = {a.theta_scale, a.freq_scale, a.ext_factor,
                           a.mscale,      a.corr_lo,    a.corr_hi};
    float c, s;
    rpc_rope_cs(f, position, fidx, p, ff ? ff[p] : 1.0f, &c, &s);
    const float x0 = E::load(xr + j0), x1 = E::load(xr + j1);
    E::store(dr + j0, x0 * c - x1 * s);
    E::store(dr + j1, x0 * s + x1 * c);
}

template <typename E>
__device__ __forceinline__ void rpc_rope(const typename E::T* x, const int* pos, const float* ff,
                                         typename E::T* dst, const RpcRopeArgs& a, long long xs1,
                                         long long xs2, long long xs3, long long ds1, long long ds2,
                                         long long ds3, long long nrows) {
    const int p = blockIdx.x * blockDim.x + threadIdx.x;  // pair index within the row
    if (2 * p >= a.ne0) return;
    RPC_FOR_ROWS_Y(r, nrows) rpc_rope_row<E>(x, pos, ff, dst, a, xs1, xs2, xs3, ds1, ds2, ds3, p, r);
}

#define RPC_ROPE_KERNEL(E, name)                                                                 \
    extern "C" __global__ void rpc_rope_##name(                                                  \
        const E::T* x, const int* pos, const float* ff, E::T* dst, int ne0, int ne1, int ne2,      \
        long long xs1, long long xs2, long long xs3, long long ds1, long long ds2, long long ds3,  \
        int n_dims, int mode, int s0, int s1, int s2, int s3, float theta_scale, float freq_scale, \
        float ext_factor, float mscale, float corr_lo, float corr_hi, long long nrows) {          \
        const RpcRopeArgs a = {ne0,         ne1,        ne2,        n_dims, mode,    s0,     s1,  \
                               s2,          s3,         theta_scale, freq_scale, ext_factor,      \
                               mscale,      corr_lo,    corr_hi};                                 \
        rpc_rope<E>(x, pos, ff, dst, a, xs1, xs2, xs3, ds1, ds2, ds3, nrows);                     \
    }
RPC_ROPE_KERNEL(RpcF32, f32)
RPC_ROPE_KERNEL(RpcF16, f16)
