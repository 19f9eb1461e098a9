"""What a GPT-2 is: GPT2Config (Hugging Face's field names) and the presets.

Shapes: L = n_layer, C = n_embd, H = n_head, V = vocab_size, Vp = V padded to a multiple of
VOCAB_MULTIPLE (the rows wte stores, the logits' columns), T tokens per sequence.
"""

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

    @classmethod
    def from_preset(cls, name, **overrides):
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}: use one of {', '.join(PRESETS)}")
        return replace(PRESETS[name], **overrides)

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


PRESETS = {
    # the public GPT-2 sizes
    "gpt2": GPT2Config(12, 12, 768),  # 124,439,808 parameters
    "gpt2-medium": GPT2Config(24, 16, 1024),
    "gpt2-large": GPT2Config(36, 20, 1280),
    "gpt2-xl": GPT2Config(48, 25, 1600),
    # small ones that train visibly on 2 CPU cores (GPT-2's tokenizer and vocabulary)
    "gpt2-mini": GPT2Config(4, 4, 128, n_positions=256),
    "gpt2-tiny": GPT2Config(2, 2, 32, n_positions=64),
}
