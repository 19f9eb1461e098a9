"""Rotary position embeddings, Hugging Face Llama's rotate-half convention: a head's D channels
are D/2 pairs (i, i + D/2), each turned by the angle of its frequency at the token's position.
The tables cos, sin (T, D/2) are in the compute dtype (fp32, fp64 for fp64), one row per position
of x; a KV-cache decode step passes the rows of its positions. The backward is the opposite turn.

cpu.py: one row (a head at one position) per iteration of a compiled loop; cuda.py + rotary.cu:
one thread per channel pair; both directions one function with a sign.
"""

from ..record import kernel, like_arg, per_element


@kernel(shape=like_arg(0), flops=per_element(3))
def rotary_fwd(x, cos, sin):
    """x (B, H, T, D) -> y (B, H, T, D): with x1 = x[..., :D/2], x2 = x[..., D/2:],
    y1 = x1 cos - x2 sin, y2 = x2 cos + x1 sin, computed in fp32 and rounded once."""


@kernel(shape=like_arg(0), flops=per_element(3))
def rotary_bwd(dy, cos, sin):
    """dx of rotary_fwd (the inverse turn): dx1 = dy1 cos + dy2 sin, dx2 = dy2 cos - dy1 sin."""
