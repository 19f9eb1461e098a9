// Flash attention (FlashAttention-2, Dao 2023): causal softmax(scale q k^T) v in tiles, the
// (Tq, Tk) scores of a head never stored. Mirrors cpu.flash_attention_fwd / _bwd: the same
// online softmax, the same causal rule (query i is at position Tk - Tq + i, so Tq < Tk serves a
// KV-cache decode step), keys past a query tile's last query skipped, everything in acc_t<T>.
//
// Layout: q, dq, out, dout (BH, Tq, D) and k, v, dk, dv (BHkv, Tk, D), contiguous (cuda.py
// makes them so); lse and Di (BH, Tq) in acc_t<T>. Grouped-query attention: with G = H / Hkv, query
// head bh = b H + h reads kv head bh / G = b Hkv + h / G (G = 1: one kv head per query head). One
// block of 256 threads per (tile, batch·head): grid (tiles, BH), for dk, dv (tiles, BHkv), each
// block summing over the G query heads of its kv head (no atomics). A tile is TILE<A> queries or
// keys: 64 in fp32 (contract.FLASH_BQ), 32 in fp64 so that the shared memory of the backward's six
// D-wide tiles fits (D = 64: 134 KB fp32, 117 KB fp64). Tiles live in dynamic shared memory in
// acc_t<T>, rows padded to D + 1 so that threads walking a column of a tile hit different banks.
// Straightforward loops, no tensor cores: each thread computes every 256th element of a tile
// product.
//
// The backward is two kernels plus a row-dot, deterministic: flash_attention_bwd_dkdv (one block
// per key tile of a kv head) sums dk, dv over its query heads and their query tiles in order,
// flash_attention_bwd_dq (one block per query tile) sums dq over the key tiles in order.
// FlashAttention-2 instead adds dq from the key-tile blocks with fp32 atomics, which saves
// recomputing q k^T and dout v^T (7 tile GEMMs here instead of 5) but makes dq's rounding depend on
// the order the blocks run in.
#include "common.cuh"

template <typename A> __host__ __device__ constexpr int tile() { return sizeof(A) == 8 ? 32 : 64; }

// Copy rows [row0, row0 + n) of a (rows, D) matrix into s[TILE][D + 1] in acc_t, times mul.
template <typename T>
__device__ void load_rows(acc_t<T>* s, const T* g, int row0, int n, int D, acc_t<T> mul) {
    for (int e = threadIdx.x; e < n * D; e += blockDim.x)
        s[(e / D) * (D + 1) + e % D] = to_acc(g[(long long)(row0 + e / D) * D + e % D]) * mul;
}

// The score tile of `nq` queries (the first at position qpos) against `nk` keys (the first is
// key j0): s[r][c] = sum_d q[r][d] k[c][d] with q already scaled, -inf where key j0 + c is
// after query r (or c >= nk); rows past nq get 0 (never read back, kept finite).
template <typename A>
__device__ void score_tile(A* s, const A* q, const A* k, int nq, int nk, int qpos, int j0, int D) {
    constexpr int TILE = tile<A>();
    for (int e = threadIdx.x; e < TILE * TILE; e += blockDim.x) {
        const int r = e / TILE, c = e % TILE;
        A dot = 0;
        if (r < nq && c < nk && j0 + c <= qpos + r)
            for (int d = 0; d < D; ++d) dot += q[r * (D + 1) + d] * k[c * (D + 1) + d];
        else if (r < nq)
            dot = neg_inf<A>();
        s[r * (TILE + 1) + c] = dot;
    }
}

// Forward, as cpu.flash_attention_fwd. Block (query tile, bh), against kv head bh / G (the CPU
// runs a kv head's G query heads in one GEMM; the same sums): q tile scaled into shared
// memory; per key tile up to the tile's last query: s = q k^T (masked), then one warp per row
// updates the running max m and sum lsum and turns s into p = exp(s - m_new), then
// o = o * exp(m_old - m_new) + p v. At the end out = o / lsum, lse = m + log(lsum).
// Shared: q, kv (k, then v, of one key tile), o: TILE x (D + 1); s: TILE x (TILE + 1);
// m, lsum, alpha: TILE.
template <typename T>
__global__ void flash_attention_fwd(const T* q, const T* k, const T* v, T* out, acc_t<T>* lse,
                                    int Tq, int Tk, int D, int G, acc_t<T> scale) {
    typedef acc_t<T> A;
    constexpr int TILE = tile<A>();
    extern __shared__ __align__(16) unsigned char smem[];
    A* qs = reinterpret_cast<A*>(smem);
    A* kv = qs + TILE * (D + 1);
    A* o = kv + TILE * (D + 1);
    A* s = o + TILE * (D + 1);
    A* m = s + TILE * (TILE + 1);
    A* lsum = m + TILE;
    A* alpha = lsum + TILE;
    const long long bh = blockIdx.y, kvh = bh / G;  // query head, its kv head
    const int i0 = blockIdx.x * TILE, nq = min(TILE, Tq - i0), qpos = Tk - Tq + i0;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    k += kvh * Tk * D;
    v += kvh * Tk * D;
    load_rows(qs, q + bh * Tq * D, i0, nq, D, scale);
    for (int e = threadIdx.x; e < TILE * (D + 1); e += blockDim.x) o[e] = 0;
    for (int r = threadIdx.x; r < TILE; r += blockDim.x) {
        m[r] = neg_inf<A>();
        lsum[r] = 0;
    }
    const int keys = qpos + nq;  // keys 0 .. qpos + nq - 1: up to the tile's last query
    for (int j0 = 0; j0 < keys; j0 += TILE) {
        const int nk = min(TILE, keys - j0);
        __syncthreads();  // the previous tile's kv and s are no longer read
        load_rows(kv, k, j0, nk, D, A(1));
        __syncthreads();
        score_tile(s, qs, kv, nq, nk, qpos, j0, D);
        __syncthreads();
        load_rows(kv, v, j0, nk, D, A(1));  // k is done; v goes where it was
        for (int r = warp; r < nq; r += nwarps) {  // key 0 is in the first tile: m finite
            A* row = s + r * (TILE + 1);
            A mx = neg_inf<A>();
            for (int c = lane; c < nk; c += 32) mx = tg_max(mx, row[c]);
            const A m_new = tg_max(m[r], warp_max(mx));
            A sum = 0;
            for (int c = lane; c < nk; c += 32) {
                row[c] = tg_exp(row[c] - m_new);
                sum += row[c];
            }
            sum = warp_sum(sum);
            if (lane == 0) {
                alpha[r] = tg_exp(m[r] - m_new);
                lsum[r] = lsum[r] * alpha[r] + sum;
                m[r] = m_new;
            }
        }
        __syncthreads();
        for (int e = threadIdx.x; e < nq * D; e += blockDim.x) {
            const int r = e / D, d = e % D;
            A acc = o[r * (D + 1) + d] * alpha[r];
            for (int c = 0; c < nk; ++c) acc += s[r * (TILE + 1) + c] * kv[c * (D + 1) + d];
            o[r * (D + 1) + d] = acc;
        }
    }
    __syncthreads();
    out += (bh * Tq + i0) * D;
    for (int e = threadIdx.x; e < nq * D; e += blockDim.x)
        out[e] = from_acc<T>(o[(e / D) * (D + 1) + e % D] / lsum[e / D]);
    for (int r = threadIdx.x; r < nq; r += blockDim.x)
        lse[bh * Tq + i0 + r] = m[r] + tg_log(lsum[r]);
}

// Di = sum_d dout[row][d] * out[row][d] for each of the BH * Tq rows (the backward's
// rowsum(dout * out)). One warp per row, 8 rows per 256-thread block.
template <typename T>
__global__ void flash_attention_bwd_rowdot(const T* dout, const T* out, acc_t<T>* Di, int rows,
                                           int D) {
    typedef acc_t<T> A;
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;
    const long long off = (long long)row * D;
    A dot = 0;
    for (int d = lane; d < D; d += 32) dot += to_acc(dout[off + d]) * to_acc(out[off + d]);
    dot = warp_sum(dot);
    if (lane == 0) Di[row] = dot;
}

// The backward's recomputation, rows r < nq of a tile: p = exp(s - lse) in place (masked
// scores are -inf, so their p is 0), then ds = p * (dp - Di) beside it, with dp = dout v^T
// computed here (0 for keys c >= nk, whose p is 0).
template <typename A>
__device__ void probs_tile(A* s, const A* lse_rows, int nq) {
    constexpr int TILE = tile<A>();
    for (int e = threadIdx.x; e < nq * TILE; e += blockDim.x)
        s[(e / TILE) * (TILE + 1) + e % TILE] = tg_exp(s[(e / TILE) * (TILE + 1) + e % TILE]
                                                       - lse_rows[e / TILE]);
}

template <typename A>
__device__ void dscores_tile(A* ds, const A* p, const A* dout, const A* v, const A* Di_rows,
                             int nq, int nk, int D) {
    constexpr int TILE = tile<A>();
    for (int e = threadIdx.x; e < nq * TILE; e += blockDim.x) {
        const int r = e / TILE, c = e % TILE;
        A dp = 0;
        if (c < nk)
            for (int d = 0; d < D; ++d) dp += dout[r * (D + 1) + d] * v[c * (D + 1) + d];
        ds[r * (TILE + 1) + c] = p[r * (TILE + 1) + c] * (dp - Di_rows[r]);
    }
}

// dq, as cpu.flash_attention_bwd's dq, one block per (query tile, bh), against kv head bh / G:
// over the key tiles the tile sees, in order: p from s = q k^T and lse, ds = p (dout v^T - Di),
// dq += ds k; then dq *= scale. Shared: q (scaled), dout, dq, k, v: TILE x (D + 1); p, ds:
// TILE x (TILE + 1); lse, Di: TILE.
template <typename T>
__global__ void flash_attention_bwd_dq(const T* q, const T* k, const T* v, const T* dout,
                                       const acc_t<T>* lse, const acc_t<T>* Di, T* dq, int Tq,
                                       int Tk, int D, int G, acc_t<T> scale) {
    typedef acc_t<T> A;
    constexpr int TILE = tile<A>();
    extern __shared__ __align__(16) unsigned char smem[];
    A* qs = reinterpret_cast<A*>(smem);
    A* dos = qs + TILE * (D + 1);
    A* dqs = dos + TILE * (D + 1);
    A* ks = dqs + TILE * (D + 1);
    A* vs = ks + TILE * (D + 1);
    A* p = vs + TILE * (D + 1);
    A* ds = p + TILE * (TILE + 1);
    A* lse_rows = ds + TILE * (TILE + 1);
    A* Di_rows = lse_rows + TILE;
    const long long bh = blockIdx.y, kvh = bh / G;  // query head, its kv head
    const int i0 = blockIdx.x * TILE, nq = min(TILE, Tq - i0), qpos = Tk - Tq + i0;
    k += kvh * Tk * D;
    v += kvh * Tk * D;
    load_rows(qs, q + bh * Tq * D, i0, nq, D, scale);
    load_rows(dos, dout + bh * Tq * D, i0, nq, D, A(1));
    for (int e = threadIdx.x; e < TILE * (D + 1); e += blockDim.x) dqs[e] = 0;
    for (int r = threadIdx.x; r < nq; r += blockDim.x) {
        lse_rows[r] = lse[bh * Tq + i0 + r];
        Di_rows[r] = Di[bh * Tq + i0 + r];
    }
    const int keys = qpos + nq;
    for (int j0 = 0; j0 < keys; j0 += TILE) {
        const int nk = min(TILE, keys - j0);
        __syncthreads();
        load_rows(ks, k, j0, nk, D, A(1));
        load_rows(vs, v, j0, nk, D, A(1));
        __syncthreads();
        score_tile(p, qs, ks, nq, nk, qpos, j0, D);
        __syncthreads();
        probs_tile(p, lse_rows, nq);
        __syncthreads();
        dscores_tile(ds, p, dos, vs, Di_rows, nq, nk, D);
        __syncthreads();
        for (int e = threadIdx.x; e < nq * D; e += blockDim.x) {
            const int r = e / D, d = e % D;
            A acc = dqs[r * (D + 1) + d];
            for (int c = 0; c < nk; ++c) acc += ds[r * (TILE + 1) + c] * ks[c * (D + 1) + d];
            dqs[r * (D + 1) + d] = acc;
        }
    }
    __syncthreads();
    dq += (bh * Tq + i0) * D;
    for (int e = threadIdx.x; e < nq * D; e += blockDim.x)
        dq[e] = from_acc<T>(dqs[(e / D) * (D + 1) + e % D] * scale);
}

// dk, dv, as cpu.flash_attention_bwd's, one block per (key tile, kv head kvh): over the G query
// heads kvh G ... kvh G + G - 1 that read it, and for each over the query tiles that see the
// tile's first key, in order: p, ds as in _dq, dv += p^T dout, dk += ds^T q (q scaled, so dk
// carries the scale). Only each query tile's keys up to its last query are used, as in the
// forward. The CPU sums a key tile's G query heads inside one GEMM: the same terms. Shared: k,
// v, dk, dv, q, dout: TILE x (D + 1); p, ds: TILE x (TILE + 1); lse, Di: TILE.
template <typename T>
__global__ void flash_attention_bwd_dkdv(const T* q, const T* k, const T* v, const T* dout,
                                         const acc_t<T>* lse, const acc_t<T>* Di, T* dk, T* dv,
                                         int Tq, int Tk, int D, int G, acc_t<T> scale) {
    typedef acc_t<T> A;
    constexpr int TILE = tile<A>();
    extern __shared__ __align__(16) unsigned char smem[];
    A* ks = reinterpret_cast<A*>(smem);
    A* vs = ks + TILE * (D + 1);
    A* dks = vs + TILE * (D + 1);
    A* dvs = dks + TILE * (D + 1);
    A* qs = dvs + TILE * (D + 1);
    A* dos = qs + TILE * (D + 1);
    A* p = dos + TILE * (D + 1);
    A* ds = p + TILE * (TILE + 1);
    A* lse_rows = ds + TILE * (TILE + 1);
    A* Di_rows = lse_rows + TILE;
    const long long kvh = blockIdx.y;
    const int j0 = blockIdx.x * TILE, nk_tile = min(TILE, Tk - j0);
    load_rows(ks, k + kvh * Tk * D, j0, nk_tile, D, A(1));
    load_rows(vs, v + kvh * Tk * D, j0, nk_tile, D, A(1));
    for (int e = threadIdx.x; e < TILE * (D + 1); e += blockDim.x) dks[e] = dvs[e] = 0;
    const int first = max(0, j0 - (Tk - Tq)) / TILE * TILE;  // the first query tile that sees j0
    for (long long bh = kvh * G; bh < (kvh + 1) * G; ++bh) {  // the query heads that read kvh
        for (int i0 = first; i0 < Tq; i0 += TILE) {
            const int nq = min(TILE, Tq - i0), qpos = Tk - Tq + i0;
            const int nk = min(nk_tile, qpos + nq - j0);  // the keys this query tile sees
            __syncthreads();
            load_rows(qs, q + bh * Tq * D, i0, nq, D, scale);
            load_rows(dos, dout + bh * Tq * D, i0, nq, D, A(1));
            for (int r = threadIdx.x; r < nq; r += blockDim.x) {
                lse_rows[r] = lse[bh * Tq + i0 + r];
                Di_rows[r] = Di[bh * Tq + i0 + r];
            }
            __syncthreads();
            score_tile(p, qs, ks, nq, nk, qpos, j0, D);
            __syncthreads();
            probs_tile(p, lse_rows, nq);
            __syncthreads();
            dscores_tile(ds, p, dos, vs, Di_rows, nq, nk, D);
            __syncthreads();
            for (int e = threadIdx.x; e < nk * D; e += blockDim.x) {
                const int c = e / D, d = e % D;
                A dk_acc = dks[c * (D + 1) + d], dv_acc = dvs[c * (D + 1) + d];
                for (int r = 0; r < nq; ++r) {
                    dv_acc += p[r * (TILE + 1) + c] * dos[r * (D + 1) + d];
                    dk_acc += ds[r * (TILE + 1) + c] * qs[r * (D + 1) + d];
                }
                dks[c * (D + 1) + d] = dk_acc;
                dvs[c * (D + 1) + d] = dv_acc;
            }
        }
    }
    __syncthreads();
    const long long off = (kvh * Tk + j0) * D;
    for (int e = threadIdx.x; e < nk_tile * D; e += blockDim.x) {
        dk[off + e] = from_acc<T>(dks[(e / D) * (D + 1) + e % D]);
        dv[off + e] = from_acc<T>(dvs[(e / D) * (D + 1) + e % D]);
    }
}

#ifdef TG_CHECK_INSTANTIATE
// Every variant cuda.py launches (see elementwise.cu).
void* tg_instances_attention[] = {
    (void*)&flash_attention_fwd<float>, (void*)&flash_attention_fwd<__half>,
    (void*)&flash_attention_fwd<__nv_bfloat16>, (void*)&flash_attention_fwd<double>,
    (void*)&flash_attention_bwd_rowdot<float>, (void*)&flash_attention_bwd_rowdot<__half>,
    (void*)&flash_attention_bwd_rowdot<__nv_bfloat16>, (void*)&flash_attention_bwd_rowdot<double>,
    (void*)&flash_attention_bwd_dq<float>, (void*)&flash_attention_bwd_dq<__half>,
    (void*)&flash_attention_bwd_dq<__nv_bfloat16>, (void*)&flash_attention_bwd_dq<double>,
    (void*)&flash_attention_bwd_dkdv<float>, (void*)&flash_attention_bwd_dkdv<__half>,
    (void*)&flash_attention_bwd_dkdv<__nv_bfloat16>, (void*)&flash_attention_bwd_dkdv<double>,
};
#endif
