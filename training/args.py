"""What every command-line program of the project shares: one bad-input convention (one line
`error: ...` on stderr, exit code 2) and one argument set for the model, dtype, device, batch
and sequence length, so train_gpt2.py and the scripts check them the same way."""

import argparse
import contextlib
import dataclasses
import sys

from accounting.measure import check_measurable, random_batch
from nn import PRESETS, ExecutionOptions, LlamaConfig, from_preset
from tinygrad_like import backend, distributed, dtypes

from .data import DataLoader

BAD_INPUT = (ValueError, FileNotFoundError, RuntimeError)  # what a user's mistake raises


def flag(name):
    """A setting's command-line flag: batch_size -> --batch-size."""
    return "--" + name.replace("_", "-")


class Refused(SystemExit):
    """fail()'s exit (code 2), with its message: under mpirun the ranks compare theirs."""

    def __init__(self, message):
        super().__init__(2)
        self.message = str(message)


def fail(message):
    """The one-line error and exit 2. Under mpirun every rank checks the same command line and
    meets the same error: rank 0 alone says it (training/cli.py makes the ranks wait for it)."""
    if distributed.launched_rank_and_size()[0] == 0:
        print(f"error: {message}", file=sys.stderr, flush=True)
    raise Refused(message)


@contextlib.contextmanager
def user_errors():
    """with user_errors(): ...  turns a bad input's exception into its one-line error."""
    try:
        yield
    except BAD_INPUT as e:
        fail(e)


class ArgumentParser(argparse.ArgumentParser):
    """argparse, with its errors (a bad value, an unknown flag) as one line and exit 2."""

    def error(self, message):
        fail(f"{message} (see {self.prog} --help)")

    def formats(self, value, allowed):
        """value's comma-separated format names -> their list, each one of allowed, else the
        one-line error naming the first that is not."""
        names = value.split(",")
        bad = [f for f in names if f not in allowed]
        if bad:
            self.error(f"unknown format {bad[0]!r}: choose from {', '.join(allowed)}")
        return names


def add_model_args(p, model="gpt2-mini", batch_size=1, seq_len=64):
    """--model, --batch-size, --seq-len, --dtype, --device with these defaults."""
    p.add_argument("--model", default=model, help=f"preset: {', '.join(PRESETS)} (default {model})")
    p.add_argument(
        "--batch-size",
        type=int,
        default=batch_size,
        help=f"sequences per batch (default {batch_size})",
    )
    p.add_argument(
        "--seq-len", type=int, default=seq_len, help=f"tokens per sequence (default {seq_len})"
    )
    p.add_argument("--dtype", default="fp32", help=f"{', '.join(dtypes.TRAINING)} (default fp32)")
    p.add_argument(
        "--device", help=f"{' or '.join(backend.DEVICES)} (default: cuda when a GPU is usable)"
    )
    p.add_argument(
        "--n-kv-head",
        type=int,
        help="a Llama preset with this many key/value heads (grouped-query attention; "
        "default: the preset's)",
    )


def config_from_args(args):
    """The --model preset's config, with --n-kv-head for a Llama preset."""
    if args.n_kv_head is None:
        return from_preset(args.model)
    if not isinstance(from_preset(args.model), LlamaConfig):
        raise ValueError(f"--n-kv-head applies to a Llama preset, not {args.model}")
    return from_preset(args.model, num_key_value_heads=args.n_kv_head)


def add_setting_flags(p, settings, gpu_defaults=None):
    """One flag per field of the dataclass settings (ExecutionOptions, RunConfig), its help the
    field's metadata "help" and its default: a bool an on/off switch (--recompute turns one on,
    --no-save one off), any other a value of the field's type. A flag not given parses as None,
    so that a resumed run tells the flags given from its saved settings. gpu_defaults: the
    defaults a GPU run takes instead, named in the help."""
    for f in dataclasses.fields(settings):
        name, text = flag(f.name), f.metadata["help"]
        if f.type is bool:
            on = not f.default
            p.add_argument(
                name if on else "--no-" + name[2:],
                dest=f.name,
                default=None,
                action="store_true" if on else "store_false",
                help=text,
            )
            continue
        if f.default is not None:
            gpu = (gpu_defaults or {}).get(f.name)
            text += f" (default {f.default}" + (f"; {gpu} on a GPU)" if gpu else ")")
        p.add_argument(name, type=f.type, help=text, metavar=f.name.upper())


def add_option_args(p):
    """--attention, --lm-head, --lm-head-design, --recompute: the model's execution options
    (nn/options.py), with its defaults."""
    add_setting_flags(p, ExecutionOptions)


def options_from_args(args):
    """-> GPT2's (and measure()'s) keyword arguments for the options add_option_args parsed:
    {"options": ExecutionOptions}, checked (ValueError)."""
    names = (f.name for f in dataclasses.fields(ExecutionOptions))
    chosen = {name: getattr(args, name) for name in names if getattr(args, name) is not None}
    return {"options": ExecutionOptions(**chosen)}


def add_step_args(p, model):
    """What a script that measures one training step takes: the model arguments, the
    execution options and --data."""
    add_model_args(p, model=model)
    add_option_args(p)
    add_data_arg(p)


def add_data_arg(p):
    p.add_argument(
        "--data",
        metavar="BIN",
        help="draw the batch from this token file "
        "(e.g. data/shakespeare/val.bin); default random ids",
    )


def batch_from_args(args, vocab_size):
    """(x, y) (B, T): the first batch of --data (seed 0), or random ids when it is not given.
    A device that holds no values (meta) refuses --data: it would drop the ids (a step's counts
    do not depend on them)."""
    if args.data:
        backend.get(args.device).require_values("--data (a token file)")
        return DataLoader(args.data, args.batch_size, args.seq_len, seed=0).next_batch()
    return random_batch(vocab_size, args.batch_size, args.seq_len)


def check_model_args(args, model_from_checkpoint=False):
    """Validate add_model_args' values (raises ValueError) and resolve args.device: the one
    place a script's device is resolved and checked (backend.resolve)."""
    if args.batch_size <= 0 or args.seq_len <= 0:
        raise ValueError(
            f"--batch-size and --seq-len must be positive, got {args.batch_size} and {args.seq_len}"
        )
    check_dtype(args.dtype)
    args.device = backend.resolve(args.device)
    check_measurable(args.device, args.dtype)
    if not model_from_checkpoint:
        config_from_args(args).check_context(args.seq_len, "--seq-len")


def check_dtype(name):
    if name not in dtypes.TRAINING:
        raise ValueError(f"unknown dtype {name!r}: use one of {', '.join(dtypes.TRAINING)}")
