"""Elementwise kernels declared as scalar expressions: the formula once, every kernel from it.

An expression is a tree of three kinds of node (tinygrad's early UOps): Input, an array argument
read at the element's index (or, for a row vector (C,) broadcast over the rows of the (..., C)
inputs, at the element's column); Const, a number (rounded to the compute type, as NumPy and
CUDA round a Python float); and Op: + - * /, negation, exp, log, sqrt, tanh, erf, the
comparisons < <= > >= and where(condition, a, b). Python's operators build the tree in the
order the formula is written, so `(t + 1) * x * 0.5` is ((t + 1) * x) * 0.5 in every kernel made
from it: nothing is reassociated, and a fused kernel that keeps the unfused order gives its bits
in fp32. Equal subtrees are one node (the dataclasses compare by value), so a kernel computes
tanh(...) once however often its formula says it.

A kernel is declared in spec.py by its stub (name, parameters, docstring) and @elementwise(formula):
formula(*inputs) -> one node per output, over the stub's parameters as Inputs. From its
Expression come the record's counts (every Op one FLOP; exp, log, tanh and erf also an exp; a
comparison none, its where one), its shape rule (check), its CPU kernel (numba_source.py), its
CUDA kernel (cuda_source.py) and its evaluation by NumPy's ufuncs (evaluate: one per node, over
NumPy's broadcasting).
"""

import inspect
import math
from dataclasses import dataclass
from functools import cached_property

from ..record import KERNELS, kernel, like

ARITHMETIC = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
COMPARISONS = {"lt": "<", "le": "<=", "gt": ">", "ge": ">="}
FUNCTIONS = ("exp", "log", "sqrt", "tanh", "erf")
TRANSCENDENTAL = ("exp", "log", "tanh", "erf")  # each counts as an exp (a sqrt does not)
ARITY = {**dict.fromkeys(ARITHMETIC, 2), **dict.fromkeys(COMPARISONS, 2), "neg": 1, "where": 3}
ARITY.update(dict.fromkeys(FUNCTIONS, 1))


class Node:
    """What every node shares: Python's operators build Ops in their written order."""

    def __add__(self, other):
        return Op("add", (self, node(other)))

    def __radd__(self, other):
        return Op("add", (node(other), self))

    def __sub__(self, other):
        return Op("sub", (self, node(other)))

    def __rsub__(self, other):
        return Op("sub", (node(other), self))

    def __mul__(self, other):
        return Op("mul", (self, node(other)))

    def __rmul__(self, other):
        return Op("mul", (node(other), self))

    def __truediv__(self, other):
        return Op("div", (self, node(other)))

    def __rtruediv__(self, other):
        return Op("div", (node(other), self))

    def __neg__(self):
        return Op("neg", (self,))

    def __lt__(self, other):
        return Op("lt", (self, node(other)))

    def __le__(self, other):
        return Op("le", (self, node(other)))

    def __gt__(self, other):
        return Op("gt", (self, node(other)))

    def __ge__(self, other):
        return Op("ge", (self, node(other)))

    def __bool__(self):
        raise TypeError("an expression has no truth value: use where(condition, a, b)")


@dataclass(frozen=True)
class Input(Node):
    name: str
    row: bool = False  # a row vector (C,), broadcast over the rows of the (..., C) inputs


@dataclass(frozen=True)
class Const(Node):
    value: float


@dataclass(frozen=True)
class Op(Node):
    op: str
    args: tuple

    def __post_init__(self):
        if ARITY.get(self.op) != len(self.args):
            raise ValueError(f"{self.op} of {len(self.args)} arguments")
        if all(isinstance(a, Const) for a in self.args):
            # a kernel would compute it in the compute type, NumPy in float64: fold it in Python
            raise ValueError(f"{self.op} of constants only: write the number it makes")
        # the hash once: the dataclass's would walk the whole subtree at every lookup
        object.__setattr__(self, "_hash", hash((self.op, self.args)))

    def __hash__(self):
        return self._hash


def node(x):
    """x as a node: a Python number is a Const."""
    if isinstance(x, Node):
        return x
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return Const(float(x))
    raise TypeError(f"{x!r} in an expression: use numbers and expressions")


def _function(op):
    def fn(x):
        return Op(op, (node(x),))

    fn.__name__ = op
    fn.__doc__ = f"{op}(x), in the compute type (fp32, fp64 for fp64 inputs)."
    return fn


exp, log, sqrt, tanh, erf = (_function(op) for op in FUNCTIONS)


def where(condition, a, b):
    """a where condition (a comparison) holds, else b."""
    if not (isinstance(condition, Op) and condition.op in COMPARISONS):
        raise TypeError("where's condition must be a comparison (x > 0, ...)")
    return Op("where", (condition, node(a), node(b)))


# ---------------------------------------------------------------- a kernel's expression


@dataclass(frozen=True)
class Expression:
    """A kernel's formula: its inputs (its parameters, in order) and one node per output."""

    name: str
    inputs: tuple  # Input nodes
    outputs: tuple  # nodes

    @cached_property
    def ops(self):
        """Every distinct Op, each after its arguments, in the outputs' order: the order in
        which the kernels compute them."""
        seen, order = set(), []

        def visit(n):
            if isinstance(n, Op) and n not in seen:
                for a in n.args:
                    visit(a)
                seen.add(n)
                order.append(n)

        for out in self.outputs:
            visit(out)
        return order

    def counts(self):
        """(FLOPs, exps) per element: every Op is one FLOP but a comparison (where counts);
        exp, log, tanh and erf are one exp each too, as record.py counts them."""
        ops = [n.op for n in self.ops]
        flops = sum(op not in COMPARISONS for op in ops)
        return flops, sum(op in TRANSCENDENTAL for op in ops)

    @cached_property
    def numpy(self):
        """(xp, *arrays) -> the outputs by xp's ufuncs (numpy_function), made once."""
        return numpy_function(self)

    @property
    def rows(self):
        """Whether an input is a row vector broadcast over the rows."""
        return any(i.row for i in self.inputs)

    def check(self, *args):
        """-> the first element input (the outputs' shape and dtype). ValueError where an
        element input's shape differs from the first's, or a row input is not (C,), C the
        inputs' last dimension."""
        first = next(a for a, i in zip(args, self.inputs) if not i.row)
        shape = tuple(first.shape)
        if self.rows and not shape:
            raise ValueError(f"{self.name}: a 0-d input has no rows to broadcast a vector over")
        for a, i in zip(args, self.inputs):
            want = shape[-1:] if i.row else shape
            if tuple(a.shape) != want:
                raise ValueError(
                    f"{self.name}: {i.name} has shape {tuple(a.shape)}, need {want} "
                    f"({'a row vector of ' if i.row else ''}the first input's {shape})"
                )
        return first

    def shape(self, *args):
        """The record's shape rule: each output a new array like the first element input."""
        first = self.check(*args)
        outs = tuple(like(first) for _ in self.outputs)
        return outs if len(outs) > 1 else outs[0]


EXPRESSIONS = {}  # kernel name -> Expression: the generators make a kernel of each


def declare(name, params, formula, rows=()):
    """The Expression of formula(*inputs) over parameters named params (those in rows: row
    vectors), registered as kernel `name`'s."""
    if isinstance(rows, str) or not set(rows) <= set(params):
        raise ValueError(f"{name}: rows {rows!r} must be a tuple of its parameters {params}")
    inputs = tuple(Input(p, p in rows) for p in params)
    if all(i.row for i in inputs):
        raise ValueError(f"{name}: at least one input must not be a row vector")
    outputs = formula(*inputs)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    if not all(isinstance(o, (Op, Input)) for o in outputs):
        raise TypeError(f"{name}: each output must be an expression of the inputs")
    EXPRESSIONS[name] = Expression(name, inputs, outputs)
    return EXPRESSIONS[name]


def elementwise(formula, rows=()):
    """Declare the stub below as a kernel of its spec's family computing formula over its
    parameters (those named in rows: row vectors broadcast over the rows), counted from the
    formula: its shape rule, FLOPs and exps come from the Expression, its kernels from the
    generators."""

    def declare_stub(stub):
        e = declare(stub.__name__, tuple(inspect.signature(stub).parameters), formula, rows)
        flops, exps = e.counts()
        return kernel(
            shape=e.shape,
            flops=lambda result, *args: flops * result.size,
            exps=(lambda result, *args: exps * result.size) if exps else None,
        )(stub)

    return declare_stub


def device_kernels(run, module):
    """name -> function, for every kernel declared by its expression, as module (a device's
    cpu.py or cuda.py) provides it: run(expression, args), under its stub's name, docstring and
    signature (tests/kernels/test_contract.py holds them)."""

    def made(e):
        def kernel(*args):
            return run(e, args)

        stub = KERNELS[e.name].signature
        kernel.__name__ = kernel.__qualname__ = e.name
        kernel.__doc__, kernel.__module__ = stub.__doc__, module
        kernel.__signature__ = inspect.signature(stub)
        return kernel

    return {name: made(e) for name, e in EXPRESSIONS.items() if name in KERNELS}


# ---------------------------------------------------------------- the generators' shared part


@dataclass(frozen=True)
class Dialect:
    """How a language spells an Op over its arguments' terms (C++ and Python share the infix
    operators): a constant (constant.format(literal)), a function (calls), where."""

    constant: str  # e.g. "A({})"
    calls: dict  # function op -> its name
    where: str  # e.g. "{0} ? {1} : {2}"


def code(n, names, dialect):
    """Op n as an expression of the dialect over its arguments: a node's name in names, a
    Const as a literal in the compute type."""
    a = [
        dialect.constant.format(literal(x.value)) if isinstance(x, Const) else names[x]
        for x in n.args
    ]
    if n.op in ARITHMETIC or n.op in COMPARISONS:
        return f"{a[0]} {ARITHMETIC.get(n.op) or COMPARISONS[n.op]} {a[1]}"
    if n.op == "neg":
        return f"-{a[0]}"
    if n.op == "where":
        return dialect.where.format(*a)
    if n.op not in dialect.calls:
        raise ValueError(f"{n.op} has no function in this dialect")
    return f"{dialect.calls[n.op]}({a[0]})"


def literal(value):
    """A Const's value as Python and C++ both read it back exactly (repr round-trips)."""
    if not math.isfinite(value):
        raise ValueError(f"the constant {value} has no literal: compute it from finite ones")
    return repr(float(value))


# NumPy's (or CuPy's) ufuncs: a Const a Python float, which keeps the arrays' dtype; no erf
NUMPY = Dialect(
    "{}", {f: f"xp.{f}" for f in ("exp", "log", "sqrt", "tanh")}, "xp.where({0}, {1}, {2})"
)


def numpy_function(e):
    """Expression e as a Python function (xp, *arrays) -> its outputs, one xp ufunc per Op in
    e's order over arrays broadcast as NumPy broadcasts (exec'd once: no interpreting per
    call)."""
    names = {i: f"in_{i.name}" for i in e.inputs}
    lines = []
    for k, n in enumerate(e.ops):
        names[n] = f"t{k}"
        lines.append(f"    t{k} = {code(n, names, NUMPY)}\n")
    outs = ", ".join(names[o] for o in e.outputs)
    params = ", ".join(names[i] for i in e.inputs)
    scope = {}
    exec(f"def {e.name}(xp, {params}):\n{''.join(lines)}    return ({outs},)\n", scope)
    return scope[e.name]


def evaluate(e, arrays, xp):
    """The outputs of expression e over arrays (one per input, broadcastable as NumPy
    broadcasts) by xp's ufuncs (numpy_function). erf has none: its kernels are the compiled
    ones."""
    return e.numpy(xp, *arrays)
