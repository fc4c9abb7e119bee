"""The notes a plan's report carries about its figures: FLOPs equal to the baseline's although the
plan recomputes (the compiler merged the recomputation: :func:`cse_undid_remat`), FLOPs below the
baseline's, and the HLO text compared for both (:func:`normalized_hlo`)."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from ..._capabilities import Capabilities
from ..._compile import CompiledPlan
from ..._paths import display
from ._report import PlanReport


_MSG_CSE = (
    "FLOPs equal the baseline's although this plan recomputes ({what}): the compiler merged the "
    "recomputation back into the forward pass (XLA's CSE; jax {version} does this on {backend}), so "
    "this compiled step keeps what the baseline keeps and its FLOP and memory figures show no remat. "
    "Fix: measure with XLA_FLAGS=--xla_disable_hlo_passes=cse, or on jax>=0.11.2.")


def cse_undid_remat(flops: float | None, baseline_flops: float | None, recomputes: bool,
                    baseline_recomputes: bool) -> bool:
    """Whether a plan that recomputes compiled to exactly the FLOPs of a baseline that does not:
    the compiler undid the rematerialization (jax 0.11.0 on CPU;
    https://github.com/jax-remat-plan/jax-remat-plan/blob/main/docs/jax_behaviour.md#cse)."""
    return (recomputes and not baseline_recomputes and flops is not None
            and baseline_flops is not None and flops == baseline_flops)


def recomputes(plan: CompiledPlan | None) -> str:
    """The boundaries of ``plan`` that recompute something, described; empty when none does."""
    if plan is None:
        return ""
    return ", ".join(display(b.path) for b in plan.boundaries if b.spec.kind != "save")


def with_cse_note(p: PlanReport, recomputes: str, base: PlanReport, base_plain: bool,
                   caps: Capabilities) -> PlanReport:
    if not cse_undid_remat(p.flops, base.flops, bool(recomputes), not base_plain):
        return p
    note = _MSG_CSE.format(what=recomputes if len(recomputes) < 80 else recomputes[:77] + "...",
                           version=caps.jax, backend=caps.backend)
    return dataclasses.replace(p, notes=(*p.notes, note))


_MSG_FLOPS_BELOW = (
    "FLOP ratio {ratio:.3f} to {base!r}, which recomputes nothing, although this plan recomputes "
    "({what}): recomputation only adds work, so the ratio is not this plan's cost. Every loop was "
    "counted per iteration; the two compiled steps differ beyond the plan: XLA fuses each its own "
    "way and counts a producer once per fusion that runs it (a step that hands its intermediates "
    "to the backward pass, as one that keeps them does, runs more of them twice). Compare "
    "compiled peaks and measured step times rather than these FLOPs.")


def flops_below_baseline(ratio: float | None, recomputes: bool, baseline_recomputes: bool) -> bool:
    """Whether a plan that recomputes compiled to fewer FLOPs than a baseline that does not: a
    figure no plan can really have (a remat plan does the baseline's work and more)."""
    return recomputes and not baseline_recomputes and ratio is not None and ratio < 1.0


def with_flops_below_note(p: PlanReport, recomputes: str, baseline: str,
                           base_plain: bool) -> PlanReport:
    if not flops_below_baseline(p.flop_ratio, bool(recomputes), not base_plain):
        return p
    assert p.flop_ratio is not None
    where = recomputes.split(", ")
    what = ", ".join(where[:3]) + (f" and {len(where) - 3} more" if len(where) > 3 else "")
    note = _MSG_FLOPS_BELOW.format(ratio=p.flop_ratio, base=baseline, what=what)
    return dataclasses.replace(p, notes=(*p.notes, note))


_HLO_SECTIONS = frozenset({"FileNames", "FunctionNames", "FileLocations", "StackFrames"})


def normalized_hlo(compiled: Any) -> str:
    """The compiled HLO text without source metadata, stack frames and the module's name.

    Two routes to the same program (a policy written by hand, the same policy from a plan) give
    equal strings exactly when XLA compiled the same instructions.
    """
    out: list[str] = []
    skipping = False
    for line in compiled.as_text().splitlines():
        if line in _HLO_SECTIONS:
            skipping = True
            continue
        if skipping:
            skipping = bool(line.strip())
            continue
        line = re.sub(r",? metadata=\{[^}]*\}", "", line)
        out.append(re.sub(r"^HloModule \S+", "HloModule m", line))
    return "\n".join(out)
