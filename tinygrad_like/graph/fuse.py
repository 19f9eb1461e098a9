"""Fusion: a captured step's adds, scalings, casts and activations folded into the kernels that
made their operands.

An add or a mul whose operand C is read by nothing else, C made by a kernel with an epilogue (a
GEMM, kernels/gemm/spec.py, or a quantized one, kernels/quant/spec.py; a norm's backward,
kernels/rownorm/spec.py; a sum, kernels/elementwise/spec.py), becomes that kernel's epilogue:
kernel(..., add=other) instead of kernel(...) then add(other, C); kernel(..., add=g, out=g)
where the add accumulated into g in place (a parameter's gradient); kernel(..., scale=s) where C
was multiplied by a 0-d array s (a mean's 1 / count), before any add. These are the residual
stream's adds in the forward (x + attn_proj(h), x + mlp_proj(h)), the gradients summed in the
backward (a layer's dW into its gradient, the residual's dx into the other branch's, a bias's
summed dY into its gradient) and the LM head's dW scaled, then summed: in gpt2-mini's training
step every add but the norm weights' gradients' and the embedding's. One launch instead of two,
and C is neither written nor read back: 2 |C| bytes fewer (the course's arithmetic, chapter 6:
each unfused kernel reads its inputs and writes its output), which the launch point's counts of
the fused step give too (Program.bytes before and after: tests/test_graph.py).

An elementwise kernel declared by its expression whose last operand is a GEMM's C becomes the
GEMM's then= epilogue: GPT-2's GELU of its fc's C (after the bias), the GELU's gradient of the fc's
dY (dZ W_proj^T), Llama's SwiGLU of its up projection's C (the gate made before it) and that
SwiGLU's gradients: 2 |C| fewer, or |C| where C is read again (in training the backward reads
the GELU's and the SwiGLU's inputs: aux=True returns C too, as cuBLASLt's GELU_AUX).

The fused kernel gives the unfused bits: it rounds C as it returned it, then multiplies and adds
as elementwise's mul and add do (in fp32 for 2-byte operands, rounded after each), or runs
elementwise's cast or then='s kernel on it. The other operand must be alive when the kernel runs,
and nothing between the kernel and the add may read or write it: the add then reads the same
bytes earlier, and what it wrote in place is written earlier, unread in between.
"""

from collections import defaultdict
from dataclasses import dataclass

from ..backend.meta.array import c_strides
from ..kernels import KERNELS
from ..kernels.elementwise.expr import EXPRESSIONS
from ..memory import root
from .capture import address, arguments, read, values

# what a kernel's epilogue takes is its record's (kernels/record.py): scale= (C times a 0-d
# array), add= (C plus an array of its shape), out= (an add into its own operand: the gradients)
# cast= (C in another dtype); then= (an elementwise kernel declared by its expression, C its last
# operand: a GELU, a SwiGLU, their gradients)
FOLDED = {"mul": "scale", "add": "add", "cast": "cast"}


def _part(op):
    """The epilogue part launch op would be folded as, or None."""
    return FOLDED.get(op.name) or ("then" if op.name in EXPRESSIONS else None)


def _sides(op):
    """The positions of op's arguments that may be the C it folds into C's kernel."""
    return (
        (0, 1) if op.name in ("add", "mul") else (0,) if op.name == "cast" else (len(op.args) - 1,)
    )


@dataclass(frozen=True)
class Fusion:
    kernel: str  # the kernel that took the elementwise launch as its epilogue
    folded: str  # the elementwise launch: "add" or "mul"
    saved: int  # bytes predicted removed: C written, then read back by the add or mul (2 |C|)


def fuse(program):
    """Fold every mul by a 0-d array and every add that can be (the module's docstring) into
    the kernel that made their operand, in program.steps (each fused launch's .folded lists
    what it took: program.fusions), and make program.plan again."""
    steps = program.steps
    readers = defaultdict(set)  # v -> the steps reading it
    for i, step in enumerate(steps):
        for v in read(step):
            readers[v].add(i)
    returned = set(values(program.result))
    first_output = {  # v -> the step whose first output it is
        step.makes[0]: i
        for i, step in enumerate(steps)
        if step[0] == "launch" and step.makes and step.makes[0] is not None
    }
    removed = set()
    for j, op in enumerate(steps):
        if op[0] != "launch" or _part(op) is None or set(op.kwargs) - {"out"}:
            continue
        for side in _sides(op):
            d = op.args[side]
            i = first_output.get(d[1]) if d[0] == "value" else None
            if i is None:
                continue
            v = d[1]
            kept = readers[v] != {j} or v in returned  # C read again: then= returns it too
            if op.kwargs.get("out") == d:  # written in place: later launches read it as it is
                if min(readers[v]) != j:
                    continue
            elif kept and _part(op) != "then":
                continue
            c = _outputs(steps[i].recorded[2])[0]
            between = [steps[s] for s in range(i + 1, j) if s not in removed]  # still launched
            if _part(op) == "then":
                fused = _then_fused(program, i, j, between, kept)
                saved = c.nbytes if kept else 2 * c.nbytes
            elif op.name == "cast":
                fused, saved = _cast_fused(program, i, j, between), 2 * c.nbytes
            else:
                fused, saved = _fused(program, i, j, side, between), 2 * c.nbytes
            if fused is not None:
                steps[i] = fused._replace(
                    folded=fused.folded + (Fusion(fused.name, op.name, saved),)
                )
                removed.add(j)
                for u in read(op):
                    readers[u].discard(j)
                for u in read(steps[i]):  # the kernel now reads op's other operand: a gradient
                    readers[u].add(i)  # it accumulates into is still read before its last add
                first_output.pop(v, None)  # C's epilogue is taken (or C is gone)
                if fused.makes[0] is not None:
                    first_output[fused.makes[0]] = i
                break
    program.steps = [s for j, s in enumerate(steps) if j not in removed]
    program.planned()


def _fused(program, i, j, side, between):
    """Launch i with launch j, an add or a mul whose argument `side` is i's first output C, as
    its epilogue, or None where it cannot."""
    kernel, op = program.steps[i], program.steps[j]
    part = FOLDED[op.name]
    takes = KERNELS[kernel.name].epilogue
    if part not in takes or {"add", "then", part} & set(kernel.kwargs):
        return None  # an epilogue is bias, then scale, cast, add (or then=): one each
    if part == "scale" and "cast" in kernel.kwargs:
        return None
    (args1, kwargs1, out1) = op.recorded
    c, other = _outputs(kernel.recorded[2])[0], args1[1 - side]
    d = op.args[1 - side]
    if not hasattr(other, "shape") or d[0] not in ("value", "const"):
        return None  # a Python number: no array to read in an epilogue
    if other.dtype != c.dtype or not _whole(args1[side], c):
        return None  # promoted, or not all of C
    if part == "scale" and tuple(other.shape) != ():
        return None
    if part == "add" and (tuple(other.shape) != tuple(args1[side].shape) or not _contiguous(other)):
        return None  # broadcast
    if d[0] == "value" and not (program.births[d[1]] < i):
        return None  # made after the kernel runs
    # in place: a mul into C itself (C stays the kernel's output), an add into its other operand
    into = op.kwargs.get("out")
    in_place = into is not None
    if in_place and into != (op.args[side] if part == "scale" else d):
        return None
    into_other = in_place and part == "add"
    # between the kernel and op nothing may write the operand (the kernel would read it too
    # early), nor read it when the kernel now writes it (it would read it too late)
    if any(_touches(step, d, reads=into_other) for step in between):
        return None
    if into_other and ("out" not in takes or _touches(kernel, d, reads=True)):
        return None  # the kernel would overwrite what it still reads
    operand = _as_shape(program, d, c.shape) if part == "add" else d
    recorded_operand = other.reshape(c.shape) if part == "add" else other
    kwargs = {**kernel.kwargs, part: operand, **({"out": operand} if into_other else {})}
    recorded_kwargs = {**kernel.recorded[1], part: recorded_operand}
    if into_other:  # the kernel returns out itself, which the launch point counts once
        recorded_kwargs["out"] = recorded_operand
    outs = _outputs(kernel.recorded[2])
    makes, shapes = list(kernel.makes), list(kernel.shapes)
    if into_other:
        made, makes[0], shapes[0] = recorded_operand, None, None
    elif not in_place:  # a new array: the launch's output now
        made, makes[0] = out1.reshape(c.shape), op.makes[0]
        shapes[0] = tuple(program.buffers[op.makes[0]].shape)
    else:
        made = c
    return kernel._replace(
        kwargs=kwargs,
        makes=tuple(makes),
        shapes=tuple(shapes),
        allocs=kernel.allocs + op.allocs,
        recorded=(
            kernel.recorded[0],
            recorded_kwargs,
            (made, *outs[1:]) if len(outs) > 1 else made,
        ),
    )


def _cast_fused(program, i, j, between):
    """Launch i, whose first output is C, with launch j, cast(C, dtype), as its epilogue's cast
    (after its scale, before an add: none taken yet), or None where it cannot."""
    kernel, op = program.steps[i], program.steps[j]
    if "cast" not in KERNELS[kernel.name].epilogue:
        return None
    if {"cast", "add", "out", "then"} & set(kernel.kwargs):
        return None
    args1, _, out1 = op.recorded
    outs = _outputs(kernel.recorded[2])
    if not _whole(args1[0], outs[0]):
        return None
    if any(_touches(step, op.args[0], reads=False) for step in between):
        return None
    made = out1.reshape(outs[0].shape)
    return kernel._replace(
        kwargs={**kernel.kwargs, "cast": op.args[1]},
        makes=(op.makes[0], *kernel.makes[1:]),
        shapes=(tuple(program.buffers[op.makes[0]].shape), *kernel.shapes[1:]),
        allocs=kernel.allocs + op.allocs,
        recorded=(
            kernel.recorded[0],
            {**kernel.recorded[1], "cast": args1[1]},
            (made, *outs[1:]) if len(outs) > 1 else made,
        ),
    )


def _then_fused(program, i, j, between, kept):
    """Launch i, a GEMM whose first output is C, with launch j, an elementwise expression kernel
    whose last operand is C (gelu_fwd(C), gelu_bwd(x, C), swiglu_fwd(gate, C), ...), as its
    then= epilogue (returning C too where it is read again: kept), or None where it cannot:
    after a bias only, on all of C, its other operands of C's size, contiguous and made before
    the GEMM, nothing writing C or them in between."""
    kernel, op = program.steps[i], program.steps[j]
    if "then" not in KERNELS[kernel.name].epilogue or set(kernel.kwargs) - {"bias"}:
        return None
    args1, _, out1 = op.recorded
    c = _outputs(kernel.recorded[2])[0]
    if not _whole(args1[-1], c):
        return None
    written, operands = [("value", op.args[-1][1], None)], []
    for x, d in zip(args1[:-1], op.args[:-1]):
        if d[0] not in ("value", "const") or x.size != c.size or not _contiguous(x):
            return None
        if d[0] == "value" and not (program.births[d[1]] < i):
            return None
        written.append(d)
        operands.append((_as_shape(program, d, c.shape), x.reshape(c.shape)))
    if any(_touches(step, w, reads=False) for step in between for w in written):
        return None
    described = ("seq", tuple, tuple(d for d, _ in operands))
    kwargs = {**kernel.kwargs, "then": ("seq", tuple, (("const", op.name), described))}
    recorded_kwargs = {**kernel.recorded[1], "then": (op.name, tuple(x for _, x in operands))}
    made = tuple(o.reshape(c.shape) for o in _outputs(out1))
    shapes = tuple(tuple(program.buffers[m].shape) for m in op.makes)
    if kept:
        kwargs["aux"], recorded_kwargs["aux"] = ("const", True), True
    return kernel._replace(
        kwargs=kwargs,
        makes=(*op.makes, op.args[-1][1]) if kept else op.makes,
        shapes=(*shapes, kernel.shapes[0]) if kept else shapes,
        allocs=kernel.allocs + op.allocs,
        recorded=(
            kernel.recorded[0],
            recorded_kwargs,
            (*made, c) if kept else made if len(made) > 1 else made[0],
        ),
    )


def _outputs(out):
    return out if isinstance(out, tuple) else (out,)


def _contiguous(a):
    return tuple(a.strides) == c_strides(tuple(a.shape), a.itemsize) or a.size <= 1


def _whole(a, c):
    """Whether a is all of c, in c's order (c itself, or a contiguous reshape of it)."""
    return a.size == c.size and _contiguous(a) and address(a) == address(c)


def _as_shape(program, d, shape):
    """Description d (a contiguous array) as an array of `shape`, the same bytes."""
    if d[0] == "const":
        return ("const", d[1].reshape(shape))
    v, view = d[1], d[2]
    offset = 0 if view is None else view[2]
    itemsize = program.buffers[v].itemsize
    if view is None and tuple(program.buffers[v].shape) == tuple(shape):
        return d
    return ("value", v, (tuple(shape), c_strides(tuple(shape), itemsize), offset))


def _touches(step, d, reads):
    """Whether step writes (or, with reads, reads or writes) what description d (an array
    argument) refers to. A host call is taken to write what it is given."""
    if step[0] == "host" or reads:
        given = arguments(step)
    else:  # the arguments the kernel writes in place
        writes = KERNELS[step.name].writes
        given = (
            *(step.args[k] for k in writes),
            *[step.kwargs[k] for k in ("out",) if k in step.kwargs],
        )
    if d[0] == "value":
        made = step.makes if step[0] == "launch" else ()
        return d[1] in (v for x in given for v in values(x)) or d[1] in made
    return any(_overlap(x, d[1]) for x in _constants(given))


def _constants(descriptions):
    for d in descriptions:
        if d[0] == "const" and hasattr(d[1], "nbytes"):
            yield d[1]
        elif d[0] == "seq":
            yield from _constants(d[2])


def _overlap(a, b):
    """Whether arrays a and b may share a byte: the spans from their first byte over their
    nbytes (a strided view's span is its first to last element), or, without addresses (the
    meta device), the same memory owner."""
    if root(a) is not root(b):
        return False
    lo_a, hi_a = _span(a)
    lo_b, hi_b = _span(b)
    return lo_a < hi_b and lo_b < hi_a


def _span(a):
    lo = address(a) + sum(min(0, s * (n - 1)) for s, n in zip(a.strides, a.shape))
    hi = address(a) + sum(max(0, s * (n - 1)) for s, n in zip(a.strides, a.shape)) + a.itemsize
    return lo, hi
