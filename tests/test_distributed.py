"""Data-parallel training on 2 CPU ranks under the PyPI Open MPI (the [dist] extra), against
the same global batch on 1 process: the losses and final weights agree for ZeRO-0/1/2 in fp32
and bf16, the per-rank memory and the bytes sent per step are what the formulas say, a run
saved on 2 ranks resumes on 1, a failing rank stops the job, and ranks that disagree are
refused. Each mpirun takes a few seconds."""

import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

from accounting.predictions import predicted_collectives, predicted_state_bytes
from nn.hf import read_state
from optim import AdamW
from tinygrad_like.distributed import Communicator, sent_bytes
from training import checkpoint

pytest.importorskip("mpi4py", reason="the [dist] extra: pip install -e '.[test,dist]'")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MPIRUN = os.path.join(os.path.dirname(sys.executable), "mpirun")
STEPS = 10
# bf16: each rank rounds its half of a gradient sum to bf16 and the all-reduce rounds their sum
# again, where one process rounds the whole sum once: about 1 bf16 ulp (2^-8) on a few
# gradient elements per step, which moves the losses by up to ~3e-5 over 10 steps
RTOL = {"fp32": 1e-5, "bf16": 1e-4}


def mpirun(ranks, args, out, data, script="examples/train_gpt2.py", env=None, timeout=120):
    """Run the training command on `ranks` processes -> CompletedProcess (text)."""
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    cmd = [
        MPIRUN,
        *root,
        "--oversubscribe",
        "-n",
        str(ranks),
        sys.executable,
        script,
        *train_args(out, data),
        *args,
    ]
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def single(args, out, data):
    cmd = [sys.executable, "examples/train_gpt2.py", *train_args(out, data), *args]
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def train_args(out, data):
    return [
        "--model",
        "gpt2-tiny",
        "--data-dir",
        data,
        "--out",
        str(out),
        "--device",
        "cpu",
        "--seq-len",
        "32",
        "--steps",
        str(STEPS),
        "--lr",
        "5e-3",
        "--min-lr",
        "5e-4",
        "--warmup",
        "2",
        "--eval-every",
        "5",
        "--eval-iters",
        "2",
        "--no-report",
    ]


def ok(run):
    assert run.returncode == 0, run.stderr[-3000:]
    return run


def losses(out, key="loss"):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [row[key] for row in map(json.loads, f) if key in row]


def assert_close(a, b, rtol=1e-5):
    np.testing.assert_allclose(
        np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=rtol, atol=0
    )


@pytest.fixture(scope="module")
def one_process(tmp_path_factory, shakespeare):
    """The reference: 1 process at --batch-size 8, fp32 and bf16 -> dtype -> run folder."""
    runs = {}
    for dtype in ("fp32", "bf16"):
        out = tmp_path_factory.mktemp(f"one_{dtype}")
        ok(single(["--batch-size", "8", "--dtype", dtype, "--quiet"], out, shakespeare))
        runs[dtype] = out
    return runs


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("zero", [0, 1, 2])
def test_two_ranks_train_what_one_process_trains(one_process, shakespeare, tmp_path, zero, dtype):
    """2 ranks x B = 4 are 1 process x B = 8: the same sequences, the same losses (train and
    the split validation) and the same final weights, to 1e-5."""
    run = ok(
        mpirun(
            2, ["--batch-size", "4", "--dtype", dtype, "--zero", str(zero)], tmp_path, shakespeare
        )
    )
    ref = one_process[dtype]
    rtol = RTOL[dtype]
    assert_close(losses(tmp_path), losses(ref), rtol)
    assert_close(losses(tmp_path, "val_loss"), losses(ref, "val_loss"), rtol)
    assert len(losses(tmp_path)) == STEPS
    assert_same_weights(read_state(tmp_path / "checkpoint"), read_state(ref / "checkpoint"), dtype)
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert {(r["world_size"], r["zero"]) for r in rows} == {(2, zero)}
    check_memory_table(run.stdout, dtype, zero)
    check_communication_table(run.stdout, dtype, zero)


def test_two_compiled_ranks_are_the_eager_ranks_bit_for_bit(shakespeare, tmp_path):
    """--compile under mpirun with ZeRO-2: each rank captures its training step on the first two
    steps and replays it after, its collectives replayed as the host calls they are; every
    metric (timing aside) and the saved weights equal the eager ranks' bit for bit."""
    runs = []
    for flag in ([], ["--compile"]):
        out = tmp_path / ("compiled" if flag else "eager")
        ok(mpirun(2, ["--batch-size", "4", "--zero", "2", "--quiet", *flag], out, shakespeare))
        rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
        timing = ("ms", "tokens_per_s", "mfu")
        runs.append(
            (
                [{k: v for k, v in r.items() if k not in timing} for r in rows],
                (out / "checkpoint" / "model.safetensors").read_bytes(),
            )
        )
    assert len(runs[0][0]) == STEPS and runs[0] == runs[1]


def assert_same_weights(mine, theirs, dtype):
    """fp32: every tensor to 1e-5 in norm, but the key third of each c_attn.bias: adding a
    constant to every key of a row shifts all its scores equally, which softmax ignores, so
    that bias's gradient is zero in exact arithmetic and rounding noise in fp32, and AdamW
    divides the noise by its own size into steps of about lr in either direction.
    bf16: the rounding of the gradient sums (RTOL) moves AdamW's steps by up to an ulp, so the
    weights are compared as a whole, to one bf16 ulp (2^-8) of their norm."""
    diff = {}
    for name, w in theirs.items():
        parts = (
            zip("qkv", np.split(w, 3), np.split(mine[name], 3))
            if name.endswith("c_attn.bias")
            else [("", w, mine[name])]
        )
        diff.update({name + part: (a, b) for part, a, b in parts if part != "k"})
    if dtype == "bf16":
        num = sum(np.sum((b - a) ** 2) for a, b in diff.values())
        assert np.sqrt(num / sum(np.sum(a**2) for a, _ in diff.values())) <= 2**-8
        return
    worst = {k: np.linalg.norm(b - a) / np.linalg.norm(a) for k, (a, b) in diff.items()}
    name = max(worst, key=worst.get)
    assert worst[name] <= RTOL[dtype], f"{name}: relative difference {worst[name]:.3g}"


def table_rows(text, title):
    """{first column: [other columns]} of the table after the line starting with title."""
    lines = text[text.index(title) :].splitlines()[2:]
    rows = {}
    for line in lines:
        cells = re.split(r"\s{2,}", line.strip())
        if not line.startswith("  ") or len(cells) < 3:
            break
        rows[cells[0]] = cells[1:]
    return rows


def check_memory_table(stdout, dtype, zero):
    """Each consumer's measured bytes = its predicted bytes per element x the flat buffers'
    elements (N plus the padded vocabulary's zero rows: hence 12.01, not 12.00, over N)."""
    rows = table_rows(stdout, "-- persistent training memory")
    n = int(re.search(r"for N = ([\d,]+)", stdout).group(1).replace(",", ""))
    extra = re.search(r"hold ([\d,]+) elements more", stdout)
    elements = n + (int(extra.group(1).replace(",", "")) if extra else 0)
    pred = predicted_state_bytes(dtype, zero, 2)
    names = {
        "weights": "weights",
        "gradients": "gradients",
        "master": "master",
        "adam_m": "adam m",
        "adam_v": "adam v",
    }
    for tag, label in names.items():
        (cells,) = [c for k, c in rows.items() if k.startswith(label)]
        assert float(cells[0]) == pred[tag]
        assert int(cells[1].replace(",", "")) == pred[tag] * elements, label
    total = float(rows["total"][0])
    assert total == {("fp32", 1): 12, ("bf16", 2): 9}.get((dtype, zero), total)
    assert "measured the same on every rank" in stdout


def check_communication_table(stdout, dtype, zero):
    """Bytes sent per step, measured from the collectives that ran, equal the ring formula
    on the buffers' sizes, exactly."""
    rows = table_rows(stdout, "-- communication per step")
    numel = int(rows[next(k for k in rows if k.endswith("gradients"))][0].replace(",", "")) // (
        4 if dtype == "fp32" else 2
    )
    expected = predicted_collectives(numel, dtype, zero, 2)
    assert [f"{n} {w}" for n, w, _ in expected] == [k for k in rows if k != "total"]
    for name, what, nbytes in expected:
        predicted, measured = rows[f"{name} {what}"][1:3]
        assert predicted == measured == f"{sent_bytes(name, nbytes, 2):,.0f}"
    total = sum(sent_bytes(name, nbytes, 2) for name, _, nbytes in expected)
    assert rows["total"][0] == rows["total"][1] == f"{total:,.0f}"


def test_saved_on_two_ranks_resumes_on_one(one_process, shakespeare, tmp_path):
    """A run killed at step 7 by one rank's error: the job stops within 30 s naming the rank,
    the step-5 checkpoint loads, and resumed on 1 process it finishes with the losses of the
    uninterrupted 1-process run."""
    t0 = time.monotonic()
    run = mpirun(
        2,
        ["--batch-size", "4", "--zero", "1", "--save-every", "5"],
        tmp_path,
        shakespeare,
        script="tests/mpi_fault.py",
        env={"FAULT_RANK": "1", "FAULT_STEP": "7"},
    )
    assert run.returncode != 0
    assert time.monotonic() - t0 < 30
    assert "error: rank 1 of 2: RuntimeError: injected fault in step 7" in run.stderr
    state, arrays = checkpoint.load_trainer_state(str(tmp_path / "checkpoint"))
    assert state["step"] == 5 and state["world_size"] == 2 and arrays
    ok(single(["--resume", str(tmp_path), "--quiet"], tmp_path, shakespeare))
    assert_close(losses(tmp_path), losses(one_process["fp32"]))


def test_ranks_that_disagree_are_refused(shakespeare, tmp_path):
    """One rank with another --seed: refused at start-up, exit 2, one line from rank 0."""
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    base = [sys.executable, "examples/train_gpt2.py", *train_args(tmp_path, shakespeare)]
    cmd = [
        MPIRUN,
        *root,
        "--oversubscribe",
        "-n",
        "1",
        *base,
        "--seed",
        "1",
        ":",
        "-n",
        "1",
        *base,
        "--seed",
        "2",
    ]
    run = subprocess.run(
        cmd,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OPENBLAS_NUM_THREADS": "1"},
    )
    assert run.returncode == 2, run.stderr[-2000:]
    assert run.stderr.count("error: rank 1 runs with --seed 2 where rank 0 has 1") == 1


def test_sharded_adamw_in_one_process_is_plain_adamw():
    """ZeRO-1 and ZeRO-2 over a world of one (every collective the identity) step exactly as
    the unsharded optimizer: the sharding code path is the same arithmetic."""
    from nn.flat import flatten_parameters
    from nn.module import Parameter

    shapes = [(5, 3), (7,), (2, 4)]
    results = []
    for zero in (0, 1, 2):
        rng = np.random.default_rng(0)
        params = [Parameter(rng.standard_normal(s).astype(np.float32)) for s in shapes]
        flatten_parameters(params)
        opt = AdamW(params, lr=1e-2, grad_clip=1.0, comm=Communicator(), zero=zero)
        for step in range(3):
            opt.zero_grad()
            for p in params:
                p.grad.data[...] = np.sin(p.data * (step + 1))
            opt.step()
        results.append(np.concatenate([p.data.reshape(-1) for p in params]))
    np.testing.assert_array_equal(results[0], results[1])
    np.testing.assert_array_equal(results[0], results[2])
