"""Tuning: the cheapest plan whose compiled step fits a memory budget, and the capacity it unlocks.

The search, in four steps (see :func:`tune`):

1. Calibrate: compile the step once per choice with that choice on every layer of the stack
   (``blocks.*: recompute``, ``blocks.*: dots_no_batch``, ...). Each compile gives the step's
   memory (``memory_analysis()``), its FLOPs (:func:`count_flops`) and the verified residual bytes on
   device and host (:func:`verify`). A batch of plans is compiled in a worker thread while the
   next plans are built, traced and verified (:func:`compile_figures`).
2. Model: per choice, a layer's marginal bytes, cost, and the transient of a run of layers of
   it (the part of a uniform plan's peak that is not residuals: arguments, outputs, what the
   backward pass of a layer holds on top of them). The backward pass frees each run's residuals
   last run first, so a plan's peak is the largest, over its runs, of the residuals of the runs
   up to it plus the run's transient (:class:`_Model`). A layer under a remat boundary keeps what
   its policy saves: its marginal bytes are its verified residuals per layer. A layer without a
   boundary (``save``) keeps what XLA leaves of AD's residuals after fusion, fewer: its marginal
   bytes come from one more compile, a single layer of it before layers of the reference choice
   (the one with the largest transient: full recompute, usually), a one-layer delta; on a
   scanned stack, where a one-layer group runs unrolled with a smaller transient, one more with
   the single layer last, for every choice but the reference (bounded choices too: the groups
   share one custom_vjp, and nnx_gpt-scan's RRD compiles 0.62 MiB under what ``g`` predicts). FLOPs and host bytes per layer are one ``L``-th of the uniform plan's
   (recomputation adds up per layer: measured).
3. Search: an exact dynamic programme over runs of layers, in the order of their transients
   (largest first: the order with the smallest peak), keeps every assignment that no other beats
   on both predicted peak and cost (a Pareto front). The cheapest assignment predicted under the
   budget is compiled and verified; a plan over budget tightens the prediction by its error and
   the search goes on; a plan under budget by more than predicted lets cheaper plans just above
   the prediction be tried. Only compiled plans are ever returned, so the result never exceeds
   the budget.
4. Report: every compiled plan with its peak and cost, the frontier among them, and the chosen
   one as a short plan (one glob for the most common choice, ranges for the rest). With
   ``measure=K`` the K cheapest plans that fit are timed side by side and the fastest is chosen.

On a backend where offload is a no-op (CPU: nothing leaves the device), an offloaded residual
still counts in the compiled memory; its device saving is then taken from the verified host
residual bytes and the peak is marked an estimate.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import itertools
import json
import math
import re
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple

import jax

from .._capabilities import capabilities
from .._compiler import Compiler, compiler_identity
from .._context import collect_tags
from .._annotation import parse_annotation
from .._errors import PlanTypeError, RematError, check_bool, check_count, short, sorted_list
from .._nested import NESTED_KEY, SQRT, sqrt_block
from .._plan import Plan
from .._shipped import doc_url
from ._accelerators import Accelerator, xla_remat_original
from ._flops import count_flops
from ._measure import CompilerRefused, MeasureTarget, Where, compile_figures
from ._measure import measure as measure_plans
from ._profiles import DeviceProfile, HostLink, host_link, load_profile, parse_bytes
from ._render import fmt_bytes
from ._report import PlanReport

Objective = Literal["flops", "time"]
Builder = Callable[[Plan | None], MeasureTarget]

# -- results -------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TunePoint:
    """One compiled plan of a tuning run.

    Attributes:
      name: ``save``, ``recompute``, ... for the uniform plans, ``tuned-N`` for searched ones,
        ``nested`` for the stack run as checkpointed blocks, or the name of an extra plan.
      plan: the plan as written to a file (``{pattern: annotation}``), ``None``: un-annotated.
      assignment: the choice of each layer of the stack, in layer order; ``None`` for extra
        plans and ``nested``.
      peak: compiled device bytes of the step (arguments + outputs + temporaries - aliases),
        minus the verified host residual bytes where offload is a no-op on this backend.
      estimated: whether ``peak`` subtracts host bytes the compiler did not place (an estimate).
      device_bytes, host_bytes: verified activation residuals on device and on host, per device
        (the whole batch's over the devices a mesh splits it over).
      flops: the compiled step's FLOPs (scan bodies multiplied by their trip counts).
      cost: what the objective minimises (FLOPs, or estimated seconds).
      predicted_peak: what the model predicted before compiling (searched plans only).
      source: ``uniform``, ``calibration`` (a one-layer delta), ``search``, ``nested`` (a
        whole-stack candidate) or ``extra``.
      problems: what the verifier found against the plan (such a plan is never chosen).
      dominant: the three largest ``(kind, module, bytes)`` groups at the compiled peak (from
        the step's buffer assignment; empty where XLA wrote none).
      xla_remat: compiled for an accelerator, what its compiler's own rematerialization pass
        changed (the plan as written exceeds the device memory: it never fits), else ``None``.
    """

    name: str
    plan: dict[str, Any] | None
    assignment: tuple[str, ...] | None
    peak: int
    estimated: bool
    device_bytes: int
    host_bytes: int
    flops: float
    cost: float
    predicted_peak: float | None = None
    source: str = "uniform"
    problems: tuple[str, ...] = ()
    dominant: tuple[tuple[str, str | None, int], ...] = ()
    xla_remat: str | None = None

    def fits(self, budget: int) -> bool:
        return self.peak <= budget and not self.problems and not self.xla_remat

    def summary(self) -> str:
        """One line: the compiled peak, the prediction it was compiled for, what went wrong."""
        return (f"peak {fmt_bytes(self.peak)}{' (estimate)' if self.estimated else ''}"
                + (f", predicted {fmt_bytes(self.predicted_peak)}" if self.predicted_peak else "")
                + (f", host {fmt_bytes(self.host_bytes)}" if self.host_bytes else "")
                + (", XLA rematerialized it" if self.xla_remat else "")
                + (f", {len(self.problems)} problem(s)" if self.problems else ""))

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["assignment"] = None if self.assignment is None else list(self.assignment)
        d["problems"] = list(self.problems)
        return d


@dataclasses.dataclass(frozen=True)
class TuneResult:
    """What :func:`tune` found.

    Attributes:
      budget: the budget in bytes.
      objective: ``flops`` or ``time``.
      profile: the device profile the time objective used (``None``: FLOPs).
      stack: the stacked-layer path searched over (``blocks``) and its layers.
      choices: ``(name, annotation)`` per choice a layer could take.
      points: every compiled plan, in compile order.
      chosen: the name of the chosen point (``None``: nothing fits).
      plan: the chosen plan (``None``: nothing fits).
      compiles: compiles used; ``cached``: plans taken from the ``cache`` instead;
        ``wall_s``: seconds the search took.
      message: one paragraph saying what was found (or why nothing fits).
      notes: caveats (estimates, stopped early, ...).
      step_times: ``(name, median seconds)`` of the plans timed with ``measure=K`` (the chosen
        one is the fastest of them), empty otherwise.
      whole_stack: ``(name, plan)`` of the whole-stack candidates compiled besides the per-layer
        choices: ``nested`` (the scan over a scanned stack run as checkpointed blocks).
      warnings: what makes the result doubtful (the compiled peaks cannot tell the candidates
        apart, ...); the CLI prints them as ``warning:`` lines.
      host_link: the link offload transfers were priced at (:func:`host_link`).
      compiler: the compiler whose peaks decided (:func:`compiler_identity`: jax, jaxlib, libtpu
        or the CUDA plugin).
    """

    budget: int
    objective: Objective
    profile: DeviceProfile | None
    stack: str
    layers: int
    choices: tuple[tuple[str, Any], ...]
    points: tuple[TunePoint, ...]
    chosen: str | None
    plan: Plan | None
    compiles: int
    wall_s: float
    message: str
    notes: tuple[str, ...] = ()
    cached: int = 0
    step_times: tuple[tuple[str, float], ...] = ()
    whole_stack: tuple[tuple[str, dict[str, Any]], ...] = ()
    warnings: tuple[str, ...] = ()
    host_link: HostLink | None = None
    compiler: Compiler | None = None

    def transfer_s(self, p: TunePoint) -> float | None:
        """Seconds the point's host residuals take to host and back over :attr:`host_link`."""
        if not p.host_bytes or self.host_link is None:
            return None
        return self.host_link.seconds(2 * p.host_bytes)

    def __getitem__(self, name: str) -> TunePoint:
        for p in self.points:
            if p.name == name:
                return p
        raise KeyError(f"no point named {name!r}; points: {sorted_list(p.name for p in self.points)}")

    @property
    def best(self) -> TunePoint | None:
        return None if self.chosen is None else self[self.chosen]

    @property
    def calibration(self) -> tuple[tuple[str, float, int, float], ...]:
        """How far the search's model was from the compiler: ``(name, predicted peak, compiled
        peak, (compiled - predicted) / predicted)`` of each plan the search proposed, in compile
        order (the uniform and one-layer calibration plans are what the model is fitted to)."""
        return tuple((p.name, p.predicted_peak, p.peak, (p.peak - p.predicted_peak)
                      / p.predicted_peak) for p in self.points if p.predicted_peak)

    @property
    def smallest_peak(self) -> TunePoint:
        return min(self.points, key=lambda p: (p.peak, p.cost))

    @property
    def baseline_flops(self) -> float | None:
        save = [p for p in self.points if p.assignment is not None and set(p.assignment) == {"save"}]
        return save[0].flops if save else None

    def flop_ratio(self, p: TunePoint) -> float | None:
        b = self.baseline_flops
        return None if not b else p.flops / b

    def frontier(self) -> tuple[TunePoint, ...]:
        """The compiled plans no other compiled plan beats on both peak and cost (by peak)."""
        out: list[TunePoint] = []
        for p in sorted((p for p in self.points if not p.problems), key=lambda p: (p.peak, p.cost)):
            if not out or p.cost < out[-1].cost:
                out.append(p)
        return tuple(out)

    def yaml(self) -> str:
        """The chosen plan as a plan file (empty string when nothing fits)."""
        b = self.best
        if b is None or b.plan is None:
            return ""
        ratio = self.flop_ratio(b)
        head = (f"# remat tune: the {'fastest' if self.objective == 'time' else 'cheapest (FLOPs)'} "
                f"plan found under a budget of {fmt_bytes(self.budget)}.\n"
                f"# compiled peak {fmt_bytes(b.peak)}{' (estimate)' if b.estimated else ''}"
                + (f", FLOP ratio {ratio:.3f} vs save-all" if ratio else "")
                + (f", {fmt_bytes(b.host_bytes)} to host and back per step ("
                   f"{(self.transfer_s(b) or 0) * 1e3:.3g} ms at the {self.host_link.name} "
                   "profile's host link)" if b.host_bytes and self.host_link else "")
                + f"; {self.compiles} compiles.\n"
                + ("" if self.compiler is None else
                   f"# compiled by {self.compiler.describe()}.\n"))
        return head + plan_yaml(b.plan)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": "remat-tune/1", "budget": self.budget, "objective": self.objective,
            "profile": None if self.profile is None else self.profile.to_json(),
            "stack": self.stack, "layers": self.layers,
            "choices": [[n, a.to_json() if isinstance(a, LayerRules) else a]
                        for n, a in self.choices],
            "points": [p.to_json() for p in self.points], "chosen": self.chosen,
            "frontier": [p.name for p in self.frontier()], "compiles": self.compiles,
            "cached": self.cached, "step_times": dict(self.step_times),
            "whole_stack": dict(self.whole_stack),
            "wall_s": self.wall_s, "message": self.message, "notes": list(self.notes),
            "warnings": list(self.warnings), "baseline_flops": self.baseline_flops,
            "calibration": [{"name": n, "predicted": pr, "compiled": c, "error": e}
                            for n, pr, c, e in self.calibration],
            "host_link": None if self.host_link is None else dataclasses.asdict(self.host_link),
            "compiler": None if self.compiler is None else self.compiler.to_json(),
        }

    def save(self, path: str | Path) -> Path:
        p = Path(path)
        p.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        return p

    def figure(self) -> Any:
        """The frontier figure (a matplotlib ``Figure``): compiled peak against FLOP ratio, the
        frontier and the chosen plan marked, every point labelled where no label overlaps another
        (:func:`place_labels`), the axes framing the points and a far budget marked at the edge."""
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        from ._render import frame_with_budget, freeze_layout, place_labels

        base = self.baseline_flops or 1.0
        fig = Figure(figsize=(7, 4.5), layout="constrained")
        FigureCanvasAgg(fig)
        ax = fig.subplots()
        front = {p.name for p in self.frontier()}
        xy = [(p.peak / 2**20, p.flops / base) for p in self.points]
        for p, (x, y) in zip(self.points, xy):
            ax.plot([x], [y], linestyle="none", marker="o",
                    color="tab:blue" if p.name in front else "tab:gray",
                    alpha=1.0 if p.name in front else 0.5)
        pts = sorted(v for p, v in zip(self.points, xy) if p.name in front)
        if pts:
            ax.step([x for x, _ in pts], [y for _, y in pts], where="post", color="tab:blue",
                    linewidth=1, label="frontier")
        if self.best is not None:
            ax.plot([self.best.peak / 2**20], [self.best.flops / base], marker="*", markersize=16,
                    color="tab:red", linestyle="none", label=f"chosen: {self.best.name}")
        frame_with_budget(ax, [x for x, _ in xy], self.budget / 2**20,
                          f"budget {fmt_bytes(self.budget)}")
        ys = [y for _, y in xy]
        span = (max(ys) - min(ys)) * 0.15 or 0.05
        ax.set_ylim(min(ys) - span, max(ys) + 2 * span)  # room above for labels
        ax.set_xlabel("compiled peak (MiB)" + ("; * estimate" if any(p.estimated for p in
                                                                     self.points) else ""))
        ax.set_ylabel("FLOPs / save-all FLOPs")
        ax.set_title(f"remat tune: {self.stack} ({self.layers} layers)")
        # the frontier runs from upper left to lower right: lower left and upper right are free
        ax.legend(fontsize=8, loc="lower left")
        renderer = freeze_layout(fig)
        place_labels(ax, [(x, y, p.name + ("*" if p.estimated else ""))
                          for p, (x, y) in zip(self.points, xy)], renderer, fontsize=7)
        return fig

    def plot(self, path: str | Path) -> Path:
        """Writes :meth:`figure` to ``path`` (PNG); the global matplotlib backend is left alone."""
        out = Path(path)
        self.figure().savefig(out, dpi=120)
        return out


def plan_yaml(config: Mapping[str, Any]) -> str:
    """``{pattern: annotation}`` as the ``rules:`` block of a plan file."""
    lines = ["rules:"]
    for pattern, ann in config.items():
        lines.append(f"  {json.dumps(pattern)}: {_flow(ann)}")
    return "\n".join(lines) + "\n"


def _flow(ann: Any) -> str:
    if isinstance(ann, str):
        return ann
    parts = []
    for k, v in ann.items():
        val = "[" + ", ".join(map(str, v)) + "]" if isinstance(v, list | tuple) else str(v)
        parts.append(f"{k}: {val}")
    return "{" + ", ".join(parts) + "}"


@dataclasses.dataclass(frozen=True)
class TuneEvent:
    """Progress of :func:`tune` / :func:`capacity`: a compile of ``name`` begins (``index`` of at
    most ``total``), it ended (``compiled``: ``detail`` says its peak, the model's prediction, and
    whether the target compiler changed the program), or the run is ``done``."""

    stage: Literal["compile", "compiled", "done"]
    name: str | None
    index: int
    total: int
    detail: str = ""


# -- discovery -----------------------------------------------------------------------------------

_LAYER = re.compile(r"^(.*)\.(\d+)$")

_MSG_NO_STACK = """\
remat_common.tune: found no stack of layers to tune in the model's module paths ({paths}).
tune assigns one choice per layer of a stack (paths STACK.0, STACK.1, ...). Fix: pass
layers='STACK' naming the stack, or tune a model that has one."""


def _model_paths(build: Builder) -> tuple[tuple[str, ...], tuple[str, ...], dict[str, set[str]],
                                          tuple[str, ...]]:
    """Module paths (from an annotation with an empty plan), the paths of modules that define
    their own rules (``__remat_custom__``), the tags per module path, and the stacks the adapter
    scans (``stacks=`` / ``__remat_stacks__`` in Flax, ``Stacked`` in Equinox)."""
    # A rule that matches every module but changes nothing: adapters then report every path.
    target = build(Plan.from_mapping({"**": "inherit"}))
    if not isinstance(target, MeasureTarget):
        raise RematError(f"remat_common.tune: the builder returned a {type(target).__name__}; it "
                         "must return a remat_common.MeasureTarget.")
    paths: tuple[str, ...] = ()
    stacks: tuple[str, ...] = ()
    if target.plan is not None:
        paths = tuple(target.plan.resolution.paths)
        stacks = tuple(target.plan.resolution.stacks)
    custom = target.plan.custom_paths if target.plan is not None else ()
    with collect_tags() as tags:
        jax.make_jaxpr(target.loss_fn)(*target.loss_args)
    by_path: dict[str, set[str]] = {}
    for t in tags:
        leaf = t.name.rpartition("/")[2]
        by_path.setdefault(t.path or "", set()).add(leaf)
    if not paths:  # no compiled plan: the module paths the tags were made under, and their parents
        found: set[str] = set()
        for p in by_path:
            parts = p.split(".")
            found.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
        paths = tuple(sorted(found))
    return paths, custom, by_path, stacks


def _find_stack(paths: Sequence[str], layers: str | None) -> tuple[str, int]:
    counts: dict[str, set[int]] = {}
    for p in paths:
        m = _LAYER.match(p)
        if m:
            counts.setdefault(m.group(1), set()).add(int(m.group(2)))
    if layers is not None:
        n = counts.get(layers)
        if not n:
            raise RematError(f"remat_common.tune: layers={layers!r} names no stack of the model; "
                             f"stacks: {sorted_list(counts) or 'none'}. Fix: pass one of them.")
        return layers, max(n) + 1
    if not counts:
        raise RematError(_MSG_NO_STACK.format(paths=short(list(paths)[:8])))
    stack = max(counts, key=lambda s: (len(counts[s]), -len(s)))
    return stack, max(counts[stack]) + 1


@dataclasses.dataclass(frozen=True)
class LayerRules:
    """A choice written as rules on and below each layer: ``(relative path, annotation)``, ``""``
    the layer itself (``(("", "save"), ("mlp", "custom"))``: the layer saves, its ``mlp`` runs its
    own rules)."""

    rules: tuple[tuple[str, Any], ...]

    def on(self, layers: str) -> dict[str, Any]:
        """The rules for ``layers`` (``blocks.*``, ``blocks.[0-3]``)."""
        return {f"{layers}.{sub}" if sub else layers: ann for sub, ann in self.rules}

    def to_json(self) -> dict[str, Any]:
        return {"rules": {sub or ".": ann for sub, ann in self.rules}}


def custom_choice(stack: str, layers: int, custom_paths: Sequence[str]) -> Any:
    """The ``custom`` choice where every layer of ``stack`` declares its own rules
    (``__remat_custom__``) on the layer itself (``"custom"``) or on modules inside it (those
    annotated ``custom``, the layer ``save``: a :class:`LayerRules`); ``None`` where none or not
    every layer does.

    >>> custom_choice("blocks", 2, ["blocks.0.mlp", "blocks.1.mlp", "head"])
    LayerRules(rules=(('', 'save'), ('mlp', 'custom')))
    >>> custom_choice("blocks", 2, ["blocks.0", "blocks.0.mlp", "blocks.1"])
    'custom'
    """
    per_layer: list[set[str]] = [set() for _ in range(layers)]
    for p in custom_paths:
        m = re.match(rf"^{re.escape(stack)}\.(\d+)(?:\.(.+))?$", p)
        if m and int(m.group(1)) < layers:
            per_layer[int(m.group(1))].add(m.group(2) or "")
    common = set.intersection(*per_layer) if per_layer else set()
    if not common:
        return None
    if "" in common:
        return "custom"
    # the outermost ones: a custom module inside another runs under the outer one's rules
    top = sorted(s for s in common if not any(s.startswith(o + ".") for o in common))
    return LayerRules((("", "save"), *((s, "custom") for s in top)))


_MSG_NESTED_NOT_SCANNED = """\
remat_common.tune: choice {choice!r} needs a scanned stack, and {stack!r} is not one: its layers
are called one by one, so there is no scan to run as checkpointed blocks. Nesting applies to the
stacks the adapters scan: Flax layers built with nnx.vmap, run by flax_remat_plugin.scan_layers
and declared with annotate(..., stacks=[...]) or __remat_stacks__; Equinox layers in an
equinox_remat_plugin.Stacked ({docs}). Fix: tune the model with its layers stacked (the
examples: --size layout=scan), or leave {choice!r} out of the choices."""

_MSG_NESTED_SIZE = """\
remat_common.tune: choice {choice!r} on the stack {stack!r} of {n} layers: {why}. Fix: {fix}"""


def nested_choice(choice: str, stack: str, layers: int, *, scanned: bool) -> dict[str, Any]:
    """The whole-stack candidate of a ``nested`` choice: ``nested`` (blocks of about √L layers)
    or ``nested:K`` (blocks of K layers), each layer recomputed inside its block, as a plan
    ``{stack: {remat: recompute, nested: ...}}``; :class:`RematError` where it cannot apply (a
    stack that is not scanned, a block size out of range).

    >>> nested_choice("nested", "blocks", 16, scanned=True)
    {'blocks': {'remat': 'recompute', 'nested': 'sqrt'}}
    >>> nested_choice("nested:4", "blocks", 16, scanned=True)
    {'blocks': {'remat': 'recompute', 'nested': 4}}
    """
    _, _, size = choice.partition(":")
    if not scanned:
        raise RematError(_MSG_NESTED_NOT_SCANNED.format(
            choice=choice, stack=stack, docs=doc_url("semantics", "nested-stacks-n-checkpointing")))
    spec: int | str
    if size in ("", SQRT):
        spec = SQRT
        if sqrt_block(layers) < 2:
            raise RematError(_MSG_NESTED_SIZE.format(
                choice=choice, stack=stack, n=layers,
                why="a block holds at least 2 layers and fewer than the whole stack",
                fix="nest a deeper stack, or leave 'nested' out of the choices."))
    elif size.isdigit() and 2 <= int(size) <= layers:
        spec = int(size)
    else:
        raise RematError(_MSG_NESTED_SIZE.format(
            choice=choice, stack=stack, n=layers,
            why=f"{size!r} is not a block size from 2 to {layers}",
            fix=f"write nested:K with K from 2 to {layers}, or nested (blocks of about "
                f"√{layers}: {sqrt_block(layers)} layers)."))
    return {stack: {"remat": "recompute", NESTED_KEY: spec}}


def nesting_pays(layers: int) -> bool:
    """Whether √L nesting keeps fewer layer inputs than per-layer recompute: ``ceil(L/k)`` block
    inputs plus the ``k`` layer inputs of the block being recomputed, against ``L`` (from 6
    layers on); :func:`tune` adds the ``nested`` candidate by default only then.

    >>> [n for n in range(2, 10) if nesting_pays(n)]
    [6, 7, 8, 9]
    """
    k = sqrt_block(layers)
    return k >= 2 and -(-layers // k) + k < layers


def default_choices(tags: Sequence[str], *, offload: bool = True,
                    custom: Any = None) -> dict[str, Any]:
    """The choices a layer gets by default: no remat, the dots policies, the tagged names kept,
    the modules' own rules (``custom``, where the layers declare them: :func:`custom_choice`),
    the block input or the matmul outputs offloaded (where the backend has host memory), full
    recompute."""
    out: dict[str, Any] = {"save": "save", "dots": "dots", "dots_no_batch": "dots_no_batch"}
    if tags:
        out["names"] = {"save": sorted(tags)}
    if custom is not None:
        out["custom"] = custom
    if offload:
        out["offload"] = "offload"
        out["offload_dots_no_batch"] = "offload_dots_no_batch"
    out["recompute"] = "recompute"
    return out


def name_choice(choice: str, tags: Sequence[str]) -> dict[str, list[str]]:
    """A per-name choice: ``save:q+k+v`` keeps those tagged values on device, ``offload:mlp_hidden``
    moves them to host; everything else in the layer is recomputed.

    >>> name_choice("save:q+k", ["k", "q", "v"])
    {'save': ['k', 'q']}
    """
    where, _, rest = choice.partition(":")
    names = sorted({n for n in rest.split("+") if n})
    unknown = sorted(set(names) - set(tags))
    if not names or unknown:
        raise RematError(f"remat_common.tune: choice {choice!r} names "
                         f"{sorted_list(unknown) if unknown else 'no value'}; the layers tag "
                         f"{sorted_list(tags) or 'nothing'}. Fix: write {where}:NAME[+NAME...] "
                         "with tagged names.")
    return {where: names}


# -- the search ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Model:
    """Per choice: a layer's marginal device bytes ``w`` and cost, and the transient ``g`` of a
    run of layers of it (the part of the peak that is not residuals: arguments, outputs, what
    the backward pass of the run's layers holds on top of the residuals); ``g1``: the transient
    of a run of one layer (on a scanned stack a one-layer group runs unrolled, without the scan
    loop's copy of one iteration's residuals: less than ``g``; elsewhere ``g1 == g``).

    The backward pass runs the layers last to first and frees each run's residuals when the run
    is done, so while run ``r`` is differentiated the step holds the residuals of the runs up to
    it and its transient: the peak is ``max_r (g_r + sum of w over the runs up to r)``. The last
    run's residuals are consumed first, so what keeps the most goes last.
    """

    names: tuple[str, ...]
    w: tuple[float, ...]
    c: tuple[float, ...]
    g: tuple[float, ...]
    g1: tuple[float, ...]
    layers: int

    def predict(self, assign: Sequence[int]) -> tuple[float, float]:
        """Predicted (peak, cost) of one choice per layer, in layer order."""
        mem, s = -math.inf, 0.0
        for k, run in itertools.groupby(assign):
            x = len(list(run))
            s += x * self.w[k]
            mem = max(mem, (self.g1 if x == 1 else self.g)[k] + s)
        return mem, sum(self.c[k] for k in assign)

    def frontier(self) -> list[tuple[float, float, tuple[int, ...]]]:
        """Every assignment on the (predicted peak, cost) Pareto front, exactly, among those with
        at most one run of layers per choice (one scan group per choice on a scanned stack) and,
        where a one-layer run's transient is smaller (``g1 < g``), one more one-layer run of it.

        The runs' order is the one that minimises the peak: by transient, largest first (swapping
        two neighbouring runs ``a, b`` with ``g_a >= g_b`` can only lower the larger of their
        terms). So the DP walks the runs in that order, growing each one layer at a time, and
        keeps every state that no other beats on residuals so far, peak so far and cost; a run
        never directly follows one of its own choice (the two would be one run).
        """
        n, m = self.layers, len(self.names)
        # states closer than this in residuals and peak are taken as equal (the compiled peaks
        # the model is fitted to are bytes; 1e-4 of the largest uniform peak keeps the DP small)
        tol = 1e-4 * max((self.g[k] + n * self.w[k] for k in range(m)), default=0.0) + 0.5
        prune = functools.partial(_prune, tol=tol)
        split = {k for k in range(m) if self.g1[k] < self.g[k]}
        items = [(self.g[k], False, k) for k in range(m)]
        items += [(self.g1[k], True, k) for k in split]
        items.sort(key=lambda t: (-t[0], t[1], t[2]))
        # closed[used][last]: states after whole runs over `used` layers; `last` is the last
        # run's choice where it has a one-layer item still to come (else -1)
        closed: list[dict[int, list[_State]]] = [{} for _ in range(n + 1)]
        closed[0][-1] = [(0.0, -math.inf, 0.0, ())]
        for _, single, k in items:
            w, c, tag = self.w[k], self.c[k], (k if k in split else -1)
            new = [{last: list(v) for last, v in by.items()} for by in closed]  # k left out
            starts = [[st for last, v in by.items() if last != k for st in v] for by in closed]
            if single:
                for used in range(n):
                    for s, peak, cost, a in starts[used]:
                        new[used + 1].setdefault(tag, []).append(
                            (s + w, max(peak, self.g1[k] + s + w), cost + c, a + ((k, 1),)))
            else:
                # open runs of k: (residuals, peak of the closed runs, cost, assignment), by the
                # run's length so far: one layer, or more
                one: list[_State] = []
                more: list[_State] = []
                for used in range(n):
                    more = prune([(s + w, p, cost + c, a[:-1] + ((k, a[-1][1] + 1),))
                                  for s, p, cost, a in one + more])
                    one = prune([(s + w, p, cost + c, a + ((k, 1),))
                                 for s, p, cost, a in starts[used]])
                    out = new[used + 1].setdefault(tag, [])
                    out += [(s, max(p, self.g1[k] + s), cost, a) for s, p, cost, a in one]
                    out += [(s, max(p, self.g[k] + s), cost, a) for s, p, cost, a in more]
            closed = [{last: prune(v) for last, v in by.items()} for by in new]
        return _pareto([(peak, cost, tuple(k for k, x in a for _ in range(x)))
                        for v in closed[n].values() for _, peak, cost, a in v])


#: From this many layers on a scanned stack, the one-layer-last transients are not compiled.
DEEP_SCAN = 8


def _dominated(bounded: Sequence[str], order: Sequence[str], w: Mapping[str, float],
               g: Mapping[str, float], c: Mapping[str, float], unreliable: set[str]
               ) -> dict[str, str]:
    """``{choice: the choice that dominates it}`` among the bounded choices: one whose residuals
    per layer ``w``, transient ``g`` and cost per layer ``c`` are all at least another's (where
    all three are equal, the later one in ``order``) never makes a plan better than that one in
    its place. A choice whose uniform plan XLA rematerialized on its own (``unreliable``: its
    figures are not the plan's) dominates none.

    >>> _dominated(["a", "b", "c"], ["a", "b", "c"], {"a": 2, "b": 1, "c": 1},
    ...            {"a": 5, "b": 5, "c": 5}, {"a": 1, "b": 1, "c": 1}, set())
    {'a': 'b', 'c': 'b'}
    """
    out: dict[str, str] = {}
    for k in bounded:
        for j in bounded:
            if j == k or j in out or j in unreliable:
                continue
            if w[j] <= w[k] and g[j] <= g[k] and c[j] <= c[k] and (
                    (w[j], g[j], c[j]) != (w[k], g[k], c[k]) or order.index(j) < order.index(k)):
                out[k] = j
                break
    return out


def _run_orders(assign: Sequence[int]) -> list[tuple[int, ...]]:
    """The assignments with the same runs of layers as ``assign`` in every other order.

    >>> _run_orders((0, 1, 1))
    [(1, 1, 0)]
    """
    runs = [(k, len(list(g))) for k, g in itertools.groupby(assign)]
    out: list[tuple[int, ...]] = []
    for order in itertools.permutations(runs):
        b = tuple(k for k, x in order for _ in range(x))
        if b != tuple(assign) and b not in out:
            out.append(b)
    return out


#: A DP state of :meth:`_Model.frontier`: residuals so far, peak so far, cost, and the runs so far
#: as ``(choice, layers)``.
_State = tuple[float, float, float, tuple[tuple[int, int], ...]]


def _prune(states: list[_State], tol: float = 0.5) -> list[_State]:
    """The states no other beats on residuals, peak and cost at once, to ``tol`` bytes (ties: the
    first by assignment): by cost, each kept only if no cheaper one has both fewer residuals and
    a lower peak (a staircase of the kept ones' (residuals, peak), residuals rising, peaks
    falling)."""
    states.sort(key=lambda t: (t[2], t[0], t[1], t[3]))
    kept: list[_State] = []
    xs: list[float] = []
    ys: list[float] = []
    for st in states:
        s, p = st[0], st[1]
        i = bisect.bisect_right(xs, s + tol)
        if i and ys[i - 1] <= p + tol:
            continue
        kept.append(st)
        j = bisect.bisect_left(xs, s)
        e = j
        while e < len(xs) and ys[e] >= p:
            e += 1
        xs[j:e] = [s]
        ys[j:e] = [p]
    return kept


def _pareto(items: list[tuple[float, float, tuple[int, ...]]]
            ) -> list[tuple[float, float, tuple[int, ...]]]:
    """The items no other item beats on both memory and cost (ties: the first, smaller tuple)."""
    items.sort(key=lambda t: (round(t[0]), t[1], sorted(t[2]), t[2]))
    out: list[tuple[float, float, tuple[int, ...]]] = []
    best = math.inf
    for m, c, a in items:
        if c < best * (1 - 1e-12) - 1e-9:
            out.append((m, c, a))
            best = c
    return out


def assignment_plan(stack: str, assign: Sequence[str], choices: Mapping[str, Any]) -> dict[str, Any]:
    """A short plan for one choice per layer: the most common choice on ``STACK.*``, then a range
    rule per run of layers that differ from it (later rules win).

    >>> assignment_plan("blocks", ["save", "recompute", "recompute", "recompute"],
    ...                 {"save": "save", "recompute": "recompute"})
    {'blocks.*': 'recompute', 'blocks.0': 'save'}
    >>> assignment_plan("blocks", ["save", "save", "dots", "recompute"],
    ...                 {"save": "save", "dots": "dots", "recompute": "recompute"})
    {'blocks.*': 'save', 'blocks.2': 'dots', 'blocks.3': 'recompute'}
    >>> custom = LayerRules((("", "save"), ("mlp", "custom")))
    >>> assignment_plan("blocks", ["custom", "custom", "recompute"],
    ...                 {"custom": custom, "recompute": "recompute"})
    {'blocks.*': 'recompute', 'blocks.[0-1]': 'save', 'blocks.[0-1].mlp': 'custom'}
    """
    counts = Counter(assign)
    order = list(choices)
    # a choice written as rules below the layers is on the glob only when every layer takes it
    plain = [k for k in counts if not isinstance(choices[k], LayerRules)] or list(counts)
    common = max(plain, key=lambda k: (counts[k], -order.index(k)))
    out: dict[str, Any] = _rules_on(f"{stack}.*", choices[common])
    for choice, run in itertools.groupby(enumerate(assign), key=lambda t: t[1]):
        idx = [i for i, _ in run]
        if choice == common:
            continue
        key = f"{stack}.{idx[0]}" if len(idx) == 1 else f"{stack}.[{idx[0]}-{idx[-1]}]"
        rules = _rules_on(key, choices[choice])
        if isinstance(choices[choice], LayerRules) and rules[key] == out[f"{stack}.*"]:
            del rules[key]  # the layers' own annotation is the glob's already
        out.update(rules)
    return out


def _has_boundary(choice: Any) -> bool:
    """Whether a choice puts a remat boundary on the layer itself (``save`` does not, nor a
    :class:`LayerRules` that leaves the layer saved)."""
    if isinstance(choice, LayerRules):
        choice = dict(choice.rules).get("", "save")
    return choice not in ("save", "inherit")


def _rules_on(layers: str, choice: Any) -> dict[str, Any]:
    return choice.on(layers) if isinstance(choice, LayerRules) else {layers: choice}


class _Runner:
    """Compiles plans (:func:`compile_figures`) and turns each report into a :class:`TunePoint`."""

    def __init__(self, build: Builder, objective: Objective, profile: DeviceProfile | None,
                 max_compiles: int, deadline: float | None,
                 progress: Callable[[TuneEvent], None] | None, where: Where | None = None) -> None:
        self.build, self.objective, self.profile = build, objective, profile
        self.where = where or Where.of(None, None)
        self.link = host_link(profile)
        self.max_compiles, self.deadline, self.progress = max_compiles, deadline, progress
        self.caps = capabilities()
        self.compiles = 0
        self.cached = 0
        self.cache: dict[str, Any] | None = None
        #: plans whose FLOPs are the countable part only, by the reason (the loops left uncounted)
        self.partial: dict[str, list[str]] = {}

    @property
    def exhausted(self) -> bool:
        return self.compiles >= self.max_compiles or (
            self.deadline is not None and time.perf_counter() > self.deadline)

    def cost(self, flops: float, host_bytes: int) -> float:
        if self.objective == "time":
            assert self.profile is not None
            return self.profile.step_seconds(flops, 2 * host_bytes)
        # offload is not free: the residuals' trip to host and back, as FLOPs (host_link)
        return flops + self.link.flop_equivalent(2 * host_bytes)

    def _count(self, name: str) -> None:
        if self.progress is not None:
            self.progress(TuneEvent("compile", name, self.compiles, self.max_compiles))
        self.compiles += 1

    def report(self, name: str, plan: Plan | None, build: Builder | None = None) -> PlanReport:
        """One plan's compiled figures (a :class:`RematError` from its build or checks is raised)."""
        make = functools.partial(build or self.build, plan)
        self._count(name)
        (r,) = compile_figures([(name, plan, make)], accelerator=self.where.acc,
                               mesh=self.where.mesh, compiler_options=self.where.options)
        if isinstance(r, RematError):
            raise r
        return r

    def peak(self, r: PlanReport) -> tuple[int, bool]:
        total = r.memory.device_total
        if total is None:
            raise RematError(
                "remat_common.tune: the backend gives no memory_analysis() for the compiled step "
                f"({self.caps.backend}), so no plan can be checked against a budget.")
        if r.host_bytes and not self.caps.host_offload_placed and self.where.acc.is_local:
            return total - r.host_bytes // self.split, True  # on a target, its compiler placed them
        return total, False

    @property
    def split(self) -> int:
        """The devices the batch is split over: the residuals are traced for the whole batch,
        the peak (and each device's host link) is per device."""
        return math.prod(self.where.mesh.values()) if self.where.mesh else 1

    def _figures(self, name: str, r: PlanReport) -> tuple[Any, ...]:
        flops = r.flops
        if flops is None:
            if r.flops_counted is None:
                raise _Unrankable(_MSG_UNRANKABLE.format(
                    what=f"the FLOPs of plan {name!r}", reason=r.flops_unknown,
                    when=f"after {self.compiles} compile(s), at the first plan that showed it"))
            flops = r.flops_counted  # a lower bound: the loops without a trip count once
            self.partial.setdefault(r.flops_unknown or "", []).append(name)
        peak, est = self.peak(r)
        dominant = [] if r.breakdown is None else [list(g) for g in r.breakdown.largest(3)]
        # per device, as the peak: a model of global residuals against per-device peaks predicted
        # -20 GiB to 277 GiB for plans that compiled to 51-62 GiB (Llama-3-8B, h100x8, fsdp=8)
        return (peak, est, r.device_bytes // self.split, r.host_bytes // self.split, flops,
                tuple(r.problems), dominant, r.xla_remat)

    def points(self, jobs: Sequence[_Job], *, at_least_one: bool = False
               ) -> list[TunePoint | RematError | None]:
        """Each job's point, in order: from the cache, else compiled (the compiles of a batch
        overlap its tracing: :func:`compile_figures`); a :class:`RematError` where the plan could
        not be built or checked; ``None`` where the compile or time limit left it out (the first
        job is compiled regardless when ``at_least_one``)."""
        out: list[TunePoint | RematError | None] = [None] * len(jobs)
        keys = [json.dumps(j.config, sort_keys=True) for j in jobs]
        todo: list[int] = []
        again: dict[int, int] = {}  # a plan twice in the batch: compiled once
        first: dict[str, int] = {}
        for i, (job, key) in enumerate(zip(jobs, keys)):
            hit = None if self.cache is None else self.cache.get(key)
            if hit is not None:
                self.cached += 1
                out[i] = self._point(job, hit)
            elif key in first:
                again[i] = first[key]
            else:
                first[key] = i
                todo.append(i)
        figures: dict[int, tuple[Any, ...]] = {}
        sent: list[int] = []

        def items() -> Any:
            for i in todo:
                if self.exhausted and not (at_least_one and i == 0):
                    return
                job = jobs[i]
                self._count(job.name)
                sent.append(i)
                plan = None if job.config is None else Plan.from_mapping(job.config)
                yield job.name, plan, functools.partial(self.build, plan)

        results = compile_figures(items(), accelerator=self.where.acc,  # fills ``sent`` as it goes
                                  mesh=self.where.mesh, compiler_options=self.where.options)
        for i, r in zip(sent, results):
            if isinstance(r, RematError):
                out[i] = r
                continue
            try:
                hit = self._figures(jobs[i].name, r)
            except _Unrankable:
                raise  # no plan can be ranked: stop now, not after compiling every one
            except RematError as e:
                out[i] = e
                continue
            if self.cache is not None:
                self.cache[keys[i]] = hit
            figures[i] = hit
            out[i] = got = self._point(jobs[i], hit)
            if self.progress is not None:
                self.progress(TuneEvent("compiled", got.name, self.compiles, self.max_compiles,
                                        got.summary()))
        for i, j in again.items():
            if j in figures:
                self.cached += 1
                out[i] = self._point(jobs[i], figures[j])
            else:  # left out, or an error
                out[i] = out[j] if isinstance(out[j], RematError) else None
        return out

    def time_steps(self, pts: Sequence[TunePoint], steps: int) -> dict[str, float]:
        """Median step time of each point's plan: compiled again and run side by side."""
        for p in pts:
            self._count(f"{p.name} (timed)")
        plans = {p.name: None if p.plan is None else Plan.from_mapping(p.plan) for p in pts}
        rep = measure_plans(self.build, plans, steps=steps, warmup=2, placement=False,
                            compiler_options=self.where.options,
                            check_layouts=False)  # timing only: the search compiled them
        out = {}
        for p in pts:
            again = self.peak(rep[p.name])[0]
            if again != p.peak:
                raise RematError(f"remat_common.tune: plan {p.name!r} compiled to a peak of "
                                 f"{again} bytes to be timed, {p.peak} bytes in the search; the "
                                 "step is not deterministic, so its figures cannot be trusted.")
            median = rep[p.name].timing.median_s
            assert median is not None  # steps >= 1
            out[p.name] = median
        return out

    def point(self, name: str, config: dict[str, Any] | None, assignment: tuple[str, ...] | None,
              source: str, predicted: float | None = None) -> TunePoint:
        """One plan's point (raises its :class:`RematError`; the caller checks the limits)."""
        (p,) = self.points([_Job(name, config, assignment, source, predicted)])
        if isinstance(p, RematError):
            raise p
        assert p is not None, "point() called past the compile limit"
        return p

    def _point(self, job: _Job, hit: tuple[Any, ...]) -> TunePoint:
        peak, est, dev, host, flops, problems = hit[:6]
        dominant = tuple((str(k), m, int(b)) for k, m, b in (hit[6] if len(hit) > 6 else ()))
        return TunePoint(job.name, job.config, job.assignment, peak, est, dev, host, flops,
                         self.cost(flops, host), job.predicted, job.source, tuple(problems),
                         dominant, hit[7] if len(hit) > 7 else None)


class _Unrankable(RematError):
    """The search cannot rank plans: their FLOPs cannot be counted at all."""


_MSG_UNRANKABLE = (
    "remat_common.tune: {what} cannot be counted ({reason}), and the search ranks plans by them; "
    "it stopped {when}. Fix: run the search with a jax whose compiled steps can be costed per "
    "loop iteration (jax 0.11.0 to 0.12 on CPU can), or compare plans "
    "by compiled peak alone with `remat report`, which shows these FLOPs as unknown.")


@functools.cache
def flops_countable() -> str | None:
    """Why the FLOPs of a compiled step cannot be counted here (``None``: they can), from a probe
    as small as a step gets: a scan whose body draws random numbers (a loop in a loop, and the
    RNG's loops XLA:CPU outlines into calls), compiled in milliseconds."""
    import jax.numpy as jnp

    def probe(h: jax.Array, key: jax.Array) -> jax.Array:
        def body(c: jax.Array, k: jax.Array) -> tuple[jax.Array, None]:
            return jnp.tanh(c * jax.random.uniform(jax.random.fold_in(k, 1), c.shape)), None

        return jax.lax.scan(body, h, jax.random.split(key, 2))[0].sum()

    got = count_flops(jax.jit(probe).lower(jnp.ones((4,)), jax.random.key(0)).compile())
    return None if got.counted is not None else got.reason


class _Job(NamedTuple):
    """A plan for the runner: its point's name, plan config, assignment, source, prediction."""

    name: str
    config: dict[str, Any] | None
    assignment: tuple[str, ...] | None
    source: str
    predicted: float | None = None


def _check_tune_args(target: Any, choices: Any, plans: Any, max_compiles: Any, time_limit: Any,
                     progress: Any, cache: Any, measure: Any, measure_steps: Any,
                     layers: Any) -> None:
    """Refuses, before anything is built or compiled, arguments of :func:`tune` that would fail
    later with a bare TypeError, or be misread (a string of choices split into characters, a
    negative time limit that stops after one compile, a choice that compiles to an error)."""
    fn = "remat_common.tune"
    if not callable(target):
        raise RematError(f"{fn}: target must be a builder build(plan) -> MeasureTarget, got "
                         f"{type(target).__name__} {short(target)}.")
    check_count(fn, "max_compiles", max_compiles, 1)
    check_count(fn, "measure", measure, 0)
    check_count(fn, "measure_steps", measure_steps, 1)
    if time_limit is not None and (isinstance(time_limit, bool) or not isinstance(
            time_limit, int | float) or not math.isfinite(time_limit) or time_limit <= 0):
        raise RematError(f"{fn}: time_limit must be a positive number of seconds (or None: no "
                         f"limit), got {type(time_limit).__name__} {short(time_limit)}.")
    for name, value in (("progress", progress),):
        if value is not None and not callable(value):
            raise RematError(f"{fn}: {name} must be a callable (or None), got "
                             f"{type(value).__name__} {short(value)}.")
    if cache is not None and not isinstance(cache, dict):
        raise RematError(f"{fn}: cache must be a dict shared between calls (or None), got "
                         f"{type(cache).__name__} {short(cache)}.")
    if layers is not None and not isinstance(layers, str):
        raise RematError(f"{fn}: layers must be the stack's path (a string such as 'blocks'), got "
                         f"{type(layers).__name__} {short(layers)}.")
    if isinstance(choices, Mapping):
        for name, value in choices.items():
            if not isinstance(name, str) or not name:
                raise RematError(f"{fn}: choice names must be non-empty strings, got "
                                 f"{short(name)}.")
            if not isinstance(value, LayerRules):
                try:
                    parse_annotation(value)
                except RematError as e:
                    raise RematError(f"{fn}: choice {name!r}: {e}") from None
    elif choices is not None:
        if isinstance(choices, str | bytes) or not isinstance(choices, Sequence | set | frozenset):
            fix = f"pass [{short(choices)}]" if isinstance(choices, str) else "pass a list of names"
            raise RematError(f"{fn}: choices must be a list of choice names (or a mapping "
                             f"{{name: annotation}}), got {type(choices).__name__} "
                             f"{short(choices)}. Fix: {fix}.")
        bad = [c for c in choices if not isinstance(c, str)]
        if bad:
            raise RematError(f"{fn}: choice names must be strings, got {short(bad[0])}.")
    if plans is not None and not isinstance(plans, Mapping):
        raise RematError(f"{fn}: plans must be a mapping {{name: plan}} (a plan: a mapping of "
                         "rules, a file path, a Plan, or None), got "
                         f"{type(plans).__name__} {short(plans)}. Fix: name each plan, e.g. "
                         "{'minimal': 'plans/minimal.yaml'}.")


_MSG_INDISTINCT = (
    "the compiled peaks cannot tell the candidates apart: {names} all compile to {peak}. At this "
    "size the step's memory is its arguments, outputs and workspace, not the activations a plan "
    "keeps, so the budget cannot choose between them{offload}. Fix: tune at the size you train "
    "(--size batch=N seq_len=N), or compile for the accelerator the plan is for.")


def _indistinct_peaks(uniform: Mapping[str, TunePoint], choices: Mapping[str, Any]) -> list[str]:
    """A warning when every uniform candidate that keeps its residuals on device (two or more)
    compiled to the same peak: the figures that should rank them are blind to what they keep."""
    on_device = [p for k, p in uniform.items() if not p.host_bytes and not p.problems
                 and not _moves_to_host(choices[k])]
    if len(on_device) < 2 or len({p.peak for p in on_device}) > 1:
        return []
    off = [k for k, p in uniform.items() if p not in on_device and not p.problems]
    return [_MSG_INDISTINCT.format(
        names=", ".join(p.name for p in on_device), peak=fmt_bytes(on_device[0].peak),
        offload=f" (the offloading ones, {', '.join(off)}, differ only by the host bytes they "
                "subtract: an estimate)" if off else "")]


def _moves_to_host(choice: Any) -> bool:
    if isinstance(choice, LayerRules):
        return any(_moves_to_host(a) for _, a in choice.rules)
    try:
        return parse_annotation(choice).moves_to_host
    except RematError:
        return False


_MSG_BELOW_SAVE_ALL = (
    "{listed} compiled to fewer FLOPs than save-all although they recompute: recomputation only "
    "adds work, so these ratios are not the plans' cost. Every loop was counted per iteration; "
    "XLA fuses each step its own way and counts a producer once per fusion that runs it (save-all "
    "hands its intermediates to the backward pass and runs more of them twice). The search ranks "
    "by these FLOPs: compare the plans' step times (--measure) before trusting the order.")

_MSG_BELOW_CHANGED = (
    "{listed} compiled to fewer FLOPs than save-all: as written save-all exceeds the device "
    "memory, so the target compiler rematerialized on its own in it, and its FLOPs are those of "
    "the program XLA changed, not of save-all. The ratios against it understate what the plans "
    "recompute; the search ranks plans by their own FLOPs, which this does not change.")


def _recomputes(config: Mapping[str, Any] | None) -> bool:
    """Whether a plan puts any remat boundary (something is recomputed): not save-all."""
    if not config:
        return False
    try:
        return any(parse_annotation(v).kind not in ("save", "inherit") for v in config.values())
    except RematError:
        return True  # what tune compiled parses; a plan it cannot read is no save-all


def below_save_all(points: Sequence[TunePoint], base: TunePoint | None) -> list[str]:
    """A warning naming the plans that recompute yet compiled to fewer FLOPs than save-all, each
    with its ratio (a figure no remat plan can really have: see :data:`_MSG_BELOW_SAVE_ALL`)."""
    if base is None or not base.flops:
        return []
    below = [f"{p.name} ({p.flops / base.flops:.3f}x)" for p in points
             if p is not base and p.flops < base.flops and _recomputes(p.plan)]
    if not below:
        return []
    listed = ("plan " if len(below) == 1 else "plans ") + ", ".join(below)
    if base.xla_remat:  # the baseline recomputes too: not the plans' fault
        return [_MSG_BELOW_CHANGED.format(listed=listed)]
    return [_MSG_BELOW_SAVE_ALL.format(listed=listed)]


_MSG_NOTHING_FITS = (
    "nothing fits {budget}: the smallest compiled peak is {peak}{est} ({name}, FLOP ratio "
    "{ratio}). It would take a budget of at least {peak}, or a smaller batch or sequence "
    "(remat tune CONFIG --budget {budget_arg} --maximize batch finds the largest batch that fits "
    "{budget}).{dominant}")


def _dominant(p: TunePoint) -> str:
    """What holds the most at a point's compiled peak, as the nothing-fits message says it."""
    if not p.dominant:
        return ""
    from ._breakdown import group_label

    parts = [group_label(kind, m, b) for kind, m, b in p.dominant]
    return f" At that peak the most is held by: {'; '.join(parts)}."


#: What the default budget on an accelerator leaves free of its device memory: on GPUs JAX's
#: allocator takes 75 % of the memory by default (XLA_PYTHON_CLIENT_MEM_FRACTION=.75), so 25 %; on
#: TPUs 5 % for the runtime (an assumption).
RESERVE = {"cuda": 0.25, "tpu": 0.05}


def _local_device(acc: Accelerator) -> Accelerator:
    """``local`` with this machine's first device's memory and platform, where it is a TPU or GPU
    that says how much memory XLA may use; as it was otherwise (no default budget)."""
    d = jax.devices()[0]
    limit = (d.memory_stats() or {}).get("bytes_limit") if d.platform != "cpu" else None
    if not limit:
        return acc
    platform = "tpu" if d.platform == "tpu" else "cuda"
    return dataclasses.replace(acc, name=f"the local {d.device_kind}", platform=platform,
                               memory_bytes=int(limit))


def default_budget(acc: Accelerator, reserve: float | int | str | None = None) -> tuple[int, str]:
    """The budget on ``acc``: its device memory minus ``reserve`` (a fraction below 1, or bytes;
    default :data:`RESERVE`), and a sentence that states it. ``local`` on a machine with a TPU or
    GPU: the memory its first device gives XLA (``memory_stats()["bytes_limit"]``)."""
    local = acc.is_local  # bytes_limit is what XLA may use (on a GPU, after the allocator's share)
    if local:
        acc = _local_device(acc)
    if acc.memory_bytes is None:
        raise RematError(f"remat_common.tune: {acc.name} has no known device memory, so there is "
                         "no default budget. Fix: give the budget (--budget 60GiB).")
    r: float | int
    if reserve is None:
        r = 0.05 if local else RESERVE.get(acc.platform, 0.05)
    elif isinstance(reserve, float) and 0 <= reserve < 1:
        r = reserve
    else:
        r = parse_bytes(reserve, "reserve")
    kept = int(acc.memory_bytes * (1 - r)) if isinstance(r, float) else acc.memory_bytes - r
    if kept <= 0:
        raise RematError(f"remat_common.tune: the reserve {short(reserve)} leaves nothing of "
                         f"{acc.name}'s {fmt_bytes(acc.memory_bytes)}. Fix: a smaller reserve.")
    why = (f"{fmt_bytes(acc.memory_bytes)} of {acc.name}'s device memory minus a reserve of "
           + (f"{r:.0%}" if isinstance(r, float) else fmt_bytes(r))
           + (" (JAX's GPU allocator takes 75 % of the memory by default: "
              "XLA_PYTHON_CLIENT_MEM_FRACTION=.75)" if reserve is None and acc.platform == "cuda" and not local
              else " (runtime and fragmentation)" if reserve is None else ""))
    return kept, why


def target_profile(acc: Accelerator) -> DeviceProfile | None:
    """The device profile of an accelerator's own figures (peak FLOP/s, device memory, host link)."""
    if acc.is_local or None in (acc.flops_per_s, acc.memory_bytes, acc.host_link_bytes_per_s):
        return None
    assert acc.flops_per_s is not None and acc.memory_bytes is not None
    assert acc.host_link_bytes_per_s is not None
    return DeviceProfile(acc.name, acc.flops_per_s, acc.memory_bytes, acc.host_link_bytes_per_s,
                         acc.source)


def tune(
    target: Builder,
    budget: int | str | None = None,
    *,
    layers: str | None = None,
    choices: Mapping[str, Any] | Sequence[str] | None = None,
    plans: Mapping[str, Any] | None = None,
    objective: Objective | None = None,
    profile: str | DeviceProfile | None = None,
    max_compiles: int = 40,
    time_limit: float | None = None,
    progress: Callable[[TuneEvent], None] | None = None,
    cache: dict[str, Any] | None = None,
    measure: int = 0,
    measure_steps: int = 10,
    stop_when_save_fits: bool = True,
    accelerator: str | Accelerator | None = None,
    mesh: str | Mapping[str, int] | None = None,
    reserve: float | int | str | None = None,
    compiler_options: Mapping[str, Any] | None = None,
) -> TuneResult:
    """Finds the cheapest plan whose compiled training step fits ``budget``, and verifies it.

    One choice per layer of the model's stack of layers, from ``choices``, the layers of a
    choice in one run (on a scanned stack, one more single layer of ``save`` may come last), the
    runs in the order with the smallest peak; the search is calibrated by
    compiling one uniform plan per choice, solved exactly over those assignments on that model,
    and every plan it proposes is compiled, measured and verified before it can be chosen
    (see the module notes in ``_tune.py``, and JAX's gradient-checkpointing guide,
    https://docs.jax.dev/en/latest/gradient-checkpointing.html, for what the choices mean).

    Args:
      target: a builder ``build(plan) -> MeasureTarget``, as :func:`measure` takes it.
      budget: device bytes, an int or a string with a unit (``"12GiB"``, ``"800MiB"``).
      layers: the stack path (``"blocks"``); default: the path with the most numbered children.
      choices: ``{name: annotation}`` a layer may take, or names picked from
        :func:`default_choices` (``["dots_no_batch", "recompute"]``) and per-name choices
        (``"save:q+k+v"``, ``"offload:mlp_hidden"``: :func:`name_choice`); default: all of
        :func:`default_choices`, from the names the model tags and, where the layers' modules
        declare their own rules (``__remat_custom__``), ``custom`` (:func:`custom_choice`)
        (``save`` is always added: it is the baseline of the ratios). Each choice costs one
        calibration compile, and a choice without a remat boundary on the layer (``save``) one
        more (a one-layer delta; two on a scanned stack, where each other bounded choice also
        costs one: its one-layer group last) unless save-all fits. ``"nested"`` /
        ``"nested:K"`` add a whole-stack candidate, not a per-layer choice: the scan over a
        scanned stack run as checkpointed blocks of about √L (or K) layers, each layer
        recomputed in its block, one compile (:func:`nested_choice`; refused where the stack is
        not scanned). By default it is added on a scanned stack where it keeps fewer layer
        inputs than full recompute, from 6 layers (:func:`nesting_pays`).
      plans: extra ``{name: plan}`` to compile and consider as they are.
      objective: ``"flops"`` (default without a profile) or ``"time"`` (FLOPs at the profile's
        peak plus host transfers at its link bandwidth; the default with a profile). With
        ``"flops"`` an offloaded residual's trip to host and back counts too, as the FLOPs the
        device does meanwhile at the profile's host link (without a profile, the ``h100``
        profile's 64 GB/s: :func:`host_link`); the notes name the figure.
      profile: a device profile name (``h100``, ``h200``, ``tpu-v5e``), YAML file or
        :class:`DeviceProfile`.
      max_compiles: stop searching after this many compiles (calibration included).
      time_limit: stop searching after this many seconds.
      progress: called with a :class:`TuneEvent` before each compile.
      cache: a dict shared between calls on the same target and size: the figures of a plan
        compiled before are taken from it instead of compiling again (they are deterministic).
        ``compiles`` counts only real compiles; ``cached`` the plans taken from the cache.
      measure: after the search, time the ``measure`` cheapest compiled plans that fit (their
        steps interleaved, :func:`remat_common.measurement.measure`; each is compiled once more
        to run) and choose the one with the smallest median step time. Meant for the accelerator
        the plan is for: CPU step times do not represent one (the notes say so).
      measure_steps: timed steps per plan (after 2 warm-up steps).
      accelerator: search on this accelerator's compiler (``h100x8``, ``v5p:2x2x2``; see
        :func:`remat_common.measurement.measure`): every peak is the target's, per device, with
        its host placements (no estimate); the budget defaults to its device memory minus
        ``reserve`` (:func:`default_budget`), the objective to step time with its figures (peak
        FLOP/s, host link: offloads are ranked by what they move over it).
      mesh: the accelerator's devices (``fsdp=8``; default data parallel).
      reserve: what the default budget leaves free: a fraction below 1 or bytes (default
        :data:`RESERVE`).
      stop_when_save_fits: without extra ``plans``, save-all is compiled first, and where it
        fits the budget nothing else is (one compile, and the notes say so): no plan is cheaper
        than recomputing nothing. ``False``, or extra ``plans`` (a comparison was asked for),
        calibrate every choice regardless (a capacity search wants the other plans' figures).
      compiler_options: XLA options for every compile (``jax.jit(..., compiler_options=...)``):
        ``{"xla_disable_hlo_passes": "cse"}`` on jax 0.11.0's CPU, whose CSE merges each
        recomputation back into the forward pass, so that the compiled peaks and FLOPs tell the
        plans apart there. A ``cache`` holds figures compiled under one set of options.

    Returns:
      A :class:`TuneResult`; ``result.plan`` is ``None`` when no compiled plan fits, and
      ``result.message`` then says the smallest peak reached.
    """
    t0 = time.perf_counter()
    _check_tune_args(target, choices, plans, max_compiles, time_limit, progress, cache, measure,
                     measure_steps, layers)
    check_bool("remat_common.tune", "stop_when_save_fits", stop_when_save_fits)
    where = Where.of(accelerator, mesh, compiler_options, fn="remat_common.tune")
    acc = where.acc
    budget_notes: list[str] = []
    if budget is None:
        if acc.is_local and _local_device(acc).memory_bytes is None:
            raise RematError("remat_common.tune: give a budget (budget='12GiB'), or an "
                             "accelerator whose device memory is the default (accelerator="
                             "'h100x8').")
        limit, reason = default_budget(acc, reserve)
        budget_notes.append(f"budget {fmt_bytes(limit)} per device: {reason}.")
    else:
        limit = parse_bytes(budget)
    if not acc.is_local and measure:
        raise RematError(f"remat_common.tune: measure={measure} times steps, but nothing runs on "
                         f"the target {acc.name}. Fix: measure=0 (the default).")
    prof = load_profile(profile) if profile is not None else target_profile(acc)
    extra = [(str(name), None if value is None else _config_of(
        value, f"remat_common.tune: plans[{name!r}]")) for name, value in (plans or {}).items()]
    obj: Objective = objective or ("time" if prof is not None else "flops")
    if obj not in ("flops", "time"):
        raise RematError(f"remat_common.tune: objective must be one of ['flops', 'time'], got "
                         f"{objective!r}.")
    if obj == "time" and prof is None:
        raise RematError("remat_common.tune: objective='time' needs a device profile (profile="
                         "'h100', ...). Fix: pass profile=..., or objective='flops'.")
    run = _Runner(target, obj, prof, max_compiles,
                  None if time_limit is None else t0 + time_limit, progress, where)
    run.cache = cache
    paths, custom_paths, tags_by_path, stacks = _model_paths(target)
    stack, n = _find_stack(paths, layers)
    scanned = stack in stacks
    tags = sorted({t for p, ts in tags_by_path.items()
                   if p == stack or p.startswith(stack + ".") for t in ts})
    caps = run.caps
    can_offload = not acc.is_local or {"device", "pinned_host"} <= set(caps.memory_kinds)
    defaults = default_choices(tags, offload=can_offload,
                               custom=custom_choice(stack, n, custom_paths))
    # whole-stack candidates: the scan over the stack as checkpointed blocks (nested)
    whole: dict[str, dict[str, Any]] = {}
    if choices is None:
        chosen_choices = defaults
        if scanned and nesting_pays(n):
            whole["nested"] = nested_choice("nested", stack, n, scanned=True)
    elif isinstance(choices, Mapping):
        chosen_choices = {"save": "save", **dict(choices)}
    else:
        wanted = [str(c) for c in choices]
        per_name = {c: name_choice(c, tags) for c in wanted if c.partition(":")[0] in ("save", "offload")
                    and ":" in c}
        whole = {c: nested_choice(c, stack, n, scanned=scanned) for c in wanted
                 if c.partition(":")[0] == "nested"}
        unknown = [c for c in wanted if c not in defaults and c not in per_name and c not in whole]
        if unknown:
            raise RematError(f"remat_common.tune: unknown choice(s) {sorted_list(unknown)}; this "
                             f"model's choices: {sorted_list(defaults)}, or save:NAME / "
                             "offload:NAME (names joined by '+'), or nested / nested:K (a "
                             "scanned stack as checkpointed blocks). Fix: pick from them, or "
                             "pass a mapping {name: annotation}.")
        chosen_choices = {k: v for k, v in defaults.items() if k == "save" or k in wanted}
        chosen_choices.update(per_name)
    names = tuple(chosen_choices)
    notes: list[str] = list(budget_notes)
    if not acc.is_local:
        notes.append(f"every plan compiled for {acc.describe()}"
                     + (f", mesh {','.join(f'{k}={v}' for k, v in (where.mesh or {}).items())}"
                        if where.mesh else "") + ": peaks per device from its compiler.")
    why = flops_countable()
    if why is not None:
        raise _Unrankable(_MSG_UNRANKABLE.format(
            what="the FLOPs of a compiled step (a probe: a scan that draws random numbers, as "
                 "dropout does)", reason=why, when="before compiling any plan"))

    # 1. calibration: one uniform plan per choice, and the extra plans (compiled as one batch);
    # save-all first, alone, when it may end the search: where it fits, no plan is cheaper.
    points: list[TunePoint] = []
    uniform: dict[str, TunePoint] = {}
    jobs = [_Job(name, _rules_on(f"{stack}.*", chosen_choices[name]), (name,) * n, "uniform")
            for name in names]
    jobs += [_Job(name, config, None, "nested") for name, config in whole.items()]
    jobs += [_Job(name, config, None, "extra") for name, config in extra]
    alone = 1 if stop_when_save_fits and not extra and jobs[0].name == "save" else len(jobs)
    stopped = False
    for batch in (jobs[:alone], jobs[alone:]):
        if batch and batch[0] is not jobs[0] and "save" in uniform and uniform["save"].fits(limit):
            skipped, batch = batch, []
            notes.append(
                f"save-all fits {fmt_bytes(limit)} (compiled peak {fmt_bytes(uniform['save'].peak)}"
                f"): no plan recomputes less, so the {len(skipped)} other candidates were not "
                "compiled. A budget below save-all's peak makes the search choose.")
        for job, got in zip(batch, run.points(batch, at_least_one=not points)):
            if got is None:
                if job.source in ("uniform", "nested") and not stopped:
                    notes.append(f"stopped calibrating before {job.name!r}: compile or time "
                                 "limit reached.")
                stopped = True
                continue
            if isinstance(got, RematError):
                if job.source == "extra":
                    raise got
                if job.source == "nested" and choices is not None:  # asked for: say why not
                    raise RematError(f"remat_common.tune: choice {job.name!r} cannot apply to "
                                     f"this model: {got}") from got
                notes.append(f"choice {job.name!r} left out: {got}")
                continue
            if job.source == "uniform":
                uniform[job.name] = got
            points.append(got)
    if any(p.estimated for p in points):
        notes.append("offloaded residuals stay on device on this backend (offload is a no-op "
                     f"on {caps.backend}): peaks marked * subtract their verified host bytes, an "
                     "estimate of the device memory on a GPU/TPU.")
    if obj == "flops" and any(p.host_bytes for p in points):
        notes.append("offload is ranked with its transfer cost: the host residuals' bytes to host "
                     f"and back at {run.link.describe()} (pass --profile for another device).")
    warnings = _indistinct_peaks(uniform, chosen_choices)

    # 2. model: per choice, a layer's marginal bytes w and the transient g of a run of it, so
    # that a uniform plan's peak is g + n * w (see _Model for a mix: the backward pass frees the
    # runs' residuals last run first). For a choice that puts a remat boundary on the layer, the
    # compiled step keeps what its policy saves: w is its verified residual bytes per layer. A
    # layer without a boundary (save, or a choice that only puts one on modules inside it) keeps
    # what XLA leaves of AD's residuals after fusion, fewer than verified: its w comes from one
    # more compile, a single layer of it before n - 1 layers of the reference (a one-layer
    # delta). The reference is the choice with the largest transient (full recompute, usually).
    # On a scanned stack a one-layer group runs unrolled, without the scan's copy of one
    # iteration's residuals, so its transient g1 is smaller than a longer group's: one more
    # compile, the single layer last, measures it for those choices (elsewhere g1 = g).
    usable = [k for k in names if k in uniform and not uniform[k].problems]
    w = {k: uniform[k].device_bytes / n for k in usable}
    g = {k: float(uniform[k].peak - uniform[k].device_bytes) for k in usable}
    g1 = dict(g)
    save_fits = "save" in uniform and uniform["save"].fits(limit)  # nothing to search for
    bounded = [k for k in usable if _has_boundary(chosen_choices[k])]
    dropped = _dominated(bounded, usable, w, g, {k: uniform[k].cost / n for k in usable},
                         {k for k in usable if uniform[k].xla_remat})
    if dropped and not save_fits:
        usable = [k for k in usable if k not in dropped]
        bounded = [k for k in bounded if k not in dropped]
        notes.append("choices left out of the search, no better per layer than another on this "
                     "compiler (residuals, transient and cost): "
                     + ", ".join(f"{k} (by {j})" for k, j in dropped.items()) + ".")
    # on a deep scan a one-layer run's smaller transient is worth little: taken as a longer run's
    # (an overestimate of the plans that have one), without its compiles
    deep = scanned and n >= DEEP_SCAN
    if deep and bounded and n > 1 and not save_fits:
        notes.append(f"the one-layer-last transients were not compiled on this scan of {n} layers "
                     f"(from {DEEP_SCAN}): a one-layer run's transient is taken as a longer run's, "
                     "an overestimate of the plans that have one.")
    if bounded and n > 1 and not save_fits:
        ref = max(bounded, key=lambda k: (g[k], -usable.index(k)))
        unbounded = [k for k in usable if k not in bounded]
        first = {k: (k,) + (ref,) * (n - 1) for k in unbounded}
        # on a scanned stack, every choice but the reference: a bounded one-layer group runs
        # unrolled too (since the groups share one custom_vjp, nnx_gpt-scan's RRD compiles to
        # 9.32 MiB where g_D + 2 w_R + w_D says 9.94 MiB)
        last = ({k: (ref,) * (n - 1) + (k,) for k in usable if k != ref}
                if scanned and not deep else {})
        jobs = [_Job(f"{k}x1", assignment_plan(stack, first[k], chosen_choices), first[k],
                     "calibration") for k in unbounded]
        jobs += [_Job(f"{k}x1-last", assignment_plan(stack, last[k], chosen_choices), last[k],
                      "calibration") for k in last]
        deltas = {j.name: q for j, q in zip(jobs, run.points(jobs))}
        rest = (n - 1) * w[ref]  # the reference's layers' residuals
        for k in unbounded:
            d = deltas[f"{k}x1"]
            if d is None:
                continue
            if isinstance(d, RematError):
                notes.append(f"one-layer delta of {k!r} left out: {d}")
                continue
            points.append(d)
            u = uniform[k].peak
            wk = d.peak - g[ref] - rest  # peak = g_ref + w_k + rest, when the reference's run binds
            if not scanned and u - (n - 1) * wk > d.peak + 0.5:
                # no: the layer's own term, g_k + w_k = u - (n - 1) w_k, would exceed the peak;
                # take w_k from it (where the model cannot explain both, the larger: cautious)
                wk = (u - d.peak) / (n - 1)
            w[k] = float(wk)
            g[k] = g1[k] = u - n * w[k]
            e = deltas.get(f"{k}x1-last")
            if isinstance(e, TunePoint):
                points.append(e)
                # peak = max(g_ref + rest, g1_k + rest + w_k): g1_k is at most this
                g1[k] = min(g[k], e.peak - rest - w[k])
            elif isinstance(e, RematError):
                notes.append(f"one-layer delta of {k!r} (last) left out: {e}")
        for k in bounded:
            e = deltas.get(f"{k}x1-last")
            if isinstance(e, TunePoint):
                points.append(e)
                g1[k] = min(g[k], e.peak - rest - w[k])
            elif isinstance(e, RematError):
                notes.append(f"one-layer delta of {k!r} (last) left out: {e}")
    model = _Model(
        names=tuple(usable),
        w=tuple(w[k] for k in usable),
        c=tuple(uniform[k].cost / n for k in usable),
        g=tuple(g[k] for k in usable),
        g1=tuple(g1[k] for k in usable),
        layers=n,
    )

    # 3. search
    seen = {p.assignment for p in points if p.assignment is not None}
    under = 0.0  # largest underestimate seen (a plan compiled bigger than predicted)
    over = 0.0  # largest overestimate seen
    front = model.frontier() if usable else []
    reorders: list[tuple[float, float, tuple[int, ...]]] = []  # see below
    xla_changed = 0  # searched plans the target compiler rematerialized on its own
    failed = math.inf  # the smallest prediction of a searched plan that did not fit
    step = 0
    while not run.exhausted:
        fitting = [p for p in points if p.fits(limit)]
        best_cost = min((p.cost for p in fitting), default=math.inf)
        todo = [(m, c, a) for m, c, a in front
                if c < best_cost * (1 - 1e-9) and tuple(usable[k] for k in a) not in seen]
        # first, the other orders of a plan that compiled over budget and over its prediction
        pick = next(((m, c, a) for m, c, a in reorders if c < best_cost * (1 - 1e-9)
                     and tuple(usable[k] for k in a) not in seen), None)
        if pick is None:  # the cheapest plan predicted to fit (the front is by memory, costs falling)
            pick = next(((m, c, a) for m, c, a in reversed(todo) if m + under <= limit), None)
        if pick is None:  # the smallest plan above the prediction, which the model may overestimate
            # (one by one: the compiled peaks do not rise along the front as the predicted ones
            # do; taking the middle of the candidates instead, an 8-layer scan on the H100 target
            # took 13 compiles, not 21, and missed a plan with 2.6 % fewer FLOPs that fits)
            pick = next(((m, c, a) for m, c, a in todo if m - over <= limit and over > 0), None)
        if pick is None and xla_changed and fitting:
            # After plans XLA rematerialized, the margin that found a fit may have passed over
            # cheaper ones: halve the predictions between the fit and the smallest that failed.
            ok = max((p.predicted_peak or -math.inf for p in fitting if p.cost == best_cost),
                     default=-math.inf)
            between = [t for t in todo if ok < t[0] < failed]
            pick = between[len(between) // 2] if between else None
        if pick is None and not fitting:
            # nothing fits: the plan predicted smallest, where it is below every compiled peak,
            # so that the message names the smallest peak the searched plans reach
            low = min(p.peak for p in points) if points else math.inf
            pick = next(((m, c, a) for m, c, a in todo if m + under < low), None)
        if pick is None:
            break
        m, _, a = pick
        assign = tuple(usable[k] for k in a)  # in layer order (see _Model.frontier)
        seen.add(assign)
        step += 1
        try:
            p = run.point(f"tuned-{step}", assignment_plan(stack, assign, chosen_choices), assign,
                          "search", predicted=m)
        except CompilerRefused as e:  # out of memory on the target: over budget, by more than m
            notes.append(f"tuned-{step} left out: {e}")
            under = max(under, limit - m + 1)
            failed = min(failed, m)
            continue
        points.append(p)
        err = p.peak - m
        if not p.fits(limit):
            failed = min(failed, m)
        if p.xla_remat:
            # As written the plan exceeds what the compiler holds: over the budget and over its
            # prediction, by more than its compiled peak (of the program XLA changed) says. Taken
            # as an overestimate instead, these peaks made the Llama-3-8B search on h100x8 walk
            # 22 plans XLA rematerialized one by one into its compile limit. From the second plan
            # XLA changed on, each doubles the margin: a few compiles, not one per plan down the
            # front (the Equinox 8B step, whose mixes XLA changes from 52 GiB predicted on).
            written = xla_remat_original(p.xla_remat)
            xla_changed += 1
            under = max(under, err, limit - m + 1, (written or 0) - m,
                        2 * under if xla_changed > 1 else 0)
            continue
        if err > 0:
            under = max(under, err)
            if not p.fits(limit):
                # The model orders a plan's runs by their fitted transients; where a plan compiles
                # over its prediction those are what it is least sure of (jax 0.11.0's CPU peaks
                # barely track residuals: saving the first of three layers costs 0.5 MiB more
                # than saving the last, which the model had the other way round). The same
                # choices in each other order of their runs are tried next, at the same cost.
                reorders += [(*model.predict(b), b) for b in _run_orders(a)]
        else:
            over = max(over, -err)
    else:
        notes.append(f"the search stopped at the limit ({run.compiles} compiles"
                     + (f", {time_limit:g} s" if time_limit is not None else "") + ").")

    # 4. choose among compiled plans only
    fitting = [p for p in points if p.fits(limit)]
    chosen = min(fitting, key=lambda p: (p.cost, p.peak)) if fitting else None
    step_times: dict[str, float] = {}
    if measure and chosen is not None:
        # 5. time the best few compiled plans that fit (distinct plans), side by side
        top: list[TunePoint] = []
        for p in sorted(fitting, key=lambda p: (p.cost, p.peak)):
            if all(p.plan != q.plan for q in top):
                top.append(p)
        top = top[:measure]
        step_times = run.time_steps(top, measure_steps)
        chosen = min(top, key=lambda p: (step_times[p.name], p.cost))
        if caps.backend == "cpu":
            notes.append("step times were measured on cpu: they do not represent a GPU's or "
                         "TPU's; measure on the accelerator the plan is for.")
    searched = [p for p in points if p.predicted_peak]
    if searched:
        errs = [(p.peak - p.predicted_peak) / p.predicted_peak for p in searched if p.predicted_peak]
        mine = (f"; for {chosen.name}, predicted {fmt_bytes(chosen.predicted_peak)}, compiled "
                f"{fmt_bytes(chosen.peak)} ({errs[searched.index(chosen)]:+.1%})"
                if chosen is not None and chosen in searched else "")
        notes.append(f"calibration error (compiled peak against the model's prediction) of the "
                     f"{len(searched)} plan(s) the search compiled: {min(errs):+.1%} to "
                     f"{max(errs):+.1%}{mine}.")
    changed = [p.name for p in points if p.xla_remat]
    if changed:
        notes.append(f"the {acc.name} compiler rematerialized {len(changed)} plan(s) on its own "
                     f"({', '.join(changed[:4])}{' ...' if len(changed) > 4 else ''}): as written "
                     "they exceed its device memory, so they count as over the budget, and their "
                     "peaks (of the program XLA changed) understate theirs.")
    for reason, partial in run.partial.items():
        listed = ", ".join(partial[:4]) + (f" and {len(partial) - 4} more" if len(partial) > 4 else "")
        notes.append(f"warning: the FLOPs of {len(partial)} plan(s) ({listed}) are the part that "
                     f"can be counted, a lower bound, and the plans are ranked by it: {reason}.")
    wall = time.perf_counter() - t0
    base = uniform.get("save")
    warnings += below_save_all(points, base)
    if chosen is None:
        if not points:
            raise RematError(f"remat_common.tune: none of the {run.compiles} plan(s) compiled "
                             "could be used (each was left out; the notes say why): "
                             + " ".join(notes))
        small = min(points, key=lambda p: (p.peak, p.cost))
        ratio = f"{small.flops / base.flops:.3f}" if base else "-"
        message = _MSG_NOTHING_FITS.format(
            budget=fmt_bytes(limit), peak=fmt_bytes(small.peak), est=" (estimate)" if
            small.estimated else "", name=small.name, ratio=ratio,
            budget_arg=fmt_bytes(limit).replace(" ", ""), dominant=_dominant(small))
        plan = None
    else:
        ratio = (f", FLOP ratio {chosen.flops / base.flops:.3f} vs save-all"
                 + (" (as XLA rematerialized it)" if base.xla_remat else "") if base else "")
        timed = (f", median step {step_times[chosen.name] * 1e3:.2f} ms (fastest of "
                 f"{len(step_times)} timed)" if step_times else "")
        message = (f"{chosen.name} fits {fmt_bytes(limit)}: compiled peak "
                   f"{fmt_bytes(chosen.peak)}{' (estimate)' if chosen.estimated else ''}{ratio}"
                   f"{timed}; {run.compiles} compiles, {wall:.1f} s.")
        plan = None if chosen.plan is None else Plan.from_mapping(chosen.plan)
    if progress is not None:
        progress(TuneEvent("done", None, run.compiles, run.compiles))
    return TuneResult(limit, obj, prof, stack, n, tuple((k, chosen_choices[k]) for k in names),
                      tuple(points), None if chosen is None else chosen.name, plan, run.compiles,
                      wall, message, tuple(notes), run.cached, tuple(step_times.items()),
                      tuple(whole.items()), tuple(warnings), run.link,
                      compiler_identity(None if acc.is_local else acc.platform))


def _config_of(value: Any, what: str = "plan") -> dict[str, Any]:
    try:
        plan = Plan.coerce(value)
    except PlanTypeError as e:  # the value itself is no plan: say which one
        raise PlanTypeError(f"{what}: {e}") from None
    return {r.pattern: r.annotation.to_config() for r in plan.rules}


# -- capacity ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CapacityRow:
    """The largest size of one axis whose compiled step fits the budget under one plan.

    Attributes:
      name: the plan's name; ``plan``: the plan (``{pattern: annotation}``), ``None``: none.
      largest: the largest value that fits (0: not even the smallest one).
      peak: its compiled peak; ``next``: the next value tried above it, ``next_peak``: its peak
        (over budget; ``None`` where the compiler refused it), ``None`` when the search stopped
        at ``limit``.
      compiles: compiles this row took.
      predicted: the largest value the first affine fit of peak in the size predicted to fit
        (``None``: no fit was made).
      next_why: why ``next`` does not fit: over the budget, XLA rematerialized on its own (the
        plan as written exceeds the device memory), or the compiler refused it.
    """

    name: str
    plan: dict[str, Any] | None
    largest: int
    peak: int | None
    next: int | None
    next_peak: int | None
    compiles: int
    predicted: int | None = None
    next_why: str | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_MSG_STEP_SPLIT = """\
remat_common.capacity: step={step}: a batch must split over the {n} devices the mesh splits it
over ({mesh}), so every batch tried must be a multiple of {n}, and batches in steps of {step} are
not. Fix: step={fix} (a multiple of {n}), or lay the step out on fewer devices (mesh=...)."""


def size_step(accelerator: str | Accelerator | None, mesh: str | Mapping[str, int] | None,
              step: int | None, *, batch: bool = True) -> int:
    """The step of a capacity search: ``step``, by default 1, or, for a batch laid out on a mesh,
    the devices it is split over (``data`` x ``fsdp``); a given step that does not split is a
    :class:`RematError` naming one that does."""
    where = Where.of(accelerator, mesh)
    n = math.prod((where.mesh or {}).values()) if batch else 1
    if step is None:
        return n
    if step % n:
        raise RematError(_MSG_STEP_SPLIT.format(
            step=step, n=n, fix=n * max(1, step // n),
            mesh=",".join(f"{k}={v}" for k, v in (where.mesh or {}).items())))
    return step


class NoFit(NamedTuple):
    """A size that does not fit: its peak (``None``: the compiler refused it) and why."""

    peak: int | None
    why: str


def _secant(a: tuple[int, int], b: tuple[int, int], cap: int, step: int) -> int | None:
    """The largest multiple of ``step`` under ``cap`` on the line through two ``(size, peak)``
    points (``None``: the line does not rise)."""
    (x0, y0), (x1, y1) = sorted((a, b))
    if x1 == x0 or y1 <= y0:
        return None
    slope = (y1 - y0) / (x1 - x0)
    return int(math.floor((x0 + (cap - y0) / slope) / step)) * step


#: How much larger than the largest size that fits the capacity search tries at most, in one go.
GROWTH = 8


def _on_the_line(p: int | NoFit) -> bool:
    """Whether a size that does not fit did so where the line can tell: over the budget, or
    refused by the compiler above the device memory the line aims at (not a program XLA
    rematerialized on its own, which it does short of the device memory)."""
    return not isinstance(p, NoFit) or p.peak is None


def largest_fit(peak_at: Callable[[int], int | NoFit], cap: int, start: int, step: int,
                limit: int | None, exhausted: Callable[[], bool], ceiling: int | None = None
                ) -> tuple[int, int | None, int | None]:
    """``(largest size that fits, the smallest size known not to, the first prediction)``.

    Peaks grow with the size, nearly affinely: from the size given (its peak often known) and one
    more, the line through them predicts the largest size that fits; that size and the next step
    are compiled, and the bracket (largest that fits, smallest that does not) narrows with the
    line through the points nearest the budget, bisecting where the line does not help. About
    three compiles where the peak is affine in the size; never a size assumed to fit. The line
    aims at ``cap``, or at ``ceiling`` (the device memory) where that is lower: above it the
    compiler refuses the program, or rematerializes on its own.

    ``peak_at(size)`` is the compiled peak, or an :class:`NoFit` for a size that does not fit
    whatever its peak (the compiler refused it, or rematerialized on its own)."""
    known: dict[int, int | NoFit] = {}
    first: int | None = None

    def fits(v: int) -> bool:
        if v not in known:
            known[v] = peak_at(v)
        got = known[v]
        return not isinstance(got, NoFit) and got <= cap

    lo, hi = (start, None) if fits(start) else (0, start)
    edged = False  # the step below the bracket's top was tried on the line's word
    while not exhausted():
        if (limit is not None and lo >= limit) or (hi is not None and hi - lo <= step):
            break
        pts = sorted((v, p) for v, p in known.items() if not isinstance(p, NoFit))
        under = [q for q in pts if q[1] <= cap]
        over = [q for q in pts if q[1] > cap]
        near = (under[-1:] + over[:1]) if under and over else (pts[-2:] if under else pts[:2])
        aim = min(cap, ceiling) if ceiling is not None else cap
        guess = _secant(near[0], near[1], aim, step) if len(near) == 2 else None
        predicted = guess is not None
        if guess is not None and first is None:
            first = max(0, guess)
        if guess is not None and hi is None and guess > GROWTH * max(lo, step):
            # far beyond every size compiled: the line may come from where the peak barely grows
            # (XLA:TPU keeps a small batch's residuals on chip); grow by GROWTH at most
            guess, predicted = GROWTH * max(lo, step), False
        if guess is None or guess in known or guess <= lo or (hi is not None and guess >= hi):
            if guess is not None and guess <= lo and lo + step not in known:
                guess = lo + step  # the line says lo: the next step settles it
            elif guess is not None and hi is not None and guess >= hi and not edged \
                    and hi - step not in known and _on_the_line(known[hi]):
                guess = hi - step  # the line says hi or beyond: the step below settles it, once
                predicted, edged = False, True
            elif hi is None:  # double up (a line that does not rise says nothing)
                guess = max(lo * 2, lo + step)
                predicted = False
            else:  # bisect the bracket (geometrically where it spans a factor of 4 or more)
                mid = math.sqrt(lo * hi) if lo and hi >= 4 * lo else (lo + hi) / 2
                guess = max(lo + step, int(mid) // step * step)
                predicted = False
        if limit is not None:
            guess = min(guess, limit)
        if guess in known:
            break
        if fits(guess):
            lo = guess
            nxt = guess + step
            if predicted and (hi is None or nxt < hi) and (limit is None or nxt <= limit) \
                    and not exhausted():
                if fits(nxt):  # the step above the prediction: where it does not fit, done
                    lo = nxt
                else:
                    hi = nxt
        else:
            hi = guess if hi is None else min(hi, guess)
    return lo, hi, first


def capacity(
    builder_for: Callable[[int], Builder],
    budget: int | str | None,
    plans: Mapping[str, Any],
    *,
    start: int,
    step: int | None = None,
    limit: int | None = None,
    max_compiles: int = 200,
    progress: Callable[[TuneEvent], None] | None = None,
    known: Mapping[str, int | NoFit] | None = None,
    accelerator: str | Accelerator | None = None,
    mesh: str | Mapping[str, int] | None = None,
    compiler_options: Mapping[str, Any] | None = None,
    reserve: float | int | str | None = None,
    batch: bool = True,
) -> tuple[CapacityRow, ...]:
    """For each plan, the largest value of one size (batch, sequence length) that fits ``budget``.

    The answer ``v`` compiles under the budget and ``v + step`` does not (or is over ``limit``):
    each is compiled. Between them, a frugal search (:func:`largest_fit`): the peak at ``start``
    (from ``known``, or compiled) and at one more size give a line, the peak being nearly affine
    in the batch; the largest size under the budget on it is compiled with the next step, and the
    bracket narrows from there (about three compiles per plan). A size whose compiled step XLA
    rematerialized on its own (the plan as written exceeds the device memory), or that the
    compiler refused as out of memory (XLA:TPU's RESOURCE_EXHAUSTED), does not fit.

    Args:
      builder_for: ``builder_for(value) -> build(plan) -> MeasureTarget`` at that size.
      budget: device bytes (int or ``"12GiB"``); ``None`` with an accelerator: its device memory
        minus ``reserve`` (:func:`default_budget`, as :func:`tune`).
      plans: ``{name: plan}`` (``None``: the un-annotated model).
      start: the first value tried (the config's size); a multiple of ``step``.
      step: the granularity of the answer; default 1, or for a batch laid out on a mesh the
        devices it is split over (a given step must be a multiple of them: :func:`size_step`).
      limit: the largest value worth trying.
      max_compiles: stop after this many compiles in all.
      progress: called with a :class:`TuneEvent` before each compile.
      known: ``{name: peak}`` of plans already compiled at ``start`` (by :func:`tune` at the
        same size): those peaks are taken instead of compiling again; a :class:`NoFit` for one
        that does not fit there whatever its peak (XLA rematerialized it on its own).
      accelerator, mesh: compile for this accelerator (:func:`tune`).
      reserve: what the default budget leaves free (:func:`default_budget`).
      batch: whether the size is the batch (split over the mesh's devices); ``False`` for a
        sequence length.
      compiler_options: XLA options for every compile (:func:`tune`).
    """
    fn = "remat_common.capacity"
    if not callable(builder_for):
        raise RematError(f"{fn}: builder_for must be a function of the size, builder_for(value) -> "
                         f"build(plan), got {type(builder_for).__name__} {short(builder_for)}.")
    if step is not None:
        step = check_count(fn, "step", step, 1)
    start = check_count(fn, "start", start, 1)
    check_count(fn, "max_compiles", max_compiles, 1)
    if limit is not None and check_count(fn, "limit", limit, 1) < start:
        raise RematError(f"{fn}: limit={limit} is below start={start}: the search would report "
                         f"start as the largest value that fits. Fix: a limit of at least {start}, "
                         "or a smaller start.")
    step = size_step(accelerator, mesh, step, batch=batch)
    if start % step:
        raise RematError(f"{fn}: start={start} must be a positive multiple of step={step}.")
    if not isinstance(plans, Mapping):
        raise RematError(f"{fn}: plans must be a mapping {{name: plan}}, got "
                         f"{type(plans).__name__} {short(plans)}.")
    if progress is not None and not callable(progress):
        raise RematError(f"{fn}: progress must be a callable (or None), got "
                         f"{type(progress).__name__} {short(progress)}.")
    configs = {name: None if value is None else _config_of(value, f"{fn}: plans[{str(name)!r}]")
               for name, value in plans.items()}  # every plan read before the first compile
    where = Where.of(accelerator, mesh, compiler_options, fn=fn)
    if budget is None:
        if where.acc.is_local and _local_device(where.acc).memory_bytes is None:
            raise RematError(f"{fn}: give a budget ('12GiB'), or an accelerator whose device "
                             "memory is the default (accelerator='h100x8').")
        cap = default_budget(where.acc, reserve)[0]
    else:
        cap = parse_bytes(budget)
    run = _Runner(builder_for(start), "flops", None, max_compiles, None, progress, where)
    rows = []
    for name, config in configs.items():
        plan = None if config is None else Plan.from_mapping(config)
        peaks: dict[int, int | NoFit] = {}
        if known is not None and str(name) in known:
            k = known[str(name)]
            peaks[start] = k if isinstance(k, NoFit) else int(k)
        before = run.compiles

        def peak_at(v: int, name: str = str(name), plan: Plan | None = plan) -> int | NoFit:
            if v not in peaks:
                try:
                    r = run.report(f"{name}@{v}", plan, builder_for(v))
                except CompilerRefused as e:
                    peaks[v] = NoFit(None, f"the compiler refused it: {e.error}")
                else:
                    peak = run.peak(r)[0]
                    peaks[v] = (NoFit(peak, f"XLA rematerialized on its own: {r.xla_remat}")
                                if r.xla_remat else peak)
            return peaks[v]

        lo, hi, first = largest_fit(peak_at, cap, start, step, limit, lambda: run.exhausted,
                                    where.acc.memory_bytes)
        nxt = hi if hi is not None and hi - lo <= step else None
        over = peaks.get(nxt) if nxt is not None else None
        why = (None if nxt is None else over.why if isinstance(over, NoFit)
               else f"over the budget of {fmt_bytes(cap)}")
        rows.append(CapacityRow(
            str(name), config, lo, _peak_of(peaks.get(lo)), nxt,
            None if nxt is None else _peak_of(over), run.compiles - before, first, why))
    return tuple(rows)


def _peak_of(p: int | NoFit | None) -> int | None:
    return p.peak if isinstance(p, NoFit) else p
