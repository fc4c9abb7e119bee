"""Module paths in an Equinox tree as users see them (a key's path segment, a module's children,
the walk a plan sees, the paths inside a running module), and rebuilding the tree with annotated
classes and bound wrappers (:func:`bind`) or without them (:func:`strip`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import remat_common as rc
from remat_common.adapter import annotated_class, binding_of, original_class, with_class

from ._binding import FRAMEWORK, Binding, PlanRef
from ._remat import Remat
from ._scan import Stacked, num_layers

#: The plan pattern of the root module.
ROOT = "."

_MSG_DOT = """\
equinox_remat_plugin: the dict key {key!r} under {path!r} contains '.' or '/' (or is empty): '.'
separates module path segments and '/' a path from an activation name, so no plan pattern or
qualified name could address it unambiguously. Fix: use other keys for dicts that hold modules."""


def segment(key: Any, path: str) -> str:
    """One path segment from a JAX key-path entry: attribute name, list index or dict key."""
    if isinstance(key, jax.tree_util.GetAttrKey):
        s = key.name
    elif isinstance(key, jax.tree_util.SequenceKey):
        s = str(key.idx)
    elif isinstance(key, jax.tree_util.DictKey):
        s = str(key.key)
        if not s or "." in s or rc.adapter.SEP in s:
            raise rc.PlanError(_MSG_DOT.format(key=key.key, path=rc.adapter.display(path)))
    elif isinstance(key, jax.tree_util.FlattenedIndexKey):
        s = str(key.key)
    else:  # pragma: no cover - every key type JAX has today is handled above
        s = str(key).strip(".[]'\"")
    return s


def join(path: str, keys: tuple[Any, ...]) -> str:
    for k in keys:
        s = segment(k, path)
        path = f"{path}.{s}" if path else s
    return path


def children(module: Any) -> list[tuple[tuple[Any, ...], Any]]:
    """Every leaf of a module's fields with its key path; sub-modules are leaves."""
    leaves, _ = jax.tree_util.tree_flatten_with_path(
        module, is_leaf=lambda x: x is not module and isinstance(x, eqx.Module))
    return leaves

_MSG_NESTED_STACK = """\
equinox_remat_plugin: the Stacked at {inner!r} is inside the stacked layers at {outer!r}. A scan
inside a scan body is not supported by plans (layer paths would need two indices).
Fix: stack only the outer layers, and keep the inner ones as a Python list or tuple."""

_MSG_ROOT_STACK = """\
equinox_remat_plugin.annotate: the model itself is a Stacked; its layers would have no path to
address them by. Fix: hold the stack in a field of a model module (blocks: Stacked[Block]) and
annotate that model ('blocks.*': ...)."""


def _describe(x: Any) -> str:
    if eqx.is_array(x):
        return f"jax.Array {x.dtype}{list(x.shape)}"
    return type(x).__name__


@dataclasses.dataclass(frozen=True)
class _Stack:
    path: str
    n: int

    def virtual(self, path: str) -> list[str]:
        """``blocks.attn`` (a real path inside the stacked layer) -> ``blocks.0.attn``, ..."""
        rest = path[len(self.path):]
        return [f"{self.path}.{i}{rest}" for i in range(self.n)]

    def pattern(self, path: str) -> str:
        return self.path if path == self.path else f"{self.path}.*{path[len(self.path):]}"


@dataclasses.dataclass
class Walk:
    """What a plan sees of a model: module paths (stacked layers per layer), stacks, the
    annotations ``Remat`` declares in model code, and what is not a module."""

    paths: list[str] = dataclasses.field(default_factory=list)
    stacks: list[str] = dataclasses.field(default_factory=list)
    declared: list[rc.Rule] = dataclasses.field(default_factory=list)
    others: dict[str, str] = dataclasses.field(default_factory=dict)
    stacked: dict[str, tuple[str, int]] = dataclasses.field(default_factory=dict)
    modules: dict[str, Any] = dataclasses.field(default_factory=dict)
    real: dict[str, str] = dataclasses.field(default_factory=dict)
    wrappers: dict[str, Remat[Any]] = dataclasses.field(default_factory=dict)

    def view(self) -> rc.adapter.ModelView:
        """The model as :func:`remat_common.adapter.plan_model` sees it."""
        return rc.adapter.ModelView(
            paths=tuple(self.paths), stacks=tuple(self.stacks), declared=tuple(self.declared),
            others=self.others, stacked=self.stacked, describe=self.describe,
            modules=tuple(self.modules.items()))

    def describe(self, path: str) -> tuple[str, bool, bool] | None:
        """``(class name, has __call__, has __remat_custom__)`` of the module at ``path``."""
        module = self.modules.get(path)
        if module is None:
            return None
        return (type(module).__name__, callable(module),
                getattr(module, rc.adapter.CUSTOM_METHOD, None) is not None)

    def _declare(self, path: str, stack: _Stack | None, ann: rc.Annotation) -> None:
        pattern = stack.pattern(path) if stack else (path or ROOT)
        self.declared.append(rc.Rule(pattern, ann, f"equinox_remat_plugin.Remat at {path or '<root>'!r}"))

    def visit(self, node: Any, path: str, stack: _Stack | None = None) -> None:
        if isinstance(node, Remat):
            self.wrappers[path] = node
            if node.annotation is not None:
                self._declare(path, stack, node.annotation)
            self.visit(node.module, path, stack)
        elif isinstance(node, Stacked):
            if stack is not None:
                raise rc.PlanError(_MSG_NESTED_STACK.format(inner=path, outer=stack.path))
            if not path:
                raise rc.PlanError(_MSG_ROOT_STACK)
            layers = node.layers
            inner = _Stack(path, num_layers(layers, fn="annotate"))
            self.stacks.append(path)
            self.paths.append(path)
            self.modules[path] = node
            self.real[path] = path
            if isinstance(layers, Remat):
                self.wrappers[path] = layers
                if layers.annotation is not None:
                    self._declare(path, None, layers.annotation)
                layers = layers.module
            self._module(layers, path, inner)
        elif isinstance(node, eqx.Module):
            self._module(node, path, stack)
        else:
            for p in (stack.virtual(path) if stack else [path]):
                self.others[p] = _describe(node)

    def _module(self, module: Any, path: str, stack: _Stack | None) -> None:
        if stack is not None and path != stack.path:
            self.stacked[path] = (stack.path, stack.n)
        for p in (stack.virtual(path) if stack else [path]):
            self.paths.append(p)
            self.modules[p] = module
            self.real[p] = path
        for keys, child in children(module):
            self.visit(child, join(path, keys), stack)


def walk(model: Any) -> Walk:
    out = Walk()
    out.visit(model, "")
    return out


def _map_modules(tree: Any, fn: Callable[[tuple[Any, ...], Any], Any]) -> Any:
    """``tree`` with each outermost ``eqx.Module`` below it replaced by ``fn(key path, module)``;
    ``tree`` itself (the same object) when ``fn`` changed nothing."""
    changed = False

    def one(keys: tuple[Any, ...], child: Any) -> Any:
        nonlocal changed
        if not isinstance(child, eqx.Module):
            return child
        new = fn(keys, child)
        changed |= new is not child
        return new

    out = jax.tree_util.tree_map_with_path(
        one, tree, is_leaf=lambda x: x is not tree and isinstance(x, eqx.Module))
    return out if changed else tree


def touched_paths(walked: Walk, plan: rc.CompiledPlan) -> frozenset[str]:
    """The real module paths ``annotate`` gives annotated classes (or binds, for ``Remat``).

    The modules the plan names (a rule matches them) or acts on (boundaries, tagged inputs,
    ``custom``, declared ``Remat``), a stack whose layers hold one of them (its scan splits into
    layer groups), and the modules of a stack inside one of them. Nothing else: the root only when
    the plan names it; the other modules inside a named one keep their class, and names tagged
    there are qualified with their paths by the core's lookup of the module running now.
    """
    res = plan.resolution
    named = {p for matched in res.matches for p in matched} | set(res.active_paths)
    active = {walked.real[p] for p in named if p in walked.real}
    callables = {walked.real[p] for p, m in walked.modules.items()
                 if callable(m) and not isinstance(m, Stacked)}

    def inside(r: str, roots: set[str] | list[str]) -> bool:
        return any(r == a or r.startswith(a + ".") or not a for a in roots)

    # Modules inside a named one keep their class: the core's lookup places them when they run.
    # Inside a stack they are touched: its scan runs copies of the layers, which no finder places.
    out = {r for r in callables if r in active or (inside(r, walked.stacks) and inside(r, active))}
    out |= {s for s in walked.stacks if any(a == s or a.startswith(s + ".") for a in active)}
    return frozenset(out)


def bind(node: Any, path: str, touched: frozenset[str], ref: PlanRef, prevent_cse: bool, *,
         own_prevent_cse: bool = False) -> Any:
    """``node`` with the modules at ``touched`` paths given annotated classes and every ``Remat``
    written in model code bound to its path; everything else is the same object.
    ``own_prevent_cse``: each ``Remat`` keeps the ``prevent_cse`` it was built with."""
    binding = Binding(ref, prevent_cse)
    # A module inside a shared layer (``annotate(..., share_alike_layers=True)``) runs as its
    # counterpart in the group's first layer: the same class, so the layers' treedefs are equal.
    canonical = ref.plan.canonical_path

    def children(module: Any, at: str) -> Any:
        return _map_modules(module, lambda keys, child: one(child, join(at, keys)))

    def remat(node: Remat[Any], at: str) -> Remat[Any]:
        inner = node.module  # a Stacked is at the wrapper's path, its layers too
        inner = one(inner, at) if isinstance(inner, Stacked) else children(inner, at)
        return Remat._bound(inner, annotation=node.annotation,
                            path=canonical(at), plan=ref,
                            prevent_cse=node._prevent_cse if own_prevent_cse else prevent_cse)

    def module(m: Any, at: str) -> Any:
        rebuilt = children(m, at)
        if at in touched and callable(m):
            return with_class(rebuilt, annotated_class(FRAMEWORK, type(m), canonical(at), binding),
                              copy=True)
        return rebuilt

    def one(node: Any, at: str) -> Any:
        if isinstance(node, Remat):
            return remat(node, at)
        if isinstance(node, Stacked):
            layers = node.layers
            new = remat(layers, at) if isinstance(layers, Remat) else module(layers, at)
            return node if new is layers else eqx.tree_at(lambda s: s.layers, node, new)
        if isinstance(node, eqx.Module):
            return module(node, at)
        return node

    return one(node, path)


def strip(node: Any, *, keep_remat: bool = False) -> Any:
    """Every annotated class replaced by its original, and every :class:`Remat` by the module it
    wraps (unless ``keep_remat``: then they stay, as the rules written in model code)."""
    def one(_: Any, x: Any) -> Any:
        if isinstance(x, Remat) and not keep_remat:
            return one(None, x.module)
        rebuilt = _map_modules(x, one)
        cls = original_class(type(rebuilt))
        return rebuilt if cls is type(rebuilt) else with_class(rebuilt, cls, copy=True)

    if isinstance(node, eqx.Module):
        return one(None, node)
    return _map_modules(node, one)


def paths_under(anchor: Any, path: str) -> dict[int, str]:
    """``id(module) -> real path`` for the modules inside ``anchor`` (at ``path``), as :class:`Walk`
    names them (a ``Remat`` is at the path of the module it wraps; a stack's stacked layers at its
    path); the modules inside a stack are not entered: its scans run copies of them."""
    out: dict[int, str] = {}
    todo = [(anchor, path)]
    while todo:
        node, at = todo.pop()
        while isinstance(node, Remat):
            out.setdefault(id(node), at)
            node = node.module
        if not isinstance(node, eqx.Module) or id(node) in out:
            continue
        out[id(node)] = at
        if isinstance(node, Stacked):
            layers = node.layers
            while id(layers) not in out:  # through a Remat around them
                out[id(layers)] = at
                layers = layers.module if isinstance(layers, Remat) else layers
            continue
        for keys, child in children(node):
            if isinstance(child, eqx.Module):
                todo.append((child, join(at, keys)))
    return out


def bound_path(obj: Any) -> str | None:
    """The path ``annotate`` bound ``obj`` to (an annotated class, or a bound ``Remat``)."""
    bound = binding_of(obj)
    if bound is not None:
        return bound[0]
    if isinstance(obj, Remat):
        return obj._path
    return None


def is_module(obj: Any) -> bool:
    """A module of the model: an ``eqx.Module``, but not one of Equinox's own wrappers
    (``eqx.filter_value_and_grad``, ``filter_jit``, ``filter_vmap`` return modules that call the
    function they wrap; the layers of ``eqx.nn`` are modules of the model)."""
    where = type(obj).__module__
    return isinstance(obj, eqx.Module) and (not where.startswith("equinox.")
                                            or where.startswith("equinox.nn"))


def scoped(module: Any) -> bool:
    """Modules whose call opens its own scope (an annotated class or a bound ``Remat``: through
    call_module; a standalone ``Remat``: the module it wraps) or runs others (a ``Stacked``)."""
    return binding_of(module) is not None or isinstance(module, Remat | Stacked)
