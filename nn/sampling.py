"""Choosing the next token from the last position's logits (B, V), on the host in fp32."""

import math

import numpy as np


def check_sampling(
    temperature=1.0, top_k=None, top_p=None, names=("temperature", "top_k", "top_p")
):
    """ValueError naming the first bad sampling argument (as names spells them: a command
    line passes its flags). nan fails every comparison, so each test is written to refuse it."""
    t, k, p = names
    if not (
        isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature >= 0
    ):
        raise ValueError(f"{t} must be a finite number >= 0, got {temperature}")
    if top_k is not None and not (isinstance(top_k, (int, np.integer)) and top_k >= 1):
        raise ValueError(f"{k} must be an integer >= 1, got {top_k}")
    if top_p is not None and not (isinstance(top_p, (int, float)) and 0 < top_p <= 1):
        raise ValueError(f"{p} must be in (0, 1], got {top_p}")


def sample(logits, temperature=1.0, top_k=None, top_p=None, rng=None):
    """temperature 0 is greedy (argmax). top_k keeps the k most likely tokens (and any tied
    with the k-th), top_p the smallest set whose probability reaches p; sampling never leaves
    those sets. -> (B,) int64. The top k are found by a partition (linear in V), not a sort, and
    the softmax and the draw run over them only: the sampling is host time every decode step
    pays (docs/decode.md, --stats)."""
    check_sampling(temperature, top_k, top_p)
    if temperature == 0:
        return logits.argmax(axis=-1).astype(np.int64)
    rng = rng or np.random.default_rng()
    logits = logits / temperature
    tokens = []
    for row in logits:
        kept = None  # every token, or the ids of the top k (ascending)
        if top_k is not None and top_k < row.shape[0]:
            kept = np.flatnonzero(row >= np.partition(row, -top_k)[-top_k])
            row = row[kept]
        probs = np.exp(row - row.max())
        probs /= probs.sum()
        if top_p is not None:
            probs = _nucleus(probs[None], top_p)[0]
        i = rng.choice(len(probs), p=probs)
        tokens.append(i if kept is None else kept[i])
    return np.array(tokens, dtype=np.int64)


def _nucleus(probs, top_p):
    """Zero every token outside the smallest most-likely set with total probability >= top_p."""
    order = np.argsort(-probs, axis=-1)
    sorted_p = np.take_along_axis(probs, order, axis=-1)
    # keep a token if the mass before it is still short of top_p (so the first always stays)
    keep_sorted = (np.cumsum(sorted_p, axis=-1) - sorted_p) < top_p
    keep = np.zeros_like(keep_sorted)
    np.put_along_axis(keep, order, keep_sorted, axis=-1)
    probs = np.where(keep, probs, 0.0)
    return probs / probs.sum(axis=-1, keepdims=True)
