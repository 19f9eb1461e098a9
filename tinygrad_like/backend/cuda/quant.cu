// Quantized weights: a GEMM against W (N, K) and a row gather from it, W decoded from its codes
// in registers as they are read (never a dequantized copy), as cpu/quant.py does row by row.
//
// Stored layout (contract.py, "quant"): row n of W is row n of codes, (N, K / PER_CODE) of C:
// unsigned short bit patterns for bf16 / fp16, one unsigned char per element for the 8-bit
// formats, two for the 4-bit ones (element 2j in the low nibble, 2j + 1 in the high one);
// scales (N, K / group_size) fp32, element k of row n scaled by scales[n, k / group_size], null
// for bf16 / fp16. The decode is by bit operations (no cuda_fp8.h), value for value
// ml_dtypes' (float8_e4m3fn, float8_e5m2, float4_e2m1fn), and the same as the CPU kernel's.
#include "common.cuh"

// The formats, numbered as cuda/quant.py's FORMATS (tests/test_cuda_launch_args.py checks).
enum QuantFormat {
    Q_BF16 = 0, Q_FP16 = 1, Q_FP8_E4M3 = 2, Q_FP8_E5M2 = 3, Q_INT8 = 4, Q_INT4 = 5, Q_FP4_E2M1 = 6
};

// Elements per stored code of a format: two nibbles per byte for the 4-bit ones.
template <int FMT> constexpr int PER_CODE = FMT == Q_INT4 || FMT == Q_FP4_E2M1 ? 2 : 1;

// Bytes of one stored code: the 16-bit formats keep their bit patterns, the others bytes.
template <int FMT> constexpr int CODE_BYTES = FMT == Q_BF16 || FMT == Q_FP16 ? 2 : 1;

// The value of one element's bits v (16, 8 or 4 of them), before its scale.
template <int FMT> __device__ __forceinline__ float decode(unsigned v) {
    if constexpr (FMT == Q_BF16) {
        return __uint_as_float(v << 16);
    } else if constexpr (FMT == Q_FP16) {
        return __half2float(__ushort_as_half((unsigned short)v));
    } else if constexpr (FMT == Q_FP8_E5M2) {  // the top byte of an IEEE half: same exponent, bias
        return __half2float(__ushort_as_half((unsigned short)(v << 8)));
    } else if constexpr (FMT == Q_FP8_E4M3) {  // 'fn': bias 7, subnormals, S.1111.111 is NaN, no inf
        const unsigned sign = (v & 0x80u) << 24, e = (v >> 3) & 15u, m = v & 7u;
        const float magnitude = e == 15u && m == 7u ? __uint_as_float(0x7fc00000u)
                                : e == 0u           ? (float)m * 0.001953125f  // m 2^-9
                                                    : __uint_as_float((e + 120u) << 23 | m << 20);
        return __uint_as_float(__float_as_uint(magnitude) | sign);
    } else if constexpr (FMT == Q_INT8) {
        return (float)(signed char)v;
    } else if constexpr (FMT == Q_INT4) {
        return (float)((int)v - 8);
    } else {  // Q_FP4_E2M1: bias 1; 0, 0.5 (the one subnormal), 1, 1.5, 2, 3, 4, 6
        const unsigned sign = (v & 8u) << 28, e = (v >> 1) & 3u, m = v & 1u;
        const float magnitude = e == 0u ? (float)m * 0.5f : __uint_as_float((e + 126u) << 23 | m << 22);
        return __uint_as_float(__float_as_uint(magnitude) | sign);
    }
}

// Element k = j PER_CODE + p of a row, from its stored code c = row[j]: decoded, times its
// group's scale (row_scales: that row's scales, null for bf16 / fp16), rounded to fp32.
template <int FMT>
__device__ __forceinline__ float dequantize(unsigned c, int p, const float* row_scales, int k,
                                            int group_size) {
    const float w = decode<FMT>(PER_CODE<FMT> == 2 ? (c >> (4 * p)) & 15u : c);
    return row_scales ? w * row_scales[k / group_size] : w;
}

// y[m, n] = sum_k x[m, k] w[n, k] (+ bias[n]), w = dequantize(codes[n, ...]) as above.
// x: (M, K), y: (M, N), both T; codes, scales: the layout above; bias: (N,) T or null.
// Launch: one warp per output row n (8 per 256-thread block, as launch_per_row): its lanes
// stride over the row's codes (coalesced), decode each in registers and accumulate w x[m, k]
// in fp32 for QMATMUL_ROWS rows of x at a time (M is small when decoding: one pass over the
// codes per QMATMUL_ROWS rows); warp_sum, then the bias in fp32 and one rounding to T. As
// cpu/quant.py's qmatmul: one output row per program, the same decode and fp32 products, its
// sum over k in another order (lanes, then the warp's tree).
constexpr int QMATMUL_ROWS = 8;

template <typename T, typename C, int FMT>
__global__ void qmatmul(const T* x, const C* codes, const float* scales, const T* bias, T* y, int M,
                        int N, int K, int group_size) {
    static_assert(sizeof(C) == CODE_BYTES<FMT>, "the code type of the format");
    const int lane = threadIdx.x % 32;
    const long long n = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (n >= N) return;  // the whole warp: n is the warp's
    const int codes_per_row = K / PER_CODE<FMT>;
    const C* row = codes + n * codes_per_row;
    const float* row_scales = scales ? scales + n * (K / group_size) : nullptr;
    for (int m0 = 0; m0 < M; m0 += QMATMUL_ROWS) {
        float acc[QMATMUL_ROWS] = {};
        for (int j = lane; j < codes_per_row; j += 32) {
            const unsigned c = row[j];
#pragma unroll
            for (int p = 0; p < PER_CODE<FMT>; ++p) {
                const int k = j * PER_CODE<FMT> + p;
                const float w = dequantize<FMT>(c, p, row_scales, k, group_size);
#pragma unroll
                for (int r = 0; r < QMATMUL_ROWS; ++r)
                    if (m0 + r < M) acc[r] += w * to_acc(x[(long long)(m0 + r) * K + k]);
            }
        }
#pragma unroll
        for (int r = 0; r < QMATMUL_ROWS; ++r) {
            if (m0 + r >= M) break;  // uniform over the warp
            const float sum = warp_sum(acc[r]);
            if (lane == 0) y[(long long)(m0 + r) * N + n] = from_acc<T>(sum + (bias ? to_acc(bias[n]) : 0.0f));
        }
    }
}

// out[t, :] = W[idx[t], :] dequantized, fp32. idx: (tokens,) int64, every id in [0, N) (quant.py
// checks on the host: no bounds check here); out: (tokens, K). Launch: one block per token, 256
// threads striding over the row's codes, each writing its code's PER_CODE elements. As
// cpu/quant.py's qembedding: one gathered row per program, the same decode, bit for bit.
template <typename C, int FMT>
__global__ void qembedding(const C* codes, const float* scales, const long long* idx, float* out,
                           int K, int group_size) {
    static_assert(sizeof(C) == CODE_BYTES<FMT>, "the code type of the format");
    const long long n = idx[blockIdx.x];
    const int codes_per_row = K / PER_CODE<FMT>;
    const C* row = codes + n * codes_per_row;
    const float* row_scales = scales ? scales + n * (K / group_size) : nullptr;
    float* dst = out + (long long)blockIdx.x * K;
    for (int j = threadIdx.x; j < codes_per_row; j += blockDim.x) {
        const unsigned c = row[j];
#pragma unroll
        for (int p = 0; p < PER_CODE<FMT>; ++p) {
            const int k = j * PER_CODE<FMT> + p;
            dst[k] = dequantize<FMT>(c, p, row_scales, k, group_size);
        }
    }
}

#ifdef TG_CHECK_INSTANTIATE
// Every variant quant.py launches (see elementwise.cu): x in fp32, fp16 or bf16, each format
// with its code type.
void* tg_instances_quant[] = {
    (void*)&qmatmul<float, unsigned short, 0>, (void*)&qmatmul<float, unsigned short, 1>,
    (void*)&qmatmul<float, unsigned char, 2>, (void*)&qmatmul<float, unsigned char, 3>,
    (void*)&qmatmul<float, unsigned char, 4>, (void*)&qmatmul<float, unsigned char, 5>,
    (void*)&qmatmul<float, unsigned char, 6>,
    (void*)&qmatmul<__half, unsigned short, 0>, (void*)&qmatmul<__half, unsigned short, 1>,
    (void*)&qmatmul<__half, unsigned char, 2>, (void*)&qmatmul<__half, unsigned char, 3>,
    (void*)&qmatmul<__half, unsigned char, 4>, (void*)&qmatmul<__half, unsigned char, 5>,
    (void*)&qmatmul<__half, unsigned char, 6>,
    (void*)&qmatmul<__nv_bfloat16, unsigned short, 0>, (void*)&qmatmul<__nv_bfloat16, unsigned short, 1>,
    (void*)&qmatmul<__nv_bfloat16, unsigned char, 2>, (void*)&qmatmul<__nv_bfloat16, unsigned char, 3>,
    (void*)&qmatmul<__nv_bfloat16, unsigned char, 4>, (void*)&qmatmul<__nv_bfloat16, unsigned char, 5>,
    (void*)&qmatmul<__nv_bfloat16, unsigned char, 6>,
    (void*)&qembedding<unsigned short, 0>, (void*)&qembedding<unsigned short, 1>,
    (void*)&qembedding<unsigned char, 2>, (void*)&qembedding<unsigned char, 3>,
    (void*)&qembedding<unsigned char, 4>, (void*)&qembedding<unsigned char, 5>,
    (void*)&qembedding<unsigned char, 6>,
};
#endif
