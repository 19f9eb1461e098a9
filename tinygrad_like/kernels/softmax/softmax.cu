// Softmax rows: attention's causal softmax (forward and backward) and the cross-entropy loss
// with its softmax over the vocabulary (forward, backward, and both in one launch). Everything
// is computed in acc_t<T>.
#include "common.cuh"

// Online softmax state over a set of values: m = their max, s = sum(exp(value - m)).
// Adding one value costs one exp; -inf values add nothing (and never make a NaN).
template <typename A> __device__ __forceinline__ void online_add(A& m, A& s, A x) {
    if (x > m) {
        s = s * tg_exp(m - x) + A(1);
        m = x;
    } else {
        s += x == neg_inf<A>() ? A(0) : tg_exp(x - m);
    }
}

// Merge another state (m2, s2) into (m, s). Symmetric, so lanes merging in either order get
// bit-identical results.
template <typename A> __device__ __forceinline__ void online_merge(A& m, A& s, A m2, A s2) {
    const A mx = m > m2 ? m : m2;
    const A a = m == neg_inf<A>() ? A(0) : s * tg_exp(m - mx);
    const A b = m2 == neg_inf<A>() ? A(0) : s2 * tg_exp(m2 - mx);
    s = a + b;
    m = mx;
}

template <typename A> __device__ __forceinline__ void warp_merge(A& m, A& s) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        const A m2 = __shfl_xor_sync(0xffffffffu, m, offset);
        const A s2 = __shfl_xor_sync(0xffffffffu, s, offset);
        online_merge(m, s, m2, s2);
    }
}

// Causal softmax forward. scores, probs: (rows, Tk) with rows = batch * Tq; row r is query
// q = r % Tq at position Tk - Tq + q, which sees keys 0 .. Tk - Tq + q (the KV-cache rule of
// softmax/cpu.py's future_mask); later keys get probability 0. Launch: one warp per row, 8 rows per
// 256-thread block. As cpu.softmax_causal_fwd: p = exp(scale s - max) / sum(exp(scale s - max)).
template <typename T>
__global__ void softmax_causal_fwd(const T* scores, T* probs, int rows, int Tq, int Tk, acc_t<T> scale) {
    typedef acc_t<T> A;
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;
    const int last = Tk - Tq + row % Tq;  // the last key this query may see
    const T* s = scores + (long long)row * Tk;
    T* p = probs + (long long)row * Tk;

    A m = neg_inf<A>(), sum = 0;
    for (int k = lane; k <= last && k < Tk; k += 32) online_add(m, sum, to_acc(s[k]) * scale);
    warp_merge(m, sum);
    for (int k = lane; k < Tk; k += 32)
        p[k] = from_acc<T>(k <= last ? tg_exp(to_acc(s[k]) * scale - m) / sum : A(0));
}

// Causal softmax backward: dscores = scale * p * (dp - sum_k(dp p)), as cpu.softmax_causal_bwd
// (masked keys have p = 0, so they get 0). probs, dprobs, dscores: (rows, Tk). Launch: one
// warp per row, 8 rows per 256-thread block.
template <typename T>
__global__ void softmax_causal_bwd(const T* probs, const T* dprobs, T* dscores, int rows, int Tk,
                                   acc_t<T> scale) {
    typedef acc_t<T> A;
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;
    const long long off = (long long)row * Tk;
    A dot = 0;
    for (int k = lane; k < Tk; k += 32) dot += to_acc(dprobs[off + k]) * to_acc(probs[off + k]);
    dot = warp_sum(dot);
    for (int k = lane; k < Tk; k += 32)
        dscores[off + k] = from_acc<T>((to_acc(dprobs[off + k]) - dot) * to_acc(probs[off + k]) * scale);
}

// The max m and s = sum(exp(x - m)) of one row's V classes x[0..V), for a block of threads:
// each thread reads its columns once with an online max/sum, the states are merged by warp
// shuffles, then across the warps through shared memory. The result is valid in thread 0.
template <typename T>
__device__ void block_row_max_sum(const T* x, int V, acc_t<T>& m, acc_t<T>& s) {
    typedef acc_t<T> A;
    __shared__ A warp_m[32], warp_s[32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    m = neg_inf<A>();
    s = 0;
    for (int v = threadIdx.x; v < V; v += blockDim.x) online_add(m, s, to_acc(x[v]));
    warp_merge(m, s);
    if (lane == 0) {
        warp_m[warp] = m;
        warp_s[warp] = s;
    }
    __syncthreads();
    if (warp == 0) {
        m = lane < nwarps ? warp_m[lane] : neg_inf<A>();
        s = lane < nwarps ? warp_s[lane] : A(0);
        warp_merge(m, s);
    }
}

// Cross-entropy forward over the vocabulary. logits: (N, Vp) rows, of which the first V columns
// are the classes (Vp > V: the LM head's padded vocabulary, whose padding columns are not read);
// targets: (N,) int64 in [0, V) (checked on the host by cuda.py) or -1 = ignored; losses, lse:
// (N,) acc_t<T>. Launch: one block per row, 512 threads. Reads the row's V classes once
// (block_row_max_sum) and writes lse = log(s) + m and loss = lse - logit[target] (0 if
// ignored), as cpu.cross_entropy_fwd.
template <typename T>
__global__ void cross_entropy_fwd(const T* logits, const long long* targets, acc_t<T>* losses,
                                  acc_t<T>* lse, int V, int Vp) {
    typedef acc_t<T> A;
    const T* x = logits + (long long)blockIdx.x * Vp;
    A m, s;
    block_row_max_sum(x, V, m, s);
    if (threadIdx.x == 0) {
        const long long target = targets[blockIdx.x];
        const A row_lse = tg_log(s) + m;
        lse[blockIdx.x] = row_lse;
        losses[blockIdx.x] = target >= 0 ? row_lse - to_acc(x[target]) : A(0);
    }
}

// Cross-entropy backward: dlogits = dloss * (exp(logit - lse) - onehot(target)) in the first V
// columns of each (Vp-long) row and exactly 0 in the padding columns past V, zero rows for
// ignored targets, as cpu.cross_entropy_bwd. dloss: a 1-element device array (the upstream
// gradient, loss scale included, over the number of targets), read on the device so the host
// never waits. Launch: one block per row, 512 threads, one read of the V classes and one write
// of the Vp-long row.
template <typename T>
__global__ void cross_entropy_bwd(const T* logits, const acc_t<T>* lse, const long long* targets,
                                  const acc_t<T>* dloss, T* dlogits, int V, int Vp) {
    typedef acc_t<T> A;
    const long long off = (long long)blockIdx.x * Vp;
    const long long target = targets[blockIdx.x];
    const A d = target >= 0 ? dloss[0] : A(0), row_lse = lse[blockIdx.x];
    for (int v = threadIdx.x; v < Vp; v += blockDim.x)
        dlogits[off + v] = v < V ? from_acc<T>(tg_exp(to_acc(logits[off + v]) - row_lse) * d
                                               - (v == target ? d : A(0)))
                                 : from_acc<T>(A(0));
}

// Cross-entropy forward and backward in one launch, for a caller that knows dloss in the forward
// (the fused LM head's precompute design), as cpu.cross_entropy_fwd_bwd: losses (N,) acc_t<T>
// (0 if ignored) and dlogits = exp(logit - max) * dloss / s - onehot(target) * dloss in the first
// V columns, exactly 0 in the padding columns past V, zero rows for ignored targets, where
// s = sum(exp(logit - max)). dlogits may be logits itself (the fused head writes in place): a
// thread writes only the columns it read, after the block's reduction, and logit[target] is read
// before it. Launch: one block per row, 512 threads.
// Mirrors the CPU kernel's formula, not its passes: the CPU keeps its one exp per logit (its
// bound) in the row's output and scales it there; here the max and s come from the online pass
// cross_entropy_fwd uses too (block_row_max_sum) and the write pass takes the exp again, which
// costs the same bytes as reading a stored exp back (the row, 200 KB at GPT-2's vocabulary, is
// still in L2) and needs no fp32 row buffer, which a half-precision dlogits could not be.
template <typename T>
__global__ void cross_entropy_fwd_bwd(const T* logits, const long long* targets,
                                      const acc_t<T>* dloss, acc_t<T>* losses, T* dlogits, int V,
                                      int Vp) {
    typedef acc_t<T> A;
    __shared__ A row_max, row_scale;
    const long long off = (long long)blockIdx.x * Vp;
    const long long target = targets[blockIdx.x];
    const A d = target >= 0 ? dloss[0] : A(0);
    A m, s;
    block_row_max_sum(logits + off, V, m, s);
    if (threadIdx.x == 0) {
        losses[blockIdx.x] = target >= 0 ? tg_log(s) + m - to_acc(logits[off + target]) : A(0);
        row_max = m;
        row_scale = d / s;
    }
    __syncthreads();
    for (int v = threadIdx.x; v < Vp; v += blockDim.x)
        dlogits[off + v] = v < V ? from_acc<T>(tg_exp(to_acc(logits[off + v]) - row_max) * row_scale
                                               - (v == target ? d : A(0)))
                                 : from_acc<T>(A(0));
}

// ---------------------------------------------------------------- softmax over any dim
// Rows of x (rows, C) (ops moves the dim last). Launch: one warp per row, 8 rows per 256-thread
// block, as softmax_causal_fwd. The row's max m and s = sum(exp(x - m)) come from the online
// pass (online_add, warp_merge); softmax/cpu.py subtracts the final max first, the same values
// to rounding.

// One row per warp, forward: y = exp(x - m) / s (softmax, as cpu.softmax_fwd) or
// y = x - m - log(s) (LOG: log_softmax, as cpu.log_softmax_fwd). x, y: (rows, C).
template <typename T, bool LOG>
__device__ void softmax_row_fwd(const T* x, T* y, int rows, int C) {
    typedef acc_t<T> A;
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;
    const long long off = (long long)row * C;
    A m = neg_inf<A>(), s = 0;
    for (int c = lane; c < C; c += 32) online_add(m, s, to_acc(x[off + c]));
    warp_merge(m, s);
    const A lse = m + tg_log(s);
    for (int c = lane; c < C; c += 32) {
        const A v = to_acc(x[off + c]);
        y[off + c] = from_acc<T>(LOG ? v - lse : tg_exp(v - m) / s);
    }
}

// Backward, y the forward's output: dx = (dy - sum(dy y)) y (softmax) or
// dx = dy - exp(y) sum(dy) (LOG). y, dy, dx: (rows, C).
template <typename T, bool LOG>
__device__ void softmax_row_bwd(const T* y, const T* dy, T* dx, int rows, int C) {
    typedef acc_t<T> A;
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;
    const long long off = (long long)row * C;
    A total = 0;  // sum(dy y), or sum(dy)
    for (int c = lane; c < C; c += 32)
        total += to_acc(dy[off + c]) * (LOG ? A(1) : to_acc(y[off + c]));
    total = warp_sum(total);
    for (int c = lane; c < C; c += 32) {
        const A g = to_acc(dy[off + c]), v = to_acc(y[off + c]);
        dx[off + c] = from_acc<T>(LOG ? g - tg_exp(v) * total : (g - total) * v);
    }
}

template <typename T>
__global__ void softmax_fwd(const T* x, T* y, int rows, int C) {
    softmax_row_fwd<T, false>(x, y, rows, C);
}

template <typename T>
__global__ void log_softmax_fwd(const T* x, T* y, int rows, int C) {
    softmax_row_fwd<T, true>(x, y, rows, C);
}

template <typename T>
__global__ void softmax_bwd(const T* y, const T* dy, T* dx, int rows, int C) {
    softmax_row_bwd<T, false>(y, dy, dx, rows, C);
}

template <typename T>
__global__ void log_softmax_bwd(const T* y, const T* dy, T* dx, int rows, int C) {
    softmax_row_bwd<T, true>(y, dy, dx, rows, C);
}

#ifdef TG_CHECK_INSTANTIATE
// Every variant cuda.py launches (see elementwise.cu).
void* tg_instances_softmax[] = {
    (void*)&softmax_causal_fwd<float>, (void*)&softmax_causal_fwd<__half>,
    (void*)&softmax_causal_fwd<__nv_bfloat16>, (void*)&softmax_causal_fwd<double>,
    (void*)&softmax_causal_bwd<float>, (void*)&softmax_causal_bwd<__half>,
    (void*)&softmax_causal_bwd<__nv_bfloat16>, (void*)&softmax_causal_bwd<double>,
    (void*)&cross_entropy_fwd<float>, (void*)&cross_entropy_fwd<__half>,
    (void*)&cross_entropy_fwd<__nv_bfloat16>, (void*)&cross_entropy_fwd<double>,
    (void*)&cross_entropy_bwd<float>, (void*)&cross_entropy_bwd<__half>,
    (void*)&cross_entropy_bwd<__nv_bfloat16>, (void*)&cross_entropy_bwd<double>,
    (void*)&cross_entropy_fwd_bwd<float>, (void*)&cross_entropy_fwd_bwd<__half>,
    (void*)&cross_entropy_fwd_bwd<__nv_bfloat16>, (void*)&cross_entropy_fwd_bwd<double>,
    (void*)&softmax_fwd<float>, (void*)&softmax_fwd<__half>,
    (void*)&softmax_fwd<__nv_bfloat16>, (void*)&softmax_fwd<double>,
    (void*)&softmax_bwd<float>, (void*)&softmax_bwd<__half>,
    (void*)&softmax_bwd<__nv_bfloat16>, (void*)&softmax_bwd<double>,
    (void*)&log_softmax_fwd<float>, (void*)&log_softmax_fwd<__half>,
    (void*)&log_softmax_fwd<__nv_bfloat16>, (void*)&log_softmax_fwd<double>,
    (void*)&log_softmax_bwd<float>, (void*)&log_softmax_bwd<__half>,
    (void*)&log_softmax_bwd<__nv_bfloat16>, (void*)&log_softmax_bwd<double>,
};
#endif
