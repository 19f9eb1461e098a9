// gemm.cu's inline PTX, emulated warp-wide for the CPU build (gemm.cu includes this file instead
// of its asm functions when TG_CUDA_ON_CPU is defined). The same names and signatures:
//   cp_async16, cp_async_commit, cp_async_wait<N>   cp.async.cg.shared.global (16 bytes, src-size
//                                                    zero-fill), commit_group, wait_group
//   ldmatrix_x4<TRANS>                               ldmatrix.sync.aligned.m8n8.x4{.trans}.shared.b16
//   mma16816(d, a, b, T())                           mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}
// Layouts from the PTX ISA ("Matrix Fragments for mma.m16n8k16 with floating point type",
// "Warp-level matrix load instruction: ldmatrix"); groupID = lane >> 2, threadID_in_group
// (t below) = lane % 4.
#ifndef TG_PTX_ON_CPU_H
#define TG_PTX_ON_CPU_H

#include "cuda_cpu.h"

// cp.async: the source is read when the copy is issued and lands in shared memory at the
// cp.async.wait_group that retires its group. The destination is poisoned (0xFF: NaN) meanwhile,
// so a thread that reads a tile before the wait and the barrier after it reads NaNs.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
    tg::Fiber* f = tg::current;
    if ((uintptr_t)dst % 16 || (uintptr_t)src % 16)
        tg::fail("cp.async of 16 bytes from %p to %p: both must be 16-byte aligned", src, dst);
    if (!tg::in_shared(dst, 16)) tg::fail("cp.async to %p, not 16 bytes of shared memory", dst);
    if (src_bytes < 0 || src_bytes > 16) tg::fail("cp.async with src-size %d", src_bytes);
    if (f->copies.size() >= 4096) tg::fail("more than 4096 cp.async copies in flight");
    tg::Copy c;
    c.dst = static_cast<unsigned char*>(dst);
    std::memset(c.data, 0, 16);  // src-size < 16: the rest is zero-filled
    if (src_bytes) std::memcpy(c.data, src, src_bytes);
    c.group = -1;
    std::memset(dst, 0xFF, 16);
    f->copies.push_back(c);
}

__device__ __forceinline__ void cp_async_commit() {
    tg::Fiber* f = tg::current;
    for (tg::Copy& c : f->copies)
        if (c.group < 0) c.group = f->groups;
    ++f->groups;  // an empty group counts too
}

// Wait until at most PENDING of the committed groups are still in flight.
template <int PENDING> __device__ __forceinline__ void cp_async_wait() {
    tg::Fiber* f = tg::current;
    const long retire = f->groups - PENDING;  // groups below this number must have landed
    size_t kept = 0;
    for (size_t i = 0; i < f->copies.size(); ++i) {
        tg::Copy& c = f->copies[i];
        if (c.group >= 0 && c.group < retire) std::memcpy(c.dst, c.data, 16);
        else f->copies[kept++] = c;
    }
    f->copies.resize(kept);
}

// ldmatrix .x4: lanes 8i .. 8i+7 give the addresses of the 8 rows (16 bytes each) of matrix i.
// Register i of lane l: without .trans, row l/4 and columns 2(l%4), 2(l%4)+1 of matrix i; with
// .trans the same of the transposed matrix (rows 2(l%4), 2(l%4)+1 at column l/4). The lower
// column is in the low half. The reads are one event: the first lane past the barrier reads for
// the whole warp, before any lane runs on.
template <bool TRANS> __device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* p) {
    const char* what = TRANS ? "ldmatrix.x4.trans" : "ldmatrix.x4";
    if ((uintptr_t)p % 16) tg::fail("%s: row address %p is not 16-byte aligned", what, p);
    if (!tg::in_shared(p, 16)) tg::fail("%s: row address %p is not 16 bytes of shared memory", what, p);
    tg::my_slot().v[0] = (unsigned long long)(uintptr_t)p;
    const int parity = tg::warp_arrive(0xffffffffu, what);
    tg::Warp& w = tg::warps[tg::current->warp];
    if (w.result_gen[parity] != tg::current->wgen) {
        for (int l = 0; l < 32; ++l)
            for (int i = 0; i < 4; ++i) {
                unsigned halves[2];
                for (int j = 0; j < 2; ++j) {
                    const int row = TRANS ? 2 * (l % 4) + j : l / 4, col = TRANS ? l / 4 : 2 * (l % 4) + j;
                    const unsigned short* rowp =
                        reinterpret_cast<const unsigned short*>(w.slot[parity][8 * i + row].v[0]);
                    halves[j] = rowp[col];
                }
                w.result[parity][l][i] = halves[0] | (halves[1] << 16);
            }
        w.result_gen[parity] = tg::current->wgen;
    }
    for (int i = 0; i < 4; ++i) r[i] = w.result[parity][tg::current->lane][i];
}

namespace tg {

inline float element(unsigned short bits, __half) { return __half2float(__half{bits}); }
inline float element(unsigned short bits, __nv_bfloat16) { return __bfloat162float(__nv_bfloat16{bits}); }

// D (16x8, fp32) = A (16x16, row) B (16x8, col) + C for the warp. Fragments (i: element index
// low to high across a lane's registers, two 16-bit elements per register):
//   A a0..a7: row g for i in {0,1,4,5}, g+8 otherwise; column 2t + (i&1), + 8 for i >= 4
//   B b0..b3: row (k) 2t + (i&1), + 8 for i >= 2; column (n) g
//   C, D c0..c3: row g for i < 2, g+8 otherwise; column 2t + (i&1)
// Products of two f16 or bf16 values are exact in fp32; they are added to C in k order, each
// sum rounded to fp32 (the tensor core's internal order and rounding are not specified).
template <class T> inline void mma_m16n8k16(float (&d)[4], const unsigned (&a)[4], const unsigned* b) {
    unsigned c[4];
    std::memcpy(c, d, 16);
    const unsigned regs[10] = {a[0], a[1], a[2], a[3], b[0], b[1], c[0], c[1], c[2], c[3]};
    Slot& s = my_slot();  // the lane's registers: a0..a3, b0, b1, c0..c3, two to a word
    for (int i = 0; i < 5; ++i) s.v[i] = regs[2 * i] | (unsigned long long)regs[2 * i + 1] << 32;
    const int parity = warp_arrive(0xffffffffu, "mma.m16n8k16");
    Warp& w = warps[current->warp];
    if (w.result_gen[parity] != current->wgen) {
        float A[16][16], B[16][8], C[16][8];
        for (int l = 0; l < 32; ++l) {
            const int g = l >> 2, t = l % 4;
            const Slot& ls = w.slot[parity][l];
            const auto reg_of = [&](int r) { return unsigned(ls.v[r / 2] >> (32 * (r % 2))); };
            for (int i = 0; i < 8; ++i) {
                const unsigned reg = reg_of(i / 2);
                const int row = g + ((i % 4) >= 2 ? 8 : 0), col = 2 * t + (i & 1) + (i >= 4 ? 8 : 0);
                A[row][col] = element((unsigned short)(reg >> (16 * (i & 1))), T());
            }
            for (int i = 0; i < 4; ++i) {
                const unsigned reg = reg_of(4 + i / 2);
                B[2 * t + (i & 1) + (i >= 2 ? 8 : 0)][g] = element((unsigned short)(reg >> (16 * (i & 1))), T());
            }
            for (int i = 0; i < 4; ++i)
                C[g + (i >= 2 ? 8 : 0)][2 * t + (i & 1)] = tg_float(reg_of(6 + i));
        }
        for (int l = 0; l < 32; ++l) {
            const int g = l >> 2, t = l % 4;
            for (int i = 0; i < 4; ++i) {
                const int row = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
                float acc = C[row][col];
                for (int k = 0; k < 16; ++k) acc += A[row][k] * B[k][col];
                w.result[parity][l][i] = tg_bits(acc);
            }
        }
        w.result_gen[parity] = current->wgen;
    }
    for (int i = 0; i < 4; ++i) d[i] = tg_float(w.result[parity][current->lane][i]);
}

}  // namespace tg

__device__ __forceinline__ void mma16816(float (&d)[4], const unsigned (&a)[4], const unsigned* b, __half) {
    tg::mma_m16n8k16<__half>(d, a, b);
}
__device__ __forceinline__ void mma16816(float (&d)[4], const unsigned (&a)[4], const unsigned* b,
                                         __nv_bfloat16) {
    tg::mma_m16n8k16<__nv_bfloat16>(d, a, b);
}

#endif  // TG_PTX_ON_CPU_H
