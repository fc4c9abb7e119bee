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
import dataclasses
import functools
import io
import multiprocessing
import multiprocessing.context
import os
import re
import stat
import sys
import tokenize
import warnings
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Final, Literal

from .._errors import check_count, short, sorted_list, type_error
from .._paths import CUSTOM_METHOD


@dataclasses.dataclass(frozen=True)
class LintRule:
    """One lint rule: a stable id (``RM001``), a short name, what is wrong and the fix."""

    id: str
    name: str
    summary: str
    fix: str


_RULES: Final = (
    LintRule(
        "RM000", "syntax-error",
        "the file cannot be parsed, so it was not checked",
        "fix the syntax error (remat lint parses with the running Python's ast module).",
    ),
    LintRule(
        "RM001", "checkpoint-policies-import",
        "importing jax.checkpoint_policies as a module fails on the shipped wheels "
        "(ModuleNotFoundError: in JAX 0.11 it is an attribute of jax, not a module)",
        "`import jax` and use attribute access: jax.checkpoint_policies.SaveOnlyTheseNames(...), "
        "or bind cp = jax.checkpoint_policies.",
    ),
    LintRule(
        "RM002", "uninitialized-empty",
        "jax.numpy.empty/empty_like return uninitialised memory on GPU and TPU since JAX 0.11 "
        "(CPU still gives zeros, so CPU tests cannot catch a read before write)",
        "use jnp.zeros/jnp.zeros_like (or jnp.full) unless every element is provably written "
        "before it is read; then mark the line `# remat: ignore[RM002]`.",
    ),
    LintRule(
        "RM003", "remat3-changed-policy",
        "this policy is silently changed under jax_remat3 (0.11.0 saves nothing; 0.11.2 drops "
        "primitive-based parts), with no warning and correct gradients",
        "use one name-based policy (jax.checkpoint_policies.SaveOnlyTheseNames / "
        "SaveAndOffloadOnlyTheseNames over checkpoint_name tags, or dots_saveable alone), or a "
        "remat_common plan.",
    ),
    LintRule(
        "RM004", "save-anything-except-ignores-names",
        "save_anything_except_these_names ignores its argument in JAX 0.11 and 0.12: it saves "
        "everything, the named values included",
        "to save every named value except some, use jax.checkpoint_policies.SaveAnyNamesButThese("
        "frozenset({...})) (save_any_names_but_these(...) on 0.12); to recompute chosen values, "
        "list the ones to keep with SaveOnlyTheseNames or a plan's {save: [...]} annotation.",
    ),
    LintRule(
        "RM005", "custom-remat-without-checkpoint",
        "no enclosing checkpoint is visible for this jax.custom_remat function in this file; "
        "differentiating it outside a checkpoint raises an empty NotImplementedError",
        "call it inside jax.checkpoint / jax.remat / nnx.remat / eqx.filter_checkpoint / "
        "remat_common.checkpoint, or annotate its module 'custom' in a plan (its __remat_custom__ "
        "runs inside the boundary); if the checkpoint is in another file, mark the line "
        "`# remat: ignore[RM005]`.",
    ),
    LintRule(
        "RM006", "jit-inline-true",
        "jit(inline=True) changed meaning between JAX 0.11.0 (JAX_EARLY) and 0.11.2 (JAX_LATE)",
        "say which one you mean: inline=jax.Inline.JAX_EARLY (checkpoint_name tags inside stay "
        "visible by name) or inline=jax.Inline.JAX_LATE.",
    ),
    LintRule(
        "RM007", "prevent-cse-false",
        "prevent_cse=False is ignored by jax_remat3 on JAX 0.11.0 (a CSE barrier is still "
        "emitted); it is honoured on 0.11.2+ and with remat3 off",
        "require jax>=0.11.2 where the saving matters (`remat doctor` reports the version) and "
        "then mark the line `# remat: ignore[RM007]`, or drop the argument.",
    ),
)

#: Every rule by id, in id order.
LINT_RULES: Final[Mapping[str, LintRule]] = {r.id: r for r in _RULES}
_BY_NAME: Final = {r.name: r.id for r in _RULES}

# Qualified names (after alias canonicalisation) that the rules look for.
_ALIASES: Final = {
    "jax.remat": "jax.checkpoint",
    "jax.ad_checkpoint.checkpoint_policies": "jax.checkpoint_policies",
    "flax.linen.checkpoint": "flax.linen.remat",
}
_POLICY_MODULES: Final = ("jax.checkpoint_policies", "jax.ad_checkpoint.checkpoint_policies")
_EMPTY: Final = frozenset({"jax.numpy.empty", "jax.numpy.empty_like"})
_SAVE_FROM_BOTH: Final = "jax.checkpoint_policies.save_from_both_policies"
_SAVE_ANYTHING_EXCEPT: Final = "jax.checkpoint_policies.save_anything_except_these_names"
#: The last parts of the names RM002-RM004 look for.
_REF_ATTRS: Final = frozenset(q.rpartition(".")[2] for q in
                              (*_EMPTY, _SAVE_FROM_BOTH, _SAVE_ANYTHING_EXCEPT))
_CUSTOM_REMAT: Final = "jax.custom_remat"
_PARTIAL: Final = "functools.partial"
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


@dataclasses.dataclass(frozen=True, order=True)
class Finding:
    """One hazard found by :func:`lint_source` / :func:`lint_paths`.

    Attributes:
      path: the file, as it was given (or found under a given directory).
      line, col: 1-based position of the offending expression, import or keyword.
      rule: the rule id (``RM002``); see :data:`LINT_RULES`.
      name: the rule's short name (``uninitialized-empty``).
      message: what is wrong here and why.
      fix: what to do instead.
    """

    path: str
    line: int
    col: int
    rule: str
    name: str
    message: str
    fix: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}:{self.col}: {self.rule} [{self.name}] {self.message}"

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class LintReport:
    """What :func:`lint_paths` found.

    Attributes:
      findings: every unsuppressed finding, sorted by path, line and column.
      files: the Python files that were checked.
      suppressed: how many findings ``# remat: ignore`` comments silenced.
    """

    findings: tuple[Finding, ...]
    files: tuple[str, ...]
    suppressed: int = 0

    @property
    def ok(self) -> bool:
        return not self.findings

    @property
    def counts(self) -> dict[str, int]:
        """Findings per rule id, in id order."""
        c = Counter(f.rule for f in self.findings)
        return {rule: c[rule] for rule in sorted(c)}

    def summary(self) -> str:
        """One line: how many findings, per rule, in how many of how many files."""
        n_files = len(self.files)
        tail = f"{self.suppressed} suppressed" if self.suppressed else ""
        if not self.findings:
            return f"remat lint: no problems in {n_files} file(s)" + (f" ({tail})" if tail else "")
        per_rule = ", ".join(f"{rule}: {n}" for rule, n in self.counts.items())
        n_bad = len({f.path for f in self.findings})
        return (f"remat lint: {len(self.findings)} problem(s) in {n_bad} of {n_files} file(s) "
                f"({per_rule}" + (f"; {tail}" if tail else "") + ")")

    def to_json(self) -> dict[str, Any]:
        return {
            "findings": [f.to_json() for f in self.findings],
            "summary": {
                "files": len(self.files), "findings": len(self.findings),
                "suppressed": self.suppressed, "by_rule": self.counts,
            },
            "files": list(self.files),
        }


# -- name resolution ------------------------------------------------------------------------------
# Nodes no rule looks at: load/store contexts and operators (a third of a typical tree).
_LEAVES: Final = (ast.expr_context, ast.operator, ast.unaryop, ast.cmpop, ast.boolop)
_IS_NODE: dict[type, bool] = {}


#: Per node class: the fields that can hold nodes (not ``ctx``/``op``/``ops``, always leaves).
_NODE_FIELDS: dict[type, tuple[str, ...]] = {}


def _is_node(cls: type) -> bool:
    ok = _IS_NODE[cls] = issubclass(cls, ast.AST) and not issubclass(cls, _LEAVES)
    return ok


def _children(node: ast.AST) -> Iterator[ast.AST]:
    """``ast.iter_child_nodes`` without the contexts and operators (one dict lookup per value)."""
    cls = node.__class__
    fields = _NODE_FIELDS.get(cls)
    if fields is None:
        fields = _NODE_FIELDS[cls] = tuple(f for f in cls._fields if f not in ("ctx", "op", "ops"))
    is_node = _IS_NODE
    for field in fields:
        value = getattr(node, field, None)
        if value.__class__ is list:
            for child in value:
                ok = is_node.get(child.__class__)
                if ok or (ok is None and _is_node(child.__class__)):
                    yield child
        else:
            ok = is_node.get(value.__class__)
            if ok or (ok is None and _is_node(value.__class__)):
                yield value  # type: ignore[misc]  # an AST node: checked through its class


BindingKind = Literal["import", "assign", "def", "class", "other"]


@dataclasses.dataclass(eq=False)
class _Binding:
    kind: BindingKind
    qualname: str | None = None  # for imports
    value: ast.expr | None = None  # for assignments: the assigned expression
    node: ast.AST | None = None  # for def/class: the definition


@dataclasses.dataclass(eq=False)
class _Scope:
    kind: Literal["module", "function", "class", "comprehension"]
    parent: _Scope | None
    bindings: dict[str, list[_Binding]] = dataclasses.field(default_factory=dict)
    globals: set[str] = dataclasses.field(default_factory=set)
    nonlocals: set[str] = dataclasses.field(default_factory=set)


def _canonical(q: str) -> str:
    for alias, target in _ALIASES.items():
        if q == alias or q.startswith(alias + "."):
            return target + q[len(alias):]
    return q


class _Resolver(ast.NodeVisitor):
    """Builds the scopes of a module and resolves expressions to qualified names."""

    def __init__(self, tree: ast.Module) -> None:
        self.module = _Scope("module", None)
        self.scope = self.module
        self.scope_of: dict[ast.AST, _Scope] = {}
        self._resolving: set[int] = set()
        self._qualnames: dict[ast.AST, str | None] = {}
        self._by_bindings: dict[int, str | None] = {}
        self._methods: dict[type, Any] = {}
        # Every visited node with the node whose visit reached it: the checker walks these rather
        # than the tree a second time (contexts and operators are never visited).
        self.parent_of: dict[ast.AST, ast.AST | None] = {}
        self._current: ast.AST | None = None
        self.visit(tree)

    # -- building ---------------------------------------------------------------------------------
    def visit(self, node: ast.AST) -> None:
        self.scope_of[node] = self.scope
        self.parent_of[node] = parent = self._current
        cls = node.__class__
        method = self._methods.get(cls)
        if method is None:
            method = self._methods[cls] = getattr(self, "visit_" + cls.__name__, self.generic_visit)
        self._current = node
        method(node)
        self._current = parent

    def generic_visit(self, node: ast.AST) -> None:
        for child in _children(node):
            self.visit(child)

    def visit_Constant(self, node: ast.Constant) -> None:
        """No children (and not ``NodeVisitor``'s slow fallback for the pre-3.8 node names)."""

    def _bind(self, name: str, binding: _Binding) -> None:
        s = self.scope
        if name in s.globals:
            s = self.module
        elif name in s.nonlocals:
            s = self._enclosing_function(s) or s
        s.bindings.setdefault(name, []).append(binding)

    @staticmethod
    def _enclosing_function(s: _Scope) -> _Scope | None:
        p = s.parent
        while p is not None and p.kind == "class":
            p = p.parent
        return p

    def _bind_target(self, target: ast.expr, value: ast.expr | None) -> None:
        if isinstance(target, ast.Name):
            self._bind(target.id, _Binding("assign", value=value)
                       if value is not None else _Binding("other"))
        elif isinstance(target, ast.Tuple | ast.List):
            for elt in target.elts:
                self._bind_target(elt, None)
        elif isinstance(target, ast.Starred):
            self._bind_target(target.value, None)
        self.visit(target)

    def _push(self, kind: Literal["function", "class", "comprehension"]) -> _Scope:
        self.scope = _Scope(kind, self.scope)
        return self.scope

    def _pop(self) -> None:
        assert self.scope.parent is not None
        self.scope = self.scope.parent

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            self.scope_of[a] = self.scope
            if a.asname:
                self._bind(a.asname, _Binding("import", qualname=_canonical(a.name)))
            else:
                top = a.name.split(".")[0]
                self._bind(top, _Binding("import", qualname=top))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        for a in node.names:
            self.scope_of[a] = self.scope
            if a.name == "*":
                continue
            name = a.asname or a.name
            if node.level or not node.module:
                self._bind(name, _Binding("other"))
            else:
                self._bind(name, _Binding("import", qualname=_canonical(f"{node.module}.{a.name}")))

    def visit_Assign(self, node: ast.Assign) -> None:
        self.visit(node.value)
        single = len(node.targets) == 1
        for t in node.targets:
            self._bind_target(t, node.value if single else None)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.visit(node.value)
        self.visit(node.annotation)
        if node.value is not None:
            self._bind_target(node.target, node.value)
        else:
            self.visit(node.target)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self.visit(node.value)
        if isinstance(node.target, ast.Name):
            self._bind(node.target.id, _Binding("other"))
        self.visit(node.target)

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self.visit(node.value)
        self._bind(node.target.id, _Binding("other"))
        self.visit(node.target)

    def visit_For(self, node: ast.For | ast.AsyncFor) -> None:
        self.visit(node.iter)
        self._bind_target(node.target, None)
        for stmt in (*node.body, *node.orelse):
            self.visit(stmt)

    visit_AsyncFor = visit_For

    def visit_withitem(self, node: ast.withitem) -> None:
        self.visit(node.context_expr)
        if node.optional_vars is not None:
            self._bind_target(node.optional_vars, None)

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if node.type is not None:
            self.visit(node.type)
        if node.name:
            self._bind(node.name, _Binding("other"))
        for stmt in node.body:
            self.visit(stmt)

    def _bind_pattern_name(self, name: str | None) -> None:
        if name:
            self._bind(name, _Binding("other"))

    def visit_MatchAs(self, node: ast.MatchAs) -> None:
        self._bind_pattern_name(node.name)
        self.generic_visit(node)

    def visit_MatchStar(self, node: ast.MatchStar) -> None:
        self._bind_pattern_name(node.name)

    def visit_MatchMapping(self, node: ast.MatchMapping) -> None:
        self._bind_pattern_name(node.rest)
        self.generic_visit(node)

    def visit_Global(self, node: ast.Global) -> None:
        self.scope.globals.update(node.names)

    def visit_Nonlocal(self, node: ast.Nonlocal) -> None:
        self.scope.nonlocals.update(node.names)

    def _visit_arguments(self, args: ast.arguments) -> None:
        for a in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg):
            if a is not None:
                self._bind(a.arg, _Binding("other"))
                self.scope_of[a] = self.scope

    def _visit_signature_outside(self, args: ast.arguments) -> None:
        for d in (*args.defaults, *(d for d in args.kw_defaults if d is not None)):
            self.visit(d)
        for a in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg):
            if a is not None and a.annotation is not None:
                self.visit(a.annotation)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for d in node.decorator_list:
            self.visit(d)
        self._visit_signature_outside(node.args)
        if node.returns is not None:
            self.visit(node.returns)
        self._bind(node.name, _Binding("def", node=node))
        self._push("function")
        self._visit_arguments(node.args)
        for stmt in node.body:
            self.visit(stmt)
        self._pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self._visit_signature_outside(node.args)
        self._push("function")
        self._visit_arguments(node.args)
        self.visit(node.body)
        self._pop()

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for d in (*node.decorator_list, *node.bases, *node.keywords):
            self.visit(d)
        self._bind(node.name, _Binding("class", node=node))
        self._push("class")
        for stmt in node.body:
            self.visit(stmt)
        self._pop()

    def _visit_comprehension(self, node: ast.ListComp | ast.SetComp | ast.GeneratorExp
                             | ast.DictComp) -> None:
        self._push("comprehension")
        for gen in node.generators:
            self.visit(gen.iter)
            self._bind_target(gen.target, None)
            for cond in gen.ifs:
                self.visit(cond)
        if isinstance(node, ast.DictComp):
            self.visit(node.key)
            self.visit(node.value)
        else:
            self.visit(node.elt)
        self._pop()

    visit_ListComp = visit_SetComp = visit_GeneratorExp = visit_DictComp = _visit_comprehension

    # -- lookups ----------------------------------------------------------------------------------
    def lookup(self, name: str, node: ast.AST) -> list[_Binding]:
        """The bindings a name read at ``node`` may refer to (Python's LEGB, classes skipped)."""
        s: _Scope | None = self.scope_of.get(node, self.module)
        if s is not None and name in s.globals:
            s = self.module
        first = True
        while s is not None:
            if (first or s.kind != "class") and name in s.bindings:
                return s.bindings[name]
            first = False
            s = s.parent
        return []

    def qualname(self, expr: ast.AST) -> str | None:
        """``jax.numpy.empty`` for ``jnp.empty`` after ``import jax.numpy as jnp``; None if unknown."""
        if expr not in self._qualnames:
            self._qualnames[expr] = self._qualname(expr)
        return self._qualnames[expr]

    def _qualname(self, expr: ast.AST) -> str | None:
        if isinstance(expr, ast.Attribute):
            base = self.qualname(expr.value)
            return _canonical(f"{base}.{expr.attr}") if base else None
        if not isinstance(expr, ast.Name):
            return None
        bindings = self.lookup(expr.id, expr)
        if not bindings:
            return None
        # Every read of a name in one scope sees the same bindings: resolve them once (a name
        # assigned N times and read N times would otherwise cost N * N).
        key = id(bindings)  # the list lives in its scope for the whole run: a stable key
        if key in self._by_bindings:
            return self._by_bindings[key]
        if key in self._resolving:  # ``x = x.y`` style cycles
            return None
        self._resolving.add(key)
        try:
            found: set[str | None] = set()
            for b in bindings:
                if b.kind == "import":
                    found.add(b.qualname)
                elif b.kind == "assign" and b.value is not None:
                    found.add(self.qualname(b.value))
                else:
                    found.add(None)
                if len(found) > 1:
                    break
            result = found.pop() if len(found) == 1 else None
            self._by_bindings[key] = result
            return result
        finally:
            self._resolving.discard(key)

    def target(self, call: ast.Call) -> tuple[str | None, list[ast.keyword]]:
        """What a call really calls, looking through ``functools.partial(f, **kw)``.

        Returns the qualified name and the keywords that apply to it (the call's own plus a
        partial's).
        """
        q = self.qualname(call.func)
        if q == _PARTIAL and call.args:
            return self.qualname(call.args[0]), list(call.keywords)
        return q, list(call.keywords)

    def applied(self, call: ast.Call) -> str | None:
        """For ``partial(f, ...)(g)`` and ``f(**kw)(g)``: ``f``; else what ``call`` calls."""
        if isinstance(call.func, ast.Call):
            q, _ = self.target(call.func)
            if q is not None:
                return q
        return self.target(call)[0]

    def is_local_function(self, expr: ast.expr) -> bool:
        """A lambda, or a name bound only to functions defined (or lambdas assigned) in this file."""
        if isinstance(expr, ast.Lambda):
            return True
        if isinstance(expr, ast.Call) and self.qualname(expr.func) == _PARTIAL and expr.args:
            return self.is_local_function(expr.args[0])
        if not isinstance(expr, ast.Name):
            return False
        bindings = self.lookup(expr.id, expr)
        return bool(bindings) and all(
            b.kind == "def" or (b.kind == "assign" and isinstance(b.value, ast.Lambda))
            for b in bindings
        )


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
    bridge = sys.modules.get("jax._src.xla_bridge")
    started = bridge is None or getattr(bridge, "_backends", True)  # unknown: assume started
    if "fork" in methods and not started:
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
