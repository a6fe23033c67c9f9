// CUDA execution model on the CPU, for running the kernels in compute/cuda/src with g++ in CI.
//
// Force-included before a kernel module (`g++ -include emu.h -I<src> module.cu`); then each
// extern "C" kernel is exported by RPC_EMU_EXPORT(name) (the generator in __init__.py writes
// those lines) as
//   const char* emu_<name>(gx, gy, gz, bx, by, bz, void** args)   NULL, or an error message
//   const char* emu_sig_<name>()    one letter per parameter: c pointer to const, p pointer,
//                                   i int, I unsigned, q long long, Q unsigned long long,
//                                   f float, d double, x anything else (refused at launch)
// args[i] points at parameter i's value, like cuLaunchKernel's kernelParams.
//
// Model. A launch runs its blocks one after another. A block's threads are cooperative fibers
// (own stacks, switched with _setjmp/_longjmp; created once with makecontext) on the calling OS
// thread. A thread runs until it finishes or waits at __syncthreads or a warp collective
// (__shfl*_sync, __syncwarp, votes); the scheduler then runs the others. When every live
// thread of the block waits at __syncthreads it releases them; when every lane a warp
// collective's mask names has arrived it exchanges the values and releases those lanes.
// Errors (a launch outside CUDA's limits, a thread that exited while others synchronize at
// __syncthreads, a mask naming an exited or missing lane, lanes disagreeing on a collective,
// a deadlock) abandon the launch and are returned as a message.
//
// __shared__ is `static`: a kernel's shared arrays are one object for the whole module, which
// behaves as per-block shared memory because blocks run one at a time. Values persist from
// one block (or launch) to the next, like uninitialized shared memory would hold garbage: a
// kernel that reads shared memory it did not write in that block is wrong on a GPU too, and
// the emulator does not catch it. Dynamic shared memory (extern __shared__) is not supported.
//
// Atomics are plain read-modify-writes (no fiber switches inside one) and __threadfence is
// empty: blocks run one after another, so a kernel that hands work to the last block of a
// group (a counter, a fence) runs here in one of the orders a GPU allows.
// Not modelled: memory spaces (every pointer is a host pointer), alignment faults,
// out-of-bounds accesses (the Python side checks red zones around its buffers), races between
// threads (the schedule is one legal interleaving), FMA contraction and fast-math intrinsics
// (host libm results), warp-synchronous code without __syncwarp (each lane runs alone until it
// synchronizes).
#pragma once
#undef _FORTIFY_SOURCE  // __longjmp_chk refuses jumps between stacks

#include "host_shim.h"

#include <math.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

// host_shim.h made __global__ empty; the generator's scan (-DRPC_EMU_SCAN -E) needs to see it.
#undef __global__
#ifdef RPC_EMU_SCAN
#define __global__ __rpc_emu_kernel__
#else
#define __global__
#endif
#define __shared__ static
#define __launch_bounds__(...)
#define __noinline__ __attribute__((noinline))

struct uint3 {
    unsigned int x, y, z;
};
struct dim3 {
    unsigned int x, y, z;
};
struct __attribute__((aligned(16))) uint4 {
    unsigned int x, y, z, w;
};
struct __attribute__((aligned(16))) int4 {
    int x, y, z, w;
};
struct __attribute__((aligned(8))) uint2 {
    unsigned int x, y;
};
struct __attribute__((aligned(16))) float4 {
    float x, y, z, w;
};
struct __attribute__((aligned(8))) float2 {
    float x, y;
};

#define RPC_EMU_HIDDEN __attribute__((visibility("hidden")))
// External linkage on purpose: the compiler must assume any call (a fiber switch) may change
// them, so kernels reread them after waiting.
RPC_EMU_HIDDEN uint3 threadIdx;
RPC_EMU_HIDDEN uint3 blockIdx;
RPC_EMU_HIDDEN dim3 blockDim;
RPC_EMU_HIDDEN dim3 gridDim;
static const int warpSize = 32;

// Bit casts and math intrinsics (host libm; glibc itself declares __expf and __logf). CUDA's
// fast versions differ in the last bits.
static inline float __int_as_float(int i) {
    float f;
    memcpy(&f, &i, 4);
    return f;
}
static inline int __float_as_int(float f) {
    int i;
    memcpy(&i, &f, 4);
    return i;
}
static inline float __uint_as_float(unsigned int i) {
    float f;
    memcpy(&f, &i, 4);
    return f;
}
static inline unsigned int __float_as_uint(float f) {
    unsigned int i;
    memcpy(&i, &f, 4);
    return i;
}
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline float __fdividef(float a, float b) { return a / b; }
static inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }

namespace rpc_emu {

enum ThreadState : unsigned char { UNSTARTED, RUNNING, RESUME, AT_BARRIER, AT_WARP, DONE };
enum WarpOp : int { SHFL_IDX, SHFL_UP, SHFL_DOWN, SHFL_XOR, SYNCWARP, VOTE_ALL, VOTE_ANY, VOTE_BALLOT };

static const char* const kOpNames[] = {"__shfl_sync",  "__shfl_up_sync", "__shfl_down_sync",
                                       "__shfl_xor_sync", "__syncwarp",   "__all_sync",
                                       "__any_sync",   "__ballot_sync"};

struct Thread {
    ThreadState state;
    int fiber;
    uint3 tid;
    // the warp collective it waits at
    int op, arg, width;
    unsigned mask;
    uint64_t value, result;
};

struct Fiber {
    char* stack;
    jmp_buf jb;  // where it is parked
};

static const size_t kStackBytes = 64 * 1024;
static const size_t kGuardBytes = 4096;

struct Runtime {
    std::mutex lock;
    std::vector<Fiber> fibers;
    std::vector<int> free_fibers;
    std::vector<Thread> threads;
    jmp_buf sched;
    ucontext_t creator;
    int creating = -1;
    int current = -1;  // fiber running now
    int n = 0, next_unstarted = 0, done = 0, at_barrier = 0;
    void (*body)(void*) = nullptr;
    void* ctx = nullptr;
    std::string error;
    std::string message;
};
RPC_EMU_HIDDEN Runtime rt;

static inline void fail(const std::string& msg) {
    if (rt.error.empty()) rt.error = msg;
}

static inline std::string fmt3(uint3 v) {
    char b[64];
    snprintf(b, sizeof b, "(%u, %u, %u)", v.x, v.y, v.z);
    return b;
}

// Fiber side -------------------------------------------------------------------------------

// Park the running fiber and go back to the scheduler; returns when the scheduler resumes it.
static __attribute__((noinline)) void park() {
    Fiber& f = rt.fibers[rt.current];
    if (_setjmp(f.jb) == 0) _longjmp(rt.sched, 1);
}

static __attribute__((noinline)) void fiber_loop() {
    for (;;) {
        const int self = rt.current;
        while (rt.next_unstarted < rt.n && rt.error.empty()) {
            const int t = rt.next_unstarted++;
            Thread& th = rt.threads[t];
            th.state = RUNNING;
            th.fiber = self;
            threadIdx = th.tid;
            rt.body(rt.ctx);
            rt.threads[t].state = DONE;
            rt.done++;
        }
        rt.free_fibers.push_back(self);
        park();
    }
}

static void fiber_entry() {
    Fiber& f = rt.fibers[rt.creating];
    if (_setjmp(f.jb) == 0) setcontext(&rt.creator);  // parked: back to make_fiber
    fiber_loop();
}

static bool make_fiber(int i) {
    Fiber& f = rt.fibers[i];
    if (f.stack == nullptr) {
        void* p = mmap(nullptr, kStackBytes + kGuardBytes, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) return false;
        mprotect(p, kGuardBytes, PROT_NONE);  // stacks grow down into the guard page
        f.stack = (char*)p;
    }
    ucontext_t uc;
    getcontext(&uc);
    uc.uc_stack.ss_sp = f.stack + kGuardBytes;
    uc.uc_stack.ss_size = kStackBytes;
    uc.uc_link = nullptr;
    makecontext(&uc, fiber_entry, 0);
    rt.creating = i;
    swapcontext(&rt.creator, &uc);
    return true;
}

// Scheduler side ---------------------------------------------------------------------------

static void resume(int fiber) {
    rt.current = fiber;
    if (_setjmp(rt.sched) == 0) _longjmp(rt.fibers[fiber].jb, 1);
    rt.current = -1;
}

static int take_fiber() {
    if (!rt.free_fibers.empty()) {
        const int f = rt.free_fibers.back();
        rt.free_fibers.pop_back();
        return f;
    }
    const int i = (int)rt.fibers.size();
    rt.fibers.reserve(1024);  // a block's threads at most: elements never move
    rt.fibers.push_back(Fiber{nullptr, {}});
    if (!make_fiber(i)) {
        rt.fibers.pop_back();
        return -1;
    }
    return i;
}

// After an abandoned launch the fibers' parked frames are stale: restart them all.
static void reset_fibers() {
    rt.free_fibers.clear();
    for (size_t i = 0; i < rt.fibers.size(); ++i) {
        make_fiber((int)i);
        rt.free_fibers.push_back((int)i);
    }
}

static std::string warp_where(int w, int lane) {
    const Thread& th = rt.threads[w * 32 + lane];
    char b[96];
    snprintf(b, sizeof b, "warp %d lane %d (thread %s)", w, lane, fmt3(th.tid).c_str());
    return b;
}

// Complete one warp's collective if every lane its mask names has arrived.
static bool release_warp(int w) {
    const int base = w * 32;
    const int lanes = rt.n - base < 32 ? rt.n - base : 32;
    int first = -1;
    for (int l = 0; l < lanes; ++l) {
        if (rt.threads[base + l].state == AT_WARP) {
            first = l;
            break;
        }
    }
    if (first < 0) return false;
    const Thread& t0 = rt.threads[base + first];
    const unsigned mask = t0.mask;
    if (!(mask >> first & 1)) {
        fail(std::string(kOpNames[t0.op]) + ": " + warp_where(w, first) +
             " is not in its own mask");
        return false;
    }
    for (int l = 0; l < 32; ++l) {
        if (!(mask >> l & 1)) continue;
        if (l >= lanes) {
            char b[160];
            snprintf(b, sizeof b, "%s: mask 0x%08x names lane %d, which the block (%d threads) "
                     "does not have", kOpNames[t0.op], mask, l, rt.n);
            fail(b);
            return false;
        }
        const Thread& th = rt.threads[base + l];
        if (th.state == DONE) {
            fail(std::string(kOpNames[t0.op]) + ": the mask names " + warp_where(w, l) +
                 ", which has exited");
            return false;
        }
        if (th.state != AT_WARP) return false;  // not there yet
        if (th.op != t0.op || th.mask != mask || th.width != t0.width) {
            fail(std::string("lanes of a warp wait at different collectives: ") +
                 warp_where(w, first) + " at " + kOpNames[t0.op] + ", " + warp_where(w, l) +
                 " at " + kOpNames[th.op]);
            return false;
        }
    }
    const int width = t0.width;
    if (width <= 0 || width > 32 || (width & (width - 1)) != 0) {
        fail(std::string(kOpNames[t0.op]) + ": width must be a power of 2 up to 32");
        return false;
    }
    unsigned ballot = 0;
    for (int l = 0; l < 32; ++l) {
        if ((mask >> l & 1) && rt.threads[base + l].value != 0) ballot |= 1u << l;
    }
    for (int l = 0; l < 32; ++l) {
        if (!(mask >> l & 1)) continue;
        Thread& th = rt.threads[base + l];
        const int seg = l & ~(width - 1), pos = l & (width - 1);
        int src = l;
        switch (th.op) {
            case SHFL_IDX: src = seg + (th.arg & (width - 1)); break;
            case SHFL_UP: src = pos >= th.arg ? l - th.arg : l; break;
            case SHFL_DOWN: src = pos + th.arg < width ? l + th.arg : l; break;
            case SHFL_XOR: {
                const int s = l ^ th.arg;
                src = s < seg + width ? s : l;
                break;
            }
            default: break;
        }
        if (th.op <= SHFL_XOR) {
            if (src < 0 || src >= 32 || !(mask >> src & 1)) {
                fail(std::string(kOpNames[th.op]) + ": " + warp_where(w, l) +
                     " reads a lane outside the mask");
                return false;
            }
            th.result = rt.threads[base + src].value;
        } else if (th.op == VOTE_ALL) {
            th.result = ballot == mask;
        } else if (th.op == VOTE_ANY) {
            th.result = ballot != 0;
        } else {
            th.result = ballot;
        }
    }
    for (int l = 0; l < 32; ++l) {
        if (mask >> l & 1) rt.threads[base + l].state = RESUME;
    }
    return true;
}

static bool release_barrier() {
    const int live = rt.n - rt.done;
    if (rt.at_barrier == 0 || rt.at_barrier != live) return false;
    if (rt.done > 0) {
        int exited = -1;
        for (int t = 0; t < rt.n; ++t) {
            if (rt.threads[t].state == DONE) {
                exited = t;
                break;
            }
        }
        char b[256];
        snprintf(b, sizeof b, "__syncthreads() reached by %d of the block's %d threads: %d "
                 "exited before it (thread %s first); CUDA requires every thread of the block "
                 "to reach it", rt.at_barrier, rt.n, rt.done, fmt3(rt.threads[exited].tid).c_str());
        fail(b);
        return false;
    }
    for (int t = 0; t < rt.n; ++t) rt.threads[t].state = RESUME;
    rt.at_barrier = 0;
    return true;
}

static std::string deadlock_report() {
    int barrier = 0, warp = 0;
    std::string where;
    for (int t = 0; t < rt.n; ++t) {
        const Thread& th = rt.threads[t];
        if (th.state == AT_BARRIER) barrier++;
        if (th.state == AT_WARP) {
            if (warp++ == 0) where = warp_where(t / 32, t % 32) + " at " + kOpNames[th.op];
        }
    }
    char b[160];
    snprintf(b, sizeof b, "deadlock: %d threads wait at __syncthreads(), %d at warp collectives "
             "whose lanes never all arrive", barrier, warp);
    return std::string(b) + (warp ? " (first: " + where + ")" : std::string());
}

static void run_block() {
    for (int t = 0; t < rt.n; ++t) rt.threads[t].state = UNSTARTED;
    rt.next_unstarted = 0;
    rt.done = 0;
    rt.at_barrier = 0;
    for (;;) {
        while (rt.next_unstarted < rt.n) {
            const int f = take_fiber();
            if (f < 0) {
                fail("out of memory for thread stacks");
                return;
            }
            resume(f);
            if (!rt.error.empty()) return;
        }
        for (int t = 0; t < rt.n; ++t) {
            if (rt.threads[t].state == RESUME) {
                rt.threads[t].state = RUNNING;
                resume(rt.threads[t].fiber);
                if (!rt.error.empty()) return;
            }
        }
        if (rt.done == rt.n) return;
        bool released = false;
        for (int w = 0; w * 32 < rt.n; ++w) {
            released |= release_warp(w);
            if (!rt.error.empty()) return;
        }
        if (!released) released = release_barrier();
        if (!rt.error.empty()) return;
        if (!released) {
            fail(deadlock_report());
            return;
        }
    }
}

static inline Thread& current_thread() {
    const unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    return rt.threads[t];
}

// Wait at a warp collective; the scheduler fills `result`.
static uint64_t warp_collective(int op, unsigned mask, uint64_t value, int arg, int width) {
    Thread& th = current_thread();
    th.op = op;
    th.mask = mask;
    th.value = value;
    th.arg = arg;
    th.width = width;
    th.state = AT_WARP;
    const uint3 tid = th.tid;
    park();
    threadIdx = tid;
    return current_thread().result;
}

static void syncthreads() {
    Thread& th = current_thread();
    th.state = AT_BARRIER;
    rt.at_barrier++;
    const uint3 tid = th.tid;
    park();
    threadIdx = tid;
}

template <typename T>
static inline uint64_t to_bits(T v) {
    static_assert(sizeof(T) <= 8, "shuffles move at most 8 bytes");
    uint64_t b = 0;
    memcpy(&b, &v, sizeof(T));
    return b;
}
template <typename T>
static inline T from_bits(uint64_t b) {
    T v;
    memcpy(&v, &b, sizeof(T));
    return v;
}

template <typename T>
static inline T shfl(int op, unsigned mask, T v, int arg, int width) {
    return from_bits<T>(warp_collective(op, mask, to_bits(v), arg, width));
}

// Launching --------------------------------------------------------------------------------

template <typename T>
constexpr char type_code() {
    using U = std::remove_cv_t<T>;
    if constexpr (std::is_pointer_v<U>) {
        return std::is_const_v<std::remove_pointer_t<U>> ? 'c' : 'p';  // c: only read
    }
    else if constexpr (std::is_same_v<U, int>) return 'i';
    else if constexpr (std::is_same_v<U, unsigned int>) return 'I';
    else if constexpr (std::is_same_v<U, long long> || std::is_same_v<U, long>) return 'q';
    else if constexpr (std::is_same_v<U, unsigned long long> || std::is_same_v<U, unsigned long>)
        return 'Q';
    else if constexpr (std::is_same_v<U, float>) return 'f';
    else if constexpr (std::is_same_v<U, double>) return 'd';
    else return 'x';
}

template <typename... A>
const char* signature(void (*)(A...)) {
    static const char sig[] = {type_code<A>()..., '\0'};
    return sig;
}

static const char* launch_blocks(const char* name, unsigned gx, unsigned gy, unsigned gz,
                                 unsigned bx, unsigned by, unsigned bz, void (*body)(void*),
                                 void* ctx) {
    char b[256];
    rt.error.clear();
    const unsigned long long threads = (unsigned long long)bx * by * bz;
    if (gx == 0 || gy == 0 || gz == 0 || gx > 0x7fffffffu || gy > 65535 || gz > 65535) {
        snprintf(b, sizeof b, "%s: grid (%u, %u, %u) outside CUDA's limits (x < 2^31, y and z "
                 "<= 65535, none 0)", name, gx, gy, gz);
        rt.message = b;
        return rt.message.c_str();
    }
    if (bx == 0 || by == 0 || bz == 0 || bx > 1024 || by > 1024 || bz > 64 || threads > 1024) {
        snprintf(b, sizeof b, "%s: block (%u, %u, %u) outside CUDA's limits (<= 1024 threads, "
                 "x, y <= 1024, z <= 64)", name, bx, by, bz);
        rt.message = b;
        return rt.message.c_str();
    }
    rt.n = (int)threads;
    if (rt.threads.size() < threads) rt.threads.resize(threads);
    for (unsigned z = 0, t = 0; z < bz; ++z) {
        for (unsigned y = 0; y < by; ++y) {
            for (unsigned x = 0; x < bx; ++x, ++t) rt.threads[t].tid = uint3{x, y, z};
        }
    }
    rt.body = body;
    rt.ctx = ctx;
    gridDim = dim3{gx, gy, gz};
    blockDim = dim3{bx, by, bz};
    for (unsigned z = 0; z < gz; ++z) {
        for (unsigned y = 0; y < gy; ++y) {
            for (unsigned x = 0; x < gx; ++x) {
                blockIdx = uint3{x, y, z};
                run_block();
                if (!rt.error.empty()) {
                    rt.message = std::string(name) + ": block " + fmt3(blockIdx) + ": " + rt.error;
                    rt.error.clear();
                    reset_fibers();
                    return rt.message.c_str();
                }
            }
        }
    }
    return nullptr;
}

template <typename... A>
struct Call {
    void (*kernel)(A...);
    std::tuple<std::remove_cv_t<A>...> args;
    static void run(void* self) {
        Call* c = (Call*)self;
        std::apply(c->kernel, c->args);
    }
};

template <typename... A, size_t... I>
std::tuple<std::remove_cv_t<A>...> unpack(void** args, std::index_sequence<I...>) {
    return std::tuple<std::remove_cv_t<A>...>(*static_cast<std::remove_cv_t<A>*>(args[I])...);
}

template <typename... A>
const char* launch(void (*kernel)(A...), const char* name, unsigned gx, unsigned gy, unsigned gz,
                   unsigned bx, unsigned by, unsigned bz, void** args) {
    std::lock_guard<std::mutex> hold(rt.lock);
    const char* sig = signature(kernel);
    if (strchr(sig, 'x') != nullptr) {
        rt.message = std::string(name) + ": a parameter type the emulator cannot pass";
        return rt.message.c_str();
    }
    Call<A...> call{kernel, unpack<A...>(args, std::index_sequence_for<A...>{})};
    return launch_blocks(name, gx, gy, gz, bx, by, bz, &Call<A...>::run, &call);
}

}  // namespace rpc_emu

// The CUDA intrinsics -----------------------------------------------------------------------

static inline void __syncthreads() { rpc_emu::syncthreads(); }
static inline void __syncwarp(unsigned mask = 0xffffffffu) {
    rpc_emu::warp_collective(rpc_emu::SYNCWARP, mask, 0, 0, 32);
}
template <typename T>
static inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    return rpc_emu::shfl(rpc_emu::SHFL_IDX, mask, v, src, width);
}
template <typename T>
static inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    return rpc_emu::shfl(rpc_emu::SHFL_UP, mask, v, (int)delta, width);
}
template <typename T>
static inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    return rpc_emu::shfl(rpc_emu::SHFL_DOWN, mask, v, (int)delta, width);
}
template <typename T>
static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    return rpc_emu::shfl(rpc_emu::SHFL_XOR, mask, v, lane_mask, width);
}
static inline int __all_sync(unsigned mask, int p) {
    return (int)rpc_emu::warp_collective(rpc_emu::VOTE_ALL, mask, p != 0, 0, 32);
}
static inline int __any_sync(unsigned mask, int p) {
    return (int)rpc_emu::warp_collective(rpc_emu::VOTE_ANY, mask, p != 0, 0, 32);
}
static inline unsigned __ballot_sync(unsigned mask, int p) {
    return (unsigned)rpc_emu::warp_collective(rpc_emu::VOTE_BALLOT, mask, p != 0, 0, 32);
}

// Atomics and fences: a launch's threads are fibers of one OS thread that switch only at
// barriers and warp collectives, so a read-modify-write is never interleaved, and memory is
// one coherent host memory.
static inline unsigned atomicAdd(unsigned* p, unsigned v) {
    const unsigned old = *p;
    *p = old + v;
    return old;
}
static inline int atomicAdd(int* p, int v) {
    const int old = *p;
    *p = old + v;
    return old;
}
static inline unsigned atomicExch(unsigned* p, unsigned v) {
    const unsigned old = *p;
    *p = v;
    return old;
}
static inline void __threadfence() {}

#define RPC_EMU_EXPORT(NAME)                                                                  \
    extern "C" __attribute__((visibility("default"))) const char* emu_##NAME(                \
        unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,          \
        void** args) {                                                                         \
        return rpc_emu::launch(&NAME, #NAME, gx, gy, gz, bx, by, bz, args);                     \
    }                                                                                          \
    extern "C" __attribute__((visibility("default"))) const char* emu_sig_##NAME() {          \
        return rpc_emu::signature(&NAME);                                                       \
    }
