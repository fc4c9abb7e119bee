"""The oracle: which residuals reverse-mode AD really keeps, compared with what the plan says."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable
from typing import Any, Literal

import jax
import numpy as np

from ._compile import CompiledPlan
from ._resolve import _in_subtree, folded_paths
from ._errors import CapabilityError, VerificationError, sorted_list, type_error
from ._scope import INPUT_NAME, SEP, Tag, collect_tags

Placement = Literal["device", "host"]
ResidualKind = Literal["argument", "named", "offloaded", "opaque", "other"]

_NAMED = re.compile(r"^named '([^']*)'")


def _jax_saved_residuals() -> Callable[..., list[tuple[Any, str]]]:
    try:
        from jax._src.ad_checkpoint import saved_residuals
    except ImportError:  # pragma: no cover - depends on the installed JAX
        raise CapabilityError(
            f"jax {jax.__version__} has no jax._src.ad_checkpoint.saved_residuals, which the verifier "
            "uses to see what reverse-mode AD keeps. Fix: install a supported JAX (0.11.0 - 0.12.x)."
        ) from None
    return saved_residuals


@dataclasses.dataclass(frozen=True)
class Residual:
    """One value kept for the backward pass.

    Attributes:
      kind: ``argument`` (an input of the differentiated function), ``named`` (a tagged value kept
        on device), ``offloaded`` (moved to host), ``opaque`` (inside a scan or jit, where JAX does
        not report names) or ``other``.
      name: the qualified tag name when JAX reports one (or, for offloaded values, the tag matched
        by shape among the names the plan offloads).
      path: the module path part of ``name``.
    """

    kind: ResidualKind
    name: str | None
    path: str | None
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    placement: Placement
    source: str

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
        """True when some residuals come out of a scan/jit and carry no names."""
        return any(r.kind == "opaque" for r in self.residuals)

    def table(self) -> str:
        rows = [("kind", "name", "shape", "dtype", "bytes", "placement")]
        for r in self.residuals:
            rows.append((r.kind, r.name or "-", str(list(r.shape)), r.dtype, str(r.nbytes), r.placement))
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


def _jaxpr_names(jaxpr: Any, out: set[str]) -> None:
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
        elif type(obj).__name__ == "CheckpointName" and isinstance(getattr(obj, "params", None), dict):
            out.add(obj.params["name"])
        elif isinstance(getattr(obj, "params", None), dict):
            for v in obj.params.values():
                visit(v)

    visit(jaxpr)


def _tag_path(name: str | None) -> str | None:
    if name is None or SEP not in name:
        return None
    return name.rpartition(SEP)[0]


def _arrays_only(fun: Callable[..., Any], args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> tuple[Callable[..., Any], list[Any]]:
    """``fun`` as a function of the array leaves of its arguments only (others held fixed)."""
    leaves, tree = jax.tree_util.tree_flatten((args, kwargs))
    mask = [isinstance(leaf, jax.Array | np.ndarray) for leaf in leaves]

    def f(*arrays: Any) -> Any:
        it = iter(arrays)
        full = [next(it) if m else leaf for leaf, m in zip(leaves, mask)]
        a, k = jax.tree_util.tree_unflatten(tree, full)
        return fun(*a, **k)

    return f, [leaf for leaf, m in zip(leaves, mask) if m]


def saved_residuals(fun: Callable[..., Any], *args: Any, **kwargs: Any) -> ResidualReport:
    """What reverse-mode AD of ``fun(*args)`` keeps: every residual with name, bytes and placement.

    Built on JAX's residual introspection (private in 0.11/0.12, so guarded). Tags are collected
    from this project's :func:`checkpoint_name` calls and from the jaxpr (JAX's own tags).

    >>> import jax.numpy as jnp
    >>> from remat_common import checkpoint, checkpoint_name
    >>> f = checkpoint(lambda x: jnp.sum(jnp.sin(checkpoint_name(x * 2, "h"))), {"save": ["h"]})
    >>> [r.name for r in saved_residuals(f, jnp.ones(3)).select()]
    ['h']
    """
    sr = _jax_saved_residuals()
    f, arrays = _arrays_only(fun, args, kwargs)
    with collect_tags() as tags:
        raw = sr(f, *arrays)
    names: set[str] = set()
    try:
        _jaxpr_names(jax.make_jaxpr(f)(*arrays), names)
    except Exception:  # noqa: BLE001 - names from the jaxpr are a complement, not a requirement
        pass
    known = {t.name for t in tags}
    all_tags = list(dict.fromkeys(tags)) + [Tag(n, _tag_path(n), (), "") for n in sorted(names - known)]
    out = []
    for aval, src in raw:
        shape = tuple(int(d) for d in getattr(aval, "shape", ()))
        dtype = np.dtype(aval.dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        space = str(getattr(aval, "memory_space", ""))
        placement: Placement = "host" if "Host" in space else "device"
        m = _NAMED.match(src)
        name = None
        if src.startswith("from the argument"):
            kind: ResidualKind = "argument"
        elif m:
            kind, name = "named", m.group(1)
        elif placement == "host":
            kind = "offloaded"
        elif src.startswith(("output of scan", "output of jitted", "output of pjit", "output of while")):
            kind = "opaque"
        else:
            kind = "other"
        out.append(Residual(kind, name, _tag_path(name), shape, dtype.name, nbytes, placement, src))
    return ResidualReport(tuple(out), tuple(all_tags))


@dataclasses.dataclass(frozen=True)
class Verification:
    """The result of :func:`verify`: the residual report and what differs from the plan."""

    report: ResidualReport
    expected_device: frozenset[str]
    expected_host: frozenset[str]
    problems: tuple[str, ...]
    notes: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {
            **self.report.to_json(),
            "expected_device": sorted(self.expected_device),
            "expected_host": sorted(self.expected_host),
            "problems": list(self.problems),
            "notes": list(self.notes),
        }

    def __str__(self) -> str:
        parts = [self.report.table()]
        parts += [f"problem: {p}" for p in self.problems]
        parts += [f"note: {n}" for n in self.notes]
        return "\n".join(parts)


def _leaf(name: str) -> str:
    return name.rpartition(SEP)[2]


def verify(fun: Callable[..., Any], *args: Any, plan: CompiledPlan, strict: bool | None = None,
           **kwargs: Any) -> Verification:
    """Checks that what AD keeps for ``fun(*args)`` is what ``plan`` says.

    Problems (errors in strict mode): a name the plan mentions that no traced tag produces; a
    named value kept on device that the plan does not save; a plan that offloads values but
    nothing reaches host; host residuals the plan did not ask for. Residuals inside ``scan`` carry
    no names (JAX reports "output of scan"), so name checks are skipped there and a note says so.

    Args:
      fun: the function to differentiate (for example a loss over the annotated model).
      *args, **kwargs: its arguments.
      plan: the compiled plan the function was built with.
      strict: raise :class:`VerificationError` on problems; default: the plan's own mode.

    Returns:
      A :class:`Verification`.
    """
    if not isinstance(plan, CompiledPlan):
        raise type_error("verify", "plan", plan, "a remat_common.CompiledPlan",
                         "pass compile_plan(resolve(plan, paths)) or the adapter's "
                         "compiled_plan(model).")
    strict = plan.resolution.plan.strict if strict is None else strict
    report = saved_residuals(fun, *args, **kwargs)
    produced = report.produced
    exp_dev = frozenset().union(*(b.spec.save for b in plan.boundaries)) & produced
    exp_host = frozenset().union(*(b.spec.offload for b in plan.boundaries)) & produced
    problems: list[str] = []
    notes: list[str] = []
    folded = folded_paths(plan.resolution)
    for b in plan.boundaries:
        if any(_in_subtree(b.path, f) for f in folded):
            continue  # a stacked layer scanned as its group's first layer: its boundary never opens
        mine = b.spec.save | b.spec.offload
        for n in sorted(b.spec.requested):
            if not any(_leaf(q) == _leaf(n) for q in mine & produced):
                problems.append(
                    f"module {b.path or '<root>'!r}: the plan names {n!r} but no checkpoint_name tag "
                    f"with that name runs inside this boundary (tags seen: "
                    f"{sorted_list(sorted({_leaf(t) for t in produced if not t.endswith(INPUT_NAME)}))}). "
                    "Fix: tag it with remat_common.checkpoint_name(x, name) in the module, or correct the name."
                )
    named_dev = report.names("device")
    # Named values outside every boundary are kept by plain AD, as the plan says ("save"/"inherit").
    extra = sorted(n for n in named_dev - exp_dev
                   if any(_in_subtree(_tag_path(n) or "", b.path) for b in plan.boundaries))
    if extra:
        problems.append(
            f"values {sorted_list(extra)} are kept on device but the plan does not save them "
            "(a policy other than the plan's is active?)."
        )
    host = report.select(placement="host")
    if exp_host and not host:
        problems.append(
            f"the plan offloads {sorted_list(exp_host)} but no residual is on host: either the "
            "backward pass does not need these values (it recomputes them from values already "
            "kept), or the active remat implementation dropped the offload. Either way the offload "
            "changes nothing. Fix: offload values the backward pass reads (see "
            "remat_common.saved_residuals of the un-annotated function), or remove them."
        )
    if host and not exp_host:
        problems.append(f"{len(host)} residual(s) are on host but the plan offloads nothing.")
    missing = sorted(exp_dev - named_dev)
    if report.opaque:
        notes.append("some residuals come out of a scan or nested jit, where JAX reports no names; "
                     "name checks cover only the residuals outside them.")
    elif missing:
        notes.append(f"saved by the plan but not needed by the backward pass: {sorted_list(missing)}")
    # Give the offloaded residuals the names the plan offloads, matched by shape and dtype.
    pool = [t for t in report.tags if t.name in exp_host]
    fixed = []
    for r in report.residuals:
        if r.kind == "offloaded" and r.name is None:
            # Exact shape first; under vmap or scan the residual has extra leading dimensions.
            same = [t for t in pool if t.dtype == r.dtype]
            hit = next((t for t in same if t.shape == r.shape), None) or next(
                (t for t in same if len(t.shape) < len(r.shape)
                 and r.shape[len(r.shape) - len(t.shape):] == t.shape), None)
            if hit is not None:
                pool.remove(hit)
                r = dataclasses.replace(r, name=hit.name, path=_tag_path(hit.name))
        fixed.append(r)
    report = dataclasses.replace(report, residuals=tuple(fixed))
    result = Verification(report, exp_dev, exp_host, tuple(problems), tuple(notes))
    if strict and problems:
        raise VerificationError("remat plan verification failed:\n- " + "\n- ".join(problems)
                                + "\n\nresiduals:\n" + report.table())
    return result


def residual_bytes_by_path(residuals: Iterable[Residual]) -> dict[str, int]:
    """Sums residual bytes per module path (``<other>`` for unnamed ones)."""
    out: dict[str, int] = {}
    for r in residuals:
        key = r.path if r.path is not None else ("<argument>" if r.kind == "argument" else "<other>")
        out[key] = out.get(key, 0) + r.nbytes
    return dict(sorted(out.items()))

