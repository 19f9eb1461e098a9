"""Command line of examples/train_gpt2.py. Bad input is one line on stderr and exit code 2."""
import argparse
import os
import sys

from nn.gpt2 import PRESETS
from tinygrad_like import backend
from tinygrad_like.data import DEFAULT_DATA_DIR, prepare
from .loop import RunConfig, Trainer

# with no arguments: RunConfig's defaults (a small model that shows the loss falling in about
# 5 minutes on 2 CPU cores), or GPT-2 124M at its full context when a GPU is there
GPU_DEFAULTS = dict(model="gpt2", batch_size=16, seq_len=1024, steps=2000, lr=6e-4,
                    min_lr=6e-5, warmup=100, dtype="bf16", eval_every=250)


def parser():
    p = argparse.ArgumentParser(description="Train GPT-2 on the Shakespeare default (or any "
                                "prepared .bin data) with the tinygrad_like autograd.")
    p.add_argument("--model", help="preset: gpt2, gpt2-medium, gpt2-large, gpt2-xl, gpt2-mini, "
                   "gpt2-tiny (default: gpt2-mini on CPU, gpt2 on GPU)")
    p.add_argument("--init-from", help="fine-tune from a checkpoint or Hugging Face GPT-2 dir")
    p.add_argument("--data-dir", default="data/shakespeare",
                   help="folder with train.bin and val.bin (made if it is the default)")
    for flag, typ in (("--batch-size", int), ("--seq-len", int), ("--grad-accum", int),
                      ("--steps", int), ("--lr", float), ("--min-lr", float), ("--warmup", int),
                      ("--weight-decay", float), ("--grad-clip", float), ("--eval-every", int),
                      ("--eval-iters", int), ("--sample-every", int), ("--save-every", int),
                      ("--seed", int)):
        p.add_argument(flag, type=typ)
    p.add_argument("--dtype", help="fp32, fp16 or bf16 (default fp32 on CPU, bf16 on GPU)")
    p.add_argument("--device", help="cpu or cuda (default: cuda when a GPU is usable)")
    p.add_argument("--out", default="out", help="run folder: metrics.jsonl and checkpoint/")
    p.add_argument("--resume", help="continue the run saved in this folder")
    p.add_argument("--quiet", action="store_true", help="no progress bar or messages")
    p.add_argument("--no-save", dest="save", action="store_false", default=None,
                   help="write no checkpoint (a speed test: GPT-2 124M's is 1.5 GB)")
    p.add_argument("--no-report", dest="report", action="store_false", default=None,
                   help="skip the closing accounting report (it trains a twin model)")
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
            raise ValueError(f"--{name.replace('_', '-')} must be positive, got {getattr(cfg, name)}")
    for name in ("warmup", "eval_every", "sample_every", "save_every"):
        if getattr(cfg, name) < 0:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(cfg, name)}")
    if cfg.lr <= 0 or cfg.min_lr < 0 or cfg.weight_decay < 0 or cfg.grad_clip < 0:
        raise ValueError("--lr must be positive; --min-lr, --weight-decay, --grad-clip >= 0")
    if cfg.model not in PRESETS:
        raise ValueError(f"unknown preset {cfg.model!r}: use one of {', '.join(PRESETS)}")
    if cfg.dtype not in ("fp32", "fp16", "bf16"):
        raise ValueError(f"unknown dtype {cfg.dtype!r}: use fp32, fp16 or bf16")
    backend.check_device(cfg.device)
    supported = backend.get(cfg.device).supported_dtypes()
    if cfg.dtype not in supported:
        raise ValueError(f"device {cfg.device} cannot train in {cfg.dtype}: it supports "
                         f"{', '.join(supported)}")
    if not (cfg.init_from or cfg.resume) and cfg.seq_len > PRESETS[cfg.model].n_positions:
        raise ValueError(f"--seq-len {cfg.seq_len} is longer than the context of "
                         f"{PRESETS[cfg.model].n_positions} of {cfg.model}")


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
    try:
        cfg = config_from_args(argv)
        ensure_data(cfg)
        trainer = Trainer(cfg)
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    try:
        trainer.run()
    except FloatingPointError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    return trainer
