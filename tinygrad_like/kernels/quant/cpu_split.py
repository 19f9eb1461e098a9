"""How the quantized GEMMs (cpu.py's qmatmul, cpu_int8x.py's qmatmul_int8x) split over the
cores: rows of W a block of BLOCK_ROWS per prange iteration (quant.cu gives each row a block or a
warp), and one core below SERIAL_BELOW of work (compiled.kernel's rule, scaled by the thread
pool's hand-off cost)."""

BLOCK_ROWS = 8  # rows of W per prange iteration

# Below this much work (work()) a qmatmul runs on one core: a parallel launch costs 60-100 us,
# and two cores streaming weights from memory share its bandwidth. Measured (AMD EPYC family 25
# model 1, 2 vCPUs, M = 1, K = 768, us serial / parallel), weights from memory (40 matrices in
# turn): int4 0.88M codes 298 / 343, 1.18M 397-436 / 481-562; int8 2.36M 180-191 / 255-290;
# bf16 2.36M 436-469 / 503-565; the LM head (38.6M codes, repeated): int8 2,959 / 1,572, bf16
# 6,066 / 2,557, int4 (19.3M) 6,491 / 3,282.
SERIAL_BELOW = 1 << 22
DECODE_ONCE_FROM = 4  # rows of x from which a row of W is decoded once, not at every row


def work(codes, scales, group, x, *rest):
    """A quantized GEMM's work for compiled.kernel's one-core rule (its kernels' arguments
    begin codes, scales, the group size or each block's group, x): its codes, times x's rows
    when each row of W is dotted with them all (from DECODE_ONCE_FROM rows: a prompt)."""
    return codes.size * (x.shape[0] if x.shape[0] >= DECODE_ONCE_FROM else 1)
