// Rotary position embeddings, Hugging Face Llama's rotate-half convention: one thread per pair
// (i, i + D/2) of a head's channels at one position, launched flat over the B·H·T·D/2 pairs of
// a contiguous x (B, H, T, D). Each thread reads its two values and the pair's cos, sin at the
// position, computes in acc_t<T> and rounds once: the arithmetic of rotary/cpu.py's _turn.
#include "common.cuh"

// y1 = x1 cos - SIGN x2 sin, y2 = x2 cos + SIGN x1 sin: SIGN 1 is the forward, -1 the backward
// (the opposite turn). x, y: (rows, D) with rows = B·H·T, row r at position r % T;
// cos, sin: (T, D/2) in the compute type. n = rows · D/2 pairs.
template <typename T, int SIGN>
__global__ void rotary(const T* x, const acc_t<T>* cos, const acc_t<T>* sin, T* y, long long n,
                       int T_len, int half) {
    typedef acc_t<T> A;
    const long long i = global_index();
    if (i >= n) return;
    const long long row = i / half;
    const int j = int(i % half);
    const long long at = (row % T_len) * half + j;  // the pair's entry of the tables
    const A c = cos[at], s = A(SIGN) * sin[at];
    const T* xr = x + row * 2 * half;
    const A x1 = to_acc(xr[j]), x2 = to_acc(xr[j + half]);
    y[row * 2 * half + j] = from_acc<T>(x1 * c - x2 * s);
    y[row * 2 * half + j + half] = from_acc<T>(x2 * c + x1 * s);
}

#ifdef TG_CHECK_INSTANTIATE
// Every variant cuda.py launches. backend/cuda/runtime.py reads this list for NVRTC's name_expressions;
// scripts/check_kernels.sh defines TG_CHECK_INSTANTIATE so nvcc compiles each of them.
void* tg_instances_rotary[] = {
    (void*)&rotary<float, 1>, (void*)&rotary<__half, 1>, (void*)&rotary<__nv_bfloat16, 1>,
    (void*)&rotary<double, 1>,
    (void*)&rotary<float, -1>, (void*)&rotary<__half, -1>, (void*)&rotary<__nv_bfloat16, -1>,
    (void*)&rotary<double, -1>,
};
#endif
