// Element-wise f32 ops: ADD/SUB/MUL/DIV with ggml broadcasting (src1 repeats along any dim where
// its extent divides dst's), SCALE (x * s + b), SQR/SQRT/SIN/COS/LOG, and the UNARY family with
// ggml's enum ggml_unary_op ids. Any layout: shapes and byte strides per operand; elements are
// walked in dst's logical order with a grid-stride loop.
// Launch: block 256, grid min(ceil(n / 256), 65535).
#include "common.cuh"

struct RpcShape4 {
    long long ne0, ne1, ne2, ne3;
    long long nb0, nb1, nb2, nb3;
};

__device__ __forceinline__ long long rpc_offset4(long long i0, long long i1, long long i2,
                                                 long long i3, const RpcShape4& s) {
    return i0 * s.nb0 + i1 * s.nb1 + i2 * s.nb2 + i3 * s.nb3;
}

// f(i0, i1, i2, i3) for every element of [ne0, ne1, ne2, ne3], in logical order, grid-stride.
template <typename F>
__device__ __forceinline__ void rpc_for_each4(long long ne0, long long ne1, long long ne2,
                                              long long ne3, F f) {
    const long long n = ne0 * ne1 * ne2 * ne3;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const long long i0 = i % ne0, i1 = (i / ne0) % ne1, i2 = (i / (ne0 * ne1)) % ne2;
        f(i0, i1, i2, i / (ne0 * ne1 * ne2));
    }
}

__device__ __forceinline__ float rpc_binary(int op, float a, float b) {
    switch (op) {
        case 0: return a + b;
        case 1: return a - b;
        case 2: return a * b;
        default: return a / b;
    }
}

// op: 0 ADD, 1 SUB, 2 MUL, 3 DIV
extern "C" __global__ void rpc_binary_f32(
    int op, const uint8_t* a, const uint8_t* b, uint8_t* dst, long long ne0, long long ne1,
    long long ne2, long long ne3, long long anb0, long long anb1, long long anb2, long long anb3,
    long long bne0, long long bne1, long long bne2, long long bne3, long long bnb0, long long bnb1,
    long long bnb2, long long bnb3, long long dnb0, long long dnb1, long long dnb2, long long dnb3) {
    const RpcShape4 as = {ne0, ne1, ne2, ne3, anb0, anb1, anb2, anb3};
    const RpcShape4 bs = {bne0, bne1, bne2, bne3, bnb0, bnb1, bnb2, bnb3};
    const RpcShape4 ds = {ne0, ne1, ne2, ne3, dnb0, dnb1, dnb2, dnb3};
    rpc_for_each4(ne0, ne1, ne2, ne3, [&](long long i0, long long i1, long long i2, long long i3) {
        const float x = *(const float*)(a + rpc_offset4(i0, i1, i2, i3, as));
        const float y = *(const float*)(b + rpc_offset4(i0 % bne0, i1 % bne1, i2 % bne2, i3 % bne3, bs));
        *(float*)(dst + rpc_offset4(i0, i1, i2, i3, ds)) = rpc_binary(op, x, y);
    });
}

// Unary ops by ggml_unary_op id (0 ABS ... 21 TRUNC; 17 XIELU is not here), plus rpcnet's own
// ids for the standalone ops: 100 SQR, 101 SQRT, 102 SIN, 103 COS, 104 LOG, 105 SCALE (p0*x+p1).
__device__ __forceinline__ float rpc_unary(int op, float x, float p0, float p1) {
    switch (op) {
        case 0: return fabsf(x);
        case 1: return (float)((x > 0.0f) - (x < 0.0f));
        case 2: return -x;
        case 3: return x > 0.0f ? 1.0f : 0.0f;
        case 4: return tanhf(x);
        case 5: return x > 0.0f ? x : expm1f(x);
        case 6: return fmaxf(x, 0.0f);
        case 7: return 1.0f / (1.0f + expf(-x));
        case 8: {
            const float c = 0.7978845608028654f;
            return 0.5f * x * (1.0f + tanhf(c * x * (1.0f + 0.044715f * x * x)));
        }
        case 9: return x / (1.0f + expf(-1.702f * x));
        case 10: return x / (1.0f + expf(-x));
        case 11: return x * fminf(1.0f, fmaxf(0.0f, (x + 3.0f) / 6.0f));
        case 12: return fminf(1.0f, fmaxf(0.0f, (x + 3.0f) / 6.0f));
        case 13: return expf(x);
        case 14: return expm1f(x);
        case 15: return x > 20.0f ? x : log1pf(expf(x));
        case 16: return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));
        case 18: return floorf(x);
        case 19: return ceilf(x);
        case 20: return roundf(x);
        case 21: return truncf(x);
        case 100: return x * x;
        case 101: return sqrtf(x);
        case 102: return sinf(x);
        case 103: return cosf(x);
        case 104: return logf(x);
        default: return x * p0 + p1;
    }
}

extern "C" __global__ void rpc_unary_f32(int op, const uint8_t* src, uint8_t* dst, long long ne0,
                                         long long ne1, long long ne2, long long ne3,
                                         long long snb0, long long snb1, long long snb2,
                                         long long snb3, long long dnb0, long long dnb1,
                                         long long dnb2, long long dnb3, float p0, float p1) {
    const RpcShape4 ss = {ne0, ne1, ne2, ne3, snb0, snb1, snb2, snb3};
    const RpcShape4 ds = {ne0, ne1, ne2, ne3, dnb0, dnb1, dnb2, dnb3};
    rpc_for_each4(ne0, ne1, ne2, ne3, [&](long long i0, long long i1, long long i2, long long i3) {
        const float x = *(const float*)(src + rpc_offset4(i0, i1, i2, i3, ss));
        *(float*)(dst + rpc_offset4(i0, i1, i2, i3, ds)) = rpc_unary(op, x, p0, p1);
    });
}
