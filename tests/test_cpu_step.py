"""The CPU's compiled step (tinygrad_like/graph/cpu_step.py, backend/cpu/step_runner.py): a
captured decode step whose launches all have op forms (GPT-2 and Llama, fp32 and the quantized
weight formats, fp32, int8 or bf16 activations) runs as one parallel hand-off, every thread through
the step's ops with a barrier between them, over buffers planned in one arena. It gives the
eager step's logits bit for bit on one thread and on two, refuses bad token ids and
positions as the eager step does (and runs nothing), and a step with a launch no form takes
stays a replay from Python, saying why.
"""

import numpy as np
import pytest
from test_generate import CFG, randomized
from test_llama import GQA
from test_llama import randomized as randomized_llama

from nn import KVCache
from nn.quant import quantize_model
from tinygrad_like import graph
from tinygrad_like.backend.cpu import step_runner


def _steps(model, steps, compiled, B=2, prompt_len=5, kv_dtype=None):
    """(last-position logits of each greedy step (B, steps, V), the captured Program or None)."""
    prompt = np.random.default_rng(1).integers(0, model.config.vocab_size, (B, prompt_len))
    like = model.get_input_embeddings().weight
    cache = KVCache(model.config, B, prompt_len + steps, like, kv_dtype)
    step = model.decode_step(cache)
    token = step(prompt, np.arange(prompt_len))
    run = graph.compile(step) if compiled else step
    out = []
    for _ in range(steps):
        token = run(token[:, -1].argmax(-1)[:, None], np.array([cache.length]))
        out.append(np.array(token[:, -1]))
    return np.stack(out, 1), (run.program if compiled else None)


def _model(family, fmt):
    weights, _, activations = fmt.partition("+")
    model = randomized(CFG, seed=0) if family == "gpt2" else randomized_llama(GQA, seed=0)
    return quantize_model(model, weights, activations=activations or "fp32")


@pytest.mark.parametrize(
    "family, fmt, B",
    [
        ("gpt2", "fp32", 1),
        ("gpt2", "fp32", 2),
        ("gpt2", "int4+int8", 2),
        ("gpt2", "bf16", 1),
        ("gpt2", "bf16+bf16", 2),
        ("llama", "fp32", 2),
        ("llama", "int8", 1),
        ("gpt2", "int8+int8", 1),
    ],
)
@pytest.mark.parametrize("threads", [1, 2])
def test_a_decode_step_runs_as_one_hand_off_with_the_eager_bits(
    monkeypatch, threads, family, fmt, B
):
    monkeypatch.setattr(step_runner, "THREADS", min(threads, step_runner.THREADS))
    model = _model(family, fmt)
    eager, _ = _steps(model, 5, compiled=False, B=B)
    replayed, program = _steps(model, 5, compiled=True, B=B)
    assert program.graph is not None, program.python_why
    assert program.graph.graphs == 1  # the KV cache's host call moved before the launches
    assert replayed.tobytes() == eager.tobytes()


def test_bad_token_ids_and_positions_are_refused_as_eagerly_and_run_nothing():
    model = randomized(CFG, seed=0)
    cache = KVCache(CFG, 1, 8, model.get_input_embeddings().weight)
    step = graph.compile(model.decode_step(cache))
    for _ in range(3):
        step(np.array([[3]]), np.array([cache.length]))
    assert step.program.graph is not None
    kept, length = [a.tobytes() for a in (*cache.k, *cache.v)], cache.length
    with pytest.raises(ValueError, match="token id 99 out of range for vocab"):
        step(np.array([[99]]), np.array([cache.length]))
    with pytest.raises(IndexError, match="index 9 is out of bounds for axis 2 with size 8"):
        step(np.array([[3]]), np.array([9]))  # in the model's positions, past the cache
    assert [a.tobytes() for a in (*cache.k, *cache.v)] == kept and cache.length == length


@pytest.mark.parametrize(
    "model, kv_dtype, why",
    [
        (lambda: randomized(CFG, seed=0).to(dtype="bf16"), None, "add: two fp32 arrays"),
        (lambda: randomized(CFG, seed=0), "fp8_e4m3", "no op form for kv_quantize, qattention"),
    ],
)
def test_a_step_with_a_launch_no_form_takes_stays_a_replay_from_python(model, kv_dtype, why):
    model = model()
    eager, _ = _steps(model, 3, compiled=False, kv_dtype=kv_dtype)
    replayed, program = _steps(model, 3, compiled=True, kv_dtype=kv_dtype)
    assert program.graph is None and why in program.python_why
    assert replayed.tobytes() == eager.tobytes()
