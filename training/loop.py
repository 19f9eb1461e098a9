"""The training loop behind examples/train_gpt2.py: data, model, AdamW, loss scaling,
evaluation, sampling, metrics and checkpoints."""

import contextlib
import errno
import json
import math
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

import nn
from accounting import fits, mfu, predictions, report
from nn import ExecutionOptions, from_preset
from nn.hf import read_config, read_state
from nn.options import setting, with_options
from nn.tokenizer import get_tokenizer
from optim import AdamW, LossScaler, cosine_with_warmup
from optim.scaler import MIN_SCALE
from optim.step import device_step, train_on
from tinygrad_like import backend, dtypes, graph, no_grad, profiler, rng
from tinygrad_like.distributed import (
    Communicator,
    gather_errors,
    local_size,
    say_past_the_launcher,
)
from tinygrad_like.files import atomic_write, file_sha256
from tinygrad_like.gemm_library import choose as choose_gemm_library
from tinygrad_like.kernels.gemm.cpu_bf16 import use_training_pool
from tinygrad_like.memory import PERSISTENT, TRACKER

from . import checkpoint
from .args import BAD_INPUT, flag
from .corpus import DEFAULT_DATA_DIR
from .data import DataLoader
from .plot import plot_metrics, read_metrics


@dataclass
@with_options
class RunConfig:
    """Every setting of a run, the model's ExecutionOptions among them (declared in
    nn/options.py: with_options adds their fields after these, help included). The defaults
    are the no-argument CPU run (gpt2-mini on the Shakespeare default, about 5 minutes on 2
    cores); training/cli.py overrides them on a GPU."""

    model: str = setting("gpt2-mini", "a preset of nn/config.py (PRESETS) for a fresh model")
    init_from: str = setting(None, "fine-tune from this checkpoint or Hugging Face directory")
    data_dir: str = setting(
        DEFAULT_DATA_DIR, "folder with train.bin and val.bin (training/data.py)"
    )
    batch_size: int = setting(8, "sequences per micro-batch (B)")
    seq_len: int = setting(128, "tokens per sequence (T), at most the model's context")
    grad_accum: int = setting(1, "micro-batches per optimizer step")
    steps: int = setting(550, "optimizer steps in the whole run")
    lr: float = setting(2e-3, "peak learning rate, reached after the warmup")
    min_lr: float = setting(2e-4, "the cosine schedule's floor at the last step")
    warmup: int = setting(20, "steps of linear warmup from 0 to lr")
    weight_decay: float = setting(0.1, "AdamW's decoupled decay, on the 2-D weights only")
    grad_clip: float = setting(1.0, "clip the global gradient norm to this (0 = off)")
    dtype: str = setting("fp32", "working weights and gradients: fp32, fp16 or bf16")
    zero: int = setting(0, "under mpirun, ZeRO stage: 0 DDP, 1 shard AdamW, 2 and grads")
    device: str = setting("cpu", "cpu or cuda")
    eval_every: int = setting(50, "steps between validation losses (0 = never)")
    eval_iters: int = setting(10, "validation batches per evaluation")
    sample_every: int = setting(0, "steps between printed samples (0 = never)")
    out: str = setting("out", "run folder: metrics.jsonl, checkpoint/, loss.png")
    save_every: int = setting(0, "steps between checkpoints (0 = only at the end)")
    resume: str = setting(None, "continue the run saved in this folder, with its settings")
    overwrite: bool = setting(False, "start afresh in an --out that already holds a run")
    max_skipped: int = setting(50, "fp16: stop after this many skipped steps in a row (0 = off)")
    seed: int = setting(1337, "initial weights, batch order and dropout")
    compile: bool = setting(
        False, "capture the training step once and replay it without the op layer (the same bits)"
    )
    quiet: bool = setting(False, "no progress bar, messages or report")
    # on by default: the help says what their flags, --no-save and --no-report, do
    save: bool = setting(True, "write no checkpoint (speed tests: 1.5 GB for gpt2)")
    report: bool = setting(True, "print no accounting report after training")


class Trainer:
    """One rank's run. comm: the data-parallel world (distributed.init_world); rank 0 alone
    prints, writes the run folder and checkpoints, the others train their rows of each batch."""

    def __init__(self, cfg: RunConfig, comm=None):
        self.cfg = cfg
        self.comm = comm or Communicator()
        self.rank0 = self.comm.rank == 0
        self.device = cfg.device  # resolved where the command line was read (training/cli.py)
        self.dtype = dtypes.as_dtype(cfg.dtype)
        be = backend.get(self.device)
        on_cpu = be.HOLDS_VALUES and not be.GPU
        if on_cpu:  # the CPU: before its first kernel fixes the pool
            use_training_pool(cfg.dtype)
        self.options = ExecutionOptions.of(cfg)
        self.resume_state = None
        self.resumed_from = None  # the checkpoint folder a resumed run was loaded from
        with self._errors_said_once():
            self.model, weights = self._build_model()
            self.model.config.check_context(cfg.seq_len, "--seq-len")
            config, B, T = self.model.config, cfg.batch_size, cfg.seq_len
            self.gemm_library = on_cpu and choose_gemm_library(config, B, T, cfg.dtype)
            vocab = self.model.config.vocab_size
            shard = dict(rank=self.comm.rank, world=self.comm.size)
            self.train_data = DataLoader(
                os.path.join(cfg.data_dir, "train.bin"),
                cfg.batch_size,
                cfg.seq_len,
                seed=cfg.seed,
                vocab_size=vocab,
                **shard,
            )
            self.val_path = os.path.join(cfg.data_dir, "val.bin")
            # checked now (ids, length, format), not at the first evaluation dozens of steps in
            DataLoader(self.val_path, cfg.batch_size, cfg.seq_len, vocab_size=vocab)
        self._check_same_on_every_rank()
        # the working dtype: the weights in one flat buffer of it (in equal shards under ZeRO),
        # which AdamW views; its fp32 master starts from the weights as they were before
        self.model.flatten_parameters(self.dtype, shards=self.comm.size if cfg.zero else 1)
        self.optimizer = AdamW(
            self.model.named_parameters(),
            lr=cfg.lr,
            weight_decay=cfg.weight_decay,
            grad_clip=cfg.grad_clip,
            master=weights,
            comm=self.comm,
            zero=cfg.zero,
        )
        self.scaler = LossScaler() if self.dtype == dtypes.float16 else None
        self.step_collectives = []  # the collectives of the last step (the report's)
        self.step = 0
        rng.manual_seed(cfg.seed)
        if self.resume_state is not None:
            self._restore(*self.resume_state)
        self.flops_per_token = self.model.config.flops_per_token(cfg.seq_len)

    # ---- set-up
    def _build_model(self):
        """-> (the model in fp32; its weights, name -> fp32 array, for AdamW's master: a fresh
        model's as drawn, or the checkpoint's)."""
        cfg = self.cfg
        source = cfg.resume or cfg.init_from
        self._check_fits(
            read_config(checkpoint.find_checkpoint(source)) if source else from_preset(cfg.model)
        )
        if source is None:  # the preset's family: GPT-2 or Llama
            config = from_preset(cfg.model)
            model = nn.build(config, seed=cfg.seed, device=self.device, options=self.options)
            return model, model.state_dict()
        ckpt = checkpoint.find_checkpoint(source)
        if cfg.resume:  # verifies every file's sha256 first
            self.resume_state = checkpoint.load_trainer_state(ckpt)
            self.resumed_from = ckpt
        else:
            checkpoint.verify(ckpt)
        model = nn.build(read_config(ckpt), seed=cfg.seed, device=self.device, options=self.options)
        weights = read_state(ckpt)  # the fp32 master: any --dtype can follow
        model.load_state_dict(weights)
        return model, weights

    @contextlib.contextmanager
    def _errors_said_once(self):
        """Every rank reads the same checkpoint and token files at start-up, so a bad one
        fails on every rank: the ranks compare their errors here, before the first collective,
        and all raise Agreed, which rank 0 alone says (cli.rank_errors)."""
        if self.comm.size == 1:
            yield
            return
        error = None
        try:
            yield
        except BAD_INPUT as e:
            error = str(e)
        said = gather_errors(self.comm, error)
        if said is not None:
            raise Agreed(said)

    def _check_fits(self, config):
        """DoesNotFit before anything big is allocated when this run's predicted peak is more
        than the memory there: one the machine's ranks share (a CPU's) counts them all, and the
        report's twin
        (rank 0 measures one at the end) comes beside this run's state (counted with its
        activations, which are gone by then: an upper bound)."""
        cfg, R = self.cfg, self.comm.size
        shape = (config, cfg.batch_size, cfg.seq_len, cfg.dtype)
        need = predictions.predicted_peak_bytes(*shape, self.options, zero=cfg.zero, world=R)
        shared = backend.get(self.device).HOST_MEMORY
        need *= local_size() if shared else 1
        twin = cfg.report and not cfg.quiet and (self.rank0 or shared)
        need += predictions.predicted_peak_bytes(*shape, self.options) if twin else 0
        fits.check(
            need,
            self.device,
            f"training {cfg.resume or cfg.init_from or cfg.model} at --batch-size "
            f"{cfg.batch_size} x --seq-len {cfg.seq_len} in {cfg.dtype}"
            + (f" on {local_size()} ranks here" if shared and R > 1 else "")
            + (" with the report's twin" if twin else ""),
            "lower --batch-size or --seq-len, or try --recompute"
            + (", --zero 1 or 2" if R > 1 else "")
            + (", --no-report" if twin else ""),
        )

    def _check_same_on_every_rank(self):
        """Refuse a world whose ranks would train different things: another setting, model or
        data file on one of them (distributed.Mismatch, raised on every rank)."""
        if self.comm.size == 1:
            return
        mine = {
            **{flag(k): v for k, v in vars(self.cfg).items()},
            "the model": repr(self.model.config),
            "train.bin": _file_fingerprint(self.train_data.path),
            "val.bin": _file_fingerprint(self.val_path),
        }
        ranks = self.comm.all_gather_object(mine)  # the same list on every rank
        for rank, theirs in enumerate(ranks[1:], 1):
            for key, value in ranks[0].items():
                if theirs.get(key) != value:
                    raise Mismatch(
                        f"rank {rank} runs with {key} {theirs.get(key)} where rank 0 "
                        f"has {value}: every rank must run the same command on the "
                        "same files"
                    )

    def _restore(self, state, optimizer_arrays):
        self.optimizer.load_state_dict(optimizer_arrays, state["optimizer"])
        self.step = state["step"]
        self.train_data.load_state_dict(state["data"])
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        rng.set_rng_state(state["dropout_rng"])
        saved_steps = (state.get("run_config") or {}).get("steps", self.cfg.steps)
        if saved_steps != self.cfg.steps and self.rank0:  # the schedule depends on the total
            print(
                f"warning: --steps {self.cfg.steps} differs from the saved run's {saved_steps}: "
                f"the cosine schedule changes from step {self.step} on (lr "
                f"{self._lr(self.step, saved_steps):.3g} -> {self._lr(self.step):.3g})",
                file=sys.stderr,
            )

    def _lr(self, step, steps=None):
        cfg = self.cfg
        return cosine_with_warmup(step, cfg.lr, cfg.min_lr, cfg.warmup, steps or cfg.steps)

    # ---- one optimizer step over grad_accum micro-batches
    def train_step(self):
        cfg = self.cfg
        lr = self._lr(self.step)
        batches = [self.train_data.next_batch() for _ in range(cfg.grad_accum)]
        step = self._captured if cfg.compile else device_step
        with self.comm.recording() as collectives:
            loss, norm, skipped = train_on(
                self.model, self.optimizer, batches, self.scaler, lr, step=step
            )
        self.step_collectives = collectives
        return loss, lr, norm, skipped

    def _captured(self, model, optimizer, batches, scaler, watch=None):
        """device_step captured (tinygrad_like.compile): its inputs the micro-batches stacked,
        (grad_accum, B, T) token ids and targets, on the model's device (an array moved there
        inside the step would be a new one each call, which a replay cannot pass)."""
        if not hasattr(self, "_step"):
            self._step = graph.compile(
                lambda xs, ys: device_step(model, optimizer, list(zip(xs, ys)), scaler)
            )
        be = backend.get(self.device)
        return self._step(*(be.asarray(np.stack(part)) for part in zip(*batches)))

    @no_grad()
    @profiler.phase("other")
    def evaluate(self):
        """Mean loss over eval_iters fixed validation batches (the same ones every time). Data
        parallel: split as training is (each rank its rows of the global batch), the means
        averaged over the ranks."""
        self.model.eval()
        loader = DataLoader(
            self.val_path,
            self.cfg.batch_size,
            self.cfg.seq_len,
            seed=0,
            rank=self.comm.rank,
            world=self.comm.size,
        )
        losses = [self.model(*loader.next_batch())[1].item() for _ in range(self.cfg.eval_iters)]
        self.model.train()
        return self.comm.sum_scalar(float(np.mean(losses)), what="val loss") / self.comm.size

    def sample(self, prompt="\n", tokens=48):
        tok = get_tokenizer()
        ids = self.model.generate(
            np.array([tok.encode(prompt)]), tokens, temperature=0.8, top_k=200, seed=self.cfg.seed
        )
        return tok.decode(ids[0].tolist())

    def save(self):
        """Every rank takes part (ZeRO gathers the shards); rank 0 writes one checkpoint,
        whatever the number of ranks, while the others wait."""
        cfg = self.cfg
        state = {
            "step": self.step,
            "data": self.train_data.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler else None,
            "dropout_rng": rng.get_rng_state(),
            "run_config": vars(cfg),
            "dtype": cfg.dtype,
            "world_size": self.comm.size,
        }
        master, optimizer_state = self.optimizer.master_state(), self.optimizer.state_dict()
        path = None
        if self.rank0:
            path = checkpoint.save_checkpoint(cfg.out, self.model, master, optimizer_state, state)
        self.comm.barrier()
        return path

    # ---- reporting
    def memory_table(self):
        """The persistent state's bytes per parameter, every rank's measured (a collective)."""
        persistent = {tag: TRACKER.current[tag] for tag in PERSISTENT}
        opt = self.optimizer
        return report.state_memory_table(
            persistent,
            self.model.num_parameters(),
            dtypes.name(self.dtype),
            "measured from the buffers allocated for this run",
            zero=opt.zero,
            ranks=self.comm.all_gather_object(persistent),
            elements=opt.numel,
            padding=opt.padding,
        )

    # ---- the run folder
    def _claim_out(self):
        """Lock cfg.out for this run (the returned file holds it), refuse to overwrite another
        run's checkpoint by accident (checkpoint.claim_run_folder), and cut metrics.jsonl back
        to the step the run starts from (rows replayed since the last save, a partial line left
        by a kill)."""
        cfg = self.cfg
        lock = checkpoint.claim_run_folder(cfg.out, cfg.overwrite, self.resumed_from)
        try:
            self._cut_metrics_back()
        except BaseException:
            lock.close()
            raise
        return lock

    def _cut_metrics_back(self):
        out = self.cfg.out
        try:
            _trim_metrics(os.path.join(out, "metrics.jsonl"), self.step)
        except OSError as e:  # a full disk: the rows are written again whole (atomic_write)
            what = checkpoint.write_failed(out, e, f"metrics.jsonl cut back to step {self.step}")
            raise checkpoint.CheckpointError(f"{what}; {checkpoint.on_disk(out)}") from None

    def _append(self, metrics, row):
        """One row of metrics.jsonl; a full disk stops the run (CheckpointError: exit 2), since
        the rows are the run's record. A short write is a full disk too."""
        out, line = self.cfg.out, (strict_json(row) + "\n").encode()
        try:
            if metrics.write(line) != len(line):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError as e:
            what = checkpoint.write_failed(out, e, f"step {row['step']}'s row of metrics.jsonl")
            stop = f"{what}: stopping; {checkpoint.on_disk(out)}"
            raise checkpoint.CheckpointError(stop) from None

    def _plot(self, say):
        """Draw loss.png. The run is done and saved by now: a picture that cannot be written (a
        full disk) is a warning, not an exit 1 (diverged) or 2."""
        out = self.cfg.out
        try:
            say(f"metrics: {plot_metrics(out)} (python scripts/plot_metrics.py {out})")
        except OSError as e:
            print(
                f"warning: {checkpoint.write_failed(out, e, 'loss.png')}; the run is saved: "
                f"draw it later with python scripts/plot_metrics.py {out}",
                file=sys.stderr,
            )

    def _stop_if_diverged(self, loss, skipped):
        """FloatingPointError (exit 1) when the run cannot go on: a non-finite loss in fp32 or
        bf16, or in fp16 a loss scale under MIN_SCALE or max_skipped skipped steps in a row."""
        cfg, scaler = self.cfg, self.scaler
        if scaler is None:
            if math.isfinite(loss):
                return
            why, fix = f"loss is {loss} at step {self.step}", "lower --lr or use --grad-clip"
        elif not skipped:
            return
        elif scaler.scale < MIN_SCALE:
            why = (
                f"the fp16 loss scale fell to {scaler.scale:.3g}, below 2^-24, at step "
                f"{self.step}: the overflows do not come from the scale"
            )
            fix = "lower --lr, or train in bf16 or fp32"
        elif cfg.max_skipped and scaler.skips_in_a_row >= cfg.max_skipped:
            why = (
                f"fp16 skipped {scaler.skips_in_a_row} steps in a row for inf/nan gradients "
                f"at step {self.step} (loss scale {scaler.scale:.3g})"
            )
            fix = "lower --lr, raise --max-skipped, or train in bf16"
        else:
            return
        raise FloatingPointError(f"{why}: stopping; {checkpoint.on_disk(cfg.out)} ({fix})")

    # ---- stopping on a signal
    def _catch_stop_signals(self):
        """From now on SIGINT (Ctrl-C) and SIGTERM ask for a stop at the next step boundary
        (_stop_if_asked); the first one puts the previous handlers back, so that a second one
        stops at once. -> the previous handlers (none outside the main thread)."""
        self.stop_signal, self.stop_said = None, False
        if threading.current_thread() is not threading.main_thread():
            return {}

        def ask(signum, frame):
            self.stop_signal = signum
            for s, handler in handlers.items():
                signal.signal(s, handler)
            if self.rank0 and self.comm.size > 1:  # mpirun may kill us in 0.25 s: say it now
                say_past_the_launcher(self._stop_line(signum))
                self.stop_said = True

        handlers = {s: signal.signal(s, ask) for s in (signal.SIGINT, signal.SIGTERM)}
        return handlers

    def _stop_if_asked(self):
        """At a step boundary: if any rank got a stop signal, every rank raises Interrupted.
        One process saves first (unless its last checkpoint is of this step, or fp16 is in the
        middle of skips); under mpirun no rank saves, since mpirun, on Ctrl-C or SIGTERM, kills
        the ranks 0.25 s after passing the signal on, too soon to finish a step, let alone a
        save: the line rank 0 says at once names the checkpoint already on disk."""
        signum = self.stop_signal
        if self.comm.size > 1:  # one small collective a step, outside the counted ones
            signum = next(filter(None, self.comm.all_gather_object(signum)), None)
        if signum is None:
            return
        cfg, skipping = self.cfg, self.scaler and self.scaler.skips_in_a_row
        if self.comm.size == 1 and cfg.save and self.step and not skipping:
            if checkpoint.checkpoint_step(cfg.out) != self.step:
                self.save()
        raise Interrupted(self._stop_line(signum), signum, said=self.stop_said)

    def _stop_line(self, signum):
        """What a stopped run says: the checkpoint it leaves and the command that resumes it."""
        cfg, R, name = self.cfg, self.comm.size, signal.Signals(signum).name
        if R == 1:
            line = f"stopped by {name} after step {self.step} of {cfg.steps}: "
        else:
            line = f"{name} under mpirun: stopping without a save (no time for one): "
        line += checkpoint.on_disk(cfg.out)
        if checkpoint.checkpoint_step(cfg.out) is not None:
            launch = f"mpirun -n {R} " if R > 1 else ""
            line += f"; continue with: {launch}python examples/train_gpt2.py --resume {cfg.out}"
        return line

    # ---- the run
    def run(self):
        cfg, R = self.cfg, self.comm.size
        quiet = cfg.quiet or not self.rank0
        say = (lambda *a: None) if quiet else tqdm.write
        lock = self._claim_out() if self.rank0 else None
        memory = self.memory_table()
        peak, peak_name = mfu.device_peak(self.device, dtypes.name(self.dtype))
        say(
            f"model {cfg.resume or cfg.init_from or cfg.model}: "
            f"{self.model.num_parameters():,} parameters, device {self.device}, dtype {cfg.dtype}"
            + (f"; {R} ranks ({self.comm.engine}), ZeRO-{cfg.zero}" if R > 1 else "")
        )
        say(memory)
        if self.gemm_library:  # the CPU's, by measurement (gemm_library.py)
            say(self.gemm_library.describe())
        say(
            f"MFU divides 6N + 12LCT = {self.flops_per_token / 1e6:.1f} MFLOP/token by the "
            f"{peak_name}" + (f" (per rank, x {R})" if R > 1 else "")
        )
        tokens_per_step = cfg.batch_size * cfg.seq_len * cfg.grad_accum * R  # the global batch
        # unbuffered: a row that cannot be written fails once, where it is written
        metrics = open(os.path.join(cfg.out, "metrics.jsonl"), "ab", 0) if self.rank0 else None
        bar = tqdm(total=cfg.steps, initial=self.step, disable=quiet, dynamic_ncols=True)
        history, save_due = [], False
        handlers = self._catch_stop_signals()
        try:
            while self.step < cfg.steps:
                self._stop_if_asked()
                t0 = time.perf_counter()
                loss, lr, norm, skipped = self.train_step()
                backend.get(self.device).synchronize()
                dt = time.perf_counter() - t0
                self._stop_if_diverged(loss, skipped)
                self.step += 1
                tps = tokens_per_step / dt
                row = {
                    "step": self.step,
                    "loss": loss,
                    "lr": lr,
                    "grad_norm": norm,
                    "tokens_per_s": tps,
                    "ms": dt * 1e3,
                    "mfu": tps * self.flops_per_token / (peak * R),
                    "world_size": R,
                    "zero": cfg.zero,
                }
                if self.scaler is not None:
                    row.update(
                        loss_scale=self.scaler.scale,
                        skipped=skipped,
                        skipped_total=self.scaler.skipped_steps,
                    )
                if cfg.eval_every and (self.step % cfg.eval_every == 0 or self.step == cfg.steps):
                    row["val_loss"] = self.evaluate()
                    say(f"step {self.step}: train loss {loss:.4f}, val loss {row['val_loss']:.4f}")
                if metrics:
                    self._append(metrics, row)
                history.append(row)
                shown = mfu.percent(row["mfu"])  # above 100%: a flag, not a figure
                bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{tps:,.0f}", mfu=shown)
                bar.update(1)
                if cfg.sample_every and self.step % cfg.sample_every == 0 and not quiet:
                    say(f"sample at step {self.step}: {self.sample()!r}")
                save_due |= bool(cfg.save and cfg.save_every and self.step % cfg.save_every == 0)
                # not in the middle of fp16 skips: the run may never recover, and then the
                # checkpoint to keep is the one from before them
                if save_due and not (self.scaler and self.scaler.skips_in_a_row):
                    self.save()
                    save_due = False
            if cfg.save:
                path = self.save()
                say(f"checkpoint: {path}")
        finally:
            for signum, handler in handlers.items():
                signal.signal(signum, handler)
            bar.close()
            if self.rank0:
                metrics.close()
                lock.close()
        if not self.rank0:
            return history
        if self.comm.engine != "none":  # the last step's collectives, predicted and measured
            predicted = predictions.predicted_collectives(
                self.optimizer.numel, cfg.dtype, cfg.zero, R
            )
            say(report.communication_table(self.step_collectives, predicted, R))
        self._plot(say)
        if cfg.report and not cfg.quiet:  # predicted vs measured, measured on a twin model
            batch = DataLoader(self.val_path, cfg.batch_size, cfg.seq_len, seed=0).next_batch()
            say(report.for_run(self.model.config, cfg.dtype, self.device, batch, self.options))
        return history


class Agreed(ValueError):
    """An error raised on every rank at the same point: rank 0 alone says it, and the ranks
    exit together (cli.rank_errors)."""


class Interrupted(Agreed):
    """A stop signal, acted on by every rank at the same step boundary. said: rank 0 has said
    it already; the exit code is the shell's for a signal, 128 + its number."""

    def __init__(self, line, signum, said=False):
        super().__init__(line)
        self.code, self.said = 128 + signum, said


class Mismatch(Agreed):
    """The ranks of one run disagree on what to train (raised on every rank at start-up)."""


def _file_fingerprint(path):
    """(size, sha256 of the whole file): two copies that differ anywhere, even in one token
    in the middle, are told apart. Each rank hashes its own copy, all at once."""
    return f"{os.path.getsize(path)} bytes, sha256 {file_sha256(path)[:16]}"


def strict_json(row):
    """One metrics line as strict JSON: a non-finite value (an fp16 overflow's loss) is null,
    which every JSON reader accepts, where NaN and Infinity are not JSON at all."""
    clean = {
        k: (float(v) if math.isfinite(v) else None) if isinstance(v, (float, np.floating)) else v
        for k, v in row.items()
    }
    return json.dumps(clean, allow_nan=False)


def _trim_metrics(path, step):
    """Keep only the complete rows of metrics.jsonl up to step: a resumed run replays the
    steps after its checkpoint, and a kill can leave half a line that the next row would be
    glued to. The rows were written by strict_json, so writing them again keeps their bytes."""
    if not os.path.isfile(path):
        return
    text = "".join(strict_json(r) + "\n" for r in read_metrics(path) if r["step"] <= step)
    with open(path) as f:
        if f.read() == text:
            return
    atomic_write(path, text.encode())
