"""How a GPT2 runs, not what it is (that is GPT2Config; Hugging Face files never hold these):
ExecutionOptions, one frozen object that GPT2(...), the command line and the accounting report
share, with one set of defaults, those of the default training run.

Each option is declared once, here: its name, type, default, the values it takes and its help.
The training run's settings (training/loop.py's RunConfig) and every script's flags
(training/args.py) are made from these fields."""

from dataclasses import dataclass, field, fields

import tinygrad_like.functional as F


def setting(default, help, choices=None):
    """A field of ExecutionOptions (or of a run's settings, training/loop.py's RunConfig): its
    default, its command-line help and, for a string, the values it takes (the field's
    metadata "help" and "choices")."""
    return field(default=default, metadata={"help": help, "choices": choices})


@dataclass(frozen=True)
class ExecutionOptions:
    """Three trades of memory for compute (and one design of the fused head), each measured by
    the accounting report (accounting/report.py). Checked once, here: a bad value is a
    ValueError naming the choices."""

    # flash saves one fp32 log-sum-exp per row of a block; naive the (B, H, T, T) probabilities
    attention: str = setting(
        "flash",
        "flash (FlashAttention in blocks: one log-sum-exp saved per row) or naive (T x T saved)",
        ("flash", "naive"),
    )
    # fused: the tied LM head and the loss in one record over row blocks, the (B·T, Vp) logits
    # never made (no logits returned with targets); plain: the head's GEMM, then the loss
    lm_head: str = setting(
        "fused",
        "fused (the head and the loss over row blocks, no logits kept) or plain (B·T x Vp)",
        ("fused", "plain"),
    )
    # precompute saves fp32 dX (B·T, C) and dW (Vp, C); recompute saves x and runs one more head
    # GEMM. The designs are the op's (F.linear_cross_entropy runs them and refuses any other),
    # named through it: one list, and a new design needs no edit here
    lm_head_design: str = setting(
        "precompute",
        "the fused head's: precompute (its gradients formed in the forward) or recompute "
        "(its logits formed again in the backward)",
        F.HEAD_DESIGNS,
    )
    # each block saves only its input (B, T, C)
    recompute: bool = setting(False, "blocks save only their input and redo their forward")

    def __post_init__(self):
        for f in fields(self):
            value, choices = getattr(self, f.name), f.metadata["choices"]
            if choices is not None and value not in choices:
                raise ValueError(f"unknown {f.name} {value!r}: use one of {', '.join(choices)}")
            if f.type is bool and not isinstance(value, bool):
                raise ValueError(f"{f.name} must be True or False, got {value!r}")

    @classmethod
    def of(cls, settings):
        """The options that settings (a RunConfig, a script's parsed flags: anything with an
        attribute per option) choose, checked (ValueError)."""
        return cls(**{f.name: getattr(settings, f.name) for f in fields(cls)})


def with_options(cls):
    """Give the settings class cls (training/loop.py's RunConfig) ExecutionOptions' fields, as
    declared here, with their types, defaults and help: a class decorator applied before
    @dataclass reads the class."""
    for f in fields(ExecutionOptions):
        cls.__annotations__[f.name] = f.type
        setattr(cls, f.name, field(default=f.default, metadata=f.metadata))
    return cls
