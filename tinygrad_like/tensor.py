"""Tensor: an array (NumPy on the CPU, CuPy on a GPU), its dtype and device, and its gradient.

Its operators and methods (x + y, x.sum(), x.reshape(...), x.to(dtype), ...) are the functional
API's functions of the same names (functional.py sets them on Tensor), each one differentiable
op that launches kernels and, with grad enabled, appends a record to the tape; this module needs
no op.
"""

import functools

import numpy as np

from . import autograd, backend, dtypes


class Tensor:
    def __init__(self, data, requires_grad=False, dtype=None, device=None):
        if dtype is None and device is None and not requires_grad and isinstance(data, np.ndarray):
            self.data, self.requires_grad, self.grad = data, False, None  # the common case
            self._record, self._out_index = None, 0
            return
        if isinstance(data, Tensor):
            data = data.data
        be = backend.get(device) if device is not None else None
        if be is None:
            be = (
                backend.of(data)
                if backend.is_array(data)
                else backend.get(backend.default_device())
            )
        if dtype is None and not hasattr(data, "dtype"):
            # Python lists and scalars: floats become fp32 and ints int64, as in PyTorch
            data = np.asarray(data)
            dtype = dtypes.float32 if data.dtype.kind == "f" else data.dtype
        if backend.of(data) is not be:
            data = be.asarray(backend.of(data).to_numpy(data))
        self.data = data if dtype is None else be.asarray(data, dtype=dtypes.as_dtype(dtype))
        if requires_grad and not dtypes.is_float(self.data.dtype):
            raise TypeError(
                f"only floating-point tensors can require gradients, got "
                f"{self.data.dtype}: cast first, e.g. Tensor(x, dtype='fp32')"
            )
        self.requires_grad = requires_grad
        self.grad = None
        self._record = None  # the tape record that produced this tensor (None: a leaf)
        self._out_index = 0

    # ---- facts
    @property
    def shape(self):
        return tuple(self.data.shape)

    @property
    def dtype(self):
        return self.data.dtype

    @property
    def device(self):
        return backend.of(self.data).name

    @property
    def ndim(self):
        return self.data.ndim

    def numel(self):
        return int(self.data.size)

    @property
    def nbytes(self):
        return int(self.data.nbytes)

    def __len__(self):
        return self.shape[0]

    def __repr__(self):
        grad = ", requires_grad=True" if self.requires_grad else ""
        return (
            f"Tensor(shape={self.shape}, dtype={dtypes.name(self.dtype)}, "
            f"device={self.device}{grad})"
        )

    def numpy(self) -> np.ndarray:
        return backend.of(self.data).to_numpy(self.data)

    def item(self):
        return self.numpy().item()

    def detach(self):
        return Tensor(self.data)

    def is_leaf(self):
        return self._record is None

    # ---- autograd
    def backward(self, grad=None):
        """Accumulate d(self)/d(leaf) into every leaf's .grad, walking the tape in reverse."""
        if not self.requires_grad:
            raise RuntimeError(
                "backward() on a tensor that does not require grad: no input "
                "of the computation had requires_grad=True (or it ran under "
                "no_grad())"
            )
        if grad is None:
            if self.numel() != 1:
                raise RuntimeError(
                    f"backward() on a non-scalar tensor of shape {self.shape} "
                    "needs a gradient: call .backward(grad) with an array of "
                    "that shape, or reduce to a scalar first (e.g. .sum())"
                )
            grad = _ones(backend.of(self.data), self.shape, self.dtype)
        else:
            grad = (
                grad.data
                if isinstance(grad, Tensor)
                else backend.of(self.data).asarray(grad, dtype=self.dtype)
            )
            if tuple(grad.shape) != self.shape:
                raise ValueError(
                    f"backward(grad): grad has shape {tuple(grad.shape)} but the "
                    f"tensor has shape {self.shape}"
                )
        autograd.backward(self, grad)


@functools.lru_cache(maxsize=None)
def _ones(be, shape, dtype):
    """A one-element 1 of shape and dtype on be's device: backward()'s seed for a scalar, the
    same array at every call (a captured training step's kernels read it as a constant; none
    writes it)."""
    return be.asarray(np.ones(shape, dtype=dtype))


autograd.Tensor = Tensor  # Function.apply wraps results without importing this module
