"""Name resolution for ``remat lint``: what a name in a file stands for, through its imports and
simple assignments, scope by scope (:class:`Resolver`), from Python's :mod:`ast` alone."""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Iterator
from typing import Any, Final, Literal


_ALIASES: Final = {
    "jax.remat": "jax.checkpoint",
    "jax.ad_checkpoint.checkpoint_policies": "jax.checkpoint_policies",
    "flax.linen.checkpoint": "flax.linen.remat",
}
PARTIAL: Final = "functools.partial"
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


class Resolver(ast.NodeVisitor):
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
        if q == PARTIAL and call.args:
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
        if isinstance(expr, ast.Call) and self.qualname(expr.func) == PARTIAL and expr.args:
            return self.is_local_function(expr.args[0])
        if not isinstance(expr, ast.Name):
            return False
        bindings = self.lookup(expr.id, expr)
        return bool(bindings) and all(
            b.kind == "def" or (b.kind == "assign" and isinstance(b.value, ast.Lambda))
            for b in bindings
        )
