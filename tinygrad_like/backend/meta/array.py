"""MetaArray: an array of the meta device, a shape, a dtype and strides with no data behind
them; and the array functions (broadcast_to, split) that code which allocates views on a
device calls through `backend.of(a).xp`.

A view (reshape, transpose, basic indexing, broadcast_to, split) has NumPy's shape, strides,
base and byte offset within its base: NumPy computes them on a stand-in, a view of the same
shape and strides over one element of memory, which it never reads (a view moves no data). So
functions._can_view, the kernels' byte counts, the memory tracker (which follows .base to the
buffer behind a view) and a captured step's fusions (which ask whether two views of one buffer
overlap) see a meta array exactly as they see the NumPy array it stands for.

Anything that needs the values (np.asarray, float(), bool(), comparisons, .item()) raises
NoValues: the meta device counts a step, it cannot say what the step computed.
"""

import math

import numpy as np


class NoValues(RuntimeError):
    """A value was asked of the meta device, which holds shapes only."""

    def __init__(self, what):
        super().__init__(
            f"the meta device holds shapes, not values: {what} needs the values (loss values, "
            "gradient norms, token files and the fp16 overflow skip are not available on meta)"
        )


def c_strides(shape, itemsize):
    """The strides of a C-contiguous array of shape (NumPy's: 0-size and 1-long axes alike)."""
    strides, step = [], itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


class MetaArray:
    """shape, dtype and strides; base: the array whose memory a view would share (None for an
    array that owns its memory), as NumPy's .base; known: the values of a small integer array
    made from host data (a KV cache's positions), which decide the work of the kernels that
    read them as shapes do, else None; offset: a view's first byte within its base."""

    __slots__ = ("shape", "dtype", "strides", "base", "known", "offset", "__weakref__")

    def __init__(self, shape, dtype, strides=None, base=None, known=None, offset=0):
        self.shape = tuple(int(n) for n in shape)
        if any(n < 0 for n in self.shape):
            raise ValueError(f"negative dimensions are not allowed: {self.shape}")
        self.dtype = np.dtype(dtype)
        self.strides = c_strides(self.shape, self.dtype.itemsize) if strides is None else strides
        self.base, self.known, self.offset = base, known, offset

    # ---- facts
    @property
    def ndim(self):
        return len(self.shape)

    @property
    def size(self):
        return math.prod(self.shape)

    @property
    def itemsize(self):
        return self.dtype.itemsize

    @property
    def nbytes(self):
        return self.size * self.dtype.itemsize

    @property
    def flags(self):
        """NumPy's flags for these strides (c_contiguous, ...), read off the stand-in."""
        return self._stand_in().flags

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of a 0-d array")
        return self.shape[0]

    def __repr__(self):
        return f"MetaArray(shape={self.shape}, dtype={self.dtype})"

    # ---- views: NumPy's, computed on the stand-in
    def _stand_in(self):
        one = np.empty(1, self.dtype)
        return np.lib.stride_tricks.as_strided(one, self.shape, self.strides)

    def _views(self, make):
        """The MetaArrays for the views make(stand-in) returns (a list of NumPy views)."""
        stand_in = self._stand_in()
        start = stand_in.__array_interface__["data"][0]
        owner = self if self.base is None else self.base
        return [
            MetaArray(
                v.shape,
                self.dtype,
                v.strides,
                owner,
                offset=self.offset + v.__array_interface__["data"][0] - start,
            )
            for v in make(stand_in)
        ]

    def _view(self, make):
        """The MetaArray for the view make(stand-in) returns."""
        return self._views(lambda s: [make(s)])[0]

    def reshape(self, *shape):
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        try:
            return self._view(lambda s: np.reshape(s, shape, copy=False))
        except ValueError:  # NumPy would copy: a new buffer of the new shape
            contiguous = np.lib.stride_tricks.as_strided(
                np.empty(1, self.dtype), self.shape, c_strides(self.shape, self.itemsize)
            )
            return MetaArray(contiguous.reshape(shape).shape, self.dtype)

    def transpose(self, *axes):
        axes = axes[0] if len(axes) == 1 and isinstance(axes[0], (tuple, list)) else axes
        return self._view(lambda s: s.transpose(*axes))

    @property
    def T(self):
        return self.transpose()

    def swapaxes(self, a, b):
        return self._view(lambda s: s.swapaxes(a, b))

    def __getitem__(self, index):
        items = index if isinstance(index, tuple) else (index,)
        basic = (int, np.integer, slice, type(None), type(Ellipsis))
        if not all(isinstance(i, basic) for i in items):
            raise TypeError(
                f"a meta array takes basic indexes only (ints, slices, None, ...), got {index!r}"
            )
        if not any(i is Ellipsis for i in items):  # so that NumPy returns a view, never a scalar
            items = items + (Ellipsis,)
        return self._view(lambda s: s[items])

    # ---- values: none
    def __array__(self, *args, **kwargs):
        raise NoValues("converting a meta array to NumPy")

    def item(self, *args):
        raise NoValues("item()")

    def tolist(self):
        raise NoValues("tolist()")

    def __float__(self):
        raise NoValues("float()")

    def __int__(self):
        raise NoValues("int()")

    def __bool__(self):
        raise NoValues("a truth value")

    def _compare(self, other):
        raise NoValues("a comparison")

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = _compare
    __hash__ = object.__hash__

    def min(self, *args, **kwargs):
        raise NoValues("min()")

    def max(self, *args, **kwargs):
        raise NoValues("max()")


# ---------------------------------------------------------------- the xp namespace


def broadcast_to(a, shape):
    return a._view(lambda s: np.broadcast_to(s, shape))


def split(a, indices_or_sections, axis=0):
    return a._views(lambda s: np.split(s, indices_or_sections, axis=axis))
