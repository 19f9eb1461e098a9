"""Learning-rate schedules: linear warmup, then cosine decay to a minimum (GPT-2 / nanoGPT)."""

import math


def cosine_with_warmup(step, max_lr, min_lr, warmup, total):
    """lr at step (0-based): rises linearly over warmup steps to max_lr, then follows half a
    cosine down to min_lr at step total, and stays there."""
    if step < warmup:
        return max_lr * (step + 1) / warmup
    if step >= total:
        return min_lr
    progress = (step - warmup) / max(1, total - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (max_lr - min_lr)
