"""Quantized checkpoints (scripts/quantize.py, nn/quant_checkpoint.py): the codes and scales
come back bit for bit for every format and both families, in the layout documented; a model
loaded from one decodes the greedy tokens of the fp32 model quantized on load; bad input is
one line; and loading never makes an fp32 copy of the quantized weights."""

import errno
import gc
import json
import os
import shutil
import tracemalloc

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file
from test_decode import generate_py
from test_faults import one_line_error, read_only, run_main, script_main  # noqa: F401 (fixture)
from test_generate import CFG, randomized
from test_llama import GQA
from test_llama import randomized as randomized_llama

from nn import GPT2Config, build, from_pretrained, hf, quant_checkpoint
from nn.quant import quantize_model
from nn.quant_checkpoint import save_quantized
from tinygrad_like import files, formats, quant
from tinygrad_like.memory import TRACKER
from training import checkpoint

MAKE = {"gpt2": lambda: randomized(CFG, seed=0), "llama": lambda: randomized_llama(GQA)}
# Llama's down_proj rows are 48 wide: a 4-bit format's default group of 32 does not divide them
GROUP = {"gpt2": None, "llama": 8}


def group_for(fmt, family):
    return GROUP[family] if formats.FORMATS[fmt].bits == 4 else None


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """family -> an fp32 save_pretrained folder of a randomized tiny model."""
    out = {}
    for family, make in MAKE.items():
        out[family] = str(tmp_path_factory.mktemp(family))
        make().save_pretrained(out[family])
    return out


def quantize_py(argv, capsys):
    """-> (exit code, stdout, stderr) of scripts/quantize.py."""
    code = 0
    try:
        script_main("scripts/quantize.py")(argv)
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def quantized_dir(sources, family, fmt, tmp_path, capsys, group=None):
    """scripts/quantize.py's --out for the family's source in fmt."""
    out = str(tmp_path / f"{family}-{fmt}")
    argv = ["--checkpoint", sources[family], "--weights", fmt, "--out", out]
    code, stdout, err = quantize_py(argv + (["--group-size", str(group)] if group else []), capsys)
    assert code == 0, err
    return out, stdout


# ---------------------------------------------------------------- the round trip


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("fmt", list(formats.FORMATS))
def test_codes_and_scales_come_back_bit_for_bit(sources, tmp_path, capsys, family, fmt):
    """Every weight of the loaded model equals the fp32 model quantized on load: codes and
    scales bitwise (dtype, shape, padding rows included), layout fields, the fp32 tensors."""
    group = group_for(fmt, family)
    out, _ = quantized_dir(sources, family, fmt, tmp_path, capsys, group)
    want = quantize_model(from_pretrained(sources[family], device="cpu"), fmt, group)
    got = from_pretrained(out, device="cpu")
    want_params, got_params = dict(want.named_parameters()), dict(got.named_parameters())
    assert want_params.keys() == got_params.keys()
    n_quantized = 0
    for name, w in want_params.items():
        g = got_params[name]
        assert type(g) is type(w), name
        if isinstance(w, quant.QuantizedWeight):
            n_quantized += 1
            fields = ("fmt", "shape", "out_axis", "rows", "group_size")
            assert [getattr(g, f) for f in fields] == [getattr(w, f) for f in fields], name
            assert g.codes.dtype == w.codes.dtype and g.codes.tobytes() == w.codes.tobytes()
            assert (g.scales is None) == (w.scales is None) == (not formats.FORMATS[fmt].scaled)
            if w.scales is not None:
                assert g.scales.dtype == np.float32 and g.scales.tobytes() == w.scales.tobytes()
        else:
            assert g.numpy().tobytes() == w.numpy().tobytes(), name
    assert n_quantized == {"gpt2": 9, "llama": 16}[family]  # GPT-2's head is the tied wte
    if family == "llama":  # an untied head of its own
        assert got.lm_head.weight is not got.model.embed_tokens.weight
    else:
        assert got.transformer.wte.weight is got_params["transformer.wte.weight"]


def test_the_file_holds_the_documented_layout(sources, tmp_path, capsys):
    """int4, group 8: NAME.codes (N, K/2) uint8 and NAME.scales (N, K/8) fp32 per quantized
    weight, one row per output channel (GPT-2's Conv1D (in, out) stored transposed), the
    embedding's vocab_size rows only; everything else fp32 under its fp32 name; config.json the
    source's plus the quantization entry; and what the script printed."""
    out, printed = quantized_dir(sources, "gpt2", "int4", tmp_path, capsys, group=8)
    tensors, fp32 = (
        load_file(os.path.join(out, hf.WEIGHTS)),
        load_file(os.path.join(sources["gpt2"], hf.WEIGHTS)),
    )
    with open(os.path.join(out, hf.CONFIG)) as f:
        config = json.load(f)
    entry = config.pop("quantization")
    with open(os.path.join(sources["gpt2"], hf.CONFIG)) as f:
        assert config == json.load(f)
    assert entry["format"] == "int4" and entry["group_size"] == 8
    assert len(entry["tensors"]) == 9
    for name, array in fp32.items():
        if name in entry["tensors"]:
            K, N = array.shape if name != "transformer.wte.weight" else array.shape[::-1]
            assert tensors[name + ".codes"].dtype == np.uint8
            assert tensors[name + ".codes"].shape == (N, K // 2)
            assert tensors[name + ".scales"].dtype == np.float32
            assert tensors[name + ".scales"].shape == (N, K // 8)
            assert name not in tensors
        else:
            assert tensors[name].dtype == np.float32 and np.array_equal(tensors[name], array)
    assert tensors["transformer.wte.weight.codes"].shape == (CFG.vocab_size, CFG.n_embd // 2)
    assert len(tensors) == 2 * 9 + len(fp32) - 9
    lines = printed.splitlines()
    assert lines[0].startswith(f"wrote {out}: ") and "9 weights in int4 (group size 8)" in lines[0]
    before, after = (os.path.getsize(os.path.join(d, hf.WEIGHTS)) for d in (sources["gpt2"], out))
    assert f"{before / 1e6:,.2f} MB -> {after / 1e6:,.2f} MB" in lines[1]
    assert "bytes per parameter: 4.000 -> " in lines[2]
    assert lines[2].endswith(f"the quantized weights alone: {0.5 + 4 / 8:.3f}")


# ---------------------------------------------------------------- greedy tokens


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("fmt", ["bf16", "fp8_e4m3", "int8", "int4", "fp4_e2m1"])
def test_greedy_tokens_from_the_file_equal_quantizing_on_load(
    sources, tmp_path, capsys, family, fmt
):
    group = group_for(fmt, family)
    out, _ = quantized_dir(sources, family, fmt, tmp_path, capsys, group)
    prompt = np.random.default_rng(3).integers(0, 50, (2, 4))
    on_load = quantize_model(from_pretrained(sources[family], device="cpu"), fmt, group)
    want = on_load.generate(prompt, 12, temperature=0)
    got = from_pretrained(out, device="cpu").generate(prompt, 12, temperature=0)
    np.testing.assert_array_equal(got, want)
    assert len(set(want[:, 4:].ravel().tolist())) > 1  # not one token over and over


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_generate_py_prints_the_same_text_from_the_file(sources, tmp_path, capsys, family):
    """generate.py --weights int4 on the fp32 checkpoint, and on scripts/quantize.py's int4
    output with and without --weights int4: one text, the same --stats format line."""
    group = group_for("int4", family)
    out, _ = quantized_dir(sources, family, "int4", tmp_path, capsys, group)
    argv = ["--prompt", "!#", "--max-new-tokens", "8", "--temperature", "0", "--stats"]
    grouping = ["--group-size", str(group)] if group else []
    texts = []
    for extra in (
        ["--checkpoint", sources[family], "--weights", "int4", *grouping],
        ["--checkpoint", out],
        ["--checkpoint", out, "--weights", "int4", *grouping],
    ):
        code, stdout, err = generate_py(argv + extra, capsys)
        assert code == 0, err
        texts.append(stdout[: stdout.index("\n--- prompt:")])  # the prompt and what follows
        bytes_per_weight = 0.5 + 4 / (group or 32)
        assert f"weights int4, KV cache fp32, B = 1; {bytes_per_weight:g} bytes per weight" in (
            stdout
        )
    assert texts[0] == texts[1] == texts[2] and texts[0].startswith("---\n!#")


# ---------------------------------------------------------------- bad input


def test_quantize_py_refuses_in_one_line(sources, tmp_path, capsys):
    int8, _ = quantized_dir(sources, "gpt2", "int8", tmp_path, capsys)
    src, out = sources["gpt2"], str(tmp_path / "out")
    cases = [
        (["--checkpoint", str(tmp_path / "nope"), "--weights", "int8"], "is not a checkpoint"),
        (["--checkpoint", src, "--weights", "int3"], "unknown weight format 'int3'"),
        (["--checkpoint", src, "--weights", "fp32"], "name a format to quantize to"),
        (["--checkpoint", src, "--weights", "int4", "--group-size", "3"], "positive and even"),
        (["--checkpoint", src, "--weights", "bf16", "--group-size", "8"], "bf16 has no scales"),
        (["--checkpoint", src, "--weights", "int4", "--group-size", "48"], "divide the rows' 32"),
        (["--checkpoint", int8, "--weights", "int4"], "is quantized already (int8)"),
    ]
    for argv, words in cases:
        code, stdout, err = quantize_py(argv + ["--out", out], capsys)
        assert code == 2 and stdout == "", argv
        assert err.startswith("error: ") and words in err and len(err.strip().splitlines()) == 1
    assert not os.path.exists(out)  # nothing written by a refused command
    code, _, err = quantize_py(["--checkpoint", src, "--weights", "int8", "--out", src], capsys)
    assert code == 2 and "holds the checkpoint being quantized" in err
    assert hf.read_quantization(src) is None  # the source is untouched


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--weights", "int4"], "a quantized checkpoint of int8 weights; leave --weights out"),
        (["--weights", "bf16"], "a quantized checkpoint of int8 weights"),
        (["--group-size", "8"], "int8 weights with one scale per output channel"),
        (["--dtype", "bf16"], "int8 weights with --dtype bf16"),
    ],
)
def test_generate_py_refuses_another_format_in_one_line(sources, tmp_path, capsys, argv, words):
    out, _ = quantized_dir(sources, "gpt2", "int8", tmp_path, capsys)
    code, stdout, err = generate_py(["--checkpoint", out, "--max-new-tokens", "2", *argv], capsys)
    assert code == 2 and stdout == ""
    assert err.startswith("error: ") and words in err and len(err.strip().splitlines()) == 1


def tamper(out, tensors=None, config=None, metadata=None):
    """Rewrite a quantized folder's model.safetensors (tensors, with metadata: by default the
    format config.json names) and config.json, then its SHA256SUMS, as someone who edits the
    files and recomputes the sums would: what only the load's own checks can catch."""
    config_path = os.path.join(out, hf.CONFIG)
    if config is not None:
        with open(config_path, "w") as f:
            json.dump(config, f)
    if tensors is not None:
        with open(config_path) as f:
            fmt = json.load(f)["quantization"]["format"]
        save_file(tensors, os.path.join(out, hf.WEIGHTS), metadata or {"quantization": fmt})
    files.write_sums(out, [hf.CONFIG, hf.WEIGHTS])


def test_a_damaged_quantized_checkpoint_is_refused(sources, tmp_path, capsys):
    """Codes of the wrong dtype, a missing scale, an unknown format in config.json (each with
    the sums recomputed), and the fp32 readers (training's --init-from) that must not take
    codes for weights."""
    out, _ = quantized_dir(sources, "gpt2", "int8", tmp_path, capsys)
    tensors = load_file(os.path.join(out, hf.WEIGHTS))
    name = "transformer.h.0.mlp.c_fc.weight"
    with pytest.raises(ValueError, match="holds int8 weights"):
        hf.read_state(out)
    with pytest.raises(ValueError, match="load it with dtype fp32"):
        from_pretrained(out, dtype="bf16", device="cpu")
    tamper(out, dict(tensors, **{name + ".codes": tensors[name + ".codes"].view(np.int8)}))
    with pytest.raises(ValueError, match=f"{name}.codes: int8 .* expected uint8"):
        from_pretrained(out, device="cpu")
    tamper(out, {k: v for k, v in tensors.items() if k != name + ".scales"})
    with pytest.raises(ValueError, match=f"missing tensors: {name}.scales"):
        from_pretrained(out, device="cpu")
    with open(os.path.join(out, hf.CONFIG)) as f:
        config = json.load(f)
    config["quantization"]["format"] = "int3"
    tamper(out, tensors, config, metadata={"quantization": "int8"})
    with pytest.raises(ValueError, match="unknown weight format 'int3'"):
        from_pretrained(out, device="cpu")
    code, _, err = generate_py(["--checkpoint", out, "--max-new-tokens", "2"], capsys)
    assert code == 2 and err.startswith("error: ") and "int3" in err


# ---------------------------------------------------------------- memory


WIDE = GPT2Config(n_layer=2, n_head=4, n_embd=256, n_positions=32, vocab_size=300)


@pytest.mark.parametrize("fmt", ["bf16", "int8", "int4"])
def test_loading_makes_no_fp32_copy_of_the_quantized_weights(tmp_path, fmt):
    """The host memory allocated while a quantized checkpoint loads (tracemalloc sees every
    NumPy buffer) stays near the stored codes and scales, far below the quantized weights'
    fp32 bytes; loading the fp32 checkpoint itself allocates more than those bytes (the
    measurement sees them). The memory tracker's weights are the stored bytes too."""
    src, out = tmp_path / "fp32", tmp_path / fmt
    model = build(WIDE, device="cpu")
    model.save_pretrained(src)
    save_quantized(out, quantize_model(model, fmt), src)
    fp32_bytes = sum(  # the quantized weights' fp32 bytes, padding rows included
        4 * p.numel() for p in model.parameters() if isinstance(p, quant.QuantizedWeight)
    )
    del model
    gc.collect()
    tracked = TRACKER.current["weights"]
    tracemalloc.start()
    try:
        loaded = from_pretrained(out, device="cpu")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    gc.collect()
    stored = sum(p.nbytes for p in loaded.parameters())
    assert TRACKER.current["weights"] - tracked == stored
    share = formats.bytes_per_parameter(fmt) / 4  # of the fp32 bytes: 0.5, 0.28, 0.16
    assert peak < (share + 0.15) * fp32_bytes, (peak, fp32_bytes)
    del loaded
    gc.collect()
    tracemalloc.start()
    try:
        from_pretrained(src, device="cpu")
        fp32_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert fp32_peak > fp32_bytes


# ---------------------------------------------------------------- --out, as training checkpoints


def snapshot(folder):
    """{path relative to folder: bytes} of every file under folder."""
    return {
        os.path.relpath(os.path.join(d, f), folder): open(os.path.join(d, f), "rb").read()
        for d, _, names in os.walk(folder)
        for f in names
    }


def refused(argv, capsys, *words):
    """scripts/quantize.py's one-line refusal of argv, holding words."""
    code, stdout, err = quantize_py(argv, capsys)
    assert code == 2 and stdout == "" and one_line_error(err), err
    assert all(w in err for w in words), err
    return err


QUANTIZED = sorted([files.SUMS, hf.CONFIG, hf.WEIGHTS])


def test_out_holding_a_run_a_checkpoint_or_a_model_needs_overwrite(sources, tmp_path, capsys):
    """Each refused without --overwrite, its files untouched; with it, replaced whole by the
    new checkpoint, nothing left beside it (no .new, no .old)."""
    run, model = tmp_path / "run", tmp_path / "model"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    build(CFG).save_pretrained(model)
    done, _ = quantized_dir(sources, "gpt2", "int8", tmp_path, capsys)
    argv = ["--checkpoint", sources["gpt2"], "--weights", "int4", "--out"]
    cases = {
        str(run): "a run's metrics.jsonl (1 rows, no checkpoint)",
        str(model): "a checkpoint (config.json, model.safetensors)",
        done: f"a checkpoint ({', '.join(QUANTIZED)})",
    }
    for out, held in cases.items():
        before = snapshot(out)
        refused(argv + [out], capsys, f"--out {out} already holds {held}", "--overwrite")
        assert snapshot(out) == before
    for out in cases:
        code, _, err = quantize_py(argv + [out, "--overwrite"], capsys)
        assert code == 0, err
        assert sorted(os.listdir(out)) == QUANTIZED
        assert hf.read_quantization(out)["format"] == "int4"
    assert sorted(os.listdir(tmp_path)) == ["gpt2-int8", "model", "run"]


def test_out_whose_files_would_be_lost_is_always_refused(sources, tmp_path, capsys):
    """A folder holding other files (replacing it would delete them), and one holding the
    checkpoint being quantized: refused even with --overwrite."""
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("keep me")
    argv = ["--checkpoint", sources["gpt2"], "--weights", "int8", "--overwrite", "--out"]
    refused(argv + [str(notes)], capsys, "holds files that are not a model's (todo.txt)")
    assert snapshot(notes) == {"todo.txt": b"keep me"}
    run = tmp_path / "run"
    shutil.copytree(sources["gpt2"], run / "checkpoint")
    before = snapshot(run)
    for out in (run, run / "checkpoint"):
        argv = ["--checkpoint", str(run), "--weights", "int8", "--overwrite", "--out", str(out)]
        refused(argv, capsys, "holds the checkpoint being quantized")
    assert snapshot(run) == before


def test_a_run_in_use_is_never_replaced(sources, tmp_path, capsys):
    run = tmp_path / "run"
    lock = checkpoint.lock_run_folder(str(run))
    try:
        argv = ["--checkpoint", sources["gpt2"], "--weights", "int8", "--out", str(run)]
        refused(argv, capsys, "already holds a run's .lock")
        refused(argv + ["--overwrite"], capsys, "is in use by another run")
    finally:
        lock.close()
    assert os.listdir(run) == [".lock"]


def test_a_full_disk_is_one_line_and_leaves_out_as_it_was(sources, tmp_path, capsys, monkeypatch):
    """The weights' write fails (ENOSPC): an existing --out keeps its bytes, a new one (two
    folders deep) leaves no folder behind, and no staging folder is left."""
    out, _ = quantized_dir(sources, "gpt2", "int8", tmp_path, capsys)
    before = snapshot(out)
    real = quant_checkpoint.atomic_write

    def full(path, data):
        if path.endswith(hf.WEIGHTS):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(path, data)

    monkeypatch.setattr(quant_checkpoint, "atomic_write", full)
    argv = ["--checkpoint", sources["gpt2"], "--weights", "int4", "--overwrite", "--out"]
    for target in (out, str(tmp_path / "a" / "b" / "int4")):
        refused(argv + [target], capsys, "error: disk full: the int4 checkpoint needs about")
    assert snapshot(out) == before
    assert sorted(os.listdir(tmp_path)) == ["gpt2-int8"]


def test_an_unwritable_folder_is_one_line(sources, read_only, capsys):  # noqa: F811
    argv = ["--checkpoint", sources["gpt2"], "--weights", "int8", "--out", str(read_only / "q")]
    refused(argv, capsys, "could not write the int8 checkpoint in", "is as it was")
    assert os.listdir(read_only) == []


class Killed(BaseException):
    """A kill -9 at that instant, as far as the files are concerned."""


def test_a_swap_killed_between_its_renames_keeps_the_old_folder(
    sources, tmp_path, capsys, monkeypatch
):
    """Killed after OUT -> OUT.old: OUT.old still loads (find_checkpoint falls back to it), is
    still a checkpoint that --overwrite must be asked to replace, and the next swap ends it."""
    out, _ = quantized_dir(sources, "gpt2", "int8", tmp_path, capsys)
    real = os.rename

    def rename(src, dst):
        real(src, dst)
        if dst == out + ".old":
            raise Killed

    monkeypatch.setattr(os, "rename", rename)
    argv = ["--checkpoint", sources["gpt2"], "--weights", "int4", "--out", out]
    with pytest.raises(Killed):
        quantize_py(argv + ["--overwrite"], capsys)
    monkeypatch.undo()
    assert not os.path.exists(out) and os.path.isdir(out + ".new")
    assert checkpoint.find_checkpoint(out) == out + ".old"
    assert hf.read_quantization(out + ".old")["format"] == "int8"
    refused(argv, capsys, "already holds a checkpoint")
    code, _, err = quantize_py(argv + ["--overwrite"], capsys)
    assert code == 0, err
    assert hf.read_quantization(out)["format"] == "int4"
    assert sorted(os.listdir(tmp_path)) == ["gpt2-int8"]


# ---------------------------------------------------------------- what a load checks


def with_tensor(name, change):
    """A tamper() case: model.safetensors with one tensor changed in place by change(array)."""

    def edit(out):
        tensors = load_file(os.path.join(out, hf.WEIGHTS))
        change(tensors[name])
        tamper(out, tensors)

    return edit


def with_format(fmt):
    def edit(out):
        with open(os.path.join(out, hf.CONFIG)) as f:
            config = json.load(f)
        config["quantization"]["format"] = fmt
        tamper(out, config=config)

    return edit


def flip_a_byte(out):
    path = os.path.join(out, hf.WEIGHTS)
    data = bytearray(open(path, "rb").read())
    data[-7] ^= 0x10
    open(path, "wb").write(bytes(data))


def sums_naming(name):
    def edit(out):
        with open(os.path.join(out, files.SUMS), "a") as f:
            f.write(f"{'0' * 64}  {name}\n")

    return edit


FC = "transformer.h.0.mlp.c_fc.weight"


@pytest.mark.parametrize(
    "fmt, edit, words",
    [
        ("int8", with_format("fp8_e4m3"), "records int8 weights, but config.json says fp8_e4m3"),
        ("bf16", with_format("fp16"), "records bf16 weights, but config.json says fp16"),
        ("int4", with_format("fp4_e2m1"), "records int4 weights, but config.json says fp4"),
        ("int8", with_tensor(FC + ".scales", lambda a: a.__setitem__((0, 0), -1e30)), "scale"),
        ("int8", with_tensor(FC + ".scales", lambda a: a.__setitem__((1, 0), np.nan)), "scale"),
        ("int8", with_tensor(FC + ".scales", lambda a: a.__setitem__((1, 0), 0)), "> 0"),
        ("bf16", with_tensor(FC + ".codes", lambda a: a.__setitem__((0, 0), 0x7FC0)), "inf or nan"),
        ("fp8_e4m3", with_tensor(FC + ".codes", lambda a: a.__setitem__((0, 0), 0x7F)), "nan"),
        ("int8", with_tensor("transformer.ln_f.weight", lambda a: a.fill(np.inf)), "nan or inf"),
        ("int8", flip_a_byte, "model.safetensors: its sha256 does not match"),
        ("int8", lambda out: os.remove(os.path.join(out, files.SUMS)), "but no SHA256SUMS"),
        ("int8", sums_naming("../../etc/passwd"), "'../../etc/passwd', not a file of this"),
    ],
)
def test_a_tampered_folder_is_refused_in_one_line(sources, tmp_path, capsys, fmt, edit, words):
    """What each edit breaks, the load's checks catch, even where the sums were recomputed:
    generate.py answers one line and prints nothing else."""
    out, _ = quantized_dir(sources, "gpt2", fmt, tmp_path, capsys)
    edit(out)
    code, stdout, err = generate_py(["--checkpoint", out, "--max-new-tokens", "2"], capsys)
    assert code == 2 and stdout == "" and one_line_error(err), err
    assert words in err, err


@pytest.mark.parametrize("program", ["generate.py", "quantize.py", "train_gpt2.py --init-from"])
def test_quantization_null_is_one_line(sources, shakespeare, tmp_path, capsys, program):
    src = tmp_path / "src"
    shutil.copytree(sources["gpt2"], src)
    with open(src / hf.CONFIG) as f:
        config = json.load(f)
    with open(src / hf.CONFIG, "w") as f:
        json.dump({**config, "quantization": None}, f)
    if program == "generate.py":
        code, _, err = generate_py(["--checkpoint", str(src)], capsys)
    elif program == "quantize.py":
        argv = ["--checkpoint", str(src), "--weights", "int8", "--out", str(tmp_path / "q")]
        code, _, err = quantize_py(argv, capsys)
    else:
        argv = ["--init-from", str(src), "--data-dir", shakespeare, "--out", str(tmp_path / "r")]
        code, err = run_main(argv + ["--steps", "1", "--quiet", "--no-report"], capsys)
    assert code == 2 and one_line_error(err), err
    assert "'quantization' is null: remove the entry" in err


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # to fp16
def test_non_finite_weights_are_refused_naming_the_tensor(sources, tmp_path):
    """quantize_model (a nan would become a finite code) leaves the model as it was; a
    quantized model whose fp32 tensor, or whose fp16 code, is not finite is not saved."""
    model = from_pretrained(sources["gpt2"], device="cpu")
    model.transformer.h[1].attn.c_proj.weight.data[2, 3] = np.nan
    with pytest.raises(ValueError, match=r"transformer.h.1.attn.c_proj.weight holds nan or inf"):
        quantize_model(model, "int8")
    assert not any(isinstance(p, quant.QuantizedWeight) for p in model.parameters())
    model = quantize_model(from_pretrained(sources["gpt2"], device="cpu"), "int8")
    model.transformer.ln_f.weight.data[0] = np.inf
    with pytest.raises(ValueError, match="ln_f.weight holds nan or inf: the model cannot be"):
        save_quantized(tmp_path / "a", model, sources["gpt2"])
    model = from_pretrained(sources["gpt2"], device="cpu")
    model.transformer.h[0].mlp.c_fc.weight.data[0, 0] = 1e6  # beyond fp16's 65,504
    with pytest.raises(ValueError, match=f"{FC}.codes holds a code that decodes to inf or nan"):
        save_quantized(tmp_path / "b", quantize_model(model, "fp16"), sources["gpt2"])
    assert os.listdir(tmp_path) == []


def test_tokenizer_files_are_copied_but_links_never_followed(sources, tmp_path, capsys):
    src, secret = tmp_path / "src", tmp_path / "secret"
    shutil.copytree(sources["gpt2"], src)
    (src / "vocab.json").write_text("{}")
    secret.write_text("a key")
    os.symlink(secret, src / "tokenizer.json")
    argv = ["--checkpoint", str(src), "--weights", "int8", "--out", str(tmp_path / "q")]
    code, stdout, err = quantize_py(argv, capsys)
    assert code == 0, err
    assert "not copied (symbolic links or not regular files): tokenizer.json" in stdout
    assert sorted(os.listdir(tmp_path / "q")) == sorted(QUANTIZED + ["vocab.json"])
    assert "  vocab.json\n" in (tmp_path / "q" / files.SUMS).read_text()
    assert from_pretrained(str(tmp_path / "q"), device="cpu")  # the sums hold
