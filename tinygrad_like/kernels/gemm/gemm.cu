// GEMMs: C[M, N] = (op(A)[M, K] @ op(B)[K, N] (+ bias[N])) (* scale) (+ add[M, N]), batched
// over blockIdx.z.
//
// The three layouts a linear layer needs are template flags, read as "the operand is stored
// transposed":
//   forward   Y  = X  W     matmul     TA = false, TB = false   A: [M][K], B: [K][N]
//   backward  dX = dY W^T  matmul_nt  TA = false, TB = true    A: [M][K], B: [N][K]
//   backward  dW = X^T dY  matmul_tn  TA = true,  TB = false   A: [K][M], B: [K][N]
// All arrays are row-major and contiguous within a batch; batch b starts at b * stride (stride 0
// broadcasts one matrix over the batch). Ragged sizes: tiles that run past M, N or K are
// zero-filled when loaded and bounds-checked when stored. Accumulation is always fp32, and the
// bias is added in fp32 before the one rounding to T, as cpu.matmul does. K = 0 is correct
// (C = bias, or 0, then + add: no k-tile runs and the loads in flight are drained before
// exit), though cuda.py never launches it: it fills C on the host side without a kernel.
//
// The epilogue's scale (NULL: none; one element) and add (NULL: none; C's shape and batch
// stride) are read in the store and give the bits of elementwise's mul(C, scale), then
// add(add, C), launched after the GEMM: fp32 C = ((acc + bias) * scale) + add, each rounded
// (__fmul_rn / __fadd_rn: no FMA contracts them); fp16/bf16 C rounded to T first, then each
// step widened to fp32 and rounded back to T, as the elementwise kernels do.
// add may be C itself (a gradient accumulated in place): each element is read, then written,
// by the one thread that owns it, so neither pointer is __restrict__.
//
// Shared memory tiles mirror the global layout (a tile of [K][M] stays k-major), so the global
// -> shared copy is a plain 2-D copy: 16 bytes per cp.async when ASYNC (the contiguous dims are
// multiples of 16 bytes and the pointers aligned, checked by cuda.py), else element by element.
// Two stages: tile t+1 is in flight while tile t is being multiplied.
#include "common.cuh"

// The inline PTX lives in these small functions only. The CPU test build (tests/cuda_on_cpu,
// TG_CUDA_ON_CPU) replaces them with ptx_on_cpu.h's warp-wide emulation of the same names.
#ifdef TG_CUDA_ON_CPU
#include "ptx_on_cpu.h"
#else
__device__ __forceinline__ unsigned smem_addr(const void* p) {
    return (unsigned)__cvta_generic_to_shared(p);
}

// 16-byte asynchronous copy global -> shared; src_bytes = 0 writes 16 zero bytes instead.
// Every cp.async asm has the "memory" clobber: it writes shared memory behind the compiler's
// back, so the compiler must not keep shared values in registers across the copy or the wait,
// nor move ordinary loads and stores of the tiles across them.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int PENDING> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING) : "memory");
}

// D = A B + D for one 16x8x16 tile. a: 4 registers (8 halves) of A's fragment, b: 2 of B's.
__device__ __forceinline__ void mma16816(float (&d)[4], const unsigned (&a)[4], const unsigned* b, __half) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ void mma16816(float (&d)[4], const unsigned (&a)[4], const unsigned* b, __nv_bfloat16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Four 8x8 16-bit matrices from shared memory; lane l gives the address of a row of matrix l/8.
template <bool TRANS> __device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* p) {
    if constexpr (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}

#endif  // TG_CUDA_ON_CPU

// Copy the ROWS x COLS tile at (row0, col0) of a row-major matrix g (nrows x ncols, leading
// dimension ld) into s[ROWS][PITCH]; elements outside the matrix become 0. Chunks of 16 bytes
// along the rows; consecutive threads take consecutive chunks (coalesced).
template <typename T, int ROWS, int COLS, int PITCH, int THREADS, bool ASYNC>
__device__ __forceinline__ void load_tile(T* s, const T* g, int ld, int row0, int col0, int nrows,
                                          int ncols) {
    constexpr int VEC = 16 / sizeof(T), CHUNKS_PER_ROW = COLS / VEC;
    static_assert(COLS % VEC == 0 && (ROWS * CHUNKS_PER_ROW) % THREADS == 0, "tile shape");
#pragma unroll
    for (int i = threadIdx.x; i < ROWS * CHUNKS_PER_ROW; i += THREADS) {
        const int r = i / CHUNKS_PER_ROW, c = (i % CHUNKS_PER_ROW) * VEC;
        const int gr = row0 + r, gc = col0 + c;
        T* dst = s + r * PITCH + c;
        if constexpr (ASYNC) {  // ncols is a multiple of VEC: a chunk is all in or all out
            const bool inside = gr < nrows && gc < ncols;
            cp_async16(dst, inside ? g + (long long)gr * ld + gc : g, inside ? 16 : 0);
        } else {
#pragma unroll
            for (int v = 0; v < VEC; ++v)
                dst[v] = gr < nrows && gc + v < ncols ? g[(long long)gr * ld + gc + v] : from_acc<T>(0.0f);
        }
    }
}

// Load the k-tile starting at k0 of op(A) (BM x BK) and op(B) (BK x BN) for the output tile at
// (m0, n0) into the given stage buffers, in the mirrored layouts described above.
template <typename T, bool TA, bool TB, bool ASYNC, int BM, int BN, int BK, int PA, int PB, int THREADS>
__device__ __forceinline__ void load_stage(T* As, T* Bs, const T* A, const T* B, int M, int N, int K,
                                           int m0, int n0, int k0) {
    if constexpr (TA) load_tile<T, BK, BM, PA, THREADS, ASYNC>(As, A, M, k0, m0, K, M);
    else load_tile<T, BM, BK, PA, THREADS, ASYNC>(As, A, K, m0, k0, M, K);
    if constexpr (TB) load_tile<T, BN, BK, PB, THREADS, ASYNC>(Bs, B, K, n0, k0, N, K);
    else load_tile<T, BK, BN, PB, THREADS, ASYNC>(Bs, B, N, k0, n0, K, N);
}

// ---------------------------------------------------------------------------------------------
// fp32: a tiled shared-memory kernel (no tensor cores, so it matches NumPy's fp32 closely).
// Launch: grid (ceil(N/64), ceil(M/64), batch), 256 threads as 16 x 16; thread (ty, tx) owns
// the 4 x 4 outputs at rows ty + 16 i, columns tx + 16 j of the block's 64 x 64 tile, and
// walks K in tiles of 16.
constexpr int S_BM = 64, S_BN = 64, S_BK = 16, S_THREADS = 256;

template <bool TA, bool TB, bool ASYNC>
__global__ void __launch_bounds__(S_THREADS)
gemm_f32(const float* A, const float* B, const float* bias, const float* scale,
         const float* add, float* C, int M, int N, int K, long long stride_a, long long stride_b,
         long long stride_c) {
    // pitch: row length + 4 floats (keeps 16-byte alignment for cp.async, staggers banks)
    constexpr int PA = (TA ? S_BM : S_BK) + 4, PB = (TB ? S_BK : S_BN) + 4;
    __shared__ __align__(16) float As[2][(TA ? S_BK : S_BM) * PA];
    __shared__ __align__(16) float Bs[2][(TB ? S_BN : S_BK) * PB];
    A += blockIdx.z * stride_a;
    B += blockIdx.z * stride_b;
    C += blockIdx.z * stride_c;
    if (add) add += blockIdx.z * stride_c;
    const int m0 = blockIdx.y * S_BM, n0 = blockIdx.x * S_BN;
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;

    float acc[4][4] = {};
    const int ktiles = (K + S_BK - 1) / S_BK;
    load_stage<float, TA, TB, ASYNC, S_BM, S_BN, S_BK, PA, PB, S_THREADS>(As[0], Bs[0], A, B, M, N, K, m0, n0, 0);
    cp_async_commit();
    for (int t = 0; t < ktiles; ++t) {
        if (t + 1 < ktiles)
            load_stage<float, TA, TB, ASYNC, S_BM, S_BN, S_BK, PA, PB, S_THREADS>(
                As[(t + 1) % 2], Bs[(t + 1) % 2], A, B, M, N, K, m0, n0, (t + 1) * S_BK);
        cp_async_commit();
        cp_async_wait<1>();  // tile t has landed (tile t+1 may still be in flight)
        __syncthreads();
        const float* as = As[t % 2];
        const float* bs = Bs[t % 2];
#pragma unroll
        for (int k = 0; k < S_BK; ++k) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) a[i] = TA ? as[k * PA + ty + 16 * i] : as[(ty + 16 * i) * PA + k];
#pragma unroll
            for (int j = 0; j < 4; ++j) b[j] = TB ? bs[(tx + 16 * j) * PB + k] : bs[k * PB + tx + 16 * j];
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] += a[i] * b[j];
        }
        __syncthreads();  // everyone is done with stage t % 2 before it is refilled
    }
    cp_async_wait<0>();  // K = 0 runs no iteration: the prologue's copies must land before exit
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int row = m0 + ty + 16 * i;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int col = n0 + tx + 16 * j;
            if (row < M && col < N) {
                const long long idx = (long long)row * N + col;
                float r = acc[i][j] + (bias ? bias[col] : 0.0f);
                if (scale) r = __fmul_rn(r, *scale);
                C[idx] = add ? __fadd_rn(r, add[idx]) : r;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// fp16 / bf16: tensor cores through mma.sync.aligned.m16n8k16 (fp32 accumulators), fragments
// loaded from shared memory with ldmatrix (.trans for the k-major tiles).
// Launch: grid (ceil(N/128), ceil(M/128), batch), 256 threads = 8 warps as 2 (M) x 4 (N); each
// warp owns a 64 x 32 piece of the block's 128 x 128 tile: 4 x 4 mma tiles of 16 x 8, K walked
// in tiles of 32 (two k16 steps).
constexpr int T_BM = 128, T_BN = 128, T_BK = 32, T_THREADS = 256;

template <typename T, bool TA, bool TB, bool ASYNC>
__global__ void __launch_bounds__(T_THREADS)
gemm_tc(const T* A, const T* B, const T* bias, const T* scale, const T* add, T* C, int M, int N,
        int K, long long stride_a, long long stride_b, long long stride_c) {
    // pitch: row length + 8 elements (16 bytes): rows stay 16-byte aligned for cp.async and
    // ldmatrix, and the 8 rows one ldmatrix reads fall in different banks
    constexpr int PA = (TA ? T_BM : T_BK) + 8, PB = (TB ? T_BK : T_BN) + 8;
    __shared__ __align__(16) T As[2][(TA ? T_BK : T_BM) * PA];
    __shared__ __align__(16) T Bs[2][(TB ? T_BN : T_BK) * PB];
    A += blockIdx.z * stride_a;
    B += blockIdx.z * stride_b;
    C += blockIdx.z * stride_c;
    if (add) add += blockIdx.z * stride_c;
    const int m0 = blockIdx.y * T_BM, n0 = blockIdx.x * T_BN;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int wm = (warp / 4) * 64, wn = (warp % 4) * 32;  // the warp's piece of the tile

    float acc[4][4][4] = {};  // [m16 tile][n8 tile][fragment element]
    const int ktiles = (K + T_BK - 1) / T_BK;
    load_stage<T, TA, TB, ASYNC, T_BM, T_BN, T_BK, PA, PB, T_THREADS>(As[0], Bs[0], A, B, M, N, K, m0, n0, 0);
    cp_async_commit();
    for (int t = 0; t < ktiles; ++t) {
        if (t + 1 < ktiles)
            load_stage<T, TA, TB, ASYNC, T_BM, T_BN, T_BK, PA, PB, T_THREADS>(
                As[(t + 1) % 2], Bs[(t + 1) % 2], A, B, M, N, K, m0, n0, (t + 1) * T_BK);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const T* as = As[t % 2];
        const T* bs = Bs[t % 2];
#pragma unroll
        for (int kk = 0; kk < T_BK; kk += 16) {
            // A fragments (16 x 16 each). Matrices 0..3 = (rows 0-7, k 0-7), (rows 8-15, k 0-7),
            // (rows 0-7, k 8-15), (rows 8-15, k 8-15): the register order of mma's A operand.
            unsigned a[4][4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int row = wm + i * 16;
                if constexpr (TA)  // tile is [k][m]: rows of the 8x8 matrices are k, transpose
                    ldmatrix_x4<true>(a[i], as + (kk + lane % 8 + (lane / 16) * 8) * PA + row + ((lane / 8) % 2) * 8);
                else
                    ldmatrix_x4<false>(a[i], as + (row + lane % 16) * PA + kk + (lane / 16) * 8);
            }
            // B fragments, two n8 tiles per ldmatrix: registers {b0, b1} of tile 2j and of
            // tile 2j+1, i.e. matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15).
            unsigned b[2][4];
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const int col = wn + j * 16;
                if constexpr (TB)  // tile is [n][k]
                    ldmatrix_x4<false>(b[j], bs + (col + lane % 8 + (lane / 16) * 8) * PB + kk + ((lane / 8) % 2) * 8);
                else               // tile is [k][n]: transpose
                    ldmatrix_x4<true>(b[j], bs + (kk + lane % 8 + ((lane / 8) % 2) * 8) * PB + col + (lane / 16) * 8);
            }
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) mma16816(acc[i][j], a[i], &b[j / 2][(j % 2) * 2], T());
        }
        __syncthreads();
    }
    cp_async_wait<0>();  // as gemm_f32: no copy is left in flight when K = 0
    // Accumulator fragment: lane holds rows lane/4 and lane/4 + 8, columns 2 (lane%4) + {0, 1}.
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int row = m0 + wm + i * 16 + lane / 4 + (e / 2) * 8;
                const int col = n0 + wn + j * 8 + (lane % 4) * 2 + e % 2;
                if (row < M && col < N) {
                    const long long idx = (long long)row * N + col;
                    T r = from_acc<T>(acc[i][j][e] + (bias ? to_acc(bias[col]) : 0.0f));
                    if (scale) r = from_acc<T>(to_acc(r) * to_acc(*scale));
                    if (add) r = from_acc<T>(to_acc(r) + to_acc(add[idx]));
                    C[idx] = r;
                }
            }
}

#ifdef TG_CHECK_INSTANTIATE
// Every variant cuda.py launches (see elementwise.cu).
void* tg_instances_gemm[] = {
    (void*)&gemm_f32<false, false, false>, (void*)&gemm_f32<false, false, true>,
    (void*)&gemm_f32<false, true, false>, (void*)&gemm_f32<false, true, true>,
    (void*)&gemm_f32<true, false, false>, (void*)&gemm_f32<true, false, true>,
    (void*)&gemm_tc<__half, false, false, false>, (void*)&gemm_tc<__half, false, false, true>,
    (void*)&gemm_tc<__half, false, true, false>, (void*)&gemm_tc<__half, false, true, true>,
    (void*)&gemm_tc<__half, true, false, false>, (void*)&gemm_tc<__half, true, false, true>,
    (void*)&gemm_tc<__nv_bfloat16, false, false, false>, (void*)&gemm_tc<__nv_bfloat16, false, false, true>,
    (void*)&gemm_tc<__nv_bfloat16, false, true, false>, (void*)&gemm_tc<__nv_bfloat16, false, true, true>,
    (void*)&gemm_tc<__nv_bfloat16, true, false, false>, (void*)&gemm_tc<__nv_bfloat16, true, false, true>,
};
#endif
