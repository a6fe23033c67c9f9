// The GLU activations, shared by glu.cu and the gate/up products of matvec_group.cu.
// op: 0 REGLU, 1 GEGLU (tanh approximation), 2 SWIGLU, 3 GEGLU_ERF, 4 GEGLU_QUICK, 5 SWIGLU_OAI.
#pragma once
#include "common.cuh"

__device__ __forceinline__ float rpc_glu(int op, float a, float b, float alpha, float limit) {
    switch (op) {
        case 0: return fmaxf(a, 0.0f) * b;
        case 1: {
            const float c = 0.7978845608028654f;  // sqrt(2/pi)
            return 0.5f * a * (1.0f + tanhf(c * a * (1.0f + 0.044715f * a * a))) * b;
        }
        case 2: return a / (1.0f + expf(-a)) * b;
        case 3: return 0.5f * a * (1.0f + erff(a * 0.7071067811865476f)) * b;
        case 4: return a / (1.0f + expf(-1.702f * a)) * b;
        default: {
            const float x = fminf(a, limit);
            const float g = fmaxf(fminf(b, limit), -limit);
            return x / (1.0f + expf(-alpha * x)) * (g + 1.0f);
        }
    }
}

