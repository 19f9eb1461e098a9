"""The training loop behind examples/train_gpt2.py: data, model, AdamW, loss scaling,
evaluation, sampling, metrics and checkpoints."""
import json
import math
import os
import time
from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

import tinygrad_like.ops as F
from nn import GPT2, GPT2Config
from nn.hf import read_config, read_state
from nn.tokenizer import get_tokenizer
from optim import AdamW, LossScaler, cosine_with_warmup
from tinygrad_like import backend, dtypes, no_grad, profiler
from tinygrad_like.memory import PERSISTENT, TRACKER

from . import checkpoint, mfu, report
from .corpus import DEFAULT_DATA_DIR
from .data import DataLoader
from .plot import plot_metrics
from .step import train_on


@dataclass
class RunConfig:
    """Every setting of a run. The defaults are the no-argument CPU run (gpt2-mini on the
    Shakespeare default, about 5 minutes on 2 cores); training/cli.py overrides them on a GPU."""
    model: str = "gpt2-mini"          # a preset of nn/gpt2.py (PRESETS) for a fresh model
    init_from: str = None             # fine-tune from this checkpoint or Hugging Face directory
    data_dir: str = DEFAULT_DATA_DIR  # folder with train.bin and val.bin (training/data.py)
    batch_size: int = 8               # sequences per micro-batch (B)
    seq_len: int = 128                # tokens per sequence (T), at most the model's context
    grad_accum: int = 1               # micro-batches per optimizer step
    steps: int = 550                  # optimizer steps in the whole run
    lr: float = 2e-3                  # peak learning rate, reached after the warmup
    min_lr: float = 2e-4              # the cosine schedule's floor at the last step
    warmup: int = 20                  # steps of linear warmup from 0 to lr
    weight_decay: float = 0.1         # AdamW's decoupled decay, on the 2-D weights only
    grad_clip: float = 1.0            # clip the global gradient norm to this (0 = off)
    dtype: str = "fp32"               # working weights and gradients: fp32, fp16 or bf16
    attention: str = "naive"          # naive (saves the T x T probabilities) or flash
    lm_head: str = "plain"            # plain (saves the B·T x V logits) or fused (row blocks)
    recompute: bool = False           # blocks save only their input and redo their forward
    device: str = "cpu"               # cpu or cuda
    eval_every: int = 50              # steps between validation losses (0 = never)
    eval_iters: int = 10              # validation batches per evaluation
    sample_every: int = 0             # steps between printed samples (0 = never)
    out: str = "out"                  # run folder: metrics.jsonl, checkpoint/, loss.png
    save_every: int = 0               # steps between checkpoints (0 = only at the end)
    resume: str = None                # continue the run saved in this folder
    seed: int = 1337                  # initial weights, batch order and dropout
    quiet: bool = False               # no progress bar, messages or report
    save: bool = True                 # write checkpoints (off for speed tests: 1.5 GB for gpt2)
    report: bool = True               # print the accounting report after training


class Trainer:
    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        self.device = backend.check_device(cfg.device)
        self.dtype = dtypes.as_dtype(cfg.dtype)
        self.options = dict(attention=cfg.attention, lm_head=cfg.lm_head, recompute=cfg.recompute)
        self.resume_state = None
        self.model = self._build_model()
        self.model.config.check_context(cfg.seq_len, "--seq-len")
        self.optimizer = AdamW(self.model.named_parameters(), lr=cfg.lr,
                               weight_decay=cfg.weight_decay, grad_clip=cfg.grad_clip,
                               dtype=self.dtype)
        self.scaler = LossScaler() if self.dtype == dtypes.float16 else None
        self.train_data = DataLoader(os.path.join(cfg.data_dir, "train.bin"), cfg.batch_size,
                                     cfg.seq_len, seed=cfg.seed)
        self.val_path = os.path.join(cfg.data_dir, "val.bin")
        self.step = 0
        F.manual_seed(cfg.seed)
        if self.resume_state is not None:
            self._restore(*self.resume_state)
        n = self.model.num_parameters()
        self.flops_per_token = mfu.training_flops_per_token(self.model.config, cfg.seq_len, n)

    # ---- set-up
    def _build_model(self):
        cfg = self.cfg
        source = cfg.resume or cfg.init_from
        if source is None:
            return GPT2(GPT2Config.from_preset(cfg.model), seed=cfg.seed, device=self.device,
                        **self.options)
        ckpt = checkpoint.find_checkpoint(source)
        model = GPT2(read_config(ckpt), seed=cfg.seed, device=self.device, **self.options)
        model.load_state_dict(read_state(ckpt))        # fp32 master: any --dtype can follow
        if cfg.resume:
            self.resume_state = checkpoint.load_trainer_state(ckpt)
        return model

    def _restore(self, state, optimizer_arrays):
        self.optimizer.load_state_dict(optimizer_arrays, state["optimizer"])
        self.step = state["step"]
        self.train_data.load_state_dict(state["data"])
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        F.set_rng_state(state["dropout_rng"])

    # ---- one optimizer step over grad_accum micro-batches
    def train_step(self):
        cfg = self.cfg
        lr = cosine_with_warmup(self.step, cfg.lr, cfg.min_lr, cfg.warmup, cfg.steps)
        batches = [self.train_data.next_batch() for _ in range(cfg.grad_accum)]
        loss, norm, skipped = train_on(self.model, self.optimizer, batches, self.scaler, lr)
        return loss, lr, norm, skipped

    @no_grad()
    @profiler.phase("other")
    def evaluate(self):
        """Mean loss over eval_iters fixed validation batches (the same ones every time)."""
        self.model.eval()
        loader = DataLoader(self.val_path, self.cfg.batch_size, self.cfg.seq_len, seed=0)
        losses = [self.model(*loader.next_batch())[1].item() for _ in range(self.cfg.eval_iters)]
        self.model.train()
        return float(np.mean(losses))

    def sample(self, prompt="\n", tokens=48):
        tok = get_tokenizer()
        ids = self.model.generate(np.array([tok.encode(prompt)]), tokens, temperature=0.8,
                                  top_k=200, seed=self.cfg.seed)
        return tok.decode(ids[0].tolist())

    def save(self):
        cfg = self.cfg
        state = {"step": self.step, "data": self.train_data.state_dict(),
                 "scaler": self.scaler.state_dict() if self.scaler else None,
                 "dropout_rng": F.get_rng_state(), "run_config": vars(cfg),
                 "dtype": cfg.dtype}
        return checkpoint.save_checkpoint(cfg.out, self.model, self.optimizer, state)

    # ---- reporting
    def memory_table(self):
        persistent = {tag: TRACKER.current[tag] for tag in PERSISTENT}
        return report.state_memory_table(persistent, self.model.num_parameters(),
                                         dtypes.name(self.dtype),
                                         "measured from the buffers allocated for this run")

    # ---- the run
    def run(self):
        cfg = self.cfg
        say = (lambda *a: None) if cfg.quiet else tqdm.write
        os.makedirs(cfg.out, exist_ok=True)
        peak, peak_name = mfu.device_peak(self.device, dtypes.name(self.dtype))
        say(f"model {cfg.resume or cfg.init_from or cfg.model}: "
            f"{self.model.num_parameters():,} parameters, device {self.device}, dtype {cfg.dtype}")
        say(self.memory_table())
        say(f"MFU divides 6N + 12LCT = {self.flops_per_token / 1e6:.1f} MFLOP/token by the "
            f"{peak_name}")
        tokens_per_step = cfg.batch_size * cfg.seq_len * cfg.grad_accum
        metrics = open(os.path.join(cfg.out, "metrics.jsonl"), "a")
        bar = tqdm(total=cfg.steps, initial=self.step, disable=cfg.quiet, dynamic_ncols=True)
        history = []
        try:
            while self.step < cfg.steps:
                t0 = time.perf_counter()
                loss, lr, norm, skipped = self.train_step()
                backend.get(self.device).synchronize()
                dt = time.perf_counter() - t0
                if not math.isfinite(loss) and self.scaler is None:
                    raise FloatingPointError(
                        f"loss is {loss} at step {self.step}: stopping; the last good checkpoint "
                        f"in {cfg.out} is kept (lower --lr or use --grad-clip)")
                self.step += 1
                tps = tokens_per_step / dt
                row = {"step": self.step, "loss": loss, "lr": lr, "grad_norm": norm,
                       "tokens_per_s": tps, "ms": dt * 1e3,
                       "mfu": tps * self.flops_per_token / peak}
                if self.scaler is not None:
                    row.update(loss_scale=self.scaler.scale, skipped=skipped,
                               skipped_total=self.scaler.skipped_steps)
                if cfg.eval_every and (self.step % cfg.eval_every == 0 or self.step == cfg.steps):
                    row["val_loss"] = self.evaluate()
                    say(f"step {self.step}: train loss {loss:.4f}, val loss {row['val_loss']:.4f}")
                metrics.write(json.dumps(row) + "\n")
                metrics.flush()
                history.append(row)
                bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{tps:,.0f}", mfu=f"{row['mfu']:.1%}")
                bar.update(1)
                if cfg.sample_every and self.step % cfg.sample_every == 0:
                    say(f"sample at step {self.step}: {self.sample()!r}")
                if cfg.save and cfg.save_every and self.step % cfg.save_every == 0:
                    self.save()
        finally:
            bar.close()
            metrics.close()
        if cfg.save:
            path = self.save()
            say(f"checkpoint: {path}")
        say(f"metrics: {plot_metrics(cfg.out)} (python scripts/plot_metrics.py {cfg.out})")
        if cfg.report and not cfg.quiet:  # predicted vs measured, measured on a twin model
            say(report.for_trainer(self))
        return history
