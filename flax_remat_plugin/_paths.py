"""Module paths of an NNX model as a plan sees them: dotted, with stacked layers listed per layer."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable
from typing import Any

import jax
from flax import nnx

from remat_common import PlanError
from remat_common.adapter import SEP, display, in_subtree, join, nearest

_MSG_NOT_A_MODULE = """\
{fn}: expected an nnx.Module instance, got {what}.
Fix: pass the model object itself, e.g. {fn}(model, plan)."""

_MSG_BOUND_METHOD = """\
{fn}: got the bound method {name!r} of a {cls} instance.
nnx.remat (and so every remat boundary this package builds) must see the module as an argument
so that its state updates (rng streams, batch statistics) survive: a bound method hides it.
    wrong:  {fn}(model.{attr}, ...)
    right:  {fn}(model, ...)            # the module; its __call__ is wrapped for you
For a function of your own, use nnx.remat(MyModule.{attr})(model, ...), the unbound form."""

_MSG_BAD_KEY = """\
module {path!r}: child key {key!r} cannot be written as a dotted path segment (it contains '.' or
'/', or is empty): '.' separates path segments and '/' a path from an activation name, so no plan
pattern or qualified name could address it unambiguously. Fix: rename the nnx.Dict key."""

_MSG_STACK = """\
{fn}: stack {path!r} {why}
Fix: {fix}"""


def check_module(obj: Any, fn: str) -> nnx.Module:
    """``obj`` if it is an ``nnx.Module``; a TypeError naming what it is and the fix otherwise."""
    if isinstance(obj, nnx.Module):
        return obj
    self = getattr(obj, "__self__", None)
    if isinstance(self, nnx.Module) and callable(obj):
        attr = getattr(obj, "__name__", "__call__")
        raise TypeError(_MSG_BOUND_METHOD.format(fn=fn, name=f"{type(self).__name__}.{attr}",
                                                 cls=type(self).__name__, attr=attr))
    raise TypeError(_MSG_NOT_A_MODULE.format(fn=fn, what=f"{type(obj).__name__} {obj!r:.80}"))


def is_module(obj: Any) -> bool:
    return isinstance(obj, nnx.Module)


def graph_paths(module: nnx.Module, path: str) -> dict[int, str]:
    """``id -> real path`` of ``module`` (at ``path``) and every module in its graph, as NNX's graph
    traversal names them (``nnx.List`` indices, ``nnx.Dict`` keys)."""
    out: dict[int, str] = {}
    for keys, node in nnx.iter_graph(module):
        if isinstance(node, nnx.Module) and id(node) not in out:
            out[id(node)] = join(path, *map(str, keys))
    return out


def _segment(path: str, key: Any) -> str:
    seg = str(key)
    if not seg or "." in seg or SEP in seg:
        raise PlanError(_MSG_BAD_KEY.format(path=display(path), key=key))
    return seg


@dataclasses.dataclass(frozen=True)
class ModuleTree:
    """Every module of a model by dotted path, the stacked-layer modules and the other nodes.

    Attributes:
      modules: ``(path, module)`` for every ``nnx.Module`` in the graph (a shared module once, under
        the first path NNX's graph traversal gives it); ``""`` is the root.
      stacks: ``(path, number of layers)`` of the stacked-layer modules (built with ``nnx.vmap``).
      others: ``(path, type name)`` of the graph's other entries (variables, rng streams, static
        attributes), for error messages.
      aliases: ``(path, first path)`` of a shared module's other paths.
    """

    modules: tuple[tuple[str, nnx.Module], ...]
    stacks: tuple[tuple[str, int], ...]
    others: tuple[tuple[str, str], ...]
    aliases: tuple[tuple[str, str], ...] = ()

    @property
    def stack_paths(self) -> tuple[str, ...]:
        return tuple(p for p, _ in self.stacks)

    def stack_of(self, path: str) -> str | None:
        """The stack whose subtree holds ``path`` (the stack itself included), if any."""
        return next((s for s, _ in self.stacks if in_subtree(path, s)), None)

    def virtual(self, path: str, index: int | str) -> str:
        """A real path under a stack written for one layer: ``layers.attn`` → ``layers.3.attn``."""
        stack = self.stack_of(path)
        if stack is None:
            return path
        return join(stack, str(index), path[len(stack):].lstrip("."))

    @property
    def plan_paths(self) -> tuple[str, ...]:
        """The paths a plan is resolved against: stacked layers listed per layer (virtual paths)."""
        out: list[str] = []
        n_of = dict(self.stacks)
        for path, _ in self.modules:
            stack = self.stack_of(path)
            if stack is None or path == stack:
                out.append(path)
            if stack is not None:
                out.extend(self.virtual(path, i) for i in range(n_of[stack]))
        return tuple(dict.fromkeys(out))

    def real(self, plan_path: str) -> str:
        """The real module path of a plan path (``layers.3.attn`` → ``layers.attn``)."""
        for stack, _ in self.stacks:
            pre = stack + "." if stack else ""
            rest = plan_path[len(pre):] if plan_path.startswith(pre) else None
            if rest is not None:
                head, _, tail = rest.partition(".")
                if head.isdigit():
                    return join(stack, tail)
        return plan_path

    def module(self, path: str) -> nnx.Module | None:
        return self._by_path.get(path)

    @functools.cached_property
    def _by_path(self) -> dict[str, nnx.Module]:  # a dict per call made annotate quadratic
        return dict(self.modules)


def _path_key(path: tuple[Any, ...]) -> tuple[tuple[int, Any], ...]:
    return tuple((0, k) if isinstance(k, int) else (1, str(k)) for k in path)


def num_layers(module: nnx.Module, *, fn: str, path: str) -> int:
    """The leading (layer) axis size shared by every array of a stack built with ``nnx.vmap``."""
    leaves = [x for x in jax.tree_util.tree_leaves(nnx.state(module)) if getattr(x, "ndim", 0) >= 1]
    sizes = sorted({int(x.shape[0]) for x in leaves})
    if not leaves:
        raise PlanError(_MSG_STACK.format(
            fn=fn, path=display(path), why="holds no arrays, so it cannot be a stack of layers.",
            fix="list only modules built with nnx.vmap (one leading layer axis) as stacks."))
    if len(sizes) != 1:
        raise PlanError(_MSG_STACK.format(
            fn=fn, path=display(path), why=f"has arrays with different leading sizes {sizes}; "
            "stacked layers share one leading layer axis.",
            fix="build the stack with nnx.vmap(..., in_axes=0, out_axes=0), or do not list it "
                "as a stack."))
    return sizes[0]


def _describe(node: Any) -> str:
    value = node.get_value() if isinstance(node, nnx.Variable) else node
    shape = getattr(value, "shape", None)
    if shape is not None and hasattr(value, "dtype"):
        return f"{type(node).__name__} {value.dtype}{list(shape)}"
    return type(node).__name__


def _nearest(path: str, paths: Iterable[str]) -> str:
    return ", ".join(repr(p) for p in nearest(path, paths)) or "(none)"


def module_tree(model: nnx.Module, stacks: Iterable[str] = (), *, fn: str = "module_tree") -> ModuleTree:
    """Walks ``model``'s graph: every module by dotted path, plus the declared stacks.

    Stacks are the ``stacks`` given (paths from ``model``) plus the ``__remat_stacks__`` that any
    module's class declares (paths relative to that module).
    """
    check_module(model, fn)
    found: dict[str, nnx.Module] = {}
    others: dict[str, str] = {}
    seen: dict[int, str] = {}
    aliases: dict[str, str] = {}
    items = sorted(nnx.iter_graph(model), key=lambda kv: _path_key(kv[0]))
    for keys, node in items:
        if any(isinstance(k, str) and k.startswith("_pytree__") for k in keys):
            continue
        prefix = ""
        for k in keys:
            prefix = join(prefix, _segment(prefix, k))
        if isinstance(node, nnx.Module):
            if id(node) not in seen:  # shared modules: first path only
                seen[id(node)] = prefix
                found[prefix] = node
            else:
                aliases[prefix] = seen[id(node)]
        else:
            others[prefix] = _describe(node)
    for path, module in list(found.items()):  # a module held by two attributes: both paths
        for name, value in vars(module).items():
            first = seen.get(id(value)) if isinstance(value, nnx.Module) else None
            here = join(path, str(name))
            if first is not None and first != here and here not in found:
                aliases[here] = first
    declared = [*stacks]
    for path, module in found.items():
        for rel in getattr(type(module), "__remat_stacks__", ()):
            declared.append(join(path, rel))
    stack_sizes: dict[str, int] = {}
    for s in dict.fromkeys(declared):
        if s == "":
            raise PlanError(_MSG_STACK.format(
                fn=fn, path=s, why="is the model itself; a stack is a submodule of the model.",
                fix="put the stacked layers in a parent module (self.layers = create(rngs)), or run "
                    "them with scan_layers without declaring a stack (one annotation for every layer)."))
        if s not in found:
            raise PlanError(_MSG_STACK.format(
                fn=fn, path=s, why="is not a module path of this model.",
                fix=f"use one of the module paths; nearest: {_nearest(s, found)}."))
        outer = next((t for t in stack_sizes if t != s and (in_subtree(s, t) or in_subtree(t, s))), None)
        if outer is not None:
            raise PlanError(_MSG_STACK.format(
                fn=fn, path=s,
                why=f"is nested with stack {outer!r}; one level of stacked layers is supported.",
                fix="scan the outer stack and run the inner one with a plain loop, or list only one."))
        indexed = [p for p in found if p.startswith(f"{s}.") and p[len(s) + 1:].isdigit()]
        if indexed:
            raise PlanError(_MSG_STACK.format(
                fn=fn, path=s,
                why=f"({type(found[s]).__name__}) holds {len(indexed)} modules by index "
                    f"({', '.join(map(repr, indexed[:3]))}{', ...' if len(indexed) > 3 else ''}): a "
                    "list of layers run in a Python loop, not layers stacked with nnx.vmap.",
                fix=f"leave {s!r} out of stacks; a plan addresses its layers as they are "
                    f"({s}.*, {s}.[0-3])."))
        stack_sizes[s] = num_layers(found[s], fn=fn, path=s)
    return ModuleTree(tuple(found.items()), tuple(stack_sizes.items()), tuple(others.items()),
                      tuple(aliases.items()))


def module_paths(model: nnx.Module, *, stacks: Iterable[str] = ()) -> tuple[str, ...]:
    """The module paths a plan for ``model`` can name (``""`` is the root).

    Lists and dicts of modules appear by index or key (``layers.0.attn``); the layers of a stack
    (built with ``nnx.vmap``, declared with ``stacks=`` or a class's ``__remat_stacks__``) appear
    once per layer (``layers.3.mlp``), as the plan addresses them.

    >>> from flax import nnx
    >>> class Net(nnx.Module):
    ...     def __init__(self, rngs):
    ...         self.layers = nnx.List([nnx.Linear(2, 2, rngs=rngs) for _ in range(2)])
    >>> module_paths(Net(nnx.Rngs(0)))
    ('', 'layers', 'layers.0', 'layers.1')
    """
    return module_tree(model, stacks, fn="module_paths").plan_paths
