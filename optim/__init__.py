"""Optimizers: fused flat-buffer AdamW with an fp32 master copy, loss scaling, schedules."""

from .adamw import AdamW
from .clip import clip_grad_norm_
from .scaler import LossScaler
from .schedule import cosine_with_warmup

__all__ = ["AdamW", "LossScaler", "clip_grad_norm_", "cosine_with_warmup"]
