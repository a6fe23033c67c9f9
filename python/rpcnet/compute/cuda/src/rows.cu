// GET_ROWS (any weight type -> f32) and SET_ROWS (f32 -> f32/f16/bf16/q8_0), ggml semantics:
//   get_rows: src [ne00, ne01, ne02, ne03], ids int32 [ne10, ne11, ne12];
//             dst row (i10, i11, i12) = src row ids[i10, i11, i12] of plane (i11, i12).
//   set_rows: src f32 [ne00, ne01, ne02, ne03], ids int64/int32 [ne01, ne11, ne12];
//             dst row ids[i01, i02 % ne11, i03 % ne12] of plane (i02, i03) = src row (i01..i03).
// Byte strides everywhere (ids too), so views of any layout work. Ids are a client's data: a
// get_rows id outside the source's rows gives a row of zeros, a set_rows id outside the
// destination's rows writes nothing (the CPU device refuses the graph instead).
#include "blocks.cuh"
#include "common.cuh"

// Launch: block 256, grid (ceil(ne00/256), min(ne10, 65535), ne11*ne12).
#define RPC_GET_ROWS_KERNEL(T, name)                                                              \
    extern "C" __global__ void rpc_get_rows_##name(                                              \
        const uint8_t* src, const uint8_t* ids, float* dst, int ne00, int ne11, long long nb01,  \
        long long nb02, long long nb03, long long ib0, long long ib1, long long ib2,             \
        long long db1, long long db2, long long db3, long long ne10, long long src_rows) {       \
        const int i = blockIdx.x * blockDim.x + threadIdx.x;                                     \
        if (i >= ne00) return;                                                                   \
        const long long i11 = blockIdx.z % ne11, i12 = blockIdx.z / ne11;                        \
        RPC_FOR_ROWS_Y(i10, ne10) {                                                              \
            const int row = *(const int*)(ids + i10 * ib0 + i11 * ib1 + i12 * ib2);              \
            float* d = (float*)((uint8_t*)dst + i10 * db1 + i11 * db2 + i12 * db3);               \
            if (row < 0 || row >= src_rows) { /* a client's bad id reads nothing: zeros */       \
                d[i] = 0.0f;                                                                     \
                continue;                                                                        \
            }                                                                                    \
            const uint8_t* s = src + row * nb01 + i11 * nb02 + i12 * nb03;                        \
            d[i] = Blk<T>::value(s + (i / Blk<T>::QK) * Blk<T>::BYTES, i % Blk<T>::QK);          \
        }                                                                                        \
    }
RPC_FOR_WEIGHT_TYPES(RPC_GET_ROWS_KERNEL)

__device__ __forceinline__ long long rpc_set_rows_dst(const uint8_t* ids, int ids_i64, long long i01,
                                                      long long i02, long long i03, int ne11,
                                                      int ne12, long long ib0, long long ib1,
                                                      long long ib2) {
    const uint8_t* p = ids + i01 * ib0 + (i02 % ne11) * ib1 + (i03 % ne12) * ib2;
    return ids_i64 ? *(const long long*)p : (long long)*(const int*)p;
}

#define RPC_SET_ROWS_ARGS                                                                        \
    const float *src, const uint8_t *ids, int ids_i64, uint8_t *dst, int ne00, int ne02,          \
        int ne11, int ne12, long long sb1, long long sb2, long long sb3, long long ib0,           \
        long long ib1, long long ib2, long long db1, long long db2, long long db3,                \
        long long ne01, long long dst_rows
#define RPC_SET_ROWS_PASS                                                                        \
    src, ids, ids_i64, dst, ne00, ne02, ne11, ne12, sb1, sb2, sb3, ib0, ib1, ib2, db1, db2, db3,  \
        ne01, dst_rows

// The rows of this block's plane (blockIdx.z over ne02*ne03, rows on grid.y) whose ids land
// inside the destination: put(source row, destination row).
template <typename F>
__device__ __forceinline__ void rpc_set_rows_each(RPC_SET_ROWS_ARGS, F put) {
    const long long i02 = blockIdx.z % ne02, i03 = blockIdx.z / ne02;
    RPC_FOR_ROWS_Y(i01, ne01) {
        const long long row =
            rpc_set_rows_dst(ids, ids_i64, i01, i02, i03, ne11, ne12, ib0, ib1, ib2);
        if (row < 0 || row >= dst_rows) continue;  // a client's bad id writes nothing
        const float* s = (const float*)((const uint8_t*)src + i01 * sb1 + i02 * sb2 + i03 * sb3);
        put(s, dst + row * db1 + i02 * db2 + i03 * db3);
    }
}

// Launch: block 256, grid (ceil(ne00/256), min(ne01, 65535), ne02*ne03).
template <typename E>
__device__ __forceinline__ void rpc_set_rows(RPC_SET_ROWS_ARGS) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= ne00) return;
    rpc_set_rows_each(RPC_SET_ROWS_PASS, [&](const float* s, uint8_t* d) {
        E::store((typename E::T*)d + i, s[i]);
    });
}

#define RPC_SET_ROWS_KERNEL(E, name)                                                             \
    extern "C" __global__ void rpc_set_rows_##name(RPC_SET_ROWS_ARGS) {                          \
        rpc_set_rows<E>(RPC_SET_ROWS_PASS);                                                       \
    }
RPC_SET_ROWS_KERNEL(RpcF32, f32)
RPC_SET_ROWS_KERNEL(RpcF16, f16)
RPC_SET_ROWS_KERNEL(RpcBF16, bf16)

// q8_0 destination (quantized KV cache): one warp per 32-value block, like ggml's quantizer
// (d = amax/127, q = round(x / d)).
// Launch: block (32, 8), grid (ceil(ne00/32/8), min(ne01, 65535), ne02*ne03).
extern "C" __global__ void rpc_set_rows_q8_0(RPC_SET_ROWS_ARGS) {
    const int blk = blockIdx.x * blockDim.y + threadIdx.y;
    if (blk >= ne00 / 32) return;
    rpc_set_rows_each(RPC_SET_ROWS_PASS, [&](const float* s, uint8_t* out) {
        const float v = s[blk * 32 + threadIdx.x];
        const float amax = rpc_warp_max(fabsf(v));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        uint8_t* b = out + blk * 34;
        b[2 + threadIdx.x] = (uint8_t)(int8_t)roundf(v * id);
        if (threadIdx.x == 0) {
            *(uint16_t*)b = rpc_float_to_half(d);  // rows and blocks are 34 bytes: 2-byte aligned
        }
    });
}
