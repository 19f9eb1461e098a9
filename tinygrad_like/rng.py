"""The generator dropout draws its masks' seeds from: one stream for the whole process, apart
from the models' initial weights (GPT2's own seed). Its own module so that autograd's
recomputation can rewind it without importing the ops."""

import numpy as np

_generator = np.random.default_rng(0)


def manual_seed(seed):
    """Seed the generator dropout draws its masks from (model init has its own seed)."""
    global _generator
    _generator = np.random.default_rng(seed)


def get_rng_state():
    """The generator's state as JSON-friendly data (for checkpoints)."""
    return _generator.bit_generator.state


def set_rng_state(state):
    _generator.bit_generator.state = state


def next_seed():
    """The seed of the next dropout mask: one draw from the stream."""
    return int(_generator.integers(2**63))
