// A KV cache's attention and an fp8 cache (spec.py): kv_quantize turns the rows appended into
// codes and a scale per row; qattention attends over an fp8 cache, decoding each code as it
// reads it (never a dequantized copy), and kv_attention over a cache in q's dtype, both reading
// the cache's length from the positions on the device. Mirrors kvcache/cpu.py.
//
// Layout: codes (B, Hkv, L, D) unsigned char, scales (B, Hkv, L) fp32, contiguous; an element is
// its code's value times its row's scale. The formats are 8-bit floats of EXP_BITS exponent and
// MAN_BITS mantissa bits (formats.FORMATS' fields: fp8_e4m3 4, 3; fp8_e5m2 5, 2).
#include "common.cuh"

// The byte of the small float (1 sign, EXP_BITS, MAN_BITS, bias 2^(EXP_BITS - 1) - 1) nearest to
// x, ties to even, its magnitude first clipped to the fp32 bits qmax_bits of the format's largest
// value (a magnitude's bits order as its value does); a NaN gives nan_code (the format's NaN
// without its sign, as ml_dtypes casts one) with its sign. kvcache/cpu.py's minifloat_code, bit
// for bit: a normal of the format rounds away fp32's low 23 - MAN_BITS mantissa bits (a carry
// moves into the exponent) and is rebiased; a subnormal (or zero) is the significand, implicit 1
// included, shifted to units of the smallest subnormal 2^(1 - bias - MAN_BITS), rounded alike.
template <int EXP_BITS, int MAN_BITS>
__device__ __forceinline__ unsigned char minifloat_code(float x, int qmax_bits, int nan_code) {
    constexpr int bias = (1 << (EXP_BITS - 1)) - 1, width = EXP_BITS + MAN_BITS;
    constexpr int low = 23 - MAN_BITS;  // the fp32 mantissa bits rounded away
    const int bits = __float_as_int(x), sign = (bits >> 31) & 1;
    const bool nan = (bits & 0x7fffffff) > 0x7f800000;
    const int magnitude = min(bits & 0x7fffffff, qmax_bits), e = magnitude >> 23;
    int code;
    if (e >= 128 - bias) {
        code = ((magnitude + (1 << (low - 1)) - 1 + ((magnitude >> low) & 1)) >> low) -
               ((127 - bias) << MAN_BITS);
    } else {
        const int significand = (magnitude & 0x7fffff) | (e > 0 ? 0x800000 : 0);
        const int shift = min(151 - bias - MAN_BITS - max(e, 1), 25);  // 25 and past: 0
        code = (significand + (1 << (shift - 1)) - 1 + ((significand >> shift) & 1)) >> shift;
    }
    return (unsigned char)((sign << width) | (nan ? nan_code : code));
}

// codes[r, :] and scales[r] of row r of x (rows, D), T read as fp32 (fp64 rounded to it, as the
// CPU twin's cast): scale = max |x| / qmax (1 unless the max is > 0), codes of x / scale. The
// max is over the magnitudes' bits (exact, a NaN the largest), as the CPU's. Launch: one warp per
// row (8 per 256-thread block), its lanes striding over the row. As kvcache/cpu.py's
// kv_quantize, bit for bit (one fp32 divide per element and integer rounding), but for a row of
// fp32 subnormals only (|x| < 2^-126), which the GPU's flush to zero makes all zeros.
template <typename T, int EXP_BITS, int MAN_BITS>
__global__ void kv_quantize(const T* x, unsigned char* codes, float* scales, int rows, int D,
                            float qmax, int nan_code) {
    const int lane = threadIdx.x % 32;
    const long long r = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (r >= rows) return;  // the whole warp: r is the warp's
    const T* row = x + r * D;
    unsigned top = 0;
    for (int d = lane; d < D; d += 32)
        top = tg_max(top, __float_as_uint((float)to_acc(row[d])) & 0x7fffffffu);
    const float amax = __uint_as_float(warp_max(top));
    const float scale = amax > 0.0f ? amax / qmax : 1.0f;
    const int qmax_bits = __float_as_int(qmax);
    for (int d = lane; d < D; d += 32)
        codes[r * D + d] =
            minifloat_code<EXP_BITS, MAN_BITS>((float)to_acc(row[d]) / scale, qmax_bits, nan_code);
    if (lane == 0) scales[r] = scale;
}

// Keys per block of the online softmax (kvcache/cpu.py's _KEYS, attention/spec.py's FLASH_BK).
constexpr int KV_KEYS = 64;

// A cache's rows as the attention below reads them: element d of row r (rows counted over the
// cache's (B, Hkv, L) positions, D elements each) and the row's scale. An fp8 cache's codes are
// looked up in its format's 256 values (ml_dtypes' values; looked up, not computed from the bits,
// so that the GPU's flush to zero cannot touch a subnormal one), each row times its scale; a
// cache in a float dtype is its elements, scale 1 (a product by 1 rounds to itself: the sums
// are those of the fp8 path's code).
struct Fp8Rows {
    const unsigned char* codes;
    const float* scales;
    const float* table;  // the values, in shared memory
    __device__ float at(long long r, int d, int D) const { return table[codes[r * D + d]]; }
    __device__ float scale(long long r) const { return scales[r]; }
};

template <typename T, typename A> struct PlainRows {
    const T* x;
    __device__ A at(long long r, int d, int D) const { return (A)to_acc(x[r * D + d]); }
    __device__ A scale(long long) const { return A(1); }
};

// out[b, h, i, :] = softmax(scale q k^T over keys 0 ... length - Tq + i) v for query head h of
// H = G Hkv, against kv head h / G; q, out (B, H, Tq, D) T, read and accumulated in A; k and v
// as Rows reads them, rows of L positions. length = positions[Tq - 1] + 1, read on the device
// (never by the host: a decode step launches the same kernel at every position, so a CUDA graph
// can replay it), at most L (the host checks the positions against the cache's length before
// the step: nn/lm.py's advance). One block per (b, h, i) row, 256 threads; shared memory
// (2 D + KV_KEYS) A after what the caller keeps there: q, the running o, a block's scores.
// Per block of KV_KEYS keys: a warp per key computes q . k (lanes over D, warp_sum) times the
// key's row scale and scale; then every thread takes m_new = max(m, the scores) and alpha =
// exp(m - m_new), the scores become p = exp(s - m_new), lsum = lsum alpha + sum(p) in key order,
// and thread d updates o[d] = o[d] alpha + sum over the keys, in order, of (p x the value's row
// scale) x v[d]. At the end out = o / lsum, rounded once to T. As kvcache/cpu.py's qattention:
// one row per program, the same blocks, values, products and order, but for q . k's sum (the
// lanes, then the warp's tree) and expf: equal to fp32 rounding.
template <typename T, typename A, typename Rows>
__device__ void attend_row(const T* q, Rows k, Rows v, T* out, A* shared, int H, int G, int Tq,
                           int L, const long long* positions, int D, A scale) {
    A* qs = shared;
    A* o = qs + D;
    A* s = o + D;
    const long long row = blockIdx.x, bh = row / Tq;  // (b, h) = (bh / H, bh % H)
    const int i = row % Tq, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const long long kv0 = (bh / H * (H / G) + bh % H / G) * L;  // kv head b Hkv + h / G, row 0
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        qs[d] = (A)to_acc(q[row * D + d]);
        o[d] = 0;
    }
    __syncthreads();
    const int length = (int)min(positions[Tq - 1] + 1, (long long)L);
    const int seen = length - Tq + i + 1;  // the keys this query sees
    A m = neg_inf<A>(), lsum = 0;
    for (int j0 = 0; j0 < seen; j0 += KV_KEYS) {
        const int n = min(KV_KEYS, seen - j0);
        for (int c = warp; c < n; c += blockDim.x / 32) {
            A dot = 0;
            for (int d = lane; d < D; d += 32) dot += qs[d] * k.at(kv0 + j0 + c, d, D);
            dot = warp_sum(dot);
            if (lane == 0) s[c] = dot * k.scale(kv0 + j0 + c) * scale;
        }
        __syncthreads();
        A m_new = m;
        for (int c = 0; c < n; ++c) m_new = tg_max(m_new, s[c]);
        const A alpha = tg_exp(m - m_new);
        __syncthreads();  // every thread has read the scores before they become p
        for (int c = threadIdx.x; c < n; c += blockDim.x) s[c] = tg_exp(s[c] - m_new);
        __syncthreads();
        A total = 0;
        for (int c = 0; c < n; ++c) total += s[c];
        lsum = lsum * alpha + total;
        for (int d = threadIdx.x; d < D; d += blockDim.x) {
            A acc = o[d] * alpha;
            for (int c = 0; c < n; ++c)
                acc += s[c] * v.scale(kv0 + j0 + c) * v.at(kv0 + j0 + c, d, D);
            o[d] = acc;
        }
        m = m_new;
        __syncthreads();  // p is read by every thread before the next block's scores
    }
    for (int d = threadIdx.x; d < D; d += blockDim.x) out[row * D + d] = from_acc<T>(o[d] / lsum);
}

// attend_row over an fp8 cache, in fp32 whatever T is (as the CPU twin): codes (B, Hkv, L, D),
// scales (B, Hkv, L), values the format's 256 values, copied to shared memory first (dynamic
// shared memory: (256 + 2 D + KV_KEYS) floats).
template <typename T>
__global__ void qattention(const T* q, const unsigned char* k_codes, const float* k_scales,
                           const unsigned char* v_codes, const float* v_scales,
                           const float* values, T* out, int H, int G, int Tq, int L,
                           const long long* positions, int D, float scale) {
    extern __shared__ __align__(16) unsigned char smem[];
    float* table = reinterpret_cast<float*>(smem);
    for (int c = threadIdx.x; c < 256; c += blockDim.x) table[c] = values[c];
    attend_row<T, float>(q, Fp8Rows{k_codes, k_scales, table}, Fp8Rows{v_codes, v_scales, table},
                         out, table + 256, H, G, Tq, L, positions, D, scale);
}

// attend_row over a cache in q's dtype, k and v (B, Hkv, L, D), in acc_t<T> (dynamic shared
// memory: (2 D + KV_KEYS) acc_t<T>). The CPU twin runs flash attention's rows on the cache cut
// to its length, with the same blocks of keys: equal to the accumulator's rounding.
template <typename T>
__global__ void kv_attention(const T* q, const T* k, const T* v, T* out, int H, int G, int Tq,
                             int L, const long long* positions, int D, acc_t<T> scale) {
    typedef acc_t<T> A;
    extern __shared__ __align__(16) unsigned char smem[];
    attend_row<T, A>(q, PlainRows<T, A>{k}, PlainRows<T, A>{v}, out, reinterpret_cast<A*>(smem),
                     H, G, Tq, L, positions, D, scale);
}

#ifdef TG_CHECK_INSTANTIATE
// Every variant cuda.py launches (see elementwise.cu): kv_quantize for x in each float dtype
// and each format's fields, qattention and kv_attention for q in each float dtype.
void* tg_instances_kvcache[] = {
    (void*)&kv_quantize<float, 4, 3>, (void*)&kv_quantize<float, 5, 2>,
    (void*)&kv_quantize<__half, 4, 3>, (void*)&kv_quantize<__half, 5, 2>,
    (void*)&kv_quantize<__nv_bfloat16, 4, 3>, (void*)&kv_quantize<__nv_bfloat16, 5, 2>,
    (void*)&kv_quantize<double, 4, 3>, (void*)&kv_quantize<double, 5, 2>,
    (void*)&qattention<float>, (void*)&qattention<__half>, (void*)&qattention<__nv_bfloat16>,
    (void*)&qattention<double>,
    (void*)&kv_attention<float>, (void*)&kv_attention<__half>, (void*)&kv_attention<__nv_bfloat16>,
    (void*)&kv_attention<double>,
};
#endif
