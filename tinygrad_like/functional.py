"""The functional API, PyTorch's names and signatures (torch.nn.functional's and torch's), over
the Functions of functions.py, attention.py and losses.py: each checks its operands in PyTorch's
words, then applies one Function. Tensor's operators and methods are these functions (set on
Tensor at the end of this module, so that tensor.py needs no op).
"""

import builtins  # `sum` and `max` below are ops
import math
from collections import namedtuple

import numpy as np

from . import backend, dtypes, kernels, rng
from .attention import scaled_dot_product_attention  # noqa: F401 (F.scaled_dot_product_attention)
from .autograd import is_grad_enabled
from .functions import (
    _UNARY,
    GELU,
    Add,
    Amax,
    Cast,
    Concat,
    Div,
    Dropout,
    Embedding,
    GetItem,
    LayerNorm,
    Linear,
    LogSoftmax,
    MatMul,
    Max,
    Mul,
    Neg,
    Permute,
    Reshape,
    RMSNorm,
    Rotary,
    Softmax,
    Split,
    Sub,
    Sum,
    SwiGLU,
    _matrix,
)
from .kernels import launch
from .losses import (  # noqa: F401 (F.cross_entropy, ...)
    HEAD_DESIGNS,
    cross_entropy,
    linear_cross_entropy,
)
from .quant import QuantizedWeight
from .rng import get_rng_state, manual_seed, set_rng_state  # noqa: F401 (F.manual_seed, ...)
from .tensor import Tensor


def _operand(x, like):
    """Tensors and Python scalars pass through; other array-likes become constant Tensors."""
    if isinstance(x, np.generic):  # a NumPy scalar acts like the Python number it holds
        return x.item()
    if isinstance(x, (Tensor, int, float)):
        return x
    return Tensor(x, device=like.device)


def _binary(fn, a, b):
    like = a if isinstance(a, Tensor) else b
    return fn.apply(_operand(a, like), _operand(b, like))


def add(a, b):
    return _binary(Add, a, b)


def sub(a, b):
    return _binary(Sub, a, b)


def mul(a, b):
    return _binary(Mul, a, b)


def div(a, b):
    return _binary(Div, a, b)


def neg(x):
    return Neg.apply(x)


def cast(x, dtype):
    return Cast.apply(x, dtypes.as_dtype(dtype))


def reshape(x, shape):
    return Reshape.apply(x, shape, True)


def view(x, shape):
    return Reshape.apply(x, shape, False)


# ---- dims, as PyTorch takes them


def _dim(dim, ndim):
    """dim in [-ndim, ndim - 1] wrapped into [0, ndim), as PyTorch (a 0-d tensor takes -1 and
    0 as if it had one dim); anything else is an IndexError in PyTorch's words."""
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)):
        raise TypeError(f"dim must be an int, got {dim!r}")
    n = builtins.max(ndim, 1)
    if not -n <= dim < n:
        raise IndexError(
            f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {dim})"
        )
    return int(dim) % n


def _dims(dims, ndim):
    """Each of dims normalized (_dim), none repeated."""
    out = [_dim(d, ndim) for d in dims]
    for d in out:
        if out.count(d) > 1:
            raise ValueError(f"dim {d} appears multiple times in the list of dims {tuple(dims)}")
    return tuple(out)


def _axes(dim, ndim):
    """The axes a reduction over dim covers: every axis for None or () (PyTorch's meaning;
    NumPy's () reduces none), else the dims normalized (_dims). A 0-d tensor's dim 0 or -1
    covers no axis."""
    if dim is None or (isinstance(dim, (tuple, list)) and not dim):
        return tuple(range(ndim))
    return tuple(
        d for d in _dims(dim if isinstance(dim, (tuple, list)) else (dim,), ndim) if d < ndim
    )


def _reduction(dim, keepdim, axis, keepdims):
    """PyTorch's (dim, keepdim), also given as NumPy's (axis, keepdims), the names sum and mean
    took first."""
    if axis is not None:
        if dim is not None:
            raise TypeError("give dim or axis, not both")
        dim = axis
    return dim, keepdim if keepdims is None else keepdims


def _floating(fn, x):
    if not dtypes.is_float(x.dtype):
        raise TypeError(f"{fn}: needs a floating-point tensor, got {x.dtype}: cast it first")


def permute(x, dims):
    """torch.permute: the dims reordered (a view); dims lists each dim once."""
    dims = tuple(dims)
    if len(dims) != x.ndim:
        raise ValueError(f"permute: {len(dims)} dims {dims} for a tensor of shape {x.shape}")
    return Permute.apply(x, _dims(dims, x.ndim))


def sum(x, dim=None, keepdim=False, *, axis=None, keepdims=None):
    """torch.sum: over dim (an int or a tuple; None or () sums everything)."""
    dim, keepdim = _reduction(dim, keepdim, axis, keepdims)
    return Sum.apply(x, _axes(dim, x.ndim), keepdim)


def mean(x, dim=None, keepdim=False, *, axis=None, keepdims=None):
    """torch.mean: over dim (an int or a tuple; None or () averages everything); nan over no
    elements, as PyTorch; a floating-point tensor only, as PyTorch (an integer mean has no dtype
    to be in)."""
    _floating("mean", x)
    dim, keepdim = _reduction(dim, keepdim, axis, keepdims)
    axes = _axes(dim, x.ndim)
    n = math.prod(x.shape[a] for a in axes)
    return mul(Sum.apply(x, axes, keepdim), 1.0 / n if n else math.nan)


def var(x, dim=None, correction=1, keepdim=False):
    """torch.var: sum((x - mean)^2) / max(0, n - correction) over dim (None or (): all), by
    default unbiased (correction=1). A composite of mean, sub, mul and sum, each launch
    counted. With n - correction <= 0 it divides by zero as PyTorch does: inf, or nan where the
    sum is 0 (one element)."""
    _floating("var", x)
    axes = _axes(dim, x.ndim)
    d = sub(x, mean(x, axes, keepdim=True))
    s = Sum.apply(mul(d, d), axes, keepdim)
    dof = builtins.max(0, math.prod(x.shape[a] for a in axes) - correction)
    return mul(s, 1.0 / dof if dof else math.inf)


def transpose(x, dim0=-2, dim1=-1):
    """Swap dims dim0 and dim1 (a view). The defaults, the last two dims, are this API's
    (PyTorch's transpose names both)."""
    dim0, dim1 = _dim(dim0, x.ndim), _dim(dim1, x.ndim)
    dims = list(range(x.ndim))
    if x.ndim:
        dims[dim0], dims[dim1] = dims[dim1], dims[dim0]
    return Permute.apply(x, tuple(dims))  # a permutation by construction: permute's checks pass


def getitem(x, index):
    """x[index] for a basic index: ints, slices, None and ... only (a view; its gradient writes
    dy back). Unlike PyTorch, no indexing by tensors, lists or booleans: gather rows with
    embedding()."""
    items = index if isinstance(index, tuple) else (index,)
    if not all(i is None or i is Ellipsis or isinstance(i, (int, slice)) for i in items):
        raise TypeError(
            f"indexing with {index!r}: only ints, slices, None and ... are "
            "supported (views); use embedding() to gather rows by id"
        )
    return GetItem.apply(x, index)


def split(x, split_size, dim=-1):
    """Like torch.split: chunks of split_size (an int) or of the listed sizes along dim. The
    default dim is the last (this API's; PyTorch's is 0)."""
    if x.ndim == 0:
        raise ValueError("split: a 0-d tensor has no dim to split")
    dim = _dim(dim, x.ndim)
    if isinstance(split_size, int) and split_size <= 0:
        raise ValueError(f"split: split_size must be a positive int, got {split_size}")
    n = x.shape[dim]
    sizes = (
        [split_size] * (n // split_size) + ([n % split_size] if n % split_size else [])
        if isinstance(split_size, int)
        else list(split_size)
    )
    if np.sum(sizes) != n or any(k < 0 for k in sizes):
        raise ValueError(f"split: sizes {sizes} do not add up to dimension {dim} of size {n}")
    return Split.apply(x, sizes, dim)


def cat(tensors, dim=0):
    """torch.cat: tensors of one ndim (at least 1), equal but in dim, joined along dim."""
    tensors = list(tensors)
    if not tensors:
        raise ValueError("cat: expected a non-empty list of tensors")
    for i, t in enumerate(tensors):
        if t.ndim == 0:
            raise ValueError(
                f"cat: zero-dimensional tensor (at position {i}) cannot be concatenated"
            )
        if t.ndim != tensors[0].ndim or any(
            n != m
            for k, (n, m) in enumerate(zip(t.shape, tensors[0].shape))
            if k != _dim(dim, t.ndim)
        ):
            raise ValueError(
                f"cat: tensor {i} of shape {t.shape} does not match tensor 0 of shape "
                f"{tensors[0].shape} outside dim {dim}"
            )
    return Concat.apply(*tensors, axis=_dim(dim, tensors[0].ndim))


def matmul(a, b):
    """a (..., M, K) @ b (..., K, N). Unlike torch.matmul, both operands need 2 dims or more
    (no 1-D vector forms) and batch dims must be equal, or one side 2-D (no broadcasting of
    batch dims)."""
    if a.ndim < 2 or b.ndim < 2:
        raise ValueError(f"matmul: {a.shape} @ {b.shape}: both operands need at least 2 dims")
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(
            f"matmul: {a.shape} @ {b.shape}: inner dimensions "
            f"{a.shape[-1]} and {b.shape[-2]} differ"
        )
    if a.ndim > 2 and b.ndim > 2 and a.shape[:-2] != b.shape[:-2]:
        raise ValueError(
            f"matmul: {a.shape} @ {b.shape}: batch dimensions "
            f"{a.shape[:-2]} and {b.shape[:-2]} differ (no batch broadcasting)"
        )
    return MatMul.apply(a, b)


def _check_linear(x, weight, transposed):
    """A ValueError unless x (..., K) meets the weight's K."""
    k = weight.shape[1] if transposed else weight.shape[0]
    if x.shape[-1] != k:
        raise ValueError(
            f"linear: input {x.shape} @ weight {weight.shape}"
            f"{'^T' if transposed else ''}: inner dimensions {x.shape[-1]} and "
            f"{k} differ"
        )


def linear(x, weight, bias=None, transposed=False):
    """x (..., in) @ weight (in, out) + bias (out,): GPT-2's (in, out) layout. With
    transposed=True the weight is (out, in), as PyTorch's nn.Linear and the tied LM head.
    weight may be a QuantizedWeight (inference only): then its out_axis must say the same
    layout (0 for transposed=True, 1 otherwise), and qmatmul decodes it in the kernel."""
    _check_linear(x, weight, transposed)
    if isinstance(weight, QuantizedWeight):
        return _quantized_linear(x, weight, bias, transposed)
    return Linear.apply(x, weight, bias, transposed)


def linears(x, weights, transposed=False):
    """[linear(x, w, transposed=transposed) for w in weights]: the projections of one input
    (Llama's q, k, v; gate and up). Where the weights all meet x in int8 (quantized weights,
    activations "int8"), x is quantized once and its codes shared by their GEMMs: one
    quantize_rows, not one per weight."""
    if not (weights and all(shares_codes(w) for w in weights)):
        return [linear(x, w, transposed=transposed) for w in weights]
    _inference_only("linear", x)
    for w in weights:
        _check_linear(x, w, transposed)
    codes = launch("quantize_rows", _matrix(x.data))
    return [_quantized_linear(x, w, None, transposed, codes) for w in weights]


def shares_codes(weight):
    """Whether weight meets x in int8 codes (quantize_rows'), which linears shares."""
    return isinstance(weight, QuantizedWeight) and weight.activations == "int8"


def _inference_only(what, *tensors):
    """A RuntimeError when the tape would record an op on a quantized weight: it has no
    gradient (and its kernels no backward)."""
    if is_grad_enabled() and any(isinstance(t, Tensor) and t.requires_grad for t in tensors):
        raise RuntimeError(
            f"{what} with a quantized weight is inference only: run it under no_grad() "
            "(quantized weights hold no gradient)"
        )


def _quantized_linear(x, weight, bias, transposed, codes=None):
    """y (..., N) = x (..., K) W^T + bias, W (N, K) the quantized weight's rows, over x
    flattened to (M, K): one qmatmul, or with weight.activations "int8" quantize_rows then
    qmatmul_int8x (y in x's dtype), "bf16" a cast of x to bf16 then qmatmul; codes:
    quantize_rows' of x, made already (linears)."""
    if weight.out_axis != (0 if transposed else 1):
        raise ValueError(
            f"linear: a quantized weight stored with out_axis {weight.out_axis} used as "
            f"{'(out, in)' if transposed else '(in, out)'}: quantize it with out_axis "
            f"{0 if transposed else 1}"
        )
    _inference_only("linear", x, bias)
    x2, b = _matrix(x.data), None if bias is None else bias.data
    w = (weight.codes, weight.scales, weight.fmt, weight.group_size)
    if weight.activations == "int8":
        codes = launch("quantize_rows", x2) if codes is None else codes
        y = launch("qmatmul_int8x", *codes, *w, x2.dtype, bias=b)
    elif weight.activations == "bf16":  # x rounded to bf16 at the GEMM's input, y in x's dtype
        y = launch("qmatmul", launch("cast", x2, dtypes.bfloat16), *w, bias=b, dtype=x2.dtype)
    else:
        y = launch("qmatmul", x2, *w, bias=b)
    return Tensor(y.reshape(*x.shape[:-1], y.shape[-1]))


def embedding(idx, weight, num_embeddings=None):
    """idx (...) int token ids -> weight rows (..., C). Ids must be < num_embeddings: all of
    weight's rows by default, fewer when the rows past it are padding."""
    if weight.ndim != 2:
        raise ValueError(
            f"embedding: weight must be (num_embeddings, embedding_dim), got shape {weight.shape}"
        )
    quantized = isinstance(weight, QuantizedWeight)
    if quantized and weight.out_axis != 0:
        raise ValueError("embedding: a quantized table must be stored by rows (out_axis 0)")
    n = weight.shape[0] if num_embeddings is None else num_embeddings
    ids = idx.data if isinstance(idx, Tensor) else idx
    # host ids (lists too): check, then move; device ids as they are (meta's: no values)
    if backend.holds_values(ids) and not hasattr(ids, "__cuda_array_interface__"):
        ids = np.asarray(ids)
        if ids.dtype.kind not in "iu":
            raise TypeError(f"embedding: ids must be integers, got {ids.dtype}")
        if ids.size and (ids.min() < 0 or ids.max() >= n):
            bad = int(ids.max() if ids.max() >= n else ids.min())
            raise ValueError(f"token id {bad} out of range for vocab {n}")
        ids = backend.get(weight.device).asarray(ids)
    if quantized:  # only the gathered rows decoded; no gradient to the table
        args = weight.codes, weight.scales, ids, weight.fmt, weight.group_size
        return Tensor(launch("qembedding", *args))
    return Embedding.apply(weight, ids)


def gelu(x):
    """GELU, always the tanh approximation (GPT-2's): PyTorch's gelu(x, approximate="tanh").
    PyTorch's default is the exact erf form."""
    return GELU.apply(x)


def layer_norm(x, weight, bias, eps=1e-5):
    """Layer norm over the last dim only, with a weight and a bias of (C,): PyTorch's
    layer_norm(x, (C,), weight, bias, eps). No normalized_shape of several dims."""
    C = x.shape[-1] if x.ndim else None
    for name, p in (("weight", weight), ("bias", bias)):
        if p is None or p.shape != (C,):
            got = None if p is None else p.shape
            raise ValueError(
                f"layer_norm: input {x.shape} has {C} features, {name} has shape {got}: "
                f"need a {name} of ({C},)"
            )
    return LayerNorm.apply(x, weight, bias, eps)


def rms_norm(x, weight, eps=1e-6):
    """x / sqrt(mean(x^2 over the last axis) + eps) * weight: Llama's RMSNorm (PyTorch's
    rms_norm over the last dim, with a weight)."""
    if weight.ndim != 1 or x.shape[-1] != weight.shape[0]:
        raise ValueError(
            f"rms_norm: input {x.shape} has {x.shape[-1]} features, weight has shape "
            f"{weight.shape}: need a weight of ({x.shape[-1]},)"
        )
    return RMSNorm.apply(x, weight, eps)


def dropout(x, p=0.0, training=True):
    """Inverted dropout: zero with probability p, scale the rest by 1 / (1 - p). The default p
    is 0.0, off (PyTorch's is 0.5)."""
    if not training or p == 0.0:
        return x
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must be in [0, 1), got {p}")
    return Dropout.apply(x, p, kernels.on_host(_dropout_seed))


def _dropout_seed():
    """The next mask's seed, a NumPy integer (an object of its own: a captured step's replay
    draws the next one and passes it where the recording passed this)."""
    return np.uint64(rng.next_seed())


# ---- unary ops, softmax over any dim, max (PyTorch's names and signatures)


def _unary(op):
    """The functional form of a unary op of functions._UNARY (torch.exp, ...)."""

    def fn(x):
        _floating(op, x)
        return _UNARY[op].apply(x)

    fn.__name__ = fn.__qualname__ = op
    fn.__doc__ = f"torch.{op}, elementwise, in fp32 for 2-byte floats and rounded once."
    return fn


exp, log, sqrt, rsqrt, tanh, sigmoid, silu, relu = (
    _unary(op) for op in ("exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "silu", "relu")
)


def _over_dim(fn, x, dim):
    """fn, a Function over the last axis, applied over dim: dim swapped last (a view; the
    kernel's input is made contiguous by a counted copy when it is not), and back. A 0-d
    tensor is one row of one element."""
    _floating(fn.__name__.lower(), x)
    d = _dim(dim, x.ndim)
    if x.ndim == 0:
        return reshape(fn.apply(reshape(x, (1,))), ())
    if d == x.ndim - 1:
        return fn.apply(x)
    return transpose(fn.apply(transpose(x, d, -1)), d, -1)


def softmax(x, dim):
    """torch.softmax over dim: exp(x - max) / sum(exp(x - max)); a row of -inf is nan."""
    return _over_dim(Softmax, x, dim)


def log_softmax(x, dim):
    """torch.log_softmax over dim: x - max - log(sum(exp(x - max)))."""
    return _over_dim(LogSoftmax, x, dim)


def _nonempty(fn, x, axes):
    for a in axes:
        if x.shape[a] == 0:
            raise IndexError(f"{fn}(): Expected reduction dim {a} to have non-zero size")


def amax(x, dim=(), keepdim=False):
    """torch.amax: the max over dim (an int or a tuple; () or None: every dim); a NaN is the
    max. The gradient is shared evenly by tied maxima."""
    axes = _axes(dim, x.ndim)
    _nonempty("amax", x, axes)
    return Amax.apply(x, axes, keepdim)


MaxResult = namedtuple("max", ["values", "indices"])  # torch.return_types.max


def max(x, dim=None, keepdim=False):
    """torch.max: without dim, the max of every element (as amax, ties sharing the gradient);
    with dim, (values, indices) along it, indices (int64) of the first max, the gradient going
    to the index."""
    if dim is None:
        return amax(x)
    if x.ndim == 0:  # one element, dim 0 or -1
        _dim(dim, 0)
        values, indices = max(reshape(x, (1,)), 0)
        return MaxResult(reshape(values, ()), reshape(indices, ()))
    d = _dim(dim, x.ndim)
    _nonempty("max", x, (d,))
    idx = launch("argmax", x.data, d)  # (..., 1, ...): not differentiable, no record
    values = Max.apply(x, idx, d, keepdim)
    return MaxResult(values, Tensor(idx if keepdim else idx.reshape(values.shape)))


def apply_rotary(x, cos, sin, start=0):
    """Rotary position embeddings (Hugging Face Llama's rotate-half convention) of x (B, H, T,
    D) at positions start .. start + T - 1: cos, sin are tables (positions, D/2) of the angles
    (arrays of x's device in its compute dtype, or Tensors), of which rows start .. start + T
    are read (a KV-cache decode step starts past the cached positions)."""
    cos, sin = (t.data if isinstance(t, Tensor) else t for t in (cos, sin))
    T, D = x.shape[-2:]
    if x.ndim != 4 or D % 2 or cos.shape[1:] != (D // 2,) or sin.shape != cos.shape:
        raise ValueError(
            f"apply_rotary: x {x.shape}, cos {cos.shape}, sin {sin.shape}: need x (B, H, T, D) "
            f"of an even D and tables (positions, D/2) of one shape"
        )
    if start < 0 or start + T > cos.shape[0]:
        raise ValueError(
            f"apply_rotary: positions {start} .. {start + T - 1} are outside the tables' "
            f"{cos.shape[0]} positions"
        )
    return Rotary.apply(x, cos[start : start + T], sin[start : start + T])


def swiglu(gate, up):
    """silu(gate) * up (Llama's SwiGLU MLP: down(silu(gate(x)) * up(x)))."""
    if gate.shape != up.shape:
        raise ValueError(f"swiglu: gate {gate.shape} and up {up.shape} differ in shape")
    return SwiGLU.apply(gate, up)


# ---------------------------------------------------------------- Tensor's operators and methods


def _shape_arg(shape):
    one = len(shape) == 1 and isinstance(shape[0], (tuple, list))  # t.view((2, 3)) or t.view(2, 3)
    return tuple(shape[0]) if one else tuple(shape)


def _to(t, dtype=None, device=None):
    """Tensor.to: another device (a copy, through the host), then another dtype (a cast)."""
    out = t
    if device is not None and device != t.device:
        out = Tensor(backend.get(device).asarray(t.numpy()), requires_grad=t.requires_grad)
    if dtype is not None and dtypes.as_dtype(dtype) != out.dtype:
        out = cast(out, dtypes.as_dtype(dtype))
    return out


# PyTorch's names; the reflected operators take the tensor second
_METHODS = {
    "__add__": add,
    "__radd__": add,
    "__sub__": sub,
    "__rsub__": lambda t, other: sub(other, t),
    "__mul__": mul,
    "__rmul__": mul,
    "__truediv__": div,
    "__rtruediv__": lambda t, other: div(other, t),
    "__neg__": neg,
    "__matmul__": matmul,
    "__getitem__": getitem,
    "to": _to,
    "float": lambda t: _to(t, dtypes.float32),
    "half": lambda t: _to(t, dtypes.float16),
    "bfloat16": lambda t: _to(t, dtypes.bfloat16),
    "sum": sum,
    "mean": mean,
    "var": var,
    "amax": amax,
    "max": max,
    "exp": exp,
    "log": log,
    "sqrt": sqrt,
    "rsqrt": rsqrt,
    "tanh": tanh,
    "sigmoid": sigmoid,
    "relu": relu,
    "softmax": softmax,
    "log_softmax": log_softmax,
    "reshape": lambda t, *shape: reshape(t, _shape_arg(shape)),
    "view": lambda t, *shape: view(t, _shape_arg(shape)),
    "transpose": transpose,
    "permute": lambda t, *dims: permute(t, _shape_arg(dims)),
    "split": split,
    # the last two dims swapped (PyTorch's .mT; PyTorch's .T reverses every dim)
    "T": property(lambda t: transpose(t, -2, -1)),
}
for _name, _method in _METHODS.items():
    setattr(Tensor, _name, _method)
