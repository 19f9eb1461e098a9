"""Docs that cannot drift: every machine-independent figure and excerpt in docs/ and the README
(counts, bytes, events, launches, the accounting files, the memory trace, the tape, the memory
trades' tables, the KV tables) is regenerated here by the command its doc names, and compared.

The reports run with --counts-only on the meta device: what they print is the same on every
machine and device (the first test holds the CPU's equal to meta's), and a 7B step is counted
in a second. The memory trace trains, so it runs on the CPU (gpt2-mini, 3 small steps). Times,
MFU, machine peaks and census are never compared: the docs quote them with their machine.
"""

import contextlib
import io
import re
import shlex
from functools import lru_cache
from pathlib import Path

import pytest

from scripts import inspect_tape, memory_trace
from scripts import report as report_script

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
MINI = "python scripts/report.py --model gpt2-mini --batch-size 8 --seq-len 128"  # the README's
LLAMA_7B = (
    "python scripts/report.py --model llama-7b{} --device meta --dtype bf16 --batch-size {} "
    "--seq-len 4096{} --budget-gb 80{} --counts-only"
)
ACCOUNTING_FILES = {  # file -> the command docs/accounting.md names for it
    "accounting_gpt2.txt": "python scripts/report.py --model gpt2 --counts-only",
    "accounting_llama-7b.txt": LLAMA_7B.format("", 8, " --lm-head plain", ""),
    "accounting_llama-7b-gqa.txt": LLAMA_7B.format(" --n-kv-head 8", 8, " --lm-head plain", ""),
    "accounting_llama-7b-zero1x8.txt": LLAMA_7B.format("", 1, "", " --zero 1 --world-size 8"),
}
TAPE = "python scripts/inspect_tape.py --model gpt2"
TAPE_CUT = (26, 232)  # sed '27,232c\   ...': output lines 27 to 232 become one line "   ..."


def printed(main, argv):
    """What main(argv) prints to stdout."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(argv)
    return out.getvalue()


@lru_cache(maxsize=None)
def report(command, device="meta"):
    """scripts/report.py's output for a command line as a doc gives it, counts only."""
    argv = shlex.split(command)[2:]
    argv += [] if "--counts-only" in argv else ["--counts-only"]
    return printed(report_script.main, argv + ["--device", device])


def doc(name):
    return (ROOT / name).read_text()


def block_after(text, marker):
    """The lines of the first code block after marker: fenced (```) or indented 4 spaces (then
    without the indent)."""
    lines = text[text.index(marker) + len(marker) :].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(("```", "    ")))
    if lines[start].startswith("```"):
        end = lines.index("```", start + 1)
        return lines[start + 1 : end]
    block = []
    for line in lines[start:]:
        if line and not line.startswith("    "):
            break
        block.append(line[4:])
    while block and not block[-1]:
        block.pop()
    return block


def assert_excerpt(excerpt, lines):
    """Every line of the excerpt is one of lines, in their order (an excerpt skips some)."""
    rest = iter(lines)
    for line in excerpt:
        assert any(line == other for other in rest), f"not in the regenerated output: {line!r}"


# ---------------------------------------------------------------- the regenerations


@pytest.mark.parametrize(
    "model, argv",
    [
        ("gpt2-tiny", []),
        ("llama-tiny", ["--dtype", "bf16", "--attention", "naive", "--recompute", "--zero", "1"]),
    ],
)
def test_counts_only_is_the_same_on_the_cpu_and_on_meta(model, argv):
    """Why the docs' reports may be regenerated on meta."""
    command = shlex.join(["python", "scripts/report.py", "--model", model, *argv])
    assert report(command, "cpu") == report(command, "meta")


@pytest.mark.parametrize("name", ACCOUNTING_FILES)
def test_the_accounting_files_are_their_commands_output(name):
    command = ACCOUNTING_FILES[name]
    assert f"{command} > docs/{name}" in doc("docs/accounting.md")
    assert (DOCS / name).read_text() == report(command)


def tape_excerpt():
    lines = printed(inspect_tape.main, shlex.split(TAPE)[2:] + ["--device", "meta"]).splitlines()
    return lines[: TAPE_CUT[0]] + ["   ..."] + lines[TAPE_CUT[1] :]


def test_the_tape_excerpt_is_its_commands_output():
    command = f"{TAPE} | sed '{TAPE_CUT[0] + 1},{TAPE_CUT[1]}c\\   ...'"
    assert f"`{command} > docs/inspect_tape_excerpt.txt`" in doc("docs/accounting.md")
    assert (DOCS / "inspect_tape_excerpt.txt").read_text().splitlines() == tape_excerpt()


def test_the_memory_trace_is_its_commands_output(shakespeare, tmp_path, monkeypatch):
    """Run as the doc says, from a folder whose data/shakespeare is the session's corpus. The
    trace counts the run's own buffers: a test process also holds other tests' (a quantized
    weight's codes that its test module keeps), which the script leaves out."""
    assert "`python scripts/memory_trace.py > docs/memory_trace.txt" in doc("docs/memory.md")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "shakespeare").symlink_to(shakespeare)
    monkeypatch.chdir(tmp_path)
    assert (DOCS / "memory_trace.txt").read_text() == printed(memory_trace.main, [])


def test_the_excerpts_in_the_pages_are_of_the_files():
    accounting = doc("docs/accounting.md")
    gpt2 = (DOCS / "accounting_gpt2.txt").read_text().splitlines()
    assert_excerpt(block_after(accounting, "> docs/accounting_gpt2.txt`"), gpt2)
    tape = (DOCS / "inspect_tape_excerpt.txt").read_text().splitlines()
    assert_excerpt(block_after(accounting, "> docs/inspect_tape_excerpt.txt`"), tape)
    trace = (DOCS / "memory_trace.txt").read_text().splitlines()
    assert_excerpt(block_after(doc("docs/memory.md"), "> docs/memory_trace.txt"), trace)


def prose(text):
    """The text with every run of spaces and line breaks one space: a phrase across lines."""
    return " ".join(text.split())


def table_rows(text, title):
    """The cells of each row of the first Markdown table after title (its header left out)."""
    lines = text[text.index(title) :].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|---"))
    rows = []
    for line in lines[start + 1 :]:
        if not line.startswith("|"):
            return rows
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def test_the_readmes_report_excerpt_and_figures_are_the_reports():
    readme = doc("README.md")
    out = report(MINI)
    said = prose(readme)
    assert f"(also `{MINI}`, without training" in said
    assert_excerpt(block_after(readme, "## Reading the report"), out.splitlines())
    got = {  # the report's figures that the README's bullets quote
        name: re.search(pattern, out).group(1)
        for name, pattern in {
            "N": r"N = ([\d,]+) ",
            "per_param": r"total +16 +[\d,]+ +([\d.]+)",
            "layer": r"per token per layer: predicted [\d,]+, measured ([\d,]+)",
            "head": r"the loss save ([\d,]+)\.0 bytes per token",
            "peak": r"measured peak [\d,]+ bytes \(([\d,.]+ MB)",
            "forward": r"training step: forward +(\d+)",
            "backward": r"training step: backward +(\d+)",
            "optimizer": r"training step: optimizer +(\d+)",
            "step": r"training step: total +(\d+)",
            "decode": r"decode step \(M = 1\) +(\d+)",
        }.items()
    }
    for figure in (
        "**N**: parameters ({N} for gpt2-mini",
        "({per_param}: the padding rows)",
        "{layer} bytes per layer",
        "and {head} for the head",
        "the tracker's measured peak ({peak})",
        "**launches**: {forward} forward, {backward} backward, {optimizer} optimizer ({step} a "
        "step) and {decode} a decode step",
    ):
        assert figure.format(**got) in said


def test_the_7b_table_is_the_reports():
    """docs/accounting.md's table of the reference 7B: every number of its measured columns is
    in the report it quotes (GQA: its own), and the ZeRO-1 rank's figures below it in that
    report's."""
    readme = doc("docs/accounting.md")
    number = r"(?<![\w.])\d[\d,]*(?:\.\d+)?"
    dense, gqa = (report(ACCOUNTING_FILES[f"accounting_llama-7b{s}.txt"]) for s in ("", "-gqa"))
    rows = table_rows(readme, "| figure (bf16, B = 8, T = 4096")
    assert len(rows) == 12
    for cells in rows:
        for cell, out in ((cells[2], dense), (cells[4], gqa)):
            for value in re.findall(number, cell):
                assert value in out, f"{value} ({cells[0]}) is not in the report"
    zero = report(ACCOUNTING_FILES["accounting_llama-7b-zero1x8.txt"])
    said = prose(readme)
    per_param, gb = re.search(r"holds ([\d.]+) bytes per parameter \(([\d.]+) GB\)", said).groups()
    assert re.search(rf"total +[\d.]+ +[\d,]+ +{per_param}\n", zero) and f"{gb} GB for N" in zero
    fits = re.search(r"fits B = (\d+) at T = 4,096 with flash attention, B = (\d+) with", said)
    assert re.search(rf"flash +fused +off .* {fits[1]}\n +flash +fused +on .* {fits[2]}\n", zero)


def test_the_data_parallel_tables_bytes_are_the_reports():
    """docs/distributed.md's tables from a 2-rank run: every byte the same as rank 0's counted
    on meta (the times, ms and busbw, are the run's)."""
    command = (
        "python scripts/report.py --model gpt2-mini --batch-size 4 --seq-len 128 --zero 1 "
        "--world-size 2 --device meta"
    )
    text = doc("docs/distributed.md")
    assert f"`{command}`" in prose(text)
    lines = [tuple(line.split()) for line in report(command).splitlines()]
    untimed = {line[:-2] for line in lines if line[-2:] == ("-", "-")}  # a collective's row
    rows = [line.split() for line in block_after(text, "`mpirun -n 2 python") if line[:1] == " "]
    assert len(rows) == 13  # 2 headers, 6 consumers, 5 collectives
    for row in rows:
        assert tuple(row) in lines or tuple(row[:-2]) in untimed, row


def test_the_pages_prose_figures_are_the_reports():
    def saved(head):
        out = report(f"python scripts/report.py --model gpt2 --lm-head {head}")
        return int(re.search(r"total saved: ([\d,]+) bytes", out)[1].replace(",", "")) / 1e6

    said = prose(doc("docs/accounting.md"))
    assert f"{saved('fused'):.0f} MB against the plain head's {saved('plain'):.0f} MB" in said
    out = report(MINI)  # the fused head at gpt2-mini's B = 8, T = 128, and the plain one
    fused = float(re.search(r"measured peak [\d,]+ bytes \(([\d.]+) MB", out)[1])
    plain = float(re.search(r"\n +flash +plain +off +[\d,]+ +([\d.]+) ", out)[1])
    said = prose(doc("docs/memory.md"))
    assert f"{plain - fused:.1f} MB less than the plain head's {plain:.1f} MB" in said


# ---------------------------------------------------------------- the memory trades' tables


def trade_figures(command, attention, head, recompute):
    """-> {the figure: as the tables print it} of one report of a memory trades' table row."""
    options = f" --attention {attention} --lm-head {head}" + " --recompute" * (recompute == "on")
    out = report(command + options)
    largest = re.search(rf"\n +{attention} +{head} +{recompute} .* ([\d,]+)\n", out)[1]
    return {
        "saved": re.search(r"per token per layer: predicted [\d,]+, measured ([\d,]+)", out)[1],
        "head": re.search(r"the loss save ([\d,]+)\.0 bytes per token", out)[1],
        "peak": re.search(r"measured peak [\d,]+ bytes \(([\d,.]+ MB)\)", out)[1],
        "largest": largest,
    }


GPT2_1024 = "python scripts/report.py --model gpt2 --seq-len 1024"


@pytest.mark.parametrize(
    "page, title, named, command",
    [
        (
            "README.md",
            "The three memory trades on gpt2-mini, B = 8, T = 128, fp32",
            f"`{MINI}` with the row's `--attention`, `--lm-head` and `--recompute`",
            MINI,
        ),
        (
            "docs/memory.md",
            "## gpt2-mini, B = 8, T = 128, fp32",
            f"`{MINI} --attention naive --lm-head plain`",
            MINI,
        ),
        (
            "docs/memory.md",
            "## GPT-2 124M, T = 1,024, B = 1, fp32",
            f"`{GPT2_1024} --attention naive --lm-head plain`",
            GPT2_1024,
        ),
    ],
)
def test_the_memory_trades_tables_are_the_reports(page, title, named, command):
    """Each row's saved bytes, head and loss bytes, step peak and (where a column has it) the
    largest batch in 8 GB; a step time beside them is the machine's, not compared."""
    text = doc(page)
    assert named in prose(text)
    rows = table_rows(text, title)
    assert len(rows) >= 3
    for cells in rows:
        got = trade_figures(command, *cells[:3])
        assert cells[3:6] == [got["saved"], got["head"], got["peak"]], cells
        if len(cells) == 8:  # docs/memory.md's GPT-2 table: the largest B last
            assert cells[7] == got["largest"], cells


# ---------------------------------------------------------------- the KV tables


def test_the_kv_tables_are_their_commands_output():
    """docs/decode.md's python -c commands, run as they are written, print its tables."""
    text = doc("docs/decode.md")
    commands = re.findall(r'\n    python -c "((?:[^"\\]|\\\n)*)"\n\n', text)
    assert len(commands) == 2  # the KV cache's dtypes, the weights' formats
    for code in commands:
        expected = block_after(text, code + '"\n')
        out = printed(lambda _: exec(code.replace("\\\n", " "), {}), None)
        assert out.splitlines() == expected
    assert "-- llama-7b, GQA n_kv = 8: the KV cache" in text  # three tables, all printed
