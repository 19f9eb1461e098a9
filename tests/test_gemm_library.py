"""The CPU's BLAS chosen per machine (tinygrad_like/gemm_library.py) and the CBLAS calls behind it
(kernels/gemm/cpu_blas.py): operands read where they lie, the choice named, measured once and
cached, and MKL's GEMMs where the `mkl` extra is installed."""

import json
import os

import numpy as np
import pytest

from nn.config import from_preset
from tinygrad_like import dtypes, gemm_library, kernels
from tinygrad_like.kernels.gemm import cpu_blas

F32 = np.float32


@pytest.fixture
def restore_openblas():
    yield
    cpu_blas.use("openblas")


def _rand(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape, F32)


def _cases():
    """(a, b, out or None) in every layout a GEMM of cpu.py hands its BLAS: plain, transposed
    views, a slice of rows (a leading dimension past the width) and a slice of out's columns."""
    a, b = _rand((40, 70), 1), _rand((70, 30), 2)
    wide = np.zeros((40, 50), F32)
    return [
        (a, b, None),
        (a.T.copy().T, b.T.copy().T, None),  # column-major: CBLAS's transposes
        (a[:, 10:60], b[10:60], None),  # a slice of K: a's rows longer than its width
        (a, b[:, 5:25], wide[:, 20:40]),  # into a slice of out's columns
    ]


def test_cblas_sgemm_reads_each_layout_where_it_lies():
    """OpenBLAS's cblas_sgemm through ctypes gives np.matmul's bits (NumPy calls the same
    library) in every layout, and beta = 1 adds into out."""
    sgemm = cpu_blas.OPENBLAS_SGEMM
    if sgemm is None:
        pytest.skip("NumPy's BLAS is not an OpenBLAS with a cblas_sgemm")
    for a, b, out in _cases():
        assert cpu_blas.in_blas_layout(a) and cpu_blas.in_blas_layout(b)
        out = np.empty((a.shape[0], b.shape[1]), F32) if out is None else out
        np.testing.assert_array_equal(sgemm(a, b, out), np.matmul(a, b))
        before = out.copy()
        sgemm(a, b, out, 1.0)
        np.testing.assert_allclose(out, before + np.matmul(a, b), rtol=1e-5, atol=1e-5)
    assert not cpu_blas.in_blas_layout(_rand((8, 8), 3)[::2, ::2])  # no unit stride


def test_a_named_library_is_used_and_a_bad_name_refused(monkeypatch, restore_openblas):
    monkeypatch.setenv(gemm_library.CHOOSE, "openblas")
    choice = gemm_library.choose(from_preset("gpt2-tiny"), 2, 16)
    assert (choice.library, choice.how, cpu_blas.used()) == ("openblas", "TG_BLAS", "openblas")
    assert gemm_library.chosen() is choice and "OpenBLAS" in choice.describe()
    monkeypatch.setenv(gemm_library.CHOOSE, "blis")
    with pytest.raises(ValueError, match="blis: name one of openblas, openblas-skylakex, mkl"):
        gemm_library.choose(from_preset("gpt2-tiny"), 2, 16)
    monkeypatch.setattr(cpu_blas, "available", lambda: ("openblas",))
    monkeypatch.setenv(gemm_library.CHOOSE, "mkl")
    with pytest.raises(ValueError, match=r"not installed \(pip install -e '.\[mkl\]'\)"):
        gemm_library.choose(from_preset("gpt2-tiny"), 2, 16)


def test_the_faster_library_is_measured_once_and_cached(monkeypatch, tmp_path, restore_openblas):
    """Two libraries: the first choice measures (at the step's GEMMs) and writes the cache; the
    next reads it; a step of other shapes measures again. The libraries here are OpenBLAS under
    two names, the measurement a stand-in that says which is faster."""
    monkeypatch.delenv(gemm_library.CHOOSE, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(cpu_blas, "available", lambda: ("openblas", "mkl"))
    monkeypatch.setattr(cpu_blas, "use", lambda name: None)
    measured = []

    def measure(gemms, libraries, operands, step):
        measured.append(gemms)
        seconds = {"openblas": 1.0, "mkl": 2.0}
        return gemm_library.Choice("openblas", "measured", seconds, len(gemms), "t", operands, step)

    monkeypatch.setattr(gemm_library, "measure", measure)
    config = from_preset("gpt2-tiny")
    first = gemm_library.choose(config, 2, 16)
    again = gemm_library.choose(config, 2, 16)
    assert (first.how, again.how, len(measured)) == ("measured", "cached", 1)
    assert again.seconds == first.seconds and "OpenBLAS 1,000.0 ms, MKL 2,000.0 ms" in (
        again.describe()
    )
    gemm_library.choose(config, 4, 16)
    assert len(measured) == 2  # other shapes: measured for themselves
    bf16 = gemm_library.choose(config, 2, 16, "bf16")
    assert len(measured) == 3 and "15 bf16 GEMM shapes" in bf16.describe()  # other operands
    assert gemm_library.choose(config, 2, 16, "fp16").how == "cached"  # fp16 widens to fp32
    prompt = gemm_library.choose(config, 1, 60, prompt=True)  # generation's prefill: its own
    assert len(measured) == 4 and "this prompt's 5 fp32 GEMM shapes" in prompt.describe()
    assert measured[-1] == gemm_library.prompt_gemms(config, 1, 64)  # 60 rounded up
    assert gemm_library.choose(config, 1, 33, prompt=True).how == "cached"  # 64 too
    (cache,) = tmp_path.glob("tinygrad_like/blas-*.json")
    assert len(json.loads(cache.read_text())) == 4
    cache.write_text('{"x": {"library": "blis"}}')  # unsound: measured again
    gemm_library.choose(config, 2, 16)
    assert len(measured) == 5


@pytest.mark.skipif(not cpu_blas.SKYLAKEX, reason="OpenBLAS loaded its AVX-512 kernels, or none")
def test_openblas_switches_to_its_avx512_kernels_and_back(restore_openblas):
    """openblas-skylakex: NumPy's OpenBLAS on its SkylakeX kernels (a Zen 5 EPYC's OpenBLAS
    loads its AVX2 ones, or an environment names them), fp32's rounding of the loaded set's
    GEMMs; openblas: back to the set it loaded; the environment as it was either way."""
    environment = os.environ.get("OPENBLAS_CORETYPE")
    a, b = _rand((300, 1024), 6), _rand((1024, 200), 7)
    loaded = np.matmul(a, b)
    assert cpu_blas.openblas_cores() == (cpu_blas.LOADED_CORE, "SkylakeX")
    cpu_blas.use("openblas-skylakex")
    assert cpu_blas._CORES[0]() == "SkylakeX" and cpu_blas.used() == "openblas-skylakex"
    np.testing.assert_allclose(kernels.on("cpu").matmul(a, b), loaded, rtol=1e-4, atol=1e-3)
    with cpu_blas.openblas_core(cpu_blas.LOADED_CORE):  # the peaks' matmul, set by set
        np.testing.assert_array_equal(np.matmul(a, b), loaded)
    assert cpu_blas._CORES[0]() == "SkylakeX"
    cpu_blas.use("openblas")
    assert cpu_blas._CORES[0]() == cpu_blas.LOADED_CORE
    np.testing.assert_array_equal(np.matmul(a, b), loaded)
    assert os.environ.get("OPENBLAS_CORETYPE") == environment


def test_the_step_gemms_are_the_models():
    """step_gemms: each linear layer's three GEMMs and the head's, with their FLOPs summing to
    the model's 6N-per-token matmul FLOPs (the embeddings' lookups aside)."""
    config = from_preset("gpt2-tiny")
    B, T = 2, 16
    flops = 0
    for _, kind, a, b, calls in gemm_library.step_gemms(config, B, T):
        M, K = a[::-1] if kind == "tn" else a
        N = b[0] if kind == "nt" else b[1]
        flops += 2 * M * K * N * calls
    C, V, L = config.n_embd, config.padded_vocab_size, config.n_layer
    assert flops == 6 * B * T * (12 * L * C * C + V * C)


def test_the_prompt_gemms_are_the_forward_and_the_last_positions_head():
    """prompt_gemms: each linear layer's X W over the prompt's tokens and the head's logits at
    each prompt's last position: 2N per token of the layers, 2 C Vp per prompt for the head."""
    config = from_preset("gpt2-tiny")
    B, T = 2, 16
    flops = sum(2 * a[0] * a[1] * b[1] * calls for _, kind, a, b, calls in
                gemm_library.prompt_gemms(config, B, T) if kind == "nn")  # fmt: skip
    head = [row for row in gemm_library.prompt_gemms(config, B, T) if row[1] == "nt"]
    C, V, L = config.n_embd, config.padded_vocab_size, config.n_layer
    assert flops == 2 * B * T * 12 * L * C * C
    assert head == [("head logits", "nt", (B, C), (V, C), 1)]


def test_a_near_tie_keeps_openblas():
    """MKL only where it is clearly faster, so that noise does not flip a machine's choice."""
    assert gemm_library.faster({"openblas": 1.0, "mkl": 0.95}) == "openblas"
    assert gemm_library.faster({"openblas": 1.0, "mkl": 0.8}) == "mkl"
    assert gemm_library.faster({"openblas": 0.8, "mkl": 1.0}) == "openblas"


def test_measure_times_each_library_at_the_gemms(restore_openblas):
    gemms = gemm_library.step_gemms(from_preset("gpt2-tiny"), 2, 16)
    choice = gemm_library.measure(gemms, ("openblas",))
    assert (choice.library, choice.gemms, list(choice.seconds)) == ("openblas", 15, ["openblas"])
    assert choice.seconds["openblas"] > 0


@pytest.mark.skipif("mkl" not in cpu_blas.available(), reason="the mkl extra is not installed")
def test_mkl_gemms_are_close_and_reproducible(restore_openblas):
    """With MKL in use, the three GEMMs (and their splits across the cores) within fp32's
    rounding of float64's, and the same bits call after call (its reproducible mode)."""
    cpu = kernels.on("cpu")
    cpu_blas.use("mkl")
    a, b = _rand((300, 1024), 4), _rand((1024, 200), 5)
    for kernel, x, y, want in (
        (cpu.matmul, a, b, a.astype(np.float64) @ b),
        (cpu.matmul_nt, a, b.T.copy(), a.astype(np.float64) @ b),
        (cpu.matmul_tn, a.T.copy(), b, a.astype(np.float64) @ b),
    ):
        got = kernel(x, y)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
        assert kernel(x, y).tobytes() == got.tobytes()
    for a, b, out in _cases():
        got = cpu_blas.matmul(a, b, out=out)
        np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    # bf16 operands: MKL's bf16 GEMM, the products of the bf16 values summed in fp32
    a, b = (_rand(s, i).astype(dtypes.bfloat16) for i, s in ((6, (64, 256)), (7, (256, 48))))
    want = a.astype(np.float64) @ b.astype(np.float64)
    got = cpu.matmul(a, b)
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=2e-2, atol=2e-1)
    assert cpu_blas.bf16_matmul(a, b).tobytes() == cpu_blas.bf16_matmul(a, b).tobytes()
    np.testing.assert_allclose(cpu_blas.bf16_matmul(a, b), want, rtol=1e-4, atol=1e-3)
