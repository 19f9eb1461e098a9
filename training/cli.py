"""Command line of examples/train_gpt2.py: one flag per RunConfig field, its help the field's
(args.add_setting_flags). Bad input is one line on stderr and exit code 2 (training/args.py). Under
`mpirun -n R` every rank runs this same command: data-parallel training (training/loop.py)."""

import contextlib
import dataclasses
import math
import os
import signal
import sys
import traceback

from nn import ExecutionOptions, GPT2Config, from_preset
from nn.config import PRESETS
from nn.hf import read_config
from tinygrad_like import backend, distributed

from . import checkpoint
from .args import (
    BAD_INPUT,
    ArgumentParser,
    Refused,
    add_setting_flags,
    check_dtype,
    fail,
    flag,
    user_errors,
)
from .corpus import DEFAULT_DATA_DIR, prepare
from .loop import Agreed, Interrupted, RunConfig, Trainer

# with no arguments: RunConfig's defaults (a small model that shows the loss falling in about
# 5 minutes on 2 CPU cores), or GPT-2 124M at its full context when a GPU is there
GPU_DEFAULTS = dict(
    model="gpt2",
    batch_size=16,
    seq_len=1024,
    steps=2000,
    lr=6e-4,
    min_lr=6e-5,
    warmup=100,
    dtype="bf16",
    eval_every=250,
)
# what a resumed run cannot change: the model and where it came from, and the batch shape and
# seed that the saved data position counts in (the global batch: --batch-size x ranks)
FIXED_ON_RESUME = ("model", "init_from", "batch_size", "seq_len", "seed")
# how and where this process runs, not what the run is: never taken from a saved config
NOT_RESTORED = ("resume", "out", "overwrite", "device", "quiet", "report")


def parser():
    p = ArgumentParser(
        description="Train GPT-2 on the Shakespeare default (or any prepared "
        ".bin data) with the tinygrad_like autograd."
    )
    add_setting_flags(p, RunConfig, GPU_DEFAULTS)
    return p


def config_from_args(argv=None) -> RunConfig:
    return resolve(argv)[0]


def resolve(argv=None):
    """-> (RunConfig, notes). The defaults are RunConfig's (GPU_DEFAULTS on a GPU), or with
    --resume the saved run's config: a flag given explicitly overrides a saved setting, and
    notes says so, one line each. Resuming a run already at --steps is a ValueError."""
    given = {k: v for k, v in vars(parser().parse_args(argv)).items() if v is not None}
    device = backend.resolve(given.get("device"))  # the one place the device is resolved
    defaults, notes, step = (GPU_DEFAULTS if backend.get(device).GPU else {}), [], None
    if "init_from" in given:
        given["model"] = model_of(given["init_from"], given.get("model"))
    if "resume" in given:
        saved, folder, step = saved_run(given["resume"])
        saved["batch_size"] = per_rank_batch(saved, given, folder)  # on this many ranks
        defaults = {k: v for k, v in saved.items() if k not in NOT_RESTORED}
        notes = resume_overrides(saved, given, folder)
        given.setdefault("out", folder)
    cfg = RunConfig(**{**defaults, "device": device, **given})
    validate(cfg)
    if step is not None and step >= cfg.steps:  # else it would only save its checkpoint again
        raise ValueError(
            f"{folder} is already at step {step} of {cfg.steps}: pass --steps M "
            f"(M > {step}) to train further"
        )
    return cfg, notes


def model_of(init_from, model=None):
    """The preset the --init-from checkpoint is (None: none is; its config.json is the model),
    recorded as the run's --model; ValueError when --model names another: the weights are the
    checkpoint's whatever --model says."""
    config = read_config(checkpoint.find_checkpoint(init_from))
    # what a GPT-2 preset leaves at its default (a Llama preset sets every field)
    shape = dict(dropout=0.0, layer_norm_epsilon=1e-5) if isinstance(config, GPT2Config) else {}
    held = next((k for k, v in PRESETS.items() if dataclasses.replace(config, **shape) == v), None)
    if model is not None and model != held:
        raise ValueError(
            f"--model {model} does not match --init-from {init_from}, which holds "
            f"{held or 'no preset'} ({config.n_layer} layers, {config.n_head} heads, "
            f"{config.n_embd} channels, {config.n_positions} positions): leave --model out"
        )
    return held


def saved_run(path):
    """-> (the saved run's RunConfig fields and world_size, the run folder, the step it is at)
    of the checkpoint at path."""
    ckpt = checkpoint.find_checkpoint(path)
    state, _ = checkpoint.load_trainer_state(ckpt, arrays=False)
    types = {f.name: f.type for f in dataclasses.fields(RunConfig)}
    saved = {k: v for k, v in state["run_config"].items() if k in types}
    for name, value in saved.items():  # each checked for its range with the flags (validate)
        if not _of_type(value, types[name]):
            raise checkpoint.CheckpointError(
                f"{os.path.join(ckpt, checkpoint.STATE)}: run_config.{name} must be "
                f"{types[name].__name__}, got {value!r:.60}: the file is corrupt"
            )
    saved["world_size"] = state["world_size"]
    same = os.path.normpath(ckpt) == os.path.normpath(path)  # path is the checkpoint itself
    return saved, os.path.dirname(os.path.normpath(path)) if same else path, state["step"]


def _of_type(value, kind):
    """Whether a saved run config's value is of its RunConfig field's type (str: or None, as
    init_from and resume are, and model with --init-from)."""
    if kind is float:
        return type(value) in (int, float)
    return type(value) is kind or (kind is str and value is None)


def per_rank_batch(saved, given, folder):
    """The --batch-size that continues a saved run on this many ranks: the global batch
    (--batch-size x ranks) is fixed, so 4 x 2 ranks resumes as 8 x 1 or 2 x 4."""
    world = distributed.launched_rank_and_size()[1]
    total = saved["batch_size"] * saved.pop("world_size")
    if total % world:
        raise ValueError(
            f"the run in {folder} trains a global batch of {total} sequences "
            f"(--batch-size x ranks), which {world} ranks cannot share equally: "
            f"resume on a number of ranks that divides {total}"
        )
    batch = given.get("batch_size", total // world)
    if batch * world != total:
        raise ValueError(
            f"--batch-size {batch} on {world} rank(s) is a global batch of "
            f"{batch * world}; the run in {folder} trains {total}: use "
            f"--batch-size {total // world} (or leave it out)"
        )
    return batch


def resume_overrides(saved, given, folder):
    """The notes for flags that override the saved run; ValueError for one that cannot.
    --steps is left to the Trainer, whose warning says what it does to the schedule."""
    notes = []
    for name, value in given.items():
        if name in NOT_RESTORED or name not in saved or value == saved[name]:
            continue
        if name in FIXED_ON_RESUME:
            raise ValueError(
                f"{flag(name)} {value} cannot change on resume: the run in "
                f"{folder} was saved with {saved[name]} (start a new run with "
                "--out elsewhere to change it)"
            )
        if name != "steps":
            notes.append(
                f"note: {flag(name)} {_show(value)} overrides the saved {_show(saved[name])}"
            )
    return notes


def _show(value):
    return f"{value:g}" if isinstance(value, float) else str(value)


def validate(cfg):
    for name in ("batch_size", "seq_len", "grad_accum", "steps", "eval_iters"):
        if getattr(cfg, name) <= 0:
            raise ValueError(f"{flag(name)} must be positive, got {getattr(cfg, name)}")
    for name in ("warmup", "eval_every", "sample_every", "save_every", "max_skipped"):
        if getattr(cfg, name) < 0:
            raise ValueError(f"{flag(name)} must be >= 0, got {getattr(cfg, name)}")
    for f in dataclasses.fields(RunConfig):  # nan passes every comparison below
        if f.type is float and not math.isfinite(getattr(cfg, f.name)):
            raise ValueError(f"{flag(f.name)} must be a finite number, got {getattr(cfg, f.name)}")
    if cfg.zero not in (0, 1, 2):
        raise ValueError(
            f"--zero must be 0 (DDP), 1 (AdamW's state sharded) or 2 (and the "
            f"gradients), got {cfg.zero}"
        )
    if cfg.lr <= 0:
        raise ValueError(f"--lr must be positive, got {cfg.lr}")
    for name in ("min_lr", "weight_decay", "grad_clip"):
        if getattr(cfg, name) < 0:
            raise ValueError(f"{flag(name)} must be >= 0, got {getattr(cfg, name)}")
    if cfg.min_lr > cfg.lr:
        raise ValueError(
            f"--min-lr {cfg.min_lr} is above --lr {cfg.lr}: the schedule decays "
            "from --lr down to --min-lr"
        )
    config = cfg.model and from_preset(cfg.model)  # None: --init-from's own
    check_dtype(cfg.dtype)
    ExecutionOptions.of(cfg)
    be = backend.get(cfg.device)
    if not be.HOLDS_VALUES:
        raise ValueError(
            "--device meta cannot train: it holds shapes, not values (no token files, no loss); "
            "count a training step on it with python scripts/report.py --device meta"
        )
    supported = be.supported_dtypes()
    if cfg.dtype not in supported:
        raise ValueError(
            f"device {cfg.device} cannot train in {cfg.dtype}: it supports {', '.join(supported)}"
        )
    if not (cfg.init_from or cfg.resume):  # else the checkpoint's context (Trainer checks it)
        config.check_context(cfg.seq_len, "--seq-len")


def ensure_data(cfg):
    """Make the Shakespeare default if it is missing; other folders must be prepared first."""
    have = all(os.path.isfile(os.path.join(cfg.data_dir, f)) for f in ("train.bin", "val.bin"))
    if have:
        return
    if os.path.normpath(cfg.data_dir) != os.path.normpath(DEFAULT_DATA_DIR):
        raise FileNotFoundError(
            f"no train.bin/val.bin in {cfg.data_dir}: make them with "
            f"python scripts/prepare_data.py --out-dir {cfg.data_dir} "
            "--input YOUR_TEXT_FILES"
        )
    prepare(cfg.data_dir)


def main(argv=None):
    """Exit codes: 0 done, 1 the run diverged (or a rank failed), 2 bad input, 128 + N stopped
    by signal N (130 Ctrl-C, 143 SIGTERM)."""
    cfg, notes = resolve_on_every_rank(argv)
    with user_errors():
        comm = distributed.init_world(cfg.device)
    if cfg.zero and comm.size == 1:  # as ZeroRedundancyOptimizer and DeepSpeed run on 1 rank
        notes.append(
            f"note: --zero {cfg.zero} in one process has 1 rank to shard over, so it keeps all "
            "16 bytes per parameter; under mpirun -n R each rank keeps its 1/R share"
        )
    with rank_errors(comm):
        if comm.rank == 0:
            ensure_data(cfg)
        comm.barrier()
        trainer = Trainer(cfg, comm)
        for note in notes if comm.rank == 0 else ():
            print(note, file=sys.stderr)
        trainer.run()
    return trainer


def resolve_on_every_rank(argv):
    """resolve(argv), its refusal said once. Under mpirun every rank checks the command line on
    its own: rank 0 has said its refusal (args.fail), says here any other rank's, and no rank
    exits before it has, since mpirun kills the job when the first rank exits with an error."""
    refused = resolved = None
    try:
        with user_errors():
            resolved = resolve(argv)
    except Refused as e:
        refused = e
    with user_errors():
        world = distributed.host_world()
    mine = refused and refused.message
    said = distributed.gather_errors(world, mine)
    if said is None:
        return resolved
    if world.rank == 0 and said != mine:
        print(f"error: {said}", file=sys.stderr, flush=True)
    world.barrier()
    raise Refused(said)


@contextlib.contextmanager
def rank_errors(comm):
    """An error every rank meets at the same point (the ranks disagree, the run diverged) is
    said once, by rank 0, and the ranks exit together. Any other error under mpirun is said by
    the rank that met it, with its rank, and stops the job (MPI_Abort): the other ranks would
    otherwise wait for it in their next collective for ever."""
    try:
        yield
    except (Agreed, FloatingPointError) as e:
        code = 1 if isinstance(e, FloatingPointError) else getattr(e, "code", 2)  # 1: diverged
        if comm.rank == 0 and not getattr(e, "said", False):
            line = e if isinstance(e, Interrupted) else f"error: {e}"
            print(line, file=sys.stderr, flush=True)
        comm.barrier()
        sys.exit(code)
    except KeyboardInterrupt:  # a second Ctrl-C, or one before the first step
        print(
            "error: interrupted at once: a save in progress is dropped whole, the checkpoint "
            "before it is kept",
            file=sys.stderr,
        )
        comm.abort(128 + signal.SIGINT)
    except BaseException as e:
        code = e.code if isinstance(e, SystemExit) else 2 if isinstance(e, BAD_INPUT) else 1
        if comm.size == 1:
            if isinstance(e, BAD_INPUT):
                fail(e)
            raise
        if code == 1 and not isinstance(e, SystemExit):  # a bug: where it is
            traceback.print_exc()
        print(f"error: rank {comm.rank} of {comm.size}: {type(e).__name__}: {e}", file=sys.stderr)
        comm.abort(code if isinstance(code, int) else 1)
