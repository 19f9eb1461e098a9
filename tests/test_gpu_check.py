"""scripts/gpu_check.sh without a GPU: the PARTS filter (a dry run lists what would run) and the
trainer runs it starts, whose sequence lengths must fit their model's context (the nccl part
asked gpt2-tiny for 128 positions of its 64 and stopped before NCCL was reached)."""

import os
import re
import subprocess
from pathlib import Path

import pytest

from nn.config import PRESETS

SCRIPT = Path(__file__).parents[1] / "scripts" / "gpu_check.sh"


def dry_run(tmp_path, parts):
    env = {**os.environ, "GPU_CHECK_DRY_RUN": "1", "OUT": str(tmp_path)}
    env.pop("PARTS", None)
    if parts is not None:
        env["PARTS"] = parts
    return subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True)


GATES = ["setup", "versions", "gpu", "headers"]


@pytest.mark.parametrize(
    "parts,want",
    [
        ("nccl,train", GATES + ["train-bf16", "nccl"]),
        ("pytest", GATES + ["pytest-kernels", "pytest-rest"]),
        ("mlp-block", GATES + ["mlp-block"]),
        ("graph", GATES + ["graph", "graph-train"]),
        ("gpu", GATES),
        (
            None,
            GATES
            + ["compile", "pytest-kernels", "pytest-rest", "bench-kernels", "bench-torch"]
            + ["train-bf16", "nccl", "mlp-block", "graph", "graph-train"],
        ),
    ],
)
def test_parts_select_what_runs(tmp_path, parts, want):
    done = dry_run(tmp_path, parts)
    assert done.returncode == 0, done.stderr
    ran = re.findall(r"^===== \[([\w@/.-]+)\] would run", done.stdout, re.M)
    assert ran == want
    summary = done.stdout.split("===== summary", 1)[1]
    assert re.findall(r"^(\S+)\s+passed$", summary, re.M) == want
    assert ("the other parts did not run" in summary) == (parts is not None)


def test_an_unknown_part_stops_before_anything_runs(tmp_path):
    done = dry_run(tmp_path, "nccl,trian")
    assert done.returncode == 2
    assert done.stderr.startswith("error: PARTS: no part is called 'trian'")
    assert "would run" not in done.stdout


def trainer_runs(text):
    """The examples/train_gpt2.py command lines of a shell script, continuations joined."""
    joined = text.replace("\\\n", " ")
    lines = [line for line in joined.splitlines() if not line.lstrip().startswith("#")]
    return [line for line in lines if "examples/train_gpt2.py" in line]


def test_every_trainer_run_fits_its_models_context():
    runs = trainer_runs(SCRIPT.read_text())
    assert len(runs) == 2  # train-bf16 and nccl
    for line in runs:
        model = re.search(r"--model (\S+)", line)[1]
        seq_len = int(re.search(r"--seq-len (\d+)", line)[1])
        PRESETS[model].check_context(seq_len)  # the trainer's own check
