"""LLVM IR for the CPU kernels written below Numba's loops (kernels/quant's cpu_int8x.py and
cpu_gemv.py): a builder's loads at byte offsets of a row of a Numba array, its shapes, vector
constants. Numba vectorizes loops but not straight-line code (NUMBA_SLP_VECTORIZE=0): a dot
whose vector shape is the algorithm is written in IR with these."""

from llvmlite import ir
from numba.core import cgutils

I8, I32, I64, F32 = ir.IntType(8), ir.IntType(32), ir.IntType(64), ir.FloatType()


class Emit:
    """LLVM IR over one builder: loads at byte offsets of an i8* (a row of a C-contiguous
    Numba array), constants; ints are i64 offsets, i32 lanes."""

    def __init__(self, context, builder, kinds, args):
        self.context, self.b, self.kinds, self.args = context, builder, kinds, args

    def row(self, i, row=None):
        """An i8* to row `row` of argument i (2-D), or to its start (1-D)."""
        kind = self.kinds[i]
        array = self.context.make_array(kind)(self.context, self.b, self.args[i])
        index = [row, ir.Constant(I64, 0)][-kind.ndim :]
        at = cgutils.get_item_pointer(self.context, self.b, kind, array, index, wraparound=False)
        return self.b.bitcast(at, I8.as_pointer())

    def dim(self, i, axis):
        shape = self.context.make_array(self.kinds[i])(self.context, self.b, self.args[i]).shape
        return self.b.extract_value(shape, axis)

    def at(self, j, step, plus=0):
        """The offset j * step + plus."""
        return self.b.add(self.b.mul(j, ir.Constant(I64, step)), ir.Constant(I64, plus))

    def load(self, base, offset, kind, n=None):
        """<n x kind> (or one kind when n is None) at base + offset bytes, unaligned."""
        pointee = kind if n is None else ir.VectorType(kind, n)
        load = self.b.load(self.b.bitcast(self.b.gep(base, [offset]), pointee.as_pointer()))
        load.align = 1
        return load

    def lane(self, i):
        return ir.Constant(I32, i)

    def has(self, feature):
        """Whether the CPU Numba compiles for has feature ("avx512f", "avx512vnni", ...)."""
        return _has(self.context.codegen(), feature)

    def dot_bytes(self, acc, u, x):
        """acc <n x i32> + in each lane the four products of u's unsigned bytes and x's signed
        ones in that lane (<4n x i8> each): AVX-512 VNNI's vpdpbusd (n = 16, or 8 with
        AVX-512 VL), else the widened products summed four by four (the same integers)."""
        n = acc.type.count
        lanes = ir.VectorType(I32, n)
        if self.has("avx512vnni") and (n == 16 or (n == 8 and self.has("avx512vl"))):
            fn = cgutils.get_or_insert_function(
                self.b.module,
                ir.FunctionType(lanes, [lanes] * 3),
                f"llvm.x86.avx512.vpdpbusd.{32 * n}",
            )
            return self.b.call(fn, [acc, self.b.bitcast(u, lanes), self.b.bitcast(x, lanes)])
        wide = ir.VectorType(I32, 4 * n)
        products = self.b.mul(self.b.zext(u, wide), self.b.sext(x, wide))
        picks = [ir.Constant(lanes, list(range(k, 4 * n, 4))) for k in range(4)]
        p = [self.b.shuffle_vector(products, products, pick) for pick in picks]
        return self.b.add(acc, self.b.add(self.b.add(p[0], p[1]), self.b.add(p[2], p[3])))

    def broadcast(self, value, n):
        """<n x value's type> with value in every lane (its first lane, then a shuffle)."""
        empty = ir.Constant(ir.VectorType(value.type, n), None)
        first = self.b.insert_element(empty, value, self.lane(0))
        return self.b.shuffle_vector(first, empty, splat(I32, n, 0))


def _has(codegen, feature):
    return f"+{feature}" in codegen.magic_tuple()[2].split(",")


def cpu_has(feature):
    """Whether the CPU Numba compiles for has feature, outside a kernel's IR (Emit.has)."""
    from numba.core.registry import cpu_target

    return _has(cpu_target.target_context.codegen(), feature)


def splat(kind, n, v):
    return ir.Constant(ir.VectorType(kind, n), [v] * n)
