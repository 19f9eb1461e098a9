"""How a GPT2 runs, not what it is (that is GPT2Config; Hugging Face files never hold these):
ExecutionOptions, one frozen object that GPT2(...), the command line and the accounting report
share, with one set of defaults, those of the default training run."""

from dataclasses import dataclass

import tinygrad_like.functional as F

# the values each string option takes, its default first
CHOICES = {
    "attention": ("flash", "naive"),
    "lm_head": ("fused", "plain"),
    "lm_head_design": F.HEAD_DESIGNS,
}


@dataclass(frozen=True)
class ExecutionOptions:
    """Three trades of memory for compute (and one design of the fused head), each measured by
    the accounting report (accounting/report.py). Checked once, here: a bad value is a
    ValueError naming the choices."""

    # flash: FlashAttention in blocks, saving one fp32 log-sum-exp per row; naive: saves the
    # (B, H, T, T) probabilities
    attention: str = "flash"
    # fused: the tied LM head and the loss in one record over row blocks, the (B·T, Vp) logits
    # never made (no logits returned with targets); plain: the head's GEMM, then the loss
    lm_head: str = "fused"
    # the fused head's design (F.linear_cross_entropy): precompute forms its gradients in the
    # forward and saves them, fp32 dX (B·T, C) and dW (Vp, C); recompute saves x and forms the
    # logits again in the backward (one more head GEMM)
    lm_head_design: str = "precompute"
    # each block saves only its input (B, T, C) and re-runs its forward inside the backward
    recompute: bool = False

    def __post_init__(self):
        for name, choices in CHOICES.items():
            value = getattr(self, name)
            if value not in choices:
                raise ValueError(f"unknown {name} {value!r}: use one of {', '.join(choices)}")
        if not isinstance(self.recompute, bool):
            raise ValueError(f"recompute must be True or False, got {self.recompute!r}")
