"""The training loop end to end on the gpt2-tiny preset and the Shakespeare default: the loss
falls, resume is bit-identical, a save killed mid-way leaves a loadable checkpoint, the
command line turns bad input into one line on stderr, and a non-finite loss stops the run."""

import dataclasses
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file

from nn import GPT2, GPT2Config
from nn.hf import read_state
from optim import AdamW, cosine_with_warmup
from tinygrad_like import backend
from training import checkpoint
from training.cli import main, parser
from training.loop import RunConfig, Trainer

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


pytestmark = pytest.mark.usefixtures("one_blas_thread")


def tiny(data_dir, out, **overrides):
    """A fast run: gpt2-tiny, 2 x 16 tokens a step, no evaluation unless asked."""
    cfg = dict(
        model="gpt2-tiny",
        data_dir=data_dir,
        batch_size=2,
        seq_len=16,
        steps=10,
        lr=5e-3,
        min_lr=5e-4,
        warmup=2,
        eval_every=0,
        eval_iters=2,
        out=str(out),
        quiet=True,
        seed=1337,
    )
    cfg.update(overrides)
    return RunConfig(**cfg)


def read_metrics(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def ckpt_step(path):
    state, _ = checkpoint.load_trainer_state(path)
    return state["step"]


class Killed(BaseException):
    """Stands in for SIGKILL: not an Exception, so nothing in the loop catches it."""


# ----------------------------------------------------------------------------- it learns


def test_short_run_lowers_val_loss(shakespeare, tmp_path):
    steps = 40
    tr = Trainer(
        tiny(
            shakespeare,
            tmp_path,
            batch_size=4,
            seq_len=16,
            steps=steps,
            lr=1e-2,
            min_lr=1e-3,
            warmup=5,
            eval_every=steps,
            eval_iters=4,
        )
    )
    initial = tr.evaluate()
    assert initial == pytest.approx(math.log(50257), abs=0.3)  # untrained: ~uniform
    history = tr.run()
    assert [r["step"] for r in history] == list(range(1, steps + 1))
    final = history[-1]["val_loss"]
    # measured: 10.8 -> ~7.5 in 40 steps; a clear margin, far from noise
    assert final < initial - 1.5, (initial, final)
    assert final == tr.evaluate()  # evaluation uses fixed batches: deterministic
    # the loop follows the schedule, and the metrics file holds the same rows
    for r in history:
        assert r["lr"] == cosine_with_warmup(r["step"] - 1, 1e-2, 1e-3, 5, steps)
        assert math.isfinite(r["loss"]) and r["grad_norm"] > 0
    assert [r["loss"] for r in read_metrics(tmp_path)] == [r["loss"] for r in history]
    ck = checkpoint.find_checkpoint(str(tmp_path))
    assert ckpt_step(ck) == steps


# ----------------------------------------------------------------------------- resume


def test_a_compiled_run_is_the_eager_run_bit_for_bit(shakespeare, tmp_path):
    """--compile: the training step captured on its first two steps and replayed after, grad
    accumulation and evaluation included; every loss, lr and grad norm, and the weights."""
    runs = []
    for compiled in (False, True):
        out = tmp_path / str(compiled)
        Trainer(tiny(shakespeare, out, steps=6, grad_accum=2, eval_every=3, compile=compiled)).run()
        rows = [
            {k: v for k, v in r.items() if k not in ("ms", "tokens_per_s", "mfu")}
            for r in read_metrics(out)
        ]
        runs.append((rows, (out / "checkpoint" / "model.safetensors").read_bytes()))
    assert runs[0] == runs[1]


def test_resume_is_bit_identical(shakespeare, tmp_path, monkeypatch):
    """20 straight steps vs. the same run killed right after its step-10 checkpoint and
    resumed with --resume: every loss, lr and grad norm, and the final weights, identical."""
    straight_dir, split_dir = tmp_path / "straight", tmp_path / "split"
    Trainer(tiny(shakespeare, straight_dir, steps=20)).run()
    straight = read_metrics(straight_dir)

    real_save = Trainer.save

    def save_then_die(self):
        path = real_save(self)
        if self.step == 10:
            raise Killed
        return path

    monkeypatch.setattr(Trainer, "save", save_then_die)
    with pytest.raises(Killed):
        Trainer(tiny(shakespeare, split_dir, steps=20, save_every=10)).run()
    monkeypatch.undo()
    assert ckpt_step(checkpoint.find_checkpoint(str(split_dir))) == 10
    assert len(read_metrics(split_dir)) == 10

    resumed = Trainer(tiny(shakespeare, split_dir, steps=20, resume=str(split_dir)))
    assert resumed.step == 10 and resumed.optimizer.step_count == 10
    history = resumed.run()
    assert [r["step"] for r in history] == list(range(11, 21))
    split = read_metrics(split_dir)
    for key in ("step", "loss", "lr", "grad_norm"):
        assert [r[key] for r in split] == [r[key] for r in straight], key
    for name in ("model.safetensors", "optimizer.safetensors"):
        a = (straight_dir / "checkpoint" / name).read_bytes()
        b = (split_dir / "checkpoint" / name).read_bytes()
        assert a == b, name


# ----------------------------------------------------------------------------- padded vocabulary


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_adamw_keeps_padding_rows_zero_and_checkpoints_hold_v_rows(tmp_path, dtype):
    """wte is stored (Vp, C) = (64, 16) for V = 37. Its padding rows get zero gradients, so
    with weight decay the master, working weights, m and v all stay exactly 0 there, while the
    real rows train. The checkpoint (HF weights, optimizer m and v) holds V rows, and loads back
    into the padded buffers exactly."""
    cfg = GPT2Config(n_layer=1, n_head=2, n_embd=16, n_positions=8, vocab_size=37)
    V, Vp, C = 37, 64, 16
    model = GPT2(cfg).flatten_parameters(dtype)
    opt = AdamW(model.named_parameters(), lr=1e-2, weight_decay=0.1)
    rng = np.random.default_rng(0)
    idx, targets = rng.integers(0, V, (2, 8)), rng.integers(0, V, (2, 8))
    for _ in range(3):
        model(idx, targets)[1].backward()
        opt.step()
        opt.zero_grad()
    lo, hi = opt.spans["transformer.wte.weight"]
    for buf in [opt.master, opt.m, opt.v] + ([opt.working] if opt.working is not None else []):
        rows = buf[lo:hi].reshape(Vp, C).astype(np.float32)
        assert np.all(rows[V:] == 0) and np.all(rows[:V] != 0)
    assert np.all(model.transformer.wte.weight.numpy()[V:] == 0)

    path = checkpoint.save_checkpoint(
        str(tmp_path), model, opt.master_state(), opt.state_dict(), {"step": 3}
    )
    assert read_state(path)["transformer.wte.weight"].shape == (V, C)
    arrays = load_file(os.path.join(path, checkpoint.OPTIMIZER))  # a partial trainer state
    assert (
        arrays["m.transformer.wte.weight"].shape
        == arrays["v.transformer.wte.weight"].shape
        == (V, C)
    )
    loaded = GPT2.from_pretrained(path).flatten_parameters(dtype)
    master = read_state(path)  # the fp32 master, which a 2-byte model no longer holds
    again = AdamW(loaded.named_parameters(), lr=1e-2, weight_decay=0.1, master=master)
    again.load_state_dict(arrays, opt.state_dict()[1])
    for a, b in ((again.master, opt.master), (again.m, opt.m), (again.v, opt.v)):
        np.testing.assert_array_equal(a, b)


# ----------------------------------------------------------------------------- crash safety


def _kill_rename(monkeypatch, out, which):
    """Make the save's `which`-th rename under out (1-based, counted from now) raise Killed."""
    real_rename = os.rename
    count = [0]

    def rename(src, dst):
        if os.path.dirname(os.path.abspath(src)) == os.path.abspath(out):
            count[0] += 1
            if count[0] == which:
                raise Killed
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", rename)


def _run_killed_at_second_save(shakespeare, out, monkeypatch, kill):
    """Steps 1-4 with a save every 2 steps; the step-4 save dies at its rename number `kill`
    (1: checkpoint -> checkpoint.old, 2: checkpoint.new -> checkpoint). Returns the fp32
    master weights the step-2 save wrote."""
    saved = {}
    real_save = checkpoint.save_checkpoint

    def save(out_dir, model, master, optimizer_state, state):
        if state["step"] == 2:
            saved.update(master)
            path = real_save(out_dir, model, master, optimizer_state, state)
            _kill_rename(monkeypatch, out_dir, kill)
            return path
        return real_save(out_dir, model, master, optimizer_state, state)

    monkeypatch.setattr(checkpoint, "save_checkpoint", save)
    with pytest.raises(Killed):
        Trainer(tiny(shakespeare, out, steps=4, save_every=2)).run()
    monkeypatch.undo()
    return saved


@pytest.mark.parametrize(
    "kill, expect_dir", [(1, "checkpoint"), (2, "checkpoint.old")], ids=["before-swap", "mid-swap"]
)
def test_killed_save_keeps_previous_checkpoint(
    shakespeare, tmp_path, monkeypatch, kill, expect_dir
):
    saved = _run_killed_at_second_save(shakespeare, tmp_path, monkeypatch, kill)
    ck = checkpoint.find_checkpoint(str(tmp_path))
    assert os.path.normpath(ck) == os.path.normpath(tmp_path / expect_dir)
    assert ckpt_step(ck) == 2
    state = read_state(ck)
    assert set(state) == set(saved)
    for k in saved:
        np.testing.assert_array_equal(state[k], saved[k], err_msg=k)

    # resume from it: it carries on from step 2 and redoes steps 3 and 4 exactly
    killed_rows = read_metrics(tmp_path)
    tr = Trainer(tiny(shakespeare, tmp_path, steps=4, save_every=2, resume=str(tmp_path)))
    assert tr.step == 2
    for k, w in tr.model.state_dict().items():
        np.testing.assert_array_equal(w, saved[k], err_msg=k)
    tr.run()
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]  # replayed steps replace, not append
    assert [r["loss"] for r in rows[2:]] == [r["loss"] for r in killed_rows[2:4]]
    ck = checkpoint.find_checkpoint(str(tmp_path))
    assert os.path.basename(ck) == "checkpoint" and ckpt_step(ck) == 4
    assert not os.path.exists(tmp_path / "checkpoint.old")


def test_second_kill_after_mid_swap_kill_keeps_a_checkpoint(shakespeare, tmp_path, monkeypatch):
    _run_killed_at_second_save(shakespeare, tmp_path, monkeypatch, kill=2)
    assert os.listdir(tmp_path) and (tmp_path / "checkpoint.old").is_dir()
    tr = Trainer(tiny(shakespeare, tmp_path, steps=4, save_every=2, resume=str(tmp_path)))
    # the next save has no checkpoint/ to move aside, so its one rename is new -> checkpoint
    _kill_rename(monkeypatch, tmp_path, 1)
    with pytest.raises(Killed):
        tr.run()
    monkeypatch.undo()
    ck = checkpoint.find_checkpoint(str(tmp_path))  # raises today: nothing is left
    assert ckpt_step(ck) in (2, 4)


# ----------------------------------------------------------------------------- the CLI


def cli_args(data_dir, out, *extra):
    return [
        "--model",
        "gpt2-tiny",
        "--data-dir",
        data_dir,
        "--out",
        str(out),
        "--quiet",
        "--device",
        "cpu",
        "--dtype",
        "fp32",
        "--steps",
        "2",
        "--batch-size",
        "2",
        "--seq-len",
        "16",
        "--eval-every",
        "0",
        *extra,
    ]


def run_cli(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    return exit_info.value.code, capsys.readouterr().err


def assert_one_line_error(err, *needles):
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: "), err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], (needle, err)


BAD_INPUT = {
    "zero-batch": (["--batch-size", "0"], "--batch-size"),
    "negative-batch": (["--batch-size", "-4"], "--batch-size"),
    "zero-seq-len": (["--seq-len", "0"], "--seq-len"),
    "negative-seq-len": (["--seq-len", "-16"], "--seq-len"),
    "zero-steps": (["--steps", "0"], "--steps"),
    "negative-steps": (["--steps", "-1"], "--steps"),
    "zero-grad-accum": (["--grad-accum", "0"], "--grad-accum"),
    "zero-eval-iters": (["--eval-iters", "0"], "--eval-iters"),
    "negative-warmup": (["--warmup", "-1"], "--warmup"),
    "negative-save-every": (["--save-every", "-5"], "--save-every"),
    "zero-lr": (["--lr", "0"], "--lr"),
    "negative-grad-clip": (["--grad-clip", "-1"], "--grad-clip"),
    "seq-len-over-context": (["--seq-len", "65"], "64"),
    "unknown-preset": (["--model", "gpt5-huge"], "gpt5-huge"),
    "unknown-dtype": (["--dtype", "fp8"], "fp8"),
    "unknown-device": (["--device", "tpu"], "tpu"),
    "unknown-lm-head-design": (["--lm-head-design", "lazy"], "unknown lm_head_design 'lazy'"),
}


def test_every_setting_is_a_flag_with_its_help():
    """The help is the field's (RunConfig's metadata); a switch on by default says what its
    --no- flag does."""
    actions = {a.dest: a for a in parser()._actions}
    for f in dataclasses.fields(RunConfig):
        assert f.metadata["help"] and actions[f.name].help.startswith(f.metadata["help"])
    assert actions["save"].option_strings == ["--no-save"]
    assert actions["save"].help.startswith("write no checkpoint")
    assert actions["report"].help == "print no accounting report after training"
    assert actions["lm_head_design"].help.endswith("(default precompute)")


@pytest.mark.parametrize("extra, needle", list(BAD_INPUT.values()), ids=list(BAD_INPUT))
def test_cli_bad_input_is_one_line_exit_2(shakespeare, tmp_path, capsys, extra, needle):
    code, err = run_cli(cli_args(shakespeare, tmp_path, *extra), capsys)
    assert code == 2
    assert_one_line_error(err, needle)
    assert not os.path.exists(tmp_path / "checkpoint")


@pytest.mark.skipif(backend.cuda_available(), reason="a GPU is usable here")
def test_cli_cuda_without_gpu_is_one_line_exit_2(shakespeare, tmp_path, capsys):
    code, err = run_cli(cli_args(shakespeare, tmp_path, "--device", "cuda"), capsys)
    assert code == 2
    assert_one_line_error(err, "cuda")


def test_cli_seq_len_cannot_change_on_resume(shakespeare, tmp_path, capsys):
    """The saved data position counts batches of the saved shape: a one-line error."""
    Trainer(tiny(shakespeare, tmp_path, steps=1)).run()
    code, err = run_cli(
        cli_args(shakespeare, tmp_path, "--resume", str(tmp_path), "--seq-len", "100"), capsys
    )
    assert code == 2
    assert_one_line_error(err, "--seq-len 100 cannot change on resume", "saved with 16")


def test_cli_resume_from_nothing_is_one_line_exit_2(shakespeare, tmp_path, capsys):
    code, err = run_cli(cli_args(shakespeare, tmp_path, "--resume", str(tmp_path / "nope")), capsys)
    assert code == 2
    assert_one_line_error(err, "nope")


def test_cli_missing_data_names_the_command(tmp_path, capsys):
    data = tmp_path / "my_corpus"
    code, err = run_cli(cli_args(str(data), tmp_path / "out"), capsys)
    assert code == 2
    assert_one_line_error(err, "scripts/prepare_data.py", f"--out-dir {data}")
    assert not data.exists()  # a non-default folder is never made behind your back


def test_cli_trains_and_returns_the_trainer(shakespeare, tmp_path, capsys):
    tr = main(cli_args(shakespeare, tmp_path))
    assert tr.step == 2 and tr.cfg.model == "gpt2-tiny"
    assert ckpt_step(checkpoint.find_checkpoint(str(tmp_path))) == 2
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    "extra, needle",
    [(["--model", "nope"], "nope"), (["--batch-size", "0"], "--batch-size")],
    ids=["unknown-preset", "zero-batch"],
)
def test_train_script_bad_input_subprocess(shakespeare, tmp_path, extra, needle):
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join("examples", "train_gpt2.py"),
            *cli_args(shakespeare, tmp_path, *extra),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert_one_line_error(proc.stderr, needle)
    assert proc.stdout == ""


# ----------------------------------------------------------------------------- non-finite loss


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the overflow is the point
def test_nan_loss_stops_with_exit_1_and_keeps_last_checkpoint(
    shakespeare, tmp_path, capsys, monkeypatch
):
    """A learning rate of 1e9 with no clipping blows the weights up: the loss is finite on
    step 1 and nan soon after. With a save every step, the checkpoint on disk must be the one
    written after the last finite step, byte for byte, and nothing may be saved after."""
    writes = []
    real_save = checkpoint.save_checkpoint

    def save(out_dir, model, *arrays_and_state):
        state = arrays_and_state[-1]
        path = real_save(out_dir, model, *arrays_and_state)
        writes.append((state["step"], (tmp_path / "checkpoint" / "model.safetensors").read_bytes()))
        return path

    monkeypatch.setattr(checkpoint, "save_checkpoint", save)
    # naive attention: its scores q·k^T overflow to inf and the loss turns nan; flash scales q
    # first and stays finite (a loss of ~1e19) at this learning rate
    code, err = run_cli(
        cli_args(
            shakespeare,
            tmp_path,
            "--lr",
            "1e9",
            "--min-lr",
            "0",
            "--warmup",
            "0",
            "--grad-clip",
            "0",
            "--weight-decay",
            "0",
            "--steps",
            "6",
            "--save-every",
            "1",
            "--attention",
            "naive",
        ),
        capsys,
    )
    assert code == 1
    assert_one_line_error(err, "loss is nan", f"checkpoint in {tmp_path}")
    good = read_metrics(tmp_path)
    assert 1 <= len(good) < 6 and all(math.isfinite(r["loss"]) for r in good)
    assert [step for step, _ in writes] == list(range(1, len(good) + 1))  # no save after nan
    ck = checkpoint.find_checkpoint(str(tmp_path))
    assert os.path.basename(ck) == "checkpoint" and ckpt_step(ck) == len(good)
    assert (tmp_path / "checkpoint" / "model.safetensors").read_bytes() == writes[-1][1]
    assert all(np.isfinite(a).all() for a in read_state(ck).values())
    tr = Trainer(tiny(shakespeare, tmp_path, steps=6, resume=str(tmp_path)))  # still loads
    assert tr.step == len(good)


# ----------------------------------------------------------------------------- grad accumulation


def test_grad_accum_averages_micro_batches(shakespeare, tmp_path):
    tr = Trainer(tiny(shakespeare, tmp_path, steps=2, grad_accum=2))
    probe = Trainer(tiny(shakespeare, tmp_path / "probe", steps=2))  # same weights, batches
    expected = np.mean([probe.model(*probe.train_data.next_batch())[1].item() for _ in range(2)])
    loss, _, _, skipped = tr.train_step()
    assert not skipped
    assert loss == pytest.approx(expected, rel=1e-5)


# ----------------------------------------------------------------------------- reliability


def test_resume_takes_the_saved_config_and_reports_overrides(shakespeare, tmp_path, capsys):
    main(cli_args(shakespeare, tmp_path, "--lr", "2e-3", "--min-lr", "1e-4"))
    capsys.readouterr()
    tr = main(["--resume", str(tmp_path), "--quiet", "--lr", "1e-3", "--steps", "3"])
    assert tr.cfg.model == "gpt2-tiny" and tr.cfg.seq_len == 16 and tr.cfg.min_lr == 1e-4
    assert tr.cfg.out == str(tmp_path) and tr.cfg.lr == 1e-3 and tr.step == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith(
        "warning: --steps 3 differs from the saved run's 2: the cosine "
        "schedule changes from step 2 on"
    )
    assert err[1:] == ["note: --lr 0.001 overrides the saved 0.002"]


def test_the_schedule_warning_on_resume_is_rank_0s_alone(shakespeare, tmp_path, capsys):
    """Rank 1 of 2 (a world whose collectives are the identity) resumes with another --steps:
    it says nothing, rank 0 says the warning (tests/test_faults.py counts it under mpirun)."""
    from tinygrad_like.distributed import Communicator

    Trainer(tiny(shakespeare, tmp_path, steps=1)).run()
    capsys.readouterr()
    resumed = dict(steps=3, resume=str(tmp_path))
    Trainer(tiny(shakespeare, tmp_path, batch_size=1, **resumed), Communicator(rank=1, size=2))
    assert capsys.readouterr().err == ""
    Trainer(tiny(shakespeare, tmp_path, **resumed))
    assert capsys.readouterr().err.startswith("warning: --steps 3 differs")


def test_resume_refuses_to_change_the_model(shakespeare, tmp_path, capsys):
    Trainer(tiny(shakespeare, tmp_path, steps=1)).run()
    code, err = run_cli(["--resume", str(tmp_path), "--model", "gpt2-mini"], capsys)
    assert code == 2
    assert_one_line_error(err, "--model gpt2-mini cannot change on resume", "gpt2-tiny")


def test_resume_of_a_finished_run_is_refused_and_leaves_the_folder_alone(
    shakespeare, tmp_path, capsys
):
    Trainer(tiny(shakespeare, tmp_path, steps=2)).run()

    def files():
        return {
            p: (p.read_bytes(), p.stat().st_mtime_ns) for p in tmp_path.rglob("*") if p.is_file()
        }

    before = files()
    for extra, steps in (([], 2), (["--steps", "1"], 1)):
        code, err = run_cli(["--resume", str(tmp_path), *extra], capsys)
        assert code == 2
        assert_one_line_error(
            err,
            f"{tmp_path} is already at step 2 of {steps}: pass --steps M (M > 2) to train further",
        )
    assert files() == before
    tr = main(["--resume", str(tmp_path), "--quiet", "--steps", "3"])
    assert tr.step == 3 and ckpt_step(checkpoint.find_checkpoint(str(tmp_path))) == 3


def test_fresh_run_into_a_run_folder_is_refused_unless_overwrite(shakespeare, tmp_path, capsys):
    Trainer(tiny(shakespeare, tmp_path, steps=2)).run()
    code, err = run_cli(cli_args(shakespeare, tmp_path), capsys)
    assert code == 2
    assert_one_line_error(
        err,
        f"{tmp_path}/ already holds a run at step 2: --resume "
        f"{tmp_path} to continue, or --out elsewhere, or --overwrite",
    )
    tr = main(cli_args(shakespeare, tmp_path, "--overwrite", "--steps", "1"))
    assert tr.step == 1 and ckpt_step(checkpoint.find_checkpoint(str(tmp_path))) == 1
    assert [r["step"] for r in read_metrics(tmp_path)] == [1]


@pytest.mark.parametrize("left", ["metrics.jsonl", ".lock"])
def test_a_run_stopped_before_its_first_save_is_a_run_folder(shakespeare, tmp_path, capsys, left):
    """A folder with only metrics.jsonl, or only the lock, of a run that never saved: a new run
    there is refused (its rows would be cut to the new run's), --overwrite starts afresh."""
    rows = "".join(f'{{"step": {i}, "loss": 1.0}}\n' for i in range(1, 114))
    (tmp_path / left).write_text(rows if left == "metrics.jsonl" else "pid 1\n")
    code, err = run_cli(cli_args(shakespeare, tmp_path), capsys)
    assert code == 2
    held = "metrics.jsonl (113 rows" if left == "metrics.jsonl" else ".lock"
    assert_one_line_error(err, f"{tmp_path}/ already holds a run's {held}", "no checkpoint): --out")
    assert "--resume" not in err
    if left == "metrics.jsonl":
        assert (tmp_path / left).read_text() == rows
    tr = main(cli_args(shakespeare, tmp_path, "--overwrite", "--steps", "1"))
    assert tr.step == 1 and [r["step"] for r in read_metrics(tmp_path)] == [1]


def test_init_from_takes_the_checkpoints_model_and_refuses_another(shakespeare, tmp_path, capsys):
    """--init-from a gpt2-mini checkpoint with --model gpt2-tiny: refused, both named; with
    --model left out the run records the checkpoint's preset, or None for a shape of its own."""
    from training.cli import resolve

    GPT2(GPT2Config.from_preset("gpt2-mini")).save_pretrained(tmp_path / "mini")
    argv = cli_args(shakespeare, tmp_path / "run", "--init-from", str(tmp_path / "mini"))
    code, err = run_cli(argv, capsys)  # cli_args says --model gpt2-tiny
    assert code == 2
    assert_one_line_error(err, "--model gpt2-tiny does not match --init-from", "holds gpt2-mini")
    without = [a for a in argv if a not in ("--model", "gpt2-tiny")]
    assert resolve(without)[0].model == "gpt2-mini"
    GPT2(GPT2Config(n_layer=1, n_head=2, n_embd=32)).save_pretrained(tmp_path / "own")
    without[without.index(str(tmp_path / "mini"))] = str(tmp_path / "own")
    assert resolve(without)[0].model is None


def test_a_second_run_into_a_locked_folder_is_refused(shakespeare, tmp_path, capsys):
    lock = checkpoint.lock_run_folder(str(tmp_path))
    try:
        code, err = run_cli(cli_args(shakespeare, tmp_path), capsys)
    finally:
        lock.close()
    assert code == 2
    assert_one_line_error(err, "in use by another run", f"pid {os.getpid()}")


def test_out_that_is_a_file_is_one_line_exit_2(shakespeare, tmp_path, capsys):
    (tmp_path / "f").write_text("")
    code, err = run_cli(cli_args(shakespeare, tmp_path / "f"), capsys)
    assert code == 2
    assert_one_line_error(err, "is a file, not a folder")


def test_metrics_are_cut_back_to_the_checkpoint_and_strict_json(tmp_path):
    from training.loop import _trim_metrics, strict_json

    path = tmp_path / "metrics.jsonl"
    rows = [strict_json({"step": i, "loss": float("nan") if i == 2 else 1.0}) for i in (1, 2, 3)]
    path.write_text("\n".join(rows) + '\n{"step": 4, "lo')  # a kill mid-line
    _trim_metrics(str(path), 2)
    assert path.read_text() == rows[0] + "\n" + rows[1] + "\n"
    assert json.loads(rows[1]) == {"step": 2, "loss": None}
    assert "NaN" not in strict_json({"x": np.float32("inf")})


def test_non_finite_weights_are_never_saved(shakespeare, tmp_path):
    tr = Trainer(tiny(shakespeare, tmp_path, steps=1))
    tr.run()
    before = (tmp_path / "checkpoint" / "model.safetensors").read_bytes()
    tr.optimizer.master[3] = np.nan
    with pytest.raises(
        FloatingPointError,
        match=r"weights hold nan or inf at step 1 .*not "
        r"saved; the step-1 checkpoint in .* is kept",
    ):
        tr.save()
    assert (tmp_path / "checkpoint" / "model.safetensors").read_bytes() == before
    assert not (tmp_path / "checkpoint.new").exists()


def test_disk_full_while_saving_keeps_the_previous_checkpoint(
    shakespeare, tmp_path, capsys, monkeypatch
):
    import errno

    from tinygrad_like import files

    real_save, real = Trainer.save, files.atomic_write

    def save_then_die(self):  # a run of 2 steps killed after its step-1 checkpoint
        real_save(self)
        raise Killed

    monkeypatch.setattr(Trainer, "save", save_then_die)
    with pytest.raises(Killed):
        Trainer(tiny(shakespeare, tmp_path, steps=2, save_every=1)).run()
    monkeypatch.undo()

    def full(path, data):
        if "checkpoint.new" in str(path) and str(path).endswith("optimizer.safetensors"):
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, data)

    monkeypatch.setattr(checkpoint, "atomic_write", full)
    code, err = run_cli(["--resume", str(tmp_path), "--quiet", "--no-report"], capsys)
    assert code == 2 and ckpt_step(checkpoint.find_checkpoint(str(tmp_path))) == 1
    assert_one_line_error(
        err,
        "disk full: the step-2 checkpoint needs about",
        "MB",
        "nothing partial is left, the step-1 checkpoint",
    )
    assert not (tmp_path / "checkpoint.new").exists()


@pytest.mark.parametrize(
    "max_skipped, why", [(3, "fp16 skipped 3 steps in a row"), (0, "below 2^-24")]
)
def test_fp16_that_never_recovers_stops_with_exit_1(
    shakespeare, tmp_path, capsys, monkeypatch, max_skipped, why
):
    """Every step overflows: with --max-skipped 3 the third skip stops the run; with 0 the
    scale halves from 2^16 until it falls under 2^-24 (41 skips). The checkpoint stays."""
    Trainer(tiny(shakespeare, tmp_path, steps=1, dtype="fp16")).run()
    before = (tmp_path / "checkpoint" / "model.safetensors").read_bytes()
    monkeypatch.setattr(
        Trainer,
        "train_step",
        lambda self: (float("inf"), 1e-3, 0.0, True) if self.scaler.update(True) is None else None,
    )
    code, err = run_cli(
        [
            "--resume",
            str(tmp_path),
            "--quiet",
            "--steps",
            "100",
            "--max-skipped",
            str(max_skipped),
            "--save-every",
            "1",
        ],
        capsys,
    )
    assert code == 1
    assert why in err and "the step-1 checkpoint" in err and "is kept" in err
    assert (tmp_path / "checkpoint" / "model.safetensors").read_bytes() == before
