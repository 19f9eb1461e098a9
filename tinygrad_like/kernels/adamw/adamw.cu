// The optimizer step: the gradient's sum of squares (for clipping and the overflow check) and
// the fused AdamW update, both over flat buffers and both free of host synchronization: the
// skip on inf/nan and the clipping coefficient are decided on the device from norm_sq.
#include "common.cuh"

// out[b] = sum over the elements of x that block b visits (grid-stride: i = b*256 + t, then
// += gridDim*256) of x^2 (SQUARE) or x, in acc_t<T>. Launch: G blocks of 256 threads.
// grad_norm_sq runs it twice: G = min(1024, ceil(n / 256)) blocks over the gradient with
// SQUARE, then one block over the G partials. The order depends only on n, so the result is
// deterministic; an inf or nan anywhere makes it non-finite (squares are >= 0, so no inf - inf).
template <typename T, bool SQUARE>
__global__ void sum_partials(const T* x, acc_t<T>* out, long long n) {
    typedef acc_t<T> A;
    A sum = 0;
    for (long long i = global_index(); i < n; i += (long long)gridDim.x * blockDim.x) {
        const A v = to_acc(x[i]);
        sum += SQUARE ? v * v : v;
    }
    sum = block_sum(sum);
    if (threadIdx.x == 0) out[blockIdx.x] = sum;
}

// One AdamW step, in place, one thread per element. master, m, v: (n,) in P (fp32 from optim/;
// fp64 in the gradient checks); grad: (n,) in G, still multiplied by the loss scale; working:
// (n,) G copy of the weights refreshed from master, or null; norm_sq: (1,) acc_t<G>, the sum of
// squares of the scaled grad exactly as grad_norm_sq returned it.
// As cpu.adamw_step: if norm_sq is inf/nan every thread returns (the step is skipped; nothing
// is written). Else g = grad * coef with coef = inv_scale * min(1, max_norm / (norm + 1e-6))
// (norm = sqrt(norm_sq) inv_scale; no clip when max_norm == 0), computed in double with the
// operations of adamw/cpu.py's Python floats and rounded once to P, as its acc(g_coef);
// m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; the first n_decay weights are multiplied by
// decay = 1 - lr wd; then w -= lr_bc1 * m / (sqrt(v) inv_sqrt_bc2 + eps). The scalars come from
// c, spec.constants' fp64 vector on the device (written by the host before the step: a CUDA
// graph of the step reads each step's), each P scalar rounded once from it to P, as adamw/cpu.py
// rounds the same fp64 values; inv_scale and max_norm stay double. c's layout is spec.py's:
// lr, beta1, beta2, eps, weight_decay, n_decay, step, inv_scale, max_norm, then decay, lr_bc1,
// inv_sqrt_bc2, 1 - beta1, 1 - beta2.
template <typename P, typename G>
__global__ void adamw_step(P* master, const G* grad, P* m, P* v, G* working,
                           const acc_t<G>* norm_sq, long long n, const double* c) {
    const long long i = global_index();
    if (i >= n) return;
    const double scaled_norm_sq = norm_sq[0];  // exact, as adamw/cpu.py's float(norm_sq[0])
    if (!isfinite(scaled_norm_sq)) return;
    const double inv_scale = c[7], max_norm = c[8];
    const long long n_decay = (long long)c[5];
    const P beta1 = P(c[1]), beta2 = P(c[2]), eps = P(c[3]), decay = P(c[9]), lr_bc1 = P(c[10]);
    const P inv_sqrt_bc2 = P(c[11]), one_minus_beta1 = P(c[12]), one_minus_beta2 = P(c[13]);
    double coef = inv_scale;
    if (max_norm > 0) {  // _rn: no FMA contraction, so coef is bit-identical to adamw/cpu.py's
        const double norm = __dmul_rn(sqrt(scaled_norm_sq), inv_scale);
        coef *= fmin(1.0, max_norm / __dadd_rn(norm, 1e-6));
    }

    const P g = P(to_acc(grad[i])) * P(coef);
    const P mi = m[i] * beta1 + one_minus_beta1 * g;
    const P vi = v[i] * beta2 + one_minus_beta2 * (g * g);
    P w = master[i];
    if (i < n_decay) w *= decay;
    w -= mi / (tg_sqrt(vi) * inv_sqrt_bc2 + eps) * lr_bc1;
    m[i] = mi;
    v[i] = vi;
    master[i] = w;
    if (working) working[i] = from_acc<G>(acc_t<G>(w));
}

#ifdef TG_CHECK_INSTANTIATE
// Every variant cuda.py launches (see elementwise.cu).
void* tg_instances_adamw[] = {
    (void*)&sum_partials<float, true>, (void*)&sum_partials<__half, true>,
    (void*)&sum_partials<__nv_bfloat16, true>, (void*)&sum_partials<double, true>,
    (void*)&sum_partials<float, false>, (void*)&sum_partials<double, false>,
    (void*)&adamw_step<float, float>, (void*)&adamw_step<float, __half>,
    (void*)&adamw_step<float, __nv_bfloat16>, (void*)&adamw_step<float, double>,
    (void*)&adamw_step<double, double>,
};
#endif
