"""The backend contract: every kernel a backend provides, declared once.

Each kernel is a stub below: its name, its signature and a docstring saying what it takes and
returns, decorated with how a launch of it is counted. backend/cpu and backend/cuda define a
function of the same name and signature in the module of its family (backend/cpu/gemm.py,
backend/cuda/gemm.py beside gemm.cu, ...); tests/test_backend_contract.py holds them to it.
kernels.launch counts every launch from these records, accounting/roofline.py bounds kernels by
their exps, and the report names kernels by family.

How a launch is counted (kernels.py):
- flops(result, *args, **kwargs), from the shapes: a GEMM counts one multiply and one add per term
  (2 M K N, plus M N for a fused bias); elementwise and row kernels count arithmetic per element
  (exp, tanh and sqrt count as 1); data movement (gathers, casts, copies) counts 0 and only bytes.
- exps(result, *args, **kwargs): exp / tanh evaluations, which on a CPU can bound a kernel of their
  own (one per element or score exponentiated; a log or sqrt per row is left out).
- bytes: every array argument read once and every new output written once, corrected by
  `writes` (argument positions written in place), `skips` (argument positions not read) and
  `reads` (bytes read, for a kernel that reads only part of an argument).

Adding a kernel: its stub here, its CPU function, its CUDA function (and .cu code), its meta
function, its op (or the module that launches it, as nn/lm.py's KVCache).
The HOST functions at the end are the rest of a backend: called directly, never counted.
"""

import builtins  # `sum` below is a kernel's stub
from dataclasses import dataclass
from importlib import import_module
from typing import Callable

# The flash kernels' blocks of queries and of keys. FLOPs count the scores these blocks compute,
# so both backends use them: backend/cpu/attention.py, and attention.cu's tile<float> (64).
FLASH_BQ = 64
FLASH_BK = 64


@dataclass(frozen=True)
class Kernel:
    name: str
    family: str  # the backend module (and .cu file) it lives in
    signature: Callable  # the stub: parameters and docstring
    flops: Callable = None  # (result, *args, **kwargs) -> FLOPs; None: 0
    exps: Callable = None  # (result, *args, **kwargs) -> exp/tanh evaluations; None: 0
    writes: tuple = ()  # argument positions written in place
    skips: tuple = ()  # argument positions not read
    reads: Callable = None  # (outs, *args, **kwargs) -> bytes read; None: from skips


KERNELS = {}  # name -> Kernel, in declaration order (family by family)


def kernel(family, **counting):
    """Declare the stub below as a kernel of `family`, counted as `counting` says."""

    def declare(stub):
        KERNELS[stub.__name__] = Kernel(stub.__name__, family, stub, **counting)
        return stub

    return declare


def _per_element(n, of=0):
    """n per element of argument `of` (0 = the first input)."""
    return lambda result, *args, **kw: n * args[of].size


def _per_output(result, *args, **kw):
    """One per output element (binary ops, whatever broadcast their inputs)."""
    return result.size


def flash_scores(q, k):
    """Scores the flash kernels compute for q (B, H, Tq, D), k (B, Hkv, Tk, D): each block of
    FLASH_BQ queries of each of the H query heads against the keys up to its last query's
    position (per query head: grouped-query attention, Hkv < H, computes as many as Hkv = H).
    The masked corner of each diagonal block is computed and counted; the key blocks after a
    query block are skipped and not counted."""
    (B, H, Tq, _), Tk, bq = q.shape, k.shape[-2], FLASH_BQ
    return (
        B
        * H
        * builtins.sum(min(bq, Tq - i) * (Tk - Tq + min(i + bq, Tq)) for i in range(0, Tq, bq))
    )


def _classes(logits, n_classes):
    """Elements of the logits' first n_classes columns: a padded vocabulary's columns past
    n_classes are neither computed nor read."""
    return logits[:, :n_classes].size


def _logits_read(outs, logits, *rest, n_classes=None, out=None):
    return logits[:, :n_classes].nbytes + builtins.sum(
        a.nbytes for a in rest if hasattr(a, "nbytes")
    )


# ---------------------------------------------------------------- gemm
# A linear layer Y = X W (W stored [in, out], as GPT-2's checkpoints) runs three GEMMs of the
# same cost 2 M K N: forward X W (matmul), backward dX = dY W^T (matmul_nt) and dW = X^T dY
# (matmul_tn). Each is C (M, N) = op(A) (M, K) op(B) (K, N), op a transpose of the operand's
# last two axes where the name says t. Leading dimensions are batch dimensions (B, H).


@kernel(
    "gemm", flops=lambda r, a, b, bias=None: 2 * r.size * a.shape[-1] + (bias is not None) * r.size
)
def matmul(a, b, bias=None):
    """(..., M, K) @ (..., K, N) [+ bias (N,)] -> (..., M, N)."""


@kernel("gemm", flops=lambda r, a, b: 2 * r.size * a.shape[-1])
def matmul_nt(a, b):
    """(..., M, K) @ (..., N, K)^T -> (..., M, N)."""


@kernel("gemm", flops=lambda r, a, b: 2 * r.size * a.shape[-2])
def matmul_tn(a, b):
    """(..., K, M)^T @ (..., K, N) -> (..., M, N)."""


# ---------------------------------------------------------------- quant
# Quantized weights for inference (tinygrad_like/quant.py holds the formats, the quantizer and
# the NumPy reference). A quantized weight W (N, K) is stored with one row per output channel
# (the row a GEMV streams): codes (N, K) uint8 for the 8-bit formats, (N, K/2) uint8 for the
# 4-bit ones (element 2j in the low nibble, 2j + 1 in the high one), (N, K) uint16 bit patterns
# for bf16 / fp16; scales (N, K / group_size) fp32, one per group of a row (group_size = K: one
# per output channel), None for bf16 / fp16. fmt is one of quant.FORMATS' names. The kernels
# decode each code in registers as they read it: there is never a dequantized copy of W.


def _quantized_row_bytes(codes, scales):
    """Bytes of one stored row: its codes and its scales."""
    return codes[0].nbytes + (scales[0].nbytes if scales is not None else 0)


@kernel(
    "quant",
    flops=lambda r, x, codes, scales, fmt, group_size, bias=None: (
        2 * r.size * x.shape[-1] + (bias is not None) * r.size
    ),
)
def qmatmul(x, codes, scales, fmt, group_size, bias=None):
    """x (M, K) @ W^T (+ bias (N,)) -> (M, N) in x's dtype, W (N, K) decoded from codes and
    scales inside the kernel (w = code value x its group's scale), fp32 accumulation."""


@kernel(
    "quant",
    skips=(0, 1),
    reads=lambda outs, codes, scales, idx, fmt, group_size: (
        idx.nbytes + idx.size * _quantized_row_bytes(codes, scales)
    ),
)
def qembedding(codes, scales, idx, fmt, group_size):
    """Rows idx (...) int in [0, N) of a quantized table W (N, K) -> (..., K) fp32, decoded:
    a gather that reads only the rows it decodes."""


# ---------------------------------------------------------------- kvcache
# A KV cache in an 8-bit float format (nn/lm.py KVCache, inference only). Keys and values
# (B, Hkv, L, D) are stored as codes (B, Hkv, L, D) uint8 of fmt, one of KV_FORMATS
# (tinygrad_like/quant.py FORMATS), and scales (B, Hkv, L) fp32, one per row of D (a position
# of a kv head): the row's max |x| over the format's qmax (1 for an all-zero row), an element
# being its code's value x its row's scale, as quant.quantize scales a weight's output channel.
# kv_quantize makes the rows of the positions appended; qattention reads the cache's first
# `length` positions and decodes each code as it reads it: there is never a dequantized copy.

KV_FORMATS = ("fp8_e4m3", "fp8_e5m2")


def causal_pairs(Tq, length):
    """(query, key) pairs of a causal attention of Tq queries over `length` keys, query i at
    position length - Tq + i seeing keys 0 ... that position."""
    return Tq * (length - Tq) + Tq * (Tq + 1) // 2


def _kv_scores(q, length):
    """Scores qattention computes for q (B, H, Tq, D): the causal pairs of each query head."""
    return q.shape[0] * q.shape[1] * causal_pairs(q.shape[2], length)


def _kv_read(outs, q, k_codes, k_scales, v_codes, v_scales, fmt, length, scale):
    """q, and the codes and scales of the first `length` positions of K and V."""
    B, Hkv, _, D = k_codes.shape
    return q.nbytes + 2 * B * Hkv * length * (D * k_codes.itemsize + k_scales.itemsize)


@kernel("kvcache", flops=_per_element(2))
def kv_quantize(x, fmt):
    """x (..., D) float -> codes (..., D) uint8 and scales (...) fp32 of fmt (KV_FORMATS), one
    scale per row: max |x| / qmax (1 for an all-zero row); a code is x / scale rounded to fmt
    (to nearest, ties to even) within +-qmax: quant.quantize's codes and scales of the rows as
    a weight of one scale per output channel, bit for bit. In fp32 (fp64 x rounded to it).
    2 FLOPs per element: the max and the divide."""


@kernel(
    "kvcache",
    # per (query head, query, key) pair: q k and p v (2 D each), the online softmax (5) and the
    # two row scales (of the key's score, of the value's weight)
    flops=lambda r, q, kc, ks, vc, vs, fmt, length, scale: (
        (4 * q.shape[-1] + 7) * _kv_scores(q, length)
    ),
    exps=lambda r, q, kc, ks, vc, vs, fmt, length, scale: _kv_scores(q, length),
    reads=_kv_read,
)
def qattention(q, k_codes, k_scales, v_codes, v_scales, fmt, length, scale):
    """Causal attention of q (B, H, Tq, D) over the first `length` positions of an fp8 cache
    (codes (B, Hkv, L, D) uint8, scales (B, Hkv, L) fp32 for K and for V, fmt of KV_FORMATS),
    Tq <= length <= L, H a multiple of Hkv -> out (B, H, Tq, D) in q's dtype =
    softmax(scale q K^T, future keys masked) V, query i at position length - Tq + i, query head
    h against kv head h // (H / Hkv); K and V decoded inside the kernel, fp32 accumulation."""


# ---------------------------------------------------------------- elementwise
# Binary ops broadcast as NumPy does (either side may be a Python scalar); out, when given, is
# written in place. Data movement counts bytes only.


@kernel("elementwise", flops=_per_output)
def add(a, b, out=None):
    """a + b."""


@kernel("elementwise", flops=_per_output)
def sub(a, b, out=None):
    """a - b."""


@kernel("elementwise", flops=_per_output)
def mul(a, b, out=None):
    """a * b."""


@kernel("elementwise", flops=_per_output)
def div(a, b, out=None):
    """a / b."""


@kernel("elementwise", flops=_per_element(1))
def neg(a):
    """-a."""


# ---- div's gradient, the unary ops, max (PyTorch's names)


@kernel("elementwise", flops=_per_output)
def div_bwd(a, b, dy):
    """-dy a / b^2, the gradient of a / b with respect to b (dy's shape: broadcast), computed
    as -(dy (a / b)) / b in fp32 for 2-byte operands and rounded once (b * b in fp16 overflows
    for |b| >= 256). a may be a Python scalar. 4 FLOPs per output."""


# The unary ops: one kernel pair, the op named by its PyTorch name. op -> (forward FLOPs,
# forward exps, backward FLOPs, backward exps) per element; the backward recomputes op(x) from
# x where its derivative needs it (exp, tanh, sigmoid, silu), so it counts that again. A log
# per element counts as an exp (one transcendental each); sqrt as a FLOP, as above.
UNARY_OPS = {
    "exp": (1, 1, 2, 1),  # exp(x); dy exp(x)
    "log": (1, 1, 1, 0),  # log(x); dy / x
    "sqrt": (1, 0, 3, 0),  # sqrt(x); dy 0.5 / sqrt(x)
    "rsqrt": (2, 0, 5, 0),  # 1 / sqrt(x); dy -0.5 / sqrt(x) / x
    "tanh": (1, 1, 4, 1),  # tanh(x); dy (1 - t^2)
    "sigmoid": (4, 1, 7, 1),  # s = 1 / (1 + exp(-x)); dy s (1 - s)
    "silu": (5, 1, 9, 1),  # x s; dy s (1 + x (1 - s))
    "relu": (1, 0, 1, 0),  # x > 0 ? x : 0 (NaN stays NaN); x > 0 ? dy : 0
}


def unary_op(op):
    """The index of op in UNARY_OPS (elementwise.cu's UnaryOp), or a ValueError naming them."""
    if op not in UNARY_OPS:
        raise ValueError(f"unknown unary op {op!r}: use one of {', '.join(UNARY_OPS)}")
    return list(UNARY_OPS).index(op)


def _unary(column):
    return lambda r, x, *a, op=None: UNARY_OPS[a[-1] if op is None else op][column] * x.size


@kernel("elementwise", flops=_unary(0), exps=_unary(1))
def unary_fwd(x, op):
    """op(x) elementwise for op in UNARY_OPS, in fp32 for 2-byte x and rounded once."""


@kernel("elementwise", flops=_unary(2), exps=_unary(3))
def unary_bwd(x, dy, op):
    """dx = dy op'(x), op'(x) from the forward's input x."""


@kernel("elementwise", flops=_per_element(1))
def amax(a, axis=None, keepdims=False):
    """The max over axes (NaN if any is NaN), in a's dtype."""


@kernel("elementwise", flops=_per_element(1))
def argmax(a, axis):
    """int64 index of the first max along axis (a NaN counts as the max), axis kept (size 1)."""


@kernel("elementwise", flops=_per_element(3))
def amax_bwd(x, y, dy, axis):
    """Gradient of amax over axis: dx = dy (x == y) / count(x == y over axis), spread evenly
    over ties as PyTorch's amax; y and dy keep the reduced axes (size 1). In fp32 for 2-byte
    x, rounded once."""


@kernel("elementwise")
def max_bwd(dy, idx, shape, axis):
    """Gradient of max along axis with indices idx: zeros of shape with dy at idx (dy and idx
    keep the axis, size 1)."""


@kernel("elementwise", flops=_per_element(8), exps=_per_element(1))
def gelu_fwd(x):
    """GPT-2's GELU, tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). One tanh per
    element."""


@kernel("elementwise", flops=_per_element(16), exps=_per_element(1))
def gelu_bwd(x, dy):
    """dx = dy GELU'(x), the forward's tanh recomputed."""


@kernel("elementwise", flops=_per_element(2))
def dropout_fwd(x, p, seed):
    """Inverted dropout: -> (y, mask), mask in x's dtype holding 0 or 1/(1-p)."""


@kernel("elementwise")
def contiguous(a):
    """A C-contiguous copy (reshaping a transposed view needs one; explicit so it counts)."""


@kernel("elementwise")
def cast(a, dtype):
    """a in another dtype."""


@kernel("elementwise", writes=(0,), skips=(0,))
def copy(dst, src):
    """dst[...] = src, in place (dst may be a view, e.g. a slice of a KV cache) -> dst."""


@kernel("elementwise", writes=(0,), skips=(0,))
def fill(dst, value):
    """dst[...] = value, in place -> dst."""


@kernel("elementwise")
def concat(arrays, axis):
    """The arrays joined along axis."""


@kernel("elementwise")
def index_bwd(dy, shape, index):
    """Gradient of x[index] for a basic index (ints, slices, None, ...: no element hit twice):
    zeros of x's shape with dy written at index."""


@kernel("elementwise", flops=_per_element(1))
def sum(a, axis=None, keepdims=False):
    """Sum over axes, accumulated in fp32 (fp64 for fp64), result in a's dtype."""


@kernel("elementwise", flops=_per_element(5), exps=_per_element(1))
def swiglu_fwd(gate, up):
    """Llama's SwiGLU: silu(gate) * up = gate sigmoid(gate) up, gate and up of one shape. One
    exp per element."""


@kernel("elementwise", flops=_per_element(11), exps=_per_element(1))
def swiglu_bwd(gate, up, dy):
    """-> (dgate, dup): dgate = dy up s (1 + gate (1 - s)), dup = dy gate s, s = sigmoid(gate)
    recomputed."""


# ---------------------------------------------------------------- rownorm


@kernel("rownorm", flops=_per_element(8))
def layernorm_fwd(x, weight, bias, eps=1e-5):
    """x (..., C) -> y (..., C), mean (...,) and rstd (...,) in fp32 (saved for backward)."""


@kernel("rownorm", flops=_per_element(12, of=1))
def layernorm_bwd(dy, x, weight, mean, rstd):
    """-> dx (..., C), dweight (C,), dbias (C,)."""


@kernel("rownorm", flops=_per_element(4))
def rmsnorm_fwd(x, weight, eps=1e-6):
    """x (..., C) -> y (..., C) = x rstd weight, and rstd (...,) fp32 = 1 / sqrt(mean(x^2) + eps)
    (saved for backward). Llama's RMSNorm: no mean subtracted, no bias."""


@kernel("rownorm", flops=_per_element(9, of=1))
def rmsnorm_bwd(dy, x, weight, rstd):
    """-> dx (..., C), dweight (C,)."""


# ---------------------------------------------------------------- softmax
# The naive attention's softmax, and cross-entropy over (N, Vp) logits whose columns past
# V = n_classes are padding. Targets are int64, -1 = ignored (0 loss, 0 gradient).


@kernel("softmax", flops=_per_element(5), exps=_per_element(1))
def softmax_causal_fwd(scores, scale):
    """scores (..., Tq, Tk) -> probs of softmax(scale * scores) over keys, future keys masked.
    Query i is position Tk - Tq + i, so Tq < Tk serves a KV-cache decode step. One exp per
    score, masked ones included."""


@kernel("softmax", flops=_per_element(4))
def softmax_causal_bwd(probs, dprobs, scale):
    """dscores = scale * probs * (dprobs - sum(dprobs * probs over keys))."""


@kernel(
    "softmax",
    flops=lambda r, logits, *a, n_classes=None: 4 * _classes(logits, n_classes),
    exps=lambda r, logits, *a, n_classes=None: _classes(logits, n_classes),
    reads=_logits_read,
)
def cross_entropy_fwd(logits, targets, n_classes=None):
    """logits (N, Vp), targets (N,) -> losses (N,) fp32 (0 if ignored), lse (N,) fp32: each
    row's log-sum-exp, saved for backward."""


@kernel(
    "softmax",
    flops=lambda r, logits, *a, n_classes=None: 4 * _classes(logits, n_classes),
    exps=lambda r, logits, *a, n_classes=None: _classes(logits, n_classes),
    reads=_logits_read,
)
def cross_entropy_bwd(logits, lse, targets, dloss, n_classes=None):
    """dlogits (N, Vp) = dloss * (softmax(logits) - onehot(target)), 0 in the padding columns
    and the ignored rows; dloss (1,) is the upstream gradient over the count of targets."""


@kernel(
    "softmax",  # max, subtract, exp, sum, scale: the backward's subtract and exp are the forward's
    flops=lambda r, logits, *a, n_classes=None, out=None: 5 * _classes(logits, n_classes),
    exps=lambda r, logits, *a, n_classes=None, out=None: _classes(logits, n_classes),
    reads=_logits_read,
)
def cross_entropy_fwd_bwd(logits, targets, dloss, n_classes=None, out=None):
    """cross_entropy_fwd's losses and cross_entropy_bwd's dlogits in one pass -> (losses (N,)
    fp32, dlogits (N, Vp)); dlogits are written into out when given (which may be logits)."""


# softmax and log_softmax over the last axis of (..., C) rows (ops moves the dim last).


@kernel("softmax", flops=_per_element(5), exps=_per_element(1))
def softmax_fwd(x):
    """x (..., C) -> softmax over the last axis: exp(x - max) / sum(exp(x - max))."""


@kernel("softmax", flops=_per_element(4))
def softmax_bwd(y, dy):
    """dx = y (dy - sum(dy y over the row)), from the forward's output y."""


@kernel("softmax", flops=_per_element(5), exps=_per_element(1))
def log_softmax_fwd(x):
    """x (..., C) -> x - max - log(sum(exp(x - max))) over the last axis (a log per row, left
    out of the exps)."""


@kernel("softmax", flops=_per_element(4), exps=_per_element(1))
def log_softmax_bwd(y, dy):
    """dx = dy - exp(y) sum(dy over the row), from the forward's output y."""


# ---------------------------------------------------------------- attention
# Per computed score (flash_scores): forward QK^T and PV (2D + 2D) + 5 for the online softmax;
# backward QK^T again, dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q (5 x 2D) + 4 for P and dS.
# Grouped-query attention: k, v (and dk, dv) have Hkv heads, a divisor of q's H, query head h
# reading kv head h // (H / Hkv): FLOPs count per query head, bytes count k and v as they are.


@kernel(
    "attention",
    flops=lambda r, q, k, *a: (4 * q.shape[-1] + 5) * flash_scores(q, k),
    exps=lambda r, q, k, *a: flash_scores(q, k),
)
def flash_attention_fwd(q, k, v, scale):
    """q (B, H, Tq, D), k and v (B, Hkv, Tk, D), Tk >= Tq, H a multiple of Hkv -> out
    (B, H, Tq, D) = softmax(scale q k^T, future keys masked) v with query head h against kv head
    h // (H / Hkv), and lse (B, H, Tq) fp32 (fp64 for fp64), saved for backward."""


@kernel(
    "attention",
    flops=lambda r, q, k, *a: (10 * q.shape[-1] + 4) * flash_scores(q, k),
    exps=lambda r, q, k, *a: flash_scores(q, k),  # P recomputed from lse
)
def flash_attention_bwd(q, k, v, out, lse, dout, scale):
    """-> dq (B, H, Tq, D), dk and dv (B, Hkv, Tk, D) (summed over the query heads of each kv
    head) of flash_attention_fwd, from its inputs, its out and lse, and dout."""


# ---------------------------------------------------------------- embedding


@kernel("embedding", skips=(0,), reads=lambda outs, weight, idx: idx.nbytes + outs[0].nbytes)
def embedding_fwd(weight, idx):
    """weight (V, C), idx (...) int in [0, V) -> (..., C): a gather (reads only the rows it
    copies)."""


@kernel("embedding", flops=_per_element(1))
def embedding_bwd(dout, idx, num_embeddings):
    """dout (..., C) -> dweight (V, C), rows of repeated ids summed in a fixed order."""


# ---------------------------------------------------------------- rotary
# Rotary position embeddings, Hugging Face Llama's rotate-half convention: a head's D channels
# are D/2 pairs (i, i + D/2), each turned by the angle of its frequency at the token's position.
# The tables cos, sin (T, D/2) are in the compute dtype (fp32, fp64 for fp64), one row per
# position of x; a KV-cache decode step passes the rows of its positions.


@kernel("rotary", flops=_per_element(3))
def rotary_fwd(x, cos, sin):
    """x (B, H, T, D) -> y (B, H, T, D): with x1 = x[..., :D/2], x2 = x[..., D/2:],
    y1 = x1 cos - x2 sin, y2 = x2 cos + x1 sin, computed in fp32 and rounded once."""


@kernel("rotary", flops=_per_element(3))
def rotary_bwd(dy, cos, sin):
    """dx of rotary_fwd (the inverse turn): dx1 = dy1 cos + dy2 sin, dx2 = dy2 cos - dy1 sin."""


# ---------------------------------------------------------------- adamw


@kernel("adamw", flops=_per_element(2))
def grad_norm_sq(grad):
    """Sum of squares of a flat gradient buffer in fp32 -> (1,); not finite on overflow."""


# master, m, v and the working copy written in place; the working copy is only written (from
# master), not read: 28 bytes per parameter for a 2-byte dtype (read 4 + 2 + 4 + 4, write
# 4 + 4 + 4 + 2), the lecture's "roughly 28 bytes per parameter".
@kernel("adamw", flops=_per_element(12), writes=(0, 2, 3, 4), skips=(4,))
def adamw_step(
    master,
    grad,
    m,
    v,
    working,
    norm_sq,
    *,
    lr,
    beta1,
    beta2,
    eps,
    weight_decay,
    n_decay,
    step,
    inv_scale,
    max_norm,
):
    """One fused AdamW update over flat buffers, in place; skipped when norm_sq is not finite."""


# ---------------------------------------------------------------- host functions (not counted)

HOST = {}  # name -> stub


def host(stub):
    HOST[stub.__name__] = stub
    return stub


@host
def supported_dtypes():
    """The dtype names the backend trains in."""


@host
def asarray(data, dtype=None):
    """Host data (NumPy arrays, lists) as an array of this device: a host-to-device copy."""


@host
def to_numpy(a):
    """An array of this device as a NumPy array: a device-to-host copy (waits for it)."""


@host
def empty(shape, dtype):
    """An uninitialized array of this device."""


@host
def synchronize():
    """Wait for every launch so far."""


@host
def start_timer():
    """A timer started now, with .stop() and .seconds()."""


def implement(package, namespace):
    """Fill a backend package's namespace with its functions for the contract: each kernel from
    the module of its family (package.gemm, ...), each host function from package.runtime. A
    missing one fails here, at import, naming where it belongs."""
    for name, where in [(k.name, k.family) for k in KERNELS.values()] + [
        (n, "runtime") for n in HOST
    ]:
        module = import_module(f"{package}.{where}")
        if not hasattr(module, name):
            raise ImportError(f"{package}.{where} has no {name}, which the contract declares")
        namespace[name] = getattr(module, name)


# ---------------------------------------------------------------- checks both backends run


def check_ids(idx, num_embeddings):
    """Raise ValueError unless every id is in [0, num_embeddings): NumPy would wrap a negative id
    around and raise IndexError for a large one, a CUDA kernel would read or write out of bounds.
    On CuPy min and max are device reductions whose results int() reads back (a host sync)."""
    if idx.size:
        lo, hi = int(idx.min()), int(idx.max())
        if lo < 0 or hi >= num_embeddings:
            bad = lo if lo < 0 else hi
            raise ValueError(f"token id {bad} out of range for vocab {num_embeddings}")


def check_targets(targets, n_classes):
    """Raise ValueError unless every target is -1 (ignored) or in [0, n_classes): the kernels
    index each row with it, past the row's end (CUDA) or, in a padded row, at a padding column."""
    if targets.size:
        lo, hi = int(targets.min()), int(targets.max())
        if lo < -1 or hi >= n_classes:
            raise ValueError(
                f"target id {lo if lo < -1 else hi} out of range for vocab {n_classes}"
            )


def check_kv_format(fmt):
    """Raise ValueError unless fmt is one of KV_FORMATS (the kernels' template arguments)."""
    if fmt not in KV_FORMATS:
        raise ValueError(f"a KV cache in {fmt!r}: the quantized ones are {', '.join(KV_FORMATS)}")


def check_kv_attention(q, k_codes, k_scales, v_codes, v_scales, fmt, length):
    """Raise ValueError unless qattention's arguments fit (the kernels index the cache by these
    shapes, with no bounds check): fmt one of KV_FORMATS, q (B, H, Tq, D), codes (B, Hkv, L, D)
    and scales (B, Hkv, L) alike for K and V, H a multiple of Hkv, Tq <= length <= L."""
    check_kv_format(fmt)
    shapes = (
        f"qattention: q {q.shape}, codes {k_codes.shape} and {v_codes.shape}, scales "
        f"{k_scales.shape} and {v_scales.shape}, length {length}"
    )
    if q.ndim != 4 or k_codes.ndim != 4 or k_codes.shape != v_codes.shape:
        raise ValueError(f"{shapes}: need q (B, H, Tq, D) and codes (B, Hkv, L, D) for K and V")
    B, H, Tq, D = q.shape
    _, Hkv, L, _ = k_codes.shape
    if (
        k_codes.shape[0] != B
        or k_codes.shape[3] != D
        or not Hkv
        or H % Hkv
        or k_scales.shape != (B, Hkv, L)
        or v_scales.shape != (B, Hkv, L)
        or not Tq <= length <= L
    ):
        raise ValueError(
            f"{shapes}: need codes (B, Hkv, L, D) with H a multiple of Hkv, scales (B, Hkv, L) "
            "and Tq <= length <= L"
        )
