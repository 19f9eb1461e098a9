"""Graph second (tinygrad_like/graph): a step captured through the launch point and replayed
without the op layer. A captured decode step gives the eager step's logits bit for bit (GPT-2 and
Llama; fp32, bf16, quantized weights, an fp8 cache), a step whose kernels take a value that
changes between calls is refused naming the launch, a new shape is captured again and said
once, and the memory plan never lets two live buffers share a byte. Fused (graph/fuse.py), a
step keeps the unfused bits, on the CPU and on the CUDA backend (its .cu kernels executed on the
CPU where there is no GPU), and moves the bytes fewer that its fusions predict.
"""

import numpy as np
import pytest
from test_generate import CFG, randomized
from test_llama import GQA
from test_llama import randomized as randomized_llama

import tinygrad_like as tg
from accounting import captured
from nn import GPT2, KVCache
from nn.options import ExecutionOptions
from nn.quant import quantize_model
from optim import AdamW, LossScaler
from optim.step import device_step, train_on
from tinygrad_like import backend, graph, kernels, losses
from tinygrad_like.graph.plan import Buffer, plan


def model_of(family, dtype="fp32", weights=None):
    model = randomized(CFG, seed=0) if family == "gpt2" else randomized_llama(GQA, seed=0)
    if weights is not None:
        quantize_model(model, weights)
    return model.to(dtype=dtype)


def decode(model, steps, kv_dtype=None, compiled=False, prompt_len=5):
    """The last position's logits (B, V) of each of steps greedy tokens after a prompt, from the
    eager decode step or its capture."""
    prompt = np.random.default_rng(1).integers(0, model.config.vocab_size, (2, prompt_len))
    like = model.get_input_embeddings().weight
    cache = KVCache(model.config, 2, prompt_len + steps, like, kv_dtype)
    step = model.decode_step(cache)
    token = step(prompt, np.arange(prompt_len))
    run = graph.compile(step) if compiled else step
    out = []
    for _ in range(steps):
        feed = token[:, -1].argmax(-1)[:, None]
        token = run(feed, np.array([cache.length]))
        out.append(np.array(token[:, -1], np.float32))
    return np.stack(out, 1)


@pytest.mark.parametrize(
    "family, dtype, weights, kv_dtype",
    [
        ("gpt2", "fp32", None, None),
        ("llama", "fp32", None, None),
        ("gpt2", "bf16", None, None),
        ("llama", "fp32", "int8", None),
        ("gpt2", "fp32", "int4", "fp8_e4m3"),
    ],
)
def test_a_replayed_decode_step_is_the_eager_step_bit_for_bit(family, dtype, weights, kv_dtype):
    model = model_of(family, dtype, weights)
    eager = decode(model, 6, kv_dtype)
    replayed = decode(model, 6, kv_dtype, compiled=True)
    assert replayed.tobytes() == eager.tobytes()


def test_generate_with_compile_gives_the_same_tokens():
    model = model_of("gpt2")
    prompt = np.random.default_rng(2).integers(0, CFG.vocab_size, (1, 4))
    eager = model.generate(prompt, 8, temperature=0)
    assert np.array_equal(model.generate(prompt, 8, temperature=0, compile=True), eager)


def test_a_replay_runs_the_kernels_and_host_calls_without_the_op_layer():
    """After two recorded calls, a call launches nothing through kernels.launch (no counting,
    no tape): the kernels run directly, and the cache's length still grows (kernels.on_host)."""
    model = model_of("gpt2")
    cache = KVCache(CFG, 1, 8, model.get_input_embeddings().weight)
    step = graph.compile(model.decode_step(cache))
    for _ in range(2):
        step(np.array([[3]]), np.array([cache.length]))
    with tg.profiler.Profiler() as prof:
        step(np.array([[3]]), np.array([cache.length]))
    assert prof.launches == [] and cache.length == 3
    (capture,) = step.captures.values()
    # GPT-2's decode step: 12 launches a layer and 5 more, its 2 residual adds and its GELU
    # fused away (into the GEMMs that made their operands)
    program = capture.program
    assert program.eager_launches == 12 * CFG.n_layer + 5
    assert program.launches == 9 * CFG.n_layer + 5
    assert program.eager_bytes - program.bytes == sum(f.saved for f in program.fusions) > 0


def _scaled_by_its_calls(x):  # the scale is Python's, from a counter: a replay would keep it
    _scaled_by_its_calls.calls += 1
    return kernels.launch("mul", x, float(_scaled_by_its_calls.calls))


def test_a_value_that_changes_between_calls_is_refused_naming_the_launch():
    _scaled_by_its_calls.calls = 0
    step = graph.compile(_scaled_by_its_calls, fullgraph=True)
    step(np.ones(3, np.float32))
    for _ in range(2):  # and again at the next call
        with pytest.raises(RuntimeError, match=r"step 0 \(mul\) takes a value that changes"):
            step(np.ones(3, np.float32))


def test_a_step_that_cannot_be_replayed_runs_eagerly_and_says_so_once(capsys):
    """As torch.compile without fullgraph: the step's results stay right, each call's own."""
    _scaled_by_its_calls.calls = 0
    step = graph.compile(_scaled_by_its_calls)
    got = [step(np.ones(3, np.float32)) for _ in range(4)]
    for calls, y in enumerate(got, 1):
        np.testing.assert_array_equal(y, np.full(3, calls, np.float32))
    said = capsys.readouterr().err.splitlines()
    assert len(said) == 1 and said[0].startswith("compile: _scaled_by_its_calls runs eagerly: ")
    assert "step 0 (mul) takes a value that changes" in said[0] and step.program is None


def test_the_inputs_reach_the_kernels_by_their_buffers():
    def double(x):
        return kernels.launch("mul", kernels.launch("add", x, x), 0.5)

    step = graph.compile(double)
    for value in (1.0, 2.0, 3.0, 4.0):  # two recorded, two replayed
        got = step(np.full(4, value, np.float32))
        np.testing.assert_array_equal(got, np.full(4, value, np.float32))


def test_a_new_shape_is_captured_again_and_said_once(capsys):
    def neg(x):
        return kernels.launch("neg", x)

    step = graph.compile(neg)
    for n in (2, 3, 4, 4, 4):
        np.testing.assert_array_equal(step(np.ones(n, np.float32)), -np.ones(n, np.float32))
    err = capsys.readouterr().err
    assert err.count("compile: neg captured again") == 1 and len(step.captures) == 3


def test_a_buffer_the_steps_python_allocates_is_allocated_again_at_each_replay():
    def filled(x):
        out = backend.of(x).empty(x.shape, x.dtype)
        kernels.launch("fill", out, 2.0)
        return kernels.launch("add", out, x)

    step = graph.compile(filled)
    results = [step(np.full(3, v, np.float32)) for v in (1.0, 2.0, 3.0)]
    np.testing.assert_array_equal(results[2], np.full(3, 5.0, np.float32))
    assert results[2] is not results[1]  # a fresh buffer each call, as eagerly


@pytest.mark.parametrize("seed", range(5))
def test_the_plan_never_shares_a_byte_between_two_live_buffers(seed):
    rng = np.random.default_rng(seed)
    buffers = []
    for _ in range(40):
        birth = int(rng.integers(0, 30))
        buffers.append(Buffer(int(rng.integers(1, 5000)), birth, birth + int(rng.integers(0, 8))))
    buffers.sort(key=lambda b: b.birth)
    p = plan(buffers)
    for i, a in enumerate(buffers):
        for j, b in enumerate(buffers[:i]):
            if a.birth <= b.death and b.birth <= a.death:  # alive together
                lo = max(p.offsets[i], p.offsets[j])
                assert lo >= min(p.offsets[i] + a.nbytes, p.offsets[j] + b.nbytes)
    assert p.live_peak <= p.size <= sum(-(-b.nbytes // 64) * 64 for b in buffers)


# ---------------------------------------------------------------- the training step


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("micro_batches", [1, 2])
def test_a_replayed_training_step_is_the_eager_step_bit_for_bit(dtype, micro_batches):
    """Five steps at a changing learning rate, the fp16 loss scaler's scale read at each: the
    same losses, norms and weights, replayed from the third step on."""
    replayed_equals_eager(lambda: randomized(CFG, seed=0), dtype, micro_batches)


def test_a_replayed_step_with_the_fused_head_in_blocks_is_the_eager_step(monkeypatch):
    """The fused LM head over four blocks of rows: each block's dW added into the first's,
    which fuse.py folds into the next block's GEMM, then scaled into the gradient once all are
    in (folding the scale into the first block's GEMM would drop the others')."""
    monkeypatch.setattr(losses, "HEAD_BLOCK_ROWS", 4)  # 2 x 8 rows a micro-batch: four blocks

    def fused_head():
        model = GPT2(CFG, options=ExecutionOptions(lm_head="fused"))
        model.load_state_dict(randomized(CFG, seed=0).state_dict())
        return model

    replayed_equals_eager(fused_head, "fp32", 1)


def replayed_equals_eager(make_model, dtype, micro_batches):
    rng = np.random.default_rng(0)
    batches = [
        [
            (ids[:, :-1].copy(), ids[:, 1:].copy())
            for ids in rng.integers(0, 53, (micro_batches, 2, 9))
        ]
        for _ in range(5)
    ]
    runs = []
    for compiled in (False, True):
        model = make_model()
        model.flatten_parameters(dtype)
        optimizer = AdamW(model.named_parameters(), lr=1e-3)
        scaler = LossScaler() if dtype == "fp16" else None
        step = device_step
        if compiled:
            captured = graph.compile(
                lambda xs, ys: device_step(model, optimizer, list(zip(xs, ys)), scaler)
            )
            step = lambda m, o, bs, s, w: captured(*(np.stack(p) for p in zip(*bs)))  # noqa: E731
        results = [
            train_on(model, optimizer, bs, scaler, 1e-3 * (i + 1), step=step)
            for i, bs in enumerate(batches)
        ]
        runs.append((results, [p.data.tobytes() for p in model.parameters()]))
    assert runs[0] == runs[1]  # every loss, norm, skip and weight


# ---------------------------------------------------------------- the accounting


@pytest.mark.parametrize("preset", ["gpt2-tiny", "llama-tiny"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_the_captured_steps_launch_what_the_eager_steps_do_in_an_arena_of_their_live_peak(
    preset, dtype
):
    """Counted on the meta device: a captured step launches the kernels the profiled eager step
    did; its arena is its buffers' live peak (greedy by size places these exactly, to the 64-byte
    rounding) and no more than the tracker's peak above the persistent state."""
    from accounting.measure import measure
    from nn.config import PRESETS

    m = measure(PRESETS[preset], dtype, "meta", batch_size=2, seq_len=16)
    train, decode = m.captured_step, m.captured_decode
    assert train.eager_launches == len(m.step.launches)
    assert decode.eager_launches == len(m.decode.launches)
    # every layer's two residual adds and its activation (GPT-2's GELU, Llama's SwiGLU) fused
    # into their GEMMs, forward; more in the backward
    L = m.config.n_layer
    assert decode.eager_launches - decode.launches == 3 * L
    assert train.eager_launches - train.launches > 4 * L
    assert train.eager_bytes - train.replay_bytes == train.fused_saved  # predicted = counted
    assert train.live_bytes <= train.arena_bytes <= m.peak_bytes - sum(m.persistent.values())
    assert train.arena_bytes - train.live_bytes < 64 * train.launches
    assert train.host_calls == 2  # AdamW's constants of the step, its read of the norm


def test_the_report_prints_the_captured_steps_with_their_host_time():
    from accounting.measure import measure
    from accounting.report import format_report
    from nn.config import PRESETS

    m = measure(PRESETS["gpt2-tiny"], "fp32", "cpu", batch_size=2, seq_len=16)
    for c in (m.captured_step, m.captured_decode):
        assert 0 < c.replay_kernel_seconds and 0 < c.replay_seconds  # no timing asserted
        assert 0 < c.eager_kernel_seconds and 0 < c.eager_seconds
    section = format_report(m).split("-- captured steps")[1].split("\n\n")[0]
    train = m.captured_step
    assert "replayed ms" in section and f"{train.eager_launches:,} -> {train.launches:,}" in section
    assert f"predicted {train.fused_saved:,} bytes fewer" in " ".join(section.split())


# ---------------------------------------------------------------- fusion


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_fusion_removes_the_adds_and_the_bytes_it_predicts_with_the_same_bits(family, dtype):
    """A training step captured with and without fusion (graph/fuse.py): the same losses, norms
    and weights; the fused one launches fewer kernels, each fused add's (cast's, GELU's)
    intermediate C neither written nor read back: the launch point's bytes fall by 2 |C| a
    fusion (|C| for a GELU whose C the backward reads), as predicted."""
    rng = np.random.default_rng(1)
    batches = [(ids[:, :-1].copy(), ids[:, 1:].copy()) for ids in rng.integers(0, 53, (4, 2, 9))]
    runs, programs = [], []
    for fuse in (False, True):
        model = model_of(family)
        model.flatten_parameters(dtype)
        optimizer = AdamW(model.named_parameters(), lr=1e-3)
        captured = graph.compile(
            lambda x, y: device_step(model, optimizer, [(x, y)], None), fuse=fuse
        )
        step = lambda m, o, bs, s, w: captured(*bs[0])  # noqa: E731
        losses = [train_on(model, optimizer, [b], None, 1e-3, step=step) for b in batches]
        runs.append((losses, [p.data.tobytes() for p in model.parameters()]))
        programs.append(captured.program)
    assert runs[0] == runs[1]
    plain, fused = programs
    assert plain.fusions == [] and plain.launches == plain.eager_launches == fused.eager_launches
    assert {f.kernel for f in fused.fusions} >= {"matmul", "matmul_tn"}
    assert fused.launches == plain.launches - len(fused.fusions)
    assert plain.bytes - fused.bytes == sum(f.saved for f in fused.fusions) > 0
    census = fused.fused_census()  # the report's table: per kind of fused launch
    assert sum(n for _, n, _, _ in census) == sum(
        bool(s.folded) for s in fused.steps if s[0] == "launch"
    )
    assert sum(saved for *_, saved in census) == plain.bytes - fused.bytes
    assert {name for name, *_ in census} >= {"matmul+add", "matmul_tn+add"}
    folded = {f.folded for f in fused.fusions}  # the activation both ways, GPT-2's biases' sums
    assert folded >= (
        {"gelu_fwd", "gelu_bwd"} if family == "gpt2" else {"swiglu_fwd", "swiglu_bwd"}
    )
    assert ("sum" in {f.kernel for f in fused.fusions}) == (family == "gpt2")
    assert "cast" not in folded  # a bf16 head's dW shares are cast and summed by their GEMMs
    assert fused.plan.live_peak <= plain.plan.live_peak


def test_an_add_whose_operand_is_read_again_is_not_fused():
    """C = a @ b read by the add and by a later kernel: the add stays (C must exist)."""
    a, b, w = (np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32) for _ in "abw")

    def reuse(x):
        c = kernels.launch("matmul", x, b)
        return kernels.launch("add", w, c), kernels.launch("neg", c)

    step = graph.compile(reuse)
    for _ in range(3):
        out = step(a)
    assert step.program.fusions == [] and step.program.launches == 3
    assert np.array_equal(out[0], w + a @ b)


def test_an_in_place_accumulation_folds_into_the_gemm_and_keeps_its_order():
    """g += x^T dy (a gradient accumulated in place) becomes matmul_tn(x, dy, add=g, out=g);
    a kernel that reads g between the GEMM and the add keeps the add where it was."""
    rng = np.random.default_rng(0)
    x, dy = (rng.standard_normal((6, 4)).astype(np.float32) for _ in "xd")
    g, seen = np.ones((4, 4), np.float32), np.zeros((4, 4), np.float32)

    def accumulate(x, dy):
        c = kernels.launch("matmul_tn", x, dy)
        kernels.launch("add", g, c, out=g)

    def read_between(x, dy):
        c = kernels.launch("matmul_tn", x, dy)
        kernels.launch("copy", seen, g)  # reads g before the add writes it
        kernels.launch("add", g, c, out=g)

    for fn, fused in ((accumulate, 1), (read_between, 0)):
        g[...] = 1
        step = graph.compile(fn)
        for _ in range(4):
            step(x, dy)
        assert len(step.program.fusions) == fused
        expected = np.ones((4, 4), np.float32)
        for _ in range(4):
            expected = expected + x.T @ dy
        np.testing.assert_allclose(g, expected, rtol=1e-6)
        if not fused:
            np.testing.assert_allclose(seen, expected - x.T @ dy, rtol=1e-6)


# ---------------------------------------------------------------- on the CUDA backend


@pytest.fixture
def cuda(monkeypatch):
    """The CUDA backend: a GPU's, or where there is none the CuPy stand-in with every .cu kernel
    run on the CPU (tests/cuda_on_cpu), as the kernel tests run them."""
    if backend.cuda_available():
        yield backend.get("cuda")
        return
    import cuda_on_cpu
    import fake_cupy

    if not cuda_on_cpu.available():
        pytest.skip("no CUDA device and no C++ compiler")
    with fake_cupy.installed(execute=True) as module:
        cuda_on_cpu.build(
            [
                (s, tuple(module.instances(s)))
                for s in map(module.kernel_source, module.kernel_files())
            ]
        )
        backend.default_device()  # cached from the real environment first, never as cuda
        monkeypatch.setattr(backend, "cuda_available", lambda: True)
        yield module


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_a_fused_training_step_on_cuda_is_the_eager_step_bit_for_bit(cuda, family, dtype):
    """On the CUDA backend (the .cu kernels, here executed on the CPU): the captured step with
    its adds and scalings folded into gemm.cu's and rownorm.cu's epilogues, replayed as one
    CUDA graph (two recordings, the capture, two more graph launches), gives the eager step's
    losses, norms and weights."""
    rng = np.random.default_rng(2)
    batches = [
        tuple(cuda.asarray(a) for a in (ids[:, :-1].copy(), ids[:, 1:].copy()))
        for ids in rng.integers(0, 53, (5, 2, 9))
    ]
    runs = []
    for compiled in (False, True):
        model = model_of(family)
        model.to(device="cuda")
        model.flatten_parameters(dtype)
        optimizer = AdamW(model.named_parameters(), lr=1e-3)
        step = device_step
        if compiled:
            captured = graph.compile(lambda x, y: device_step(model, optimizer, [(x, y)], None))
            step = lambda m, o, bs, s, w: captured(*bs[0])  # noqa: E731
        losses = [train_on(model, optimizer, [b], None, 1e-3, step=step) for b in batches]
        runs.append((losses, [cuda.to_numpy(p.data).tobytes() for p in model.parameters()]))
    assert runs[0] == runs[1]
    assert {f.kernel for f in captured.program.fusions} >= {"matmul", "matmul_tn"}
    assert captured.program.graph.graphs == 1


@pytest.mark.parametrize(
    "family, weights, kv_dtype",
    [("gpt2", None, None), ("llama", None, None), ("gpt2", "int8", "fp8_e4m3")],
)
def test_a_decode_step_on_cuda_replays_as_one_cuda_graph_with_the_eager_bits(
    cuda, family, weights, kv_dtype
):
    """The decode step on the CUDA backend, captured (its residual adds folded into gemm.cu's
    epilogue) and replayed as one CUDA graph: the attention reads the cache's length from the
    positions on the device, the token ids are not read by the host in the capture, so every
    kernel of a token is the graph's (none launched from Python after the capture) and the
    logits are the eager step's, bit for bit, at positions that move. Without a GPU the graph is
    the stand-in's (tests/fake_cupy.py): nothing launched inside the capture runs, a host read
    there fails, each node runs again at each launch on what the capture froze."""
    logits = []
    for compiled in (False, True):
        model = model_of(family, weights=weights)
        model.to(device="cuda")
        cache = KVCache(model.config, 1, 10, model.get_input_embeddings().weight, kv_dtype)
        step = model.decode_step(cache)
        token = step(cuda.asarray(np.array([[1, 2, 3]])), cuda.asarray(np.arange(3)))
        run = graph.compile(step) if compiled else step
        for i in range(6):
            feed = cuda.asarray(cuda.to_numpy(token[:, -1]).argmax(-1)[:, None])
            launched = len(getattr(cuda.xp, "LAUNCHES", ()))  # the stand-in's record
            token = run(feed, cuda.asarray(np.array([cache.length])))
            if compiled and i >= 3:  # two recordings, then the capture, then graph launches
                assert len(getattr(cuda.xp, "LAUNCHES", ())) == launched
            logits.append(cuda.to_numpy(token).tobytes())
    assert logits[:6] == logits[6:]
    assert run.program.graph is not None
    assert run.program.launches < run.program.eager_launches


def test_the_accounting_on_cuda_counts_one_graph_a_step(cuda):
    """accounting/captured.py (scripts/bench_graph.py --device cuda): the replayed decode and
    training steps' graph launches, one a step."""
    model = model_of("gpt2")
    model.to(device="cuda")
    ids = np.random.default_rng(0).integers(0, 53, (2, 9))
    found = captured.decode(model, ids[:1, :6], repeats=1)
    assert found.graphs == 1 and found.launches < found.eager_launches
    model.flatten_parameters("fp32")
    optimizer = AdamW(model.named_parameters(), lr=1e-3)
    found = captured.training(model, optimizer, (ids[:, :-1], ids[:, 1:]), None, repeats=1)
    assert found.graphs == 1 and found.launches < found.eager_launches
    assert found.graph_bytes >= found.live_bytes  # the graph's pool holds the step's buffers


def test_a_launch_that_takes_a_host_value_runs_from_python_between_two_graphs(cuda, capsys):
    """A step whose middle launch takes a host call's result (a graph would freeze it): two
    graphs around that launch, which runs from Python and whose output is copied into the
    buffer the second graph was captured on; every call equals the same math done eagerly."""
    calls = [0]

    def factor():
        calls[0] += 1
        return 1.0 + calls[0] / 8  # a new value at every call

    def fn(x):
        y = kernels.launch("mul", x, 2.0)
        z = kernels.launch("mul", y, kernels.on_host(factor))
        return kernels.launch("add", z, y)

    step = graph.compile(fn)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    for _ in range(5):
        got = cuda.to_numpy(step(cuda.asarray(x)))
        np.testing.assert_array_equal(got, 2 * x * np.float32(1.0 + calls[0] / 8) + 2 * x)
    assert step.program.graph.graphs == 2
    assert "launching mul from Python between them" in capsys.readouterr().err


def test_a_full_kv_cache_refuses_another_position():
    """KVCache.advance, a host call of every decode step, is where a CUDA graph's positions are
    checked (its attention reads them on the device only)."""
    model = model_of("gpt2")
    cache = KVCache(model.config, 1, 4, model.get_input_embeddings().weight)
    cache.advance(3)
    cache.advance(1)
    with pytest.raises(ValueError, match="the KV cache holds 4 positions: 4 stored and 1 more"):
        cache.advance(1)
    assert cache.length == 4


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_a_training_step_on_cuda_is_one_graph(cuda, dtype, capsys):
    """AdamW's constants of the step written to the device by a host call before the step's
    launches, the mean's 1 / count counted on the device, the fp16 loss scale a device value:
    nothing a kernel takes is a host value, so the whole step, AdamW and the overflow skip
    included, is one CUDA graph, its host calls before and after it. On the stand-in a replay
    launches no kernel from Python; the steps' losses and weights are the eager step's."""
    runs = []
    for compiled in (False, True):
        model = model_of("gpt2")
        model.to(device="cuda")
        model.flatten_parameters(dtype)
        optimizer = AdamW(model.named_parameters(), lr=1e-3)
        scaler = LossScaler(init_scale=2.0**10) if dtype == "fp16" else None
        step = graph.compile(lambda x, y: device_step(model, optimizer, [(x, y)], scaler))
        rng = np.random.default_rng(0)
        losses = []
        for i in range(5):  # two recordings, the capture, two graph launches
            ids = cuda.asarray(rng.integers(0, 53, (2, 9)))
            x, y = ids[:, :-1].copy(), ids[:, 1:].copy()
            launched = len(getattr(cuda.xp, "LAUNCHES", ()))
            losses.append(
                step(x, y) if compiled else device_step(model, optimizer, [(x, y)], scaler)
            )
            if compiled and i >= 3:
                assert len(getattr(cuda.xp, "LAUNCHES", ())) == launched
        weights = [cuda.to_numpy(p.data).tobytes() for p in model.parameters()]
        runs.append((repr(losses), weights))
    assert runs[0] == runs[1]
    assert step.program.graph.graphs == 1
    assert "from Python" not in capsys.readouterr().err
