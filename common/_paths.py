"""Dotted module paths: the one place for how paths are shown, joined, nested and suggested.

Every adapter and every core file uses these helpers (the adapter interface re-exports them), so
that a path reads the same in every message: ``layers.3.attn``; the root module is ``<root>``.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Final

#: How the root module (path ``""``) is shown in messages.
ROOT_DISPLAY: Final = "<root>"
#: Separates a module path from an activation name: ``layers.3.attn/attn_out``.
SEP: Final = "/"
#: The name under which a module's inputs are tagged when a plan offloads them.
INPUT_NAME: Final = "__input__"
#: The method through which a module annotated ``custom`` computes its output with rule sets.
CUSTOM_METHOD: Final = "__remat_custom__"


def display(path: str | None) -> str:
    """A module path as messages show it: the root is ``<root>``.

    >>> display(""), display("layers.0")
    ('<root>', 'layers.0')
    """
    return path or ROOT_DISPLAY


def join(*parts: str) -> str:
    """Joins path segments, skipping empty ones (the root).

    >>> join("", "layers", "0")
    'layers.0'
    """
    return ".".join(p for p in parts if p)


def in_subtree(path: str, root: str) -> bool:
    """``path`` is ``root`` or lies under it (everything lies under the root ``""``).

    >>> in_subtree("layers.0.mlp", "layers.0"), in_subtree("layers.01", "layers.0")
    (True, False)
    """
    return root == "" or path == root or path.startswith(root + ".")


def path_key(path: str) -> tuple[object, ...]:
    """Sorts paths with their indices as numbers (``layers.10`` after ``layers.9``).

    >>> sorted(["layers.10", "layers.9", "head"], key=path_key)
    ['head', 'layers.9', 'layers.10']
    """
    return tuple((0, int(s), "") if s.isdigit() else (1, 0, s) for s in path.split("."))


def ancestors(path: str) -> list[str]:
    """``a.b.c`` → ``['a.b', 'a', '']`` (nearest first, the root last).

    >>> ancestors("a.b.c")
    ['a.b', 'a', '']
    """
    out = []
    while path:
        path = path.rpartition(".")[0]
        out.append(path)
    return out


def qualify(path: str | None, name: str) -> str:
    """``layers.3.attn`` + ``attn_out`` → ``layers.3.attn/attn_out``; no path → the bare name.

    >>> qualify("layers.3.attn", "attn_out")
    'layers.3.attn/attn_out'
    >>> qualify(None, "h")
    'h'
    """
    return f"{path}{SEP}{name}" if path else name


def nearest(path: str, paths: Iterable[str]) -> list[str]:
    """Up to five of ``paths`` closest to ``path`` (sorted), for "did you mean" hints.

    >>> nearest("layers.0.mpl", ["layers.0.mlp", "head", ""])
    ['layers.0.mlp']
    """
    return sorted(difflib.get_close_matches(path, [p for p in paths if p], n=5, cutoff=0.3))
