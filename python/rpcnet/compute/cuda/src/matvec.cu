// Decode-path matrix-vector products (MUL_MAT with N <= 8 activation columns), ggml layout:
// W is [K, M] (rows of K elements, row stride in bytes), activations are N columns of K.
//
// Quantized weights: MMVQ-style. The activations are quantized once to q8_1 (quantize.cu);
// each warp owns one weight row and its lanes walk the row's 32-element groups, unpacking each
// group once and dotting it with all N activation columns with dp4a. Weights are read once, in
// their block form.
//
// Float weights (F32/F16/BF16): the activations stay f32 so results keep float accuracy.
//
// `add` (optional, laid out as dst, may be dst itself): dst = W y + add, the residual ADD after
// a projection.
//
// Launch (both kinds): block (32, RPC_MV_WARPS), grid (ceil(M / RPC_MV_WARPS), channels); the
// *_split_* kernels (wide rows): the same block, grid (M, channels).
// Channels cover ne2*ne3 of dst; the weight channel is channel / ratio (ggml broadcasting).
#include "matvec.cuh"

#define RPC_MV_ROW_ARGS(Y)                                                                       \
    const uint8_t *w, const Y *y, float *dst, const float *add, int k, int m, int ncols,          \
        long long w_row_bytes, long long w_chan_bytes, long long y_col, long long y_chan,         \
        long long dst_col, long long dst_chan, int ratio
#define RPC_MV_ROW_PASS                                                                          \
    w, y, dst, add, k, m, ncols, w_row_bytes, w_chan_bytes, y_col, y_chan, dst_col, dst_chan, ratio

#define RPC_MMVQ_KERNELS(T, name)                                                                \
    RPC_MV_KERNEL_PAIR(rpc_mmvq, name, RPC_MV_ROW_ARGS(uint8_t), RPC_MV_ROW_PASS, rpc_mv_rows, T, \
                       uint8_t)
RPC_FOR_QUANT_TYPES(RPC_MMVQ_KERNELS)

#define RPC_MMV_FLOAT_KERNELS(T, name)                                                           \
    RPC_MV_KERNEL_PAIR(rpc_mmv, name, RPC_MV_ROW_ARGS(float), RPC_MV_ROW_PASS, rpc_mv_rows, T,   \
                       float)
RPC_FOR_FLOAT_TYPES(RPC_MMV_FLOAT_KERNELS)

// MUL_MAT_ID decode (MoE): for token t and expert slot e, dst[:, e, t] = W[ids[e, t]] @ y[:, e %
// ne11, t], W being [K, M, n_expert]. Same per-warp-row scheme as above, one activation column
// per (slot, token). Launch: block (32, RPC_MV_WARPS), grid (ceil(M / RPC_MV_WARPS), n_slots,
// n_tokens). ids strides are in int32 elements, dst strides in floats; y strides are in bytes
// for q8_1 (per activation column, per token) and in floats for the float kernels.
// One lane's share of a weight row . activation column: q8_1 activations (QUANT) or f32.
template <int T, bool QUANT> struct RpcRowDot;
template <int T> struct RpcRowDot<T, true> {
    static __device__ __forceinline__ float lane(const uint8_t* wrow, const uint8_t* yq, int k) {
        const int subs_per_block = Blk<T>::QK / 32;
        float acc = 0.0f;
        for (int s = threadIdx.x; s < k / 32; s += RPC_WARP) {
            const RpcSub sub = Blk<T>::sub(wrow + (s / subs_per_block) * Blk<T>::BYTES,
                                           s % subs_per_block);
            acc += rpc_dot_sub_q8_1<rpc_act_q8_k(T)>(sub, yq + s * RPC_Q8_1_BYTES);
        }
        return acc;
    }
};
template <int T> struct RpcRowDot<T, false> {
    static __device__ __forceinline__ float lane(const uint8_t* wrow, const uint8_t* y, int k) {
        const float* yf = (const float*)y;
        float acc = 0.0f;
        for (int i = threadIdx.x; i < k; i += RPC_WARP) {
            acc += Blk<T>::value(wrow + i * Blk<T>::BYTES, 0) * rpc_act<T>(yf[i]);
        }
        return acc;
    }
};

template <int T, bool QUANT>
__device__ __forceinline__ void rpc_mmv_id(const uint8_t* __restrict__ w, const uint8_t* __restrict__ y,
                                           const int* __restrict__ ids, float* __restrict__ dst,
                                           int k, int m, long long w_row_bytes,
                                           long long w_expert_bytes, int ne11, long long y_col,
                                           long long y_tok, long long ids_slot, long long ids_tok,
                                           long long dst_slot, long long dst_tok, int n_expert) {
    const int row = blockIdx.x * RPC_MV_WARPS + threadIdx.y;
    if (row >= m) return;
    const int slot = blockIdx.y, tok = blockIdx.z;
    const int expert = ids[slot * ids_slot + tok * ids_tok];
    if (expert < 0 || expert >= n_expert) {  // a client's bad id reads no weights: zeros
        if (threadIdx.x == 0) dst[slot * dst_slot + tok * dst_tok + row] = 0.0f;
        return;
    }
    const uint8_t* wrow = w + expert * w_expert_bytes + row * w_row_bytes;
    const long long ycol = (slot % ne11) * y_col + tok * y_tok;
    float acc = RpcRowDot<T, QUANT>::lane(wrow, y + (QUANT ? ycol : ycol * 4), k);
    acc = rpc_warp_sum(acc);
    if (threadIdx.x == 0) dst[slot * dst_slot + tok * dst_tok + row] = acc;
}

#define RPC_MMV_ID_ARGS                                                                          \
    const uint8_t *w, const uint8_t *y, const int *ids, float *dst, int k, int m,                 \
        long long w_row_bytes, long long w_expert_bytes, int ne11, long long y_col, long long y_tok, \
        long long ids_slot, long long ids_tok, long long dst_slot, long long dst_tok, int n_expert
#define RPC_MMV_ID_PASS                                                                          \
    w, y, ids, dst, k, m, w_row_bytes, w_expert_bytes, ne11, y_col, y_tok, ids_slot, ids_tok,     \
        dst_slot, dst_tok, n_expert

#define RPC_MMVQ_ID_KERNEL(T, name)                                                              \
    extern "C" __global__ void __launch_bounds__(RPC_WARP * RPC_MV_WARPS)                         \
        rpc_mmvq_id_##name(RPC_MMV_ID_ARGS) {                                                     \
        rpc_mmv_id<T, true>(RPC_MMV_ID_PASS);                                                     \
    }
RPC_FOR_QUANT_TYPES(RPC_MMVQ_ID_KERNEL)

#define RPC_MMV_ID_FLOAT_KERNEL(T, name)                                                         \
    extern "C" __global__ void __launch_bounds__(RPC_WARP * RPC_MV_WARPS)                         \
        rpc_mmv_id_##name(RPC_MMV_ID_ARGS) {                                                      \
        rpc_mmv_id<T, false>(RPC_MMV_ID_PASS);                                                    \
    }
RPC_FOR_FLOAT_TYPES(RPC_MMV_ID_FLOAT_KERNEL)
