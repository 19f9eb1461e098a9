"""GPT-2, as in nanoGPT's model.py, with Hugging Face's parameter names and layouts.

Shapes: B batch, T tokens, C = n_embd channels, H = n_head heads of D = C / H, V = vocab,
Vp = V padded to a multiple of 64 (the rows wte stores, the logits' columns; nn/config.py).
"""

import math

import tinygrad_like.functional as F
from tinygrad_like import autograd, kernels

from .config import GPT2Config
from .layers import Dropout, Embedding, LayerNorm, Linear
from .lm import CausalLM, KVCache  # noqa: F401 (nn.gpt2.KVCache)
from .module import Module, ModuleList


class CausalSelfAttention(Module):
    def __init__(self, config, rng, options):
        super().__init__()
        C, L = config.n_embd, config.n_layer
        self.n_head = config.n_head
        self.flash = options.attention == "flash"  # FlashAttention, see tinygrad_like/attention.py
        self.c_attn = Linear(C, 3 * C, rng=rng)  # (C, 3C)
        self.c_proj = Linear(C, C, std=0.02 / math.sqrt(2 * L), rng=rng)  # residual out
        self.resid_dropout = Dropout(config.dropout)

    def forward(self, x, cache=None, layer=0, positions=None):
        B, T, C = x.shape
        H = self.n_head
        q, k, v = self.c_attn(x).split(C, dim=2)  # 3 x (B, T, C), views
        q, k, v = (t.reshape(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
        if cache is not None:  # decoding: attend to the past (B, H, Tpast + T, D)
            y = cache.attention(layer, q, k, v, positions)  # (B, H, T, D)
        else:
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

    def forward(self, x, cache=None, layer=0, positions=None):
        if self.recompute and cache is None:  # one "checkpoint" record saving x (B, T, C)
            return autograd.checkpoint(self._forward, x)
        return self._forward(x, cache, layer, positions)

    def _forward(self, x, cache=None, layer=0, positions=None):
        x = x + self.attn(self.ln_1(x), cache, layer, positions)
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


class GPT2(CausalLM):
    """config: what the model is (its shapes); options: how it runs (ExecutionOptions, the
    training run's defaults when None), read by its modules as they are built."""

    config_class = GPT2Config

    def make_modules(self, config, rng):
        self.transformer = Transformer(config, rng, self.options)
        # the LM head is tied to the token embedding: logits = x @ wte^T, no parameter of its own

    def get_input_embeddings(self):
        return self.transformer.wte

    def forward(self, idx, targets=None, cache=None, last_only=False, cache_position=None):
        """idx (B, T) int token ids -> (logits (B, T, V) fp, mean cross-entropy or None).
        targets (B, T) int, -1 ignored. With a cache, positions continue from cache.length
        (cache_position (T,): Hugging Face's name). last_only and the LM head (tied to wte,
        logits = x wte^T): CausalLM._head."""
        idx, B, T, positions = self._positions(idx, cache, cache_position)
        tr = self.transformer
        x = tr.wte(idx) + tr.wpe(positions)  # (B, T, C) + (T, C)
        x = tr.drop(x)
        for i, block in enumerate(tr.h):
            x = block(x, cache, i, positions)
        if cache is not None:
            kernels.on_host(cache.advance, T)
        return self._head(tr.ln_f(x), tr.wte.weight, targets, last_only)
