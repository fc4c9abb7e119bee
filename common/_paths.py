"""Dotted module paths: the one place for how paths are shown, joined, nested and suggested.

Every adapter and every core file uses these helpers (the adapter interface re-exports them), so
that a path reads the same in every message: ``layers.3.attn``; the root module is ``<root>``.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Collection, Iterable
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


def common_path(paths: Iterable[str]) -> str | None:
    """The longest module path that starts every one of ``paths`` (None when none does).

    >>> common_path(["blocks.0.attn", "blocks.0.mlp"]), common_path(["blocks.0", "head"])
    ('blocks.0', None)
    """
    common: list[str] = []
    for parts in zip(*(p.split(".") for p in paths)):
        if len(set(parts)) != 1:
            break
        common.append(parts[0])
    return ".".join(common) or None


def kept_for(made_in: str | None, readers: Iterable[str | None]) -> str | None:
    """The module a residual is attributed to: the one it was made in (``made_in``), unless
    the modules that read it share a path that is neither that module nor one around it: it is
    then their input (a layer's input, made by the layer before it or by the root), theirs, as
    a module's offloaded input is named ``blocks.1/__input__``.

    >>> kept_for("blocks.0", ["blocks.1.attn_norm", "blocks.1"]), kept_for("blocks.0.mlp.up", ["blocks.0.mlp"])
    ('blocks.1', 'blocks.0.mlp.up')
    """
    shared = common_path(m for m in readers if m)
    if shared is None or (made_in is not None and in_subtree(made_in, shared)):
        return made_in
    return shared


def nearest(path: str, paths: Iterable[str]) -> list[str]:
    """Up to five of ``paths`` closest to ``path`` (sorted), for "did you mean" hints.

    >>> nearest("layers.0.mpl", ["layers.0.mlp", "head", ""])
    ['layers.0.mlp']
    """
    return sorted(difflib.get_close_matches(path, [p for p in paths if p], n=5, cutoff=0.3))


# -- module paths in JAX's name stacks (named scopes) ------------------------------------------

_WRAP = re.compile(r"^[\w\-]+\((.*)\)$")
_JAX_SCOPES = frozenset({"while", "body", "cond", "checkpoint", "rematted_computation", "remat",
                         "eval_jaxpr", "scan", "vmap", "pjit", "jit", "closed_call", "core_call",
                         "custom_vjp_call", "custom_jvp_call", "shard_map", "cond_jaxpr"})
#: Named scopes the frameworks open themselves (``eqx.nn.Linear``), which are not module paths.
_LIBRARY_SCOPES = frozenset({"eqx", "equinox", "nnx", "flax", "jax", "optax", "haiku", "hk"})
_PATH_LIKE = re.compile(r"^[A-Za-z_][\w\-]*(\.[\w\-]+)+$|^[A-Za-z_][\w\-]*\.\d+$")


def module_of(op_name: str, modules: Collection[str] | None = None) -> str | None:
    """The innermost module path in an ``op_name`` name stack (``None``: none; ``""``: the root,
    whose scope is named :data:`ROOT_DISPLAY`).

    A dotted name (``blocks.0.attn``) is a module path; a single word (``head``) only when it is
    one of ``modules`` (the model's module paths). XLA keeps the name stack in each
    instruction's ``op_name`` metadata, JAX in each equation's ``source_info``.

    >>> module_of("jit(step)/transpose(jvp(blocks.0))/blocks.0.mlp/dot_general")
    'blocks.0.mlp'
    >>> module_of("jit(step)/jvp(head)/dot_general", {"head"})
    'head'
    >>> module_of("jit(step)/jvp(<root>)/add")
    ''
    """
    found = None
    for part in op_name.replace(";", "/").split("/"):
        token = part
        while True:
            m = _WRAP.match(token)
            if not m:
                break
            token = m.group(1)
        for sub in token.split("/"):
            if sub in _JAX_SCOPES or not sub:
                continue
            if sub == ROOT_DISPLAY:
                found = found or ""
            elif (modules is not None and sub in modules) or (
                    _PATH_LIKE.match(sub) and sub.split(".", 1)[0] not in _LIBRARY_SCOPES):
                found = sub
    return found
