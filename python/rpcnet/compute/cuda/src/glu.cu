// GLU family on f32: dst = act(a) * b, a and b given as separate row-strided operands (the host
// resolves ggml's single-tensor split and `swapped` into two pointers). op: 0 REGLU, 1 GEGLU
// (tanh approximation), 2 SWIGLU, 3 GEGLU_ERF, 4 GEGLU_QUICK, 5 SWIGLU_OAI (alpha, limit).
// Launch: block 256, grid (ceil(nc/256), min(rows, 65535)); rows over ne1, ne2 with element strides.
#include "glu.cuh"

extern "C" __global__ void rpc_glu_f32(const float* a, const float* b, float* dst, int nc, int ne1,
                                       int ne2, long long as1, long long as2, long long as3,
                                       long long bs1, long long bs2, long long bs3, long long ds1,
                                       long long ds2, long long ds3, int op, float alpha,
                                       float limit, long long nrows) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= nc) return;
    RPC_FOR_ROWS_Y(r, nrows) {
        const float av = a[rpc_row_offset(r, ne1, ne2, as1, as2, as3) + i];
        const float bv = b[rpc_row_offset(r, ne1, ne2, bs1, bs2, bs3) + i];
        dst[rpc_row_offset(r, ne1, ne2, ds1, ds2, ds3) + i] = rpc_glu(op, av, bv, alpha, limit);
    }
}
