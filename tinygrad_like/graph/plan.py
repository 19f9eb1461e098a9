"""The memory plan of a captured step: every buffer the step makes (a kernel's output, or one it
fills in place first) placed in one arena by its lifetime, from the launch that makes it to the
last that reads it (or the step's end, for what the step returns): two buffers share bytes when
their lifetimes do not overlap. First fit, in order of birth, on 64-byte boundaries (a cache
line, the alignment the vector loads want).
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
    placed = []  # (offset, end, death) of the buffers placed so far
    offsets = []
    for b in buffers:
        size = -(-b.nbytes // ALIGN) * ALIGN
        busy = sorted((lo, hi) for lo, hi, death in placed if death >= b.birth)
        offset = 0
        for lo, hi in busy:  # the first gap wide enough
            if offset + size <= lo:
                break
            offset = max(offset, hi)
        placed.append((offset, offset + size, b.death))
        offsets.append(offset)
    size = max((hi for _, hi, _ in placed), default=0)
    steps = max((b.death for b in buffers), default=-1) + 1
    live = [0] * steps
    for b in buffers:
        for i in range(b.birth, b.death + 1):
            live[i] += b.nbytes
    return Plan(tuple(offsets), size, max(live, default=0))
