"""The README's Python blocks run as pasted, each on its own: the ten-line example keeps ``h`` on host,
the adapters' blocks verify; so do the examples the README points to: the custom rules keep no
attention scores (docs/custom_rules.md), the poisoned-empty fixture imports (docs/testing.md)."""

import contextlib
import io
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
CUSTOM_RULES = ROOT / "docs" / "custom_rules.md"
TESTING = ROOT / "docs" / "testing.md"


def test_ten_line_example_runs_and_offloads_h():
    text = README.read_text()
    section = text.split("## Ten lines", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, str(README), "exec"), {})
    rows = [line for line in out.getvalue().splitlines()[1:] if not line.startswith("argument")]
    assert len(rows) == 1  # h, the [2, 4] activation, and nothing else is kept...
    assert rows[0].startswith("offloaded") and "[2, 4]" in rows[0] and rows[0].endswith("host")


def _python_blocks(page: pathlib.Path = README) -> dict[str, str]:
    """Every ```python block of a page (the README), by the heading of its section."""
    blocks: dict[str, str] = {}
    heading, code, fence = "", None, ""
    for line in page.read_text().splitlines(keepends=True):
        if code is not None:  # inside a python block
            if line.startswith("```"):
                n = sum(k.split(" (")[0] == heading for k in blocks)
                blocks[heading if n == 0 else f"{heading} ({n + 1})"] = "".join(code)
                code = None
            else:
                code.append(line)
        elif fence:  # inside another block: a '# comment' there is no heading
            fence = "" if line.startswith("```") else fence
        elif line.startswith("```python"):
            code = []
        elif line.startswith("```"):
            fence = line
        elif line.startswith("#"):
            heading = line.lstrip("# ").strip()
    return blocks


def _run(code: str, tmp_path: pathlib.Path, monkeypatch) -> str:
    """Runs a block as a user pastes it into a file of its own: a fresh namespace, its own folder."""
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, str(README), "exec"), {"__name__": "__main__"})
    return out.getvalue()


def test_every_python_block_is_checked_here():
    """A block added to the README gets a test below (pasted, each one runs as written)."""
    assert sorted(_python_blocks()) == ["Equinox", "Flax NNX", "Ten lines"]


def test_the_flax_block_runs_as_pasted_and_verifies(tmp_path, monkeypatch):
    pytest.importorskip("flax")
    assert _run(_python_blocks()["Flax NNX"], tmp_path, monkeypatch).split() == ["True"]


def test_the_equinox_block_runs_as_pasted_and_verifies(tmp_path, monkeypatch):
    pytest.importorskip("equinox")
    assert _run(_python_blocks()["Equinox"], tmp_path, monkeypatch).split() == ["True"]


def test_the_custom_rules_block_runs_as_pasted_and_keeps_no_scores(tmp_path, monkeypatch):
    pytest.importorskip("flax")
    out = _run(_python_blocks(CUSTOM_RULES)["An example: attention that keeps no scores"],
               tmp_path, monkeypatch)
    rows = out.splitlines()[1:]
    kept = [r for r in rows if not r.startswith("argument")]
    assert kept and not any("[1, 4, 16, 16]" in r for r in kept)  # the scores are never kept
    assert any(r.split()[1] == "layers.0.attn/__rule__" for r in kept)  # what the rules keep


def test_the_poisoned_empty_block_is_importable(tmp_path, monkeypatch):
    assert _run(_python_blocks(TESTING)["Uninitialised memory"], tmp_path, monkeypatch) == ""
