// Elementwise kernels: binary ops (residual add, scale), GELU forward and backward, casts and
// dropout. All are flat: one thread per element of a contiguous (n,) buffer, launched as a
// 1-D grid of 256-thread blocks. Values are computed in acc_t<T> (fp32 for the 2-byte formats,
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

// ---------------------------------------------------------------- div's gradient, unary ops
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

// The unary ops, in the order of spec.py's UNARY_OPS (tests/kernels/test_cuda_launches.py checks it).
enum UnaryOp { EXP = 0, LOG = 1, SQRT = 2, RSQRT = 3, TANH = 4, SIGMOID = 5, SILU = 6, RELU = 7 };

template <typename A> __device__ __forceinline__ A sigmoid(A x) {
    return A(1) / (A(1) + tg_exp(-x));
}

// op(x) and dy op'(x) in the compute type: elementwise/cpu.py's UNARY table, term for term.
template <int OP, typename A> __device__ __forceinline__ A unary_value(A x) {
    if constexpr (OP == EXP) return tg_exp(x);
    else if constexpr (OP == LOG) return tg_log(x);
    else if constexpr (OP == SQRT) return tg_sqrt(x);
    else if constexpr (OP == RSQRT) return A(1) / tg_sqrt(x);
    else if constexpr (OP == TANH) return tg_tanh(x);
    else if constexpr (OP == SIGMOID) return sigmoid(x);
    else if constexpr (OP == SILU) return x * sigmoid(x);
    else return x <= A(0) ? A(0) : x;  // RELU: a NaN stays NaN
}

template <int OP, typename A> __device__ __forceinline__ A unary_grad(A x, A dy) {
    if constexpr (OP == EXP) return dy * tg_exp(x);
    else if constexpr (OP == LOG) return dy / x;
    else if constexpr (OP == SQRT) return dy * A(0.5) / tg_sqrt(x);
    else if constexpr (OP == RSQRT) return dy * A(-0.5) / tg_sqrt(x) / x;
    else if constexpr (OP == TANH) return dy * (A(1) - tg_tanh(x) * tg_tanh(x));
    else if constexpr (OP == SIGMOID) return dy * sigmoid(x) * (A(1) - sigmoid(x));
    else if constexpr (OP == SILU) return dy * sigmoid(x) * (A(1) + x * (A(1) - sigmoid(x)));
    else return x > A(0) ? dy : A(0);  // RELU
}

// y[i] = op(x[i]), computed in acc_t<T> and rounded once. x, y: (n,). As cpu.unary_fwd.
template <typename T, int OP>
__global__ void unary_fwd(const T* x, T* y, long long n) {
    const long long i = global_index();
    if (i >= n) return;
    y[i] = from_acc<T>(unary_value<OP>(to_acc(x[i])));
}

// dx[i] = dy[i] op'(x[i]), computed in acc_t<T> and rounded once. x, dy, dx: (n,). As
// cpu.unary_bwd.
template <typename T, int OP>
__global__ void unary_bwd(const T* x, const T* dy, T* dx, long long n) {
    const long long i = global_index();
    if (i >= n) return;
    dx[i] = from_acc<T>(unary_grad<OP>(to_acc(x[i]), to_acc(dy[i])));
}

// ---------------------------------------------------------------- GELU, casts, dropout

// GPT-2's tanh GELU: t = tanh(c x (1 + 0.044715 x^2)) with c = sqrt(2/pi), evaluated in the order
// of elementwise/cpu.py's _gelu_tanh, ((x x 0.044715 + 1) x) c, with c rounded to the compute type as NumPy
// rounds the Python float.
constexpr double GELU_C = 0.7978845608028654;

template <typename A> __device__ __forceinline__ A gelu_tanh(A x) {
    return tg_tanh((x * x * A(0.044715) + A(1)) * x * A(GELU_C));
}

// y = 0.5 x (1 + t). x, y: (n,). Same formula and order as cpu.gelu_fwd.
template <typename T>
__global__ void gelu_fwd(const T* x, T* y, long long n) {
    typedef acc_t<T> A;
    const long long i = global_index();
    if (i >= n) return;
    const A v = to_acc(x[i]);
    y[i] = from_acc<T>((gelu_tanh(v) + A(1)) * v * A(0.5));
}

// dx = dy (0.5 (1 + t) + (1 - t^2) 0.5 c x (1 + 3 * 0.044715 x^2)). x, dy, dx: (n,). Same formula
// and order as cpu.gelu_bwd.
template <typename T>
__global__ void gelu_bwd(const T* x, const T* dy, T* dx, long long n) {
    typedef acc_t<T> A;
    const long long i = global_index();
    if (i >= n) return;
    const A v = to_acc(x[i]), t = gelu_tanh(v);
    const A inner = (v * v * A(3 * 0.044715) + A(1)) * v * A(0.5 * GELU_C);
    dx[i] = from_acc<T>(((t + A(1)) * A(0.5) + inner * (A(1) - t * t)) * to_acc(dy[i]));
}

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
    (void*)&unary_fwd<float, 0>, (void*)&unary_fwd<float, 1>, (void*)&unary_fwd<float, 2>, (void*)&unary_fwd<float, 3>,
    (void*)&unary_fwd<float, 4>, (void*)&unary_fwd<float, 5>, (void*)&unary_fwd<float, 6>, (void*)&unary_fwd<float, 7>,
    (void*)&unary_fwd<__half, 0>, (void*)&unary_fwd<__half, 1>, (void*)&unary_fwd<__half, 2>, (void*)&unary_fwd<__half, 3>,
    (void*)&unary_fwd<__half, 4>, (void*)&unary_fwd<__half, 5>, (void*)&unary_fwd<__half, 6>, (void*)&unary_fwd<__half, 7>,
    (void*)&unary_fwd<__nv_bfloat16, 0>, (void*)&unary_fwd<__nv_bfloat16, 1>, (void*)&unary_fwd<__nv_bfloat16, 2>, (void*)&unary_fwd<__nv_bfloat16, 3>,
    (void*)&unary_fwd<__nv_bfloat16, 4>, (void*)&unary_fwd<__nv_bfloat16, 5>, (void*)&unary_fwd<__nv_bfloat16, 6>, (void*)&unary_fwd<__nv_bfloat16, 7>,
    (void*)&unary_fwd<double, 0>, (void*)&unary_fwd<double, 1>, (void*)&unary_fwd<double, 2>, (void*)&unary_fwd<double, 3>,
    (void*)&unary_fwd<double, 4>, (void*)&unary_fwd<double, 5>, (void*)&unary_fwd<double, 6>, (void*)&unary_fwd<double, 7>,
    (void*)&unary_bwd<float, 0>, (void*)&unary_bwd<float, 1>, (void*)&unary_bwd<float, 2>, (void*)&unary_bwd<float, 3>,
    (void*)&unary_bwd<float, 4>, (void*)&unary_bwd<float, 5>, (void*)&unary_bwd<float, 6>, (void*)&unary_bwd<float, 7>,
    (void*)&unary_bwd<__half, 0>, (void*)&unary_bwd<__half, 1>, (void*)&unary_bwd<__half, 2>, (void*)&unary_bwd<__half, 3>,
    (void*)&unary_bwd<__half, 4>, (void*)&unary_bwd<__half, 5>, (void*)&unary_bwd<__half, 6>, (void*)&unary_bwd<__half, 7>,
    (void*)&unary_bwd<__nv_bfloat16, 0>, (void*)&unary_bwd<__nv_bfloat16, 1>, (void*)&unary_bwd<__nv_bfloat16, 2>, (void*)&unary_bwd<__nv_bfloat16, 3>,
    (void*)&unary_bwd<__nv_bfloat16, 4>, (void*)&unary_bwd<__nv_bfloat16, 5>, (void*)&unary_bwd<__nv_bfloat16, 6>, (void*)&unary_bwd<__nv_bfloat16, 7>,
    (void*)&unary_bwd<double, 0>, (void*)&unary_bwd<double, 1>, (void*)&unary_bwd<double, 2>, (void*)&unary_bwd<double, 3>,
    (void*)&unary_bwd<double, 4>, (void*)&unary_bwd<double, 5>, (void*)&unary_bwd<double, 6>, (void*)&unary_bwd<double, 7>,
    (void*)&gelu_fwd<float>, (void*)&gelu_fwd<__half>, (void*)&gelu_fwd<__nv_bfloat16>, (void*)&gelu_fwd<double>,
    (void*)&gelu_bwd<float>, (void*)&gelu_bwd<__half>, (void*)&gelu_bwd<__nv_bfloat16>, (void*)&gelu_bwd<double>,
    (void*)&cast<float, __half>, (void*)&cast<float, __nv_bfloat16>, (void*)&cast<__half, float>,
    (void*)&cast<__nv_bfloat16, float>, (void*)&cast<__half, __nv_bfloat16>, (void*)&cast<__nv_bfloat16, __half>,
    (void*)&dropout_fwd<float>, (void*)&dropout_fwd<__half>, (void*)&dropout_fwd<__nv_bfloat16>,
    (void*)&dropout_fwd<double>,
};
#endif

// Llama's SwiGLU, silu(gate) * up with s = sigmoid(gate) = 1 / (1 + exp(-gate)) (exp of a large
// -gate is inf: s = 0, as NumPy gives). Same formulas and order as elementwise/cpu.py's swiglu_fwd
// and swiglu_bwd.
template <typename A> __device__ __forceinline__ A swiglu_sigmoid(A g) { return A(1) / (tg_exp(-g) + A(1)); }

// y = (s gate) up. gate, up, y: (n,).
template <typename T>
__global__ void swiglu_fwd(const T* gate, const T* up, T* y, long long n) {
    typedef acc_t<T> A;
    const long long i = global_index();
    if (i >= n) return;
    const A g = to_acc(gate[i]);
    y[i] = from_acc<T>(swiglu_sigmoid(g) * g * to_acc(up[i]));
}

// dup = (gate s) dy, dgate = ((1 - s) gate + 1) s up dy. gate, up, dy, dgate, dup: (n,).
template <typename T>
__global__ void swiglu_bwd(const T* gate, const T* up, const T* dy, T* dgate, T* dup, long long n) {
    typedef acc_t<T> A;
    const long long i = global_index();
    if (i >= n) return;
    const A g = to_acc(gate[i]), d = to_acc(dy[i]), s = swiglu_sigmoid(g);
    dup[i] = from_acc<T>(g * s * d);
    dgate[i] = from_acc<T>(((A(1) - s) * g + A(1)) * s * to_acc(up[i]) * d);
}

#ifdef TG_CHECK_INSTANTIATE
// SwiGLU's variants, listed as the ones above (backend/cuda/runtime.py reads every list after the first
// TG_CHECK_INSTANTIATE).
void* tg_instances_elementwise_swiglu[] = {
    (void*)&swiglu_fwd<float>, (void*)&swiglu_fwd<__half>, (void*)&swiglu_fwd<__nv_bfloat16>,
    (void*)&swiglu_fwd<double>,
    (void*)&swiglu_bwd<float>, (void*)&swiglu_bwd<__half>, (void*)&swiglu_bwd<__nv_bfloat16>,
    (void*)&swiglu_bwd<double>,
};
#endif
