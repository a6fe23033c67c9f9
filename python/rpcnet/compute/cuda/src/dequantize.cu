// Weight dequantization for the prefill path (N > 8): a weight matrix in block form becomes an
// f16 (or f32) matrix in a reused scratch, which cuBLAS then multiplies.
// One thread per element; rows of k elements, row stride in bytes; output is dense [rows, k].
// Launch: block 256, grid (ceil(k/256), min(rows, 65535)).
#include "blocks.cuh"
#include "common.cuh"

template <int T>
__device__ __forceinline__ float rpc_value_at(const uint8_t* row, int i) {
    return Blk<T>::value(row + (i / Blk<T>::QK) * Blk<T>::BYTES, i % Blk<T>::QK);
}

#define RPC_DEQUANT_KERNELS(T, name)                                                          \
    extern "C" __global__ void rpc_dequantize_##name##_f16(const uint8_t* src, uint16_t* dst,   \
                                                           int k, long long row_bytes,     \
                                                           long long rows) {                    \
        const int i = blockIdx.x * blockDim.x + threadIdx.x;                                    \
        if (i >= k) return;                                                                     \
        RPC_FOR_ROWS_Y(row, rows) {                                                             \
            dst[row * k + i] = rpc_float_to_half(rpc_value_at<T>(src + row * row_bytes, i));    \
        }                                                                                       \
    }                                                                                           \
    extern "C" __global__ void rpc_dequantize_##name##_f32(const uint8_t* src, float* dst, int k, \
                                                           long long row_bytes,                 \
                                                           long long rows) {                    \
        const int i = blockIdx.x * blockDim.x + threadIdx.x;                                    \
        if (i >= k) return;                                                                     \
        RPC_FOR_ROWS_Y(row, rows) { dst[row * k + i] = rpc_value_at<T>(src + row * row_bytes, i); } \
    }
RPC_FOR_WEIGHT_TYPES(RPC_DEQUANT_KERNELS)
