"""Custom rematerialization rules: a function's own forward / rematerialize / backward rules.

A :class:`RuleSet` carries three rules for one function and names the residuals its forward rule
can keep. Where it runs, the rules see the *ambient* policy (what the enclosing remat boundary says
about each residual name: keep on device, move to host, or recompute), and the residuals are placed
accordingly. Two implementations run the same rules:

- ``custom_remat``: ``jax.custom_remat`` (JAX 0.11.x with ``jax_remat3`` on), inside a small
  ``jax.checkpoint`` that the rule set opens itself, so a bare ``grad`` never meets JAX's empty
  ``NotImplementedError('')``. The forward rule receives the policy object JAX passes.
- ``custom_vjp``: the portable path (``jax_remat3`` off, where JAX would silently skip the forward
  rule; JAX 0.12, which removed ``custom_remat``; under ``vmap``, which ``custom_remat`` cannot
  batch). ``jax.custom_vjp`` with the ambient policy tracked from the plan.

Forward-mode AD (``jvp``, ``jacfwd``, ``linearize``) runs the plain function (``"plain"``), since
neither rule implementation supports it. :func:`collect_rule_runs` reports which path ran, what the
forward rule saw, and whether it really ran.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Final, TypeVar

import jax

from ._compile import compile_boundary
from ._context import (
    active_plan,
    collect_rule_runs,
    current_impl,
    current_module_path,
    forced_impl,
    forced_scope,
    impl_scope,
    left_out_boundary,
    open_boundary,
    promise_rule_names,
    record_rule_run,
)
from ._errors import CapabilityError, RematError, sorted_list
from ._jaxcompat import (
    custom_remat_runs,
    has_custom_remat,
    is_custom_remat_vmap_error,
    is_custom_vjp_forward_mode_error,
    nearest_ad_trace,
    policy_location,
    remat3_on,
)
from ._paths import SEP, display, qualify
from ._records import Ambient, Impl, Location, RuleRun
from ._resolve import RULE_NAME, BoundarySpec
from ._scope import tag

T = TypeVar("T")

#: What :func:`custom_impl` and ``RuleSet(impl=...)`` accept. ``auto`` picks ``custom_remat`` where
#: it really runs and the portable ``custom_vjp`` path elsewhere; ``custom_remat`` is strict;
#: ``plain`` runs the plain function (for forward-mode code such as ``jax.linearize``).
IMPL_CHOICES: Final = ("auto", "custom_remat", "custom_vjp", "plain")
_LOCATIONS: Final = ("device", "host", "recompute")

_MSG_STRICT = """\
{where}custom_remat was requested (strict), but {why}.
Fix: {fix}, or use impl='auto' (remat_common.rules.custom_impl('auto')) to run the same rules through the
portable jax.custom_vjp path."""

_MSG_UNHONOURED = """\
{where}the plan keeps {names} of rule set {rule!r} ({locs}) inside the remat boundary at {outer!r},
but with jax_remat3 on and jax {version} running the portable custom_vjp path, JAX recomputes a
custom_vjp's residuals inside a checkpoint: they would not be kept.
Fix: jax.config.update('jax_remat3', False) (the portable path honours the names then), install
jax 0.11.x for jax.custom_remat, or annotate {outer!r} so that {path!r} is not inside a boundary."""


class CustomRuleWarning(UserWarning):
    """A lenient plan asks a custom rule to keep residuals that the running path cannot keep."""


# -- choosing the path -----------------------------------------------------------------------------

def _check_impl(impl: Any, where: str) -> str:
    if impl not in IMPL_CHOICES:
        raise RematError(
            f"{where}unknown custom-rule implementation {impl!r}. Allowed: "
            f"{sorted_list(IMPL_CHOICES)}. Fix: use 'auto' unless you need to force one path."
        )
    return impl


@contextlib.contextmanager
def custom_impl(impl: str) -> Iterator[str]:
    """Chooses how rule sets run inside the block: ``auto``, ``custom_remat`` (strict),
    ``custom_vjp`` (always the portable path) or ``plain`` (the plain function, for forward-mode
    code: ``jax.linearize`` of a ``custom_vjp`` fails in JAX itself). A rule set's own ``impl``
    wins over this.

    >>> with custom_impl("custom_vjp"):
    ...     custom_path()
    'custom_vjp'
    """
    with impl_scope(_check_impl(impl, "remat_common.rules.custom_impl: ")):
        yield impl


def _strict_error(has_custom_remat: bool, where: str) -> CapabilityError:
    if not has_custom_remat:
        why = (f"jax {jax.__version__} has no jax.custom_remat (it exists in jax 0.11.x only; "
               "0.12 removed it)")
        fix = "install jax 0.11.2 (pip install 'jax==0.11.2') and set jax_remat3 on"
    else:
        why = (f"jax_remat3 is off (jax {jax.__version__}): with remat3 off, jax.custom_remat "
               "silently skips the forward rule and recomputes the function")
        fix = "jax.config.update('jax_remat3', True) (or JAX_REMAT3=1 in the environment)"
    return CapabilityError(_MSG_STRICT.format(where=where, why=why, fix=fix))


def _choose(impl: str, where: str) -> str:
    if impl in ("custom_vjp", "plain"):
        return impl
    has = has_custom_remat()
    if custom_remat_runs():
        return "custom_remat"
    if impl == "custom_remat":
        raise _strict_error(has, where)
    return "custom_vjp"


def custom_path(impl: str | None = None) -> str:
    """Which implementation rule sets run through now: ``custom_remat`` or ``custom_vjp``
    (or ``plain`` when asked for).

    The same answer is in :attr:`Capabilities.custom_path` (for ``auto``); what really ran, per
    rule set, is recorded by :func:`collect_rule_runs`.

    Args:
      impl: ``auto``, ``custom_remat`` or ``custom_vjp``; default: the one set by
        :func:`custom_impl` (``auto`` unless changed). ``jax_remat3`` is read now.

    Raises:
      CapabilityError: ``custom_remat`` was asked for and is unavailable (JAX 0.12) or would be
        skipped (``jax_remat3`` off); the message names the version, the flag and the remedy.

    >>> custom_path("custom_vjp")
    'custom_vjp'
    """
    impl = _check_impl(current_impl() if impl is None else impl, "remat_common.rules.custom_path: ")
    return _choose(impl, "")


def with_fallbacks(call: Callable[[], T]) -> T:
    """Runs ``call()``; if JAX rejects a custom rule inside it, runs it again on a path that works.

    ``custom_remat`` has no batching rule (``vmap``) and its backward helper no forward-mode rule
    (``linearize``); when such an error surfaces from a boundary that holds a rule set, the call is
    traced again with every rule set on the portable (``vmap``) or plain (``linearize``) path. The
    error is raised while JAX binds the boundary, before anything is emitted, so re-tracing is
    safe. Adapters get this through :func:`remat_common.adapter.call_module`.
    """
    try:
        return call()
    except (NotImplementedError, TypeError) as e:
        forced = forced_impl()
        if is_custom_remat_vmap_error(e) and forced is None:
            with forced_scope("custom_vjp", "vmap: jax.custom_remat has no batching rule"):
                return call()
        if is_custom_vjp_forward_mode_error(e) and (forced is None or forced[0] != "plain"):
            with forced_scope("plain", "forward-mode AD (linearize/jvp): no custom rule supports it"):
                return call()
        raise


def skip_custom_boundary() -> bool:
    """Whether a ``custom`` module's own boundary stays closed for this call.

    A ``custom`` module normally runs inside its own remat boundary (internals recomputed, except
    what its rule sets keep; a raw ``jax.custom_remat`` inside it also needs that checkpoint). With
    ``jax_remat3`` on, JAX recomputes a ``custom_vjp``'s residuals inside any checkpoint, so where
    rule sets run the portable path (JAX 0.12, under ``vmap``, ``custom_impl('custom_vjp')``) the
    boundary is left out and the rule sets' own residuals are what is kept.
    """
    if not remat3_on():
        return False
    if forced_impl() is not None or current_impl() == "custom_vjp" or not has_custom_remat():
        return True
    return nearest_ad_trace() == "vmap"


def _own(spec: BoundarySpec | None, path: str | None) -> bool:
    return spec is not None and spec.kind == "custom" and spec.path == (path or "")


def _plan_locations(rs: RuleSet, path: str | None,
                    spec: BoundarySpec | None) -> tuple[tuple[str, Location], ...]:
    """What the plan says for each residual: named in the open boundary's save/offload sets; else
    the rule's defaults in its own ``custom`` boundary or outside any boundary; else recomputed."""
    out: list[tuple[str, Location]] = []
    for n in rs.residuals:
        q = qualify(path, n)
        loc: Location
        if spec is None:
            loc = "device" if n in rs.keep else "recompute"
        elif q in spec.save or n in spec.save:
            loc = "device"
        elif q in spec.offload or n in spec.offload:
            loc = "host"
        elif _own(spec, path) and n in rs.keep:
            loc = "device"
        else:
            loc = "recompute"
        out.append((n, loc))
    return tuple(out)


def _tag_name(rs: RuleSet, path: str | None, spec: BoundarySpec | None, n: str) -> str | None:
    """The name a kept residual is tagged with so that the open boundary's policy sees it."""
    if spec is None:
        return None
    named = spec.save | spec.offload
    q = qualify(path, n)
    if q in named:
        return q
    if n in named:
        return n
    rule = qualify(path, RULE_NAME)
    if _own(spec, path) and n in rs.keep and rule in named:
        return rule
    return None


def _policy_name(policy: Any) -> str:
    if policy is None:
        return "None"
    return getattr(policy, "__name__", None) or type(policy).__name__


def _space(kind: str) -> Any:
    return jax.memory.Space.Device if kind == "device" else jax.memory.Space.Host


def _put(x: Any, kind: str) -> Any:
    return jax.tree_util.tree_map(lambda v: jax.device_put(v, _space(kind)), x)


# -- the rule set ----------------------------------------------------------------------------------

def _check_names(names: Sequence[str], where: str) -> tuple[str, ...]:
    out = tuple(names)
    for n in out:
        if not isinstance(n, str) or not n or SEP in n or n != n.strip() or n == RULE_NAME:
            raise RematError(
                f"{where}residual name {n!r} must be a non-empty string without {SEP!r} or "
                f"surrounding spaces, other than {RULE_NAME!r} (the module path is added for you)."
            )
    if len(set(out)) != len(out):
        raise RematError(f"{where}residual names {list(out)} repeat a name. Fix: name each once.")
    return out


@dataclasses.dataclass(frozen=True)
class RuleSet:
    """A function with its own forward, rematerialize and backward rules.

    Calling the rule set computes ``fun(*args)``; under reverse-mode AD the rules decide what is
    kept. Use it inside a module (its ``__remat_custom__``) or anywhere in plain JAX.

    Attributes:
      name: a short name for reports and errors (``attention``).
      fun: the plain function ``fun(*args) -> out``; it defines the value (and runs for
        forward-mode AD).
      fwd: ``fwd(ambient, *args) -> (out, residuals)``: the forward rule. ``ambient`` is an
        :class:`Ambient`; ``residuals`` maps residual names to arrays. Those the ambient policy
        recomputes are dropped; those it offloads go to host memory and come back for ``rem``.
      rem: ``rem(residuals, *args) -> (out, res2)``: the rematerialize rule, run in the backward
        pass. ``residuals`` maps every declared name to its kept array or ``None`` (recompute it).
      bwd: ``bwd(res2, out_cotangent) -> tuple``: one cotangent per argument.
      residuals: the residual names the forward rule may return.
      keep: the names kept by default: outside any remat boundary, and in the module's own
        ``custom`` boundary. Inside another boundary only the names that boundary keeps are kept.
      impl: ``auto`` (default: follow :func:`custom_impl`), ``custom_remat`` (strict),
        ``custom_vjp`` or ``plain``.

    >>> import jax, jax.numpy as jnp
    >>> def fwd(ambient, x):
    ...     return jnp.sin(x), {"cos": jnp.cos(x)}
    >>> def rem(res, x):
    ...     c = res["cos"] if res["cos"] is not None else jnp.cos(x)
    ...     return jnp.sin(x), c
    >>> sin = RuleSet("sin", jnp.sin, fwd, rem, lambda c, g: (g * c,), residuals=("cos",),
    ...               keep=frozenset({"cos"}))
    >>> float(jax.jit(jax.grad(lambda x: sin(x).sum()))(jnp.zeros(3))[0])
    1.0
    """

    name: str
    fun: Callable[..., Any]
    fwd: Callable[..., tuple[Any, Mapping[str, Any]]]
    rem: Callable[..., tuple[Any, Any]]
    bwd: Callable[..., Sequence[Any]]
    residuals: tuple[str, ...] = ()
    keep: frozenset[str] = frozenset()
    impl: str = "auto"

    def __post_init__(self) -> None:
        where = f"RuleSet {self.name!r}: "
        object.__setattr__(self, "residuals", _check_names(self.residuals, where))
        object.__setattr__(self, "keep", frozenset(self.keep))
        bad = self.keep - set(self.residuals)
        if bad:
            raise RematError(
                f"{where}keep names {sorted_list(bad)} are not among its residuals "
                f"{sorted_list(self.residuals)}. Fix: declare them in residuals=... or drop them."
            )
        _check_impl(self.impl, where)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs:
            raise TypeError(
                f"rule set {self.name!r} takes its arrays positionally, got keywords "
                f"{sorted(kwargs)}. Fix: pass them in order; static settings belong to the "
                "factory that built the rule set."
            )
        return apply(self, *args)


def _where(rs: RuleSet, path: str | None) -> str:
    loc = f"module {path!r}, " if path else ""
    return f"{loc}rule set {rs.name!r}: "


def apply(rs: RuleSet, *args: Any) -> Any:
    """Runs a rule set on ``args`` through the path that works here (see the module docstring)."""
    path = current_module_path()
    promise_rule_names(n for r in rs.residuals for n in (qualify(path, r), r))
    boundary = open_boundary()
    spec = boundary.spec if boundary is not None else None
    # The module's own 'custom' boundary, left out (remat3 on, portable path; call_module): no
    # checkpoint is open, but its residuals are kept, named and offloaded as that boundary says.
    left = left_out_boundary() if spec is None else None
    own = left.spec if left is not None and _own(left.spec, path) else None
    plan_locs = (_plan_locations(rs, path, spec or own)
                 if spec is not None or own is not None or active_plan() is not None else None)
    impl = rs.impl if rs.impl != "auto" else current_impl()
    forced = forced_impl()
    ad = nearest_ad_trace()
    if forced is not None and forced[0] == "plain":
        return _run_plain(rs, path, forced[1], args, plan_locs)
    if ad in ("jvp", "linearize"):
        return _run_plain(rs, path, f"forward-mode AD ({ad}): no custom rule supports it",
                          args, plan_locs)
    chosen = _choose(impl, _where(rs, path))  # raises for strict custom_remat where unusable
    if chosen == "plain":
        return _run_plain(rs, path, "impl='plain' requested", args, plan_locs)
    if chosen == "custom_remat":
        reason = "jax_remat3 on and jax.custom_remat available"
    elif impl == "custom_vjp":
        reason = "impl='custom_vjp' requested"
    elif not has_custom_remat():
        reason = f"jax {jax.__version__} has no jax.custom_remat"
    else:
        reason = "jax_remat3 off: jax.custom_remat would skip the forward rule"
    if chosen == "custom_remat" and (ad == "vmap" or forced is not None):
        why = forced[1] if forced is not None else "vmap: jax.custom_remat has no batching rule"
        if impl == "custom_remat":
            raise CapabilityError(
                f"{_where(rs, path)}custom_remat was requested (strict), but {why}. Fix: apply "
                "vmap outside grad (vmap(grad(f)) works), or use impl='auto' to run the portable "
                "custom_vjp path under vmap."
            )
        chosen, reason = "custom_vjp", why
    if chosen == "custom_vjp":
        return _run_custom_vjp(rs, path, spec, plan_locs, reason, args, own)
    try:
        return _run_custom_remat(rs, path, spec, plan_locs, reason, args)
    except (NotImplementedError, TypeError) as e:
        if is_custom_remat_vmap_error(e) and impl != "custom_remat":
            return _run_custom_vjp(rs, path, spec, plan_locs,
                                   "vmap: jax.custom_remat has no batching rule", args, own)
        if is_custom_vjp_forward_mode_error(e):
            return _run_plain(rs, path, "linearize: custom_remat's backward helper has no "
                              "forward-mode rule", args, plan_locs)
        raise


def _run_plain(rs: RuleSet, path: str | None, reason: str, args: tuple[Any, ...],
               plan_locs: tuple[tuple[str, Location], ...] | None) -> Any:
    record_rule_run(RuleRun(rs.name, path, "plain", reason, None, plan_locs))
    return rs.fun(*args)


def _unknown_residuals(rs: RuleSet, path: str | None, res: Mapping[str, Any]) -> None:
    extra = set(res) - set(rs.residuals)
    if extra:
        raise RematError(
            f"{_where(rs, path)}the forward rule returned residuals {sorted_list(extra)} that the "
            f"rule set does not declare (declared: {sorted_list(rs.residuals)}). Fix: add them to "
            "residuals=..."
        )


def _same_output(out: Any, residual: Any, tagged: Any) -> Any:
    """``out`` with the leaves that *are* the residual replaced by its tagged copy.

    A rule that keeps its own output (attention keeps ``attn_out``) returns the same array twice;
    giving the output the tag too lets an enclosing checkpoint keep it as well, instead of running
    the rule's forward again to rebuild an output it already keeps.
    """
    pairs = {id(a): b for a, b in zip(jax.tree_util.tree_leaves(residual),
                                       jax.tree_util.tree_leaves(tagged), strict=True)}
    return jax.tree_util.tree_map(lambda leaf: pairs.get(id(leaf), leaf), out)


def _full(rs: RuleSet, kept: Mapping[str, Any]) -> dict[str, Any]:
    return {n: kept.get(n) for n in rs.residuals}


@functools.lru_cache(maxsize=256)
def _tiny_policy(path: str, save: frozenset[str], offload: frozenset[str], src: str,
                 dst: str) -> Any:
    spec = BoundarySpec(path, "names", save=save, offload=offload, offload_src=src,
                        offload_dst=dst)
    return compile_boundary(spec).policy


def _run_custom_remat(rs: RuleSet, path: str | None, spec: BoundarySpec | None,
                      plan_locs: tuple[tuple[str, Location], ...] | None, reason: str,
                      args: tuple[Any, ...]) -> Any:
    src = spec.offload_src if spec is not None else "device"
    dst = spec.offload_dst if spec is not None else "pinned_host"
    locs = plan_locs if plan_locs is not None else _plan_locations(rs, path, None)
    # The boundary this rule set controls: its policy keeps what the plan (or the rule's defaults)
    # keeps, so the forward rule sees that wherever no enclosing checkpoint's policy wins.
    save = frozenset(qualify(path, n) for n, loc in locs if loc == "device")
    off = frozenset(qualify(path, n) for n, loc in locs if loc == "host")
    policy = _tiny_policy(path or "", save, off, src, dst)
    placed: dict[str, str] = {}

    def f_fwd(jax_policy: Any, *a: Any) -> tuple[Any, dict[str, Any]]:
        amb_locs: list[tuple[str, Location]] = []
        src_seen = dst_seen = None
        for n in rs.residuals:
            names = (qualify(path, n), n) + ((qualify(path, RULE_NAME),) if n in rs.keep else ())
            loc, s, d = policy_location(jax_policy, names)
            amb_locs.append((n, loc))
            src_seen, dst_seen = s or src_seen, d or dst_seen
        amb = Ambient(path, tuple(amb_locs), "policy", _policy_name(jax_policy),
                      src_seen or src, dst_seen or dst)
        out, res = rs.fwd(amb, *a)
        _unknown_residuals(rs, path, res)
        kept: dict[str, Any] = {}
        placed.clear()
        for n, loc in amb.locations:
            if loc == "recompute" or res.get(n) is None:
                continue
            x = res[n]
            name = _tag_name(rs, path, spec, n)
            if name is not None:  # the plan names it: tagged, so reports show it by name
                x = tag(x, name)
                out = _same_output(out, res[n], x)
            if loc == "host":
                x = _put(x, amb.offload_dst)
                placed[n] = amb.offload_src
            kept[n] = x
        record_rule_run(RuleRun(rs.name, path, "custom_remat", reason, amb, plan_locs))
        return out, kept

    def f_rem(kept: dict[str, Any], *a: Any) -> tuple[Any, Any]:
        back = {n: _put(x, placed[n]) if n in placed else x for n, x in kept.items()}
        return rs.rem(_full(rs, back), *a)

    def f_bwd(res2: Any, g: Any) -> tuple[Any, ...]:
        return tuple(rs.bwd(res2, g))

    cr = jax.custom_remat(rs.fun, f_fwd, f_rem, f_bwd)  # type: ignore[attr-defined]
    if spec is not None:  # an open plan boundary is a checkpoint around the rule already
        return cr(*args)
    return jax.checkpoint(cr, policy=policy)(*args)


def _run_custom_vjp(rs: RuleSet, path: str | None, spec: BoundarySpec | None,
                    plan_locs: tuple[tuple[str, Location], ...] | None, reason: str,
                    args: tuple[Any, ...], own: BoundarySpec | None = None) -> Any:
    """``own``: the module's own ``custom`` boundary where it was left out (no checkpoint open):
    kept residuals get the names it keeps them under, and its memory kinds."""
    locs = plan_locs if plan_locs is not None else _plan_locations(rs, path, None)
    placing = spec or own
    src = placing.offload_src if placing is not None else "device"
    dst = placing.offload_dst if placing is not None else "pinned_host"
    amb = Ambient(path, locs, "plan" if plan_locs is not None else "rule", None, src, dst)
    inside = spec is not None  # an open plan boundary (a checkpoint) decides what is kept
    if spec is not None and amb.kept and remat3_on():
        plan = active_plan()
        msg = _MSG_UNHONOURED.format(
            where=_where(rs, path), names=sorted_list(amb.kept), rule=rs.name,
            locs=", ".join(f"{n}: {amb.location(n)}" for n in sorted(amb.kept)),
            outer=display(spec.path), version=jax.__version__, path=path,
        )
        if plan is None or plan.resolution.plan.strict:
            raise CapabilityError(msg)
        warnings.warn(msg, CustomRuleWarning, stacklevel=3)
    hosts = frozenset(n for n, loc in locs if loc == "host" and not inside)

    @jax.custom_vjp
    def g(*a: Any) -> Any:
        return rs.fun(*a)

    def g_fwd(*a: Any) -> tuple[Any, Any]:
        out, res = rs.fwd(amb, *a)
        _unknown_residuals(rs, path, res)
        kept: dict[str, Any] = {}
        for n, loc in amb.locations:
            if loc == "recompute" or res.get(n) is None:
                continue
            x = res[n]
            if inside:  # the open checkpoint's policy keeps / offloads the tagged value
                name = _tag_name(rs, path, spec, n)
                if name is not None:
                    x = tag(x, name)
                    out = _same_output(out, res[n], x)
            else:
                name = _tag_name(rs, path, own, n)
                if name is not None:  # named as its left-out boundary keeps it, for reports
                    x = tag(x, name)
                    out = _same_output(out, res[n], x)
                if n in hosts:
                    x = _put(x, dst)
            kept[n] = x
        record_rule_run(RuleRun(rs.name, path, "custom_vjp", reason, amb, plan_locs))
        return out, (kept, a)

    def g_bwd(saved: Any, ct: Any) -> tuple[Any, ...]:
        kept, a = saved
        back = {n: _put(x, src) if n in hosts else x for n, x in kept.items()}
        _, res2 = rs.rem(_full(rs, back), *a)
        return tuple(rs.bwd(res2, ct))

    g.defvjp(g_fwd, g_bwd)
    return g(*args)
