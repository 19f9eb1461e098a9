// Quantized weights: a GEMM against W (N, K) and a row gather from it, W decoded from its codes
// in registers as they are read (never a dequantized copy), as quant/cpu.py does row by row.
//
// Stored layout (formats.py): row n of W is row n of codes, (N, K / PER_CODE) of C:
// unsigned short bit patterns for bf16 / fp16, one unsigned char per element for the 8-bit
// formats, two for the 4-bit ones (element 2j in the low nibble, 2j + 1 in the high one);
// scales (N, K / group_size) fp32, element k of row n scaled by scales[n, k / group_size], null
// for bf16 / fp16. The decode is by bit operations (no cuda_fp8.h), value for value
// ml_dtypes' (float8_e4m3fn, float8_e5m2, float4_e2m1fn) and the CPU kernel's, bit for bit.
#include "common.cuh"

// The formats of formats.FORMATS, numbered in the order of quant/cuda.py's FORMATS (tests check).
enum QuantFormat {
    INT8 = 0, INT4 = 1, FP8_E4M3 = 2, FP8_E5M2 = 3, FP4_E2M1 = 4, BF16 = 5, FP16 = 6
};

// What a small float's largest exponent field means, as quant/cpu.py's: nothing special (fp4
// E2M1), NaN only where every other bit is set too (fp8 E4M3 "fn": no infinities), or IEEE
// infinities and NaNs (fp16, fp8 E5M2).
enum Specials { FINITE = 0, NAN_ONLY = 1, IEEE = 2 };

// Elements per stored code of a format (two nibbles per byte for the 4-bit ones), and the
// bytes of one code (the 16-bit formats keep their bit patterns, the others bytes).
template <int FMT> constexpr int PER_CODE = FMT == INT4 || FMT == FP4_E2M1 ? 2 : 1;
template <int FMT> constexpr int CODE_BYTES = FMT == BF16 || FMT == FP16 ? 2 : 1;

// The decode functions: bit operations from the code to its fp32 value, exact (every format's
// values are fp32 values), the values of quant/cpu.py's int8_value, int4_value and
// minifloat_value times minifloat_scale, bit for bit but for a NaN's payload (formats.FORMATS'
// fields are minifloat_value's template arguments below). One difference of means: the CPU
// goes through fp16 (F16C's conversion, subnormals exact) and multiplies by a power of two,
// where a small float's subnormal would meet CuPy's -ftz=true (added to every compile) and be
// flushed to zero; minifloat_value here takes it as the difference of two fp32 normals.
__device__ __forceinline__ float int8_value(unsigned code) {  // two's complement byte
    return (float)(((int)code ^ 0x80) - 0x80);
}

__device__ __forceinline__ float int4_value(unsigned nibble) {  // q in [-8, 7] stored as q + 8
    return (float)((int)nibble - 8);
}

// A small float's bits (1 sign, EXP_BITS exponent, MAN_BITS mantissa bits, bias
// 2^(EXP_BITS - 1) - 1): exponent and mantissa moved to fp32's places and the exponent
// rebiased; a subnormal (exponent 0) is the normal 2^(1 - bias) (1 + m / 2^MAN_BITS) minus
// 2^(1 - bias), exact; an IEEE exponent of all ones becomes fp32's (inf, NaN).
template <int EXP_BITS, int MAN_BITS, int SPECIALS>
__device__ __forceinline__ float minifloat_value(unsigned code) {
    constexpr int bias = (1 << (EXP_BITS - 1)) - 1, magnitude_bits = EXP_BITS + MAN_BITS;
    const int c = (int)code, mag = c & ((1 << magnitude_bits) - 1), e = mag >> MAN_BITS;
    const int bits = (mag << (23 - MAN_BITS)) + ((127 - bias) << 23);
    float f;
    if (e == 0)
        f = __int_as_float(bits + (1 << 23)) - __int_as_float((128 - bias) << 23);
    else if (SPECIALS == IEEE && e == (1 << EXP_BITS) - 1)
        f = __int_as_float(bits + ((128 - (1 << (EXP_BITS - 1))) << 23));
    else if (SPECIALS == NAN_ONLY && mag == (1 << magnitude_bits) - 1)
        f = __int_as_float(0x7fc00000);
    else
        f = __int_as_float(bits);
    return (c >> magnitude_bits) & 1 ? -f : f;
}

__device__ __forceinline__ float bf16_value(unsigned code) {  // the top half of fp32's bits
    return __int_as_float((int)(code << 16));
}

__device__ __forceinline__ float fp16_value(unsigned code) {
    return minifloat_value<5, 10, IEEE>(code);
}

// One element's value from its bits (16, 8 or 4 of them), before its scale.
template <int FMT> __device__ __forceinline__ float element_value(unsigned v) {
    if constexpr (FMT == INT8) return int8_value(v);
    else if constexpr (FMT == INT4) return int4_value(v);
    else if constexpr (FMT == FP8_E4M3) return minifloat_value<4, 3, NAN_ONLY>(v);
    else if constexpr (FMT == FP8_E5M2) return minifloat_value<5, 2, IEEE>(v);
    else if constexpr (FMT == FP4_E2M1) return minifloat_value<2, 1, FINITE>(v);
    else if constexpr (FMT == BF16) return bf16_value(v);
    else return fp16_value(v);
}

// Element k = j PER_CODE + p of a row, from its stored code c = row[j] (element 2j in the low
// nibble, 2j + 1 in the high one): decoded, times its group's scale (row_scales: that row's
// scales, null for bf16 / fp16), one fp32 product: quant/cpu.py's decode_row, element by
// element.
template <int FMT>
__device__ __forceinline__ float dequantize(unsigned c, int p, const float* row_scales, int k,
                                            int group_size) {
    const float w = element_value<FMT>(PER_CODE<FMT> == 2 ? (c >> (4 * p)) & 15u : c);
    return row_scales ? w * row_scales[k / group_size] : w;
}

// a + b rounded on its own (__fadd_rn / __dadd_rn are never contracted into an FMA with a
// product before them): the bits of the add launched after an unfused qmatmul.
__device__ __forceinline__ float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double add_rn(double a, double b) { return __dadd_rn(a, b); }

// y's store with the epilogue: v (fp32) rounded to T, plus a (add's element, T) with the bits of
// elementwise's add(add, y) launched after the unfused qmatmul: the rounded y widened, added in
// acc_t<T> to the widened a, rounded once more (for fp32 just v + a; fp64: y, an fp32 value,
// plus a in fp64).
template <typename T> __device__ __forceinline__ T plus(float v, T a) {
    return from_acc<T>(add_rn(to_acc(from_acc<T>(v)), to_acc(a)));
}

// y[m, n] = sum_k x[m, k] w[n, k] (+ bias[n]) (+ add[m, n]), w = dequantize(codes[n, ...]) as
// above. x: (M, K), y and add: (M, N), all T; codes, scales: the layout above; bias: (N,) T or
// null; add: null for none, else added in the store (plus); x and bias read as fp32 (fp64
// rounded to it, as the CPU twin's f32). Launch: one warp per output row n (8 per 256-thread
// block): its lanes stride over the row's codes (coalesced), decode each in registers and
// accumulate w x[m, k] in fp32 for QMATMUL_ROWS rows of x at a time (M is small when decoding:
// one pass over the codes per QMATMUL_ROWS rows); warp_sum, then the bias in fp32, one rounding
// to T and the add. As quant/cpu.py's qmatmul: one output row per program, the same decode and
// fp32 products, the sum over k in another order (lanes, then the warp's tree).
constexpr int QMATMUL_ROWS = 8;

template <typename T, typename C, int FMT>
__global__ void qmatmul(const T* x, const C* codes, const float* scales, const T* bias,
                        const T* add, T* y, int M, int N, int K, int group_size) {
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
                    if (m0 + r < M) acc[r] += w * (float)to_acc(x[(long long)(m0 + r) * K + k]);
            }
        }
#pragma unroll
        for (int r = 0; r < QMATMUL_ROWS; ++r) {
            if (m0 + r >= M) break;  // uniform over the warp
            const float sum = warp_sum(acc[r]);
            if (lane == 0) {
                const long long idx = (long long)(m0 + r) * N + n;
                const float v = sum + (bias ? (float)to_acc(bias[n]) : 0.0f);
                y[idx] = add ? plus<T>(v, add[idx]) : from_acc<T>(v);
            }
        }
    }
}

// out[t, :] = W[idx[t], :] dequantized, fp32. idx: (tokens,) int64, every id in [0, N) (cuda.py
// checks on the host: no bounds check here); out: (tokens, K). Launch: one block per token, 256
// threads striding over the row's codes, each writing its code's PER_CODE elements. As
// quant/cpu.py's qembedding: one gathered row per program, the same decode, bit for bit.
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

// ---------------------------------------------------------------- int8 activations
// quant/spec.py's quantize_rows and qmatmul_int8x (llama.cpp's Q8_0 activations): x quantized per
// block of X_BLOCK along K to int8 codes and an fp32 scale, each block's dot with a weight row
// an exact integer sum (__dp4a), scaled once in fp32; the bits of quant/cpu.py's twins.
constexpr int X_BLOCK = 32;  // spec.X_BLOCK: activations per scale
constexpr int LANES = 8;     // spec.py's fp32 sums: block b is added into sum b % 8
constexpr int INT8X_ROWS = 4;  // rows of x a pass over a row of W

// The larger of a and b, NaN when either is NaN: one value whatever the order (cpu.py's
// running max of a block).
__device__ __forceinline__ float nan_max(float a, float b) {
    if (a != a) return a;
    return b > a || b != b ? b : a;
}

// codes (M, K) int8 as bytes (two's complement) and scales (M, K / X_BLOCK) of x (M, K), as
// spec.py's quantize_rows says. Launch: one warp per block of X_BLOCK elements (block w of the
// flat (M * K / X_BLOCK,) list is elements X_BLOCK w .. of flat x, K being a multiple), a lane
// an element; the block's max by nan_max over the warp. As cpu.py's _quantize_rows: x read as
// fp32 (fp64 rounded to it), the scale and the quotient by __fdiv_rn, rintf (ties to even).
// TINY: spec.TINY_BLOCK, below which a block is all zero codes (and scale 1).
template <typename T>
__global__ void quantize_rows(const T* x, unsigned char* codes, float* scales, long long blocks) {
    constexpr float TINY = 0x1p-64f;
    const long long w = global_index() / 32;
    if (w >= blocks) return;  // the whole warp
    const int lane = threadIdx.x % 32;
    const long long at = w * X_BLOCK + lane;
    const float v = (float)to_acc(x[at]);
    float top = fabsf(v);
    for (int offset = 16; offset > 0; offset >>= 1)
        top = nan_max(top, __shfl_xor_sync(0xffffffffu, top, offset));
    const float scale = top < TINY ? 1.0f : __fdiv_rn(top, 127.0f);
    const float q = rintf(__fdiv_rn(v, scale));
    codes[at] = (unsigned char)(q == q ? (int)q : 0);
    if (lane == 0) scales[w] = scale;
}

// The four nibbles of v's low 16 bits in storage order (byte 0's low nibble first), one a byte:
// elements 2j, 2j + 1 of a 4-bit row (their values q + 8 in 0 .. 15) lined up with x's bytes.
__device__ __forceinline__ int nibble_bytes(unsigned v) {
    v = (v | (v << 8)) & 0x00FF00FFu;  // byte 1 to byte 2
    return (int)((v | (v << 4)) & 0x0F0F0F0Fu);  // each byte's high nibble to the byte above
}

// y[m, n] (M, N) in T = spec.py's qmatmul_int8x of xq (M, K) int8 codes as bytes, xs (M, K /
// X_BLOCK), the int8 or int4 W (codes, scales as qmatmul's) (+ bias (N,) fp32, or null) (+ add
// (M, N) T, or null, in the store as qmatmul's). Launch: one warp per output row n, as qmatmul.
// The warp takes LANES blocks a pass, 4 lanes a block: lane l reads 8 elements of block
// b = pass + l / 4 (elements 8 (l % 4) ..) as two words of bytes (int8: 8 codes; int4: 4 bytes
// of nibbles, spread by nibble_bytes) and x's 8 codes of them; two __dp4a (int4: less two by
// 0x08080808, 8 times the x codes' sum: a nibble is q + 8), the 4 lanes' sums added by
// shuffles (integers: exact); then t = (xs * w scale) * sum added into the lane's fp32 sum
// (the lanes of block b hold sum b % 8; blocks in increasing order; __fmul_rn / __fadd_rn, no
// FMA). The eight sums (lanes 0, 4, .., 28) are added as spec.py says by three shuffles: lane
// ^ 16 (sum l + 4), ^ 8 (+ 2), ^ 4 (+ 1). As quant/cpu.py's qmatmul_int8x, bit for bit: the
// same integers (cpu.py's dot multiplies unsigned codes and subtracts 128 or 8 times the x
// codes' sum), the same fp32 operations in the same order.
template <typename T, int FMT>
__global__ void qmatmul_int8x(const unsigned char* xq, const float* xs, const unsigned char* codes,
                              const float* scales, const float* bias, const T* add, T* y, int M,
                              int N, int K, int group_size) {
    static_assert(FMT == INT8 || FMT == INT4, "an integer format");
    const unsigned all = 0xffffffffu;
    const int lane = threadIdx.x % 32, quarter = lane % 4, nb = K / X_BLOCK;
    const long long n = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (n >= N) return;  // the whole warp: n is the warp's
    const unsigned char* row = codes + n * (K / PER_CODE<FMT>);
    const float* row_scales = scales + n * (K / group_size);
    for (int m0 = 0; m0 < M; m0 += INT8X_ROWS) {
        float acc[INT8X_ROWS] = {};
        for (int pass = 0; pass < nb; pass += LANES) {
            const int b = pass + lane / 4;
            const bool here = b < nb;  // the last pass may have fewer blocks
            int w0 = 0, w1 = 0;
            float w_scale = 0.0f;
            if (here) {
                if constexpr (FMT == INT4) {
                    const unsigned v = *(const unsigned*)(row + b * (X_BLOCK / 2) + 4 * quarter);
                    w0 = nibble_bytes(v & 0xFFFFu), w1 = nibble_bytes(v >> 16);
                } else {
                    const unsigned* v = (const unsigned*)(row + b * X_BLOCK + 8 * quarter);
                    w0 = (int)v[0], w1 = (int)v[1];
                }
                w_scale = row_scales[b * X_BLOCK / group_size];
            }
#pragma unroll
            for (int r = 0; r < INT8X_ROWS; ++r) {
                const int m = m0 + r;
                if (m >= M) break;  // uniform over the warp
                int s = 0;
                if (here) {
                    const int* x = (const int*)(xq + (long long)m * K + b * X_BLOCK + 8 * quarter);
                    s = __dp4a(w0, x[0], __dp4a(w1, x[1], 0));
                    if constexpr (FMT == INT4)
                        s -= __dp4a(0x08080808, x[0], __dp4a(0x08080808, x[1], 0));
                }
                s += __shfl_xor_sync(all, s, 1);
                s += __shfl_xor_sync(all, s, 2);
                if (here) {
                    const float scale = __fmul_rn(xs[(long long)m * nb + b], w_scale);
                    acc[r] = __fadd_rn(acc[r], __fmul_rn(scale, (float)s));
                }
            }
        }
#pragma unroll
        for (int r = 0; r < INT8X_ROWS; ++r) {
            if (m0 + r >= M) break;  // uniform over the warp
            float v = acc[r];
            for (int offset = 16; offset >= 4; offset >>= 1)
                v = __fadd_rn(v, __shfl_xor_sync(all, v, offset));
            if (lane == 0) {
                const long long idx = (long long)(m0 + r) * N + n;
                if (bias) v = __fadd_rn(v, bias[n]);
                y[idx] = add ? plus<T>(v, add[idx]) : from_acc<T>(v);
            }
        }
    }
}

#ifdef TG_CHECK_INSTANTIATE
// Every variant cuda.py launches (see elementwise.cu): qmatmul for x in each float dtype, both
// kernels for each format with its code type; quantize_rows for x in each float dtype and
// qmatmul_int8x for y in each, int8 and int4.
void* tg_instances_quant[] = {
    (void*)&qmatmul<float, unsigned char, 0>, (void*)&qmatmul<float, unsigned char, 1>,
    (void*)&qmatmul<float, unsigned char, 2>, (void*)&qmatmul<float, unsigned char, 3>,
    (void*)&qmatmul<float, unsigned char, 4>, (void*)&qmatmul<float, unsigned short, 5>,
    (void*)&qmatmul<float, unsigned short, 6>,
    (void*)&qmatmul<__half, unsigned char, 0>, (void*)&qmatmul<__half, unsigned char, 1>,
    (void*)&qmatmul<__half, unsigned char, 2>, (void*)&qmatmul<__half, unsigned char, 3>,
    (void*)&qmatmul<__half, unsigned char, 4>, (void*)&qmatmul<__half, unsigned short, 5>,
    (void*)&qmatmul<__half, unsigned short, 6>,
    (void*)&qmatmul<__nv_bfloat16, unsigned char, 0>, (void*)&qmatmul<__nv_bfloat16, unsigned char, 1>,
    (void*)&qmatmul<__nv_bfloat16, unsigned char, 2>, (void*)&qmatmul<__nv_bfloat16, unsigned char, 3>,
    (void*)&qmatmul<__nv_bfloat16, unsigned char, 4>, (void*)&qmatmul<__nv_bfloat16, unsigned short, 5>,
    (void*)&qmatmul<__nv_bfloat16, unsigned short, 6>,
    (void*)&qmatmul<double, unsigned char, 0>, (void*)&qmatmul<double, unsigned char, 1>,
    (void*)&qmatmul<double, unsigned char, 2>, (void*)&qmatmul<double, unsigned char, 3>,
    (void*)&qmatmul<double, unsigned char, 4>, (void*)&qmatmul<double, unsigned short, 5>,
    (void*)&qmatmul<double, unsigned short, 6>,
    (void*)&qembedding<unsigned char, 0>, (void*)&qembedding<unsigned char, 1>,
    (void*)&qembedding<unsigned char, 2>, (void*)&qembedding<unsigned char, 3>,
    (void*)&qembedding<unsigned char, 4>, (void*)&qembedding<unsigned short, 5>,
    (void*)&qembedding<unsigned short, 6>,
    (void*)&quantize_rows<float>, (void*)&quantize_rows<__half>,
    (void*)&quantize_rows<__nv_bfloat16>, (void*)&quantize_rows<double>,
    (void*)&qmatmul_int8x<float, 0>, (void*)&qmatmul_int8x<float, 1>,
    (void*)&qmatmul_int8x<__half, 0>, (void*)&qmatmul_int8x<__half, 1>,
    (void*)&qmatmul_int8x<__nv_bfloat16, 0>, (void*)&qmatmul_int8x<__nv_bfloat16, 1>,
    (void*)&qmatmul_int8x<double, 0>, (void*)&qmatmul_int8x<double, 1>,
};
#endif
