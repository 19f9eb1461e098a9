"""Token data: llm.c's `.bin` files and a random-window batch loader.

File format (llm.c, version 1), all little-endian:
    bytes [0, 1024)   header: 256 x int32; [0] = magic 20240520, [1] = version 1,
                      [2] = token count N, the rest zero
    bytes [1024, ...) N x uint16 token ids (GPT-2's 50257 ids fit in 16 bits)
Sticking to this format lets llm.c's own data scripts and ours read each other's files.
"""

from pathlib import Path

import numpy as np

from tinygrad_like.files import atomic_write

MAGIC = 20240520
VERSION = 1
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
_MAKE_IT = "run `python scripts/prepare_data.py` to make it"


class DataError(ValueError):
    """A token file or corpus input is missing or malformed."""


# ---------------------------------------------------------------- .bin files


def write_tokens(path, tokens):
    """Write tokens (1-D ints in [0, 65535]) to path in llm.c's format, atomically: a crash or
    a concurrent reader never sees a half-written file (files.atomic_write)."""
    arr = np.asarray(tokens)  # (N,)
    if arr.ndim != 1:
        raise ValueError(f"tokens must be 1-D, got shape {arr.shape}")
    if arr.size:
        if not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"tokens must be integers, got dtype {arr.dtype}")
        if arr.min() < 0 or arr.max() > np.iinfo(np.uint16).max:
            raise ValueError(
                f"token ids must fit in uint16 [0, 65535], got range [{arr.min()}, {arr.max()}]"
            )
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:3] = (MAGIC, VERSION, arr.size)
    atomic_write(Path(path), header.tobytes() + arr.astype("<u2").tobytes())


def read_tokens(path):
    """The uint16 tokens (N,) of an llm.c `.bin` file, memory-mapped read-only. Raises
    DataError naming the file, what was expected and what was found if the file is missing,
    is not an llm.c token file, or is truncated."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: token file not found; {_MAKE_IT}")
    size = path.stat().st_size
    if size < HEADER_BYTES:
        raise DataError(
            f"{path}: expected a {HEADER_BYTES}-byte header, found a {size}-byte "
            f"file; it is truncated or not an llm.c token file ({_MAKE_IT} again)"
        )
    header = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
    magic, version, count = (int(v) for v in header[:3])
    if magic != MAGIC:
        raise DataError(
            f"{path}: expected magic number {MAGIC} in the header, found {magic}; "
            f"this is not an llm.c token file ({_MAKE_IT})"
        )
    if version != VERSION:
        raise DataError(
            f"{path}: expected format version {VERSION} (uint16 tokens), found "
            f"version {version}; {_MAKE_IT} in the supported format"
        )
    expected = HEADER_BYTES + 2 * count
    if size != expected:
        raise DataError(
            f"{path}: header says {count} tokens, so expected {expected} bytes, "
            f"found {size}; the file is truncated or corrupt ({_MAKE_IT} again)"
        )
    if count == 0:  # mmap cannot map zero bytes, and there is nothing to map anyway
        return np.zeros(0, dtype=np.uint16)
    return np.memmap(path, dtype="<u2", mode="r", offset=HEADER_BYTES, shape=(count,))


def check_token_ids(path, tokens, vocab_size):
    """DataError naming the file, the byte offset and the value of the first token id that
    is not below vocab_size (an id the model has no embedding row for). One vectorized pass
    over the memory map, so a start-up check rather than a crash mid-run."""
    if len(tokens) == 0 or int(tokens.max()) < vocab_size:
        return
    i = int(np.argmax(np.asarray(tokens) >= vocab_size))
    raise DataError(
        f"{path}: token id {int(tokens[i])} at byte offset {HEADER_BYTES + 2 * i} "
        f"(token {i}) is not below the model's vocabulary of {vocab_size}; the file "
        f"is corrupt or made for another tokenizer ({_MAKE_IT} again)"
    )


# ---------------------------------------------------------------- batches


class DataLoader:
    """Random windows of a token file as (x, y) int64 batches of shape (B, T); y is x shifted
    left by one token (the next-token targets). Batch i is drawn from a generator seeded with
    (seed, i), so the whole sequence of batches is a pure function of the seed: the state is
    two integers, and a resumed run draws exactly the batches an uninterrupted one would.
    vocab_size: refuse a file holding an id the model cannot embed (check_token_ids).
    Data parallel: rank r of `world` ranks draws the same global batch of batch_size x world
    windows a single process would, and keeps its rows [r·B, (r+1)·B); its state counts in
    global batches, so a run can resume on another number of ranks."""

    def __init__(self, path, batch_size, seq_len, seed=0, vocab_size=None, rank=0, world=1):
        if batch_size <= 0:
            raise ValueError(f"batch_size must be > 0, got {batch_size}")
        if seq_len <= 0:
            raise ValueError(f"seq_len must be > 0, got {seq_len}")
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        self.path = Path(path)
        self.tokens = read_tokens(path)  # (N,) uint16
        if vocab_size is not None:
            check_token_ids(self.path, self.tokens, vocab_size)
        if len(self.tokens) <= seq_len + 1:
            raise DataError(
                f"{self.path}: has {len(self.tokens)} tokens, needs more than "
                f"seq_len + 1 = {seq_len + 1}; use a shorter seq_len or more text"
            )
        self.batch_size = batch_size  # this rank's rows
        self.rows = slice(rank * batch_size, (rank + 1) * batch_size)
        self.world = world
        self.seq_len = seq_len
        self.seed = seed
        self.batches_drawn = 0

    def next_batch(self):
        """The next (x, y) pair, each int64 of shape (B, T)."""
        B, T = self.batch_size, self.seq_len
        rng = np.random.default_rng((self.seed, self.batches_drawn))
        starts = rng.integers(0, len(self.tokens) - T, size=B * self.world)[self.rows]  # (B,)
        index = starts[:, None] + np.arange(T + 1)  # (B, T + 1)
        window = np.asarray(self.tokens[index], dtype=np.int64)  # (B, T + 1)
        self.batches_drawn += 1
        return np.ascontiguousarray(window[:, :-1]), np.ascontiguousarray(window[:, 1:])

    def __iter__(self):
        return self

    def __next__(self):
        return self.next_batch()

    def state_dict(self):
        """The loader's position as plain ints (JSON-friendly)."""
        return {
            "seed": self.seed,
            "batches_drawn": self.batches_drawn,
            "batch_size": self.batch_size * self.world,
            "seq_len": self.seq_len,
        }

    def load_state_dict(self, state):
        """Continue from state (from state_dict()), seed included."""
        shape = (int(state["batch_size"]), int(state["seq_len"]))
        if shape != (self.batch_size * self.world, self.seq_len):
            raise ValueError(
                f"loader state was saved with (global batch, seq_len) = {shape}, but "
                f"this loader has {(self.batch_size * self.world, self.seq_len)}; "
                "resume with the saved shape to draw the same batches"
            )
        self.seed = int(state["seed"])
        self.batches_drawn = int(state["batches_drawn"])
