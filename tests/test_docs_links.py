"""Docs references that work for an installed user: no relative ``docs/...`` link in what the wheel
installs (the modules' strings, docstrings and comments, the shipped example targets) nor in the
README (the package's long description, read on the package index); every absolute link, every
``doc_url(...)`` a message builds and every link between the pages resolves to a shipped page and
heading; ``remat docs`` prints them offline; the example configs load by name (``example:NAME``).
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

import remat_common as rc

# reads files and runs the CLI's docs command: no framework needed, no JAX
pytestmark = [pytest.mark.compat, pytest.mark.lock_only]

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
#: What the wheel installs that holds text: the three packages, and the example targets it ships.
INSTALLED = sorted([*(ROOT / "common").rglob("*.py"), *(ROOT / "flax_remat_plugin").rglob("*.py"),
                    *(ROOT / "equinox_remat_plugin").rglob("*.py"),
                    *(ROOT / "examples").glob("*_gpt/model.py")])
#: The web address of a file of the repository: the Documentation URL's repository and branch.
BLOB = rc.internal.DOCS_URL.rsplit("/", 1)[0]
#: A reference to a Markdown file by a relative path (``docs/tune.md``, ``jax_behaviour.md``,
#: ``common/README.md``), not the tail of an absolute address.
RELATIVE_MD = re.compile(r"(?<![\w/.:-])(?:[\w.-]+/)*[\w-]+\.md\b")
#: The modules that find the pages' files, and name them for that (not to point a user at them).
FINDERS = {ROOT / "common" / "_shipped.py", ROOT / "common" / "_tooling" / "cli" / "_docs.py"}
URL = re.compile(re.escape(BLOB) + r"/([\w./-]+\.md)(?:#([\w-]+))?")


def _texts(path: Path) -> list[tuple[int, str]]:
    """``(line, text)`` of every string constant (docstrings, f-string parts) and comment."""
    source = path.read_text("utf-8")
    out = [(n.lineno, n.value) for n in ast.walk(ast.parse(source))
           if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    out += [(t.start[0], t.string) for t in tokenize.generate_tokens(io.StringIO(source).readline)
            if t.type == tokenize.COMMENT]
    return out


def _readme_outside_absolute_links() -> str:
    return re.sub(r"\[[^\]]*\]\(https?://[^)]*\)", "", README.read_text("utf-8"))


def test_no_relative_docs_link_in_the_installed_code_or_the_readme() -> None:
    found = [f"{p.relative_to(ROOT)}:{line}: {m}" for p in INSTALLED if p not in FINDERS
             for line, text in _texts(p) for m in RELATIVE_MD.findall(text)]
    readme = _readme_outside_absolute_links()
    found += [f"README.md: {m}" for m in RELATIVE_MD.findall(readme)]
    found += [f"README.md: relative link {m}" for m in re.findall(r"\]\((?!https?://|#)([^)]*)\)",
                                                                 readme)]
    assert found == []


def test_the_documentation_url_is_pyprojects() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    assert f'Documentation = "{rc.internal.DOCS_URL}"' in text


def _resolve(path: str, anchor: str | None, where: str) -> str:
    """'' when ``path`` (relative to the repository) and ``anchor`` name a shipped page and one
    of its headings, else what is wrong."""
    pages = rc.internal.pages()
    by_path = {f"docs/{name}.md": p for name, p in pages.items() if name != "core"}
    by_path["common/README.md"] = pages["core"]
    if path not in by_path:
        return f"{where}: {path} is not a shipped page"
    have = {h[2] for h in rc.internal.headings(by_path[path].read_text("utf-8"))}
    if anchor and anchor not in have:
        return f"{where}: {path} has no heading #{anchor}"
    return ""


def _doc_url_calls(path: Path) -> list[tuple[int, str, str]]:
    """``(line, page, anchor)`` of each ``doc_url("page", "anchor")`` call in ``path`` (with
    literal arguments: the messages' links; ``remat docs`` passes what the user typed)."""
    out = []
    for n in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "doc_url":
            args = [a.value for a in n.args if isinstance(a, ast.Constant)]
            if len(args) == len(n.args):
                out.append((n.lineno, args[0], args[1] if len(args) > 1 else ""))
    return out


def test_every_docs_reference_resolves_to_a_shipped_page_and_heading() -> None:
    problems: list[str] = []
    urls = 0
    sources = [(p, text) for p in INSTALLED for _, text in _texts(p)]
    sources += [(p, p.read_text("utf-8")) for p in (README, *rc.internal.pages().values())]
    for p, text in sources:
        for path, anchor in URL.findall(text):
            urls += 1
            problems.append(_resolve(path, anchor, str(p.relative_to(ROOT))))
    calls = [(p, c) for p in INSTALLED for c in _doc_url_calls(p)]
    for p, (line, page, anchor) in calls:
        path = "common/README.md" if page == "core" else f"docs/{page}.md"
        problems.append(_resolve(path, anchor, f"{p.relative_to(ROOT)}:{line}"))
    for name, p in rc.internal.pages().items():  # links between the pages, relative as written
        if name == "core":
            continue
        for target, anchor in re.findall(r"\]\((?!https?://)([\w.-]*\.md)?(?:#([^)]+))?\)",
                                         p.read_text("utf-8")):
            problems.append(_resolve(f"docs/{target}" if target else f"docs/{name}.md", anchor,
                                     f"docs/{name}.md"))
    assert [x for x in problems if x] == []
    assert urls > 40 and len(calls) >= 6  # the scan sees the links (a broken pattern finds none)


def test_a_broken_reference_is_found() -> None:
    assert _resolve("docs/semantics.md", "no-such-heading", "x") == \
        "x: docs/semantics.md has no heading #no-such-heading"
    assert _resolve("docs/nope.md", "", "x") == "x: docs/nope.md is not a shipped page"
    assert RELATIVE_MD.findall('see docs/tune.md and common/README.md, not '
                               f'{rc.internal.doc_url("tune")}') == ["docs/tune.md",
                                                                    "common/README.md"]


def _remat(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = rc.internal.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_remat_docs_lists_prints_and_locates_the_pages(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _remat(capsys, "docs")
    assert code == 0 and str(rc.internal.docs_dir()) in out
    assert re.search(r"^  tune +`remat tune`: the cheapest plan that fits a memory budget$", out, re.M)
    assert len(re.findall(r"^  \w+ ", out, re.M)) == len(rc.internal.pages())
    code, out, _ = _remat(capsys, "docs", "tune")
    assert code == 0 and out == (rc.internal.docs_dir() / "tune.md").read_text("utf-8")
    code, out, _ = _remat(capsys, "docs", "tune#capacity")
    assert code == 0 and out.startswith("## Capacity\n") and "\n## " not in out
    # a link as a message prints it, pasted; a heading by its title
    url = rc.internal.doc_url("semantics", "plan-files-in-an-editor")
    code, out, _ = _remat(capsys, "docs", url)
    assert code == 0 and out.startswith("## Plan files in an editor\n")
    code, out, _ = _remat(capsys, "docs", "semantics#Plan files in an editor", "--url")
    assert (code, out) == (0, url + "\n")
    code, out, _ = _remat(capsys, "docs", "docs/jax_behaviour.md", "--path")
    assert (code, out) == (0, f"{rc.internal.docs_dir() / 'jax_behaviour.md'}\n")
    code, out, _ = _remat(capsys, "docs", "core")
    assert code == 0 and out.startswith("# The core, for maintainers")


@pytest.mark.parametrize("name, says, fix", [
    ("tunes", "no page 'tunes'. Pages: 'architecture', 'choose_a_plan', 'core',", "tune"),
    ("tune#capacities", "tune has no section 'capacities'. Its sections: 'capacity', 'how',",
     "tune#capacity"),
])
def test_remat_docs_refuses_what_is_not_shipped(capsys: pytest.CaptureFixture[str], name: str,
                                                says: str, fix: str) -> None:
    code, _, err = _remat(capsys, "docs", name)
    assert code == 2 and f"remat docs: error: {says}" in err and "Fix: remat docs" in err
    assert _remat(capsys, "docs", fix)[0] == 0


@pytest.mark.parametrize("name, needs", [("nnx_gpt", ("flax", "optax")),
                                         ("eqx_gpt", ("equinox", "optax"))])
def test_example_configs_load_by_name(name: str, needs: tuple[str, ...]) -> None:
    """A shipped example's config by name, its target and plans beside it; where the packages its
    target imports are missing (a core-only install), the extras that install them."""
    import importlib.util

    missing = [m for m in needs if importlib.util.find_spec(m) is None]
    if missing:
        with pytest.raises(rc.PlanError, match=rf"example:{name}: its target imports "
                                               rf"{' and '.join(missing)}, not installed\. Fix: "
                                               rf"pip install 'jax-remat-plan\[{needs[0]},examples\]'"):
            rc.internal.ReportConfig.load(f"example:{name}")
        return
    config = rc.internal.ReportConfig.load(f"example:{name}")
    assert config.source == rc.internal.examples_dir() / name / "report.yaml"
    assert config.target_file.is_file() and config.plan_files()
    assert all(f.is_file() for f in config.plan_files())


def test_an_unknown_example_is_refused() -> None:
    with pytest.raises(rc.PlanError, match=r"unknown example 'example:nnx'\. Examples: "
                                           r"'example:eqx_gpt', 'example:nnx_gpt'\. Fix:"):
        rc.internal.ReportConfig.load("example:nnx")
