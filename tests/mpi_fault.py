"""examples/train_gpt2.py with one injected fault, for tests/test_distributed.py: rank
FAULT_RANK raises in its optimizer step FAULT_STEP (1-based), as a bug or a bad device would."""

import os
import sys

from training import cli, loop

FAULT_RANK, FAULT_STEP = int(os.environ["FAULT_RANK"]), int(os.environ["FAULT_STEP"])
_train_step = loop.Trainer.train_step


def train_step(self):
    if self.comm.rank == FAULT_RANK and self.step + 1 == FAULT_STEP:
        raise RuntimeError(f"injected fault in step {FAULT_STEP}")
    return _train_step(self)


loop.Trainer.train_step = train_step
cli.main(sys.argv[1:])
