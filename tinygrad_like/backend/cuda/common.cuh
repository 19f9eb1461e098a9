// Pieces every kernel file shares: number conversions, math overloads, warp and block sums.
//
// runtime.py pastes this file in place of the `#include "common.cuh"` line before handing the
// source to NVRTC, so CuPy's compile cache sees (and keys on) the whole text; nvcc finds it
// with -I (scripts/check_kernels.sh). Each .cu includes it once.
#include <cuda_fp16.h>
#include <cuda_bf16.h>

// Num<T>: the compute type of a storage type and the two conversions. As in the CPU backend (and
// dtypes.compute_dtype): fp16/bf16/fp32 compute in fp32, fp64 in fp64; a 2-byte result is
// rounded once (round to nearest even) when stored.
template <typename T> struct Num;
template <> struct Num<float> {
    typedef float acc;
    static __device__ __forceinline__ float load(float x) { return x; }
    static __device__ __forceinline__ float store(float x) { return x; }
};
template <> struct Num<__half> {
    typedef float acc;
    static __device__ __forceinline__ float load(__half x) { return __half2float(x); }
    static __device__ __forceinline__ __half store(float x) { return __float2half_rn(x); }
};
template <> struct Num<__nv_bfloat16> {
    typedef float acc;
    static __device__ __forceinline__ float load(__nv_bfloat16 x) { return __bfloat162float(x); }
    static __device__ __forceinline__ __nv_bfloat16 store(float x) { return __float2bfloat16_rn(x); }
};
template <> struct Num<double> {
    typedef double acc;
    static __device__ __forceinline__ double load(double x) { return x; }
    static __device__ __forceinline__ double store(double x) { return x; }
};

template <typename T> using acc_t = typename Num<T>::acc;

template <typename T> __device__ __forceinline__ acc_t<T> to_acc(T x) { return Num<T>::load(x); }
template <typename T> __device__ __forceinline__ T from_acc(acc_t<T> x) { return Num<T>::store(x); }

// Math in the compute type (float or double), so templated kernels call one name.
__device__ __forceinline__ float tg_exp(float x) { return expf(x); }
__device__ __forceinline__ double tg_exp(double x) { return exp(x); }
__device__ __forceinline__ float tg_log(float x) { return logf(x); }
__device__ __forceinline__ double tg_log(double x) { return log(x); }
__device__ __forceinline__ float tg_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double tg_tanh(double x) { return tanh(x); }
__device__ __forceinline__ float tg_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double tg_sqrt(double x) { return sqrt(x); }

template <typename A> __device__ __forceinline__ A neg_inf();
template <> __device__ __forceinline__ float neg_inf<float>() { return -__int_as_float(0x7f800000); }
template <> __device__ __forceinline__ double neg_inf<double>() {
    return -__longlong_as_double(0x7ff0000000000000LL);
}

// Sum over the 32 lanes of a warp; every lane gets the same (bit-identical) result.
template <typename A> __device__ __forceinline__ A warp_sum(A v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

// The larger of two (b when either is NaN), and the max over the 32 lanes of a warp (every lane
// gets the same).
template <typename A> __device__ __forceinline__ A tg_max(A a, A b) { return a > b ? a : b; }

template <typename A> __device__ __forceinline__ A warp_max(A v) {
    for (int offset = 16; offset > 0; offset >>= 1)
        v = tg_max(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}

// Sum over a whole block (blockDim.x a multiple of 32, at most 1024); every thread gets the
// result. The order is fixed by the launch shape, so results are deterministic.
template <typename A> __device__ A block_sum(A v) {
    __shared__ A partial[32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    v = warp_sum(v);
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    v = warp_sum(lane < nwarps ? partial[lane] : A(0));
    __syncthreads();  // partial may be reused by a second call
    return v;
}

// One thread per element for the flat kernels: the global index (64-bit: buffers can pass 2^31).
__device__ __forceinline__ long long global_index() {
    return (long long)blockIdx.x * blockDim.x + threadIdx.x;
}
