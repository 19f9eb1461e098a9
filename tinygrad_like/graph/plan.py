"""The memory plan of a captured step: every buffer the step makes (a kernel's output, or one it
fills in place first) placed in one arena by its lifetime, from the launch that makes it to the
last that reads it (or the step's end, for what the step returns): two buffers share bytes when
their lifetimes do not overlap. Greedy by size: the largest buffer first, each at the lowest
offset free of every placed buffer whose lifetime meets its own, on 64-byte boundaries (a cache
line, the alignment the vector loads want). Placing in order of birth instead leaves the small
early buffers under the large late ones (a third more than the live peak for gpt2-tiny's fp16
training step; by size, the live peak to the 64-byte rounding: tests/test_graph.py).
"""

from dataclasses import dataclass

ALIGN = 64


@dataclass(frozen=True)
class Buffer:
    nbytes: int
    birth: int  # the index of the step that makes it
    death: int  # the index of the last step that reads it


@dataclass(frozen=True)
class Plan:
    offsets: tuple  # each buffer's byte offset in the arena
    size: int  # the arena's bytes
    live_peak: int  # the most bytes alive at once: no placement does with less


def plan(buffers):
    """Offsets for buffers (a list of Buffer) in one arena -> Plan."""
    offsets = [0] * len(buffers)
    placed = []  # (offset, end, birth, death) of the buffers placed so far
    for i in sorted(range(len(buffers)), key=lambda i: -buffers[i].nbytes):
        b = buffers[i]
        size = -(-b.nbytes // ALIGN) * ALIGN
        busy = sorted(  # the placed buffers alive at some moment b is
            (lo, hi) for lo, hi, birth, death in placed if birth <= b.death and b.birth <= death
        )
        offset = 0
        for lo, hi in busy:  # the first gap wide enough
            if offset + size <= lo:
                break
            offset = max(offset, hi)
        placed.append((offset, offset + size, b.birth, b.death))
        offsets[i] = offset
    size = max((hi for _, hi, _, _ in placed), default=0)
    steps = max((b.death for b in buffers), default=-1) + 1
    live = [0] * steps
    for b in buffers:
        for i in range(b.birth, b.death + 1):
            live[i] += b.nbytes
    return Plan(tuple(offsets), size, max(live, default=0))
