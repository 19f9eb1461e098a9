"""Activation recomputation (ExecutionOptions.recompute, autograd.checkpoint): each block saves only
its input and re-runs its forward inside the backward. The same kernels run on the same inputs,
so training is bitwise the one without it; the tape, the tracker and the profiler show what
moved: C elements saved per token per layer, the blocks' forward FLOPs once more, labelled as
forward math run in the backward phase."""

import gc

import numpy as np
import pytest

import tinygrad_like.functional as F
from accounting import measure
from nn import GPT2, ExecutionOptions, GPT2Config
from optim import AdamW
from tinygrad_like import TAPE, Tensor, autograd, no_grad
from tinygrad_like.memory import TRACKER
from tinygrad_like.profiler import Profiler

B, T = 2, 16
# gpt2-tiny's shape with a small vocabulary, so the blocks (not the logits) dominate memory
SMALL = GPT2Config(n_layer=3, n_head=2, n_embd=32, n_positions=32, vocab_size=64)


def options(recompute):
    """What these tests measure: naive attention and the plain head, recomputed or not."""
    return ExecutionOptions(attention="naive", lm_head="plain", recompute=recompute)


def train(recompute, dropout, steps=10):
    """steps of AdamW on random batches -> (losses, every step's gradients, final weights)."""
    model = GPT2(GPT2Config.from_preset("gpt2-tiny", dropout=dropout), options=options(recompute))
    model.flatten_parameters()
    optimizer = AdamW(model.named_parameters(), lr=1e-2)
    F.manual_seed(7)
    rng = np.random.default_rng(0)
    losses, grads = [], []
    for _ in range(steps):
        ids = rng.integers(0, model.config.vocab_size, (B, T + 1))
        _, loss = model(ids[:, :-1], ids[:, 1:])
        loss.backward()
        losses.append(loss.item())
        grads.append({n: p.grad.numpy().copy() for n, p in model.named_parameters()})
        optimizer.step()
        optimizer.zero_grad()
    return losses, grads, model.state_dict()


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_training_is_bitwise_the_same(dropout):
    """fp32 on the CPU: the recomputed forward runs the same kernels on the same inputs (and
    the rewound dropout generator draws the same masks), and every gradient is summed in the
    same order, so losses, gradients and weights are equal bit for bit."""
    plain, recomputed = train(False, dropout), train(True, dropout)
    assert plain[0] == recomputed[0]
    for step_plain, step_recomputed in zip(plain[1], recomputed[1]):
        for name, g in step_plain.items():
            assert np.array_equal(g, step_recomputed[name]), name
    for name, w in plain[2].items():
        assert np.array_equal(w, recomputed[2][name]), name


def step(recompute, config=SMALL):
    """One profiled forward and backward -> (profiler, tape dicts, tracker activations,
    launches outside records, the model)."""
    model = GPT2(config, options=options(recompute))
    x, y = measure.random_batch(config.vocab_size, B, T)
    with Profiler() as prof:
        records, activations, unowned = measure.forward_backward(model, x, y)
    return prof, records, activations, unowned, model


def test_a_block_saves_only_its_input():
    prof, records, activations, unowned, model = step(True)
    c = model.config
    blocks = [r for r in records if measure.layer_of(r["scope"]).startswith("transformer.h.")]
    assert [(r["op"], r["scope"]) for r in blocks] == [
        ("checkpoint", f"transformer.h.{i}") for i in range(c.n_layer)
    ]
    assert [r["saved_bytes"] / (B * T) for r in blocks] == [c.n_embd * 4] * c.n_layer
    assert activations == sum(r["saved_bytes"] for r in records)
    # each checkpoint record owns its whole backward (the recomputed forward's records report
    # to it), so the tape still adds up to the profiler
    assert sum(r["fwd_flops"] for r in records) == prof.by_phase()["forward"]["flops"]
    assert (
        sum(r["bwd_flops"] for r in records) + unowned["backward"].flops
        == prof.by_phase()["backward"]["flops"]
    )


def test_recomputed_forward_is_forward_math_in_the_backward_phase():
    """The step's forward math grows by exactly the blocks' forward (the block GEMMs: 2N + 4N
    + 2N instead of 2N + 4N); the backward math and the forward phase are unchanged."""
    plain, recomputed = step(False), step(True)
    blocks_forward = sum(
        r["fwd_flops"]
        for r in plain[1]
        if measure.layer_of(r["scope"]).startswith("transformer.h.")
    )
    by_math = [p[0].by_phase(by="math") for p in (plain, recomputed)]
    by_phase = [p[0].by_phase() for p in (plain, recomputed)]
    assert by_math[1]["forward"]["flops"] == by_math[0]["forward"]["flops"] + blocks_forward
    assert by_math[1]["backward"]["flops"] == by_math[0]["backward"]["flops"]
    assert by_phase[1]["forward"]["flops"] == by_phase[0]["forward"]["flops"]
    assert by_phase[1]["backward"]["flops"] == by_phase[0]["backward"]["flops"] + blocks_forward
    moved = [x for x in recomputed[0].launches if x.phase == "backward" and x.math == "forward"]
    assert sum(x.flops for x in moved) == blocks_forward
    assert not [x for x in plain[0].launches if x.phase != x.math]


def test_the_inner_tape_lives_only_during_its_blocks_backward():
    """Peak activations in the backward: all blocks' inputs and the embeddings' ids, plus one
    block's other activations (recomputed, then freed record by record); afterwards nothing of
    the inner tapes is alive."""
    model = GPT2(SMALL, options=options(True))
    x, y = measure.random_batch(SMALL.vocab_size, B, T)
    plain_block = B * T * ((16 * SMALL.n_embd + SMALL.n_head * T) * 4 + 16)  # as test_accounting
    gc.collect()
    before = TRACKER.current["activations"]
    start = TAPE.position()
    _, loss = model(x, y)
    records = TAPE.records(since=start)
    last = max(r.seq for r in records if r.op == "checkpoint")
    TRACKER.start_recording(temporaries=False)
    loss.backward()
    TRACKER.stop_recording()
    inputs = sum(r.saved_bytes for r in records if r.seq <= last)  # embeddings' ids, x per block
    assert TRACKER.peak["activations"] - before == inputs + plain_block - B * T * SMALL.n_embd * 4
    assert TRACKER.current["activations"] == before
    assert [r.seq for r in TAPE.records(since=start)] == [r.seq for r in records]
    # every record on the loss's path is freed (the logits' view is not on it)
    assert [(r.op, r.scope) for r in records if not r.freed] == [("getitem", "lm_head")]


def test_no_wrapper_under_no_grad_and_generation_unaffected():
    plain, recomputed = GPT2(SMALL, options=options(False)), GPT2(SMALL, options=options(True))
    x = np.random.default_rng(1).integers(0, SMALL.vocab_size, (2, 8))
    start = TAPE.position()
    with no_grad():
        logits = [m(x)[0].numpy() for m in (plain, recomputed)]
    assert TAPE.records(since=start) == []
    assert np.array_equal(*logits)
    assert np.array_equal(plain.generate(x, 10, seed=3), recomputed.generate(x, 10, seed=3))


def test_checkpoint_of_any_function():
    """A leaf used inside fn gets the gradient it would get without the checkpoint; an input
    that does not require grad gets none, and with no such input it is the plain call."""
    rng = np.random.default_rng(2)
    w = Tensor(rng.normal(size=(4, 3)).astype(np.float32), requires_grad=True)
    x = Tensor(rng.normal(size=(5, 4)).astype(np.float32), requires_grad=True)
    b = Tensor(rng.normal(size=(5, 3)).astype(np.float32))

    def fn(x, b):
        return F.dropout(F.gelu(x @ w) + b, 0.5)

    grads = []
    for wrap in (False, True):
        w.grad = x.grad = None
        F.manual_seed(0)
        out = autograd.checkpoint(fn, x, b) if wrap else fn(x, b)
        (out * out).sum().backward()
        grads.append((w.grad.numpy(), x.grad.numpy(), b.grad))
    assert np.array_equal(grads[0][0], grads[1][0]) and np.array_equal(grads[0][1], grads[1][1])
    assert grads[1][2] is None
    start = TAPE.position()
    autograd.checkpoint(lambda b: b * 2.0, b)
    assert [r.op for r in TAPE.records(since=start)] == []
