// Elementwise kernels: binary ops (residual add, scale), div's gradient, casts and dropout (the
// unary ops, GELU, SwiGLU and the fused bias kernels are generated from their expressions:
// expressions.cu, kernels/elementwise/cuda_source.py). All are flat: one thread per element of
// a contiguous (n,) buffer, launched as a 1-D grid of 256-thread blocks. Values are computed in acc_t<T> (fp32 for the 2-byte formats,
// as elementwise/cpu.py does) and rounded once on the way out.
#include "common.cuh"

enum BinaryOp { OP_ADD = 0, OP_SUB = 1, OP_MUL = 2, OP_DIV = 3 };

template <int OP, typename A> __device__ __forceinline__ A apply_op(A x, A y) {
    if constexpr (OP == OP_ADD) return x + y;
    else if constexpr (OP == OP_SUB) return x - y;
    else if constexpr (OP == OP_MUL) return x * y;
    else return x / y;
}

// out[i] = a[i] (op) b[i] for two arrays of the same shape, or with one side a scalar: a null
// pointer means "use the scalar sa (or sb)". mul with a scalar is the scale kernel.
// a, b, out: (n,). Matches elementwise/cpu.py's _binary (NumPy's ufunc on fp32 views, rounded once).
template <typename T, int OP>
__global__ void binary(const T* a, const T* b, acc_t<T> sa, acc_t<T> sb, T* out, long long n) {
    const long long i = global_index();
    if (i >= n) return;
    const acc_t<T> x = a ? to_acc(a[i]) : sa;
    const acc_t<T> y = b ? to_acc(b[i]) : sb;
    out[i] = from_acc<T>(apply_op<OP>(x, y));
}

// ---------------------------------------------------------------- div's gradient
// db[i] = -(dy[i] (a[i] / b[i])) / b[i]: the gradient of a / b with respect to b, in acc_t<T>
// and rounded once (b * b in fp16 overflows for |b| >= 256). A null a means "use the scalar sa".
// a, b, dy, db: (n,). Same formula and order as cpu.div_bwd.
template <typename T>
__global__ void div_bwd(const T* a, acc_t<T> sa, const T* b, const T* dy, T* db, long long n) {
    const long long i = global_index();
    if (i >= n) return;
    const acc_t<T> x = a ? to_acc(a[i]) : sa, y = to_acc(b[i]);
    db[i] = from_acc<T>(-(to_acc(dy[i]) * (x / y)) / y);
}

// ---------------------------------------------------------------- casts, dropout

// y[i] = x[i] converted from Tin to Tout (through fp32: exact for the 2-byte formats, then
// rounded to nearest even, as NumPy's astype). x, y: (n,).
template <typename Tin, typename Tout>
__global__ void cast(const Tin* x, Tout* y, long long n) {
    const long long i = global_index();
    if (i >= n) return;
    y[i] = from_acc<Tout>(to_acc(x[i]));
}

// A counter-based hash (splitmix64's finalizer): the same (seed, i) always gives the same bits.
__device__ __forceinline__ unsigned long long mix64(unsigned long long z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Inverted dropout: u = uniform [0, 1) with 24 random bits from hash(seed, i); keep when u >= p.
// mask[i] = keep ? scale : 0 with scale = 1/(1-p) in fp32 (rounded to T), y[i] = x[i] * mask[i].
// x, y, mask: (n,). Same rule as cpu.dropout_fwd; the random stream differs from NumPy's.
template <typename T>
__global__ void dropout_fwd(const T* x, T* y, T* mask, long long n, float p, float scale,
                            unsigned long long seed) {
    const long long i = global_index();
    if (i >= n) return;
    const float u = float(mix64(mix64(seed) + (unsigned long long)i) >> 40) * (1.0f / 16777216.0f);
    const T m = from_acc<T>(acc_t<T>(u >= p ? scale : 0.0f));
    mask[i] = m;
    y[i] = from_acc<T>(to_acc(x[i]) * to_acc(m));
}

#ifdef TG_CHECK_INSTANTIATE
// Every variant cuda.py launches. backend/cuda/runtime.py reads this list for NVRTC's name_expressions;
// scripts/check_kernels.sh defines TG_CHECK_INSTANTIATE so nvcc compiles each of them.
void* tg_instances_elementwise[] = {
    (void*)&binary<float, 0>, (void*)&binary<float, 1>, (void*)&binary<float, 2>, (void*)&binary<float, 3>,
    (void*)&binary<__half, 0>, (void*)&binary<__half, 1>, (void*)&binary<__half, 2>, (void*)&binary<__half, 3>,
    (void*)&binary<__nv_bfloat16, 0>, (void*)&binary<__nv_bfloat16, 1>,
    (void*)&binary<__nv_bfloat16, 2>, (void*)&binary<__nv_bfloat16, 3>,
    (void*)&binary<double, 0>, (void*)&binary<double, 1>, (void*)&binary<double, 2>, (void*)&binary<double, 3>,
    (void*)&div_bwd<float>, (void*)&div_bwd<__half>, (void*)&div_bwd<__nv_bfloat16>, (void*)&div_bwd<double>,
    (void*)&cast<float, __half>, (void*)&cast<float, __nv_bfloat16>, (void*)&cast<__half, float>,
    (void*)&cast<__nv_bfloat16, float>, (void*)&cast<__half, __nv_bfloat16>, (void*)&cast<__nv_bfloat16, __half>,
    (void*)&dropout_fwd<float>, (void*)&dropout_fwd<__half>, (void*)&dropout_fwd<__nv_bfloat16>,
    (void*)&dropout_fwd<double>,
};
#endif
