"""GPT-2, as in nanoGPT's model.py, with Hugging Face's parameter names and layouts.

Shapes: B batch, T tokens, C = n_embd channels, H = n_head heads of D = C / H, V = vocab,
Vp = V padded to a multiple of 64 (the rows wte stores, the logits' columns; nn/config.py).
"""

import math

import numpy as np

import tinygrad_like.ops as F
from tinygrad_like import Tensor, autograd, backend, dtypes, kernels

from . import hf
from .config import GPT2Config
from .layers import Dropout, Embedding, LayerNorm, Linear, building_on
from .module import Module, ModuleList
from .options import ExecutionOptions
from .sampling import check_sampling, sample


class CausalSelfAttention(Module):
    def __init__(self, config, rng, options):
        super().__init__()
        C, L = config.n_embd, config.n_layer
        self.n_head = config.n_head
        self.flash = options.attention == "flash"  # FlashAttention, see ops.py
        self.c_attn = Linear(C, 3 * C, rng=rng)  # (C, 3C)
        self.c_proj = Linear(C, C, std=0.02 / math.sqrt(2 * L), rng=rng)  # residual out
        self.resid_dropout = Dropout(config.dropout)

    def forward(self, x, cache=None, layer=0):
        B, T, C = x.shape
        H = self.n_head
        q, k, v = self.c_attn(x).split(C, dim=2)  # 3 x (B, T, C), views
        q, k, v = (t.reshape(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
        if cache is not None:  # decoding: attend to the past
            k, v = cache.append(layer, k, v)  # (B, H, Tpast + T, D)
        y = F.scaled_dot_product_attention(q, k, v, self.flash)  # (B, H, T, D)
        y = y.transpose(1, 2).reshape(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(Module):
    def __init__(self, config, rng):
        super().__init__()
        C = config.n_embd
        self.c_fc = Linear(C, 4 * C, rng=rng)
        self.c_proj = Linear(4 * C, C, std=0.02 / math.sqrt(2 * config.n_layer), rng=rng)
        self.dropout = Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x))))


class Block(Module):
    def __init__(self, config, rng, options):
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, config.layer_norm_epsilon)
        self.attn = CausalSelfAttention(config, rng, options)
        self.ln_2 = LayerNorm(config.n_embd, config.layer_norm_epsilon)
        self.mlp = MLP(config, rng)
        self.recompute = options.recompute  # save x, redo the rest in the backward

    def forward(self, x, cache=None, layer=0):
        if self.recompute and cache is None:  # one "checkpoint" record saving x (B, T, C)
            return autograd.checkpoint(self._forward, x)
        return self._forward(x, cache, layer)

    def _forward(self, x, cache=None, layer=0):
        x = x + self.attn(self.ln_1(x), cache, layer)
        return x + self.mlp(self.ln_2(x))


class Transformer(Module):
    def __init__(self, config, rng, options):
        super().__init__()
        self.wte = Embedding(
            config.vocab_size, config.n_embd, rng=rng, padded_to=config.padded_vocab_size
        )  # (Vp, C), zero past V
        self.wpe = Embedding(config.n_positions, config.n_embd, rng=rng)
        self.drop = Dropout(config.dropout)
        self.h = ModuleList([Block(config, rng, options) for _ in range(config.n_layer)])
        self.ln_f = LayerNorm(config.n_embd, config.layer_norm_epsilon)


class KVCache:
    """Keys and values of the positions seen so far, per layer: (B, H, max_len, D) each.
    Under no_grad only: the prompt fills it once, then each decode step appends one position."""

    def __init__(self, config, batch, max_len, like):
        shape = (batch, config.n_head, max_len, config.n_embd // config.n_head)
        empty = backend.of(like.data).empty
        self.k = [empty(shape, like.dtype) for _ in range(config.n_layer)]
        self.v = [empty(shape, like.dtype) for _ in range(config.n_layer)]
        self.length = 0  # positions already stored (before the current forward)
        self.max_len = max_len

    def append(self, layer, k, v):
        """Store this step's k, v (B, H, T, D); return all keys and values so far as views."""
        start, end = self.length, self.length + k.shape[2]
        kernels.launch("copy", self.k[layer][:, :, start:end], k.data)
        kernels.launch("copy", self.v[layer][:, :, start:end], v.data)
        return Tensor(self.k[layer][:, :, :end]), Tensor(self.v[layer][:, :, :end])


class GPT2(Module):
    """config: what the model is (its shapes); options: how it runs (ExecutionOptions, the
    training run's defaults when None), read by its modules as they are built."""

    def __init__(self, config: GPT2Config, seed=0, device=None, options=None):
        super().__init__()
        self.config = config
        self.options = options or ExecutionOptions()
        rng = np.random.default_rng(seed)
        device = device or backend.default_device()
        with building_on(device):  # on meta: shape-only parameters, nothing drawn
            self.transformer = Transformer(config, rng, self.options)
        self.name_scopes()
        self.to(device=device)
        # the LM head is tied to the token embedding: logits = x @ wte^T, no parameter of its own

    def forward(self, idx, targets=None, cache=None, last_only=False):
        """idx (B, T) int token ids -> (logits (B, T, V) fp, mean cross-entropy or None).
        targets (B, T) int, -1 ignored. With a cache, positions continue from cache.length.
        last_only computes logits for the last position only (generation). The head computes
        (B, T, Vp) padded logits; the loss reads them over the first V columns, and the logits
        returned are a view of those V columns (no copy). With the fused head (options.lm_head)
        and targets, the head and the loss are one record that never makes the logits
        (F.linear_cross_entropy, in options.lm_head_design), and the logits returned are None,
        as llm.c and Liger do; without targets (generation) the head is the plain one."""
        idx = np.asarray(idx.numpy() if isinstance(idx, Tensor) else idx)
        if idx.ndim != 2:
            raise ValueError(f"GPT2 expects token ids of shape (B, T), got {idx.shape}")
        B, T = idx.shape
        if T == 0:
            raise ValueError("GPT2 got an empty sequence (T = 0): give at least one token")
        start = cache.length if cache is not None else 0
        if start + T > self.config.n_positions:
            raise ValueError(
                f"sequence of {start + T} tokens is longer than the context of "
                f"{self.config.n_positions}: shorten it (or --seq-len)"
            )
        tr = self.transformer
        x = tr.wte(idx) + tr.wpe(np.arange(start, start + T))  # (B, T, C) + (T, C)
        x = tr.drop(x)
        for i, block in enumerate(tr.h):
            x = block(x, cache, i)
        if cache is not None:
            cache.length += T
        x = tr.ln_f(x)
        if last_only:
            x = x[:, -1:, :]  # (B, 1, C)
        V = self.config.vocab_size
        if targets is not None:
            targets = np.asarray(targets)
            if targets.shape != (B, T):
                raise ValueError(f"targets of shape {targets.shape} do not match ids {idx.shape}")
            if self.options.lm_head == "fused":
                with autograd.scope("lm_head"):  # the head and the loss
                    return None, F.linear_cross_entropy(
                        x.reshape(B * T, -1),
                        tr.wte.weight,
                        targets.reshape(-1),
                        n_classes=V,
                        design=self.options.lm_head_design,
                    )
        with autograd.scope("lm_head"):
            padded = F.linear(x, tr.wte.weight, transposed=True)  # (B, T, Vp), tied to wte
            logits = padded[:, :, :V]  # (B, T, V), a view
        loss = None
        if targets is not None:
            with autograd.scope("loss"):
                loss = F.cross_entropy(padded.reshape(B * T, -1), targets.reshape(-1), n_classes=V)
        return logits, loss

    # ---- Hugging Face format
    @classmethod
    def from_pretrained(cls, path, dtype=None, device=None, options=None):
        """The model in a Hugging Face GPT-2 directory (or a training checkpoint), run with
        options (ExecutionOptions)."""
        model = cls(hf.read_config(path), options=options)
        model.load_state_dict(hf.read_state(path))
        return model.to(dtype=dtype, device=device)

    def save_pretrained(self, path, state=None):
        """Write config.json and model.safetensors (nn/hf.py). state: name -> array to write
        instead of the model's own weights (the fp32 master)."""
        hf.save_pretrained(path, self.config, self.state_dict() if state is None else state)

    # ---- generation
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, seed=None):
        """-> (B, T + max_new_tokens) int64 ids: the prompt then the sampled continuation."""
        idx = _prompt(idx)
        new = list(self.generate_stream(idx, max_new_tokens, temperature, top_k, top_p, seed))
        return np.concatenate([idx] + [t[:, None] for t in new], axis=1)

    def generate_stream(
        self, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, seed=None
    ):
        """An iterator over each new token column (B,) as it is sampled. The prompt goes
        through the model once, filling the KV cache; then every step feeds just the one new
        token. Bad arguments raise here, not at the first next()."""
        idx = _prompt(idx)
        check_sampling(temperature, top_k, top_p)
        B, T = idx.shape
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        if T + max_new_tokens > self.config.n_positions:
            raise ValueError(
                f"prompt of {T} tokens + {max_new_tokens} new tokens = "
                f"{T + max_new_tokens} is longer than the context of "
                f"{self.config.n_positions}"
            )
        cache = KVCache(self.config, B, T + max_new_tokens, self.transformer.wte.weight)
        return self._decode(
            idx, max_new_tokens, cache, temperature, top_k, top_p, np.random.default_rng(seed)
        )

    def _decode(self, idx, max_new_tokens, cache, temperature, top_k, top_p, rng):
        modules = [m for _, m in self.named_modules()]
        feed = idx
        for _ in range(max_new_tokens):
            logits = self._infer(feed, cache, modules)  # (B, V) fp32, host
            if not np.isfinite(logits).all():  # else argmax picks token 0, sampling fails
                raise ValueError(_non_finite(self.transformer.wte.weight.dtype, cache.length))
            token = sample(logits, temperature, top_k, top_p, rng)  # (B,)
            yield token  # outside no_grad/eval: the caller's code runs as usual
            feed = token[:, None]

    def _infer(self, idx, cache, modules):
        """Last-position logits under no_grad and eval mode (each module's mode restored)."""
        modes = [m.training for m in modules]
        for m in modules:
            object.__setattr__(m, "training", False)
        try:
            # an overflow is not warned about on the way: _decode checks the logits, one error
            with autograd.no_grad(), np.errstate(over="ignore", invalid="ignore"):
                logits, _ = self(idx, cache=cache, last_only=True)
            return logits.numpy()[:, -1, :].astype(np.float32)
        finally:
            for m, mode in zip(modules, modes):
                object.__setattr__(m, "training", mode)


def _non_finite(dtype, tokens):
    """The error for inf or nan logits: fp16 overflows beyond 65,504, where bf16 keeps fp32's
    range; an fp32 forward that overflows has no wider dtype to go to."""
    what = f"the {dtypes.name(dtype)} forward gave inf or nan logits after {tokens} tokens"
    if dtype == dtypes.float16:
        return f"{what}: fp16 overflows beyond 65,504; use dtype bf16 (fp32's range) or fp32"
    if dtype == dtypes.bfloat16:
        return f"{what}: use dtype fp32 (or check the checkpoint's weights for inf or nan)"
    return f"{what}: the weights themselves overflow (a diverged checkpoint?)"


def _prompt(idx):
    """Token ids as a (B, T) int array with T >= 1 (a 1-D prompt is one sequence)."""
    idx = np.asarray(idx)
    if idx.ndim == 1:
        idx = idx[None]
    if idx.ndim != 2 or idx.shape[1] == 0:
        raise ValueError(
            f"a prompt needs at least one token, as ids of shape (T,) or (B, T); "
            f"got shape {idx.shape}"
        )
    return idx
