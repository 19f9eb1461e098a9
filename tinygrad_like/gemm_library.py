"""Which BLAS the CPU's GEMMs run on, chosen on each machine by measurement: NumPy's OpenBLAS with
the kernel set it loaded, the same with its AVX-512 (SkylakeX) kernels where it loaded others
on a CPU that has AVX-512, and, with the `mkl` extra (`pip install -e '.[mkl]'`), Intel's MKL
(kernels/gemm/cpu_blas.py; for a bf16 step, MKL's bf16 GEMM against this project's own). Each is
timed at a training step's own GEMMs (step_gemms: every linear layer's forward X W, dX = dY W^T
and dW = X^T dY, and the fused LM head's three per block of rows) as the step calls them
(cpu.matmul, matmul_nt, matmul_tn: the same splits across the cores), in interleaved rounds,
each GEMM's best round weighted by its calls per step; the fastest is used (a library other
than OpenBLAS as it loaded only where clearly faster: MARGIN). Why measure rather than name a
vendor: at these shapes MKL was 2-16% slower than OpenBLAS on an AMD EPYC and, by PyTorch's
GEMMs, well ahead on an Intel Xeon; on a Zen 5 EPYC whose environment named OpenBLAS's AVX2
kernels, its AVX-512 ones ran at twice their rate (docs/performance.md, "The GEMMs"); a BLAS's
speed is a fact of the machine, as the peaks are.

The choice and its figures are cached beside the peaks (peaks.cache_path: the same folder and
machine fingerprint), one entry per step shape, so a machine measures once; TG_BLAS=openblas,
TG_BLAS=openblas-skylakex or TG_BLAS=mkl chooses without measuring.
"""

import json
import os
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from . import dtypes, kernels, losses, peaks
from .files import atomic_write, read_small
from .kernels.gemm import cpu_blas
from .kernels.gemm.cpu_bf16 import HAS_DOT

CHOOSE = "TG_BLAS"  # the environment variable that names the library, not measured
ROUNDS = 3  # interleaved rounds: a GEMM's time is its best
CACHE_BYTES = 1 << 20
# Another library is chosen only where its time is under this fraction of OpenBLAS's (as it
# loaded): a near tie keeps NumPy's OpenBLAS, so that the noise of one measurement does not
# flip a machine's choice (and a run's bits) between processes that measure it afresh (another
# BLAS environment, a run killed before its measurement was cached)
MARGIN = 0.9
_chosen = []  # the Choice this process made last, for the reports that name it


@dataclass
class Choice:
    library: str  # the library the GEMMs run on
    how: str  # "measured", "cached" (measured before on this machine), "TG_BLAS" or "the only one"
    seconds: dict = field(default_factory=dict)  # library -> the step's GEMMs' seconds
    gemms: int = 0  # the distinct GEMMs timed
    when: str = ""  # when they were measured (UTC)
    operands: str = "fp32"  # the GEMMs' operands: fp32 (an fp32 or fp16 step's), or bf16
    step: str = "step"  # whose GEMMs: a training "step"'s, or a "prompt"'s (generation's prefill)

    def describe(self):
        """One line for a report."""
        names = {"openblas": "OpenBLAS", "openblas-skylakex": "OpenBLAS SkylakeX", "mkl": "MKL"}
        if "openblas-skylakex" in self.seconds or self.library == "openblas-skylakex":
            names["openblas"] = f"OpenBLAS {cpu_blas.LOADED_CORE}"  # the kernels it loaded
        if self.operands == "bf16":  # without MKL's bf16 GEMM, cpu.py's own (or widened)
            names["openblas"] = "ours" if HAS_DOT else "OpenBLAS (widened)"
        if not self.seconds:
            hint = "; pip install -e '.[mkl]' adds MKL" if self.how.startswith("the only") else ""
            return f"GEMM library: {names[self.library]} ({self.how}{hint})"
        times = ", ".join(f"{names[k]} {v * 1e3:,.1f} ms" for k, v in self.seconds.items())
        names["openblas"] += " (bf16 dot products)" if names["openblas"] == "ours" else ""
        return (
            f"GEMM library: {names[self.library]}, the faster at this {self.step}'s {self.gemms} "
            f"{self.operands} GEMM shapes ({times} a {self.step}; {self.how} {self.when}; "
            f"{CHOOSE}= chooses)"
        )


def step_gemms(config, B, T):
    """[(label, kind, a's shape, b's shape, calls per step)] of a GPT-2 or Llama training step's
    GEMMs (nn: a (M, K) b (K, N); nt: b (N, K); tn: a (K, M)), as functions.Linear and the fused
    head (losses.py) lay out their operands. A Llama's q, k and v count as one GEMM of their
    summed width, its gate and up projections as two of its MLP's width."""
    tokens, C, L = B * T, config.n_embd, config.n_layer
    rows, Vp = losses.HEAD_BLOCK_ROWS, config.padded_vocab_size
    F = getattr(config, "intermediate_size", None)  # a Llama's MLP width (GPT-2's: 4 C)
    gemms = []
    for layer, (k, n), calls in (
        ("qkv", (C, C + 2 * config.n_kv_head * config.head_dim), L),
        ("attn proj", (C, C), L),
        ("fc", (C, F or 4 * C), 2 * L if F else L),
        ("mlp proj", (F or 4 * C, C), L),
    ):
        gemms += [
            (f"{layer} X W", "nn", (tokens, k), (k, n), calls),
            (f"{layer} dX", "nt", (tokens, n), (k, n), calls),
            (f"{layer} dW", "tn", (tokens, k), (tokens, n), calls),
        ]
    blocks = -(-tokens // rows)
    rows = min(rows, tokens)
    return gemms + [
        ("head logits", "nt", (rows, C), (Vp, C), blocks),
        ("head dX", "nn", (rows, Vp), (Vp, C), blocks),
        ("head dW", "tn", (rows, Vp), (rows, C), blocks),
    ]


def prompt_gemms(config, B, T):
    """step_gemms' rows for a prompt's forward pass (generation's prefill): each linear layer's
    X W at B T rows, and the head's logits at the last position of each of the B prompts."""
    forward = [row for row in step_gemms(config, B, T) if row[0].endswith(" X W")]
    C, Vp = config.n_embd, config.padded_vocab_size
    return forward + [("head logits", "nt", (B, C), (Vp, C), 1)]


def choose(config, B, T, dtype="fp32", remeasure=False, prompt=False):
    """Pick the library for a step of this model, batch and dtype (TG_BLAS, the cache, or a
    measurement of a few seconds), use it from now on -> Choice. A bf16 step's GEMMs are timed
    on bf16 operands (MKL's bf16 GEMM against cpu.py's own), an fp32 or fp16 step's on fp32
    (fp16 operands are widened for the BLAS). prompt=True: for generation, a prompt of B
    sequences of T tokens (prompt_gemms, under a second), T rounded up to a power of two so
    that a machine measures a few lengths, not every prompt's."""
    operands = "bf16" if dtypes.name(dtypes.as_dtype(dtype)) == "bf16" else "fp32"
    step = "prompt" if prompt else "step"
    available = cpu_blas.available()
    candidates = available  # what is measured: OpenBLAS's two kernel sets are one for bf16
    if operands == "bf16" and HAS_DOT:  # operands, which cpu_bf16.py's own GEMMs take
        candidates = tuple(name for name in available if name != "openblas-skylakex")
    named = os.environ.get(CHOOSE)
    if named:
        if named not in cpu_blas.LIBRARIES:
            raise ValueError(f"{CHOOSE}={named}: name one of {', '.join(cpu_blas.LIBRARIES)}")
        if named not in available:
            missing = (
                "not on this CPU or this OpenBLAS (AVX-512, and a build with those kernels)"
                if named == "openblas-skylakex"
                else f"not installed (pip install -e '.[{named}]')"
            )
            raise ValueError(f"{CHOOSE}={named}: {missing}")
        choice = Choice(named, CHOOSE, operands=operands, step=step)
    elif len(candidates) == 1:
        choice = Choice(candidates[0], "the only one installed", operands=operands, step=step)
    else:
        peaks_file = peaks.cache_path("cpu")
        path = peaks_file.with_name(f"blas-{peaks_file.stem}.json")
        if prompt:  # T rounded up to a power of two: a few lengths a machine
            gemms = prompt_gemms(config, B, 1 << (T - 1).bit_length())
        else:
            gemms = step_gemms(config, B, T)
        key = json.dumps([operands, step] + [row[1:] for row in gemms])  # the step's GEMMs
        cached = {} if remeasure else _read(path)
        if key in cached and set(cached[key]["seconds"]) == set(candidates):
            choice = Choice(**{**cached[key], "how": "cached"})
        else:
            choice = measure(gemms, candidates, operands, step)
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, json.dumps({**_read(path), key: asdict(choice)}, indent=1).encode())
    cpu_blas.use(choice.library)
    _chosen[:] = [choice]
    return choice


def chosen():
    """The Choice this process made last, or None (its GEMMs on NumPy's OpenBLAS)."""
    return _chosen[0] if _chosen else None


def in_use():
    """The Choice the GEMMs run on now, for a report: the last one made, or NumPy's default."""
    return chosen() or Choice(cpu_blas.used(), "NumPy's; none chosen in this process")


def measure(gemms, libraries, operands="fp32", step="step"):
    """Time each library at gemms (step_gemms' rows), their operands of that dtype -> Choice of
    the faster."""
    cpu = kernels.on("cpu")
    run = {"nn": cpu.matmul, "nt": cpu.matmul_nt, "tn": cpu.matmul_tn}
    rng = np.random.default_rng(0)
    dtype = dtypes.as_dtype(operands)
    arrays = [
        (run[kind], *(rng.standard_normal(s, np.float32).astype(dtype) for s in (a, b)), n)
        for _, kind, a, b, n in gemms
    ]
    best = {lib: [float("inf")] * len(arrays) for lib in libraries}
    for _ in range(ROUNDS):
        for lib in libraries:
            cpu_blas.use(lib)
            for i, (gemm, a, b, _) in enumerate(arrays):
                start = time.perf_counter()
                gemm(a, b)
                best[lib][i] = min(best[lib][i], time.perf_counter() - start)
    seconds = {lib: sum(t * n for t, (*_, n) in zip(best[lib], arrays)) for lib in libraries}
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return Choice(faster(seconds), "measured", seconds, len(gemms), when, operands, step)


def faster(seconds):
    """The library of the least seconds, OpenBLAS unless another's are under MARGIN of its."""
    best = min(seconds, key=seconds.get)
    clear = "openblas" not in seconds or seconds[best] < MARGIN * seconds["openblas"]
    return best if clear else "openblas"


def _read(path):
    """The cache file's entries (step shape -> Choice's fields), {} when missing or unsound."""
    try:
        found = json.loads(read_small(path, CACHE_BYTES))
    except (OSError, ValueError):
        return {}
    sound = isinstance(found, dict) and all(
        isinstance(v, dict)
        and v.get("library") in cpu_blas.LIBRARIES
        and isinstance(v.get("seconds"), dict)
        and v.get("operands") in ("fp32", "bf16")
        and v.get("step") in ("step", "prompt")
        and all(isinstance(s, (int, float)) for s in v["seconds"].values())
        and set(v) == {f for f in Choice.__dataclass_fields__}
        for v in found.values()
    )
    return found if sound else {}
