// LayerNorm and RMSNorm over the last axis: x is viewed as (rows, C). Statistics (mean, rstd)
// are kept in acc_t<T> (fp32, or fp64 for fp64 inputs), as rownorm/cpu.py returns them.
#include "common.cuh"

// Forward. Launch: one warp per row, 8 rows per 256-thread block. x, y: (rows, C); weight,
// bias: (C,); mean, rstd: (rows,). As rownorm/cpu.py: mean = sum(x)/C, var = sum((x-mean)^2)/C (two
// passes over the row), rstd = 1/sqrt(var + eps), y = (x - mean) * rstd * weight + bias.
template <typename T>
__global__ void layernorm_fwd(const T* x, const T* weight, const T* bias, T* y, acc_t<T>* mean,
                              acc_t<T>* rstd, int rows, int C, acc_t<T> eps) {
    typedef acc_t<T> A;
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;  // whole warps leave together; no block-level sync below
    const T* xr = x + (long long)row * C;
    T* yr = y + (long long)row * C;

    A sum = 0;
    for (int c = lane; c < C; c += 32) sum += to_acc(xr[c]);
    const A mu = warp_sum(sum) / A(C);
    A sq = 0;
    for (int c = lane; c < C; c += 32) {
        const A d = to_acc(xr[c]) - mu;
        sq += d * d;
    }
    const A rs = A(1) / tg_sqrt(warp_sum(sq) / A(C) + eps);
    for (int c = lane; c < C; c += 32)
        yr[c] = from_acc<T>((to_acc(xr[c]) - mu) * rs * to_acc(weight[c]) + to_acc(bias[c]));
    if (lane == 0) {
        mean[row] = mu;
        rstd[row] = rs;
    }
}

// a + b rounded on its own: for fp32 and fp64 nothing rounds v before the add, and the compiler
// would otherwise contract v's last product and the add into an FMA (other bits than the add
// launched after the unfused kernel).
__device__ __forceinline__ float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double add_rn(double a, double b) { return __dadd_rn(a, b); }

// dx's store with the epilogue: dx = v rounded to T, plus a (add's element) with the bits of
// elementwise's add(add, dx) launched after the backward: the rounded dx widened, added in
// acc_t to the widened a, rounded once more (for fp32 and fp64 just v + a).
template <typename T> __device__ __forceinline__ T plus(acc_t<T> v, T a) {
    return from_acc<T>(add_rn(to_acc(from_acc<T>(v)), to_acc(a)));
}

// Backward, dx part. Launch: one warp per row, 8 rows per 256-thread block. dy, x, dx, add:
// (rows, C); weight: (C,); mean, rstd: (rows,). With xhat = (x - mean) rstd and g = dy weight,
// as cpu.layernorm_bwd: dx = rstd (g - mean(g) - xhat mean(g xhat)) [+ add] (plus; add NULL:
// none).
template <typename T>
__global__ void layernorm_bwd_dx(const T* dy, const T* x, const T* weight, const acc_t<T>* mean,
                                 const acc_t<T>* rstd, const T* add, T* dx, int rows, int C) {
    typedef acc_t<T> A;
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;
    const long long off = (long long)row * C;
    const A mu = mean[row], rs = rstd[row];

    A sum_g = 0, sum_gx = 0;
    for (int c = lane; c < C; c += 32) {
        const A g = to_acc(dy[off + c]) * to_acc(weight[c]);
        sum_g += g;
        sum_gx += g * ((to_acc(x[off + c]) - mu) * rs);
    }
    const A mean_g = warp_sum(sum_g) / A(C), mean_gx = warp_sum(sum_gx) / A(C);
    for (int c = lane; c < C; c += 32) {
        const A g = to_acc(dy[off + c]) * to_acc(weight[c]);
        const A xhat = (to_acc(x[off + c]) - mu) * rs;
        const A v = (g - mean_g - xhat * mean_gx) * rs;
        dx[off + c] = add ? plus<T>(v, add[off + c]) : from_acc<T>(v);
    }
}

// Backward, dweight/dbias, first pass. Launch: one block per chunk of rows_per_block
// consecutive rows, 256 threads; thread t owns columns t, t + 256, ... and adds its chunk's rows
// in order. partial: (nblocks, 2, C) with [b][0] = sum(dy xhat), [b][1] = sum(dy). Every sum
// has a fixed order, so the result is deterministic (no atomics).
template <typename T>
__global__ void layernorm_bwd_partials(const T* dy, const T* x, const acc_t<T>* mean,
                                       const acc_t<T>* rstd, acc_t<T>* partial, int rows, int C,
                                       int rows_per_block) {
    typedef acc_t<T> A;
    const int r0 = blockIdx.x * rows_per_block;
    const int r1 = min(rows, r0 + rows_per_block);
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        A dw = 0, db = 0;
        for (int r = r0; r < r1; ++r) {
            const long long i = (long long)r * C + c;
            const A d = to_acc(dy[i]);
            dw += d * ((to_acc(x[i]) - mean[r]) * rstd[r]);
            db += d;
        }
        partial[(2LL * blockIdx.x) * C + c] = dw;
        partial[(2LL * blockIdx.x + 1) * C + c] = db;
    }
}

// Backward, dweight/dbias, second pass: one thread per column sums the nblocks partials in
// block order. Launch: ceil(C / 256) blocks of 256. dweight, dbias: (C,) in T.
template <typename T>
__global__ void layernorm_bwd_reduce(const acc_t<T>* partial, T* dweight, T* dbias, int nblocks,
                                     int C) {
    typedef acc_t<T> A;
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    A dw = 0, db = 0;
    for (int b = 0; b < nblocks; ++b) {
        dw += partial[(2LL * b) * C + c];
        db += partial[(2LL * b + 1) * C + c];
    }
    dweight[c] = from_acc<T>(dw);
    dbias[c] = from_acc<T>(db);
}

// RMSNorm forward. Launch: one warp per row, 8 rows per 256-thread block. x, y: (rows, C);
// weight: (C,); rstd: (rows,). As rownorm/cpu.py: rstd = 1/sqrt(sum(x^2)/C + eps),
// y = x * rstd * weight.
template <typename T>
__global__ void rmsnorm_fwd(const T* x, const T* weight, T* y, acc_t<T>* rstd, int rows, int C,
                            acc_t<T> eps) {
    typedef acc_t<T> A;
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;  // whole warps leave together; no block-level sync below
    const T* xr = x + (long long)row * C;
    T* yr = y + (long long)row * C;

    A sq = 0;
    for (int c = lane; c < C; c += 32) {
        const A v = to_acc(xr[c]);
        sq += v * v;
    }
    const A rs = A(1) / tg_sqrt(warp_sum(sq) / A(C) + eps);
    for (int c = lane; c < C; c += 32) yr[c] = from_acc<T>(to_acc(xr[c]) * rs * to_acc(weight[c]));
    if (lane == 0) rstd[row] = rs;
}

// RMSNorm backward, dx part. Launch: one warp per row, 8 rows per 256-thread block. dy, x, dx,
// add: (rows, C); weight: (C,); rstd: (rows,). With xhat = x rstd and g = dy weight, as
// rownorm/cpu.py: dx = rstd (g - xhat mean(g xhat)) [+ add] (plus; add NULL: none). dweight is
// layernorm_bwd_partials' with a zero mean (cuda.py).
template <typename T>
__global__ void rmsnorm_bwd_dx(const T* dy, const T* x, const T* weight, const acc_t<T>* rstd,
                               const T* add, T* dx, int rows, int C) {
    typedef acc_t<T> A;
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;
    const long long off = (long long)row * C;
    const A rs = rstd[row];

    A sum_gx = 0;
    for (int c = lane; c < C; c += 32)
        sum_gx += to_acc(dy[off + c]) * to_acc(weight[c]) * (to_acc(x[off + c]) * rs);
    const A mean_gx = warp_sum(sum_gx) / A(C);
    for (int c = lane; c < C; c += 32) {
        const A g = to_acc(dy[off + c]) * to_acc(weight[c]);
        const A v = (g - to_acc(x[off + c]) * rs * mean_gx) * rs;
        dx[off + c] = add ? plus<T>(v, add[off + c]) : from_acc<T>(v);
    }
}

#ifdef TG_CHECK_INSTANTIATE
// Every variant cuda.py launches (see elementwise.cu).
void* tg_instances_rownorm[] = {
    (void*)&layernorm_fwd<float>, (void*)&layernorm_fwd<__half>,
    (void*)&layernorm_fwd<__nv_bfloat16>, (void*)&layernorm_fwd<double>,
    (void*)&layernorm_bwd_dx<float>, (void*)&layernorm_bwd_dx<__half>,
    (void*)&layernorm_bwd_dx<__nv_bfloat16>, (void*)&layernorm_bwd_dx<double>,
    (void*)&layernorm_bwd_partials<float>, (void*)&layernorm_bwd_partials<__half>,
    (void*)&layernorm_bwd_partials<__nv_bfloat16>, (void*)&layernorm_bwd_partials<double>,
    (void*)&layernorm_bwd_reduce<float>, (void*)&layernorm_bwd_reduce<__half>,
    (void*)&layernorm_bwd_reduce<__nv_bfloat16>, (void*)&layernorm_bwd_reduce<double>,
    (void*)&rmsnorm_fwd<float>, (void*)&rmsnorm_fwd<__half>,
    (void*)&rmsnorm_fwd<__nv_bfloat16>, (void*)&rmsnorm_fwd<double>,
    (void*)&rmsnorm_bwd_dx<float>, (void*)&rmsnorm_bwd_dx<__half>,
    (void*)&rmsnorm_bwd_dx<__nv_bfloat16>, (void*)&rmsnorm_bwd_dx<double>,
};
#endif
