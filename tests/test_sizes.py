"""The reading budget: the README is a guide of at most 250 lines, and no Python file of the
project outside tests/ is over 600 lines (a file that grows past it holds two concerns)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("tinygrad_like", "nn", "optim", "accounting", "training", "scripts", "examples")


def lines(path):
    return len(path.read_text().splitlines())


def test_the_readme_is_at_most_250_lines():
    assert lines(ROOT / "README.md") <= 250


def test_no_python_file_outside_the_tests_is_over_600_lines():
    files = [p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py")]
    assert len(files) > 50
    assert {str(p.relative_to(ROOT)): lines(p) for p in files if lines(p) > 600} == {}
