"""A measurement report: plain, frozen data that reads and writes JSON.

:func:`remat_common.measurement.measure` builds it; the renderers (tables, text, figures) are
functions in ``_render.py`` that take a report. Nothing here imports a renderer.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax

from ..._capabilities import Capabilities
from ..._compiler import Compiler
from ..._errors import short, sorted_list
from ..._jaxcompat import cpu_temp_tracks_residuals, cse_undoes_remat_on_cpu
from ..._residuals import Residual, residual_bytes_by_path
from ..breakdown._figures import MemoryBreakdown
from ._layout import LayoutCheck
from ._report_json import ReportFormatError, check_derived, check_report_json, wrap
from ._state_transfer import StateFigures


_MEMORY_FIELDS = (
    "argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes",
    "alias_size_in_bytes", "generated_code_size_in_bytes", "peak_memory_in_bytes",
    "host_argument_size_in_bytes", "host_output_size_in_bytes", "host_temp_size_in_bytes",
    "host_alias_size_in_bytes",
)


def _platform(compiled: Any) -> str | None:
    """The platform of the devices ``compiled`` runs on (``None`` where none is named)."""
    for sharding in (*jax.tree.leaves(compiled.input_shardings),
                     *jax.tree.leaves(compiled.output_shardings)):
        for device in getattr(sharding, "device_set", ()):
            return str(device.platform)
    return None


@dataclasses.dataclass(frozen=True)
class MemoryFigures:
    """The compiled step's ``memory_analysis()``, field for field (bytes; ``None`` where absent),
    and the platform that compiled it.

    ``peak_memory_in_bytes`` is arguments plus outputs on CPU; ``host_*`` fields are always 0 on
    CPU, where host offload is a no-op
    (https://github.com/jax-remat-plan/jax-remat-plan/blob/main/docs/jax_behaviour.md#measuring-on-cpu).
    """

    argument_size_in_bytes: int | None = None
    output_size_in_bytes: int | None = None
    temp_size_in_bytes: int | None = None
    alias_size_in_bytes: int | None = None
    generated_code_size_in_bytes: int | None = None
    peak_memory_in_bytes: int | None = None
    host_argument_size_in_bytes: int | None = None
    host_output_size_in_bytes: int | None = None
    host_temp_size_in_bytes: int | None = None
    host_alias_size_in_bytes: int | None = None
    #: ``tpu``, ``gpu``, ``cpu``: the platform of the devices the step was compiled for (a
    #: target's, compiled without them); ``None`` where unknown (a report of an earlier version).
    platform: str | None = None

    @classmethod
    def from_compiled(cls, compiled: Any) -> MemoryFigures:
        """Reads ``compiled.memory_analysis()``; every field ``None`` when the backend has none."""
        try:
            stats = compiled.memory_analysis()
        except Exception:  # noqa: BLE001 - some PJRT plugins do not implement it
            stats = None
        if stats is None:
            return cls()
        vals = {f: getattr(stats, f, None) for f in _MEMORY_FIELDS}
        return cls(**{f: None if v is None else int(v) for f, v in vals.items()},
                   platform=_platform(compiled))

    @property
    def device_total(self) -> int | None:
        """What the step holds in device memory at its peak, per device, as its compiler counts
        it: arguments + outputs + temp - aliased (XLA:GPU allocates the temporaries as one
        buffer; XLA:CPU's ``peak_memory_in_bytes`` counts arguments and outputs only).

        XLA:TPU, for a step with nothing in host memory: ``peak_memory_in_bytes``, its heap's
        peak, which is what it accepts or refuses a program by. On a TPU v5e chip (15.75 GiB)
        it accepted and ran the example GPT's step at 15.65 and 15.71 GiB of it and refused the
        next batch at 15.83 and 15.98 GiB ("HLO temporaries ... exceeds available HBM"), while
        the sum came to 18.4 and 22.1 GiB for the steps that ran: its temp is not what is live
        at once (https://github.com/jax-remat-plan/jax-remat-plan/blob/main/docs/tpu.md). Its
        heap peak counts host memory as well (a step with its state on host has the same heap
        peak as with the state on device), so a step that keeps anything in host memory keeps
        the sum, which bounded every such step the chip ran."""
        on_host = (self.host_argument_size_in_bytes, self.host_output_size_in_bytes,
                   self.host_temp_size_in_bytes)
        if self.platform == "tpu" and self.peak_memory_in_bytes and not any(on_host):
            return self.peak_memory_in_bytes
        parts = (self.argument_size_in_bytes, self.output_size_in_bytes, self.temp_size_in_bytes)
        if any(p is None for p in parts):
            return None
        return sum(parts) - (self.alias_size_in_bytes or 0)  # type: ignore[arg-type]

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MemoryFigures:
        return cls(**_known(cls, data))




@dataclasses.dataclass(frozen=True)
class PlacementCheck:
    """Host placements in the step as lowered for a GPU platform through ``jax.export``.

    On CPU the compiled program drops offload placements
    (https://github.com/jax-remat-plan/jax-remat-plan/blob/main/docs/jax_behaviour.md#host-offload),
    so the program JAX lowers for ``platform`` is where an offload can be seen without a GPU.

    Attributes:
      platform: the platform lowered for (``cuda``).
      placements: ``(memory kind, count)`` of ``annotate_device_placement`` ops, sorted by kind.
      offloaded: how many residuals the verifier saw on host for this plan.
      error: why the export failed, if it did.
      resharded: placements whose value changes sharding on its way to or from host (after
        sharding propagation; an offload should change only the memory kind). ``placed`` is False
        when any does.
      host_bytes_per_device: bytes one device places on host, summed over the to-host placement
        ops (an op in a loop body counted once; the step's inputs' shardings propagated).
      state_on_host: the plan keeps training state on host between steps (its ``state:``): the
        step's moves of it to the device and back are host placements it asked for.
    """

    platform: str
    placements: tuple[tuple[str, int], ...] = ()
    offloaded: int = 0
    error: str | None = None
    resharded: int = 0
    host_bytes_per_device: int = 0
    state_on_host: bool = False

    @property
    def to_host(self) -> int:
        """Placements into a memory kind other than ``device`` (offloads)."""
        return sum(n for kind, n in self.placements if kind != "device")

    @property
    def to_device(self) -> int:
        """Placements back into ``device`` memory (reloads for the backward pass)."""
        return sum(n for kind, n in self.placements if kind == "device")

    @property
    def placed(self) -> bool | None:
        """Offloads and host placements agree: both present, or both absent (``None``: failed)."""
        if self.error is not None:
            return None
        if self.resharded:
            return False
        if self.offloaded or self.state_on_host:
            return self.to_host > 0 and self.to_device > 0
        return self.to_host == 0

    def to_json(self) -> dict[str, Any]:
        return {"platform": self.platform, "placements": dict(self.placements),
                "offloaded": self.offloaded, "error": self.error, "resharded": self.resharded,
                "host_bytes_per_device": self.host_bytes_per_device,
                **({"state_on_host": True} if self.state_on_host else {}),
                "to_host": self.to_host, "to_device": self.to_device, "placed": self.placed}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PlacementCheck:
        d = _known(cls, data)
        d["placements"] = tuple(sorted((str(k), int(v)) for k, v in d.get("placements", {}).items()))
        return cls(**d)


@dataclasses.dataclass(frozen=True)
class StepTiming:
    """Compile time and steady-state step time of one plan (seconds).

    Attributes:
      lower_s: tracing and lowering the step.
      compile_s: XLA compilation of the lowered step.
      steps: wall time of each timed step, after ``warmup`` untimed ones; each waits for the
        step's outputs (``block_until_ready``).
      warmup: untimed steps run first.
    """

    lower_s: float
    compile_s: float
    steps: tuple[float, ...] = ()
    warmup: int = 0

    @property
    def median_s(self) -> float | None:
        return statistics.median(self.steps) if self.steps else None

    def to_json(self) -> dict[str, Any]:
        return {"lower_s": self.lower_s, "compile_s": self.compile_s, "steps": list(self.steps),
                "warmup": self.warmup, "median_s": self.median_s}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StepTiming:
        d = _known(cls, data)
        d["steps"] = tuple(float(s) for s in d.get("steps", ()))
        return cls(**d)


@dataclasses.dataclass(frozen=True)
class PlanReport:
    """What one plan costs: residuals, compiled memory and FLOPs, host traffic, times.

    Attributes:
      name: the plan's name in the report.
      plan: the plan as a config dict (:meth:`Plan.to_config`), ``None`` for the un-annotated step.
      boundaries: one line per remat boundary (:meth:`CompiledPlan.describe`).
      residuals: what reverse-mode AD of the loss keeps, by module path and name, with placement
        and bytes (:func:`verify`; :func:`saved_residuals` for the un-annotated step).
      problems, notes: what the verifier found against the plan.
      memory: the compiled step's memory analysis.
      flops: the compiled step's FLOPs (``cost_analysis()``, each scan body multiplied by its
        trip count: :func:`count_flops`), ``None`` where unknown.
      flop_ratio: ``flops`` over the baseline plan's (recomputation overhead).
      flops_unknown: why ``flops`` is unknown (the loops without a trip count, named by op and
        source line, ...), else None.
      shared: ``(first, layers)`` per group of list layers that run as their first layer (one
        shared trace): their residuals carry the first layer's path, once per layer.
      flops_counted: the part of the FLOPs that can be counted (``flops`` when it is known; with a
        loop of unknown trip count, that loop's body once: a lower bound), ``None`` when none.
      placement: host placements in the step lowered for a GPU platform, ``None`` if not checked.
      timing: lower, compile and step times.
      step_time_ratio: median step time over the baseline's, measured side by side.
      breakdown: the compiled step's memory at its peak by kind and module, and over its
        schedule, read from XLA's buffer assignment (``None`` where XLA wrote none).
      xla_remat: compiled for an accelerator, what the target compiler's own rematerialization
        pass changed to fit the device memory, read from the compiled program (the instructions
        it recomputes), with its message where it could not reach the device memory (the program
        that runs is then not the plan as written), else ``None``.
      layout: per scanned stack the plan splits into layer groups or nests, its compiled temp
        against one scan of its layers (:class:`LayoutCheck`; a flagged one is also a problem).
      state: the training state the plan keeps on host between steps (its ``state:``), as the
        compiled step holds it (:class:`StateFigures`: host argument bytes, transfer bytes and
        seconds per step), ``None`` when it keeps it all on device.
    """

    name: str
    plan: dict[str, Any] | None
    boundaries: tuple[str, ...]
    residuals: tuple[Residual, ...]
    problems: tuple[str, ...]
    notes: tuple[str, ...]
    memory: MemoryFigures
    flops: float | None
    flop_ratio: float | None
    placement: PlacementCheck | None
    timing: StepTiming
    step_time_ratio: float | None = None
    flops_unknown: str | None = None
    flops_counted: float | None = None
    shared: tuple[tuple[str, tuple[str, ...]], ...] = ()
    breakdown: MemoryBreakdown | None = None
    xla_remat: str | None = None
    layout: tuple[LayoutCheck, ...] = ()
    state: StateFigures | None = None

    @property
    def device_peak(self) -> int | None:
        """What the step holds in device memory, per device (:attr:`MemoryFigures.device_total`),
        device memory only. State the plan keeps on host is not in it: the compilers
        that place it there count it as host arguments; where the compiler drops the placements
        (XLA:CPU, :attr:`StateFigures.counted_on_device`) its bytes are taken out."""
        total = self.memory.device_total
        if total is None or self.state is None or not self.state.counted_on_device:
            return total
        return max(0, total - self.state.host_argument_bytes)

    @property
    def peak_breakdown(self) -> tuple[dict[str, Any], ...]:
        """The peak's rows ``{"kind", "module", "name", "bytes"}``, summing to the compiled peak
        (empty without a breakdown)."""
        if self.breakdown is None:
            return ()
        return tuple({"kind": r.kind, "module": r.module, "name": r.name, "bytes": r.bytes}
                     for r in self.breakdown.rows)

    def _sum(self, placement: str | None, argument: bool = False) -> int:
        return sum(r.nbytes for r in self.residuals
                   if (r.kind == "argument") == argument
                   and (placement is None or r.placement == placement))

    @property
    def device_bytes(self) -> int:
        """Activation residuals kept on device (arguments of the loss excluded)."""
        return self._sum("device")

    @property
    def host_bytes(self) -> int:
        """Activation residuals moved to host memory."""
        return self._sum("host")

    @property
    def argument_bytes(self) -> int:
        """Arguments of the loss that the backward pass reads (parameters, inputs)."""
        return self._sum(None, argument=True)

    @property
    def host_transfer_bytes(self) -> int:
        """Bytes moved between device and host per step: each offloaded residual out and back."""
        return 2 * self.host_bytes

    def bytes_by_path(self, placement: str | None = None) -> dict[str, int]:
        """Activation residual bytes per module path (``<other>``: unnamed residuals)."""
        return residual_bytes_by_path(
            r for r in self.residuals
            if r.kind != "argument" and (placement is None or r.placement == placement))

    def to_json(self, *, timeline: bool = False) -> dict[str, Any]:
        """A JSON-able dict (a residual's fields at their default left out); with ``timeline``,
        the breakdown's timelines too."""
        return {
            "name": self.name, "plan": self.plan, "boundaries": list(self.boundaries),
            "residuals": [{k: v for k, v in r.to_json().items()
                           if v is not None and not (k == "layers" and v == 1)}
                          for r in self.residuals],
            "problems": list(self.problems), "notes": list(self.notes),
            "memory": self.memory.to_json(), "flops": self.flops, "flop_ratio": self.flop_ratio,
            "placement": None if self.placement is None else self.placement.to_json(),
            "timing": self.timing.to_json(), "step_time_ratio": self.step_time_ratio,
            "flops_unknown": self.flops_unknown, "flops_counted": self.flops_counted,
            "shared": [[first, list(layers)] for first, layers in self.shared],
            "breakdown": None if self.breakdown is None else self.breakdown.to_json(
                timeline=timeline),
            "xla_remat": self.xla_remat,
            "layout": [c.to_json() for c in self.layout],
            "state": None if self.state is None else self.state.to_json(),
            # derived, for readers of the JSON; recomputed on load
            "device_bytes": self.device_bytes, "host_bytes": self.host_bytes,
            "argument_bytes": self.argument_bytes, "host_transfer_bytes": self.host_transfer_bytes,
            "bytes_by_path": {"device": self.bytes_by_path("device"),
                              "host": self.bytes_by_path("host")},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PlanReport:
        d = _known(cls, data)
        d["boundaries"] = tuple(d["boundaries"])
        d["residuals"] = tuple(
            Residual(**{"name": None, "path": None, **_known(Residual, r),
                        "shape": tuple(r["shape"])}) for r in d["residuals"])
        d["problems"] = tuple(d["problems"])
        d["notes"] = tuple(d["notes"])
        d["memory"] = MemoryFigures.from_json(d["memory"])
        d["placement"] = None if d["placement"] is None else PlacementCheck.from_json(d["placement"])
        d["timing"] = StepTiming.from_json(d["timing"])
        d["shared"] = tuple((first, tuple(layers)) for first, layers in d.get("shared", ()))
        b = d.get("breakdown")
        d["breakdown"] = None if b is None else MemoryBreakdown.from_json(b)
        d["layout"] = tuple(LayoutCheck.from_json(c) for c in d.get("layout", ()))
        st = d.get("state")
        d["state"] = None if st is None else StateFigures.from_json(st)
        return cls(**d)


@dataclasses.dataclass(frozen=True)
class FigureNote:
    """Whether one figure of the report is meaningful on the backend it was measured on."""

    figure: str
    meaningful: bool
    note: str


def accelerator_record(acc: Any, mesh: Mapping[str, int] | None) -> dict[str, Any]:
    """What a report compiled for an accelerator records about it (JSON types)."""
    return {"name": acc.name, "platform": acc.platform, "description": acc.describe(),
            "memory_bytes": acc.memory_bytes, "host_link_bytes_per_s": acc.host_link_bytes_per_s,
            "flops_per_s": acc.flops_per_s, "source": acc.source, "mesh": dict(mesh or {})}


def target_notes(acc: Any) -> tuple[FigureNote, ...]:
    """Which figures mean what when the step was compiled for ``acc``
    (https://github.com/jax-remat-plan/jax-remat-plan/blob/main/docs/targets.md)."""
    return (
        FigureNote("residuals", True,
                   "from the traced program (the same on every backend), for the whole batch: "
                   "all devices together, where the memory figures are per device."),
        FigureNote("memory", True,
                   f"the {acc.platform} compiler's memory_analysis() for {acc.name}, per device "
                   "(the step laid out on all its devices), host memory included."),
        FigureNote("flops", True,
                   "counted from the target's compiled HLO, per device, each loop body times its "
                   "trip count."),
        FigureNote("placement", True,
                   "instructions of the target's compiled program that write into host memory "
                   "(memory space 5) and read back from it."),
        FigureNote("step_time", False, "not measured: nothing runs on a target."),
    )


def backend_notes(caps: Capabilities) -> tuple[FigureNote, ...]:
    """Which figures mean what on ``caps.backend``:
    https://github.com/jax-remat-plan/jax-remat-plan/blob/main/docs/jax_behaviour.md#measuring-on-cpu,
    https://github.com/jax-remat-plan/jax-remat-plan/blob/main/docs/jax_behaviour.md#cse,
    https://github.com/jax-remat-plan/jax-remat-plan/blob/main/docs/jax_behaviour.md#host-offload."""
    cpu = caps.backend == "cpu"
    host = caps.host_offload_placed
    old_cse = cse_undoes_remat_on_cpu(caps.jax)
    return (
        FigureNote("residuals", True,
                   "from the traced program (each residual of jax.vjp followed to the equation "
                   "that made it, inside scans and nested jits too): exact on every backend; a "
                   "stacked residual of a scan counts all its layers."),
        FigureNote("flops", not old_cse,
                   "compiled cost_analysis(); on jax 0.11.0 XLA:CPU's CSE merges recomputation "
                   "back (set XLA_FLAGS=--xla_disable_hlo_passes=cse)." if old_cse else
                   "compiled cost_analysis(), each scan (while loop) body multiplied by its trip "
                   "count: recomputation shows as extra FLOPs."),
        FigureNote("temp_size_in_bytes", not (cpu and not cpu_temp_tracks_residuals(caps.jax)),
                   "on CPU it tracks saved activations only at realistic sizes (small ones are "
                   "absorbed into output buffers), and not at all on jax 0.11.0 or 0.12." if cpu else
                   "device temporaries of the compiled step, saved activations included."),
        FigureNote("peak_memory_in_bytes", not cpu,
                   "arguments + outputs only on CPU." if cpu else "the compiler's peak estimate."),
        FigureNote("host_*", host,
                   "always 0 here: the backend drops offload placements, host offload is a no-op."
                   if not host else "host memory of the compiled step (offloaded residuals)."),
        FigureNote("host_transfer_bytes", True,
                   "what the plan moves per step on a GPU/TPU (2 x offloaded bytes)"
                   + ("; nothing really moves on this backend." if not host else ".")),
        FigureNote("placement", True,
                   "annotate_device_placement ops in the step lowered for cuda via jax.export: "
                   "proves offloads survive lowering without a GPU."),
        FigureNote("step_time", True,
                   "median after warm-up, plans interleaved in one run: compare only as ratios"
                   + ("; offload costs nothing here since nothing moves." if not host else ".")),
    )


@dataclasses.dataclass(frozen=True)
class RefusedPlan:
    """A plan the target compiler refused to compile as out of its device memory (XLA:TPU's
    RESOURCE_EXHAUSTED): it has no figures, and it fits no budget.

    Attributes:
      name, plan: as :class:`PlanReport`'s.
      error: the compiler's message.
      compile_s: seconds to lower and compile it up to the refusal.
    """

    name: str
    plan: dict[str, Any] | None
    error: str
    compile_s: float


@dataclasses.dataclass(frozen=True)
class Report:
    """The cost of each plan for one model, measured side by side in one run.

    Attributes:
      plans: one :class:`PlanReport` per plan, in the order given.
      baseline: the name of the plan ratios are taken against.
      capabilities: the JAX, backend and flags it was measured with.
      figures: which figures are meaningful on that backend.
      accelerator: compiled for an accelerator (:func:`accelerator_record`: name, device memory,
        host link, the source of its figures, the mesh), ``None`` for this machine.
      refused: the plans the accelerator's compiler refused as out of its memory, in the order
        given (not in ``plans``; where the baseline asked for is one, ``baseline`` is the first
        plan compiled).
      compiler: the compiler that made the figures, with its versions (jax, jaxlib, libtpu or
        the CUDA plugin; :func:`~remat_common.measurement.compiler_identity`); ``None`` in a
        report written before reports recorded it.
      sizes: the model keyword arguments and batch the target was called with (``remat report``:
        the config's sizes, the preset expanded, and ``--size``); ``None`` when not known.
    """

    plans: tuple[PlanReport, ...]
    baseline: str
    capabilities: Capabilities
    figures: tuple[FigureNote, ...]
    accelerator: dict[str, Any] | None = None
    refused: tuple[RefusedPlan, ...] = ()
    compiler: Compiler | None = None
    sizes: dict[str, Any] | None = None

    @property
    def device_memory(self) -> int | None:
        """Device memory per device of the accelerator compiled for (``None``: this machine)."""
        return None if self.accelerator is None else self.accelerator.get("memory_bytes")

    def exceeds_by(self, name: str) -> int | None:
        """Bytes by which plan ``name``'s peak per device (:attr:`PlanReport.device_peak`)
        exceeds the accelerator's device memory (0: it fits; ``None``: no device memory known);
        state the plan keeps on host is not counted (:attr:`PlanReport.device_peak`)."""
        mem, total = self.device_memory, self[name].device_peak
        if mem is None or total is None:
            return None
        return max(0, total - mem)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.plans)

    @property
    def save_all(self) -> PlanReport | None:
        """The plan that keeps every activation (the un-annotated model, or a plan whose every
        rule says ``save``) with a breakdown, the first such; ``None`` when the report has none.
        The per-layer rows read what each layer would keep under it from it."""
        for p in self.plans:
            rules = (p.plan or {}).get("rules", ())
            if p.breakdown is not None and all(r.get("remat") == "save" for r in rules):
                return p
        return None

    def per_layer(self, name: str) -> list[dict[str, Any]]:
        """Plan ``name``'s per-layer rows (:meth:`MemoryBreakdown.per_layer_rows`): what each
        module at layer depth keeps and holds at the peak, and would keep under
        :attr:`save_all` (empty without a breakdown)."""
        b = self[name].breakdown
        ref = self.save_all
        return [] if b is None else b.per_layer_rows(None if ref is None else ref.breakdown)

    def __getitem__(self, name: str) -> PlanReport:
        for p in self.plans:
            if p.name == name:
                return p
        raise KeyError(f"no plan named {name!r} in this report; plans: {sorted_list(self.names)}")

    @property
    def problems(self) -> tuple[str, ...]:
        """Every verification problem, prefixed with its plan's name."""
        return tuple(f"{p.name}: {msg}" for p in self.plans for msg in p.problems)

    def to_json(self, *, timeline: bool = False) -> dict[str, Any]:
        """A JSON-able dict; :meth:`from_json` reads it back to an equal report. Each plan's
        timeline of live bytes (a point per buffer event, most of the bytes) only with
        ``timeline``."""
        return {
            "format": "remat-report/1",
            "baseline": self.baseline,
            "capabilities": self.capabilities.to_json(),
            "figures": [dataclasses.asdict(f) for f in self.figures],
            "plans": [{**p.to_json(timeline=timeline), "per_layer": self.per_layer(p.name)}
                      for p in self.plans],
            "accelerator": self.accelerator,
            "refused": [dataclasses.asdict(r) for r in self.refused],
            "compiler": None if self.compiler is None else self.compiler.to_json(),
            "sizes": self.sizes,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], *, source: str | None = None) -> Report:
        """The report :meth:`to_json` wrote; anything else (another format version, a field of
        the wrong type, a negative or NaN figure, a derived field that its figures contradict)
        is a :class:`ReportFormatError` naming the field (``source``: the file, for it)."""
        check_report_json(data, source)

        def caps() -> Capabilities:
            c = _known(Capabilities, data["capabilities"])
            c["memory_kinds"] = tuple(c["memory_kinds"])
            return Capabilities(**c)

        plans = tuple(wrap(f"plans[{i}] ({short(p.get('name'))})", source,
                           functools.partial(PlanReport.from_json, p))
                      for i, p in enumerate(data["plans"]))
        report = cls(
            plans=plans,
            baseline=data["baseline"],
            capabilities=wrap("capabilities", source, caps),
            figures=wrap("figures", source, lambda: tuple(
                FigureNote(**_known(FigureNote, f)) for f in data["figures"])),
            accelerator=data.get("accelerator"),
            refused=wrap("refused", source, lambda: tuple(
                RefusedPlan(**_known(RefusedPlan, r)) for r in data.get("refused", ()))),
            compiler=wrap("compiler", source, lambda: None if data.get("compiler") is None
                          else Compiler.from_json(data["compiler"])),
            sizes=data.get("sizes"),
        )
        check_derived(data, wrap("the report", source, report.to_json), source)
        return report

    def save(self, path: str | Path, *, timeline: bool = False) -> Path:
        """Writes :meth:`to_json` to ``path`` (compact JSON: ``python -m json.tool`` indents it);
        with ``timeline``, each plan's timeline too (``remat report --timeline-json``)."""
        p = Path(path)
        p.write_text(json.dumps(self.to_json(timeline=timeline), separators=(",", ":")) + "\n")
        return p

    @classmethod
    def load(cls, path: str | Path) -> Report:
        """Reads a report written by :meth:`save` (:meth:`from_json` checks it)."""
        p = Path(path)
        try:
            text = p.read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise ReportFormatError(f"Report.load: cannot read {str(p)!r}: "
                                    f"{e.strerror if isinstance(e, OSError) else e}. Fix: give "
                                    "the path of a report written by --json.") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ReportFormatError(f"Report.load: {p}:{e.lineno}: not JSON ({e.msg}). Fix: give "
                                    "a report written by --json, whole.") from None
        return cls.from_json(data, source=str(p))


def _known(cls: type, data: Mapping[str, Any]) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in data.items() if k in names}
