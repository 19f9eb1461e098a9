"""The one place every kernel launch passes through, and the list of kernels a backend must have.

ops.py, nn/ and optim/ run kernels only through launch("gelu_fwd", x), which finds the backend
that owns x, runs its kernel, and counts the launch: FLOPs and exps from the shapes (the tables
below), bytes as everything the kernel reads plus everything it writes, the phase, and (when a
profiler asks) the time. The tape and the profiler read these counts; nothing else computes them.

What does not pass through here, and so is never counted: the HOST functions below, called
directly on a backend. Host-to-device and device-to-host copies are among them: backend.asarray
(Tensor(...) from NumPy data or lists, ops.py moving host token ids and targets, moving a tensor
to another device, loading weights) and to_numpy (.numpy(), reading a loss or a gradient norm
back), and so are the min/max reads of the embedding id check (cpu.check_ids).
"""

import time

from . import backend, profiler
from .memory import TRACKER

# The backend contract: every name here is a function of both backend/cpu.py and backend/cuda.py
# with the same signature (tests/test_backend_contract.py checks it, and that launch is only
# ever asked for these names).
KERNELS = (
    "matmul",
    "matmul_nt",
    "matmul_tn",  # GEMMs, with batch dims
    "add",
    "sub",
    "mul",
    "div",
    "neg",  # elementwise arithmetic
    "gelu_fwd",
    "gelu_bwd",
    "dropout_fwd",  # activations
    "contiguous",
    "cast",
    "copy",
    "fill",
    "concat",
    "index_bwd",  # data movement
    "sum",  # reduction over any axes
    "layernorm_fwd",
    "layernorm_bwd",  # row kernels
    "softmax_causal_fwd",
    "softmax_causal_bwd",
    "flash_attention_fwd",
    "flash_attention_bwd",  # attention in blocks
    "cross_entropy_fwd",
    "cross_entropy_bwd",
    "cross_entropy_fwd_bwd",
    "embedding_fwd",
    "embedding_bwd",  # gather and scatter-add
    "grad_norm_sq",
    "adamw_step",  # optimizer
)
# The rest of a backend: host-side functions, called directly and not counted.
HOST = ("supported_dtypes", "asarray", "to_numpy", "empty", "synchronize", "start_timer")


def _per_element(n, of=0):
    """FLOPs = n per element of argument `of` (0 = the first input)."""
    return lambda result, *args, **kw: n * args[of].size


def _per_output(result, *args, **kw):
    """One FLOP per output element (binary ops, whatever broadcast their inputs)."""
    return result.size


def _flash_scores(q, k):
    """Scores the flash kernels compute for q (B, H, Tq, D), k (B, H, Tk, D): each block of
    cpu.FLASH_BQ queries against the keys up to its last query's position. The masked corner
    of each diagonal block is computed and counted (T = 128: 1.49x the causal triangle,
    T = 1024: 1.06x); the key blocks after a query block are skipped and not counted."""
    (B, H, Tq, _), Tk, bq = q.shape, k.shape[-2], backend.cpu.FLASH_BQ
    return B * H * sum(min(bq, Tq - i) * (Tk - Tq + min(i + bq, Tq)) for i in range(0, Tq, bq))


# FLOPs per launch, from shapes. GEMMs count one multiply and one add per term: 2*M*K*N
# (times the batch), plus M*N for a fused bias. Elementwise and row kernels count arithmetic
# per element (exp, tanh and sqrt count as 1): a fraction of a percent of a GPT-2 step, but
# honest. Data movement (gathers, casts, copies) counts 0 FLOPs and only bytes.
FLOPS = {
    "matmul": lambda r, a, b, bias=None: 2 * r.size * a.shape[-1] + (0 if bias is None else r.size),
    "matmul_nt": lambda r, a, b: 2 * r.size * a.shape[-1],
    "matmul_tn": lambda r, a, b: 2 * r.size * a.shape[-2],
    "add": _per_output,
    "sub": _per_output,
    "mul": _per_output,
    "div": _per_output,
    "neg": _per_element(1),
    "sum": _per_element(1),
    "gelu_fwd": _per_element(8),
    "gelu_bwd": _per_element(16),
    "dropout_fwd": _per_element(2),
    "layernorm_fwd": _per_element(8),
    "layernorm_bwd": _per_element(12, of=1),
    "softmax_causal_fwd": _per_element(5),
    "softmax_causal_bwd": _per_element(4),
    # per computed score: forward QK^T and PV (2D + 2D) + 5 for the online softmax; backward
    # QK^T again, dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q (5 x 2D) + 4 for P and dS
    "flash_attention_fwd": lambda r, q, k, *a: (4 * q.shape[-1] + 5) * _flash_scores(q, k),
    "flash_attention_bwd": lambda r, q, k, *a: (10 * q.shape[-1] + 4) * _flash_scores(q, k),
    # per class of each row: a padded vocabulary's columns past n_classes are not computed
    "cross_entropy_fwd": lambda r, logits, *a, n_classes=None: 4 * logits[:, :n_classes].size,
    "cross_entropy_bwd": lambda r, logits, *a, n_classes=None: 4 * logits[:, :n_classes].size,
    # max, subtract, exp, sum, scale: the backward's subtract and exp are the forward's
    "cross_entropy_fwd_bwd": lambda r, logits, *a, n_classes=None, out=None: (
        5 * logits[:, :n_classes].size
    ),
    "embedding_bwd": _per_element(1),
    "grad_norm_sq": _per_element(2),
    "adamw_step": _per_element(12),
}


# exp / tanh evaluations per launch, from shapes: on a CPU these, not bytes, can bound a kernel
# (training/roofline.py divides them by the measured exp rate). One per element or score that
# the kernel exponentiates; a log or sqrt per row is left out (a row holds hundreds of elements).
EXPS = {
    "gelu_fwd": _per_element(1),  # one tanh per element
    "gelu_bwd": _per_element(1),  # the same tanh, recomputed
    "softmax_causal_fwd": _per_element(1),  # one exp per score, masked ones included
    "flash_attention_fwd": lambda r, q, k, *a: _flash_scores(q, k),  # one per computed score
    "flash_attention_bwd": lambda r, q, k, *a: _flash_scores(q, k),  # P recomputed from lse
    "cross_entropy_fwd": lambda r, logits, *a, n_classes=None: logits[:, :n_classes].size,
    "cross_entropy_bwd": lambda r, logits, *a, n_classes=None: logits[:, :n_classes].size,
    "cross_entropy_fwd_bwd": lambda r, logits, *a, n_classes=None, out=None: (  # one for both
        logits[:, :n_classes].size
    ),
}


# Bytes per launch = what the kernel reads + what it writes. By default every array argument is
# read once and every new output written once; these entries correct the kernels that write
# into an argument (in place) or read only part of one.
WRITES_ARGS = {"copy": (0,), "fill": (0,), "adamw_step": (0, 2, 3, 4)}  # master, m, v, working
SKIPS_READING = {"copy": (0,), "fill": (0,), "embedding_fwd": (0,)}  # overwritten / gathered


def _bytes(name, args, kwargs, outs):
    skip = SKIPS_READING.get(name, ())
    reads = [a for i, a in enumerate(args) if i not in skip]
    nbytes = sum(a.nbytes for a in _arrays(reads))
    nbytes += sum(a.nbytes for k, a in kwargs.items() if k != "out" and hasattr(a, "nbytes"))
    written = [args[i] for i in WRITES_ARGS.get(name, ()) if args[i] is not None]
    written += [kwargs["out"]] if kwargs.get("out") is not None else []
    ids = {id(a) for a in written}
    nbytes += sum(a.nbytes for a in written)
    nbytes += sum(a.nbytes for a in _arrays(outs) if id(a) not in ids)
    if name == "embedding_fwd":  # a gather reads only the rows it copies
        nbytes += sum(a.nbytes for a in _arrays(outs))
    if name.startswith("cross_entropy"):  # the logits' padding columns (past n_classes): unread
        nbytes -= args[0].nbytes - args[0][:, : kwargs.get("n_classes")].nbytes
    return nbytes


def _arrays(items):
    for x in items:
        if hasattr(x, "nbytes") and hasattr(x, "shape"):
            yield x
        elif isinstance(x, (tuple, list)):
            yield from _arrays(x)


def _first_array(args):
    for a in _arrays(args):
        return a
    raise TypeError("a kernel launch needs at least one array argument")


_sinks = []  # objects with .add(flops, nbytes): the tape record being run, if any


class sink_to:
    """with sink_to(record): launches inside add their FLOPs and bytes to the record."""

    def __init__(self, target):
        self.target = target

    def __enter__(self):
        _sinks.append(self.target)

    def __exit__(self, *exc):
        _sinks.pop()


def launch(name, *args, **kwargs):
    be = backend.of(args[0] if hasattr(args[0], "shape") else _first_array(args))
    if not (_sinks or profiler.active() or TRACKER.track_temporaries):
        return getattr(be, name)(*args, **kwargs)  # nobody is counting: just run it
    timing = profiler.timing_wanted()
    timer = be.start_timer() if timing else None
    t_host = time.perf_counter()
    out = getattr(be, name)(*args, **kwargs)
    if timer is not None:
        timer.stop()
    outs = () if out is None else out if isinstance(out, tuple) else (out,)
    result = outs[0] if outs else None
    flops = int(FLOPS[name](result, *args, **kwargs)) if name in FLOPS else 0
    exps = int(EXPS[name](result, *args, **kwargs)) if name in EXPS else 0
    nbytes = _bytes(name, args, kwargs, outs)
    if _sinks:
        _sinks[-1].add(flops, nbytes)
    for prof in profiler.active():
        prof.launches.append(
            profiler.Launch(
                name,
                profiler.current_phase(),
                flops,
                nbytes,
                be.name,
                timer,
                t_host - prof.t0,
                exps=exps,
            )
        )
    if TRACKER.track_temporaries:
        inputs = {id(a) for a in _arrays(args)} | {id(a) for a in _arrays(kwargs.values())}
        for a in _arrays(outs):
            if id(a) not in inputs:
                TRACKER.register(a, "temporaries")
    return out
