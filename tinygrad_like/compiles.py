"""The seconds this process spent compiling kernels on their first use.

The CPU backend's Numba kernels are compiled, or loaded from Numba's disk cache, once per kernel
and dtype, by the first call that needs the variant (backend/cpu/compiled.py adds each such
compile here). That call takes up to seconds where a warm one takes microseconds: a step timed
around it measures the compiler. Whoever times a step (accounting/measure.py, the decode meter
of accounting/decode.py) reads the counter before and after, keeps the compiles out of the
step's time and reports them on a line of their own.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Compiles:
    """count kernel variants compiled (or loaded from the disk cache) in seconds."""

    count: int = 0
    seconds: float = 0.0

    def __add__(self, other):
        return Compiles(self.count + other.count, self.seconds + other.seconds)

    def __sub__(self, other):
        return Compiles(self.count - other.count, self.seconds - other.seconds)

    def describe(self):
        """One line: how many variants took how long, or that none did."""
        if not self.count:
            return "compiles: none (every kernel was compiled earlier in this process)"
        return (
            f"compiles: {self.count} kernel variant{'s' if self.count > 1 else ''} compiled (or "
            f"loaded from Numba's disk cache) on first use, {self.seconds:.2f} s, kept out of "
            "every time"
        )


_total = Compiles()


def add(seconds):
    """One kernel variant compiled (or loaded) in seconds."""
    global _total
    _total += Compiles(1, seconds)


def so_far():
    """The compiles of this process until now (subtract two readings for those between)."""
    return _total
