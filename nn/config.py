"""What a model is: GPT2Config and LlamaConfig (Hugging Face's field names), and the presets of
both families (from_preset picks the class by the preset's name).

Shapes: L layers, C channels, H query heads of D = C / H, Hkv key/value heads (Llama), F the
MLP's width, V = vocab_size, Vp = V padded to a multiple of VOCAB_MULTIPLE (the rows the
embedding and LM head store, the logits' columns), T tokens per sequence.

Both configs answer the same questions (num_parameters, flops_per_token, padded_vocab_size,
kv_cache_bytes_per_token, attention_crossover, check_context, ...) so that the trainer, the
accounting and generation need not know the family.
"""

import math
from dataclasses import asdict, dataclass, replace

# wte is stored with its vocabulary padded to a multiple of 64 (50,257 -> 50,304 for GPT-2, as
# llm.c and nanoGPT do), so the tied LM head's GEMMs have 16-byte aligned rows: the logits
# (B*T, Vp) and dlogits rows and wte's Vp dimension then take gemm.cu's cp.async 16-byte loads
# (any multiple of 8 would do for 2-byte types) and fill its 64- and 128-wide tiles, where
# V = 50,257 falls to the element-by-element path. The padding rows are zero, never sampled,
# never parameters, and absent from Hugging Face files.
VOCAB_MULTIPLE = 64


@dataclass(frozen=True)
class GPT2Config:
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    n_positions: int = 1024  # the context length
    vocab_size: int = 50257
    dropout: float = 0.0  # embedding and residual dropout (GPT-2's resid/embd_pdrop)
    layer_norm_epsilon: float = 1e-5

    def __post_init__(self):
        for field in ("n_layer", "n_head", "n_embd", "n_positions", "vocab_size"):
            if getattr(self, field) <= 0:
                raise ValueError(f"GPT2Config.{field} must be positive, got {getattr(self, field)}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd {self.n_embd} is not divisible by n_head {self.n_head}")
        _check_positive(self, "layer_norm_epsilon")
        if not (_is_number(self.dropout) and 0 <= self.dropout < 1):
            raise ValueError(f"GPT2Config.dropout must be in [0, 1), got {self.dropout!r}")

    @classmethod
    def from_preset(cls, name, **overrides):
        return from_preset(name, **overrides)

    # LlamaConfig's names for the attention's shape (the KV cache reads them): every head has
    # its own keys and values
    n_kv_head = property(lambda self: self.n_head)
    head_dim = property(lambda self: self.n_embd // self.n_head)

    @property
    def padded_vocab_size(self):
        """Vp: the rows wte stores and the logits' columns (derived: config.json keeps V)."""
        return -(-self.vocab_size // VOCAB_MULTIPLE) * VOCAB_MULTIPLE

    def num_parameters(self):
        """N, as GPT2.num_parameters() counts it: wte (V, C) once (the LM head is tied to it,
        its padding rows are not parameters), wpe, L blocks of two layernorms, QKV, attention
        output and the MLP's two linears (weights and biases), and ln_f."""
        V, P, L, C = self.vocab_size, self.n_positions, self.n_layer, self.n_embd
        block = 4 * C + (3 * C * C + 3 * C) + (C * C + C) + (4 * C * C + 4 * C) + (4 * C * C + C)
        return V * C + P * C + L * block + 2 * C

    def flops_per_token(self, seq_len):
        """Model FLOPs per token of a training step at seq_len tokens per sequence, what MFU
        divides by: 6N + 12·L·C·T. Every parameter costs 2 FLOPs forward and 4 backward per
        token (the tied embedding paid in full as the LM head), and attention's own GEMMs
        (QK^T and probs·V) 4·C·T forward and 8·C·T backward per layer, counting the masked
        half of the T x T scores as computed, as the kernels do (the other public convention,
        6N + 6·L·C·T, skips it)."""
        return 6 * self.num_parameters() + 12 * self.n_layer * self.n_embd * seq_len

    def padding_cost(self):
        """What the padding rows cost, for the accounting: elements stored beyond the
        parameters (in the weights and in each of AdamW's buffers), and the tied LM head's
        extra GEMM FLOPs per token (forward 2·C·pad, backward twice that). The cross-entropy
        kernels skip the padding columns, so they add nothing there."""
        pad, C = self.padded_vocab_size - self.vocab_size, self.n_embd
        return {
            "rows": pad,
            "elements": pad * C,
            "forward_flops_per_token": 2 * C * pad,
            "backward_flops_per_token": 4 * C * pad,
        }

    def kv_cache_bytes_per_token(self, itemsize=2):
        """Bytes a KV cache holds per token: K and V of every layer, C values each."""
        return 2 * self.n_layer * self.n_embd * itemsize

    def attention_crossover(self):
        """The sequence length at which attention's own matmuls (4·C·T FLOPs per token per layer
        forward) equal the layer's linear layers (2 FLOPs per weight: 12·C² weights)."""
        return 12 * self.n_embd**2 / (4 * self.n_embd)

    def to_dict(self):
        return asdict(self)

    def check_context(self, n_tokens, what="a sequence of length"):
        """The one error for n_tokens positions that do not fit the context: '{what} {n_tokens}
        is longer than the context of ...'."""
        if n_tokens > self.n_positions:
            raise ValueError(
                f"{what} {n_tokens} is longer than the context of "
                f"{self.n_positions} positions: shorten it"
            )


@dataclass(frozen=True)
class LlamaConfig:
    """A Llama-family decoder, Hugging Face's LlamaConfig names: pre-RMSNorm blocks, rotary
    positions (rotate-half), grouped-query attention with num_key_value_heads K/V heads shared
    by the query heads, a SwiGLU MLP, untied embeddings, no biases."""

    num_hidden_layers: int = 32  # L
    hidden_size: int = 4096  # C
    num_attention_heads: int = 32  # H, of D = C / H channels each
    num_key_value_heads: int = 32  # Hkv: H / Hkv query heads share each K/V head (GQA)
    intermediate_size: int = 11008  # F, the gate and up projections' width
    vocab_size: int = 32000  # V
    max_position_embeddings: int = 4096  # the context length
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0  # rotary base: pair i of a head turns theta^(-2i/D) per position

    def __post_init__(self):
        for field in (
            "num_hidden_layers",
            "hidden_size",
            "num_attention_heads",
            "num_key_value_heads",
            "intermediate_size",
            "vocab_size",
            "max_position_embeddings",
        ):
            if getattr(self, field) <= 0:
                raise ValueError(
                    f"LlamaConfig.{field} must be positive, got {getattr(self, field)}"
                )
        H, Hkv = self.num_attention_heads, self.num_key_value_heads
        if self.hidden_size % H or (self.hidden_size // H) % 2:
            raise ValueError(
                f"hidden_size {self.hidden_size} must split into {H} heads of an even size"
            )
        if H % Hkv:
            raise ValueError(
                f"num_attention_heads {H} is not a multiple of num_key_value_heads {Hkv}"
            )
        _check_positive(self, "rms_norm_eps")
        _check_positive(self, "rope_theta")

    # the names family-independent code reads (GPT2Config's)
    n_layer = property(lambda self: self.num_hidden_layers)
    n_embd = property(lambda self: self.hidden_size)
    n_head = property(lambda self: self.num_attention_heads)
    n_kv_head = property(lambda self: self.num_key_value_heads)
    n_positions = property(lambda self: self.max_position_embeddings)
    head_dim = property(lambda self: self.hidden_size // self.num_attention_heads)
    padded_vocab_size = GPT2Config.padded_vocab_size
    check_context = GPT2Config.check_context
    to_dict = GPT2Config.to_dict

    @classmethod
    def from_preset(cls, name, **overrides):
        return from_preset(name, **overrides)

    def layer_parameters(self):
        """Weights of one block: Q and the output projection (C x C each), K and V
        (C x Hkv·D each), the gate, up and down projections (C x F each), two RMSNorm weights."""
        C, F, kv = self.hidden_size, self.intermediate_size, self.n_kv_head * self.head_dim
        return 2 * C * C + 2 * C * kv + 3 * C * F + 2 * C

    def num_parameters(self):
        """N, as the model counts it: the embedding and the LM head (V x C each, untied; padding
        rows are not parameters), L blocks, the final RMSNorm. The lecture's reference 7B
        count (6,738,149,376) leaves out the 2·L·C + C = 266,240 RMSNorm weights."""
        return (
            2 * self.vocab_size * self.hidden_size
            + self.n_layer * self.layer_parameters()
            + self.hidden_size
        )

    def flops_per_token(self, seq_len):
        """Model FLOPs per token of a training step at seq_len tokens per sequence: 6 per weight
        that multiplies (every parameter but the embedding, a gather, and the RMSNorm weights)
        and attention's own GEMMs, 12·L·C·T as GPT2Config counts them (all H query heads
        attend, whatever Hkv)."""
        C, L = self.hidden_size, self.n_layer
        multiplying = self.vocab_size * C + L * (self.layer_parameters() - 2 * C)
        return 6 * multiplying + 12 * L * C * seq_len

    def padding_cost(self):
        """Elements stored beyond the parameters (the padding rows of the embedding and of the
        LM head) and the LM head's extra GEMM FLOPs per token (forward 2·C·pad, backward twice)."""
        pad, C = self.padded_vocab_size - self.vocab_size, self.hidden_size
        return {
            "rows": pad,
            "elements": 2 * pad * C,
            "forward_flops_per_token": 2 * C * pad,
            "backward_flops_per_token": 4 * C * pad,
        }

    def kv_cache_bytes_per_token(self, itemsize=2):
        """Bytes a KV cache holds per token: K and V of every layer, Hkv heads of D values each
        (GQA's saving: H / Hkv times less than one per query head)."""
        return 2 * self.n_layer * self.n_kv_head * self.head_dim * itemsize

    def attention_crossover(self):
        """The sequence length at which attention's own matmuls (4·C·T FLOPs per token per layer
        forward) equal the layer's linear layers (2 per weight), the lecture's S = 24,704 for
        the reference 7B (its count, without the RMSNorm weights)."""
        return (self.layer_parameters() - 2 * self.hidden_size) / (2 * self.hidden_size)


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_positive(config, field):
    """A ValueError unless config.field is a finite number > 0 (an epsilon, the rotary base): a
    zero, negative or infinite one would surface later as nan, blamed on the weights or --lr."""
    value = getattr(config, field)
    if not (_is_number(value) and math.isfinite(value) and value > 0):
        raise ValueError(
            f"{type(config).__name__}.{field} must be a finite number > 0, got {value!r}"
        )


def from_preset(name, **overrides):
    """The config of a preset (either family), with fields overridden."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}: use one of {', '.join(PRESETS)}")
    return replace(PRESETS[name], **overrides)


PRESETS = {
    # the public GPT-2 sizes
    "gpt2": GPT2Config(12, 12, 768),  # 124,439,808 parameters
    "gpt2-medium": GPT2Config(24, 16, 1024),
    "gpt2-large": GPT2Config(36, 20, 1280),
    "gpt2-xl": GPT2Config(48, 25, 1600),
    # small ones that train visibly on 2 CPU cores (GPT-2's tokenizer and vocabulary)
    "gpt2-mini": GPT2Config(4, 4, 128, n_positions=256),
    "gpt2-tiny": GPT2Config(2, 2, 32, n_positions=64),
    # the course's reference 7B (lecture 2): L 32, C 4096, 32 heads of 128, F 11008, V 32000;
    # its grouped-query exercise is llama-7b with num_key_value_heads=8
    "llama-7b": LlamaConfig(),
    # small ones that train on 2 CPU cores with GPT-2's tokenizer (GQA: 2 query heads per K/V)
    "llama-mini": LlamaConfig(4, 128, 4, 2, 352, 50257, 256),
    "llama-tiny": LlamaConfig(2, 32, 4, 2, 64, 50257, 64),
}
