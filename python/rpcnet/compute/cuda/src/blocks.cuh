// Block math for every weight type rpcnet serves on CUDA, written once for device and host.
//
// Each weight type is a `Blk<TYPE>` (TYPE is the ggml type id) that knows:
//   QK, BYTES          elements and bytes per block,
//   value(b, i)        element i of the block at b, dequantized to float,
//   sub(b, s)          the s-th group of 32 elements as packed int8 (for dp4a) plus scales,
// and the activation side is q8_1 (32 int8 + half scale + half scaled sum), made by
// quantize_q8_1_block. dot_sub_q8_1 combines the two with integer dot products.
// Layouts follow ggml's block structs (ggml-common.h); blocks are read as bytes so no struct
// packing or alignment assumptions leak in (MXFP4 blocks are 17 bytes).
#pragma once
#include "host_shim.h"

enum RpcType {
    RPC_F32 = 0, RPC_F16 = 1, RPC_Q4_0 = 2, RPC_Q4_1 = 3, RPC_Q5_0 = 6, RPC_Q5_1 = 7,
    RPC_Q8_0 = 8, RPC_Q8_1 = 9, RPC_Q2_K = 10, RPC_Q3_K = 11, RPC_Q4_K = 12, RPC_Q5_K = 13,
    RPC_Q6_K = 14, RPC_IQ4_NL = 20, RPC_IQ4_XS = 23, RPC_BF16 = 30, RPC_MXFP4 = 39,
};

#define RPC_QK_K 256

// The 16-entry non-linear tables of IQ4_NL/IQ4_XS and of MXFP4's e2m1 (values doubled).
#define RPC_KVALUES_IQ4NL {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113}
#define RPC_KVALUES_E2M1 {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12}

// X-macros over the served weight types: (ggml type id, kernel-name suffix).
#define RPC_FOR_FLOAT_TYPES(X) X(RPC_F32, f32) X(RPC_F16, f16) X(RPC_BF16, bf16)
#define RPC_FOR_QUANT_TYPES(X)                                                              \
    X(RPC_Q4_0, q4_0) X(RPC_Q4_1, q4_1) X(RPC_Q5_0, q5_0) X(RPC_Q5_1, q5_1) X(RPC_Q8_0, q8_0) \
    X(RPC_Q2_K, q2_K) X(RPC_Q3_K, q3_K) X(RPC_Q4_K, q4_K) X(RPC_Q5_K, q5_K) X(RPC_Q6_K, q6_K) \
    X(RPC_IQ4_NL, iq4_nl) X(RPC_IQ4_XS, iq4_xs) X(RPC_MXFP4, mxfp4)
#define RPC_FOR_WEIGHT_TYPES(X) RPC_FOR_FLOAT_TYPES(X) RPC_FOR_QUANT_TYPES(X)

RPC_HD uint16_t rpc_ld_u16(const uint8_t* p) { return (uint16_t)(p[0] | (p[1] << 8)); }
RPC_HD float rpc_ld_half(const uint8_t* p) { return rpc_half_to_float(rpc_ld_u16(p)); }

// Four consecutive bytes as a little-endian word; byte loads because blocks are not 4-aligned.
RPC_HD uint32_t rpc_ld_u32(const uint8_t* p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

// Word loads where the field's alignment is known: the device issues one 32-bit load (A=4) or
// two 16-bit loads (A=2) instead of four byte loads. A block's alignment is the gcd of its size
// and its fields' offsets; ggml places tensors at aligned offsets, so rows start aligned too.
template <int A> RPC_HD uint32_t rpc_ld_u32a(const uint8_t* p) {
#ifdef RPC_DEVICE_BUILD
    if (A % 4 == 0) return *(const uint32_t*)p;
    if (A % 2 == 0) {
        const uint16_t* h = (const uint16_t*)p;
        return (uint32_t)h[0] | ((uint32_t)h[1] << 16);
    }
    return rpc_ld_u32(p);
#else
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
#endif
}

// Bits 0..3 of `bits` moved to bit 4 of bytes 0..3 (the fifth bit of four Q5 quants).
RPC_HD uint32_t rpc_spread4_bit4(uint32_t bits) {
    return ((bits & 1u) << 4) | ((bits & 2u) << 11) | ((bits & 4u) << 18) | ((bits & 8u) << 25);
}

// Aligned 16-bit load (halves and bf16 values of F16/BF16 rows are 2-aligned).
RPC_HD uint16_t rpc_ld_u16a(const uint8_t* p) {
#ifdef RPC_DEVICE_BUILD
    return *(const uint16_t*)p;
#else
    return rpc_ld_u16(p);
#endif
}

// The 16-entry non-linear tables of IQ4_NL/IQ4_XS and of MXFP4's e2m1 (values doubled).
RPC_HD int rpc_kvalue_iq4nl(int q) {
    const int8_t t[16] = RPC_KVALUES_IQ4NL;
    return t[q & 15];
}
RPC_HD int rpc_kvalue_e2m1(int q) {
    const int8_t t[16] = RPC_KVALUES_E2M1;
    return t[q & 15];
}

// E8M0 exponent byte -> 2^(e-128): half of the MX scale, matching the doubled e2m1 table.
RPC_HD float rpc_e8m0_half(uint8_t e) {
    return rpc_bits_to_float(e < 2 ? (0x00200000u << e) : ((uint32_t)(e - 1) << 23));
}

// Six-bit scale j and min j of the Q4_K/Q5_K 12-byte scale array.
RPC_HD void rpc_scale_min_k4(int j, const uint8_t* q, int* sc, int* mn) {
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// Signed six-bit scale i (already minus 32) of the Q3_K 12-byte scale array.
RPC_HD int rpc_scale_q3k(int i, const uint8_t* s) {
    const int lo = i < 8 ? (s[i] & 0xF) : (s[i - 8] >> 4);
    const int hi = (s[8 + (i & 3)] >> (2 * (i >> 2))) & 3;
    return (lo | (hi << 4)) - 32;
}

// 32 weights as int8 packed four per word, and how they turn into a dot product: for the two
// 16-element halves h, dot = sum_h d[h] * (w . y)_h + m[h] * (sum y)_h (all times y's scale).
struct RpcSub {
    int w[8];
    float d[2];
    float m[2];
};

RPC_HD void rpc_sub_uniform(RpcSub* s, float d, float m) {
    s->d[0] = s->d[1] = d;
    s->m[0] = s->m[1] = m;
}

// Packs 4 small unsigned/signed values (already in -128..255 truncated to a byte) into a word.
RPC_HD int rpc_pack4(int a, int b, int c, int e) {
    return (int)((uint32_t)(a & 0xff) | ((uint32_t)(b & 0xff) << 8) | ((uint32_t)(c & 0xff) << 16) |
                 ((uint32_t)(e & 0xff) << 24));
}

// Four table lookups at once: `q` holds a 4-bit index in the low nibble of each byte; the
// 16-entry table is t (bytes 0..15); each byte of the result is t[index]. Two byte permutes
// (prmt; emulated on the host) and a select, instead of four loads from a local array.
RPC_HD uint32_t rpc_lookup4(uint32_t q, const int8_t* t) {
    const uint32_t t0 = (uint32_t)rpc_pack4(t[0], t[1], t[2], t[3]);
    const uint32_t t1 = (uint32_t)rpc_pack4(t[4], t[5], t[6], t[7]);
    const uint32_t t2 = (uint32_t)rpc_pack4(t[8], t[9], t[10], t[11]);
    const uint32_t t3 = (uint32_t)rpc_pack4(t[12], t[13], t[14], t[15]);
    // selector nibble per output byte: the low 3 bits of its index (bit 3 of a prmt selector
    // means sign replication, so it is kept out and chooses between the two halves instead)
    const uint32_t sel = (q & 7u) | ((q >> 4) & 0x70u) | ((q >> 8) & 0x700u) | ((q >> 12) & 0x7000u);
    const uint32_t lo = rpc_prmt(t0, t1, sel), hi = rpc_prmt(t2, t3, sel);
    const uint32_t upper = ((q >> 3) & 0x01010101u) * 0xFFu;  // bytes whose index is >= 8
    return (lo & ~upper) | (hi & upper);
}

template <int T> struct Blk;

template <> struct Blk<RPC_F32> {
    static const int QK = 1, BYTES = 4;
    static RPC_HD float value(const uint8_t* b, int) { return rpc_bits_to_float(rpc_ld_u32a<4>(b)); }
};

template <> struct Blk<RPC_F16> {
    static const int QK = 1, BYTES = 2;
    static RPC_HD float value(const uint8_t* b, int) { return rpc_half_to_float(rpc_ld_u16a(b)); }
};

template <> struct Blk<RPC_BF16> {
    static const int QK = 1, BYTES = 2;
    static RPC_HD float value(const uint8_t* b, int) { return rpc_bf16_to_float(rpc_ld_u16a(b)); }
};

// Q4_0, Q4_1, Q5_0 and Q5_1 (the 32-element blocks with nibbles): half d, then half m when M
// (Q4_1, Q5_1), then when HI (Q5_0, Q5_1) 32 high bits (bit j belongs to element j), then 16
// bytes of nibbles: element j<16 is the low nibble of byte j, j>=16 the high nibble of byte
// j-16. Value d*(q-8) (Q4_0), d*(q-16) (Q5_0), or d*q + m (Q4_1, Q5_1). LD: the word load the
// block's alignment allows (each Blk names its own, which the host tests check).
template <bool M, bool HI, uint32_t (*LD)(const uint8_t*)> struct RpcBlkNibbles {
    static const int QK = 32, HEAD = M ? 4 : 2, QS = HEAD + (HI ? 4 : 0), BYTES = QS + 16;
    static const int BIAS = HI ? 16 : 8;
    static RPC_HD int q(const uint8_t* b, int i) {
        const uint8_t v = b[QS + (i & 15)];
        const int lo = i < 16 ? (v & 0xF) : (v >> 4);
        return HI ? lo | (((rpc_ld_u32(b + HEAD) >> i) & 1) << 4) : lo;
    }
    static RPC_HD float value(const uint8_t* b, int i) {
        return M ? rpc_ld_half(b) * q(b, i) + rpc_ld_half(b + 2) : rpc_ld_half(b) * (q(b, i) - BIAS);
    }
    static RPC_HD RpcSub sub(const uint8_t* b, int) {
        RpcSub s;
        const uint32_t qh = HI ? LD(b + HEAD) : 0u;
        for (int k = 0; k < 4; ++k) {
            const uint32_t v = LD(b + QS + 4 * k);
            s.w[k] = (int)((v & 0x0F0F0F0Fu) | (HI ? rpc_spread4_bit4(qh >> (4 * k)) : 0u));
            s.w[k + 4] =
                (int)(((v >> 4) & 0x0F0F0F0Fu) | (HI ? rpc_spread4_bit4(qh >> (16 + 4 * k)) : 0u));
        }
        const float d = rpc_ld_half(b);
        rpc_sub_uniform(&s, d, M ? rpc_ld_half(b + 2) : -(float)BIAS * d);
        return s;
    }
};
template <> struct Blk<RPC_Q4_0> : RpcBlkNibbles<false, false, rpc_ld_u32a<2>> {};
template <> struct Blk<RPC_Q4_1> : RpcBlkNibbles<true, false, rpc_ld_u32a<4>> {};
template <> struct Blk<RPC_Q5_0> : RpcBlkNibbles<false, true, rpc_ld_u32a<2>> {};
template <> struct Blk<RPC_Q5_1> : RpcBlkNibbles<true, true, rpc_ld_u32a<4>> {};

// Q8_0: half d, 32 int8; value d*q.
template <> struct Blk<RPC_Q8_0> {
    static const int QK = 32, BYTES = 34;
    static RPC_HD float value(const uint8_t* b, int i) { return rpc_ld_half(b) * (int8_t)b[2 + i]; }
    static RPC_HD RpcSub sub(const uint8_t* b, int) {
        RpcSub s;
        for (int k = 0; k < 8; ++k) s.w[k] = (int)rpc_ld_u32a<2>(b + 2 + 4 * k);
        rpc_sub_uniform(&s, rpc_ld_half(b), 0.0f);
        return s;
    }
};

// IQ4_NL: half d, nibbles as Q4_0 indexing a non-linear table; value d*table[q].
template <> struct Blk<RPC_IQ4_NL> {
    static const int QK = 32, BYTES = 18;
    static RPC_HD float value(const uint8_t* b, int i) {
        return rpc_ld_half(b) * rpc_kvalue_iq4nl(Blk<RPC_Q4_0>::q(b, i));
    }
    static RPC_HD RpcSub sub(const uint8_t* b, int) {
        RpcSub s;
        const int8_t table[16] = RPC_KVALUES_IQ4NL;
        for (int k = 0; k < 4; ++k) {
            const uint32_t v = rpc_ld_u32a<2>(b + 2 + 4 * k);
            s.w[k] = (int)rpc_lookup4(v & 0x0F0F0F0Fu, table);
            s.w[k + 4] = (int)rpc_lookup4((v >> 4) & 0x0F0F0F0Fu, table);
        }
        rpc_sub_uniform(&s, rpc_ld_half(b), 0.0f);
        return s;
    }
};

// MXFP4: one E8M0 exponent byte, nibbles as Q4_0 indexing e2m1 (doubled); value e_half*table[q].
template <> struct Blk<RPC_MXFP4> {
    static const int QK = 32, BYTES = 17;
    static RPC_HD float value(const uint8_t* b, int i) {
        const uint8_t v = b[1 + (i & 15)];
        return rpc_e8m0_half(b[0]) * rpc_kvalue_e2m1(i < 16 ? v : v >> 4);
    }
    static RPC_HD RpcSub sub(const uint8_t* b, int) {
        RpcSub s;
        const int8_t table[16] = RPC_KVALUES_E2M1;
        for (int k = 0; k < 4; ++k) {
            const uint32_t v = rpc_ld_u32(b + 1 + 4 * k);  // 17-byte blocks: byte loads
            s.w[k] = (int)rpc_lookup4(v & 0x0F0F0F0Fu, table);
            s.w[k + 4] = (int)rpc_lookup4((v >> 4) & 0x0F0F0F0Fu, table);
        }
        rpc_sub_uniform(&s, rpc_e8m0_half(b[0]), 0.0f);
        return s;
    }
};

// The 2-bit low parts of Q2_K and Q3_K (qs[64]): element e is bits 2j, 2j+1 of byte l of the
// 32-byte chunk n (n = e/128, j = (e%128)/32, l = e%32); group of 32 s is chunk s/4, pair s%4.
RPC_HD int rpc_q2_bits(const uint8_t* qs, int e) {
    const int n = e >> 7, j = (e & 127) >> 5, l = e & 31;
    return (qs[32 * n + l] >> (2 * j)) & 3;
}
// Word k (elements 4k..4k+3) of group s, one 2-bit value a byte, read by LD (the word load the
// block's alignment allows).
template <uint32_t (*LD)(const uint8_t*)> RPC_HD uint32_t rpc_q2_bits4(const uint8_t* qs, int s, int k) {
    return (LD(qs + 32 * (s >> 2) + 4 * k) >> (2 * (s & 3))) & 0x03030303u;
}

// Q2_K (84 bytes): scales[16] (low nibble scale, high nibble min), qs[64] 2-bit, half d, dmin.
// Element e: 128-chunk n=e/128, within it shift pair j=(e%128)/32, byte l=e%32 of qs+32n;
// group of 16 is e/16; value d*sc*q - dmin*min.
template <> struct Blk<RPC_Q2_K> {
    static const int QK = RPC_QK_K, BYTES = 84;
    static RPC_HD float value(const uint8_t* b, int e) {
        const int q = rpc_q2_bits(b + 16, e);
        const uint8_t sc = b[e >> 4];
        const float d = rpc_ld_half(b + 80), dmin = rpc_ld_half(b + 82);
        return d * (sc & 0xF) * q - dmin * (sc >> 4);
    }
    static RPC_HD RpcSub sub(const uint8_t* b, int s) {
        RpcSub r;
        for (int k = 0; k < 8; ++k) r.w[k] = (int)rpc_q2_bits4<rpc_ld_u32a<4>>(b + 16, s, k);
        const float d = rpc_ld_half(b + 80), dmin = rpc_ld_half(b + 82);
        for (int h = 0; h < 2; ++h) {
            const uint8_t sc = b[2 * s + h];
            r.d[h] = d * (sc & 0xF);
            r.m[h] = -dmin * (sc >> 4);
        }
        return r;
    }
};

// Q3_K (110 bytes): hmask[32], qs[64] 2-bit, scales[12] (16 six-bit), half d. Element e as Q2_K
// for the low bits; its high bit is bit (4n+j) of hmask[l]; value d*(scale-32)*(q - (hi?0:4)).
template <> struct Blk<RPC_Q3_K> {
    static const int QK = RPC_QK_K, BYTES = 110;
    static RPC_HD float value(const uint8_t* b, int e) {
        const int n = e >> 7, j = (e & 127) >> 5, l = e & 31;
        const int lo = rpc_q2_bits(b + 32, e);
        const int hi = (b[l] >> (4 * n + j)) & 1;
        return rpc_ld_half(b + 108) * rpc_scale_q3k(e >> 4, b + 96) * (lo - (hi ? 0 : 4));
    }
    static RPC_HD RpcSub sub(const uint8_t* b, int s) {
        RpcSub r;
        const int n = s >> 2, j = s & 3;
        for (int k = 0; k < 8; ++k) {
            const uint32_t lo = rpc_q2_bits4<rpc_ld_u32a<2>>(b + 32, s, k);
            const uint32_t hi = (rpc_ld_u32a<2>(b + 4 * k) >> (4 * n + j)) & 0x01010101u;
            r.w[k] = (int)(lo | (hi << 2));  // q + 4 in 0..7; the -4 goes into m
        }
        const float d = rpc_ld_half(b + 108);
        for (int h = 0; h < 2; ++h) {
            r.d[h] = d * rpc_scale_q3k(2 * s + h, b + 96);
            r.m[h] = -4.0f * r.d[h];
        }
        return r;
    }
};

// Q4_K (144 bytes) and, HI, Q5_K (176 bytes): half d, dmin, scales[12] (8 six-bit scale/min
// pairs), for Q5_K qh[32] (the fifth bit of element e=32s+l is bit s of qh[l]), then qs[128] (at
// byte 16, or 48). Group of 32 s: 64-chunk c=s/2 of qs+32c, low nibbles for even s, high for
// odd; value d*sc*q - dmin*min. LD: the word load the block's alignment allows.
template <bool HI, uint32_t (*LD)(const uint8_t*)> struct RpcBlkK45 {
    static const int QK = RPC_QK_K, BYTES = HI ? 176 : 144, QS = HI ? 48 : 16;
    static RPC_HD float value(const uint8_t* b, int e) {
        const int s = e >> 5, l = e & 31;
        int sc, mn;
        rpc_scale_min_k4(s, b + 4, &sc, &mn);
        const uint8_t v = b[QS + 32 * (s >> 1) + l];
        const int lo = (s & 1) ? (v >> 4) : (v & 0xF);
        const int q = HI ? lo | (((b[16 + l] >> s) & 1) << 4) : lo;
        return rpc_ld_half(b) * sc * q - rpc_ld_half(b + 2) * mn;
    }
    static RPC_HD RpcSub sub(const uint8_t* b, int s) {
        RpcSub r;
        const int shift = 4 * (s & 1);
        for (int k = 0; k < 8; ++k) {
            const uint32_t lo = (LD(b + QS + 32 * (s >> 1) + 4 * k) >> shift) & 0x0F0F0F0Fu;
            const uint32_t hi = HI ? (LD(b + 16 + 4 * k) >> s) & 0x01010101u : 0u;
            r.w[k] = (int)(lo | (hi << 4));
        }
        int sc, mn;
        rpc_scale_min_k4(s, b + 4, &sc, &mn);
        rpc_sub_uniform(&r, rpc_ld_half(b) * sc, -rpc_ld_half(b + 2) * mn);
        return r;
    }
};
template <> struct Blk<RPC_Q4_K> : RpcBlkK45<false, rpc_ld_u32a<4>> {};
template <> struct Blk<RPC_Q5_K> : RpcBlkK45<true, rpc_ld_u32a<4>> {};

// Q6_K (210 bytes): ql[128] low nibbles, qh[64] two high bits, int8 scales[16], half d.
// Element e: 128-chunk n, quarter j=(e%128)/32, l=e%32: low nibble from ql[64n + l + 32*(j&1)]
// (high nibble when j>=2), high bits (qh[32n+l] >> 2j)&3; value d*scale[e/16]*(q-32).
template <> struct Blk<RPC_Q6_K> {
    static const int QK = RPC_QK_K, BYTES = 210;
    static RPC_HD float value(const uint8_t* b, int e) {
        const int n = e >> 7, j = (e & 127) >> 5, l = e & 31;
        const uint8_t v = b[64 * n + l + 32 * (j & 1)];
        const int lo = j >= 2 ? (v >> 4) : (v & 0xF);
        const int hi = (b[128 + 32 * n + l] >> (2 * j)) & 3;
        return rpc_ld_half(b + 208) * (int8_t)b[192 + (e >> 4)] * ((lo | (hi << 4)) - 32);
    }
    static RPC_HD RpcSub sub(const uint8_t* b, int s) {
        RpcSub r;
        const int n = s >> 2, j = s & 3;
        for (int k = 0; k < 8; ++k) {
            const uint32_t v = rpc_ld_u32a<2>(b + 64 * n + 32 * (j & 1) + 4 * k);
            const uint32_t lo = (j >= 2 ? (v >> 4) : v) & 0x0F0F0F0Fu;
            const uint32_t hi = (rpc_ld_u32a<2>(b + 128 + 32 * n + 4 * k) >> (2 * j)) & 0x03030303u;
            r.w[k] = (int)(lo | (hi << 4));  // q + 32 in 0..63; the -32 goes into m
        }
        const float d = rpc_ld_half(b + 208);
        for (int h = 0; h < 2; ++h) {
            r.d[h] = d * (int8_t)b[192 + 2 * s + h];
            r.m[h] = -32.0f * r.d[h];
        }
        return r;
    }
};

// IQ4_XS (136 bytes): half d, u16 scales_h, scales_l[4], qs[128]. Group of 32 ib has six-bit
// scale ls (low nibble from scales_l, two high bits from scales_h) and IQ4_NL-style nibbles at
// qs+16ib; value d*(ls-32)*table[q].
template <> struct Blk<RPC_IQ4_XS> {
    static const int QK = RPC_QK_K, BYTES = 136;
    static RPC_HD float scale(const uint8_t* b, int ib) {
        const int ls = ((b[4 + ib / 2] >> (4 * (ib & 1))) & 0xF) |
                       (((rpc_ld_u16(b + 2) >> (2 * ib)) & 3) << 4);
        return rpc_ld_half(b) * (ls - 32);
    }
    static RPC_HD float value(const uint8_t* b, int e) {
        const int ib = e >> 5, l = e & 31;
        const uint8_t v = b[8 + 16 * ib + (l & 15)];
        return scale(b, ib) * rpc_kvalue_iq4nl(l < 16 ? v : v >> 4);
    }
    static RPC_HD RpcSub sub(const uint8_t* b, int s) {
        RpcSub r;
        const int8_t table[16] = RPC_KVALUES_IQ4NL;
        for (int k = 0; k < 4; ++k) {
            const uint32_t v = rpc_ld_u32a<4>(b + 8 + 16 * s + 4 * k);
            r.w[k] = (int)rpc_lookup4(v & 0x0F0F0F0Fu, table);
            r.w[k + 4] = (int)rpc_lookup4((v >> 4) & 0x0F0F0F0Fu, table);
        }
        rpc_sub_uniform(&r, scale(b, s), 0.0f);
        return r;
    }
};

// ---- activations: q8_1 -------------------------------------------------------------------

#define RPC_Q8_1_BYTES 36  // half d, half s (= d * sum q), int8 qs[32]

// Quantizes 32 floats to one q8_1 block the way ggml's reference does: d = amax/127,
// q = round(x * (1/d)), s = d * sum(q).
RPC_HD void rpc_quantize_q8_1_block(const float* x, uint8_t* out) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = rpc_fmaxf(amax, rpc_fabsf(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int sum = 0;
    for (int j = 0; j < 32; ++j) {
        const int q = (int)rpc_roundf(x[j] * id);
        out[4 + j] = (uint8_t)(int8_t)q;
        sum += q;
    }
    const uint16_t dh = rpc_float_to_half(d), sh = rpc_float_to_half((float)sum * d);
    out[0] = (uint8_t)dh;
    out[1] = (uint8_t)(dh >> 8);
    out[2] = (uint8_t)sh;
    out[3] = (uint8_t)(sh >> 8);
}

// Whether ggml's CPU dot product quantizes activations to q8_K (blocks of 256, f32 scale) for
// weights of type T: the K-quants and IQ4_XS. Their activation blocks here carry that f32
// scale in place of q8_1's half scale and sum (the sum is taken from the quants anyway).
RPC_HD constexpr bool rpc_act_q8_k(int t) {
    return t == RPC_Q2_K || t == RPC_Q3_K || t == RPC_Q4_K || t == RPC_Q5_K || t == RPC_Q6_K ||
           t == RPC_IQ4_XS;
}

// Dot product of one 32-weight group with one q8_1 block (F32_SCALE: the block's first 4 bytes
// are an f32 scale, see rpc_act_q8_k).
template <bool F32_SCALE = false> RPC_HD float rpc_dot_sub_q8_1(const RpcSub& s, const uint8_t* y) {
    float acc = 0.0f;
    for (int h = 0; h < 2; ++h) {
        int dot = 0, sum = 0;
        for (int k = 0; k < 4; ++k) {
            const int yv = (int)rpc_ld_u32a<4>(y + 4 + 16 * h + 4 * k);
            dot = rpc_dp4a(s.w[4 * h + k], yv, dot);
            sum = rpc_dp4a(0x01010101, yv, sum);
        }
        acc += s.d[h] * (float)dot + s.m[h] * (float)sum;
    }
    return acc * (F32_SCALE ? rpc_bits_to_float(rpc_ld_u32a<4>(y)) : rpc_ld_half(y));
}

// Dot product of one whole weight block with the QK/32 consecutive q8_1 blocks covering it.
template <int T> RPC_HD float rpc_dot_block_q8_1(const uint8_t* w, const uint8_t* y) {
    float acc = 0.0f;
    for (int s = 0; s < Blk<T>::QK / 32; ++s) {
        acc += rpc_dot_sub_q8_1(Blk<T>::sub(w, s), y + RPC_Q8_1_BYTES * s);
    }
    return acc;
}
