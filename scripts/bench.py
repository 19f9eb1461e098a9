"""CPU benchmark: a full fp32 training step and KV-cache generation, ours against PyTorch.

For one preset, batch and sequence length it measures
  1. the training step (forward, backward, gradient clipping, AdamW step, zero_grad): median
     time of the timed steps (warm-up steps excluded) and tokens/s;
  2. MFU: achieved model FLOP/s (6N + 12LCT per token, training/mfu.py) divided by the fp32
     matmul peak NumPy's BLAS reaches on this machine (measured here, at the start);
  3. greedy generation with the KV cache: a prompt of --prompt-len tokens, then --new-tokens
     decode steps; prompt tokens/s and decode tokens/s reported separately.
When PyTorch is importable the same model (the same weights, copied from ours), the same batch
and the same step (torch.optim.AdamW with its defaults, decay on 2-D weights only, the same
clipping) run in PyTorch eager in this run, interleaved with ours round by round so that a load
from elsewhere hits both alike; both must give the same initial loss before anything is timed.
When transformers is importable, Hugging Face's GPT2LMHeadModel.generate (greedy, use_cache)
runs on the same weights (saved with our save_pretrained) for the decode comparison.
Neither torch nor transformers is a dependency of the project: without them only ours runs.

    python scripts/bench.py                              # gpt2-mini, B=8, T=128 (CPU default)
    python scripts/bench.py --model gpt2 --batch-size 4 --seq-len 256
    python scripts/bench.py --census --json bench.json   # plus where the time goes

NumPy's OpenBLAS picks its kernels for the CPU it detects when it loads; OPENBLAS_CORETYPE (and
OPENBLAS_L2_SIZE) in the environment override that choice. The header names the kernel set in
use; to measure what a current NumPy does on this CPU, unset both for that command alone:
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python scripts/bench.py
"""
import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from nn import GPT2, GPT2Config  # noqa: E402
from nn.gpt2 import PRESETS  # noqa: E402
from optim import AdamW  # noqa: E402
from tinygrad_like.profiler import Profiler, format_census  # noqa: E402
from training import mfu  # noqa: E402
from training.loop import train_on  # noqa: E402
from training.measure import random_batch  # noqa: E402

BLAS_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
            "MKL_NUM_THREADS", "OMP_WAIT_POLICY")
LOSS_TOLERANCE = 1e-4
QUIET = 0.10   # a step is "quiet" while other processes use under 10% of the CPUs


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Benchmark a training step and generation on the "
                                "CPU, against PyTorch eager and Hugging Face when installed.")
    p.add_argument("--model", default="gpt2-mini", help="preset (default gpt2-mini)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=5, help="timed steps per round (default 5)")
    p.add_argument("--rounds", type=int, default=2,
                   help="rounds of timed steps, ours then torch in each (default 2)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first (default 2)")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--grad-clip", type=float, default=1.0, help="as training (0 = off)")
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--gen-batch", type=int, default=1, help="sequences generated at once")
    p.add_argument("--gen-repeats", type=int, default=3,
                   help="timed generations after one warm-up (median reported)")
    p.add_argument("--threads", type=int,
                   help="BLAS and torch threads (default: leave the libraries' defaults)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--census", action="store_true",
                   help="print the op census of one training step and one decode step")
    p.add_argument("--no-torch", action="store_true", help="skip the PyTorch comparison")
    p.add_argument("--no-hf", action="store_true", help="skip the Hugging Face comparison")
    p.add_argument("--no-train", action="store_true", help="generation only")
    p.add_argument("--no-generate", action="store_true", help="training only")
    p.add_argument("--json", metavar="PATH", help="write every number to this JSON file")
    args = p.parse_args(argv)
    for name in ("batch_size", "seq_len", "steps", "rounds", "prompt_len", "new_tokens",
                 "gen_batch", "gen_repeats"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive")
    if args.warmup < 0:
        p.error("--warmup must be >= 0")
    if args.threads is not None and args.threads <= 0:
        p.error("--threads must be positive")
    if args.model not in PRESETS:
        p.error(f"unknown preset {args.model!r}: use one of {', '.join(PRESETS)}")
    config = PRESETS[args.model]
    if args.seq_len > config.n_positions:
        p.error(f"--seq-len {args.seq_len} is longer than {args.model}'s context "
                f"{config.n_positions}")
    if args.prompt_len + args.new_tokens > config.n_positions:
        p.error(f"--prompt-len + --new-tokens = {args.prompt_len + args.new_tokens} is longer "
                f"than {args.model}'s context {config.n_positions}")
    return args


# ---------------------------------------------------------------- optional libraries

def import_torch():
    try:
        import torch
        return torch
    except ImportError:
        return None


def import_transformers():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")          # local directories only
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    try:
        import transformers
    except ImportError:
        return None
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    return transformers


_thread_limit = []   # keeps a threadpoolctl limit alive for the whole run


def set_threads(n, torch=None):
    """Limit BLAS (through threadpoolctl) and torch to n threads; None leaves the defaults."""
    if n is None:
        return
    try:
        from threadpoolctl import threadpool_limits
        _thread_limit.append(threadpool_limits(limits=n))
    except ImportError:
        print(f"warning: threadpoolctl is not installed, so --threads {n} cannot limit "
              "NumPy's BLAS; set OPENBLAS_NUM_THREADS before starting instead", file=sys.stderr)
    if torch is not None:
        torch.set_num_threads(n)


# ---------------------------------------------------------------- the machine

def environment_info(torch=None):
    """CPU, NumPy and its BLAS (kernel set, threads), the BLAS variables, torch's threads."""
    info = {"python": platform.python_version(), "numpy": np.__version__,
            "cpu": _cpu_name(), "logical_cpus": os.cpu_count(),
            "affinity_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
            "env": {k: os.environ.get(k) for k in BLAS_ENV if os.environ.get(k) is not None},
            "blas": _blas_info(), "load_average": _loadavg()}
    if torch is not None:
        info["torch"] = {"version": torch.__version__, "threads": torch.get_num_threads(),
                         "interop_threads": torch.get_num_interop_threads(),
                         "mkldnn": bool(torch.backends.mkldnn.is_available()),
                         "blas": _torch_blas(torch)}
    return info


def _cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _loadavg():
    try:
        return list(os.getloadavg())
    except OSError:
        return None


def _blas_info():
    """threadpoolctl's view of the loaded BLAS (kernel set, threads) when it is installed,
    else what NumPy's build configuration says."""
    try:
        from threadpoolctl import threadpool_info
        libs = [{k: v for k, v in lib.items() if k in ("internal_api", "prefix", "version",
                                                        "architecture", "num_threads",
                                                        "threading_layer", "filepath")}
                for lib in threadpool_info()]
        return {"source": "threadpoolctl", "libraries": libs}
    except ImportError:
        pass
    try:
        cfg = np.show_config(mode="dicts")
        blas = cfg.get("Build Dependencies", {}).get("blas", {})
        return {"source": "numpy.show_config", "libraries": [
            {"internal_api": blas.get("name"), "version": blas.get("version"),
             "architecture": "unknown (pip install threadpoolctl)", "num_threads": None}]}
    except Exception as e:  # an old NumPy without mode="dicts"
        return {"source": "none", "libraries": [], "error": str(e)}


def _torch_blas(torch):
    cfg = torch.__config__.show()
    for name in ("Math Kernel Library", "OpenBLAS"):
        if name in cfg:
            return "MKL" if name.startswith("Math") else name
    return "unknown"


def format_environment(info, peak):
    lines = [f"machine: {info['cpu']}, {info['logical_cpus']} logical CPUs "
             f"({info['affinity_cpus']} usable), Python {info['python']}, NumPy {info['numpy']}"]
    for lib in info["blas"]["libraries"]:
        kernels = f"kernel set {lib['architecture']}, " if lib.get("architecture") else ""
        version = f" {lib['version']}" if lib.get("version") else ""
        lines.append(f"  {lib.get('internal_api')}{version}: {kernels}{lib.get('num_threads')} "
                     f"threads ({os.path.basename(str(lib.get('filepath', '')))})")
    env = info["env"]
    lines.append("  BLAS variables: " + (", ".join(f"{k}={v}" for k, v in env.items())
                                        if env else "none set"))
    if "OPENBLAS_CORETYPE" in env:
        lines.append("  note: OPENBLAS_CORETYPE overrides the kernels OpenBLAS would pick for "
                     "this CPU; run with `env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE` to "
                     "measure the native ones")
    if "torch" in info:
        t = info["torch"]
        lines.append(f"  torch {t['version']} ({t['blas']}, mkldnn {t['mkldnn']}): "
                     f"{t['threads']} threads, {t['interop_threads']} inter-op")
    lines.append(f"  fp32 matmul peak (NumPy, 1024^3, training/mfu.py, best of 5 tries): {peak / 1e9:.0f} GFLOP/s")
    if info["load_average"]:
        lines.append("  load average at start: " +
                     " ".join(f"{x:.2f}" for x in info["load_average"]))
    return "\n".join(lines)


def measure_peak(tries=5, pause=0.05):
    """training/mfu.py's measurement (best of 5 GEMMs), best of a few tries spread over a
    moment: a burst of load from another process only ever lowers it."""
    best = 0.0
    for i in range(tries):
        if i:
            time.sleep(pause)
        best = max(best, mfu.measure_cpu_matmul_peak())
    return best


def torch_matmul_peak(torch, n=1024, repeats=5):
    """The same measurement as training/mfu.py, through torch's BLAS (for reference)."""
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(n, n, generator=g) for _ in range(2))
    out = torch.empty(n, n)
    return 2 * n ** 3 / mfu.best_seconds(lambda: torch.mm(a, b, out=out), repeats)


# ---------------------------------------------------------------- ours

def build_ours(config, seed=0, lr=1e-4, weight_decay=0.1, grad_clip=1.0):
    model = GPT2(config, seed=seed, device="cpu")
    opt = AdamW(model.named_parameters(), lr=lr, betas=(0.9, 0.95), eps=1e-8,
                weight_decay=weight_decay, grad_clip=grad_clip)
    return model, opt


def ours_loss(model, x, y):
    from tinygrad_like import no_grad
    with no_grad():
        return float(model(x, y)[1].item())


def ours_train_step(model, opt, x, y):
    """One optimizer step as Trainer.train_step takes it (grad_accum 1, no data loading)."""
    return train_on(model, opt, [(x, y)])[0]


def cpu_snapshot():
    """(seconds the machine's CPUs were busy, seconds this process ran, all its threads).
    Their differences over a step tell our load from other processes' (the noise)."""
    busy = float("nan")
    try:
        with open("/proc/stat") as f:
            ticks = [int(v) for v in f.readline().split()[1:9]]   # user .. steal
        busy = (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # less idle, iowait
    except (OSError, ValueError, IndexError):
        pass
    t = os.times()
    return busy, t.user + t.system


def foreign_share(before, after, wall):
    """The fraction of the machine's CPU time that other processes used during wall seconds
    (0 = we had the machine to ourselves; NaN where /proc/stat is missing)."""
    ncpu = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    other = (after[0] - before[0]) - (after[1] - before[1])
    return max(other, 0.0) / (wall * ncpu) if wall > 0 else 0.0


def timed(fn):
    """-> (fn(), wall seconds, share of the CPUs other processes took meanwhile)."""
    s0, t0 = cpu_snapshot(), time.perf_counter()
    out = fn()
    wall = time.perf_counter() - t0
    return out, wall, foreign_share(s0, cpu_snapshot(), wall)


def time_steps(step, n):
    """Run step() n times; -> ([(seconds, foreign CPU share) of each], the last loss)."""
    samples, loss = [], None
    for _ in range(n):
        loss, wall, foreign = timed(step)
        samples.append((wall, foreign))
    return samples, loss


def quiet(samples, key=lambda s: s):
    """The samples taken while other processes used under QUIET of the CPUs, when at least
    3 (or a third) of them were; otherwise all of them (and the report says so)."""
    calm = [s for s in samples if not key(s)[1] > QUIET]      # NaN (no /proc) counts as calm
    return (calm, True) if len(calm) >= max(3, len(samples) // 3) else (samples, False)


def summarize_steps(samples, tokens, flops_per_token, peak):
    """Step times -> median (over the quiet steps), min, spread, tokens/s and MFU."""
    chosen, is_quiet = quiet(samples)
    times = [t for t, _ in chosen]
    med = statistics.median(times)
    tps = tokens / med
    all_times = [t for t, _ in samples]
    return {"steps": len(samples), "quiet_steps": len(chosen) if is_quiet else 0,
            "median_ms": med * 1e3, "median_all_ms": statistics.median(all_times) * 1e3,
            "min_ms": min(all_times) * 1e3, "max_ms": max(all_times) * 1e3,
            "spread": (max(times) - min(times)) / med,
            "tokens_per_s": tps, "tokens_per_s_best": tokens / min(all_times),
            "mfu": tps * flops_per_token / peak,
            "foreign_cpu": statistics.mean(f for _, f in samples),
            "times_ms": [t * 1e3 for t in all_times],
            "foreign_cpu_per_step": [f for _, f in samples]}


def ours_generate(model, prompt, new_tokens):
    """Greedy generation with the KV cache through GPT2.generate_stream.
    -> (prompt seconds (to the first new token), decode seconds (the other tokens), ids)."""
    t0 = time.perf_counter()
    stream = model.generate_stream(prompt, new_tokens, temperature=0.0)
    tokens = [next(stream)]
    t1 = time.perf_counter()
    tokens.extend(stream)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, np.stack(tokens, axis=1)


def time_generations(generate, n):
    """n runs of generate() -> [(prompt s, decode s, ids, foreign CPU share)]."""
    runs = []
    for _ in range(n):
        (prompt_s, decode_s, ids), _, foreign = timed(generate)
        runs.append((prompt_s, decode_s, ids, foreign))
    return runs


def summarize_generation(runs, batch, prompt_len, new_tokens):
    """runs: [(prompt s, decode s, ids, foreign share)] -> medians over the quiet runs and
    tokens/s (decode counts the new_tokens - 1 steps after the first token, which the
    prompt's forward gives)."""
    chosen, is_quiet = quiet(runs, key=lambda r: (r, r[3]))
    prompt_s = statistics.median(r[0] for r in chosen)
    decode_s = statistics.median(r[1] for r in chosen)
    steps = max(new_tokens - 1, 1)
    return {"runs": len(runs), "quiet_runs": len(chosen) if is_quiet else 0,
            "prompt_ms": prompt_s * 1e3,
            "prompt_tokens_per_s": batch * prompt_len / prompt_s,
            "decode_ms_per_token": decode_s / steps * 1e3,
            "decode_tokens_per_s": batch * steps / decode_s if decode_s > 0 else float("inf"),
            "foreign_cpu": statistics.mean(r[3] for r in runs),
            "prompt_ms_all": [r[0] * 1e3 for r in runs],
            "decode_ms_all": [r[1] * 1e3 for r in runs]}


def census_train_step(model, opt, x, y):
    """Profile one training step with kernel timing -> census rows, per-phase sums, wall s."""
    with Profiler(timing=True) as prof:
        ours_train_step(model, opt, x, y)
        wall = prof.elapsed()
    return prof.census(), prof.by_phase(), wall


def census_decode_step(model, prompt, new_tokens=2):
    """Profile the forward of one decode step (one new token, KV cache filled by the prompt)
    -> census rows, wall seconds."""
    stream = model.generate_stream(prompt, max(new_tokens, 2), temperature=0.0)
    next(stream)                           # the prompt's forward and the first token
    with Profiler(timing=True) as prof:
        next(stream)                       # one decode forward and its argmax
        wall = prof.elapsed()
    stream.close()
    return prof.census(), wall


def format_phases(by_phase, wall):
    kernel_s = sum(row["seconds"] for row in by_phase.values())
    parts = [f"{name} {row['seconds'] * 1e3:.1f} ms / {row['launches']} launches"
             for name, row in by_phase.items() if row["launches"]]
    return (f"  by phase: {', '.join(parts)}\n  wall {wall * 1e3:.1f} ms, in kernels "
            f"{kernel_s * 1e3:.1f} ms, outside kernels (Python, tape, allocation) "
            f"{(wall - kernel_s) * 1e3:.1f} ms ({(wall - kernel_s) / wall:.0%})")


# ---------------------------------------------------------------- PyTorch

def torch_model_class(torch):
    """A compact GPT-2 in PyTorch eager with our parameter names and layouts: Linear weights
    (in, out) used as x @ W (Hugging Face's Conv1D), the LM head tied to wte."""
    nn, F = torch.nn, torch.nn.functional

    class Conv1D(nn.Module):
        def __init__(self, n_in, n_out):
            super().__init__()
            self.weight = nn.Parameter(torch.empty(n_in, n_out))
            self.bias = nn.Parameter(torch.zeros(n_out))

        def forward(self, x):
            shape = x.shape[:-1] + (self.weight.shape[1],)
            return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(shape)

    class Attention(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.n_head = config.n_head
            self.c_attn = Conv1D(config.n_embd, 3 * config.n_embd)
            self.c_proj = Conv1D(config.n_embd, config.n_embd)

        def forward(self, x):
            B, T, C = x.shape
            q, k, v = self.c_attn(x).split(C, dim=2)
            q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
                       for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.c_proj(y.transpose(1, 2).reshape(B, T, C))

    class MLP(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.c_fc = Conv1D(config.n_embd, 4 * config.n_embd)
            self.c_proj = Conv1D(4 * config.n_embd, config.n_embd)

        def forward(self, x):
            return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))

    class Block(nn.Module):
        def __init__(self, config):
            super().__init__()
            eps = config.layer_norm_epsilon
            self.ln_1 = nn.LayerNorm(config.n_embd, eps=eps)
            self.attn = Attention(config)
            self.ln_2 = nn.LayerNorm(config.n_embd, eps=eps)
            self.mlp = MLP(config)

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class Transformer(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.wte = nn.Embedding(config.vocab_size, config.n_embd)
            self.wpe = nn.Embedding(config.n_positions, config.n_embd)
            self.h = nn.ModuleList(Block(config) for _ in range(config.n_layer))
            self.ln_f = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)

    class TorchGPT2(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.config = config
            self.transformer = Transformer(config)

        def forward(self, idx, targets=None):
            tr = self.transformer
            T = idx.shape[1]
            x = tr.wte(idx) + tr.wpe(torch.arange(T, device=idx.device))
            for block in tr.h:
                x = block(x)
            logits = F.linear(tr.ln_f(x), tr.wte.weight)          # tied LM head
            loss = None
            if targets is not None:
                loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1),
                                       ignore_index=-1)
            return logits, loss

    return TorchGPT2


def build_torch(torch, config, state, lr=1e-4, weight_decay=0.1):
    """The torch model with our weights (copied) and torch.optim.AdamW: decay on the 2-D
    parameters only, betas (0.9, 0.95), fused off and foreach left to torch's default."""
    model = torch_model_class(torch)(config)
    own = model.state_dict()
    if set(own) != set(state):
        raise RuntimeError(f"torch model keys differ from ours: {sorted(set(own) ^ set(state))[:5]}")
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.from_numpy(np.array(state[name], dtype=np.float32, copy=True)))
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                             {"params": rest, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95), eps=1e-8, fused=False)
    return model, opt


def torch_train_step(torch, model, opt, x, y, grad_clip):
    _, loss = model(x, y)
    loss.backward()
    value = loss.item()
    if grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    opt.step()
    opt.zero_grad()
    return value


def torch_loss(torch, model, x, y):
    with torch.no_grad():
        return float(model(x, y)[1].item())


def torch_census(torch, model, opt, x, y, grad_clip, rows=25):
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch_train_step(torch, model, opt, x, y, grad_clip)
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)


# ---------------------------------------------------------------- Hugging Face

def hf_load(transformers, torch, model):
    """Save our model in Hugging Face's format and load it as GPT2LMHeadModel."""
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        hf = transformers.GPT2LMHeadModel.from_pretrained(tmp, dtype=torch.float32)
    return hf.eval()


def hf_generate(transformers, torch, hf, prompt, new_tokens):
    """Greedy generate with the KV cache; a streamer stamps each token as it comes.
    -> (prompt seconds, decode seconds, new ids (B, new_tokens))."""
    from transformers.generation.streamers import BaseStreamer

    class Stamps(BaseStreamer):
        def __init__(self):
            self.times = []

        def put(self, value):
            self.times.append(time.perf_counter())

        def end(self):
            pass

    ids = torch.from_numpy(np.ascontiguousarray(prompt))
    stamps = Stamps()
    t0 = time.perf_counter()
    with torch.no_grad():
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                          min_new_tokens=new_tokens, do_sample=False, use_cache=True,
                          pad_token_id=hf.config.eos_token_id, streamer=stamps)
    t_end = time.perf_counter()
    # put() is called with the prompt first, then once per new token
    first, last = stamps.times[1], stamps.times[-1] if len(stamps.times) > 2 else t_end
    return first - t0, last - first, out[:, prompt.shape[1]:].numpy()


def hf_prompt_logits_diff(torch, hf, model, prompt):
    """Largest |logit difference| between Hugging Face's model and ours on the prompt."""
    from tinygrad_like import no_grad
    with no_grad():
        ours = model(prompt)[0].numpy()
    with torch.no_grad():
        theirs = hf(torch.from_numpy(np.ascontiguousarray(prompt))).logits.numpy()
    return float(np.abs(ours - theirs).max())


# ---------------------------------------------------------------- the run

def run(args, log=print):
    """Every measurement the arguments ask for -> a JSON-friendly dict."""
    torch = None if args.no_torch else import_torch()
    transformers = None if (args.no_hf or torch is None) else import_transformers()
    set_threads(args.threads, torch)
    config = GPT2Config.from_preset(args.model)
    env = environment_info(torch)
    peak = measure_peak()
    results = {"args": vars(args), "config": config.to_dict(), "environment": env,
               "peak_flops": peak}
    log(format_environment(env, peak))
    if torch is not None:
        time.sleep(0.5)      # OpenBLAS's threads spin a while after a call: let them sleep first
        results["torch_peak_flops"] = max(torch_matmul_peak(torch) for _ in range(3))
        log(f"  fp32 matmul peak (torch, same test): {results['torch_peak_flops'] / 1e9:.0f} "
            "GFLOP/s (for reference; MFU always divides by NumPy's)")

    model, opt = build_ours(config, args.seed, args.lr, args.weight_decay, args.grad_clip)
    n_params = model.num_parameters()
    B, T = args.batch_size, args.seq_len
    fpt = mfu.training_flops_per_token(config, T, n_params)
    results.update(n_params=n_params, flops_per_token=fpt, tokens_per_step=B * T)
    log(f"model {args.model}: {n_params:,} parameters, L={config.n_layer} C={config.n_embd} "
        f"H={config.n_head} V={config.vocab_size}; batch {B} x {T} = {B * T} tokens/step; "
        f"6N + 12LCT = {fpt / 1e6:.1f} MFLOP/token")
    x, y = random_batch(config.vocab_size, B, T, args.seed)

    tmodel = topt = None
    if torch is not None:
        tmodel, topt = build_torch(torch, config, model.state_dict(), args.lr, args.weight_decay)
        ours0 = ours_loss(model, x, y)
        theirs0 = torch_loss(torch, tmodel, torch.from_numpy(x), torch.from_numpy(y))
        results["initial_loss"] = {"ours": ours0, "torch": theirs0, "diff": abs(ours0 - theirs0)}
        log(f"initial loss: ours {ours0:.6f}, torch {theirs0:.6f}, |diff| "
            f"{abs(ours0 - theirs0):.2e} (tolerance {LOSS_TOLERANCE:g})")
        if not abs(ours0 - theirs0) <= LOSS_TOLERANCE:
            raise RuntimeError("the PyTorch model does not give our initial loss: it is not the "
                               "same model, so timing it would compare nothing")

    if not args.no_generate:
        results["generate"] = bench_generation(args, config, model, torch, transformers, log)
    if not args.no_train:
        results["train"] = bench_training(args, model, opt, tmodel, topt, torch, x, y, fpt,
                                          peak, log)
    if args.census:
        results["census"] = run_census(args, config, model, opt, tmodel, topt, torch, x, y, log)
    late = measure_peak()
    if late > peak * 1.05:
        log(f"note: the matmul peak measured at the end, {late / 1e9:.0f} GFLOP/s, is above "
            f"the one at the start ({peak / 1e9:.0f}): the start was disturbed; MFU is given "
            "against the higher one")
        for part in (results.get("train") or {}).values():
            if isinstance(part, dict) and "mfu" in part:
                part["mfu"] *= peak / late
        results["peak_flops"] = peak = late
    results["load_average_end"] = _loadavg()
    return results


def bench_training(args, model, opt, tmodel, topt, torch, x, y, fpt, peak, log):
    tokens = x.size
    ours_step = lambda: ours_train_step(model, opt, x, y)  # noqa: E731
    torch_step = None
    if tmodel is not None:
        xt, yt = torch.from_numpy(x), torch.from_numpy(y)
        torch_step = lambda: torch_train_step(torch, tmodel, topt, xt, yt, args.grad_clip)  # noqa: E731
    log(f"training: {args.warmup} warm-up steps, then {args.rounds} round(s) of {args.steps} "
        f"timed steps{' (ours, then torch, each after one untimed step)' if torch_step else ''}")
    time_steps(ours_step, args.warmup)
    times = {"ours": [], "torch": []}
    if torch_step:
        time_steps(torch_step, args.warmup)
    last = {}
    for r in range(args.rounds):
        # after the other framework's round, one untimed step first: the memory it freed has
        # to be faulted in again (first touch costs ~2 ms per MB on this VM), which a training
        # loop that runs alone pays once, not once per round
        if torch_step:
            time_steps(ours_step, 1)
        t, last["ours"] = time_steps(ours_step, args.steps)
        times["ours"] += t
        if torch_step:
            time_steps(torch_step, 1)
            t, last["torch"] = time_steps(torch_step, args.steps)
            times["torch"] += t
        log(f"  round {r + 1}: " + ", ".join(
            f"{name} {statistics.median(t for t, _ in times[name][-args.steps:]) * 1e3:.1f} "
            f"ms/step (others used {statistics.mean(f for _, f in times[name][-args.steps:]):.0%}"
            " of the CPUs)" for name in times if times[name]))
    out = {"ours": summarize_steps(times["ours"], tokens, fpt, peak)}
    out["ours"]["last_loss"] = last["ours"]
    if torch_step:
        out["torch"] = summarize_steps(times["torch"], tokens, fpt, peak)
        out["torch"]["last_loss"] = last["torch"]
        out["ratio_tokens_per_s"] = out["ours"]["tokens_per_s"] / out["torch"]["tokens_per_s"]
        # the same updates from the same start: the losses should stay together
        out["loss_after_steps"] = {"ours": last["ours"], "torch": last["torch"]}
    return out


def bench_generation(args, config, model, torch, transformers, log):
    rng = np.random.default_rng(args.seed + 1)
    prompt = rng.integers(0, config.vocab_size, (args.gen_batch, args.prompt_len), dtype=np.int64)
    P, N, Bg = args.prompt_len, args.new_tokens, args.gen_batch
    log(f"generation: greedy, KV cache, batch {Bg}, prompt {P} tokens, {N} new tokens; "
        f"1 warm-up + {args.gen_repeats} timed runs each")
    ours_generate(model, prompt, N)
    runs = time_generations(lambda: ours_generate(model, prompt, N), args.gen_repeats)
    out = {"ours": summarize_generation(runs, Bg, P, N)}
    ours_ids = runs[-1][2]
    if transformers is not None:
        hf = hf_load(transformers, torch, model)
        out["hf_logits_max_abs_diff"] = hf_prompt_logits_diff(torch, hf, model, prompt)
        hf_generate(transformers, torch, hf, prompt, N)
        hf_runs = time_generations(lambda: hf_generate(transformers, torch, hf, prompt, N),
                                   args.gen_repeats)
        out["hf"] = summarize_generation(hf_runs, Bg, P, N)
        out["hf"]["transformers"] = transformers.__version__
        out["hf"]["attn_implementation"] = getattr(hf.config, "_attn_implementation", None)
        hf_ids = hf_runs[-1][2]
        same = (hf_ids == ours_ids).all(axis=0)
        out["same_tokens"] = int(same.sum()) if same.all() else int(np.argmin(same))
        out["ratio_prompt_tokens_per_s"] = (out["ours"]["prompt_tokens_per_s"] /
                                            out["hf"]["prompt_tokens_per_s"])
        out["ratio_decode_tokens_per_s"] = (out["ours"]["decode_tokens_per_s"] /
                                            out["hf"]["decode_tokens_per_s"])
        log(f"  Hugging Face model: max |logit diff| on the prompt "
            f"{out['hf_logits_max_abs_diff']:.2e}; greedy tokens identical for the first "
            f"{out['same_tokens']} of {N}")
        del hf
    return out


def run_census(args, config, model, opt, tmodel, topt, torch, x, y, log):
    ours_train_step(model, opt, x, y)        # warm again: torch's round ran last
    rows, phases, wall = census_train_step(model, opt, x, y)
    log(format_census(rows, f"ours: op census of one training step ({args.model}, "
                      f"B={args.batch_size}, T={args.seq_len})"))
    log(format_phases(phases, wall))
    prompt = np.random.default_rng(args.seed + 1).integers(
        0, config.vocab_size, (args.gen_batch, args.prompt_len), dtype=np.int64)
    drows, dwall = census_decode_step(model, prompt)
    dkernel = sum(r["seconds"] for r in drows)
    log(format_census(drows, f"ours: op census of one decode step (batch {args.gen_batch}, "
                      f"{args.prompt_len} cached positions)"))
    log(f"  wall {dwall * 1e3:.2f} ms, in kernels {dkernel * 1e3:.2f} ms, outside kernels "
        f"{(dwall - dkernel) * 1e3:.2f} ms ({(dwall - dkernel) / dwall:.0%})")
    out = {"train": {"rows": rows, "by_phase": phases, "wall_s": wall},
           "decode": {"rows": drows, "wall_s": dwall}}
    if tmodel is not None:
        xt, yt = torch.from_numpy(x), torch.from_numpy(y)
        torch_train_step(torch, tmodel, topt, xt, yt, args.grad_clip)
        table = torch_census(torch, tmodel, topt, xt, yt, args.grad_clip)
        log("torch: profiler of one training step (self CPU time)\n" + table)
        out["torch_train_table"] = table
    return out


# ---------------------------------------------------------------- the report

def _fmt(v, spec):
    return format(v, spec) if v is not None else "-"


def format_report(results):
    lines = []
    args = results["args"]
    tr = results.get("train")
    if tr:
        o, t = tr["ours"], tr.get("torch")
        lines.append(f"\ntraining step, fp32 ({args['model']}, B={args['batch_size']}, "
                     f"T={args['seq_len']}; median of {o['steps']} steps)")
        lines.append(f"{'':<22}{'ours':>12}{'torch eager':>14}{'ours/torch':>12}")

        def row(label, key, spec, show_ratio):
            a, b = o[key], (t[key] if t else None)
            ratio = _fmt(a / b, ".2f") + "x" if (show_ratio and b) else ""
            lines.append(f"{label:<22}{_fmt(a, spec):>12}{_fmt(b, spec):>14}{ratio:>12}")
        row("step ms (median)", "median_ms", ".1f", False)
        row("step ms (min)", "min_ms", ".1f", False)
        row("tokens/s (median)", "tokens_per_s", ",.0f", True)
        row("tokens/s (best step)", "tokens_per_s_best", ",.0f", True)
        row("MFU (median)", "mfu", ".1%", True)
        row("spread (max-min)/med", "spread", ".0%", False)
        row("others' CPU share", "foreign_cpu", ".0%", False)
        lines.append(_noise_note(o, t, "steps"))
        lines.append(f"MFU = tokens/s x {results['flops_per_token'] / 1e6:.1f} MFLOP/token "
                     f"(6N + 12LCT) / {results['peak_flops'] / 1e9:.0f} GFLOP/s (NumPy matmul "
                     "peak measured here)")
        if t:
            ls = tr["loss_after_steps"]
            lines.append(f"loss after the same steps from the same start: ours {ls['ours']:.5f}, "
                         f"torch {ls['torch']:.5f}")
    gen = results.get("generate")
    if gen:
        o, h = gen["ours"], gen.get("hf")
        lines.append(f"\ngeneration, greedy with KV cache (batch {args['gen_batch']}, prompt "
                     f"{args['prompt_len']}, {args['new_tokens']} new tokens; median of "
                     f"{o['runs']} runs)")
        lines.append(f"{'':<22}{'ours':>12}{'HF generate':>14}{'ours/HF':>12}")
        for label, key, spec, show_ratio in (
                ("prompt ms", "prompt_ms", ".1f", False),
                ("prompt tokens/s", "prompt_tokens_per_s", ",.0f", True),
                ("decode ms/token", "decode_ms_per_token", ".2f", False),
                ("decode tokens/s", "decode_tokens_per_s", ",.1f", True),
                ("others' CPU share", "foreign_cpu", ".0%", False)):
            a, b = o[key], (h[key] if h else None)
            ratio = _fmt(a / b, ".2f") + "x" if (show_ratio and b) else ""
            lines.append(f"{label:<22}{_fmt(a, spec):>12}{_fmt(b, spec):>14}{ratio:>12}")
        lines.append(_noise_note(o, h, "runs"))
    load0, load1 = results["environment"]["load_average"], results.get("load_average_end")
    if load0 and load1:
        lines.append(f"\nload average: {load0[0]:.2f} at start, {load1[0]:.2f} at end "
                     f"(above ~0.1 means something else was running)")
    return "\n".join(lines)


def _noise_note(ours, theirs, unit):
    """Which samples the medians use: the quiet ones, or all when too few were quiet."""
    key, count = f"quiet_{unit}", unit if unit == "runs" else "steps"
    parts = []
    for name, r in (("ours", ours), ("theirs", theirs)):
        if r is None:
            continue
        n = r["runs" if unit == "runs" else "steps"]
        parts.append(f"{name} {r[key]} of {n} quiet" if r[key] else
                     f"{name}: too few quiet {count} of {n}, median of all (noisy)")
    return (f"medians over the {unit} where other processes took under {QUIET:.0%} of the "
            f"CPUs: " + "; ".join(parts))


def main(argv=None):
    args = parse_args(argv)
    results = run(args)
    print(format_report(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=_json_default)
        print(f"wrote {args.json}")
    return results


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)


if __name__ == "__main__":
    main()
