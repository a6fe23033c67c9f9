// RMS_NORM (optionally fused with the MUL by its weight, as ggml-cuda fuses them) and NORM, f32.
// One block per row (blockDim a multiple of 32, <= 1024); rows decomposed over ne1, ne2 with
// element strides s1..s3. The weight of the fused form broadcasts over rows like ggml's MUL:
// its row is (i1 % wne1, i2 % wne2, i3 % wne3).
#include "quantize.cuh"

extern "C" __global__ void rpc_rms_norm_f32(const float* x, float* dst, int ncols, int ne1, int ne2,
                                            long long xs1, long long xs2, long long xs3,
                                            long long ds1, long long ds2, long long ds3, float eps) {
    __shared__ float scratch[32];
    const long long r = blockIdx.x;
    const float* xr = x + rpc_row_offset(r, ne1, ne2, xs1, xs2, xs3);
    float* dr = dst + rpc_row_offset(r, ne1, ne2, ds1, ds2, ds3);
    float sum = 0.0f;
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) sum += xr[i] * xr[i];
    sum = rpc_block_sum(sum, scratch);
    const float scale = rsqrtf(sum / ncols + eps);
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) dr[i] = xr[i] * scale;
}

__device__ __forceinline__ void rpc_rms_norm_mul_row(const float* x, const float* w, float* dst,
                                                     int ncols, int ne1, int ne2, long long xs1,
                                                     long long xs2, long long xs3, long long ds1,
                                                     long long ds2, long long ds3, int wne0,
                                                     int wne1, int wne2, int wne3, long long ws1,
                                                     long long ws2, long long ws3, float eps) {
    __shared__ float scratch[32];
    const long long r = blockIdx.x;
    const long long i1 = r % ne1, i2 = (r / ne1) % ne2, i3 = r / ((long long)ne1 * ne2);
    const float* xr = x + i1 * xs1 + i2 * xs2 + i3 * xs3;
    float* dr = dst + i1 * ds1 + i2 * ds2 + i3 * ds3;
    const float* wr = w + (i1 % wne1) * ws1 + (i2 % wne2) * ws2 + (i3 % wne3) * ws3;
    float sum = 0.0f;
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) sum += xr[i] * xr[i];
    sum = rpc_block_sum(sum, scratch);
    const float scale = rsqrtf(sum / ncols + eps);
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) dr[i] = xr[i] * scale * wr[i % wne0];
}

#define RPC_NORM_MUL_ARGS                                                                        \
    const float *x, const float *w, float *dst, int ncols, int ne1, int ne2, long long xs1,       \
        long long xs2, long long xs3, long long ds1, long long ds2, long long ds3, int wne0,      \
        int wne1, int wne2, int wne3, long long ws1, long long ws2, long long ws3, float eps
#define RPC_NORM_MUL_PASS                                                                        \
    x, w, dst, ncols, ne1, ne2, xs1, xs2, xs3, ds1, ds2, ds3, wne0, wne1, wne2, wne3, ws1, ws2,   \
        ws3, eps

extern "C" __global__ void rpc_rms_norm_mul_f32(RPC_NORM_MUL_ARGS) {
    rpc_rms_norm_mul_row(RPC_NORM_MUL_PASS);
}

// The same, and the row (contiguous in dst, ds1 == ncols, ne2 == ne3 == 1) also quantized for
// the decode products that read it: q8_1 blocks, or q8_K held in q8_1 blocks (`as_q8_k`), into
// `q` with one column of ncols / 32 blocks per row (what quantize.cu's kernels write).
extern "C" __global__ void rpc_rms_norm_mul_q8_f32(RPC_NORM_MUL_ARGS, uint8_t* q, int as_q8_k) {
    rpc_rms_norm_mul_row(RPC_NORM_MUL_PASS);
    __syncthreads();  // the row's values, written by every thread, are read by the quantizer
    rpc_quantize_row_block(dst + blockIdx.x * ds1, q + blockIdx.x * (ncols / 32) * RPC_Q8_1_BYTES,
                           ncols, as_q8_k != 0);
}

extern "C" __global__ void rpc_norm_f32(const float* x, float* dst, int ncols, int ne1, int ne2,
                                        long long xs1, long long xs2, long long xs3, long long ds1,
                                        long long ds2, long long ds3, float eps) {
    __shared__ float scratch[32];
    const long long r = blockIdx.x;
    const float* xr = x + rpc_row_offset(r, ne1, ne2, xs1, xs2, xs3);
    float* dr = dst + rpc_row_offset(r, ne1, ne2, ds1, ds2, ds3);
    float sum = 0.0f;
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) sum += xr[i];
    const float mean = rpc_block_sum(sum, scratch) / ncols;
    float var = 0.0f;
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) var += (xr[i] - mean) * (xr[i] - mean);
    const float scale = rsqrtf(rpc_block_sum(var, scratch) / ncols + eps);
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) dr[i] = (xr[i] - mean) * scale;
}
