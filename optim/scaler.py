"""Dynamic loss scaling for fp16 (GradScaler semantics).

fp16 has 5 exponent bits: gradients below ~6e-8 flush to zero and values above 65,504
overflow. Multiplying the loss by S before backward lifts small gradients into range; the
optimizer divides by S again. An inf/nan anywhere means S was too large: skip the step and
halve S. After growth_interval good steps in a row, try doubling S.

A run whose overflows never stop halves S without end; below MIN_SCALE nothing can recover:
there even a loss gradient of 1 times S is under fp16's smallest subnormal (2^-24), so every
scaled gradient would flush to zero. The trainer stops there (training/loop.py), or after too
many skipped steps in a row (skips_in_a_row), whichever comes first.
"""

import numpy as np

from tinygrad_like import Tensor, backend, dtypes, kernels

MIN_SCALE = 2.0**-24


class LossScaler:
    def __init__(
        self,
        init_scale=2.0**16,
        growth_factor=2.0,
        backoff_factor=0.5,
        growth_interval=2000,
        dynamic=True,
    ):
        if init_scale <= 0:
            raise ValueError(f"loss scale must be positive, got {init_scale}")
        self.scale = float(init_scale)
        self._on_device = None  # S where the step's kernels read it (scale_loss)
        self.growth_factor, self.backoff_factor = growth_factor, backoff_factor
        self.growth_interval, self.dynamic = growth_interval, dynamic
        self.good_steps = 0
        self.skipped_steps = 0
        self.skips_in_a_row = 0

    def scale_loss(self, loss):
        """loss * S, the tensor to call backward() on. S is a (,) fp32 array on loss's device,
        written by a host call (which a captured step's replay runs again) before the step's
        launches: S changes between steps, and a CUDA graph of the step reads each step's."""
        be = backend.of(loss.data)
        if self._on_device is None or backend.of(self._on_device) is not be:
            self._on_device = be.empty((), dtypes.float32)
        kernels.on_host(self._write_scale, self._on_device)
        return loss * Tensor(self._on_device)

    def _write_scale(self, buffer):
        if backend.of(buffer).HOLDS_VALUES:
            buffer[...] = backend.of(buffer).asarray(np.float32(self.scale))

    def update(self, overflow: bool):
        if overflow:
            self.skipped_steps += 1
        self.skips_in_a_row = self.skips_in_a_row + 1 if overflow else 0
        if not self.dynamic:
            return
        if overflow:
            self.scale *= self.backoff_factor
            self.good_steps = 0
        else:
            self.good_steps += 1
            if self.good_steps == self.growth_interval:
                self.scale *= self.growth_factor
                self.good_steps = 0

    def state_dict(self):
        return {
            "scale": self.scale,
            "good_steps": self.good_steps,
            "skipped_steps": self.skipped_steps,
            "skips_in_a_row": self.skips_in_a_row,
            "growth_factor": self.growth_factor,
            "backoff_factor": self.backoff_factor,
            "growth_interval": self.growth_interval,
            "dynamic": self.dynamic,
        }

    def load_state_dict(self, state):
        for key, value in state.items():
            setattr(self, key, value)
