// Host build of the CUDA block math (python/rpcnet/compute/cuda/src/blocks.cuh) for the tests:
// the very functions the kernels call, exported with C linkage for ctypes.
#include "blocks.cuh"

template <int T> static void dequantize_row(const uint8_t* src, float* dst, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        const int64_t blk = i / Blk<T>::QK;
        dst[i] = Blk<T>::value(src + blk * Blk<T>::BYTES, (int)(i % Blk<T>::QK));
    }
}

template <int T> static float dot_row(const uint8_t* w, const uint8_t* y, int64_t n) {
    float acc = 0.0f;
    const int64_t sub_per_block = Blk<T>::QK / 32;
    for (int64_t b = 0; b < n / Blk<T>::QK; ++b) {
        acc += rpc_dot_block_q8_1<T>(w + b * Blk<T>::BYTES, y + b * sub_per_block * RPC_Q8_1_BYTES);
    }
    return acc;
}

extern "C" {

int rpc_block_bytes(int type, int* qk) {
#define X(T, name) \
    if (type == T) { *qk = Blk<T>::QK; return Blk<T>::BYTES; }
    RPC_FOR_WEIGHT_TYPES(X)
#undef X
    return -1;
}

int rpc_dequantize(int type, const uint8_t* src, float* dst, int64_t n) {
#define X(T, name) \
    if (type == T) { dequantize_row<T>(src, dst, n); return 0; }
    RPC_FOR_WEIGHT_TYPES(X)
#undef X
    return -1;
}

void rpc_quantize_q8_1(const float* x, uint8_t* out, int64_t n) {
    for (int64_t b = 0; b < n / 32; ++b) rpc_quantize_q8_1_block(x + 32 * b, out + RPC_Q8_1_BYTES * b);
}

int rpc_dot_q8_1(int type, const uint8_t* w, const uint8_t* y, int64_t n, float* out) {
#define X(T, name) \
    if (type == T) { *out = dot_row<T>(w, y, n); return 0; }
    RPC_FOR_QUANT_TYPES(X)
#undef X
    return -1;
}

uint16_t rpc_host_float_to_half(float f) { return rpc_float_to_half(f); }
float rpc_host_half_to_float(uint16_t h) { return rpc_half_to_float(h); }
uint16_t rpc_host_float_to_bf16(float f) { return rpc_float_to_bf16(f); }
int rpc_host_dp4a(int a, int b, int c) { return rpc_dp4a(a, b, c); }

}

extern "C" uint32_t rpc_host_prmt(uint32_t x, uint32_t y, uint32_t s) { return rpc_prmt(x, y, s); }
