"""Measuring a training step: what the accounting report, inspect_tape and the benchmarks run."""
import numpy as np


def random_batch(vocab_size, batch_size, seq_len, seed=0):
    """(x, y) int64 (B, T) token ids: counts and shapes do not depend on the values."""
    ids = np.random.default_rng(seed).integers(0, vocab_size, (batch_size, seq_len + 1))
    return ids[:, :-1].copy(), ids[:, 1:].copy()
