"""``remat lint``: a static checker for the JAX 0.11 remat hazards in user code.

It reads files with Python's :mod:`ast` and never imports them. Names are resolved through the
file's imports and simple assignments, scope by scope (``import jax.numpy as jnp``,
``from jax import numpy as np2``, ``from jax.numpy import empty``, ``cp = jax.checkpoint_policies``),
so ``np.empty`` from NumPy, a method named ``empty`` or a parameter that shadows ``jnp`` are not
flagged. The rules and the reasoning behind each:
https://github.com/jax-remat-plan/jax-remat-plan/blob/main/docs/lint.md#remat-lint; the measured JAX
behaviour they rest on:
https://github.com/jax-remat-plan/jax-remat-plan/blob/main/docs/jax_behaviour.md.
"""

from __future__ import annotations

import ast
import concurrent.futures
import functools
import io
import multiprocessing
import multiprocessing.context
import os
import re
import stat
import tokenize
import warnings
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Final

from ..._errors import check_count, short, sorted_list, type_error
from ..._jaxcompat import backends_started
from ..._paths import CUSTOM_METHOD
from ._rules import LINT_RULES, Finding, LintReport
from ._rules import BY_NAME as _BY_NAME
from ._names import PARTIAL as _PARTIAL
from ._names import Resolver as _Resolver


# Qualified names (after alias canonicalisation) that the rules look for.
_POLICY_MODULES: Final = ("jax.checkpoint_policies", "jax.ad_checkpoint.checkpoint_policies")
_EMPTY: Final = frozenset({"jax.numpy.empty", "jax.numpy.empty_like"})
_SAVE_FROM_BOTH: Final = "jax.checkpoint_policies.save_from_both_policies"
_SAVE_ANYTHING_EXCEPT: Final = "jax.checkpoint_policies.save_anything_except_these_names"
#: The last parts of the names RM002-RM004 look for.
_REF_ATTRS: Final = frozenset(q.rpartition(".")[2] for q in
                              (*_EMPTY, _SAVE_FROM_BOTH, _SAVE_ANYTHING_EXCEPT))
_CUSTOM_REMAT: Final = "jax.custom_remat"
#: Functions that take a ``policy=`` (checked by RM003).
_POLICY_TAKERS: Final = frozenset({
    "jax.checkpoint", "flax.nnx.remat", "flax.linen.remat", "flax.linen.remat_scan",
    "equinox.filter_checkpoint",
})
#: Functions whose (function) arguments run inside a remat boundary (RM005).
_BOUNDARIES: Final = _POLICY_TAKERS | {
    "remat_common.checkpoint", "remat_common.adapter.call_module", "remat_common.adapter.wrap_call",
}
#: Methods that run inside a plan's boundary when the plan annotates their module 'custom'.
_CUSTOM_METHODS: Final = frozenset({CUSTOM_METHOD})
_JITS: Final = frozenset({"jax.jit", "flax.nnx.jit", "equinox.filter_jit"})

_IGNORE: Final = re.compile(r"#\s*remat:\s*ignore\b(?:\[([^\]]*)\])?")
# flake8/ruff style: ``# noqa`` (every rule) or ``# noqa: RM002, E501`` (the RM codes listed).
_NOQA: Final = re.compile(r"#\s*noqa\b(?::\s*([A-Za-z]+[0-9]+(?:[,\s]+[A-Za-z]+[0-9]+)*))?",
                          re.IGNORECASE)
# Every rule needs a name imported from one of these; a file that never mentions them is clean.
_MENTIONS: Final = re.compile(r"jax|flax|equinox|remat_common")
# ... and each rule needs one of these words in the text (RM001 ... RM007).
_TOKENS: Final = re.compile(
    r"\bempty(?:_like)?\b|checkpoint_policies|save_from_both_policies|"
    r"save_anything_except_these_names|custom_remat|\binline\b|prevent_cse|\bpolicy\b")
_SKIP_DIRS: Final = frozenset({"__pycache__", "node_modules", "site-packages"})


# -- the rules ------------------------------------------------------------------------------------
class _Checker:
    def __init__(self, tree: ast.Module, path: str, source: str) -> None:
        self.tree = tree
        self.path = path
        self.source = source
        self.res = _Resolver(tree)
        # Every node the resolver visited (depth first), with its parent.
        self._parents = self.res.parent_of
        self.nodes: list[ast.AST] = list(self._parents)
        self.findings: list[Finding] = []

    def add(self, rule: str, node: ast.AST, message: str) -> None:
        r = LINT_RULES[rule]
        line = getattr(node, "lineno", 1)
        col = getattr(node, "col_offset", 0) + 1
        self.findings.append(Finding(self.path, line, col, rule, r.name, message, r.fix))

    def text(self, node: ast.AST) -> str:
        return ast.get_source_segment(self.source, node) or ast.unparse(node)

    def run(self) -> list[Finding]:
        calls: list[ast.Call] = []
        defs: list[ast.FunctionDef | ast.AsyncFunctionDef] = []
        # A reference can only resolve to a name RM002-RM004 look for when its last part is that
        # name's last part (aliases only rename prefixes), and the file must spell it somewhere.
        ref_attrs = frozenset(a for a in _REF_ATTRS if a in self.source)
        for node in self.nodes:  # dispatch on the exact class: parsed trees hold no subclasses
            cls = node.__class__
            if cls is ast.Name:
                if ref_attrs and node.ctx.__class__ is ast.Load:  # type: ignore[attr-defined]
                    self._reference(node)  # type: ignore[arg-type]
            elif cls is ast.Attribute:
                if node.attr in ref_attrs and node.ctx.__class__ is ast.Load:  # type: ignore[attr-defined]
                    self._reference(node)  # type: ignore[arg-type]
            elif cls is ast.Call:
                if node.keywords:  # type: ignore[attr-defined]  # RM003/6/7 read keywords only
                    self._call(node)  # type: ignore[arg-type]
                calls.append(node)  # type: ignore[arg-type]
            elif cls is ast.FunctionDef or cls is ast.AsyncFunctionDef:
                defs.append(node)  # type: ignore[arg-type]
            elif cls is ast.Import:
                self._import(node)  # type: ignore[arg-type]
            elif cls is ast.ImportFrom:
                self._import_from(node)  # type: ignore[arg-type]
        if "custom_remat" in self.source:  # RM005 needs jax.custom_remat, spelled out somewhere
            self._custom_remat(calls, defs)
        return self.findings

    # RM001
    def _import(self, node: ast.Import) -> None:
        for a in node.names:
            if _is_policy_module(a.name):
                self.add("RM001", a, f"`import {a.name}` fails with ModuleNotFoundError on JAX "
                         "0.11 (jax.checkpoint_policies is an attribute of jax, not a module)")

    def _import_from(self, node: ast.ImportFrom) -> None:
        if node.level == 0 and node.module and _is_policy_module(node.module):
            names = ", ".join(a.name for a in node.names)
            self.add("RM001", node, f"`from {node.module} import {names}` fails with "
                     "ModuleNotFoundError on JAX 0.11 (jax.checkpoint_policies is an attribute of "
                     "jax, not a module)")

    # RM002, RM003 (save_from_both_policies), RM004
    def _reference(self, node: ast.Name | ast.Attribute) -> None:
        q = self.res.qualname(node)
        if q is None:
            return
        if q in _EMPTY:
            if self._filled_at_once(node):
                return
            self.add("RM002", node, f"`{self.text(node)}` ({q}) returns uninitialised memory on "
                     "GPU and TPU since JAX 0.11; CPU gives zeros, so CPU tests cannot catch a "
                     "read before write")
        elif q == _SAVE_FROM_BOTH:
            self.add("RM003", node, f"`{self.text(node)}` is silently changed under jax_remat3: "
                     "on 0.11.0 it saves nothing, on 0.11.2 it drops primitive-based halves such "
                     "as dots_saveable")
        elif q == _SAVE_ANYTHING_EXCEPT:
            self.add("RM004", node, f"`{self.text(node)}` ignores its argument in JAX 0.11 and "
                     "0.12: it saves everything, the named values included")

    def _parent(self, node: ast.AST) -> ast.AST | None:
        return self._parents.get(node)

    def _filled_at_once(self, ref: ast.AST) -> bool:
        """``jnp.empty(...)`` whose every element is written before anything can read it.

        Two shapes: ``jnp.empty(s).at[...].set(v)`` (or ``.at[:]``), and ``buf = jnp.empty(s)``
        followed by ``buf = buf.at[...].set(v)`` as the very next statement (or ``return``).
        """
        call = self._parent(ref)
        if not isinstance(call, ast.Call) or call.func is not ref:
            return False
        if _full_set_of(self._parent(call), call, self._parent):
            return True
        if _zero_size(call) or self._metadata_only(call):
            return True
        assign = self._parent(call)
        if not (isinstance(assign, ast.Assign | ast.AnnAssign) and assign.value is call):
            return False
        targets = assign.targets if isinstance(assign, ast.Assign) else [assign.target]
        if len(targets) != 1 or not isinstance(targets[0], ast.Name):
            return False
        nxt = _next_statement(assign, self._parent(assign))
        value = getattr(nxt, "value", None)
        if not isinstance(nxt, ast.Assign | ast.AnnAssign | ast.Return | ast.Expr) or value is None:
            return False
        name = targets[0].id
        for n in ast.walk(value):
            if isinstance(n, ast.Name) and n.id == name and _full_set_of(
                    self._parent(n), n, self._parent):
                return True
        return False

    def _metadata_only(self, call: ast.Call) -> bool:
        """Only the dtype/shape of the buffer is read: ``jnp.empty((), d).dtype`` or a name bound
        to it whose every use in its scope is ``name.dtype`` (through ``jnp.real(...)``, ``.real``)."""
        if self._reads_metadata(call):
            return True
        assign = self._parent(call)
        if not (isinstance(assign, ast.Assign) and assign.value is call and len(assign.targets) == 1
                and isinstance(assign.targets[0], ast.Name)):
            return False
        name = assign.targets[0].id
        scope = self.res.scope_of.get(assign.targets[0])
        uses = [n for n in self.nodes if isinstance(n, ast.Name) and n.id == name
                and isinstance(n.ctx, ast.Load) and self.res.scope_of.get(n) is scope]
        return bool(uses) and all(self._reads_metadata(n) for n in uses)

    def _reads_metadata(self, node: ast.AST) -> bool:
        for _ in range(8):
            parent = self._parent(node)
            if isinstance(parent, ast.Attribute) and parent.value is node:
                if parent.attr in _METADATA:
                    return True
                if parent.attr not in ("real", "imag"):
                    return False
            elif isinstance(parent, ast.Call) and parent.args == [node] and not parent.keywords \
                    and self.res.qualname(parent.func) in _VALUE_PRESERVING:
                pass
            else:
                return False
            node = parent
        return False

    # RM003 (lambda / local function policies), RM006, RM007
    def _call(self, node: ast.Call) -> None:
        q, keywords = self.res.target(node)
        for kw in keywords:
            if kw.arg == "prevent_cse" and _is_const(kw.value, False):
                self.add("RM007", kw, "prevent_cse=False is ignored by jax_remat3 on JAX 0.11.0 "
                         "(a CSE barrier is still emitted); honoured on 0.11.2+ and remat3 off")
            elif kw.arg == "inline" and q in _JITS and _is_const(kw.value, True):
                self.add("RM006", kw, f"{q}(inline=True) means JAX_EARLY on JAX 0.11.0 but "
                         "JAX_LATE on 0.11.2+")
            elif kw.arg == "policy" and q in _POLICY_TAKERS and self.res.is_local_function(
                    kw.value):
                what = ("a lambda" if isinstance(kw.value, ast.Lambda)
                        else f"`{self.text(kw.value)}`, a function defined in this file,")
                self.add("RM003", kw.value, f"{what} passed as policy= to {q} is silently "
                         "changed under jax_remat3: on 0.11.0 it saves nothing, and policies that "
                         "inspect primitives save nothing on 0.11.2 either")

    # RM005
    def _custom_remat(self, calls: list[ast.Call],
                      defs: list[ast.FunctionDef | ast.AsyncFunctionDef]) -> None:
        sites: list[tuple[ast.AST, str]] = []  # (node to report at, name for the message)
        for call in calls:
            if self._builds_custom_remat(call):
                sites.append((call, self._site_name(call)))
        for fn in defs:
            for d in fn.decorator_list:
                if isinstance(d, ast.Call) and self._is_custom_remat_partial(d):
                    sites.append((d, f"`{fn.name}`"))
        if not sites:
            return
        covered = self._covered()
        for node, name in sites:
            if node not in covered:
                self.add("RM005", node, f"the jax.custom_remat function {name} is never used "
                         "inside a jax.checkpoint/remat visible in this file; differentiating it "
                         "outside one raises an empty NotImplementedError")

    def _is_custom_remat_partial(self, call: ast.Call) -> bool:
        """``functools.partial(jax.custom_remat, f_fwd=..., ...)``."""
        return (self.res.qualname(call.func) == _PARTIAL and bool(call.args)
                and self.res.qualname(call.args[0]) == _CUSTOM_REMAT)

    def _builds_custom_remat(self, call: ast.Call) -> bool:
        """``jax.custom_remat(f, ...)`` or ``functools.partial(jax.custom_remat, ...)(f)``."""
        if self.res.qualname(call.func) == _CUSTOM_REMAT:
            return True
        return isinstance(call.func, ast.Call) and self._is_custom_remat_partial(call.func)

    def _site_name(self, call: ast.Call) -> str:
        parent = _parent_assign(self.nodes, call)
        if parent is not None:
            return f"`{self.text(parent)}`"
        return "built here"

    def _is_boundary_decorator(self, d: ast.expr) -> bool:
        if isinstance(d, ast.Call):  # @nnx.remat(policy=...), @partial(jax.checkpoint, ...)
            return self.res.target(d)[0] in _BOUNDARIES
        return self.res.qualname(d) in _BOUNDARIES

    def _covered(self) -> set[ast.AST]:
        """Every node that runs (as far as this file shows) inside a remat boundary."""
        defs: dict[str, list[ast.AST]] = {}
        attr_values: dict[str, list[ast.AST]] = {}
        roots: list[ast.AST] = []
        for node in self.nodes:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                defs.setdefault(node.name, []).append(node)
                if node.name in _CUSTOM_METHODS or any(
                        self._is_boundary_decorator(d) for d in node.decorator_list):
                    roots.append(node)
            elif isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Attribute):
                        attr_values.setdefault(t.attr, []).append(node.value)
            elif isinstance(node, ast.Call) and self.res.applied(node) in _BOUNDARIES:
                roots.extend([*node.args, *(k.value for k in node.keywords)])
        covered: set[ast.AST] = set()
        while roots:
            root = roots.pop()
            if root in covered:
                continue
            for n in ast.walk(root):
                if n in covered:
                    continue
                covered.add(n)
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
                    for b in self.res.lookup(n.id, n):
                        if b.node is not None:
                            roots.append(b.node)
                        elif b.value is not None:
                            roots.append(b.value)
                elif isinstance(n, ast.Attribute):
                    roots.extend(defs.get(n.attr, ()))
                    roots.extend(attr_values.get(n.attr, ()))
        return covered


_METADATA: Final = frozenset({"dtype", "shape", "ndim", "size", "weak_type"})
_VALUE_PRESERVING: Final = frozenset({"jax.numpy.real", "jax.numpy.imag", "jax.numpy.asarray"})


def _zero_size(call: ast.Call) -> bool:
    """``jnp.empty(0)``, ``jnp.empty((0, n))``: no element to read."""
    shape = call.args[0] if call.args else next(
        (k.value for k in call.keywords if k.arg == "shape"), None)
    if isinstance(shape, ast.Constant):
        return shape.value == 0 and not isinstance(shape.value, bool)
    if isinstance(shape, ast.Tuple | ast.List):
        return any(isinstance(e, ast.Constant) and e.value == 0 and not isinstance(e.value, bool)
                   for e in shape.elts)
    return False


def _is_full_index(index: ast.expr) -> bool:
    """``...``, ``:`` or a tuple of them: an index that covers the whole array."""
    if isinstance(index, ast.Constant) and index.value is Ellipsis:
        return True
    if isinstance(index, ast.Slice):
        return index.lower is None and index.upper is None and index.step is None
    if isinstance(index, ast.Tuple):
        return all(_is_full_index(e) for e in index.elts)
    return False


def _full_set_of(parent: ast.AST | None, base: ast.AST, parent_of: Any) -> bool:
    """Whether ``base`` is used as ``base.at[FULL].set(value)`` (``parent`` is base's parent)."""
    if not (isinstance(parent, ast.Attribute) and parent.attr == "at" and parent.value is base):
        return False
    sub = parent_of(parent)
    if not (isinstance(sub, ast.Subscript) and sub.value is parent and _is_full_index(sub.slice)):
        return False
    meth = parent_of(sub)
    if not (isinstance(meth, ast.Attribute) and meth.attr == "set"):
        return False
    call = parent_of(meth)
    return isinstance(call, ast.Call) and call.func is meth and bool(call.args)


def _next_statement(stmt: ast.AST, parent: ast.AST | None) -> ast.stmt | None:
    for field in ("body", "orelse", "finalbody"):
        block = getattr(parent, field, None)
        if isinstance(block, list) and stmt in block:
            i = block.index(stmt)
            return block[i + 1] if i + 1 < len(block) else None
    return None


def _parent_assign(nodes: Iterable[ast.AST], call: ast.Call) -> ast.expr | None:
    for node in nodes:
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is call:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if len(targets) == 1 and isinstance(targets[0], ast.Name | ast.Attribute):
                return targets[0]
    return None


def _is_policy_module(module: str) -> bool:
    return any(module == m or module.startswith(m + ".") for m in _POLICY_MODULES)


def _is_const(node: ast.expr, value: bool) -> bool:
    return isinstance(node, ast.Constant) and node.value is value


# -- suppression ----------------------------------------------------------------------------------
def _suppressions(source: str) -> dict[int, frozenset[str] | None]:
    """Line -> the rule ids a ``# remat: ignore[...]`` comment silences (None: every rule)."""
    out: dict[int, frozenset[str] | None] = {}
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError):
        return out
    for tok in tokens:
        if tok.type != tokenize.COMMENT:
            continue
        line = tok.start[0]
        noqa = _NOQA.search(tok.string)
        if noqa:
            if noqa.group(1) is None:
                out[line] = None
            else:
                codes = {c.upper() for c in re.split(r"[,\s]+", noqa.group(1)) if c}
                rm = frozenset(c for c in codes if c.startswith("RM"))
                prev = out.get(line, frozenset())
                if rm:
                    out[line] = None if prev is None else frozenset(prev | rm)
        m = _IGNORE.search(tok.string)
        if not m:
            continue
        if m.group(1) is None:
            out[line] = None
            continue
        ids = set()
        for item in re.split(r"[,\s]+", m.group(1).strip()):
            if item:
                ids.add(_BY_NAME.get(item, item.upper()))
        prev = out.get(line, frozenset())
        out[line] = None if prev is None else frozenset(prev | ids)
    return out


def _is_suppressed(f: Finding, sup: Mapping[int, frozenset[str] | None]) -> bool:
    if f.line not in sup:
        return False
    ids = sup[f.line]
    return ids is None or f.rule in ids


# -- entry points ---------------------------------------------------------------------------------
def rule_ids(spec: str | Iterable[str] | None, *, option: str = "select") -> frozenset[str] | None:
    """Rule ids from ``"RM002,uninitialized-empty"`` style lists; None stays None (all rules).

    Raises:
      ValueError: for an unknown id or name, listing the allowed ones.
    """
    if spec is None:
        return None
    if not isinstance(spec, str) and (isinstance(spec, bytes) or not isinstance(spec, Iterable)):
        raise TypeError(f"{option} must be rule ids or names ('RM002,uninitialized-empty' or a list "
                        f"of them), got {type(spec).__name__} {short(spec)}.")
    items = re.split(r"[,\s]+", spec) if isinstance(spec, str) else list(spec)
    out = set()
    for item in (i.strip() for i in items):
        if not item:
            continue
        rid = _BY_NAME.get(item, item.upper())
        if rid not in LINT_RULES:
            raise ValueError(
                f"unknown lint rule {item!r} in {option}. Allowed ids: "
                f"{sorted_list(LINT_RULES)}; or names: {sorted_list(_BY_NAME)}."
            )
        out.add(rid)
    if not out and option == "select":  # selecting nothing would pass any code, silently
        raise ValueError(
            f"select {short(spec)} names no rule, so nothing would be checked. Allowed ids: "
            f"{sorted_list(LINT_RULES)}. Fix: name the rules to report, or leave select out for "
            "all of them."
        )
    return frozenset(out)


def _lint(source: str, path: str, select: frozenset[str] | None,
          ignore: frozenset[str] | None) -> tuple[list[Finding], int]:
    try:
        with warnings.catch_warnings():  # SyntaxWarnings about the linted code are not ours
            warnings.simplefilter("ignore")
            tree = ast.parse(source, filename=path)
    except SyntaxError as e:
        f = Finding(path, e.lineno or 1, (e.offset or 0) or 1, "RM000", "syntax-error",
                    f"cannot parse: {e.msg}", LINT_RULES["RM000"].fix)
        return [f], 0
    except (RecursionError, MemoryError, ValueError) as e:
        return [_not_checked(path, e)], 0
    if not _MENTIONS.search(source) or not _TOKENS.search(source):
        return [], 0  # no word any rule looks for: nothing can be found (a cheap text test)
    try:
        found = _Checker(tree, path, source).run()
    except RecursionError as e:
        return [_not_checked(path, e)], 0
    found = [f for f in found if (select is None or f.rule in select)
             and (ignore is None or f.rule not in ignore)]
    if not found:
        return [], 0
    sup = _suppressions(source)
    kept = [f for f in found if not _is_suppressed(f, sup)]
    return sorted(set(kept)), len(set(found)) - len(set(kept))


def _not_checked(path: str, e: BaseException) -> Finding:
    why = ("it is nested too deeply to analyse (an expression or block thousands of levels "
           "deep)" if isinstance(e, RecursionError | MemoryError) else f"{type(e).__name__}: {e}")
    return Finding(path, 1, 1, "RM000", "syntax-error", f"cannot check: {why}",
                   "split the expression (generated code can be excluded by passing only the "
                   "files to check).")


def lint_source(source: str, path: str = "<string>", *, select: Iterable[str] | None = None,
                ignore: Iterable[str] | None = None) -> tuple[Finding, ...]:
    """Checks one piece of Python source for the JAX 0.11 remat hazards.

    Args:
      source: Python source text (never executed or imported).
      path: the name to report findings under.
      select, ignore: rule ids or names to report only / to skip (default: every rule).

    Returns:
      The findings, sorted by position, with ``# remat: ignore[...]`` suppressions applied.

    >>> src = "import jax.numpy as jnp\\nimport numpy as np\\nx = jnp.empty(3) + np.empty(3)\\n"
    >>> [str(f) for f in lint_source(src, "model.py")]  # doctest: +ELLIPSIS
    ['model.py:3:5: RM002 [uninitialized-empty] `jnp.empty` (jax.numpy.empty) returns ...']
    >>> lint_source(src.replace("(3)\\n", "(3)  # remat: ignore[RM002]\\n"))
    ()
    """
    if not isinstance(source, str):
        raise TypeError(f"lint_source: source must be Python source text (str), got "
                        f"{type(source).__name__} {short(source)}. Fix: pass the text; for a file, "
                        "use lint_paths([path]).")
    findings, _ = _lint(source, str(path), rule_ids(select), rule_ids(ignore, option="ignore"))
    return tuple(findings)


def _is_venv(d: Path) -> bool:
    try:
        return (d / "pyvenv.cfg").is_file()
    except OSError:  # a directory we may not look into (permission denied): not a venv we know of
        return False


def python_files(paths: Iterable[str | os.PathLike[str]], *,
                 unreadable: list[OSError] | None = None) -> Iterator[str]:
    """The files to check: each file given, and every ``*.py`` under each directory given.

    Hidden directories (``.git``, ``.venv``), ``__pycache__``, ``site-packages``,
    ``node_modules`` and virtual environments (a ``pyvenv.cfg`` inside) are skipped. A directory
    that cannot be listed (no permission) is skipped too; its error is appended to
    ``unreadable`` when given, so the caller can say it was not checked.

    Raises:
      FileNotFoundError: for a path that does not exist.
      TypeError: ``paths`` is one path (a string would be walked character by character, from
        ``/``) or holds something that is not a path.
    """
    if isinstance(paths, str | bytes | os.PathLike) or not isinstance(paths, Iterable):
        raise type_error("lint_paths", "paths", paths, "a list of files and directories",
                         f"pass [{short(paths)}] for one path." if isinstance(paths, str | os.PathLike)
                         else "pass a list such as ['src/', 'train.py'].")
    paths = list(paths)
    for p in paths:
        if not isinstance(p, str | os.PathLike):
            raise type_error("lint_paths", "each of paths", p, "a file or directory path (str or "
                             "os.PathLike)")
    for p in paths:
        path = Path(p)
        if path.is_dir():
            for root, dirs, files in os.walk(path, onerror=None if unreadable is None
                                             else unreadable.append):
                dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in _SKIP_DIRS
                                 and not _is_venv(Path(root) / d))
                for name in sorted(files):
                    full = os.path.join(root, name)
                    if name.endswith(".py") and _is_regular(full):  # not a FIFO, socket, device
                        yield full
        elif path.is_file():
            yield str(p)
        elif path.exists():
            raise FileNotFoundError(
                f"{str(p)!r} is not a regular file or a directory (a FIFO, socket or device). "
                "Fix: pass Python files or directories to check."
            )
        else:
            raise FileNotFoundError(
                f"{str(p)!r} is neither a file nor a directory. Fix: pass Python files "
                "or directories to check (directories are searched for *.py recursively)."
            )


def _is_regular(path: str) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:  # a dangling link or a loop
        return False


def lint_paths(paths: Iterable[str | os.PathLike[str]], *, select: Iterable[str] | None = None,
               ignore: Iterable[str] | None = None, jobs: int | None = None) -> LintReport:
    """Checks files, and directories recursively (``*.py``), for the JAX 0.11 remat hazards.

    Args:
      paths: files and directories.
      select, ignore: rule ids or names to report only / to skip (default: every rule).
      jobs: worker processes (each file is checked on its own, so the report is the same for any
        number); default: one per available core, up to 8, when there are at least
        ``_PARALLEL_FROM`` files, else 1.

    Returns:
      A :class:`LintReport`: sorted findings, the files checked, the number suppressed.

    >>> import pathlib, tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     _ = (pathlib.Path(d) / "train.py").write_text("import jax\\nf = jax.jit(abs, inline=True)\\n")
    ...     report = lint_paths([d])
    >>> [(f.rule, f.line, f.col) for f in report.findings], report.counts
    ([('RM006', 2, 18)], {'RM006': 1})
    """
    sel, ign = rule_ids(select), rule_ids(ignore, option="ignore")
    if jobs is not None:
        check_count("lint_paths", "jobs", jobs, 1)
    unreadable: list[OSError] = []
    files = tuple(dict.fromkeys(python_files(paths, unreadable=unreadable)))
    n = jobs if jobs is not None else (
        min(_cores(), 8) if len(files) >= _PARALLEL_FROM else 1)
    check = functools.partial(_lint_file, select=sel, ignore=ign)
    results: Iterable[tuple[list[Finding], int]]
    if n > 1 and len(files) > 1:
        with concurrent.futures.ProcessPoolExecutor(min(n, len(files)),
                                                    mp_context=_context()) as pool:
            results = list(pool.map(check, files, chunksize=max(1, len(files) // (4 * n))))
    else:
        results = map(check, files)
    findings = [Finding(str(e.filename), 1, 1, "RM000", "syntax-error",
                        f"cannot read this directory ({e.strerror or e}), so the files in it "
                        "were not checked", "give the linting user read access to it, or "
                        "leave it out of the paths.") for e in unreadable]
    suppressed = 0
    for found, k in results:
        findings.extend(found)
        suppressed += k
    return LintReport(tuple(sorted(findings)), files, suppressed)


#: Below this many files, one process checks them (starting workers would cost more).
_PARALLEL_FROM: Final = 32


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _context() -> multiprocessing.context.BaseContext:
    """``fork`` where it exists and JAX has started no backend in this process (the command line
    never does: forking is then cheap and safe); else a fresh interpreter per worker."""
    methods = multiprocessing.get_all_start_methods()
    if "fork" in methods and not backends_started():
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")


def _lint_file(path: str, *, select: frozenset[str] | None,
               ignore: frozenset[str] | None) -> tuple[list[Finding], int]:
    try:
        source = _decode(Path(path).read_bytes())
    except (OSError, UnicodeDecodeError, SyntaxError) as e:
        return [Finding(path, 1, 1, "RM000", "syntax-error", f"cannot read: {e}",
                        LINT_RULES["RM000"].fix)], 0
    return _lint(source, path, select, ignore)


def _decode(data: bytes) -> str:
    """Decodes a Python file the way the interpreter does (PEP 263 coding cookie, BOM)."""
    encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    return data.decode(encoding).removeprefix("\ufeff")
