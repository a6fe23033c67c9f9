// Portability layer: lets the same block math build with NVRTC/nvcc (device) and g++ (host tests).
// Device builds get PTX-backed conversions and dp4a; host builds get plain C equivalents.
#pragma once

#if defined(__CUDACC_RTC__)
// NVRTC has no libc headers: the fixed-width types it needs, spelled out.
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;
#else
#include <stdint.h>
#include <string.h>
#include <math.h>
#endif

#if defined(__CUDACC__)
#define RPC_DEVICE_BUILD 1
#else
// Host compiler: the CUDA qualifiers are no-ops.
#define __host__
#define __device__
#define __global__
#define __forceinline__ inline __attribute__((always_inline))
#define __restrict__ __restrict
#endif

#define RPC_HD __host__ __device__ __forceinline__

// A float's bits and back: intrinsics on the device, a byte copy on the host.
#ifdef RPC_DEVICE_BUILD
RPC_HD float rpc_bits_to_float(uint32_t bits) { return __int_as_float((int)bits); }
RPC_HD uint32_t rpc_float_to_bits(float f) { return (uint32_t)__float_as_int(f); }
#else
template <typename To, typename From> RPC_HD To rpc_bit_cast(From v) {
    To t;
    memcpy(&t, &v, sizeof t);
    return t;
}
RPC_HD float rpc_bits_to_float(uint32_t bits) { return rpc_bit_cast<float>(bits); }
RPC_HD uint32_t rpc_float_to_bits(float f) { return rpc_bit_cast<uint32_t>(f); }
#endif

// IEEE half -> float (exact for every half, subnormals included).
RPC_HD float rpc_half_to_float(uint16_t h) {
#ifdef RPC_DEVICE_BUILD
    float f;
    asm("{ cvt.f32.f16 %0, %1; }" : "=f"(f) : "h"(h));
    return f;
#else
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0x1f) return rpc_bits_to_float(sign | 0x7f800000u | (mant << 13));
    if (exp != 0) return rpc_bits_to_float(sign | ((exp + 112) << 23) | (mant << 13));
    if (mant == 0) return rpc_bits_to_float(sign);
    // Subnormal half: value is mant * 2^-24.
    const float v = (float)mant * (1.0f / 16777216.0f);
    return sign ? -v : v;
#endif
}

// float -> IEEE half, round to nearest even (what ggml's conversions do).
RPC_HD uint16_t rpc_float_to_half(float f) {
#ifdef RPC_DEVICE_BUILD
    // The half leaves the asm zero-extended in a 32-bit register: with a 16-bit ("h") output,
    // ptxas (CUDA 13, sm_90) byte-stored the wrong half of the register (the low byte came out
    // 0), seen on an H200.
    uint32_t h;
    asm("{ .reg .b16 t; cvt.rn.f16.f32 t, %1; cvt.u32.u16 %0, t; }" : "=r"(h) : "f"(f));
    return (uint16_t)h;
#else
    const uint32_t x = rpc_float_to_bits(f);
    const uint32_t sign = (x >> 16) & 0x8000u;
    const uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);  // rounds to infinity
    if (ax < 0x38800000u) {
        // Result is subnormal (or zero): shift the full mantissa, round to nearest even.
        if (ax < 0x33000000u) return (uint16_t)sign;
        const uint32_t e = ax >> 23;
        const uint32_t m = (ax & 0x7fffffu) | 0x800000u;
        const uint32_t shift = 126 - e;  // 14 + (113 - e) - ... brings m to units of 2^-24
        uint32_t r = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1);
        const uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = ((ax >> 13) - (112u << 10));
    const uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1))) r++;
    return (uint16_t)(sign | r);
#endif
}

RPC_HD float rpc_bf16_to_float(uint16_t h) { return rpc_bits_to_float((uint32_t)h << 16); }

// float -> bf16, round to nearest even; NaNs stay quiet NaNs (as ggml does).
RPC_HD uint16_t rpc_float_to_bf16(float f) {
    const uint32_t x = rpc_float_to_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 64);
    return (uint16_t)((x + (0x7fffu + ((x >> 16) & 1))) >> 16);
}

// Signed 8-bit x4 dot product accumulated into c (dp4a), and byte permute (PTX prmt.b32,
// default mode: output byte i is byte (c & 7) of {y:x} for the selector nibble c = s[4i+3:4i],
// or that byte's sign replicated when c & 8): the PTX instructions on the device, plain C on
// the host.
#ifdef RPC_DEVICE_BUILD
RPC_HD int rpc_dp4a(int a, int b, int c) {
    int r;
    asm("{ dp4a.s32.s32 %0, %1, %2, %3; }" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}
RPC_HD uint32_t rpc_prmt(uint32_t x, uint32_t y, uint32_t s) {
    uint32_t r;
    asm("{ prmt.b32 %0, %1, %2, %3; }" : "=r"(r) : "r"(x), "r"(y), "r"(s));
    return r;
}
#else
RPC_HD int rpc_dp4a(int a, int b, int c) {
    for (int k = 0; k < 4; ++k) {
        c += (int)(int8_t)(a >> (8 * k)) * (int)(int8_t)(b >> (8 * k));
    }
    return c;
}
RPC_HD uint32_t rpc_prmt(uint32_t x, uint32_t y, uint32_t s) {
    const uint64_t bytes = (uint64_t)x | ((uint64_t)y << 32);
    uint32_t r = 0;
    for (int i = 0; i < 4; ++i) {
        const uint32_t c = (s >> (4 * i)) & 15;
        uint32_t b = (uint32_t)(bytes >> (8 * (c & 7))) & 0xff;
        if (c & 8) b = (b & 0x80) ? 0xff : 0;
        r |= b << (8 * i);
    }
    return r;
}
#endif

RPC_HD float rpc_fabsf(float x) { return x < 0.0f ? -x : x; }
RPC_HD float rpc_fmaxf(float a, float b) { return a > b ? a : b; }

// Round half away from zero, like C roundf (what ggml's reference quantizers use).
RPC_HD float rpc_roundf(float x) {
#ifdef RPC_DEVICE_BUILD
    return roundf(x);
#else
    return roundf(x);
#endif
}
