"""Check the CPU's compiled 2-byte conversions (tinygrad_like/backend/cpu/halves.py) against
NumPy's (ml_dtypes' for bf16) over fp32 bit patterns: every one by default (2^32, a few minutes),
or every --stride-th. Prints, per format, how many rounded results differ, split into signaling
NaNs (the difference halves.py states: its fp16 conversion quiets them) and the rest, which
must be none; exit 1 if any of the rest differ.

Why a script and not only a test: the tests check every rounding boundary of both formats, and
this is the whole space once per machine (a CPU's conversion instructions decide fp16's bits).

    python scripts/check_halves.py                # all 2^32 fp32 values
    python scripts/check_halves.py --stride 4099  # a quick sample across the space
"""

import sys

import numpy as np

from tinygrad_like import dtypes
from tinygrad_like.backend.cpu import halves
from training.args import ArgumentParser, user_errors

CHUNK = 1 << 24  # bit patterns per pass


def signaling(h):
    """fp16 bit patterns of signaling NaNs (exponent all ones, mantissa nonzero, its top bit 0)."""
    return ((h & 0x7C00) == 0x7C00) & ((h & 0x3FF) != 0) & ((h & 0x200) == 0)


def main(argv=None):
    p = ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--stride", type=int, default=1, help="check every stride-th bit pattern (1)")
    args = p.parse_args(argv)
    with user_errors():
        if args.stride <= 0:
            raise ValueError("--stride must be positive")
    counts = {fmt: [0, 0, 0] for fmt in ("bf16", "fp16")}  # checked, signaling NaNs, others
    for lo in range(0, 1 << 32, CHUNK * args.stride):
        bits = np.arange(lo, min(lo + CHUNK * args.stride, 1 << 32), args.stride, dtype=np.uint64)
        x = bits.astype(np.uint32).view(np.float32)
        for fmt in counts:
            dtype = dtypes.as_dtype(fmt)
            with np.errstate(all="ignore"):
                want = x.astype(dtype).view(np.uint16)
            differ = halves.rounded(x, dtype).view(np.uint16) != want
            quiet = (
                differ & np.isnan(x) & signaling(want) if fmt == "fp16" else np.zeros_like(differ)
            )
            counts[fmt][0] += x.size
            counts[fmt][1] += int(quiet.sum())
            counts[fmt][2] += int((differ & ~quiet).sum())
    for fmt, (checked, quiet, other) in counts.items():
        print(
            f"fp32 -> {fmt}: {checked:,} values, {quiet:,} signaling NaNs made quiet, "
            f"{other:,} other differences"
        )
    return 1 if any(other for *_, other in counts.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
