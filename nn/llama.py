"""Llama, as Hugging Face's LlamaForCausalLM, with its parameter names and layouts: pre-RMSNorm
blocks, rotary positions (rotate-half), grouped-query attention, a SwiGLU MLP, untied
embeddings, no biases. Generation, the checks and the LM head are CausalLM's (nn/lm.py).

Shapes: B batch, T tokens, C = hidden_size, H query heads and Hkv key/value heads of D = C / H
channels, F = intermediate_size, V vocab, Vp = V padded (nn/config.py). Every projection
weight is (out, in), as the checkpoints store it (layers.TransposedLinear).
"""

import numpy as np

import tinygrad_like.functional as F
from tinygrad_like import autograd, backend, dtypes, kernels

from .config import LlamaConfig
from .layers import Embedding, RMSNorm, TransposedLinear, projections
from .lm import CausalLM
from .module import Module, ModuleList


class LlamaRotaryEmbedding(Module):
    """The rotary tables cos, sin (max_position_embeddings, D/2): pair i of a head turns by
    position * rope_theta^(-2i/D). Computed once in fp64 on the host; each device and compute
    dtype gets its copy on first use. Constants, not parameters (Hugging Face does not save
    them either)."""

    def __init__(self, config):
        super().__init__()
        D = config.head_dim
        inv_freq = config.rope_theta ** (-np.arange(0, D, 2, dtype=np.float64) / D)  # (D/2,)
        angles = np.outer(np.arange(config.max_position_embeddings), inv_freq)  # (P, D/2)
        self.host = np.cos(angles), np.sin(angles)
        self.tables = {}  # (device, compute dtype) -> (cos, sin)

    def forward(self, like, positions=None):
        """(cos, sin) on like's device in its compute dtype (fp32, fp64 for fp64): the whole
        tables, or their rows at positions (T,) int64 of that device, gathered by counted
        embedding_fwd launches (a KV-cache step's: the same launches at every position)."""
        be, acc = backend.of(like.data), dtypes.compute_dtype(like.dtype)
        key = (be.name, acc)
        if key not in self.tables:
            self.tables[key] = tuple(be.asarray(t.astype(acc)) for t in self.host)
        if positions is None:
            return self.tables[key]
        return tuple(kernels.launch("embedding_fwd", t, positions) for t in self.tables[key])


class LlamaAttention(Module):
    """Causal self-attention with Hkv key/value heads, each shared by H / Hkv query heads
    (grouped-query attention; Hkv = H is multi-head attention). The shared heads are passed
    as they are to F.scaled_dot_product_attention, which never repeats them."""

    def __init__(self, config, rng, options):
        super().__init__()
        C, H, Hkv, D = config.hidden_size, config.n_head, config.n_kv_head, config.head_dim
        self.n_head, self.n_kv_head, self.head_dim = H, Hkv, D
        self.flash = options.attention == "flash"
        self.q_proj = TransposedLinear(C, H * D, rng=rng)  # (H D, C)
        self.k_proj = TransposedLinear(C, Hkv * D, rng=rng)  # (Hkv D, C)
        self.v_proj = TransposedLinear(C, Hkv * D, rng=rng)
        self.o_proj = TransposedLinear(H * D, C, rng=rng)

    def forward(self, x, rope, cache=None, layer=0, positions=None):
        """x (B, T, C); rope (cos, sin, start): the tables and the first of their rows to read
        (a KV-cache step's tables are its rows, start 0); positions (T,): the cache's."""
        B, T, _ = x.shape
        cos, sin, start = rope
        q, k, v = projections(x, self.q_proj, self.k_proj, self.v_proj)
        q = q.reshape(B, T, self.n_head, self.head_dim).transpose(1, 2)
        k = k.reshape(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
        v = v.reshape(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
        q = F.apply_rotary(q, cos, sin, start)  # (B, H, T, D)
        k = F.apply_rotary(k, cos, sin, start)  # (B, Hkv, T, D)
        if cache is not None:  # decoding: attend to the past (B, Hkv, Tpast + T, D)
            y = cache.attention(layer, q, k, v, positions)  # (B, H, T, D)
        else:
            y = F.scaled_dot_product_attention(q, k, v, self.flash)  # (B, H, T, D)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))


class LlamaMLP(Module):
    """down(silu(gate(x)) * up(x)): SwiGLU, F = intermediate_size wide."""

    def __init__(self, config, rng):
        super().__init__()
        C, Fw = config.hidden_size, config.intermediate_size
        self.gate_proj = TransposedLinear(C, Fw, rng=rng)  # (F, C)
        self.up_proj = TransposedLinear(C, Fw, rng=rng)
        self.down_proj = TransposedLinear(Fw, C, rng=rng)  # (C, F)

    def forward(self, x):
        return self.down_proj(F.swiglu(*projections(x, self.gate_proj, self.up_proj)))


class LlamaDecoderLayer(Module):
    def __init__(self, config, rng, options):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LlamaAttention(config, rng, options)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = LlamaMLP(config, rng)
        self.recompute = options.recompute  # save x, redo the rest in the backward

    def forward(self, x, rope, cache=None, layer=0, positions=None):
        if self.recompute and cache is None:  # one "checkpoint" record saving x (B, T, C)
            return autograd.checkpoint(lambda x: self._forward(x, rope), x)
        return self._forward(x, rope, cache, layer, positions)

    def _forward(self, x, rope, cache=None, layer=0, positions=None):
        x = x + self.self_attn(self.input_layernorm(x), rope, cache, layer, positions)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(Module):
    def __init__(self, config, rng, options):
        super().__init__()
        self.embed_tokens = Embedding(
            config.vocab_size, config.hidden_size, rng=rng, padded_to=config.padded_vocab_size
        )  # (Vp, C), zero past V
        self.layers = ModuleList(
            [LlamaDecoderLayer(config, rng, options) for _ in range(config.n_layer)]
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = LlamaRotaryEmbedding(config)


class Llama(CausalLM):
    """LlamaForCausalLM: config (LlamaConfig) is what the model is; options (ExecutionOptions,
    the training run's defaults when None) how it runs. The LM head is its own (Vp, C) weight
    (untied), zero past V."""

    config_class = LlamaConfig

    def make_modules(self, config, rng):
        self.model = LlamaModel(config, rng, self.options)
        self.lm_head = TransposedLinear(
            config.hidden_size, config.vocab_size, rng=rng, padded_to=config.padded_vocab_size
        )  # (Vp, C)

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def forward(self, idx, targets=None, cache=None, last_only=False, cache_position=None):
        """idx (B, T) int token ids -> (logits (B, T, V) fp, mean cross-entropy or None).
        targets (B, T) int, -1 ignored. With a cache, positions continue from cache.length
        (cache_position (T,): Hugging Face's name), the rotary tables' rows gathered at them.
        last_only and the LM head: CausalLM._head."""
        idx, B, T, positions = self._positions(idx, cache, cache_position)
        m = self.model
        x = m.embed_tokens(idx)  # (B, T, C)
        rope = (*m.rotary_emb(x, positions if cache is not None else None), 0)
        for i, layer in enumerate(m.layers):
            x = layer(x, rope, cache, i, positions)
        if cache is not None:
            kernels.on_host(cache.advance, T)
        return self._head(m.norm(x), self.lm_head.weight, targets, last_only)
