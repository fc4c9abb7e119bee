"""What the tuner returns: the compiled plans it tried (:class:`TunePoint`), the result with its
frontier, chosen plan, JSON and plot (:class:`TuneResult`), and its progress events
(:class:`TuneEvent`)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from ..._compiler import Compiler
from ..._errors import sorted_list
from ..._plan import Plan
from ..._state import StatePlacement
from ..accelerators._compilers import xla_remat_fits
from ..accelerators._profiles import DeviceProfile, HostLink
from ..accelerators._units import fmt_bytes
from ._model import LayerRules


Objective = Literal["flops", "time"]

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
      peak: compiled device bytes of the step (``MemoryFigures.device_total``: arguments +
        outputs + temporaries - aliases; on a TPU, with nothing on host, the compiler's heap
        peak), minus the verified host residual bytes where offload is a no-op on this backend.
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
        changed, else ``None``: the plan as written exceeds the device memory, and does not fit,
        unless its peak plus every value the pass recomputes is within the budget
        (:func:`~..accelerators._compilers.xla_remat_fits`), or ``xla_remat_accepted``.
      xla_remat_accepted: the program XLA's pass changed counts as fitting where its compiled
        peak is within the budget (``tune(accept_xla_remat=True)``): it is what runs, its FLOPs
        include what the pass recomputes.
      state_host_bytes: training state the plan keeps on host between steps (its ``state:``),
        per device: not in ``peak``; each step moves it to the device and back (in ``cost``).
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
    state_host_bytes: int = 0
    xla_remat_accepted: bool = False

    def fits(self, budget: int) -> bool:
        return self.peak <= budget and not self.problems and (
            not self.xla_remat or self.xla_remat_accepted
            or xla_remat_fits(self.xla_remat, self.peak, budget))

    def summary(self) -> str:
        """One line: the compiled peak, the prediction it was compiled for, what went wrong."""
        return (f"peak {fmt_bytes(self.peak)}{' (estimate)' if self.estimated else ''}"
                + (f", predicted {fmt_bytes(self.predicted_peak)}" if self.predicted_peak else "")
                + (f", host {fmt_bytes(self.host_bytes)}" if self.host_bytes else "")
                + (f", state on host {fmt_bytes(self.state_host_bytes)}"
                   if self.state_host_bytes else "")
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
      state: where every compiled plan keeps the training state between steps (the chosen
        plan's ``state:``; :func:`~remat_common.measurement.tune_states` chooses it).
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
    state: StatePlacement = StatePlacement()

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
                + (f", state on host {fmt_bytes(b.state_host_bytes)} to the device and back "
                   f"per step" if b.state_host_bytes else "")
                + (f"; predicted step {b.cost:.3g} s at the {self.profile.name} profile"
                   if self.objective == "time" and self.profile is not None else "")
                + f"; {self.compiles} compiles.\n"
                + ("" if self.compiler is None else
                   f"# compiled by {self.compiler.describe()}.\n"))
        return head + plan_yaml(b.plan, self.state)

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
            "state": self.state.to_config(),
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

        from ..report._plots import frame_with_budget, freeze_layout, place_labels

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


def plan_yaml(config: Mapping[str, Any], state: StatePlacement | None = None) -> str:
    """``{pattern: annotation}`` as the ``rules:`` block of a plan file, and ``state:`` where
    ``state`` keeps something on host."""
    lines = ["rules:"]
    for pattern, ann in config.items():
        lines.append(f"  {json.dumps(pattern)}: {_flow(ann)}")
    if state is not None and not state.is_default:
        lines.append("state: {" + ", ".join(f"{k}: {v if isinstance(v, str) else json.dumps(v)}"
                                            for k, v in state.to_config().items()) + "}")
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
