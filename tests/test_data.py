"""llm.c .bin files, the batch loader, and corpus preparation."""

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from nn.tokenizer import get_tokenizer
from training.corpus import prepare, strip_markdown
from training.data import HEADER_BYTES, MAGIC, DataError, DataLoader, read_tokens, write_tokens

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "prepare_data.py"


def _set_header_int(path, index, value):
    raw = bytearray(path.read_bytes())
    raw[4 * index : 4 * index + 4] = np.array([value], dtype="<i4").tobytes()
    path.write_bytes(bytes(raw))


# ----------------------------------------------------------------------------- .bin files


def test_bin_round_trip(tmp_path):
    path = tmp_path / "t.bin"
    tokens = [0, 1, 50256, 65535, 42]
    write_tokens(path, tokens)

    header = np.fromfile(path, dtype="<i4", count=256)
    assert list(header[:3]) == [MAGIC, 1, len(tokens)]
    assert not header[3:].any()
    assert path.stat().st_size == HEADER_BYTES + 2 * len(tokens)

    got = read_tokens(path)
    assert got.dtype == np.uint16
    assert got.tolist() == tokens


def test_write_replaces_atomically_and_leaves_no_temp_files(tmp_path):
    path = tmp_path / "t.bin"
    write_tokens(path, np.arange(10))
    write_tokens(path, np.arange(3))
    assert read_tokens(path).tolist() == [0, 1, 2]
    assert [p.name for p in tmp_path.iterdir()] == ["t.bin"]


def test_empty_file_round_trip(tmp_path):
    path = tmp_path / "t.bin"
    write_tokens(path, [])
    assert read_tokens(path).shape == (0,)


@pytest.mark.parametrize("bad", [[-1], [65536], [[1, 2]], [0.5]])
def test_write_rejects_tokens_that_do_not_fit(tmp_path, bad):
    with pytest.raises(ValueError):
        write_tokens(tmp_path / "t.bin", bad)
    assert list(tmp_path.iterdir()) == []


def test_wrong_magic(tmp_path):
    path = tmp_path / "t.bin"
    write_tokens(path, [1, 2, 3])
    _set_header_int(path, 0, 1234)
    with pytest.raises(DataError) as err:
        read_tokens(path)
    message = str(err.value)
    assert str(path) in message and "20240520" in message and "1234" in message


def test_wrong_version(tmp_path):
    path = tmp_path / "t.bin"
    write_tokens(path, [1, 2, 3])
    _set_header_int(path, 1, 2)
    with pytest.raises(DataError, match=r"expected format version 1 .*found version 2") as err:
        read_tokens(path)
    assert str(path) in str(err.value)


def test_truncated_file(tmp_path):
    path = tmp_path / "t.bin"
    write_tokens(path, [1, 2, 3])
    path.write_bytes(path.read_bytes()[:-2])
    with pytest.raises(DataError) as err:
        read_tokens(path)
    message = str(err.value)
    assert str(path) in message and "3 tokens" in message
    assert str(HEADER_BYTES + 6) in message and str(HEADER_BYTES + 4) in message


def test_file_shorter_than_header(tmp_path):
    path = tmp_path / "t.bin"
    path.write_bytes(b"hello")
    with pytest.raises(DataError, match="1024-byte header.*5-byte file"):
        read_tokens(path)


def test_missing_file(tmp_path):
    path = tmp_path / "nope.bin"
    with pytest.raises(DataError) as err:
        read_tokens(path)
    assert str(path) in str(err.value)
    assert "run `python scripts/prepare_data.py` to make it" in str(err.value)


def test_data_error_is_a_value_error():
    assert issubclass(DataError, ValueError)


# ----------------------------------------------------------------------------- loader


@pytest.fixture
def counting_file(tmp_path):
    """A token file whose token at position i is i, so windows are easy to check."""
    path = tmp_path / "count.bin"
    write_tokens(path, np.arange(1000))
    return path


def test_batches_are_windows_and_y_is_x_shifted(counting_file):
    loader = DataLoader(counting_file, batch_size=4, seq_len=16, seed=0)
    x, y = loader.next_batch()
    assert x.shape == y.shape == (4, 16)
    assert x.dtype == y.dtype == np.int64
    assert type(x) is np.ndarray and x.flags.c_contiguous and y.flags.c_contiguous
    np.testing.assert_array_equal(x[:, 1:], y[:, :-1])
    np.testing.assert_array_equal(y, x + 1)  # consecutive tokens of the file
    assert x.min() >= 0 and y.max() <= 999


def test_every_start_can_be_drawn(tmp_path):
    path = tmp_path / "t.bin"
    write_tokens(path, np.arange(5))
    loader = DataLoader(path, batch_size=64, seq_len=3)
    starts = set()
    for _ in range(4):
        x, _ = loader.next_batch()
        starts.update(x[:, 0].tolist())
    assert starts == {0, 1}  # windows of 4 tokens in a 5-token file


def test_loader_is_deterministic_from_seed(counting_file):
    a = DataLoader(counting_file, 8, 32, seed=7)
    b = DataLoader(counting_file, 8, 32, seed=7)
    c = DataLoader(counting_file, 8, 32, seed=8)
    for _ in range(5):
        xa, ya = a.next_batch()
        xb, yb = b.next_batch()
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)
    assert not np.array_equal(a.next_batch()[0], c.next_batch()[0])


def test_resume_from_state_dict_draws_the_same_batches(counting_file):
    run = DataLoader(counting_file, 4, 16, seed=3)
    for _ in range(5):
        run.next_batch()
    state = json.loads(json.dumps(run.state_dict()))  # as if saved in a checkpoint
    expected = [run.next_batch() for _ in range(5)]

    resumed = DataLoader(counting_file, 4, 16, seed=0)
    resumed.load_state_dict(state)
    for x, y in expected:
        rx, ry = next(resumed)
        np.testing.assert_array_equal(rx, x)
        np.testing.assert_array_equal(ry, y)
    assert resumed.state_dict() == run.state_dict()


def test_resume_with_other_shape_is_refused(counting_file):
    state = DataLoader(counting_file, 4, 16).state_dict()
    with pytest.raises(ValueError, match="global batch, seq_len"):
        DataLoader(counting_file, 8, 16).load_state_dict(state)


@pytest.mark.parametrize("batch_size, seq_len", [(0, 8), (-1, 8), (4, 0)])
def test_loader_rejects_bad_shapes(counting_file, batch_size, seq_len):
    with pytest.raises(ValueError, match="must be > 0"):
        DataLoader(counting_file, batch_size, seq_len)


def test_loader_rejects_file_too_short(tmp_path):
    path = tmp_path / "t.bin"
    write_tokens(path, np.arange(9))
    with pytest.raises(DataError, match=r"has 9 tokens, needs more than seq_len \+ 1 = 9"):
        DataLoader(path, batch_size=1, seq_len=8)


# ----------------------------------------------------------------------------- corpus


def test_strip_markdown():
    md = (
        "# Othello\n\n## ACT I\n\n### SCENE I. Venice.\n\n_Enter RODERIGO and IAGO_\n\n"
        "**RODERIGO**  \nTush! never tell me;  \n_\\[Aside]_  \n\\--Handkerchief!\n"
        "[Reciting to himself]_  \n*Exit Audley,\nand returns.*\n\n\n\n1\\. Trumpets.\n"
    )
    assert strip_markdown(md) == (
        "Othello\n\nACT I\n\nSCENE I. Venice.\n\nEnter RODERIGO and IAGO\n\n"
        "RODERIGO\nTush! never tell me;\n[Aside]\n--Handkerchief!\n"
        "[Reciting to himself]\nExit Audley,\nand returns.\n\n1. Trumpets.\n"
    )


def test_prepare_on_input_files(tmp_path):
    texts = [
        "First document.\nWith two lines.\n",
        "Second — with ünïcode and <|endoftext|> as text.\n",
    ]
    inputs = []
    for i, text in enumerate(texts):
        inputs.append(tmp_path / f"doc{i}.txt")
        inputs[-1].write_text(text, encoding="utf-8")

    train_path, val_path = prepare(tmp_path / "out", inputs=inputs, val_fraction=0.25)

    tok = get_tokenizer()
    expected = np.concatenate([tok.encode(t) + [tok.eot] for t in texts])
    n_val = round(len(expected) * 0.25)
    assert (train_path, val_path) == (tmp_path / "out" / "train.bin", tmp_path / "out" / "val.bin")
    train, val = read_tokens(train_path), read_tokens(val_path)
    assert len(train) == len(expected) - n_val and len(val) == n_val
    np.testing.assert_array_equal(np.concatenate([train, val]), expected)
    assert np.count_nonzero(expected == tok.eot) == 2  # the literal text one stays ordinary


def test_prepare_missing_input(tmp_path):
    with pytest.raises(DataError, match="input file not found: .*nope.txt"):
        prepare(tmp_path / "out", inputs=[tmp_path / "nope.txt"])
    assert not (tmp_path / "out").exists()


def test_prepare_rejects_split_that_would_be_empty(tmp_path):
    doc = tmp_path / "doc.txt"
    doc.write_text("hi", encoding="utf-8")
    with pytest.raises(DataError, match="empty split"):
        prepare(tmp_path / "out", inputs=[doc], val_fraction=0.1)  # 2 tokens -> 0 val tokens


def test_prepare_default_shakespeare(tmp_path):
    # About 1 s on 2 cores: 38 plays, ~1.5M tokens.
    train_path, val_path = prepare(tmp_path)
    train, val = read_tokens(train_path), read_tokens(val_path)
    tok = get_tokenizer()
    total = len(train) + len(val)
    assert total > 1_000_000
    assert len(val) == round(total * 0.1)
    assert np.count_nonzero(train == tok.eot) + np.count_nonzero(val == tok.eot) == 38
    assert val[-1] == tok.eot
    text = tok.decode(train[:20_000])
    assert "ACT I" in text and not re.search(r"[#*_\\]", text)


def test_script_writes_files_and_reports(tmp_path):
    doc = tmp_path / "doc.txt"
    doc.write_text("Some words to split into train and val. " * 10, encoding="utf-8")
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--input", str(doc), "--out-dir", str(out)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert str(out / "train.bin") in result.stdout and str(out / "val.bin") in result.stdout
    assert "tokens" in result.stdout


def test_script_missing_input_exits_2_with_one_line(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--input",
            str(tmp_path / "nope.txt"),
            "--out-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert "nope.txt" in result.stderr


def test_an_id_outside_the_vocabulary_names_file_offset_and_value(tmp_path):
    from training.data import check_token_ids

    path = tmp_path / "t.bin"
    write_tokens(path, [5, 7, 50257, 3, 60000])
    with pytest.raises(DataError, match=r"t\.bin: token id 50257 at byte offset 1028 \(token 2\)"):
        DataLoader(path, 1, 2, vocab_size=50257)
    check_token_ids(path, read_tokens(path), 60001)  # all below: nothing to say
