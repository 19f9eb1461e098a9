"""examples/train_gpt2.py with one injected fault, for tests/test_distributed.py and
tests/test_faults.py, chosen by the environment:
    FAULT_RANK, FAULT_STEP   rank FAULT_RANK raises in its optimizer step FAULT_STEP (1-based),
                             as a bug or a bad device would
    KILL_RANK, KILL_STEP     rank KILL_RANK is SIGKILLed in the save of step KILL_STEP: rank 0
                             (the writer) between the two renames that swap the checkpoints in,
                             another rank while rank 0 writes
    SLOW_RANK0=SECONDS       rank 0 starts that late, as on a busy machine: the other ranks meet
                             any error first
    PID_DIR=FOLDER           each rank writes its pid to FOLDER/RANK.pid (to signal one rank)"""

import os
import signal
import sys
import time

from training import cli, loop

_env = os.environ.get
_train_step, _save, _rename = loop.Trainer.train_step, loop.Trainer.save, os.rename


def train_step(self):
    if self.comm.rank == int(_env("FAULT_RANK", -1)) and self.step + 1 == int(_env("FAULT_STEP")):
        raise RuntimeError(f"injected fault in step {_env('FAULT_STEP')}")
    return _train_step(self)


def save(self):
    if self.comm.rank != int(_env("KILL_RANK", -1)) or self.step != int(_env("KILL_STEP")):
        return _save(self)
    if self.rank0:
        os.rename = rename_then_die  # this process's last save
        return _save(self)
    time.sleep(0.05)  # rank 0 is writing by now
    os.kill(os.getpid(), signal.SIGKILL)


def rename_then_die(src, dst):
    """The first rename of the swap (checkpoint -> checkpoint.old), then SIGKILL: the folder
    holds checkpoint.old and checkpoint.new, and no checkpoint/."""
    _rename(src, dst)
    os.kill(os.getpid(), signal.SIGKILL)


if _env("PID_DIR"):
    with open(os.path.join(_env("PID_DIR"), f"{_env('OMPI_COMM_WORLD_RANK')}.pid"), "w") as f:
        f.write(str(os.getpid()))
if _env("OMPI_COMM_WORLD_RANK") == "0":
    time.sleep(float(_env("SLOW_RANK0", 0)))
loop.Trainer.train_step, loop.Trainer.save = train_step, save
cli.main(sys.argv[1:])
