"""The oracle: which residuals reverse-mode AD really keeps, compared with what the plan says."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable
from typing import Any

from ._compile import CompiledPlan
from ._context import collect_module_runs, defer_name_checks
from ._errors import VerificationError, check_bool, sorted_list, type_error
from ._framework import frameworks
from ._jaxcompat import fresh_trace
from ._paths import INPUT_NAME, SEP, display, in_subtree, path_key
from ._records import ModuleRun
from ._resolve import folded_paths
from ._residuals import Residual, ResidualReport, check_acyclic, saved_residuals
from ._residuals import tag_path as _tag_path


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

    Problems (errors in strict mode): a boundary of the plan that the traced function does not run
    (the module was swapped out after the plan was taken, a plain model, a function that does not
    call the model), or no boundary of the plan at all; a model argument with modules the plan was
    not compiled for (a layer appended after ``annotate``); a module the function runs under another
    plan (compiled for another model or by another ``annotate`` call), or a boundary where the plan
    has none or another one; a name the plan mentions that no traced tag produces; a
    named value kept on device that the plan does not save; a plan that offloads values but
    nothing reaches host; host residuals the plan did not ask for; a residual the verifier cannot
    follow (out of ``cond`` or another primitive it cannot look into), named by module; a slice of
    an argument kept for the backward pass (parameters sliced for a layer group). Residuals made
    inside scans, nested jits and checkpoints are followed to the equation that made them, so the
    name checks hold there exactly as outside.

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
    if strict is not None:
        check_bool("verify", "strict", strict)  # 'no' would be strict
    check_acyclic("verify", args, kwargs)
    strict = plan.resolution.plan.strict if strict is None else strict
    # Traced afresh (jit trace caches missed), so every module call and boundary is seen.
    with defer_name_checks(), collect_module_runs() as runs, fresh_trace():
        report = saved_residuals(fun, *args, **kwargs)
    exp_dev = frozenset().union(*(b.spec.save for b in plan.boundaries)) & report.produced
    exp_host = frozenset().union(*(b.spec.offload for b in plan.boundaries)) & report.produced
    # an offloaded name that is kept on device: the value leaves its boundary (an identity module)
    passed = frozenset(n for n in report.names("device") if n in exp_host)
    problems = [*_plan_runs(plan, runs), *(p for fw in frameworks() if fw.check_models
                  for p in fw.check_models(plan, (args, kwargs))),
                *_untagged_names(plan, report), *_passed_through(plan, passed),
                *_unplanned_device(plan, report, exp_dev | passed),
                *_host_mismatch(report, exp_host - passed, _dot_offloads(plan)), *_blind_spots(report), *_parameter_copies(report)]
    missing = sorted(exp_dev - report.names("device"))
    notes = [f"saved by the plan but not needed by the backward pass: {sorted_list(missing)}"] if missing else []
    notes += _shared_notes(plan)
    report = _name_offloaded(report, exp_host)
    if strict and problems:
        raise VerificationError("remat plan verification failed:\n- " + "\n- ".join(problems)
                                + "\n\nresiduals:\n" + report.table())
    return Verification(report, exp_dev, exp_host, tuple(problems), tuple(notes))


# -- the checks of verify() ------------------------------------------------------------------------

_MSG_NOTHING_RAN = """\
none of the plan's {n} boundaries ({shown}) runs in the traced function: it calls a model without
this plan (a plain model: erp.unwrap/frp.unannotate, or never annotated), or one annotated by
another annotate() call, or no annotated module at all. A plan with no boundary that ran verifies
nothing. Fix: annotate the model the function calls and verify with the plan it carries:
erp.plan_of(model) / frp.compiled_plan(model), taken after the last annotate() or change."""

_MSG_NOT_RUN = """\
module {path!r}: the plan puts a boundary here ({ann}: {policy}) but the traced function does not
run it: the module was replaced after the plan was taken (eqx.tree_at, assignment), is not
called by this function, or runs outside the plan. Fix: annotate the model again after the change
(erp.annotate / frp.annotate(model, plan, replace=True)) and verify with the plan it carries
(erp.plan_of(model) / frp.compiled_plan(model)), or remove the rule."""

_MSG_SHARED_NOT_RUN = """\
layers {layers} run as {first!r} (one shared trace: the plan shares alike list layers), so the
boundary at {path!r} should run {n} times, but the traced function runs it {k} time(s): a layer
of the group was replaced after the plan was taken (eqx.tree_at, assignment) or is not called.
Fix: annotate the model again after the change (erp.annotate / frp.annotate(model, plan,
replace=True)) and verify with the plan it carries (erp.plan_of(model) / frp.compiled_plan(model))."""

_MSG_OTHER_PLAN = """\
modules {paths} run under another plan than the one given to verify (compiled for another model,
or by another annotate() call): the residuals are not this plan's. Fix: verify with the plan the
model runs, erp.plan_of(model) / frp.compiled_plan(model), taken after the last annotate()."""

_MSG_STANDALONE = """
If the model's annotations are written in model code (erp.Remat wrappers, @frp.remat blocks)
and the function reaches it through a closure, each of them runs as its own plan at '<root>'.
Fix: pass the model as an argument, verify(loss, model, x, plan=erp.plan_of(model)) (or
frp.compiled_plan(model)): verify traces such a model as the plan it carries."""

_MSG_OTHER_BOUNDARY = """\
module {path!r}: the traced function runs a boundary here ({ran}) but the plan has {want}: the
model was annotated with another plan (or changed) after this plan was taken. Fix: verify with
the plan the model runs, erp.plan_of(model) / frp.compiled_plan(model)."""


def _plan_runs(plan: CompiledPlan, runs: list[ModuleRun]) -> list[str]:
    """The boundaries the traced function ran compared with the plan's: a plan boundary that did
    not run, a module run under another plan, a boundary the plan does not have there."""
    same: dict[int, bool] = {}

    def mine(p: CompiledPlan) -> bool:
        if id(p) not in same:
            same[id(p)] = p is plan or p == plan
        return same[id(p)]

    out: list[str] = []
    foreign = sorted({r.path for r in runs if r.plan is not None and not mine(r.plan)}, key=path_key)
    if foreign:
        shown = ", ".join(repr(display(p)) for p in foreign[:8]) + (
            f", ... ({len(foreign) - 8} more)" if len(foreign) > 8 else "")
        out.append(_MSG_OTHER_PLAN.format(paths=shown) + (_MSG_STANDALONE if "" in foreign else ""))
    ran: set[str] = set()
    planned = {b.path: b for b in plan.boundaries}
    in_modules = {r.path for r in runs if r.plan is not None}
    for r in runs:
        if r.boundary is None or (r.plan is not None and not mine(r.plan)):
            continue
        want = planned.get(r.path)
        if want is not None and (r.plan is not None or want == r.boundary):
            ran.add(r.path)  # a module call under this plan, or the plan's boundary entered
        elif r.plan is None and r.path not in in_modules:
            # a boundary entered outside any plan's module call (remat_common.checkpoint) where
            # the plan has none or another one
            msg = _MSG_OTHER_BOUNDARY.format(
                path=display(r.path), ran=r.boundary.describe(),
                want="none there" if want is None else f"another one ({want.describe()})")
            if msg not in out:
                out.append(msg)
    # Layers folded into a scanned group never open; a list layer shared with an earlier alike one
    # runs as that one (the same class, path and boundary), so each of the first layer's
    # boundaries runs once per layer of the group.
    folded = folded_paths(plan.resolution) | {layer for layer, _ in plan.shared}
    expected = [b for b in plan.boundaries if not any(in_subtree(b.path, f) for f in folded)]
    missing = [b for b in expected if b.path not in ran]
    groups: dict[str, list[str]] = {}
    for layer, first in plan.shared:
        groups.setdefault(first, [first]).append(layer)
    calls = collections.Counter(r.path for r in runs if r.plan is not None and mine(r.plan))
    for first, layers in sorted(groups.items()):
        short_of = [b for b in expected if in_subtree(b.path, first) and b.path in ran
                    and calls[b.path] < len(layers)]
        if short_of:
            b = short_of[0]
            out.append(_MSG_SHARED_NOT_RUN.format(
                layers=", ".join(repr(p) for p in sorted(layers, key=path_key)[:8]), first=first,
                path=display(b.path), n=len(layers), k=calls[b.path]))
    if expected and len(missing) == len(expected):
        every = plan.boundaries
        shown = ", ".join(repr(display(b.path)) for b in every[:8]) + (
            f", ... ({len(every) - 8} more)" if len(every) > 8 else "")
        out.append(_MSG_NOTHING_RAN.format(n=len(every), shown=shown))
    else:
        out += [_MSG_NOT_RUN.format(path=display(b.path), policy=b.policy_name,
                                    ann=plan.resolution.annotation(b.path)) for b in missing]
    return out


def _untagged_names(plan: CompiledPlan, report: ResidualReport) -> list[str]:
    """A name the plan asks a boundary for that no tag inside that boundary produces."""
    produced = report.produced
    folded = folded_paths(plan.resolution) | {layer for layer, _ in plan.shared}
    out = []
    for b in plan.boundaries:
        if any(in_subtree(b.path, f) for f in folded):
            continue  # a layer run as its group's first layer (scanned or shared): never opens
        mine = b.spec.save | b.spec.offload
        for n in sorted(b.spec.requested):
            if not any(_leaf(q) == _leaf(n) for q in mine & produced):
                out.append(
                    f"module {display(b.path)!r}: the plan names {n!r} but no checkpoint_name tag "
                    f"with that name runs inside this boundary (tags seen: "
                    f"{sorted_list(sorted({_leaf(t) for t in produced if not t.endswith(INPUT_NAME)}))}). "
                    "Fix: tag it with remat_common.checkpoint_name(x, name) in the module, or correct the name."
                )
    return out


def _shared_notes(plan: CompiledPlan) -> list[str]:
    """Which layers run as which (``compile_plan(..., share_alike_layers=True)``): their residuals
    carry the first layer's names, one set per layer."""
    out = []
    for first, group in plan.shared_groups():
        ls = [p for p in group if p != first]
        shown = ", ".join(ls) if len(ls) <= 20 else (
            f"{', '.join(ls[:10])}, ... ({len(ls) - 11} more), {ls[-1]}")
        out.append(f"layers {shown} run as {first!r} (one shared trace): their residuals carry "
                   f"the names of {first!r}, which therefore counts them x{len(group)}, once per "
                   "layer of the group")
    return out


def _unplanned_device(plan: CompiledPlan, report: ResidualReport, exp_dev: frozenset[str]) -> list[str]:
    """Named values kept on device inside a boundary that the plan does not save. Named values
    outside every boundary are kept by plain AD, as the plan says ("save"/"inherit")."""
    extra = sorted(n for n in report.names("device") - exp_dev
                   if any(in_subtree(_tag_path(n) or "", b.path) for b in plan.boundaries))
    if not extra:
        return []
    return [f"values {sorted_list(extra)} are kept on device but the plan does not save them "
            "(a policy other than the plan's is active?)."]


_MSG_PASSED = """\
module {path!r}: the plan offloads {names}, but {it} kept on device: the value leaves the boundary
unchanged (the module returns its input: an identity such as Dropout at rate 0 or in eval mode),
so the code after the boundary keeps it, and offloading it there moves nothing. Fix: annotate
{path!r} 'inherit' (or remove its rule), and offload the module that reads the value instead."""


def _passed_through(plan: CompiledPlan, passed: frozenset[str]) -> list[str]:
    """One problem per boundary whose offloaded names are kept on device (see ``_MSG_PASSED``)."""
    out = []
    for b in plan.boundaries:
        mine = sorted(passed & b.spec.offload)
        if mine:
            out.append(_MSG_PASSED.format(path=display(b.path), names=sorted_list(mine),
                                          it="it is" if len(mine) == 1 else "they are"))
    return out


def _dot_offloads(plan: CompiledPlan) -> tuple[str, ...]:
    """The boundaries that offload their matmul outputs (unnamed values) rather than names."""
    return tuple(b.path for b in plan.boundaries if b.spec.kind == "offload_dots_no_batch")


def _host_mismatch(report: ResidualReport, exp_host: frozenset[str],
                   dot_offloads: tuple[str, ...] = ()) -> list[str]:
    """An offload that reaches no host memory, or host residuals the plan did not ask for."""
    host = report.select(placement="host")
    if dot_offloads and not host:
        return [
            f"modules {sorted_list(map(display, dot_offloads))} offload their matmul outputs "
            "without batch dimensions (offload_dots_no_batch) but no residual is on host: the "
            "backward pass needs none of them, or the active remat implementation dropped the "
            "offload. Fix: use 'recompute' or 'dots_no_batch' there, which keep the same on device."
        ]
    if dot_offloads:  # unnamed host residuals are those matmul outputs
        return []
    if exp_host and not host:
        return [
            f"the plan offloads {sorted_list(exp_host)} but no residual is on host: either the "
            "backward pass does not need these values (it recomputes them from values already "
            "kept), or the active remat implementation dropped the offload. Either way the offload "
            "changes nothing. Fix: offload values the backward pass reads (see "
            "remat_common.saved_residuals of the un-annotated function), or remove them."
        ]
    if host and not exp_host:
        return [f"{len(host)} residual(s) are on host but the plan offloads nothing."]
    return []


def _name_offloaded(report: ResidualReport, exp_host: frozenset[str]) -> ResidualReport:
    """Gives the offloaded residuals the names the plan offloads, matched by shape and dtype."""
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
    return dataclasses.replace(report, residuals=tuple(fixed))


_MSG_OPAQUE = """\
module {module}: {n} residual(s) ({nbytes} bytes) cannot be verified: {reason}.
The verifier follows every residual back to the equation that made it, through scans, nested jits
and checkpoints; this one comes out of a primitive it cannot look into, so what it holds (and
whether the plan is followed there) is unknown. Fix: run that part with jax.lax.scan, jax.jit or
the adapters' scan_layers, or verify the part on its own (remat_common.verify on its function)."""

_MSG_COPY = """\
module {module}: the backward pass keeps {n} slice(s) of arguments ({nbytes} bytes), copies of
parameters the plan did not ask for: {what}.
A slice of an argument made in the forward pass (a layer group's share of stacked parameters) is
kept as a residual: one extra copy of those parameters on device. A layer group that keeps
everything (save, no boundary) keeps its layers' weight slices too, read out of the stack per
layer. Fix: scan the whole stack in one scan (a plan that treats every layer alike); give those
layers a boundary that keeps activations only ('dots', {{save: [names]}}); or index the stacked
parameters inside the remat boundary instead of slicing them before the scan."""


def _blind_spots(report: ResidualReport) -> list[str]:
    """One problem per module whose residuals the verifier cannot see into."""
    groups: dict[tuple[str, str], list[Residual]] = {}
    for r in report.residuals:
        if r.kind == "opaque":
            groups.setdefault((r.module or "<unknown module>", r.source), []).append(r)
    return [_MSG_OPAQUE.format(module=repr(m), n=len(rs), nbytes=sum(r.nbytes for r in rs),
                               reason=src)
            for (m, src), rs in sorted(groups.items())]


def _floating(dtype: str) -> bool:
    """``float32``, ``bfloat16``, ``float8_e4m3fn``, ``complex64``...: not ints, bools or keys."""
    return dtype.startswith(("float", "bfloat", "complex"))


def _parameter_copies(report: ResidualReport) -> list[str]:
    """One problem per module that keeps slices of arguments (parameter-sized values the plan did
    not ask for)."""
    groups: dict[str, list[Residual]] = {}
    for r in report.residuals:
        # Integer and key slices (rng keys and counts of the layers, carried per layer by the
        # adapters) are state the layers need, not copies of parameters.
        if r.kind == "copy" and _floating(r.dtype):
            groups.setdefault(r.module or "<unknown module>", []).append(r)
    return [_MSG_COPY.format(module=repr(m), n=len(rs), nbytes=sum(r.nbytes for r in rs),
                             what="; ".join(f"{r.dtype}{list(r.shape)} {r.source}" for r in rs[:3])
                             + (f"; and {len(rs) - 3} more" if len(rs) > 3 else ""))
            for m, rs in sorted(groups.items())]


