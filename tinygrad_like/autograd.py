"""Function (a forward/backward pair) and the Tape (a Wengert list of the ops that ran).

Running a Function with grad enabled appends one Record to the tape: the op, an edge to each
input's producer (the record that made it, or the leaf tensor itself), and the arrays backward
needs (the saved tensors). loss.backward() walks the records that lead to the loss in reverse
order of execution, calls each backward, sums the gradients flowing into each tensor, and drops
each record's saved arrays as soon as its backward has run.

The tape holds records weakly: a record lives as long as a tensor it produced (or a record
downstream of it) is alive, so a forward pass that nobody calls backward on frees itself.
"""

import contextlib
import itertools
import weakref

from . import backend, kernels, profiler, rng
from .memory import TRACKER

_grad_enabled = [True]
Tensor = None  # tensor.py imports this module, then binds its Tensor class here


def is_grad_enabled() -> bool:
    return _grad_enabled[-1]


@contextlib.contextmanager
def _grad_mode(enabled):
    _grad_enabled.append(enabled)
    try:
        yield
    finally:
        _grad_enabled.pop()


def no_grad():
    """with no_grad(): ops record nothing (inference, evaluation, optimizer updates)."""
    return _grad_mode(False)


def enable_grad():
    return _grad_mode(True)


_scope = [""]


class scope:
    """with scope(name): name the module that is running, so tape records can be totalled per
    layer. A plain class, not a generator context manager: it runs once per module call."""

    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name

    def __enter__(self):
        _scope.append(self.name)

    def __exit__(self, *exc):
        _scope.pop()


class Context:
    """What a Function's forward leaves for its backward."""

    def __init__(self):
        self.saved = ()
        self.needs_input_grad = ()  # per input: whether a gradient flows to it (set by apply)

    def save_for_backward(self, *arrays):
        self.saved = arrays


class Function:
    """One differentiable op: forward(ctx, *arrays, **kw) -> array(s), backward(ctx, *grads)
    -> one gradient (or None) per array input. Both call kernels through kernels.launch."""

    @staticmethod
    def forward(ctx, *args, **kwargs):
        raise NotImplementedError

    @staticmethod
    def backward(ctx, *grads):
        raise NotImplementedError

    @classmethod
    def apply(cls, *inputs, **kwargs):
        needs_grad = _grad_enabled[-1] and any(
            isinstance(x, Tensor) and x.requires_grad for x in inputs
        )
        args = [x.data if isinstance(x, Tensor) else x for x in inputs]
        ctx = Context()
        if not needs_grad:  # inference: no record, no counting
            out = cls.forward(ctx, *args, **kwargs)
            return tuple(map(Tensor, out)) if isinstance(out, tuple) else Tensor(out)
        record = Record(cls, inputs)
        ctx.needs_input_grad = tuple(e is not None for e in record.edges)  # PyTorch's name
        with kernels.sink_to(record):
            out = cls.forward(ctx, *args, **kwargs)
        outs = out if isinstance(out, tuple) else (out,)
        results = tuple(Tensor(o, requires_grad=True) for o in outs)
        record.finish(ctx, results)
        return results if isinstance(out, tuple) else results[0]


class Record:
    """One entry of the tape."""

    def __init__(self, fn, inputs):
        self.seq = next(_SEQ)
        self.fn = fn
        self.op = getattr(fn, "name", fn.__name__.lower())
        self.scope = _scope[-1]
        tensors = [x for x in inputs if isinstance(x, Tensor)]
        self.inputs = [(t.shape, t.dtype) for t in tensors]
        # one edge per positional input: the producing record and output index, the leaf
        # tensor itself, or None when no gradient flows there (constants, ints, no-grad tensors)
        self.edges = [_edge(x) if isinstance(x, Tensor) else None for x in inputs]
        self.fwd_flops = self.bwd_flops = self.fwd_bytes = self.bwd_bytes = 0
        self.fwd_launches = self.bwd_launches = 0
        self._in_backward = False
        self.freed = False
        # made while another record's backward runs (a checkpoint's recomputed forward): its
        # launches are that backward's work too, so the outer tape's counts stay complete
        self.parent = _running[-1] if _running else None

    def add(self, flops, nbytes):  # kernels.launch reports here while this record runs
        if self._in_backward:
            self.bwd_flops += flops
            self.bwd_bytes += nbytes
            self.bwd_launches += 1
        else:
            self.fwd_flops += flops
            self.fwd_bytes += nbytes
            self.fwd_launches += 1
        if self.parent is not None:
            self.parent.add(flops, nbytes)

    def finish(self, ctx, outputs):
        self.ctx = ctx
        self.outputs = [(t.shape, t.dtype) for t in outputs]
        for i, t in enumerate(outputs):
            t._record, t._out_index = self, i
        self.saved_bytes = TRACKER.save_for_backward(ctx.saved)
        # a record that dies without a backward (its outputs dropped) releases its saved arrays
        self._release = weakref.finalize(self, TRACKER.release_saved, ctx.saved)
        TAPE.append(self)

    def run_backward(self, grads):
        if self.freed:
            raise RuntimeError(
                f"backward() through a freed tape: the saved tensors of '{self.op}' were "
                "released by an earlier backward(). Run the forward pass again before calling "
                "backward() a second time."
            )
        self._in_backward = True
        _running.append(self)
        try:
            with kernels.sink_to(self):
                in_grads = self.fn.backward(self.ctx, *grads)
        finally:
            _running.pop()
        self.free()
        return in_grads if isinstance(in_grads, tuple) else (in_grads,)

    def free(self):
        if not self.freed:
            self._release()
            self.ctx.saved = ()
            self.freed = True

    def as_dict(self):
        return {
            "seq": self.seq,
            "op": self.op,
            "scope": self.scope,
            "inputs": [[list(s), str(d)] for s, d in self.inputs],
            "outputs": [[list(s), str(d)] for s, d in self.outputs],
            "fwd_flops": self.fwd_flops,
            "bwd_flops": self.bwd_flops,
            "fwd_launches": self.fwd_launches,
            "bwd_launches": self.bwd_launches,
            "saved_bytes": self.saved_bytes,
        }


_SEQ = itertools.count()
_running = []  # the records whose backward is running now, innermost last


def _edge(t):
    if not t.requires_grad:
        return None
    return (t._record, t._out_index) if t._record is not None else t


class Tape:
    """The Wengert list: every live record in the order the ops ran."""

    def __init__(self):
        self._records = weakref.WeakValueDictionary()

    def append(self, record):
        self._records[record.seq] = record

    def position(self) -> int:
        """A bookmark: records(since=tape.position()) lists what runs after this point."""
        return next(_SEQ)

    def records(self, since=0):
        return [self._records[k] for k in sorted(self._records.keys()) if k >= since]

    def listing(self, since=0):
        """The tape as data: one dict per record."""
        return [r.as_dict() for r in self.records(since)]


TAPE = Tape()


def backward(tensor, grad):
    """Reverse-mode sweep from tensor (with upstream gradient array grad) to the leaves."""
    root = tensor._record
    if root is None:  # a leaf: its gradient is the upstream gradient
        _accumulate_leaf(tensor, grad)
        return
    if root.freed:
        root.run_backward(())  # raises the freed-tape error
    grads = {(root, tensor._out_index): grad}
    with profiler.phase("backward"):
        for record in _reachable_in_reverse(root):
            outs = [grads.pop((record, i), None) for i in range(len(record.outputs))]
            if all(g is None for g in outs):  # on the path but no gradient reached it
                record.free()
                continue
            outs = [
                g if g is not None else _zeros(shape, dtype, like=grad)
                for g, (shape, dtype) in zip(outs, record.outputs)
            ]
            for edge, g in zip(record.edges, record.run_backward(outs)):
                if edge is None or g is None:
                    continue
                if isinstance(edge, tuple):
                    prev = grads.get(edge)
                    grads[edge] = g if prev is None else kernels.launch("add", prev, g)
                else:
                    _accumulate_leaf(edge, g)


def _reachable_in_reverse(root):
    """Records the root depends on, latest first (the reverse of the order they ran)."""
    seen, stack = {root.seq: root}, [root]
    while stack:
        for edge in stack.pop().edges:
            if isinstance(edge, tuple) and edge[0].seq not in seen:
                seen[edge[0].seq] = edge[0]
                stack.append(edge[0])
    return [seen[k] for k in sorted(seen, reverse=True)]


def _zeros(shape, dtype, like):
    return kernels.launch("fill", backend.of(like).empty(shape, dtype), 0)


def _accumulate_leaf(t, g):
    """A leaf's .grad is the sum over every use: add in place when it exists (its buffer may
    be a view into the optimizer's flat gradient buffer), else a private copy."""
    if g.dtype != t.dtype:
        g = kernels.launch("cast", g, t.dtype)
    if t.grad is None:
        t.grad = Tensor(kernels.launch("copy", backend.of(g).empty(t.shape, t.dtype), g))
    else:
        kernels.launch("add", t.grad.data, g, out=t.grad.data)


# ---------------------------------------------------------------- activation recomputation


def checkpoint(fn, *inputs):
    """fn(*inputs) -> a Tensor, recomputed instead of stored (torch.utils.checkpoint): the tape
    gets one "checkpoint" record that saves only the inputs (Tensors), and its backward re-runs
    fn with grad on, backpropagates through that small tape into the inputs and the leaves fn
    uses (its parameters' .grad, as without recomputation), then drops it. Under no_grad, or
    when no input requires grad (no record could be made), it is the plain call fn(*inputs)."""
    if not (_grad_enabled[-1] and any(x.requires_grad for x in inputs)):
        return fn(*inputs)
    return Checkpoint.apply(*inputs, fn=fn, needs=[x.requires_grad for x in inputs])


class Checkpoint(Function):
    @staticmethod
    def forward(ctx, *arrays, fn, needs):
        ctx.fn, ctx.needs, ctx.scope = fn, needs, _scope[-1]
        ctx.rng = rng.get_rng_state()  # rewound in the backward: the same dropout masks
        ctx.save_for_backward(*arrays)
        with no_grad():  # fn's launches count as this record's forward; it saves nothing
            return fn(*map(Tensor, arrays)).data

    @staticmethod
    def backward(ctx, g):
        leaves = [Tensor(a, requires_grad=r) for a, r in zip(ctx.saved, ctx.needs)]
        state = rng.get_rng_state()
        rng.set_rng_state(ctx.rng)
        # the recomputed forward runs in the backward phase but is forward math; its records
        # report their launches to this one (Record.parent)
        with scope(ctx.scope), enable_grad(), profiler.math("forward"):
            out = ctx.fn(*leaves)
        rng.set_rng_state(state)
        backward(out, g)  # frees each saved array as it goes; the records die with `out`
        return tuple(t.grad.data if t.grad is not None else None for t in leaves)
