"""What reverse-mode AD keeps: the residuals of a traced function, each with its size, placement,
tag name and module (:func:`saved_residuals`), read from the jaxpr that AD saves for the
backward pass. The verifier (``_verify.py``) compares them with what a plan says."""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable, Iterable
from typing import Any, Literal

import jax
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from ._arrays import is_array, is_float
from ._context import collect_tags
from ._errors import type_error
from ._framework import frameworks
from ._jaxcompat import (
    checkpoint_name_of,
    is_checkpoint_name_object,
    is_literal,
    name_stack_of,
    remat3_on,
    scan_split,
    summarize_source,
)
from ._module_calls import ModuleCalls
from ._context import module_calls
from ._paths import SEP, common_path, in_subtree, kept_for, module_of
from ._records import Tag


Placement = Literal["device", "host"]
ResidualKind = Literal["argument", "copy", "named", "offloaded", "opaque", "other"]

_NAMED = re.compile(r"^named '([^']*)'")


@dataclasses.dataclass(frozen=True)
class Residual:
    """One value kept for the backward pass.

    Attributes:
      kind: ``argument`` (an input of the differentiated function), ``copy`` (a slice of an
        argument, such as a layer group's share of stacked parameters), ``named`` (a tagged value
        kept on device), ``offloaded`` (moved to host), ``opaque`` (made inside a primitive the
        verifier cannot look into) or ``other``.
      name: the qualified tag name, also inside scans and nested jits (the verifier follows each
        residual back to the equation that made it).
      path: the module path part of ``name``.
      shape, dtype, nbytes: of the residual as kept; inside a scan the leading axis is the
        iterations (``layers`` of them) and ``nbytes`` counts them all.
      placement: ``device`` or ``host``.
      source: where JAX made it.
      layers: how many copies are stacked (the scan's iterations, multiplied through nested
        scans); ``nbytes // layers`` is one layer's share.
      module: the module the residual was made in, where its name does not say it: the module
        path the tags of its scan or nested jit share, else the innermost module scope it was
        traced in (the adapters open one per module call; a measurement, for every module).
    """

    kind: ResidualKind
    name: str | None
    path: str | None
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    placement: Placement
    source: str
    layers: int = 1
    module: str | None = None

    @property
    def per_layer(self) -> int:
        """Bytes kept per layer (per scan iteration); ``nbytes`` outside scans."""
        return self.nbytes // max(self.layers, 1)

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["shape"] = list(self.shape)
        return d


@dataclasses.dataclass(frozen=True)
class ResidualReport:
    """Residuals of a function under reverse-mode AD plus the tags its trace produced."""

    residuals: tuple[Residual, ...]
    tags: tuple[Tag, ...]

    @property
    def produced(self) -> frozenset[str]:
        return frozenset(t.name for t in self.tags)

    def select(self, *, placement: Placement | None = None,
               include_arguments: bool = False) -> tuple[Residual, ...]:
        return tuple(
            r for r in self.residuals
            if (include_arguments or r.kind != "argument")
            and (placement is None or r.placement == placement)
        )

    def nbytes(self, placement: Placement | None = None, *, include_arguments: bool = False) -> int:
        return sum(r.nbytes for r in self.select(placement=placement,
                                                  include_arguments=include_arguments))

    def names(self, placement: Placement | None = None) -> frozenset[str]:
        return frozenset(r.name for r in self.select(placement=placement) if r.name is not None)

    @property
    def opaque(self) -> bool:
        """True when some residuals come out of a primitive the verifier cannot look into."""
        return any(r.kind == "opaque" for r in self.residuals)

    def table(self) -> str:
        stacked = any(r.layers > 1 for r in self.residuals)
        head = ("kind", "name", "shape", "dtype", "bytes") + (("layers", "per layer") if stacked else ())
        rows = [(*head, "placement")]
        for r in self.residuals:
            extra = (str(r.layers), str(r.per_layer)) if stacked else ()
            rows.append((r.kind, r.name or (f"({r.module})" if r.module else "-"), str(list(r.shape)),
                         r.dtype, str(r.nbytes), *extra, r.placement))
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows)

    def to_json(self) -> dict[str, Any]:
        return {
            "residuals": [r.to_json() for r in self.residuals],
            "tags": sorted(self.produced),
            "device_bytes": self.nbytes("device"),
            "host_bytes": self.nbytes("host"),
            "argument_bytes": sum(r.nbytes for r in self.residuals if r.kind == "argument"),
        }


def jaxpr_names(jaxpr: Any, out: set[str]) -> None:
    """Collects every checkpoint_name tag in a (closed) jaxpr, remat3's hi-primitives included."""
    seen: set[int] = set()

    def visit(obj: Any) -> None:
        if id(obj) in seen:
            return
        seen.add(id(obj))
        if hasattr(obj, "eqns"):
            for eqn in obj.eqns:
                if eqn.primitive.name == "name" and "name" in eqn.params:
                    out.add(eqn.params["name"])
                for v in eqn.params.values():
                    visit(v)
        elif hasattr(obj, "jaxpr") and hasattr(obj, "consts"):
            visit(obj.jaxpr)
        elif isinstance(obj, tuple | list):
            for v in obj:
                visit(v)
        elif is_checkpoint_name_object(obj):
            out.add(obj.params["name"])
        elif isinstance(getattr(obj, "params", None), dict):
            for v in obj.params.values():
                visit(v)

    visit(jaxpr)


def tag_path(name: str | None) -> str | None:
    if name is None or SEP not in name:
        return None
    return name.rpartition(SEP)[0]


def aval_nbytes(aval: Any) -> int:
    """Bytes of one abstract value, extended dtypes (typed PRNG keys) by their real size.

    ``np.dtype`` cannot read ``key<fry>``; its ``itemsize`` (the key data, two uint32) can.

    >>> aval_nbytes(jax.random.split(jax.random.key(0), 3))  # anything with shape and dtype
    24
    """
    shape = tuple(int(d) for d in getattr(aval, "shape", ()))
    dtype = getattr(aval, "dtype", None)
    itemsize = int(getattr(dtype, "itemsize", 0) or 0)
    return int(np.prod(shape, dtype=np.int64)) * itemsize


def _dtype_name(aval: Any) -> str:
    dtype = getattr(aval, "dtype", None)
    return getattr(dtype, "name", None) or str(dtype)


def _host(aval: Any) -> bool:
    return "Host" in str(getattr(aval, "memory_space", ""))


# Primitives whose i-th output is its i-th input, placed or rounded: a residual is its producer's.
_LOOK_THROUGH = frozenset({"reduce_precision", "device_put", "copy", "copy_p", "optimization_barrier"})
# Primitives that copy part of one operand: a residual made by them from an argument is a copy.
_SLICING = frozenset({"slice", "dynamic_slice"})
# Primitives that only reshape: followed back with the slicing ones, a slice of an argument stays one.
_RESHAPING = frozenset({"squeeze", "reshape", "expand_dims", "broadcast_in_dim"})


def _open(j: Any) -> Any:
    """The open jaxpr of a jaxpr or closed jaxpr (``None`` for anything else)."""
    if hasattr(j, "eqns") and hasattr(j, "invars"):
        return j
    inner = getattr(j, "jaxpr", None)
    if inner is not None and hasattr(inner, "eqns") and hasattr(getattr(j, "consts", None), "__len__"):
        return inner
    return None


def _call_body(eqn: Any) -> Any:
    """The body of a call-like equation (jit, checkpoint, custom_jvp/vjp call, closed_call): one
    input per operand and one output per result; ``None`` for any other primitive."""
    for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        body = _open(eqn.params.get(key))
        if (body is not None and len(body.invars) == len(eqn.invars)
                and len(body.outvars) == len(eqn.outvars)):
            return body
    return None


def _names_in(jaxpr: Any) -> set[str]:
    out: set[str] = set()
    jaxpr_names(jaxpr, out)
    return out


def _tag_paths(jaxpr: Any) -> frozenset[str]:
    """The module paths of the qualified tags in a jaxpr (modules that ran)."""
    return frozenset(p for p in map(tag_path, _names_in(jaxpr)) if p)


def _module_of(names: Iterable[str]) -> str | None:
    """The longest module path shared by the qualified ``names`` (None when they share none)."""
    return common_path(p for p in (tag_path(n) for n in names) if p)


@dataclasses.dataclass(frozen=True)
class _Origin:
    """Where one residual comes from, found by walking the jaxpr of the vjp."""

    kind: ResidualKind
    name: str | None = None
    source: str = ""
    layers: int = 1
    host: bool = False
    module: str | None = None


class _Walker:
    """Follows each residual of a vjp's jaxpr back to the equation that made it, through scans
    (whose residuals are stacked per iteration), nested jits, checkpoints and placements.
    ``modules``: the model's module paths where known (the module scopes that ran)."""

    def __init__(self, arg_names: list[str], modules: frozenset[str] | None = None) -> None:
        self.arg_names = arg_names
        self.modules = modules
        self._producers: dict[int, dict[Any, tuple[Any, int]]] = {}

    def _scope(self, eqn: Any, module: str | None) -> str | None:
        """The innermost module scope ``eqn`` was traced in, else ``module`` (its enclosing
        body's)."""
        found = module_of(name_stack_of(eqn), self.modules)
        return module if found is None else found

    def _body_module(self, body: Any, eqn: Any, module: str | None) -> str | None:
        """The module of a scan's or a call's body: the path its tags share, else the path the
        module scopes of its equations share, else the scope of the equation that runs it."""
        tagged = _module_of(_names_in(body))
        if tagged is not None:
            return tagged
        scopes = {m for e in body.eqns
                  if (m := module_of(name_stack_of(e), self.modules)) is not None}
        shared = common_path(scopes) if scopes else None
        outer = self._scope(eqn, module)
        return shared if shared and (outer is None or in_subtree(shared, outer)) else outer

    def _producer(self, jaxpr: Any, v: Any) -> tuple[Any, int] | None:
        table = self._producers.get(id(jaxpr))
        if table is None:
            table = {o: (e, i) for e in jaxpr.eqns for i, o in enumerate(e.outvars)}
            self._producers[id(jaxpr)] = table
        if is_literal(v):  # literals are unhashable on some versions
            return None
        return table.get(v)

    def top(self, jaxpr: Any, v: Any) -> _Origin:
        def on_invar(j: int, layers: int) -> _Origin:
            return _Origin("argument", source=f"from the argument {self.arg_names[j]}", layers=layers)

        got = self.walk(jaxpr, v, 1, on_invar, module=None, via=())
        readers = [e for e in jaxpr.eqns if any(x is v for x in e.invars)]
        found = self._producer(jaxpr, v)
        if got.kind == "copy" and not any(e.primitive.name == "scan" for e in readers) and (
                found is None or found[0].primitive.name != "scan"):
            # A slice of an argument that no scan reads (weights indexed in a Python loop): what
            # plain AD keeps for that code, not a layer group's copy of stacked parameters.
            got = dataclasses.replace(got, kind="other", source=got.source.partition(": a slice")[0])
        if got.module is None and got.kind in ("copy", "opaque", "other"):
            # A value made outside any scan or jit (a layer group's parameter slice) is named
            # after the module(s) of the equations that read it.
            module = _module_of(n for e in readers for n in _names_in(list(e.params.values())))
            if module is not None:
                got = dataclasses.replace(got, module=module)
        if got.kind == "other" and got.name is None:
            got = dataclasses.replace(got, module=kept_for(
                got.module, (self._scope(e, None) for e in readers)))
        return got

    def walk(self, jaxpr: Any, v: Any, layers: int, on_invar: Callable[[int, int], _Origin],
             module: str | None, via: tuple[str, ...]) -> _Origin:
        host = False
        sliced: list[str] = []
        first: Any = None  # the first slicing or reshaping equation
        cut = False
        got = None
        for _ in range(10_000):
            if is_literal(v):
                if sliced:  # a constant broadcast (zeros, a mask): the broadcast is the residual
                    break
                return _Origin("other", source="from a literal", layers=layers, module=module)
            host = host or _host(getattr(v, "aval", None))
            if v in jaxpr.invars:
                got = on_invar(jaxpr.invars.index(v), layers)
                break
            if v in getattr(jaxpr, "constvars", ()):
                got = _Origin("other", source="from a constant", layers=layers)
                break
            found = self._producer(jaxpr, v)
            if found is None:
                got = _Origin("opaque", source="no equation produces it", layers=layers,
                              module=module)
                break
            eqn, i = found
            src = summarize_source(eqn)
            name = checkpoint_name_of(eqn)
            prim = eqn.primitive.name
            if name is not None:
                got = _Origin("named", name=name, source=f"named {name!r} from {src}", layers=layers,
                              module=self._scope(eqn, module))
                break
            if prim in _LOOK_THROUGH and i < len(eqn.invars):
                v = eqn.invars[i]
                continue
            if prim in _SLICING | _RESHAPING and eqn.invars:
                sliced.append(f"{prim} from {src}")
                first = first if first is not None else eqn
                cut = cut or prim in _SLICING
                v = eqn.invars[0]
                continue
            if sliced:  # a slice of something computed: the slice is the residual
                break
            if prim == "scan":
                got = self._scan(jaxpr, eqn, i, layers, on_invar, via + (src,))
                break
            body = _call_body(eqn)
            if body is not None:
                outer = (jaxpr, eqn)

                def inner(j: int, lay: int, outer: tuple[Any, Any] = outer) -> _Origin:
                    return self.walk(outer[0], outer[1].invars[j], lay, on_invar, module, via)

                got = self.walk(body, body.outvars[i], layers, inner,
                                self._body_module(body, eqn, module),
                                via + (src,))
                break
            if any(_open(p) is not None or (isinstance(p, tuple | list)
                                            and any(_open(q) is not None for q in p))
                   for p in eqn.params.values()):
                got = _Origin("opaque", source=f"output of {prim} from {src}: the verifier does not "
                              f"look inside {prim}", layers=layers,
                              module=_module_of(_names_in(list(eqn.params.values()))) or module)
                break
            got = _Origin("other", source=f"output of {prim} from {src}", layers=layers,
                          module=self._scope(eqn, module))
            break
        else:  # pragma: no cover - a cycle cannot occur in a jaxpr
            got = _Origin("opaque", source="too deep", layers=layers, module=module)
        if sliced and got is not None and got.kind == "argument" and cut:
            got = dataclasses.replace(got, kind="copy", module=got.module or module, source=(
                f"output of {sliced[0]}: a slice of {got.source.removeprefix('from ')}"))
        elif sliced:  # a reshaped argument, or a slice of something computed: itself the residual
            got = _Origin("other", source=f"output of {sliced[0]}", layers=layers,
                          module=self._scope(first, module))
        assert got is not None
        if host and not got.host:
            got = dataclasses.replace(got, host=True)
        return got

    def _scan(self, jaxpr: Any, eqn: Any, i: int, layers: int,
              on_invar: Callable[[int, int], _Origin], via: tuple[str, ...]) -> _Origin:
        body = _open(eqn.params.get("jaxpr"))
        split = scan_split(eqn)
        module = self._body_module(body, eqn, None) if body is not None else self._scope(eqn, None)
        if body is None or split is None or len(body.outvars) != len(eqn.outvars):
            return _Origin("opaque", source=f"output of scan from {via[-1]}: this jax "
                           f"{jax.__version__} scan layout is not one the verifier can read",
                           layers=layers, module=module)
        nc, ncarry = split
        length = int(eqn.params["length"])
        if i < ncarry:
            return _Origin("other", source=f"the final carry of scan from {via[-1]}", layers=layers,
                           module=module)

        def inner(j: int, lay: int) -> _Origin:
            if j >= nc + ncarry:  # a per-iteration input (xs): the residual is the scanned array
                return self.walk(jaxpr, eqn.invars[j], layers, on_invar, module, via)
            if j < nc:  # a loop-invariant argument (stacked parameters indexed per iteration):
                # the walk that reached it sliced it, so the residual is a copy of that argument
                outer = self.walk(jaxpr, eqn.invars[j], layers, on_invar, module, via)
                if outer.kind == "argument":
                    return dataclasses.replace(outer, layers=lay)
            what = "loop-invariant value" if j < nc else "carry (each iteration's input)"
            return _Origin("other", source=f"{what} of scan from {via[-1]}, kept per iteration",
                           layers=lay, module=module)

        return self.walk(body, body.outvars[i], layers * length, inner, module, via)


def _trace_residuals(fun: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
                     ) -> tuple[list[tuple[Any, _Origin]], Any]:
    """Residuals of reverse-mode AD of ``fun`` w.r.t. its floating-point array leaves.

    Other leaves (integers, bools, typed PRNG keys) are inputs of the traced program but are not
    differentiated, as ``jax.grad`` would not; anything that is not an array is held fixed.
    """
    paths_leaves, tree = jax.tree_util.tree_flatten_with_path((args, kwargs))
    leaves = [leaf for _, leaf in paths_leaves]
    # An abstract argument (jax.ShapeDtypeStruct: an eval_shape model) is traced like an array.
    abstract = [isinstance(leaf, jax.ShapeDtypeStruct) for leaf in leaves]
    floating = [is_float(leaf) or (a and jax.dtypes.issubdtype(leaf.dtype, np.inexact))
                for leaf, a in zip(leaves, abstract)]
    diff = [i for i, f in enumerate(floating) if f]
    fixed = [i for i, leaf in enumerate(leaves)
             if (is_array(leaf) or abstract[i]) and not floating[i]]

    def names(idx: list[int]) -> list[str]:
        out = []
        for i in idx:
            path = jax.tree_util.keystr(paths_leaves[i][0])
            out.append(path.replace("[0]", "args", 1) if path.startswith("[0]") else path)
        return out

    def f(diff_vals: list[Any], fixed_vals: list[Any]) -> Any:
        def g(*d: Any) -> Any:
            full = list(leaves)
            for i, x in zip(diff, d):
                full[i] = x
            for i, x in zip(fixed, fixed_vals):
                full[i] = x
            a, k = jax.tree_util.tree_unflatten(tree, full)
            return fun(*a, **k)

        return jax.vjp(g, *diff_vals)

    closed, shape = jax.make_jaxpr(f, return_shape=True)(
        [leaves[i] for i in diff], [leaves[i] for i in fixed])
    jaxpr = closed.jaxpr
    num_res = len(jax.tree_util.tree_leaves(shape[1]))
    res_vars, seen = [], set()
    for v in jaxpr.outvars[len(jaxpr.outvars) - num_res:]:
        if is_literal(v) or id(v) not in seen:  # JAX lists each variable once
            seen.add(id(v))
            res_vars.append(v)
    calls = module_calls()
    scoped = calls.scoped if isinstance(calls, ModuleCalls) else set()
    walker = _Walker(names(diff) + names(fixed), frozenset(scoped) | _tag_paths(jaxpr) or None)
    return [(getattr(v, "aval", None), walker.top(jaxpr, v)) for v in res_vars], jaxpr


_MSG_CYCLE = """\
{fn}: the arguments hold a reference cycle:
{where} contains itself ({hint}), so they are no
pytree: flattening them would recurse without end and kill the interpreter. Fix: pass what the
function differentiates without the cycle, e.g. the state, and rebuild the model inside:
{fn}(lambda s: loss(nnx.merge(graphdef, s, copy=True)), state) with graphdef, state =
nnx.split(model); or keep the parent out of the child (pass it as a call argument)."""


def check_acyclic(fn: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Refuses a pytree that contains itself (which ``jax.tree_util`` flattens without end: a
    ``RecursionError`` that can take the interpreter down). Walked one level at a time, without
    recursion; each node is entered once."""
    def children(node: Any) -> list[tuple[str, Any]]:
        calls = [0]

        def below(_: Any) -> bool:  # the node itself is flattened, everything under it is a leaf
            calls[0] += 1
            return calls[0] > 1

        flat, _ = jax.tree_util.tree_flatten_with_path(node, is_leaf=below)
        if len(flat) == 1 and flat[0][1] is node:
            return []
        return [(jax.tree_util.keystr(k), c) for k, c in flat]

    done: set[int] = set()
    on_path: dict[int, str] = {}
    todo: list[tuple[Any, str, bool]] = [(v, f"kwargs[{k!r}]", False) for k, v in kwargs.items()]
    todo += [(a, f"args[{i}]", False) for i, a in reversed(list(enumerate(args)))]
    while todo:
        node, where, leaving = todo.pop()
        if leaving:
            on_path.pop(id(node), None)
            done.add(id(node))
            continue
        if id(node) in on_path:
            hint = (f"a {type(node).__name__} that holds itself through its items"
                    if type(node) in (list, tuple, dict) else
                    "a child module that keeps a reference to its parent?")
            raise TypeError(_MSG_CYCLE.format(
                fn=fn, hint=hint,
                where=f"the {type(node).__name__} at {on_path[id(node)]} (again at {where})"))
        if id(node) in done or is_array(node):
            continue
        kids = children(node)
        if not kids:
            done.add(id(node))
            continue
        on_path[id(node)] = where
        todo.append((node, where, True))
        todo.extend((c, where + k, False) for k, c in reversed(kids))


def saved_residuals(fun: Callable[..., Any], *args: Any, **kwargs: Any) -> ResidualReport:
    """What reverse-mode AD of ``fun(*args)`` keeps: every residual with name, bytes and placement.

    A model among the arguments whose annotations are all written in model code (``erp.Remat``
    wrappers, ``@frp.remat`` classes) is traced as the plan it carries (``erp.plan_of(model)`` /
    ``frp.compiled_plan(model)``: each annotated module at its path, names path-qualified), not as
    separate one-boundary plans with unqualified names; see
    :attr:`remat_common.adapter.Framework.bind_models`.

    Each residual of ``jax.vjp`` (w.r.t. the floating-point array leaves of the arguments;
    integer, bool and typed-key leaves are inputs but not differentiated) is followed back through
    the jaxpr to the equation that made it, as JAX's ``saved_residuals`` does, and further: into
    scans (a residual made inside a scanned layer keeps its name, with ``layers`` = iterations),
    nested jits and checkpoints, and through host placements. Sizes of extended dtypes (typed PRNG
    keys) are their real sizes. Tags are collected from this project's :func:`checkpoint_name`
    calls and from the jaxpr (JAX's own tags).

    >>> import jax.numpy as jnp
    >>> from remat_common import checkpoint, checkpoint_name
    >>> f = checkpoint(lambda x: jnp.sum(jnp.sin(checkpoint_name(x * 2, "h"))), {"save": ["h"]})
    >>> [r.name for r in saved_residuals(f, jnp.ones(3)).select()]
    ['h']
    """
    if not callable(fun):
        raise type_error("saved_residuals", "fun", fun, "a function",
                         "saved_residuals(loss_fn, *args): the function first, then its arguments.")
    check_acyclic("saved_residuals", args, kwargs)
    for fw in frameworks():
        if fw.bind_models is not None:
            args, kwargs = fw.bind_models((args, kwargs))
    with collect_tags() as tags:
        found, jaxpr = _trace_residuals(fun, args, kwargs)
    names: set[str] = set()
    jaxpr_names(jaxpr, names)
    known = {t.name for t in tags}
    all_tags = list(dict.fromkeys(tags)) + [Tag(n, tag_path(n), (), "") for n in sorted(names - known)]
    out = []
    for aval, o in found:
        placement: Placement = "host" if (o.host or _host(aval)) else "device"
        kind = o.kind
        if placement == "host" and kind in ("named", "other"):
            kind = "offloaded"
        out.append(Residual(kind, o.name, tag_path(o.name),
                            tuple(int(d) for d in getattr(aval, "shape", ())), _dtype_name(aval),
                            aval_nbytes(aval), placement, o.source, o.layers,
                            o.module if o.name is None or tag_path(o.name) is None else None))
    return ResidualReport(tuple(out), tuple(all_tags))

def residuals_readable() -> bool:
    """Whether :func:`saved_residuals` reads the installed JAX's jaxprs: a probe that keeps
    exactly one named value must be reported under that name. Measured, not inferred from
    private imports; cached per JAX version and ``jax_remat3`` setting."""
    return _residuals_readable(jax.__version__, remat3_on())


@functools.lru_cache(maxsize=None)
def _residuals_readable(version: str, remat3: bool) -> bool:
    del version, remat3  # the cache key: the probe's answer depends on both

    def f(x: jax.Array) -> jax.Array:
        h = checkpoint_name(jax.numpy.sin(x), "probe")
        return jax.numpy.sum(jax.numpy.cos(h * 2.0))

    g = jax.checkpoint(f, policy=jax.checkpoint_policies.save_only_these_names("probe"))
    try:
        return saved_residuals(g, jax.numpy.ones(4, jax.numpy.float32)).names() == {"probe"}
    except Exception:  # noqa: BLE001 - any failure to read the probe means the reader is stale
        return False


def residual_bytes_by_path(residuals: Iterable[Residual]) -> dict[str, int]:
    """Sums residual bytes per module path (``<other>`` for unnamed ones)."""
    out: dict[str, int] = {}
    for r in residuals:
        key = r.path if r.path is not None else ("<argument>" if r.kind == "argument" else "<other>")
        out[key] = out.get(key, 0) + r.nbytes
    return dict(sorted(out.items()))
