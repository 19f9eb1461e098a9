"""Fault injection: SIGKILL at random moments of a run that saves every step, a disk that
fills up during a save, corrupted checkpoint and token files, and every float flag given nan,
inf, 0 and a negative value. What must hold: a kill never leaves an unloadable run folder and
the resumed run ends bit for bit where an uninterrupted one does; every other fault is one
line `error: ...` with exit code 2 (or a correct load), never a traceback, never a silent
wrong load. Seeded throughout, so a failure reproduces."""

import contextlib
import dataclasses
import importlib.util
import io
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nn import GPT2, GPT2Config
from nn.hf import read_state
from tinygrad_like import backend
from training import checkpoint
from training.args import user_errors
from training.cli import main, resolve
from training.data import HEADER_BYTES, write_tokens
from training.loop import RunConfig, Trainer

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(REPO, "examples", "train_gpt2.py")
ENV = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
STEPS = 24

pytestmark = pytest.mark.usefixtures("one_blas_thread")


def flags(data_dir, out, *extra):
    """The command line of tiny(): gpt2-tiny, 2 x 16 tokens a step, a save every step."""
    return [
        "--model",
        "gpt2-tiny",
        "--data-dir",
        data_dir,
        "--out",
        str(out),
        "--quiet",
        "--no-report",
        "--device",
        "cpu",
        "--dtype",
        "fp32",
        "--batch-size",
        "2",
        "--seq-len",
        "16",
        "--steps",
        str(STEPS),
        "--lr",
        "5e-3",
        "--min-lr",
        "5e-4",
        "--warmup",
        "2",
        "--eval-every",
        "0",
        "--eval-iters",
        "2",
        "--seed",
        "1337",
        "--save-every",
        "1",
        *extra,
    ]


def tiny(data_dir, out, **overrides):
    cfg = dict(
        model="gpt2-tiny",
        data_dir=data_dir,
        batch_size=2,
        seq_len=16,
        steps=STEPS,
        lr=5e-3,
        min_lr=5e-4,
        warmup=2,
        eval_every=0,
        eval_iters=2,
        out=str(out),
        quiet=True,
        report=False,
        seed=1337,
        save_every=1,
    )
    return RunConfig(**{**cfg, **overrides})


def one_line_error(err):
    lines = err.strip().splitlines()
    return len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err


def saved_step(out):
    """The step of the checkpoint a run folder holds, every file's sha256 verified."""
    ck = checkpoint.find_checkpoint(str(out))
    state, arrays = checkpoint.load_trainer_state(ck)
    assert read_state(ck) and arrays
    return state["step"]


# ----------------------------------------------------------------------------- kill -9


def test_sigkill_at_random_moments_then_resume_ends_bit_exact(shakespeare, tmp_path):
    """Kill the run at random moments (after its first save of the trial, plus a random delay
    of up to 0.3 s); after each kill the folder's checkpoint loads and --resume carries on;
    the last resume runs to the end, and its weights and AdamW state equal an uninterrupted
    run's byte for byte. Counted: kills, and kills that landed mid-save."""
    Trainer(tiny(shakespeare, tmp_path / "straight")).run()
    out, rng = tmp_path / "killed", random.Random(20240520)
    kills = mid_save = 0
    args = flags(shakespeare, out)
    for trial in range(6):
        before = checkpoint.checkpoint_step(str(out)) or 0
        proc = subprocess.Popen(
            [sys.executable, TRAIN, *args],
            cwd=REPO,
            env=ENV,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 60
        while (checkpoint.checkpoint_step(str(out)) or 0) <= before and proc.poll() is None:
            assert time.monotonic() < deadline, "the run made no progress"
            time.sleep(0.01)
        time.sleep(rng.uniform(0, 0.3))
        if proc.poll() is not None:  # it finished first: nothing left to kill
            assert proc.returncode == 0, proc.stderr.read()
            break
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stderr.close()
        kills += 1
        mid_save += any(os.path.exists(out / d) for d in ("checkpoint.new", "checkpoint.old"))
        assert 1 <= saved_step(out) <= STEPS
        args = ["--resume", str(out), "--quiet"]  # the saved run config does the rest
    else:  # killed every time: one more resume runs to the end
        proc = subprocess.run(
            [sys.executable, TRAIN, *args],
            cwd=REPO,
            env=ENV,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
    assert saved_step(out) == STEPS
    for name in ("model.safetensors", "optimizer.safetensors"):
        a = (tmp_path / "straight" / "checkpoint" / name).read_bytes()
        assert (out / "checkpoint" / name).read_bytes() == a, name
    # metrics.jsonl: each step once, whatever was replayed or cut mid-line
    steps = [r["step"] for r in _rows(out)]
    assert steps == list(range(1, STEPS + 1))
    print(f"\nkill -9: {kills} kills, {mid_save} mid-save")
    assert kills >= 3


def _rows(out):
    import json

    with open(out / "metrics.jsonl") as f:
        return [json.loads(line) for line in f]


# ----------------------------------------------------------------------------- disk full


@contextlib.contextmanager
def tmpfs(path, options):
    """A tmpfs mounted at path (mount's -o options: size=..., ro) while the test runs."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    path.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if proc.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


@pytest.fixture
def small_disk(tmp_path):
    """A 30 MB tmpfs: room for one gpt2-tiny checkpoint (about 20 MB), not for two."""
    with tmpfs(tmp_path / "disk", "size=30m") as mnt:
        yield mnt


@pytest.fixture
def two_pages(tmp_path):
    """An 8 KB tmpfs: two 4 KB pages, one for the run's .lock and one for its metrics.jsonl
    (about 20 rows), none for loss.png or a checkpoint."""
    with tmpfs(tmp_path / "disk", "size=8k") as mnt:
        yield mnt


@pytest.fixture
def read_only(tmp_path):
    """A read-only file system (as root, who may write in any folder), or else a folder
    without write permission."""
    if os.geteuid() == 0:
        with tmpfs(tmp_path / "ro", "ro,size=1m") as mnt:
            yield mnt
        return
    (tmp_path / "ro").mkdir(mode=0o555)
    yield tmp_path / "ro"


def test_disk_full_during_a_save(shakespeare, small_disk):
    out = small_disk / "run"
    proc = subprocess.run(
        [sys.executable, TRAIN, *flags(shakespeare, out, "--steps", "3")],
        cwd=REPO,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert one_line_error(proc.stderr), proc.stderr
    assert "disk full" in proc.stderr and "MB" in proc.stderr
    assert "the step-1 checkpoint" in proc.stderr and "is kept" in proc.stderr
    assert saved_step(out) == 1  # the previous one, intact
    assert sorted(os.listdir(out)) == [".lock", "checkpoint", "metrics.jsonl"]
    assert not [f for f in os.listdir(out / "checkpoint") if f.endswith(".tmp")]


def run_main(argv, capsys):
    """training.cli.main in this process -> (exit code, stderr)."""
    try:
        main(argv)
        code = 0
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


def test_metrics_on_a_full_disk_stop_with_one_line(shakespeare, two_pages, capsys):
    code, err = run_main(flags(shakespeare, two_pages, "--no-save", "--steps", "60"), capsys)
    assert code == 2 and one_line_error(err), err
    assert "error: disk full: step " in err and "row of metrics.jsonl" in err
    assert "stopping; no usable checkpoint" in err


def test_resume_on_a_full_disk_is_one_line(shakespeare, small_disk, capsys):
    """The resume must cut metrics.jsonl back (a half row left by a kill) and has no room."""
    out = small_disk / "run"
    Trainer(tiny(shakespeare, out, steps=1, save_every=0)).run()
    with open(out / "metrics.jsonl", "a") as f:
        f.write('{"step": 2, "lo')
    with open(small_disk / "filler", "wb") as f, contextlib.suppress(OSError):
        while True:
            f.write(bytes(1 << 20))
    code, err = run_main(["--resume", str(out), "--steps", "2", "--quiet"], capsys)
    warning, err = err.split("\n", 1)  # --steps 2 moves the schedule
    assert code == 2 and warning.startswith("warning: --steps 2") and one_line_error(err), err
    assert "error: disk full: metrics.jsonl cut back to step 1" in err
    assert "the step-1 checkpoint" in err and "is kept" in err


def test_a_finished_run_whose_picture_cannot_be_written_warns_and_exits_0(
    shakespeare, two_pages, capsys
):
    code, err = run_main(flags(shakespeare, two_pages, "--no-save", "--steps", "3"), capsys)
    assert code == 0
    (line,) = err.strip().splitlines()
    assert line.startswith("warning: disk full: loss.png in ") and "plot_metrics.py" in line
    assert [r["step"] for r in _rows(two_pages)] == [1, 2, 3]


def test_out_on_a_read_only_file_system_is_one_line(shakespeare, read_only, capsys):
    code, err = run_main(flags(shakespeare, read_only / "run"), capsys)
    assert code == 2 and one_line_error(err) and "choose another --out" in err, err


def test_prepare_data_out_dir_naming_a_file_is_one_line(tmp_path, capsys):
    (tmp_path / "a.txt").write_text("to be or not to be\n" * 20)
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit) as exit_info:
        script_main("scripts/prepare_data.py")(
            ["--out-dir", str(tmp_path / "file"), "--input", str(tmp_path / "a.txt")]
        )
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "is a file, not a folder" in err, err
    assert one_line_error(err), err  # said before the tokenizing starts


# ----------------------------------------------------------------------------- corruption

CHECKPOINT_FILES = [
    "config.json",
    "model.safetensors",
    "optimizer.safetensors",
    "trainer_state.json",
]
BIN_FILES = ["train.bin", "val.bin"]
TRIED = {"corruptions": 0, "errors": 0, "loads": 0}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A 2-step run saved in run/, its data (small .bin files) in data/, and what it holds."""
    root = tmp_path_factory.mktemp("corrupt")
    rng = np.random.default_rng(0)
    (root / "data").mkdir()
    for name in BIN_FILES:
        write_tokens(root / "data" / name, rng.integers(0, 50257, 3000))
    tr = Trainer(tiny(str(root / "data"), root / "run", steps=2))
    tr.run()
    ck = root / "run" / "checkpoint"
    files = {n: (ck / n).read_bytes() for n in CHECKPOINT_FILES}
    files.update({n: (root / "data" / n).read_bytes() for n in BIN_FILES})
    expected = dict(
        weights=tr.optimizer.master_state(),
        opt=tr.optimizer.state_dict()[0],
        step=tr.step,
        data=tr.train_data.state_dict(),
    )
    yield root, files, expected
    print(f"\ncorruption: {TRIED}")


def load_resumed(root):
    """Resume the run as train_gpt2.py does, up to the first step, with one step more than it
    saved (a finished run is refused). -> (exit code, stderr, the Trainer or None)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            with user_errors():
                run, data = str(root / "run"), str(root / "data")
                cfg, _ = resolve(["--resume", run, "--data-dir", data, "--quiet", "--steps", "3"])
                return 0, err.getvalue(), Trainer(cfg)
        except SystemExit as e:
            return e.code, err.getvalue(), None


def corrupt(data, kind, where, mask):
    """A truncation to where * len, or byte number where * len xor mask."""
    i = min(int(where * len(data)), len(data) - 1)
    if kind == "truncate":
        return data[:i]
    return data[:i] + bytes([data[i] ^ mask]) + data[i + 1 :]


def check_outcome(root, files, expected, name, bad):
    path = (
        (root / "run" / "checkpoint" / name) if name in CHECKPOINT_FILES else (root / "data" / name)
    )
    path.write_bytes(bad)
    try:
        code, err, tr = load_resumed(root)
        tokens = np.array(tr.train_data.tokens) if tr else None  # a map of the bad file
    finally:
        path.write_bytes(files[name])
    TRIED["corruptions"] += 1
    if tr is None:
        TRIED["errors"] += 1
        assert code == 2 and one_line_error(err), (name, err)
        return
    TRIED["loads"] += 1  # then it must be exactly what was saved
    assert tr.step == expected["step"] and tr.train_data.state_dict() == expected["data"]
    for k, w in tr.optimizer.master_state().items():
        np.testing.assert_array_equal(w, expected["weights"][k], err_msg=k)
    for k, a in tr.optimizer.state_dict()[0].items():
        np.testing.assert_array_equal(a, expected["opt"][k], err_msg=k)
    if name in BIN_FILES:  # a flipped id that is still a valid id
        on_disk = np.frombuffer(bad[HEADER_BYTES:], "<u2")
        assert on_disk.max() < 50257
        if name == "train.bin":
            np.testing.assert_array_equal(tokens, on_disk)


@pytest.mark.parametrize("name", CHECKPOINT_FILES + BIN_FILES)
@pytest.mark.parametrize("kind", ["empty", "half", "last-byte"])
def test_truncated_files_are_one_line_errors(pristine, name, kind):
    root, files, expected = pristine
    data = files[name]
    bad = {"empty": b"", "half": data[: len(data) // 2], "last-byte": data[:-1]}[kind]
    check_outcome(root, files, expected, name, bad)
    assert TRIED["errors"]


@pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisWarning")  # the fixture's repr
@settings(
    max_examples=120,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    name=st.sampled_from(CHECKPOINT_FILES + BIN_FILES),
    kind=st.sampled_from(["truncate", "flip", "flip"]),
    where=st.floats(0, 1),
    mask=st.integers(1, 255),
)
def test_corrupted_inputs_are_a_clean_error_or_a_correct_load(pristine, name, kind, where, mask):
    root, files, expected = pristine
    check_outcome(root, files, expected, name, corrupt(files[name], kind, where, mask))


def test_a_flipped_byte_in_the_weights_is_caught_by_the_checksum(pristine):
    """The one corruption a parser cannot see: a float's bits changed in place."""
    root, files, _ = pristine
    path = root / "run" / "checkpoint" / "model.safetensors"
    path.write_bytes(corrupt(files["model.safetensors"], "flip", 0.9, 0x40))
    try:
        code, err, _ = load_resumed(root)
    finally:
        path.write_bytes(files["model.safetensors"])
    assert code == 2 and "model.safetensors" in err and "sha256" in err, err


# ----------------------------------------------------------------------------- float flags

FLOAT_FLAGS = [
    "--" + f.name.replace("_", "-") for f in dataclasses.fields(RunConfig) if f.type is float
]
ZERO_IS_FINE = {"--min-lr", "--weight-decay", "--grad-clip"}  # 0: floor, no decay, no clip


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0", "-1"])
@pytest.mark.parametrize("flag", FLOAT_FLAGS)
def test_every_float_flag(shakespeare, tmp_path, flag, value):
    argv = flags(shakespeare, tmp_path, flag, value)
    if flag == "--min-lr":  # min-lr must also stay under lr
        argv += ["--lr", "1"]
    if value == "0" and flag in ZERO_IS_FINE:
        assert getattr(resolve(argv)[0], flag[2:].replace("-", "_")) == 0
        return
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exit_info:
        with user_errors():
            resolve(argv)
    assert exit_info.value.code == 2
    assert one_line_error(err.getvalue()) and flag in err.getvalue(), err.getvalue()


def test_min_lr_above_lr_is_refused(shakespeare, tmp_path):
    with pytest.raises(ValueError, match="--min-lr 0.01 is above --lr 0.001"):
        resolve(flags(shakespeare, tmp_path, "--lr", "1e-3", "--min-lr", "1e-2"))


def script_main(path):
    """The main() of a script of the repository (path relative to it)."""
    spec = importlib.util.spec_from_file_location(
        os.path.basename(path)[:-3], os.path.join(REPO, path)
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


@pytest.mark.parametrize(
    "flag, value",
    [(f, v) for f in ("--temperature", "--top-p") for v in ("nan", "inf", "-1")]
    + [("--top-p", "0"), ("--top-p", "1.5"), ("--top-k", "0"), ("--top-k", "-3")],
)
def test_every_float_flag_of_generate(tmp_path, flag, value, capsys):
    """Refused before any checkpoint is read or any text is printed."""
    with pytest.raises(SystemExit) as exit_info:
        script_main("examples/generate.py")(["--checkpoint", str(tmp_path / "none"), flag, value])
    out, err = capsys.readouterr()
    assert exit_info.value.code == 2 and out == ""
    assert one_line_error(err) and flag in err, err


# ----------------------------------------------------------------------------- ranks

MPIRUN = os.path.join(os.path.dirname(sys.executable), "mpirun")
FAULT = os.path.join(REPO, "tests", "mpi_fault.py")
RANK_STEPS = ["--steps", "8"]


def mpirun(*apps, env=None):
    """One mpirun job of apps, each (ranks, argv) or (ranks, argv, working folder); several
    are joined by ':' (MPMD) -> CompletedProcess (text)."""
    pytest.importorskip("mpi4py", reason="the [dist] extra: pip install -e '.[test,dist]'")
    cmd = [MPIRUN, *(["--allow-run-as-root"] if os.geteuid() == 0 else []), "--oversubscribe"]
    for i, (ranks, argv, *wdir) in enumerate(apps):
        cmd += [":"] * (i > 0) + ["-n", str(ranks), *(["--wdir", *wdir] if wdir else [])]
        cmd += [sys.executable, *argv]
    env = {**ENV, **(env or {})}
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def error_lines(err):
    return [line for line in err.splitlines() if line.startswith("error:")]


def test_a_token_file_changed_in_the_middle_on_one_rank_is_refused(shakespeare, tmp_path):
    """Each rank reads data/ in its own folder; rank 1's train.bin has 1,000 tokens changed
    in its middle (same size, valid ids): refused at start-up, one line from rank 0."""
    for rank in ("a", "b"):
        (tmp_path / rank / "data").mkdir(parents=True)
        for name in BIN_FILES:
            data = (Path(shakespeare) / name).read_bytes()
            if rank == "b" and name == "train.bin":
                middle = len(data) // 2 & ~1
                data = data[:middle] + bytes(2000) + data[middle + 2000 :]
            (tmp_path / rank / "data" / name).write_bytes(data)
    argv = [TRAIN, *flags("data", tmp_path / "out")]
    run = mpirun((1, argv, str(tmp_path / "a")), (1, argv, str(tmp_path / "b")))
    assert run.returncode == 2, run.stderr[-2000:]
    (line,) = error_lines(run.stderr)
    assert line.startswith("error: rank 1 runs with train.bin ") and "where rank 0 has" in line


@pytest.fixture(scope="module")
def truncated_data(tmp_path_factory, shakespeare):
    """A data folder whose val.bin lost its last byte: every rank meets it at start-up."""
    d = tmp_path_factory.mktemp("truncated")
    (d / "train.bin").write_bytes((Path(shakespeare) / "train.bin").read_bytes())
    (d / "val.bin").write_bytes((Path(shakespeare) / "val.bin").read_bytes()[:-1])
    return str(d)


@pytest.fixture(scope="module")
def saved_at_global_batch_2(tmp_path_factory, shakespeare):
    out = tmp_path_factory.mktemp("batch2")
    Trainer(tiny(shakespeare, out, steps=1)).run()
    return out


@pytest.mark.parametrize("ranks", [2, 4])
def test_bad_input_under_mpirun_is_said_once(
    shakespeare, truncated_data, saved_at_global_batch_2, tmp_path, ranks
):
    """Rank 0 starts last (SLOW_RANK0), so the other ranks meet each error first: each error
    is still one line, said once, and the job exits 2. On 2 ranks a bad flag twice, then a
    token file every rank reads at start-up; on 4 a bad flag, then a resume of a global batch
    of 2."""
    slow = {"SLOW_RANK0": "0.3"}
    bad_flag = (flags(shakespeare, tmp_path, "--batch-size", "0"), "--batch-size must be")
    if ranks == 2:
        cases = [bad_flag] * 2 + [(flags(truncated_data, tmp_path), "val.bin: header says")]
    else:
        cases = [bad_flag, (["--resume", str(saved_at_global_batch_2)], "global batch")]
    for argv, expected in cases:
        run = mpirun((ranks, [FAULT, *argv]), env=slow)
        assert run.returncode == 2, run.stderr[-2000:]
        assert len(error_lines(run.stderr)) == 1 and expected in run.stderr, run.stderr[-2000:]
        assert "Traceback" not in run.stderr and "rank 0 of" not in run.stderr


@pytest.fixture(scope="module")
def two_ranks_straight(tmp_path_factory, shakespeare):
    """An uninterrupted 2-rank run of 8 steps, saving every step."""
    out = tmp_path_factory.mktemp("straight2")
    run = mpirun((2, [TRAIN, *flags(shakespeare, out), *RANK_STEPS]))
    assert run.returncode == 0, run.stderr[-2000:]
    return out


@pytest.mark.parametrize("rank", [0, 1])
def test_a_rank_killed_mid_save_then_resume_ends_bit_exact(
    shakespeare, two_ranks_straight, tmp_path, rank
):
    """SIGKILL of rank 0 between the two renames of its step-5 save (no checkpoint/ is left,
    only checkpoint.old and checkpoint.new), or of rank 1 while rank 0 writes it: the job
    stops, the folder's checkpoint loads, and --resume on 2 ranks ends byte-identical to an
    uninterrupted 2-rank run."""
    env = {"KILL_RANK": str(rank), "KILL_STEP": "5"}
    run = mpirun((2, [FAULT, *flags(shakespeare, tmp_path), *RANK_STEPS]), env=env)
    assert run.returncode != 0
    if rank == 0:
        assert sorted(d for d in os.listdir(tmp_path) if d.startswith("checkpoint")) == [
            "checkpoint.new",
            "checkpoint.old",
        ]
    assert saved_step(tmp_path) in (4, 5)
    run = mpirun((2, [TRAIN, "--resume", str(tmp_path), "--quiet"]))
    assert run.returncode == 0, run.stderr[-2000:]
    assert saved_step(tmp_path) == 8
    for name in ("model.safetensors", "optimizer.safetensors"):
        a = (two_ranks_straight / "checkpoint" / name).read_bytes()
        assert (tmp_path / "checkpoint" / name).read_bytes() == a, name
    assert [r["step"] for r in _rows(tmp_path)] == list(range(1, 9))


# ----------------------------------------------------------------------------- signals

LONG = ["--steps", "100000"]
STOPPED = re.compile(r"the step-(\d+) checkpoint in (\S+) is kept; continue with: (.+)$")


def training(argv, env=None):
    """A run in the background -> Popen (stderr piped, text)."""
    return subprocess.Popen(
        argv,
        cwd=REPO,
        env={**ENV, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_until(ready, proc):
    deadline = time.monotonic() + 60
    while not ready():
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, "the run made no progress"
        time.sleep(0.02)


def rows_written(out, n):
    return lambda: os.path.isfile(out / "metrics.jsonl") and len(_rows(out)) >= n


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_one_process_at_a_step_boundary_and_saves(shakespeare, tmp_path, sig):
    """Ctrl-C or SIGTERM: the step under way finishes, a checkpoint of it is saved, one line
    says so with the command that resumes, exit 128 + the signal's number."""
    proc = training(
        [sys.executable, TRAIN, *flags(shakespeare, tmp_path, "--save-every", "0", *LONG)]
    )
    wait_until(rows_written(tmp_path, 3), proc)
    proc.send_signal(sig)
    err = proc.communicate(timeout=60)[1]
    assert proc.returncode == 128 + sig, err
    step = saved_step(tmp_path)
    assert err.splitlines() == [
        f"stopped by {sig.name} after step {step} of 100000: the step-{step} checkpoint in "
        f"{tmp_path}/checkpoint is kept; continue with: python examples/train_gpt2.py "
        f"--resume {tmp_path}"
    ]
    assert [r["step"] for r in _rows(tmp_path)] == list(range(1, step + 1))


def test_ctrl_c_to_mpirun_names_the_checkpoint_and_the_resume_command(shakespeare, tmp_path):
    """mpirun passes Ctrl-C on as SIGTERM and kills the ranks 0.25 s later, no longer relaying
    their output: rank 0 says its one line at once, past mpirun, naming a checkpoint that
    loads (a 2-rank resume is the killed-mid-save tests')."""
    pytest.importorskip("mpi4py")
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    argv = [MPIRUN, *root, "--oversubscribe", "-n", "2", sys.executable, TRAIN]
    proc = training([*argv, *flags(shakespeare, tmp_path, *LONG)])
    wait_until(lambda: (checkpoint.checkpoint_step(str(tmp_path)) or 0) >= 2, proc)
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=60)[1]
    (line,) = [line for line in err.splitlines() if "under mpirun" in line]
    assert line.startswith("SIGTERM under mpirun: stopping without a save"), err
    said, folder, command = STOPPED.search(line).groups()
    assert command == f"mpirun -n 2 python examples/train_gpt2.py --resume {tmp_path}"
    step = saved_step(tmp_path)
    assert int(said) in (step - 1, step) and os.path.dirname(folder) == str(tmp_path)


def test_sigterm_to_one_rank_stops_every_rank_at_one_boundary(shakespeare, tmp_path):
    """A signal to rank 1 alone (mpirun is not involved): every rank stops after the same
    step, rank 0 says the one line, the job exits 143."""
    pids = tmp_path / "pids"
    pids.mkdir()
    out = tmp_path / "run"
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    argv = [MPIRUN, *root, "--oversubscribe", "-n", "2", sys.executable, FAULT]
    proc = training(
        [*argv, *flags(shakespeare, out, "--save-every", "2", *LONG)], {"PID_DIR": str(pids)}
    )
    wait_until(rows_written(out, 3), proc)
    os.kill(int((pids / "1.pid").read_text()), signal.SIGTERM)
    err = proc.communicate(timeout=60)[1]
    assert proc.returncode == 143, err[-2000:]
    (line,) = [line for line in err.splitlines() if "under mpirun" in line]
    said = int(STOPPED.search(line).group(1))
    assert said == saved_step(out) and said % 2 == 0
    steps = [r["step"] for r in _rows(out)]
    assert steps == list(range(1, len(steps) + 1)) and said <= len(steps) < said + 2 + 1


# ----------------------------------------------------------------------------- the run folder


def test_the_lock_is_taken_before_the_folder_is_examined(shakespeare, tmp_path, capsys):
    """A run stalls just before it locks its folder, while another run locks it, trains and
    saves: once it holds the lock it sees that run and refuses, one line, and the other run's
    checkpoint and rows are kept."""
    out, real = tmp_path / "run", checkpoint.lock_run_folder

    def stalled(folder):
        checkpoint.lock_run_folder = real  # the other run locks as usual
        Trainer(tiny(shakespeare, out, steps=2)).run()
        return real(folder)

    checkpoint.lock_run_folder = stalled
    try:
        code, err = run_main(flags(shakespeare, out, "--steps", "1"), capsys)
    finally:
        checkpoint.lock_run_folder = real
    assert code == 2 and one_line_error(err), err
    assert f"{out}/ already holds a run at step 2: --resume {out} to continue" in err
    assert saved_step(out) == 2 and [r["step"] for r in _rows(out)] == [1, 2]


def test_a_lock_that_is_a_symbolic_link_is_not_followed(shakespeare, tmp_path, capsys):
    target, out = tmp_path / "target", tmp_path / "run"
    target.write_text("keep")
    out.mkdir()
    os.symlink(target, out / checkpoint.LOCK)
    code, err = run_main(flags(shakespeare, out, "--steps", "1"), capsys)
    assert code == 2 and one_line_error(err) and "choose another --out" in err, err
    assert target.read_text() == "keep" and os.listdir(out) == [checkpoint.LOCK]


# ----------------------------------------------------------------------------- a new user


def test_zero_in_one_process_is_said_in_one_line(shakespeare, tmp_path, capsys):
    """It trains, as PyTorch's ZeroRedundancyOptimizer and DeepSpeed do on one rank, and says
    that one rank keeps the whole 16 bytes per parameter."""
    code, err = run_main(flags(shakespeare, tmp_path, "--zero", "1", "--steps", "1"), capsys)
    assert code == 0 and err.splitlines() == [
        "note: --zero 1 in one process has 1 rank to shard over, so it keeps all 16 bytes per "
        "parameter; under mpirun -n R each rank keeps its 1/R share"
    ]


def test_an_out_whose_name_is_not_utf8_trains_saves_and_plots(shakespeare, tmp_path, capsys):
    from training.plot import run_title

    out = tmp_path / os.fsdecode(b"run\xff")
    code, err = run_main(flags(shakespeare, out, "--steps", "2"), capsys)
    assert code == 0 and err == "", err
    assert saved_step(out) == 2 and (out / "loss.png").is_file()
    assert run_title(str(out)) == f"gpt2-tiny, fp32 — {tmp_path}/run\\udcff/"


def test_the_readmes_training_commands_each_have_a_run_folder_of_their_own():
    """Run one after another, as a new user does, no command of the README that starts a run
    finds the folder of another (the default out/ included) and is refused."""
    with open(os.path.join(REPO, "README.md")) as f:
        commands = [line.split("#")[0].split() for line in f if "examples/train_gpt2.py" in line]
    starts = [c for c in commands if c[0] in ("python", "mpirun", "python3") and "--help" not in c]
    starts = [c for c in starts if "--resume" not in c]
    outs = [c[c.index("--out") + 1] if "--out" in c else "out" for c in starts]
    assert len(starts) >= 5 and len(set(outs)) == len(outs), outs


# ----------------------------------------------------------------------------- memory


@pytest.fixture
def memory_24gb(monkeypatch):
    """24 GB available (the machine of issue 25): nothing is allocated to find out."""
    monkeypatch.setattr(backend.cpu, "available_bytes", lambda: 24 * 10**9)


def test_accounting_of_a_model_that_does_not_fit_is_refused_at_once(memory_24gb, capsys):
    t0 = time.perf_counter()
    with pytest.raises(SystemExit) as exit_info:
        script_main("scripts/report.py")(["--model", "gpt2-xl", "--device", "cpu"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and one_line_error(err), err
    assert "gpt2-xl's training step" in err and "needs about 25.59 GB" in err
    assert "24.00 GB available" in err and time.perf_counter() - t0 < 5


def test_training_a_model_that_does_not_fit_is_refused_before_building_it(
    shakespeare, tmp_path, memory_24gb, capsys
):
    code, err = run_main(flags(shakespeare, tmp_path / "run", "--model", "gpt2-xl"), capsys)
    assert code == 2 and one_line_error(err) and "training gpt2-xl" in err, err
    assert "24.00 GB available" in err and not (tmp_path / "run").exists()


def test_generating_from_a_checkpoint_that_does_not_fit_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(backend.cpu, "available_bytes", lambda: 10**6)
    GPT2(GPT2Config.from_preset("gpt2-tiny")).save_pretrained(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        script_main("examples/generate.py")(
            ["--checkpoint", str(tmp_path), "--max-new-tokens", "9"]
        )
    out, err = capsys.readouterr()
    assert exit_info.value.code == 2 and out == "" and one_line_error(err), err
    assert f"loading {tmp_path} in fp32" in err and "0.00 GB available" in err
