// CUDA on the CPU: what the project's .cu kernels use, in plain C++17, so that a kernel compiled
// with g++ runs its blocks on this machine (tests/cuda_on_cpu/__init__.py builds and calls them).
//
// Execution: the blocks of a launch run one after another on the calling OS thread. Each CUDA
// thread of a block is a fiber (a ucontext stack, switched with _setjmp/_longjmp: no system call
// per switch); a fiber runs until it reaches a switch point, __syncthreads or a warp collective
// (the shuffles, __syncwarp, votes, and the warp-wide PTX of ptx_on_cpu.h), then another runs.
// Three thread orders (run_block): forward and reverse run warp by warp, each as far as it gets
// before the next; shuffle runs all threads in a fresh random order between barriers. Nothing
// runnable and some thread not finished is a deadlock, reported with where the threads wait.
// Between switch points a thread runs alone, so atomics are plain read-modify-writes.
//
// Memory: global memory is the caller's (NumPy buffers). Static __shared__ variables live in a
// per-block arena, dynamic shared memory (extern __shared__) in a buffer that ends at a
// PROT_NONE page; both are filled with 0xFF bytes (NaN in every float format) before each block,
// and the slack past each static variable and past the dynamic size is checked after it. The
// builder rewrites each __shared__ declaration into a call below (shared_var / dynamic_shared).
// A fault (the guard page, a fiber's stack guard, a wild pointer) becomes an error of the launch.
//
// What this cannot show: weak memory ordering between threads (a thread's writes are seen at once
// by every other), the GPU's math (its expf, tanhf, ... ulps, FMA contraction, flush to zero),
// resource limits beyond the ones checked here (registers, occupancy), and performance.
#ifndef TG_CUDA_CPU_H
#define TG_CUDA_CPU_H

#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <math.h>  // the C++ <math.h>: expf, isfinite, ... in the global namespace, as CUDA has them
#include <type_traits>
#include <utility>
#include <vector>

#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/common_interface_defs.h>
#endif

// ---------------------------------------------------------------- qualifiers and built-in types

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __restrict__ __restrict
// The builder rewrites every __shared__ declaration; one left over does not compile.
#define __shared__ tg_shared_declaration_not_rewritten_by_the_builder

struct uint3 {
    unsigned x, y, z;
};
struct dim3 {
    unsigned x, y, z;
};
constexpr int warpSize = 32;

// ---------------------------------------------------------------- 2-byte floats

struct __half {
    unsigned short x;
};
struct __nv_bfloat16 {
    unsigned short x;
};

inline unsigned tg_bits(float f) {
    unsigned u;
    std::memcpy(&u, &f, 4);
    return u;
}
inline float tg_float(unsigned u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

inline float __half2float(__half h) {
    const unsigned sign = (h.x & 0x8000u) << 16, e = (h.x >> 10) & 0x1f, m = h.x & 0x3ff;
    if (e == 0) return tg_float(sign | tg_bits(float(m) * 5.9604644775390625e-8f));  // m 2^-24
    if (e == 31) return tg_float(sign | 0x7f800000u | (m << 13));                     // inf, NaN
    return tg_float(sign | ((e + 112) << 23) | (m << 13));
}

// Round to nearest even, as the GPU's cvt.rn.f16.f32 (and NumPy's astype).
inline __half __float2half_rn(float f) {
    const unsigned u = tg_bits(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    unsigned short h;
    if (a > 0x7f800000u) h = 0x7e00;                 // NaN
    else if (a >= 0x477ff000u) h = 0x7c00;           // 65520 and above round to inf
    else if (a < 0x38800000u)                        // below 2^-14: a subnormal half (or 0)
        h = (unsigned short)std::nearbyint(tg_float(a) * 16777216.0f);  // exact scaling, RNE
    else {
        const unsigned m = a & 0x7fffff, rest = m & 0x1fff;
        h = (unsigned short)((((a >> 23) - 112) << 10) | (m >> 13));
        if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h;  // a carry moves to the exponent
    }
    return __half{(unsigned short)(h | sign)};
}
inline __half __float2half(float f) { return __float2half_rn(f); }

inline float __bfloat162float(__nv_bfloat16 b) { return tg_float(unsigned(b.x) << 16); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    const unsigned u = tg_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return __nv_bfloat16{(unsigned short)((u >> 16) | 0x40)};
    return __nv_bfloat16{(unsigned short)((u + 0x7fffu + ((u >> 16) & 1)) >> 16)};
}
inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }

inline unsigned short __half_as_ushort(__half h) { return h.x; }
inline __half __ushort_as_half(unsigned short x) { return __half{x}; }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short x) { return __nv_bfloat16{x}; }

// ---------------------------------------------------------------- math and bit casts

template <class To, class From> inline To tg_cast(From x) {
    static_assert(sizeof(To) == sizeof(From), "bit cast between sizes");
    To y;
    std::memcpy(&y, &x, sizeof(To));
    return y;
}
inline float __int_as_float(int x) { return tg_cast<float>(x); }
inline int __float_as_int(float x) { return tg_cast<int>(x); }
inline float __uint_as_float(unsigned x) { return tg_cast<float>(x); }
inline unsigned __float_as_uint(float x) { return tg_cast<unsigned>(x); }
inline double __longlong_as_double(long long x) { return tg_cast<double>(x); }
inline long long __double_as_longlong(double x) { return tg_cast<long long>(x); }

// Built with -ffp-contract=off: every operation is rounded on its own, as the _rn intrinsics ask.
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dsub_rn(double a, double b) { return a - b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __ddiv_rn(double a, double b) { return a / b; }
inline double __dsqrt_rn(double a) { return std::sqrt(a); }
inline double __fma_rn(double a, double b, double c) { return std::fma(a, b, c); }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
// The four signed bytes of a times those of b, summed, plus c (sm_61's dp4a.s32.s32).
inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 32; i += 8) c += (int)(signed char)(a >> i) * (int)(signed char)(b >> i);
    return c;
}

#define TG_MINMAX(T)                                  \
    inline T min(T a, T b) { return b < a ? b : a; } \
    inline T max(T a, T b) { return a < b ? b : a; }
TG_MINMAX(int)
TG_MINMAX(unsigned)
TG_MINMAX(long long)
TG_MINMAX(unsigned long long)
TG_MINMAX(float)
TG_MINMAX(double)
#undef TG_MINMAX

// ---------------------------------------------------------------- the machine

namespace tg {

enum State { RUNNABLE, AT_SYNCTHREADS, AT_WARP, DONE };

struct Copy {  // one cp.async in flight: its 16 bytes, read at issue, land at the wait
    unsigned char* dst;
    unsigned char data[16];
    long group;  // -1 until committed
};

struct Fiber {
    uint3 tid;
    int lane, warp;
    State state;
    unsigned mask;     // the lanes of the warp collective it waits at
    const char* what;  // the switch point it waits at, for the deadlock report
    unsigned wgen;     // warp collectives passed so far
    jmp_buf ctx;
    ucontext_t uc;
    char* stack;  // usable part; one PROT_NONE page below it
    size_t stack_size;
    std::vector<Copy> copies;
    long groups;  // cp.async groups committed
    void* fake_stack;
};

struct Slot {  // what a lane brings to a warp collective
    unsigned long long v[6];
};
struct Warp {
    Slot slot[2][32];            // by parity of the collective's number (wgen)
    unsigned result_gen[2];      // the collective whose whole-warp result is in result[]
    unsigned result[2][32][4];
};

struct SharedVar {
    const void* key;
    unsigned char* ptr;
    size_t size;
};

constexpr size_t STATIC_SHARED = 48 * 1024;  // CUDA's limit for static __shared__ per block
constexpr size_t REDZONE = 64;               // poison between static shared variables
#ifdef __SANITIZE_ADDRESS__
constexpr size_t STACK = 1 << 20;
#else
constexpr size_t STACK = 128 * 1024;
#endif

inline Fiber* current = nullptr;
inline std::vector<Fiber*> pool;
inline bool pool_broken = false;  // a launch was abandoned: every fiber must start afresh
inline Warp warps[32];
inline jmp_buf scheduler;
inline sigjmp_buf launch_env;
inline char error[8192];
inline void (*job)(void*, void**) = nullptr;
inline void* job_kernel = nullptr;
inline void** job_args = nullptr;
inline ucontext_t creator;
inline Fiber* creating = nullptr;
inline size_t page = 4096;
inline void* main_stack_bottom = nullptr;  // for AddressSanitizer's fiber switches
inline size_t main_stack_size = 0;
inline void* main_fake_stack = nullptr;

// static shared: an arena per block; dynamic shared: a buffer ending at a PROT_NONE page
inline unsigned char* arena = nullptr;  // STATIC_SHARED + redzones, mapped once
inline size_t arena_cap = 0, arena_used = 0;
inline std::vector<SharedVar> shared_vars;
inline unsigned char* dyn_map = nullptr;
inline size_t dyn_map_size = 0;
inline unsigned char* dyn_base = nullptr;  // = guard page - round_up(dyn_size, 16)
inline size_t dyn_size = 0, dyn_padded = 0;

}  // namespace tg

inline uint3 blockIdx;
inline dim3 blockDim, gridDim;
#define threadIdx (tg::current->tid)

namespace tg {

[[noreturn]] inline void fail(const char* fmt, ...) {
    int n = std::snprintf(error, sizeof error, "block (%u,%u,%u)", blockIdx.x, blockIdx.y, blockIdx.z);
    if (current)
        n += std::snprintf(error + n, sizeof error - n, " thread (%u,%u,%u)", current->tid.x,
                           current->tid.y, current->tid.z);
    n += std::snprintf(error + n, sizeof error - n, ": ");
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(error + n, sizeof error - n, fmt, ap);
    va_end(ap);
    siglongjmp(launch_env, 1);
}

// AddressSanitizer must be told when the stack changes (no-ops in the ordinary build).
inline void asan_leave(void** fake, const void* bottom, size_t size) {
#ifdef __SANITIZE_ADDRESS__
    __sanitizer_start_switch_fiber(fake, bottom, size);
#else
    (void)fake, (void)bottom, (void)size;
#endif
}
inline void asan_arrive(void* fake, const void** bottom_old, size_t* size_old) {
#ifdef __SANITIZE_ADDRESS__
    __sanitizer_finish_switch_fiber(fake, bottom_old, size_old);
#else
    (void)fake, (void)bottom_old, (void)size_old;
#endif
}

inline void check_copies_landed(Fiber* f);

// A fiber hands control back to the scheduler; it continues here when resumed.
inline void yield() {
    Fiber* self = current;
    if (!_setjmp(self->ctx)) {
        asan_leave(&self->fake_stack, main_stack_bottom, main_stack_size);
        _longjmp(scheduler, 1);
    }
    asan_arrive(self->fake_stack, nullptr, nullptr);
}

inline void resume(Fiber* f) {
    current = f;
    if (!_setjmp(scheduler)) {
        asan_leave(&main_fake_stack, f->stack, f->stack_size);
        _longjmp(f->ctx, 1);
    }
    asan_arrive(main_fake_stack, nullptr, nullptr);
    current = nullptr;
}

// Every fiber runs this forever: the launch's kernel for the thread it is given, then DONE.
inline void trampoline() {
    Fiber* self = creating;
    asan_arrive(nullptr, (const void**)&main_stack_bottom, &main_stack_size);
    if (!_setjmp(self->ctx)) {  // parked; the first resume continues below
        asan_leave(&self->fake_stack, main_stack_bottom, main_stack_size);
        swapcontext(&self->uc, &creator);
    }
    asan_arrive(self->fake_stack, nullptr, nullptr);
    for (;;) {
        job(job_kernel, job_args);
        check_copies_landed(current);
        current->state = DONE;
        yield();
    }
}

inline void park(Fiber* f) {
    getcontext(&f->uc);
    f->uc.uc_stack.ss_sp = f->stack;
    f->uc.uc_stack.ss_size = f->stack_size;
    f->uc.uc_link = nullptr;
    makecontext(&f->uc, trampoline, 0);
    creating = f;
    asan_leave(&main_fake_stack, f->stack, f->stack_size);
    swapcontext(&creator, &f->uc);
    asan_arrive(main_fake_stack, nullptr, nullptr);
}

inline void ensure_pool(size_t n) {
    if (pool_broken) {
        for (Fiber* f : pool) park(f);
        pool_broken = false;
    }
    while (pool.size() < n) {
        Fiber* f = new Fiber();
        void* m = mmap(nullptr, STACK + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                       -1, 0);
        if (m == MAP_FAILED) {
            std::snprintf(error, sizeof error, "cannot map a fiber stack");
            siglongjmp(launch_env, 1);
        }
        mprotect(m, page, PROT_NONE);  // the stack grows down into this page on overflow
        f->stack = (char*)m + page;
        f->stack_size = STACK;
        f->copies.reserve(64);
        park(f);
        pool.push_back(f);
    }
}

// ---------------------------------------------------------------- shared memory

inline bool in_shared(const void* p, size_t n) {
    const unsigned char* c = (const unsigned char*)p;
    for (const SharedVar& v : shared_vars)
        if (c >= v.ptr && c + n <= v.ptr + v.size) return true;
    return dyn_base && c >= dyn_base && c + n <= dyn_base + dyn_size;
}

// The storage of one static __shared__ variable (key: one per declaration and instance), the
// same for every thread of the block, 0xFF-filled when the block starts.
template <class T> inline T& shared_var(const void* key, size_t align) {
    for (const SharedVar& v : shared_vars)
        if (v.key == key) return *reinterpret_cast<T*>(v.ptr);
    if (align < 16) align = 16;
    size_t at = (arena_used + REDZONE + align - 1) / align * align;
    if (at + sizeof(T) > STATIC_SHARED + REDZONE)
        fail("static __shared__ memory past CUDA's 48 KB per block (%zu bytes)", at + sizeof(T));
    shared_vars.push_back({key, arena + at, sizeof(T)});
    arena_used = at + sizeof(T);
    return *reinterpret_cast<T*>(arena + at);
}

inline unsigned char* dynamic_shared() { return dyn_base; }

inline void check_redzones() {
    size_t from = 0;
    for (const SharedVar& v : shared_vars) {
        for (size_t i = from; i < size_t(v.ptr - arena); ++i)
            if (arena[i] != 0xFF) fail("a write %zu bytes before a static __shared__ variable", size_t(v.ptr - arena) - i);
        from = size_t(v.ptr - arena) + v.size;
    }
    for (size_t i = from; i < from + REDZONE && i < arena_cap; ++i)
        if (arena[i] != 0xFF) fail("a write %zu bytes past a static __shared__ variable", i - from + 1);
    for (size_t i = dyn_size; i < dyn_padded; ++i)
        if (dyn_base[i] != 0xFF) fail("a write %zu bytes past the dynamic shared memory (%zu bytes)", i - dyn_size + 1, dyn_size);
}

// ---------------------------------------------------------------- barriers and warp collectives

inline void syncthreads() {
    current->state = AT_SYNCTHREADS;
    current->what = "__syncthreads";
    yield();
}

// Wait until every lane of mask has reached this collective (the lane's Slot already written).
// -> the parity of this collective's slots and results.
inline int warp_arrive(unsigned mask, const char* what) {
    Fiber* f = current;
    if (!(mask >> f->lane & 1)) fail("%s with mask %08x, which leaves out the calling lane %d", what, mask, f->lane);
    const int parity = f->wgen & 1;
    f->state = AT_WARP;
    f->mask = mask;
    f->what = what;
    yield();
    ++f->wgen;
    return parity;
}

inline Slot& my_slot() { return warps[current->warp].slot[current->wgen & 1][current->lane]; }

template <class T> inline T shuffle(unsigned mask, T var, int src, const char* what) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffle of a large type");
    std::memcpy(&my_slot().v[0], &var, sizeof(T));
    const int parity = warp_arrive(mask, what);
    if (src == current->lane) return var;
    if (!(mask >> src & 1)) fail("%s reads lane %d, which is not in mask %08x", what, src, mask);
    T out;
    std::memcpy(&out, &warps[current->warp].slot[parity][src].v[0], sizeof(T));
    return out;
}

inline int check_width(int width, const char* what) {
    if (width < 1 || width > 32 || (width & (width - 1))) fail("%s with width %d", what, width);
    return width;
}

inline unsigned vote(unsigned mask, bool pred, const char* what) {
    my_slot().v[0] = pred;
    const int parity = warp_arrive(mask, what);
    unsigned ballot = 0;
    for (int l = 0; l < 32; ++l)
        if ((mask >> l & 1) && warps[current->warp].slot[parity][l].v[0]) ballot |= 1u << l;
    return ballot;
}

}  // namespace tg

inline void __syncthreads() { tg::syncthreads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { tg::warp_arrive(mask, "__syncwarp"); }
inline void __threadfence() {}
inline void __threadfence_block() {}

template <class T> inline T __shfl_sync(unsigned mask, T var, int src, int width = 32) {
    const int w = tg::check_width(width, "__shfl_sync"), lane = tg::current->lane;
    return tg::shuffle(mask, var, (lane & ~(w - 1)) + (src & (w - 1)), "__shfl_sync");
}
template <class T> inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32) {
    const int w = tg::check_width(width, "__shfl_up_sync"), lane = tg::current->lane;
    const int src = (lane % w) >= int(delta) ? lane - int(delta) : lane;
    return tg::shuffle(mask, var, src, "__shfl_up_sync");
}
template <class T> inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32) {
    const int w = tg::check_width(width, "__shfl_down_sync"), lane = tg::current->lane;
    const int src = (lane % w) + int(delta) < w ? lane + int(delta) : lane;
    return tg::shuffle(mask, var, src, "__shfl_down_sync");
}
template <class T> inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32) {
    const int w = tg::check_width(width, "__shfl_xor_sync"), lane = tg::current->lane;
    const int src = lane ^ (lane_mask & 31);
    // a lane of a later group of `width` reads its own value, as CUDA documents
    return tg::shuffle(mask, var, (src & ~(w - 1)) > (lane & ~(w - 1)) ? lane : src, "__shfl_xor_sync");
}
inline unsigned __ballot_sync(unsigned mask, int pred) { return tg::vote(mask, pred, "__ballot_sync"); }
inline int __any_sync(unsigned mask, int pred) { return tg::vote(mask, pred, "__any_sync") != 0; }
inline int __all_sync(unsigned mask, int pred) { return tg::vote(mask, pred, "__all_sync") == mask; }

// Threads switch only at barriers: a read-modify-write is atomic.
template <class T> inline T atomicAdd(T* p, T v) {
    const T old = *p;
    *p = old + v;
    return old;
}
template <class T> inline T atomicExch(T* p, T v) {
    const T old = *p;
    *p = v;
    return old;
}
template <class T> inline T atomicMax(T* p, T v) {
    const T old = *p;
    *p = old < v ? v : old;
    return old;
}
template <class T> inline T atomicMin(T* p, T v) {
    const T old = *p;
    *p = v < old ? v : old;
    return old;
}
template <class T> inline T atomicCAS(T* p, T compare, T v) {
    const T old = *p;
    if (old == compare) *p = v;
    return old;
}

inline size_t __cvta_generic_to_shared(const void* p) { return (size_t)p; }

namespace tg {

inline void check_copies_landed(Fiber* f) {
    if (!f->copies.empty())
        fail("the thread ends with %zu cp.async copies not waited for", f->copies.size());
}

// ---------------------------------------------------------------- the scheduler

enum Order { FORWARD = 0, REVERSE = 1, SHUFFLE = 2, CYCLE = 3 };

inline unsigned long long splitmix(unsigned long long& s) {
    unsigned long long z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

inline void arrange(std::vector<int>& perm, int order, unsigned long long& rng) {
    const int n = (int)perm.size();
    for (int i = 0; i < n; ++i) perm[i] = order == REVERSE ? n - 1 - i : i;
    if (order == SHUFFLE)
        for (int i = n - 1; i > 0; --i) std::swap(perm[i], perm[splitmix(rng) % (i + 1)]);
}

[[noreturn]] inline void deadlock(int n) {
    char buf[4096];
    int len = 0, done = 0, sync = 0;
    for (int i = 0; i < n; ++i) {
        done += pool[i]->state == DONE;
        sync += pool[i]->state == AT_SYNCTHREADS;
    }
    len += std::snprintf(buf + len, sizeof buf - len, "%d threads at __syncthreads, %d finished", sync, done);
    for (int w = 0; w * 32 < n; ++w) {
        int at = 0, first = -1;
        for (int l = 0; l < 32 && w * 32 + l < n; ++l)
            if (pool[w * 32 + l]->state == AT_WARP) at += 1, first = first < 0 ? w * 32 + l : first;
        if (at && len < (int)sizeof buf - 200)
            len += std::snprintf(buf + len, sizeof buf - len, "; warp %d: %d lanes at %s (mask %08x)", w,
                                 at, pool[first]->what, pool[first]->mask);
    }
    fail("deadlock: %s", buf);
}

// Release __syncthreads when every thread has arrived or exited (exited threads do not hold a
// barrier up, as on the GPU). -> whether it was released.
inline bool release_sync(int n) {
    int done = 0, sync = 0;
    for (int i = 0; i < n; ++i) {
        done += pool[i]->state == DONE;
        sync += pool[i]->state == AT_SYNCTHREADS;
    }
    if (!sync || sync + done != n) return false;
    for (int i = 0; i < n; ++i)
        if (pool[i]->state == AT_SYNCTHREADS) pool[i]->state = RUNNABLE;
    return true;
}

// Release the collectives of warp w that every lane of their mask has reached. -> whether any was.
inline bool release_warp(int w, int n) {
    bool released = false;
    Fiber** lanes = &pool[w * 32];
    const int nl = n - w * 32 < 32 ? n - w * 32 : 32;
    for (int l = 0; l < nl; ++l) {
        Fiber* f = lanes[l];
        if (f->state != AT_WARP) continue;
        bool ready = true;
        for (int m = 0; m < 32 && ready; ++m) {
            if (!(f->mask >> m & 1)) continue;
            if (m >= nl) {
                current = f;
                fail("%s with mask %08x names lane %d, which this block does not have", f->what, f->mask, m);
            }
            Fiber* g = lanes[m];
            if (g->state == DONE) {
                current = f;
                fail("%s with mask %08x waits for lane %d, which has exited", f->what, f->mask, m);
            }
            ready = g->state == AT_WARP && g->mask == f->mask && g->wgen == f->wgen && g->what == f->what;
        }
        if (!ready) continue;
        for (int m = 0; m < 32; ++m)
            if (f->mask >> m & 1) lanes[m]->state = RUNNABLE;
        released = true;
    }
    return released;
}

// One block. FORWARD and REVERSE run warp by warp (in that order, lanes too), each warp as far as
// it can get (through its warp collectives, up to __syncthreads or its end) before the next one
// starts: warps get ahead of each other, so a barrier missing between warps shows. SHUFFLE runs
// passes over all threads in a fresh random order, releasing the barriers after each pass: warps
// move in step, threads interleave at random between barriers.
inline void run_block(int n, int order, unsigned long long rng, std::vector<int>& perm) {
    for (int t = 0; t < n; ++t) {
        Fiber* f = pool[t];
        f->tid = {t % blockDim.x, (t / blockDim.x) % blockDim.y, t / (blockDim.x * blockDim.y)};
        f->lane = t % 32;
        f->warp = t / 32;
        f->state = RUNNABLE;
        f->wgen = 0;
        f->copies.clear();
        f->groups = 0;
    }
    for (Warp& w : warps) w.result_gen[0] = w.result_gen[1] = 0;
    std::memset(arena, 0xFF, arena_used + REDZONE < arena_cap ? arena_used + REDZONE : arena_cap);
    shared_vars.clear();
    arena_used = 0;
    if (dyn_base) std::memset(dyn_base, 0xFF, dyn_padded);
    const int nwarps = (n + 31) / 32;
    for (;;) {
        bool released = false;
        if (order == SHUFFLE) {
            arrange(perm, order, rng);
            for (int i : perm)
                if (pool[i]->state == RUNNABLE) resume(pool[i]);
            for (int w = 0; w < nwarps; ++w) released |= release_warp(w, n);
        } else {
            for (int k = 0; k < nwarps; ++k) {
                const int w = order == REVERSE ? nwarps - 1 - k : k;
                const int first = w * 32, nl = n - first < 32 ? n - first : 32;
                do
                    for (int j = 0; j < nl; ++j) {
                        Fiber* f = pool[first + (order == REVERSE ? nl - 1 - j : j)];
                        if (f->state == RUNNABLE) resume(f);
                    }
                while (release_warp(w, n));
            }
        }
        bool finished = true;
        for (int i = 0; i < n && finished; ++i) finished = pool[i]->state == DONE;
        if (finished) break;
        released |= release_sync(n);
        if (!released) deadlock(n);
    }
    check_redzones();
}

// ---------------------------------------------------------------- faults

inline struct sigaction old_segv, old_bus;
inline stack_t old_altstack;
inline char* altstack = nullptr;

inline void on_fault(int sig, siginfo_t* info, void*) {
    const unsigned char* a = (const unsigned char*)info->si_addr;
    const char* what = "an invalid address (out of bounds of a global buffer?)";
    if (dyn_base && a >= dyn_base + dyn_padded && a < dyn_base + dyn_padded + page)
        what = "past the end of the dynamic shared memory";
    for (Fiber* f : pool)
        if (a >= (unsigned char*)f->stack - page && a < (unsigned char*)f->stack) what = "a CUDA thread's stack overflow";
    int n = std::snprintf(error, sizeof error, "block (%u,%u,%u)", blockIdx.x, blockIdx.y, blockIdx.z);
    if (current)
        n += std::snprintf(error + n, sizeof error - n, " thread (%u,%u,%u)", current->tid.x,
                           current->tid.y, current->tid.z);
    std::snprintf(error + n, sizeof error - n, ": %s at %p: %s", sig == SIGBUS ? "SIGBUS" : "SIGSEGV",
                  (const void*)a, what);
    siglongjmp(launch_env, 1);
}

inline void catch_faults(bool on) {
#ifndef __SANITIZE_ADDRESS__  // AddressSanitizer reports faults itself
    if (on) {
        if (!altstack) altstack = (char*)std::malloc(1 << 16);
        stack_t ss = {};
        ss.ss_sp = altstack;
        ss.ss_size = 1 << 16;
        sigaltstack(&ss, &old_altstack);
        struct sigaction sa = {};
        sa.sa_sigaction = on_fault;
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGSEGV, &sa, &old_segv);
        sigaction(SIGBUS, &sa, &old_bus);
    } else {
        sigaction(SIGSEGV, &old_segv, nullptr);
        sigaction(SIGBUS, &old_bus, nullptr);
        sigaltstack(&old_altstack, nullptr);
    }
#else
    (void)on;
#endif
}

// ---------------------------------------------------------------- the launch

template <class... P, size_t... I>
inline void invoke(void (*k)(P...), void** args, std::index_sequence<I...>) {
    k(*static_cast<std::remove_cv_t<std::remove_reference_t<P>>*>(args[I])...);
}
template <class... P> inline void thunk(void* k, void** args) {
    invoke(reinterpret_cast<void (*)(P...)>(k), args, std::index_sequence_for<P...>{});
}

struct Instance {
    const char* name;
    void* kernel;
    void (*thunk)(void*, void**);
    int nparams;
    int sizes[32];
};
template <class... P> inline Instance instance(const char* name, void (*k)(P...)) {
    static_assert(sizeof...(P) <= 32, "more than 32 kernel parameters");
    Instance in{name, reinterpret_cast<void*>(k), &thunk<P...>, (int)sizeof...(P), {}};
    const int sizes[] = {(int)sizeof(P)..., 0};
    for (int i = 0; i < (int)sizeof...(P); ++i) in.sizes[i] = sizes[i];
    return in;
}

inline bool set_dynamic_shared(size_t bytes) {
    dyn_size = bytes;
    dyn_padded = (bytes + 15) / 16 * 16;
    const size_t need = (dyn_padded + page - 1) / page * page + page;
    if (need > dyn_map_size) {
        if (dyn_map) munmap(dyn_map, dyn_map_size);
        void* m = mmap(nullptr, need, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) return false;
        dyn_map = (unsigned char*)m;
        dyn_map_size = need;
        mprotect(dyn_map + need - page, page, PROT_NONE);
    }
    dyn_base = bytes ? dyn_map + dyn_map_size - page - dyn_padded : nullptr;
    return true;
}

// Run grid x block threads of instance `in`; -> 0, or 1 with the reason in tg::error.
inline int launch(const Instance& in, const unsigned* grid, const unsigned* block, size_t shared,
                  void** args, int order, unsigned long long seed) {
    error[0] = 0;
    page = (size_t)sysconf(_SC_PAGESIZE);
    job = in.thunk;
    job_kernel = in.kernel;
    job_args = args;
    gridDim = {grid[0], grid[1], grid[2]};
    blockDim = {block[0], block[1], block[2]};
    const int n = int(block[0] * block[1] * block[2]);
    if (!arena) {
        arena_cap = STATIC_SHARED + 2 * REDZONE;
        arena = (unsigned char*)std::malloc(arena_cap);
        std::memset(arena, 0xFF, arena_cap);
    }
    blockIdx = {0, 0, 0};
    current = nullptr;
    catch_faults(true);
    if (sigsetjmp(launch_env, 1)) {
        catch_faults(false);
        current = nullptr;
        pool_broken = true;
        return 1;
    }
    ensure_pool(n);
    if (!set_dynamic_shared(shared)) fail("cannot map %zu bytes of dynamic shared memory", shared);
    std::vector<int> perm(n);
    const unsigned long long nblocks = (unsigned long long)grid[0] * grid[1] * grid[2];
    std::vector<unsigned long long> blocks(nblocks);
    for (unsigned long long b = 0; b < nblocks; ++b) blocks[b] = order == REVERSE ? nblocks - 1 - b : b;
    unsigned long long rng = seed;
    if (order == SHUFFLE)
        for (unsigned long long i = nblocks; i > 1; --i) std::swap(blocks[i - 1], blocks[splitmix(rng) % i]);
    for (unsigned long long b : blocks) {
        blockIdx = {unsigned(b % grid[0]), unsigned(b / grid[0] % grid[1]), unsigned(b / grid[0] / grid[1])};
        // CYCLE: block b of launch `seed` runs its threads forward, reverse or shuffled
        const int o = order == CYCLE ? int((b + seed) % 3) : order;
        run_block(n, o, seed * 0x100000001B3ull + b, perm);
    }
    catch_faults(false);
    return 0;
}

}  // namespace tg

#endif  // TG_CUDA_CPU_H
