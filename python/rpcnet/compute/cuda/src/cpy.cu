// Copies on the device. CPY / DUP / CONT between f32, f16 and bf16 tensors of any layout, and
// the parameter block's scatter (below).
//
// CPY: element i of dst (in ggml's logical order) takes element i of src; each side has its own
// shape and byte strides (ggml allows different shapes with the same element count). (q8_0
// destinations: SET_ROWS.)
// Launch: block 256, grid ceil(n / 256) (n = element count; grid.y covers n > 2^31 via stride).
#include "blocks.cuh"
#include "common.cuh"

__device__ __forceinline__ long long rpc_elem_offset(long long i, long long ne0, long long ne1,
                                                     long long ne2, long long nb0, long long nb1,
                                                     long long nb2, long long nb3) {
    const long long i0 = i % ne0, i1 = (i / ne0) % ne1, i2 = (i / (ne0 * ne1)) % ne2;
    const long long i3 = i / (ne0 * ne1 * ne2);
    return i0 * nb0 + i1 * nb1 + i2 * nb2 + i3 * nb3;
}

template <typename S, typename D>
__device__ __forceinline__ void rpc_cpy(const uint8_t* src, uint8_t* dst, long long n,
                                        long long sne0, long long sne1, long long sne2,
                                        long long snb0, long long snb1, long long snb2,
                                        long long snb3, long long dne0, long long dne1,
                                        long long dne2, long long dnb0, long long dnb1,
                                        long long dnb2, long long dnb3) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const typename S::T* s =
            (const typename S::T*)(src + rpc_elem_offset(i, sne0, sne1, sne2, snb0, snb1, snb2, snb3));
        typename D::T* d =
            (typename D::T*)(dst + rpc_elem_offset(i, dne0, dne1, dne2, dnb0, dnb1, dnb2, dnb3));
        D::store(d, S::load(s));
    }
}

#define RPC_CPY_KERNEL(S, D, name)                                                               \
    extern "C" __global__ void rpc_cpy_##name(                                                   \
        const uint8_t* src, uint8_t* dst, long long n, long long sne0, long long sne1,            \
        long long sne2, long long snb0, long long snb1, long long snb2, long long snb3,           \
        long long dne0, long long dne1, long long dne2, long long dnb0, long long dnb1,           \
        long long dnb2, long long dnb3) {                                                         \
        rpc_cpy<S, D>(src, dst, n, sne0, sne1, sne2, snb0, snb1, snb2, snb3, dne0, dne1, dne2,    \
                      dnb0, dnb1, dnb2, dnb3);                                                    \
    }
RPC_CPY_KERNEL(RpcF32, RpcF32, f32_f32)
RPC_CPY_KERNEL(RpcF32, RpcF16, f32_f16)
RPC_CPY_KERNEL(RpcF32, RpcBF16, f32_bf16)
RPC_CPY_KERNEL(RpcF16, RpcF32, f16_f32)
RPC_CPY_KERNEL(RpcF16, RpcF16, f16_f16)
RPC_CPY_KERNEL(RpcF16, RpcBF16, f16_bf16)
RPC_CPY_KERNEL(RpcBF16, RpcF32, bf16_f32)
RPC_CPY_KERNEL(RpcBF16, RpcF16, bf16_f16)
RPC_CPY_KERNEL(RpcBF16, RpcBF16, bf16_bf16)

// The parameter block of a step (compute/cuda/params.py): small uploads gathered on the host
// and copied to the device in one transfer; this kernel puts each where it belongs. Block layout
// (little-endian): u32 count at 0; entry e at 16 + 16 e = {u64 dst, u32 offset of its bytes in
// the block, u32 byte count}, e < RPC_PARAM_ENTRIES. It reads everything from the block, so a
// captured graph replays it unchanged while the block's contents change from step to step.
// Launch: block 256, grid RPC_PARAM_ENTRIES (block e copies entry e; entries past count exit).
#define RPC_PARAM_ENTRIES 64

extern "C" __global__ void __launch_bounds__(256) rpc_scatter_params(const uint8_t* block) {
    const unsigned int count = *(const unsigned int*)block;
    if (blockIdx.x >= count) return;
    const uint8_t* entry = block + 16 + 16 * blockIdx.x;
    uint8_t* dst = (uint8_t*)(*(const unsigned long long*)entry);
    const unsigned int at = *(const unsigned int*)(entry + 8);
    const unsigned int n = *(const unsigned int*)(entry + 12);
    const uint8_t* src = block + at;
    if (((((unsigned long long)dst) | at | n) & 15) == 0) {  // whole 16-byte vectors
        for (unsigned int i = threadIdx.x; i < n / 16; i += blockDim.x)
            ((uint4*)dst)[i] = ((const uint4*)src)[i];
    } else {
        for (unsigned int i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
    }
}
