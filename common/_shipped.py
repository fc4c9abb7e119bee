"""Files shipped beside the code: the documentation pages and the example report configs.

The wheel carries them as package data (``remat_common/docs/``, ``remat_common/examples/``; the
build step is ``setup.py``); a source checkout or an editable install reads the repository's own
``docs/`` and ``examples/``. ``remat docs NAME`` prints a page, ``remat report example:nnx_gpt``
measures an example. Every link to a page in the messages, help and docstrings is absolute, built
from :data:`DOCS_URL` (``doc_url``), so it works wherever the package is installed.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

from ._errors import PlanError, short, sorted_list

#: The project's Documentation URL (``pyproject.toml``'s ``[project.urls]``): the folder of the
#: pages on the web. Every docs link is built from it.
DOCS_URL: Final = "https://github.com/jax-remat-plan/jax-remat-plan/blob/main/docs"

_HERE = Path(__file__).resolve().parent

#: The page that is not in ``docs/``: the core's own README (``remat_common/README.md``), for
#: whoever writes an adapter.
CORE_PAGE: Final = "core"

#: The example report configs (``example:NAME``): the packages their targets import beyond the
#: core, and the extras that install them.
EXAMPLES: Final[dict[str, tuple[tuple[str, ...], str]]] = {
    "nnx_gpt": (("flax", "optax"), "flax,examples"),
    "eqx_gpt": (("equinox", "optax"), "equinox,examples"),
}


def _folder(name: str, marker: str) -> Path:
    """``remat_common/NAME`` (the wheel's copy), else the checkout's ``NAME/`` beside the
    package; ``marker`` is a file that the right folder holds."""
    for d in (_HERE / name, _HERE.parent / name):
        if (d / marker).is_file():
            return d
    raise FileNotFoundError(f"remat_common: the shipped {name}/ folder is missing next to "
                            f"{_HERE}. Fix: reinstall jax-remat-plan (pip install --force-reinstall "
                            "jax-remat-plan).")


def docs_dir() -> Path:
    """The folder of the documentation pages (``NAME.md``, figures in ``figures/``)."""
    return _folder("docs", "semantics.md")


def examples_dir() -> Path:
    """The folder of the example configs (``NAME/report.yaml`` with ``model.py`` and ``plans/``)."""
    return _folder("examples", "nnx_gpt/report.yaml")


def example_config(name: str) -> Path:
    """The report config of the shipped example ``name`` (``"nnx_gpt"``, or as a user writes it,
    ``"example:nnx_gpt"``; :data:`EXAMPLES`), once the packages its target imports are installed.

    >>> sorted(EXAMPLES)
    ['eqx_gpt', 'nnx_gpt']
    """
    import importlib.util

    stem = name.removeprefix("example:")
    if stem not in EXAMPLES:
        raise PlanError(f"unknown example {short(name)}. Examples: "
                        f"{sorted_list(f'example:{n}' for n in EXAMPLES)}. Fix: give one of them, "
                        "or the path of a report config.")
    needs, extra = EXAMPLES[stem]
    missing = [m for m in needs if importlib.util.find_spec(m) is None]
    if missing:
        raise PlanError(f"example:{stem}: its target imports {' and '.join(missing)}, not "
                        f"installed. Fix: pip install 'jax-remat-plan[{extra}]'")
    return examples_dir() / stem / "report.yaml"


def pages() -> dict[str, Path]:
    """``{name: file}`` of every documentation page: ``docs/NAME.md``, and :data:`CORE_PAGE`.

    >>> sorted(pages())[:3]
    ['architecture', 'choose_a_plan', 'core']
    """
    out = {p.stem: p for p in sorted(docs_dir().glob("*.md"))}
    out[CORE_PAGE] = _HERE / "README.md"
    return out


def doc_url(page: str, anchor: str = "") -> str:
    """The web address of ``page`` (a name of :func:`pages`), at the heading ``anchor`` (its
    GitHub anchor, :func:`anchor_of`), if given.

    >>> doc_url("semantics", "plan-files-in-an-editor")
    'https://github.com/jax-remat-plan/jax-remat-plan/blob/main/docs/semantics.md#plan-files-in-an-editor'
    """
    url = (f"{DOCS_URL.rsplit('/', 1)[0]}/common/README.md" if page == CORE_PAGE
           else f"{DOCS_URL}/{page}.md")
    return f"{url}#{anchor}" if anchor else url


def anchor_of(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens.

    >>> anchor_of("Nested stacks (√n checkpointing)"), anchor_of("`remat doctor`")
    ('nested-stacks-n-checkpointing', 'remat-doctor')
    """
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _scan(text: str) -> list[tuple[str, tuple[int, str, str] | None]]:
    """Each line of ``text`` with its heading ``(level, title, anchor)``, or ``None``: lines in
    code blocks are no headings, and a repeated anchor gets GitHub's ``-1``, ``-2``, ... suffix."""
    out: list[tuple[str, tuple[int, str, str] | None]] = []
    seen: dict[str, int] = {}
    fenced = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        m = None if fenced else re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        heading = None
        if m:
            base = anchor_of(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            heading = (len(m.group(1)), m.group(2), f"{base}-{n}" if n else base)
        out.append((line, heading))
    return out


def headings(text: str) -> list[tuple[int, str, str]]:
    """``(level, title, anchor)`` of each Markdown heading of ``text`` (outside code blocks).

    >>> headings("# A page\\n## Its part\\n```\\n# a comment\\n```\\n## Its part")
    [(1, 'A page', 'a-page'), (2, 'Its part', 'its-part'), (2, 'Its part', 'its-part-1')]
    """
    return [h for _, h in _scan(text) if h is not None]


def anchor_in(text: str, name: str) -> str | None:
    """The anchor of the heading of ``text`` that ``name`` names (its anchor, or its title), or
    ``None``."""
    want = {name, anchor_of(name)}
    return next((h[2] for h in headings(text) if h[2] in want), None)


def section(text: str, name: str) -> str | None:
    """The part of ``text`` from the heading ``name`` names (:func:`anchor_in`) to the next
    heading of the same or a higher level; ``None`` when there is no such heading."""
    want = anchor_in(text, name)
    out: list[str] = []
    level = 0
    for line, h in _scan(text):
        if level:
            if h is not None and h[0] <= level:
                break
            out.append(line)
        elif h is not None and h[2] == want:
            level = h[0]
            out.append(line)
    return "\n".join(out).rstrip() + "\n" if out else None
