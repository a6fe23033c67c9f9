// Activation quantization to q8_1, once per activation vector before the MMVQ matvec.
// One warp per 32-value block, one value per lane; same rounding as ggml's reference quantizer
// (and as rpc_quantize_q8_1_block, which the host tests check): d = amax/127, q = round(x/d
// computed as x * (1/d)), s = d * sum(q).
// Launch: block (32, 8), grid (ceil(k/32/8), ncols); x column stride x_col floats, output column
// stride (k/32) blocks.
#include "blocks.cuh"
#include "common.cuh"

extern "C" __global__ void rpc_quantize_q8_1(const float* __restrict__ x, uint8_t* __restrict__ out,
                                             int k, long long x_col) {
    const int blk = blockIdx.x * blockDim.y + threadIdx.y;
    if (blk >= k / 32) return;
    const int col = blockIdx.y;
    const float v = x[col * x_col + blk * 32 + threadIdx.x];
    const float amax = rpc_warp_max(fabsf(v));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const int q = (int)roundf(v * id);
    const int sum = rpc_warp_sum_int(q);
    uint8_t* b = out + ((long long)col * (k / 32) + blk) * RPC_Q8_1_BYTES;
    b[4 + threadIdx.x] = (uint8_t)(int8_t)q;
    if (threadIdx.x == 0) {
        const uint32_t dh = rpc_float_to_half(d), sh = rpc_float_to_half((float)sum * d);
        *(uint32_t*)b = dh | (sh << 16);  // blocks are 36 bytes: 4-byte aligned
    }
}
