"""Command line of examples/train_gpt2.py: one flag per RunConfig field, its help the field's
comment. Bad input is one line on stderr and exit code 2 (training/args.py)."""
import dataclasses
import inspect
import os
import re
import sys

from nn import GPT2Config
from nn.gpt2 import check_options
from tinygrad_like import backend

from .args import ArgumentParser, check_dtype, user_errors
from .corpus import DEFAULT_DATA_DIR, prepare
from .loop import RunConfig, Trainer

# with no arguments: RunConfig's defaults (a small model that shows the loss falling in about
# 5 minutes on 2 CPU cores), or GPT-2 124M at its full context when a GPU is there
GPU_DEFAULTS = dict(model="gpt2", batch_size=16, seq_len=1024, steps=2000, lr=6e-4,
                    min_lr=6e-5, warmup=100, dtype="bf16", eval_every=250)


def _comments():
    """RunConfig's one-line comments, field name -> text (the one place they are written)."""
    return dict(re.findall(r"^\s+(\w+): [^#\n]*#\s*(.+)$", inspect.getsource(RunConfig), re.M))


def _flag(name):
    return "--" + name.replace("_", "-")


def parser():
    p = ArgumentParser(description="Train GPT-2 on the Shakespeare default (or any prepared "
                       ".bin data) with the tinygrad_like autograd.")
    comments = _comments()
    for f in dataclasses.fields(RunConfig):
        flag, text = _flag(f.name), comments[f.name]
        if f.type is bool:  # on/off switches: --quiet turns one on, --no-save one off
            on = not f.default
            p.add_argument(flag if on else "--no-" + flag[2:], dest=f.name, default=None,
                           action="store_true" if on else "store_false", help=text)
            continue
        if f.default is not None:
            gpu = GPU_DEFAULTS.get(f.name)
            text += f" (default {f.default}" + (f"; {gpu} on a GPU)" if gpu else ")")
        p.add_argument(flag, type=f.type, help=text, metavar=f.name.upper())
    return p


def config_from_args(argv=None) -> RunConfig:
    args = parser().parse_args(argv)
    device = args.device or backend.default_device()
    defaults = GPU_DEFAULTS if device == "cuda" else {}
    given = {k: v for k, v in vars(args).items() if v is not None}
    cfg = RunConfig(**{**defaults, "device": device, **given})
    validate(cfg)
    return cfg


def validate(cfg):
    for name in ("batch_size", "seq_len", "grad_accum", "steps", "eval_iters"):
        if getattr(cfg, name) <= 0:
            raise ValueError(f"{_flag(name)} must be positive, got {getattr(cfg, name)}")
    for name in ("warmup", "eval_every", "sample_every", "save_every"):
        if getattr(cfg, name) < 0:
            raise ValueError(f"{_flag(name)} must be >= 0, got {getattr(cfg, name)}")
    if cfg.lr <= 0 or cfg.min_lr < 0 or cfg.weight_decay < 0 or cfg.grad_clip < 0:
        raise ValueError("--lr must be positive; --min-lr, --weight-decay, --grad-clip >= 0")
    config = GPT2Config.from_preset(cfg.model)
    check_dtype(cfg.dtype)
    check_options(cfg.attention, cfg.lm_head, cfg.recompute)
    backend.check_device(cfg.device)
    supported = backend.get(cfg.device).supported_dtypes()
    if cfg.dtype not in supported:
        raise ValueError(f"device {cfg.device} cannot train in {cfg.dtype}: it supports "
                         f"{', '.join(supported)}")
    if not (cfg.init_from or cfg.resume):  # else the checkpoint's context (Trainer checks it)
        config.check_context(cfg.seq_len, "--seq-len")


def ensure_data(cfg):
    """Make the Shakespeare default if it is missing; other folders must be prepared first."""
    have = all(os.path.isfile(os.path.join(cfg.data_dir, f)) for f in ("train.bin", "val.bin"))
    if have:
        return
    if os.path.normpath(cfg.data_dir) != os.path.normpath(DEFAULT_DATA_DIR):
        raise FileNotFoundError(f"no train.bin/val.bin in {cfg.data_dir}: make them with "
                                f"python scripts/prepare_data.py --out-dir {cfg.data_dir} "
                                "--input YOUR_TEXT_FILES")
    prepare(cfg.data_dir)


def main(argv=None):
    with user_errors():
        cfg = config_from_args(argv)
        ensure_data(cfg)
        trainer = Trainer(cfg)
    try:
        trainer.run()
    except FloatingPointError as e:  # the run diverged: not a bad input, so exit code 1
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    return trainer
