"""Measuring a training step and a decode step: what the accounting report, inspect_tape and
the benchmarks read. The step is optim/step.py's, the one the trainer runs; around it the
profiler sees every launch, the memory tracker every buffer, and a watch between the forward
and its backward reads the tape the forward appended."""

import gc
import re
import time
from dataclasses import dataclass

import numpy as np

from nn import ExecutionOptions, KVCache, build
from optim import AdamW, LossScaler, step
from tinygrad_like import (
    TAPE,
    backend,
    compiles,
    distributed,
    dtypes,
    kernels,
    no_grad,
    peaks,
    profiler,
)
from tinygrad_like.compiles import Compiles
from tinygrad_like.memory import PERSISTENT, TRACKER
from tinygrad_like.profiler import GEMMS, Profiler

from . import captured, mfu, predictions


def random_batch(vocab_size, batch_size, seq_len, seed=0, device="cpu"):
    """(x, y) int64 (B, T) token ids: counts and shapes do not depend on the values. On the
    meta device two shape-only arrays, nothing allocated (B x T may be far beyond memory)."""
    be = backend.get(device)
    if not be.HOLDS_VALUES:
        return tuple(be.empty((batch_size, seq_len), np.int64) for _ in "xy")
    ids = np.random.default_rng(seed).integers(0, vocab_size, (batch_size, seq_len + 1))
    return ids[:, :-1].copy(), ids[:, 1:].copy()


# ---------------------------------------------------------------- watching one step


class Unowned:
    """Launches no tape record owns in one phase (in a backward, the gradients summed across a
    tensor's uses and added into each leaf's .grad; in the optimizer phase, all of them)."""

    def __init__(self):
        self.launches = self.flops = self.bytes = 0

    def add(self, flops, nbytes):
        self.launches += 1
        self.flops += flops
        self.bytes += nbytes


class _ByPhase:
    """A kernels sink beneath every tape record, counting what reaches it per phase."""

    def __init__(self):
        self.phases = {phase: Unowned() for phase in profiler.PHASES}

    def add(self, flops, nbytes):
        self.phases[profiler.current_phase()].add(flops, nbytes)


class _TapeWatch:
    """Called between a forward and its backward: keeps the records the forward appended (the
    backward fills in their backward counts) and the activation bytes it saved."""

    def __init__(self):
        self.start, self.saved_before = TAPE.position(), TRACKER.current["activations"]
        self.records, self.activations = [], 0

    def __call__(self):
        self.records = TAPE.records(since=self.start)
        self.activations = TRACKER.current["activations"] - self.saved_before


def watched(run):
    """run(watch) with a _TapeWatch and a per-phase sink. -> (the forward's tape as dicts,
    backward counts filled in; activation bytes the tracker counted during the forward;
    {phase: Unowned}; run's result)."""
    watch, unowned = _TapeWatch(), _ByPhase()
    with kernels.sink_to(unowned):
        result = run(watch)
    return [r.as_dict() for r in watch.records], watch.activations, unowned.phases, result


def forward_backward(model, x, y, scaler=None):
    """One forward and backward as training runs them. -> watched()'s first three."""
    return watched(lambda watch: step.forward_backward(model, x, y, scaler, watch=watch))[:3]


# ---------------------------------------------------------------- the measurement


@dataclass
class Measurement:
    """What the report prints as measured: one training step and one decode step."""

    config: object
    options: ExecutionOptions  # how the model ran
    dtype: str
    device: str
    batch_size: int
    seq_len: int
    n_params: int
    parameters: dict  # parameter name -> elements, as the model holds them
    persistent: dict  # tracker tag -> bytes the model and AdamW allocated
    tape: list  # the profiled forward's records as dicts
    activation_bytes: int  # counted by the tracker during that forward
    peak_bytes: int  # the tracker's peak over a step (persistent + everything it held)
    unowned: dict  # phase -> that step's launches outside any record (Unowned)
    step: Profiler  # the profiled training step
    step_seconds: float
    skipped: bool  # the fp16 loss scaler skipped the profiled step (overflow); None on meta
    decode: Profiler  # one M = 1 decode step with a KV cache
    decode_seconds: float
    cached_positions: int  # the KV cache's positions before the profiled decode step
    kv_cache_bytes_per_token: int  # the decode step's cache: its buffers' bytes per position
    peak: float  # FLOP/s the MFU divides by (None on meta: nothing ran)
    peak_name: str
    zero: int  # AdamW's ZeRO stage
    world_size: int  # R: the ranks of the world (R > 1 on the meta device only)
    elements: int  # AdamW's flat buffer length (the padded vocabulary, the shards' padding)
    padding: int  # elements added to split the flat buffers into R equal shards
    collectives: list  # the profiled step's distributed.Collective records
    machine: peaks.Peaks = None  # the machine's peaks, read once (None on meta)
    peak_note: str = None  # what the run's own GEMMs raised (peaks.beaten), if anything
    compiles: Compiles = Compiles()  # compiled on first use while measuring, outside every time
    captured_step: captured.Captured = None  # the training step captured and replayed
    captured_decode: captured.Captured = None  # the decode step captured and replayed


def check_measurable(device, dtype, world_size=1):
    """Refuse fp16 on a device that holds no values (meta: NoValues): its loss scaler skips a
    step on an overflow, a decision that needs the gradient norm's value; and a world of R > 1
    ranks on one that does (one process runs one rank: a real world runs under mpirun; a
    shape-only world's sums are never read)."""
    be = backend.get(device)
    if dtype == "fp16":
        be.require_values("fp16's loss scaler (it skips a step on an overflow)")
    if world_size < 1:
        raise ValueError(f"--world-size must be >= 1, got {world_size}")
    if world_size > 1 and be.HOLDS_VALUES:
        raise ValueError(
            f"--world-size {world_size} is counted on the meta device only (--device meta); "
            "a real world of ranks trains under mpirun (examples/train_gpt2.py)"
        )


def check_world(config, world_size):
    """Refuse a world of more ranks than AdamW's flat buffers of config hold elements: a ZeRO
    shard is at least one element (and no machine has that many ranks)."""
    elements = predictions.stored_elements(config)
    if world_size > elements:
        raise ValueError(
            f"--world-size {world_size:,} is more ranks than the model's {elements:,} stored "
            f"parameters (a rank's ZeRO shard holds one at least): use at most {elements:,}"
        )


def measure(
    config,
    dtype="fp32",
    device="cpu",
    batch_size=1,
    seq_len=64,
    batch=None,
    warmup=1,
    options=None,
    zero=0,
    world_size=1,
):
    """Build a model (run with options, ExecutionOptions) and AdamW for config, run `warmup`
    untimed steps (CUDA compiles kernels on first use), then one profiled training step and
    one profiled decode step. On the meta device (shapes only) the same step is counted
    without running: its times are the host's shape arithmetic, not a run's.
    batch: (x, y) token ids of shape (batch_size, seq_len); random when None.
    zero: AdamW's ZeRO stage; world_size R > 1 (the meta device only) counts rank 0 of R
    ranks (distributed.MetaWorld). Every rank holds rank 0's bytes: AdamW splits its flat
    buffers into R equal shards, so one model is built, not one per rank.
    Kernels compiled on first use (tinygrad_like.compiles) are kept out of every time: a
    profiled step that compiled is run again, and the decode step is profiled after one
    untimed. The machine's peaks are read once, and raised when the step's own GEMMs beat
    the matmul peak (peaks.beaten)."""
    dtype = dtypes.name(dtypes.as_dtype(dtype))
    check_measurable(device, dtype, world_size)
    check_world(config, world_size)
    compiled = compiles.so_far()
    model, optimizer, persistent = _build(config, dtype, device, options, zero, world_size)
    scaler = LossScaler() if dtype == "fp16" else None
    if batch is None:
        batch = random_batch(config.vocab_size, batch_size, seq_len, device=device)
    x, y = batch

    def train_step(watch=None):
        return step.train_on(model, optimizer, [(x, y)], scaler, watch=watch)

    for _ in range(warmup):
        train_step()
    peak_bytes = _step_peak(train_step, sum(persistent.values()))
    while True:  # until a step compiled nothing: its times are the kernels'
        gc.collect()
        before, t0 = compiles.so_far(), time.perf_counter()
        with Profiler(timing=True) as prof, optimizer.comm.recording() as collectives:
            tape, activations, unowned, (_, _, skipped) = watched(train_step)
        step_seconds = time.perf_counter() - t0
        if compiles.so_far() == before:
            break
    decode, decode_seconds, cached_positions, kv_bytes = _decode_step(model, x)
    captured_step = captured.training(model, optimizer, (x, y), scaler)
    captured_decode = captured.decode(model, x)
    machine, note = _machine_peaks(device, dtype, prof)
    peak, peak_name = mfu.device_peak(device, dtype, machine)
    parameters = {name: p.unpadded_numel() for name, p in model.named_parameters()}
    return Measurement(
        config,
        model.options,
        dtype,
        device,
        x.shape[0],
        x.shape[1],
        model.num_parameters(),
        parameters,
        persistent,
        tape,
        activations,
        peak_bytes,
        unowned,
        prof,
        step_seconds,
        skipped,
        decode,
        decode_seconds,
        cached_positions,
        kv_bytes,
        peak,
        peak_name,
        zero,
        world_size,
        optimizer.numel,
        optimizer.padding,
        collectives,
        machine,
        note,
        compiles.so_far() - compiled,
        captured_step,
        captured_decode,
    )


def _machine_peaks(device, dtype, prof):
    """-> (the machine's Peaks, read once for the whole report, None on meta; the line saying
    that the profiled step's GEMMs raised the matmul peak, or None). A GEMM kernel's rate is
    its FLOPs over its time, summed over its launches in the step."""
    if not backend.get(device).HOLDS_VALUES:
        return None, None
    rows = [r for r in prof.census() if r["kernel"] in GEMMS and r["seconds"] > 0]
    best = max(rows, key=lambda r: r["flops"] / r["seconds"], default=None)
    if best is None:
        return peaks.get(device), None
    what = f"{best['kernel']} ({best['calls']} launches of its training step)"
    return peaks.beaten(device, dtype, best["flops"] / best["seconds"], what)


def _build(config, dtype, device, options, zero, world_size):
    """-> (model, its AdamW as rank 0 of world_size, the persistent bytes per tracker tag the
    two allocated)."""
    comm = distributed.MetaWorld(0, world_size) if world_size > 1 else None
    before = TRACKER.settled()
    model = build(config, device=device, options=options)
    model.flatten_parameters(dtype, shards=world_size if zero else 1)  # the working dtype
    optimizer = AdamW(model.named_parameters(), comm=comm, zero=zero)
    after = TRACKER.settled()  # not the per-parameter tensors the flat buffers replaced
    return model, optimizer, {tag: after[tag] - before[tag] for tag in PERSISTENT}


def _step_peak(train_step, persistent_bytes):
    """The tracker's peak over one more training step, temporaries included: this model's
    persistent state plus the most its step held at once (other models alive are left out)."""
    others = sum(TRACKER.settled().values()) - persistent_bytes
    TRACKER.start_recording(temporaries=True)
    try:
        train_step()
    finally:
        TRACKER.stop_recording()
    return TRACKER.peak_total - others


def _decode_step(model, x, tries=4):
    """Fill a KV cache with a prompt (the batch's first row), run one token untimed (the
    decode kernels' first call, which may compile them), then profile one more: the M = 1 step
    of generation; while a profiled token compiled a kernel (a kernel's other twin, one core or
    two, can first run a token later), profile the next, up to tries tokens. -> (profiler,
    seconds, the positions cached before that step, the cache's bytes per position: every
    layer's K and V buffers over their length)."""
    prompt = x[:1, : min(x.shape[1], model.config.n_positions - 1 - tries)]
    model.eval()
    with no_grad():
        like = model.get_input_embeddings().weight
        cache = KVCache(model.config, 1, prompt.shape[1] + 1 + tries, like)
        model(prompt, cache=cache, last_only=True)
        model(prompt[:, -1:], cache=cache, last_only=True)
        for done in range(tries):
            before, t0 = compiles.so_far(), time.perf_counter()
            with Profiler(timing=True) as prof:
                model(prompt[:, -1:], cache=cache, last_only=True)
            seconds = time.perf_counter() - t0
            if compiles.so_far() == before:
                break
    kv_bytes = sum(a.nbytes for a in cache.k + cache.v) // cache.max_len
    return prof, seconds, prompt.shape[1] + 1 + done, kv_bytes


# ---------------------------------------------------------------- the tape, grouped


def layer_of(scope):
    """transformer.h.3.mlp.c_fc -> transformer.h.3; a scope outside the blocks is its own
    layer (the model's own ops, such as the embedding sum, have the empty scope)."""
    match = re.match(r"(.*\.(?:h|layers)\.\d+)(\.|$)", scope)
    return match.group(1) if match else (scope or "(model)")


SUMMED = ("fwd_flops", "bwd_flops", "fwd_launches", "bwd_launches", "saved_bytes")


def group(records, key):
    """key(record) -> {records, and the sum of each SUMMED field}, in order of first
    appearance (key=lambda r: r["op"] totals per op kind)."""
    out = {}
    for r in records:
        row = out.setdefault(key(r), dict.fromkeys(("records",) + SUMMED, 0))
        row["records"] += 1
        for field in SUMMED:
            row[field] += r[field]
    return out


def block_layers(records):
    """The per-block layer names present in the records (transformer.h.0, ...)."""
    return [
        name
        for name in group(records, lambda r: layer_of(r["scope"]))
        if re.search(r"\.(?:h|layers)\.\d+$", name)
    ]
