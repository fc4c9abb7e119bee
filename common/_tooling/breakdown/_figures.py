"""The breakdown's figures: the rows live at the peak (:class:`PeakRow`), the timeline of live bytes
(:class:`Timeline`), the whole (:class:`MemoryBreakdown`), and whether it fits a budget
(:class:`FitSummary`, :func:`will_it_fit`). Plain frozen data with JSON in and out; the
parsing of XLA's dumps that makes them is in ``_breakdown.py``."""

from __future__ import annotations

import dataclasses
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from ..._paths import path_key
from ..accelerators._units import fmt_bytes


#: The kinds a byte at the peak can be, in the order tables list them.
KINDS = (
    "parameter", "optimizer state", "gradient", "input batch", "saved residual",
    "offloaded residual", "temporary (forward)", "temporary (backward)", "temporary (optimizer)",
    "output", "unwritten output", "allocator slack", "other argument", "compiler accounting",
)
#: The row that makes a breakdown's peak the compiler's own (:meth:`MemoryBreakdown.reconciled`).
RECONCILE = "compiler accounting"
#: Kinds that are activations of the model (what a plan changes).
ACTIVATION_KINDS = ("saved residual", "offloaded residual", "temporary (forward)",
                    "temporary (backward)")
#: Path segments of a module at layer depth (``blocks.0`` of ``blocks.0.attn``): what the
#: timeline by module and the peak table group activations by.
LAYER_DEPTH = 2
#: The timeline's series of activations no module made (the loss, the optimizer, XLA's own).
NO_MODULE = "(no module)"
#: The timeline's series of the modules beyond the :data:`MAX_SERIES` largest.
OTHER_MODULES = "(other modules)"
#: The most modules a timeline keeps as series of their own.
MAX_SERIES = 24

_NOTE_RECONCILE = ("what the compiler's memory_analysis() counts (its peak: what XLA accepts or "
                   "refuses a program by) beyond the buffers its buffer assignment shows live at "
                   "the peak")
#: The kinds of bytes allocated but holding no live value at the peak, in the order a compiler
#: peak below the buffer assignment's is taken out of them (:meth:`MemoryBreakdown.reconciled`).
UNLIVE = ("allocator slack", "unwritten output")


@dataclasses.dataclass(frozen=True)
class PeakRow:
    """Bytes of one kind, from one module (and tagged name), live at a peak.

    Attributes:
      kind: one of :data:`KINDS`.
      module: the module path (``blocks.0.attn``), ``None`` where none made it.
      name: the tagged name (``attn_out``) or the parameter's name (``kernel``), else ``None``.
      bytes: bytes live at the peak.
      note: why ``module`` is ``None``, where it is.
    """

    kind: str
    module: str | None
    name: str | None
    bytes: int
    note: str | None = None

    def to_json(self) -> dict[str, Any]:
        out = {"kind": self.kind, "module": self.module, "name": self.name, "bytes": self.bytes}
        return out if self.note is None else {**out, "note": self.note}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> PeakRow:
        return cls(str(d["kind"]), d.get("module"), d.get("name"), int(d["bytes"]), d.get("note"))


@dataclasses.dataclass(frozen=True)
class Timeline:
    """Live bytes over the schedule of one memory space, stacked by kind, and the activations
    among them by module.

    Attributes:
      kinds: the kinds stacked, in order.
      bytes: ``bytes[k][t]``: bytes of ``kinds[k]`` live at schedule point ``t``.
      backward: ``(first, last)`` schedule points of the backward pass (``None``: none found).
      peak: the schedule point of the peak.
      modules: the modules, at layer depth (:data:`LAYER_DEPTH` path segments: ``blocks.0``;
        ``""`` the root's own code, :data:`NO_MODULE` what no module made, :data:`OTHER_MODULES`
        the smaller ones beyond :data:`MAX_SERIES`), largest first.
      module_bytes: ``module_bytes[m][t]``: bytes of the activation kinds
        (:data:`ACTIVATION_KINDS`) of ``modules[m]`` live at ``t``; at every ``t`` they sum to
        those kinds' bytes.
    """

    kinds: tuple[str, ...]
    bytes: tuple[tuple[int, ...], ...]
    backward: tuple[int, int] | None
    peak: int
    modules: tuple[str, ...] = ()
    module_bytes: tuple[tuple[int, ...], ...] = ()

    @property
    def total(self) -> np.ndarray:
        return np.sum(np.asarray(self.bytes, dtype=np.int64), axis=0) if self.kinds else np.zeros(0)

    @property
    def max_bytes(self) -> int:
        t = self.total
        return int(t.max()) if t.size else 0

    def activations(self) -> np.ndarray:
        """Bytes of the activation kinds live at each point (what :attr:`module_bytes` splits)."""
        rows = [b for k, b in zip(self.kinds, self.bytes) if k in ACTIVATION_KINDS]
        n = len(self.bytes[0]) if self.bytes else 0
        return np.sum(np.asarray(rows, dtype=np.int64), axis=0) if rows else np.zeros(n, np.int64)

    def to_json(self) -> dict[str, Any]:
        return {"kinds": list(self.kinds), "bytes": [list(b) for b in self.bytes],
                "backward": None if self.backward is None else list(self.backward),
                "peak": self.peak, "modules": list(self.modules),
                "module_bytes": [list(b) for b in self.module_bytes]}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Timeline:
        bw = d.get("backward")
        return cls(tuple(d["kinds"]), tuple(tuple(int(x) for x in b) for b in d["bytes"]),
                   None if bw is None else (int(bw[0]), int(bw[1])), int(d["peak"]),
                   tuple(str(m) for m in d.get("modules", ())),
                   tuple(tuple(int(x) for x in b) for b in d.get("module_bytes", ())))


#: ``(first layer's path, label, layers, the layers' paths)``: see :attr:`MemoryBreakdown.groups`.
Group = tuple[str, str, int, tuple[str, ...]]


def _group(g: Sequence[Any]) -> Group:
    path, label, n = str(g[0]), str(g[1]), int(g[2])
    return path, label, n, tuple(str(x) for x in g[3]) if len(g) > 3 else ()


@dataclasses.dataclass(frozen=True)
class MemoryBreakdown:
    """A compiled step's memory at its peak, by kind and module, and over its schedule.

    Attributes:
      rows: device memory at the device peak; ``sum(r.bytes)`` is the compiled peak
        (``MemoryFigures.device_total``).
      timeline: live device bytes over the schedule (``None`` where read from a JSON written
        without it: ``to_json(timeline=True)``, ``remat report --timeline-json``). Not compared:
        two breakdowns of the same rows are equal.
      host_rows, host_timeline: the same for host memory (offloaded residuals), where the
        compiler placed any (empty / ``None`` on CPU, which drops host placements).
      compiler: the platform whose compiler made the program (``cpu``, ``cuda``, ``tpu``).
      saved: every residual the compiled forward pass keeps for the backward pass (device and
        host), by module and name, each counted once whether or not it is live at the peak:
        what the plan saves, per module.
      groups: ``(path, label, layers, layer paths)`` of the layer groups whose values all carry
        the first layer's path: a stack's layers run as one scan body, or list layers that share
        one traced boundary (``("blocks.0", "blocks.0-3", 4, ("blocks.0", ..., "blocks.3"))``).
    """

    rows: tuple[PeakRow, ...]
    timeline: Timeline | None = dataclasses.field(compare=False)
    host_rows: tuple[PeakRow, ...] = ()
    host_timeline: Timeline | None = dataclasses.field(default=None, compare=False)
    compiler: str = "cpu"
    saved: tuple[PeakRow, ...] = ()
    groups: tuple[Group, ...] = ()
    taken: tuple[tuple[str, int], ...] = ()
    over: int = 0

    @property
    def total(self) -> int:
        """The rows' sum: the compiled peak, except where :attr:`over` is not 0."""
        return sum(r.bytes for r in self.rows)

    @property
    def peak(self) -> int:
        """The compiled peak (the compiler's own accounting, where reconciled): :attr:`total`
        less :attr:`over`."""
        return self.total - self.over

    def accounting(self) -> str | None:
        """The line that explains how the compiler's peak and the buffer assignment's differ,
        where the compiler counts less (``None``: they agree, or the compiler counts more, which
        is a row of its own): what its peak leaves out (:attr:`taken`), and live bytes beyond it
        (:attr:`over`). A compiler's accounting is a line, never a negative row: no part is
        shown larger than the whole."""
        less = sum(b for _, b in self.taken) + self.over
        if not less:
            return None
        out = (f"the compiler's memory_analysis() peak, {fmt_bytes(self.peak)} (what XLA accepts "
               f"or refuses the program by), is {fmt_bytes(less)} below what XLA's buffer "
               f"assignment holds at its peak ({fmt_bytes(self.peak + less)})")
        if self.taken:
            left = " and ".join(f"{fmt_bytes(b)} of {k}" for k, b in self.taken)
            out += (f": its heap leaves out {left}, bytes allocated that hold no live value at "
                    "the peak, so the rows leave them out too")
        if self.over:
            out += (f"{';' if self.taken else ':'} the values live at the buffer assignment's "
                    f"peak are {fmt_bytes(self.over)} more than the compiler's peak (its heap "
                    "holds them at other times, or in less memory), so the rows sum to "
                    f"{fmt_bytes(self.total)}, the whole they are parts of")
        return out + "."

    def by_kind(self, host: bool = False) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for r in (self.host_rows if host else self.rows):
            out[r.kind] += r.bytes
        return {k: out[k] for k in KINDS if out.get(k)}

    def by_module(self, kinds: Iterable[str] = ACTIVATION_KINDS, depth: int | None = None
                  ) -> dict[str | None, int]:
        """Bytes per module path (cut to ``depth`` segments) of the rows of ``kinds``, largest
        first."""
        wanted = set(kinds)
        out: dict[str | None, int] = defaultdict(int)
        for r in self.rows:
            if r.kind in wanted:
                m = r.module if r.module is None or depth is None else ".".join(
                    r.module.split(".")[:depth])
                out[m] += r.bytes
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))

    def largest(self, n: int = 3) -> list[tuple[str, str | None, int]]:
        """The ``n`` largest (kind, module, bytes) groups at the peak: activations per module at
        layer depth (a layer group by its label, ``blocks.0-3``), every other kind as a whole
        (module ``None``)."""
        out: dict[tuple[str, str | None], int] = defaultdict(int)
        for r in self.rows:
            module = _cut(r.module, LAYER_DEPTH) if r.kind in ACTIVATION_KINDS else None
            out[(r.kind, module)] += r.bytes
        return [(k, self.layer_of(m)[0] if m else m, b)
                for (k, m), b in sorted(out.items(), key=lambda kv: -kv[1])[:n]]

    def layer_of(self, module: str | None) -> tuple[str | None, int]:
        """``(label, layers)`` of a module path as the breakdown holds it: the first layer of a
        scanned or shared group stands for ``layers`` layers (``blocks.0-3``), any other module
        for one."""
        if module is None:
            return None, 1
        for path, label, n, _ in self.groups:
            if module == path or module.startswith(path + "."):
                return label + module[len(path):], n
        return module, 1

    def layers_of(self, module: str) -> tuple[str, ...]:
        """The module paths ``module`` stands for: in a layer group, the same module of every
        layer of the group (``blocks.0.mlp`` of ``blocks.0-3``: ``blocks.0.mlp`` ...
        ``blocks.3.mlp``); any other module, itself."""
        for path, _, _, layers in self.groups:
            if layers and (module == path or module.startswith(path + ".")):
                return tuple(q + module[len(path):] for q in layers)
        return (module,)

    def _by_path(self, depth: int | None) -> dict[str | None, list[int]]:
        """``[kept, at the peak]`` activation bytes per module path cut to ``depth``."""
        out: dict[str | None, list[int]] = {}
        for rows, slot in ((self.saved, 0), (self.rows, 1)):
            for r in rows:
                if r.kind in ACTIVATION_KINDS:
                    out.setdefault(_cut(r.module, depth), [0, 0])[slot] += r.bytes
        return out

    def per_layer(self, depth: int | None = None) -> dict[str | None, tuple[int, int, int]]:
        """Per module (cut to ``depth`` segments; scanned groups as ``blocks.0-3``):
        ``(residuals kept, activations at the peak, layers)``; bytes are the whole module's
        (divide by ``layers`` for one layer of a scanned group)."""
        out: dict[str | None, list[int]] = {}
        for path, (kept, peak) in self._by_path(depth).items():
            label, n = self.layer_of(path)
            cell = out.setdefault(label, [0, 0, n])
            cell[0] += kept
            cell[1] += peak
        return {k: (v[0], v[1], v[2]) for k, v in out.items()}

    def kept_by_layer(self, depth: int | None = LAYER_DEPTH) -> dict[str | None, float]:
        """Residual bytes kept per module path (cut to ``depth``), a layer group's spread evenly
        over its layers: comparable between plans and layouts that group layers differently."""
        out: dict[str | None, float] = defaultdict(float)
        for path, (kept, _) in self._by_path(depth).items():
            reals = (None,) if path is None else self.layers_of(path)
            for q in reals:
                out[q] += kept / len(reals)
        return dict(out)

    def per_layer_rows(self, reference: MemoryBreakdown | None = None,
                       depth: int | None = LAYER_DEPTH) -> list[dict[str, Any]]:
        """Per module at ``depth`` (a layer group as one row, ``blocks.0-3``): the residuals kept
        and the activations at the peak, whole and per layer, and what the same layers keep
        under ``reference`` (a save-all plan's breakdown; ``None`` where there is none), as
        JSON-able rows ``{"module", "layers", "layer_paths", "saved", "peak", "save_all",
        "saved_per_layer", "peak_per_layer", "save_all_per_layer"}``."""
        ref = reference.kept_by_layer(depth) if reference is not None else None
        rows: dict[str | None, dict[str, Any]] = {}
        for path, (kept, peak) in self._by_path(depth).items():
            label, n = self.layer_of(path)
            reals = (None,) if path is None else self.layers_of(path)
            row = rows.setdefault(label, {"module": label, "layers": n, "layer_paths": [],
                                          "saved": 0, "peak": 0, "save_all": None})
            row["saved"] += kept
            row["peak"] += peak
            row["layer_paths"] += [q for q in reals if q is not None]
            if ref is not None:
                row["save_all"] = (row["save_all"] or 0) + round(sum(ref.get(q, 0) for q in reals))
        out = []
        for label in sorted(rows, key=lambda m: (m is None, path_key(m or ""))):
            row = rows[label]
            n = row["layers"]
            row["saved_per_layer"], row["peak_per_layer"] = row["saved"] // n, row["peak"] // n
            row["save_all_per_layer"] = None if row["save_all"] is None else row["save_all"] // n
            out.append(row)
        return out

    def _unreconciled(self) -> list[PeakRow]:
        """The buffer assignment's own rows: an earlier :meth:`reconciled` undone."""
        rows = [r for r in self.rows if r.kind != RECONCILE]
        for kind, nbytes in self.taken:
            i = next((i for i, r in enumerate(rows) if r.kind == kind), None)
            if i is None:
                rows.append(PeakRow(kind, None, None, nbytes))
            else:
                rows[i] = dataclasses.replace(rows[i], bytes=rows[i].bytes + nbytes)
        return rows

    def reconciled(self, compiled_peak: int | None) -> MemoryBreakdown:
        """This breakdown with its peak (:attr:`peak`) equal to ``compiled_peak``, the compiler's
        own accounting (``MemoryFigures.device_total``, from ``memory_analysis()``), so table,
        breakdown and JSON give one peak. ``None``: unchanged.

        Where the compiler counts more than the buffer assignment's rows, the difference is a
        row of its own (:data:`RECONCILE`). Where it counts less (XLA:TPU's heap peak, which
        packs what the buffer assignment holds in whole allocations), the difference is taken
        out of the bytes that hold no live value at the peak (:data:`UNLIVE`, recorded in
        :attr:`taken`), and what live bytes still exceed it is :attr:`over`; both are explained
        by :meth:`accounting`. It was a negative row, and a table whose allocator slack was 3.4
        times its compiled peak."""
        if compiled_peak is None:
            return self
        rows = self._unreconciled()
        diff = compiled_peak - sum(r.bytes for r in rows)
        if diff >= 0:
            extra = (PeakRow(RECONCILE, None, None, diff, _NOTE_RECONCILE),) if diff else ()
            return dataclasses.replace(self, rows=(*rows, *extra), taken=(), over=0)
        excess, taken = -diff, []
        for kind in UNLIVE:
            got = 0
            for i, r in enumerate(rows):
                take = min(r.bytes, excess) if r.kind == kind else 0
                if take:
                    rows[i] = dataclasses.replace(r, bytes=r.bytes - take)
                    excess -= take
                    got += take
            if got:
                taken.append((kind, got))
        return dataclasses.replace(self, rows=tuple(rows), taken=tuple(taken), over=excess)

    def will_it_fit(self, budget: int, on_host: int = 0) -> FitSummary:
        """This peak against a device budget (bytes): see :func:`will_it_fit`."""
        return will_it_fit(self, budget, on_host)

    def to_json(self, *, timeline: bool = False) -> dict[str, Any]:
        """The rows and groups; with ``timeline``, the timelines too (most of the bytes)."""
        out: dict[str, Any] = {"compiler": self.compiler, "rows": [r.to_json() for r in self.rows],
                               "host_rows": [r.to_json() for r in self.host_rows],
                               "saved": [r.to_json() for r in self.saved],
                               "groups": [[p, label, n, list(layers)]
                                          for p, label, n, layers in self.groups]}
        if self.taken or self.over:
            out.update(taken=[[k, b] for k, b in self.taken], over=self.over,
                       accounting=self.accounting())
        if timeline:
            out["timeline"] = None if self.timeline is None else self.timeline.to_json()
            out["host_timeline"] = (None if self.host_timeline is None
                                    else self.host_timeline.to_json())
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> MemoryBreakdown:
        t, ht = d.get("timeline"), d.get("host_timeline")
        rows = tuple(PeakRow.from_json(r) for r in d["rows"])
        b = cls(rows, None if t is None else Timeline.from_json(t),
                tuple(PeakRow.from_json(r) for r in d.get("host_rows", ())),
                None if ht is None else Timeline.from_json(ht), str(d.get("compiler", "cpu")),
                tuple(PeakRow.from_json(r) for r in d.get("saved", ())),
                tuple(_group(g) for g in d.get("groups", ())),
                tuple((str(k), int(n)) for k, n in d.get("taken", ())), int(d.get("over", 0)))
        if any(r.kind == RECONCILE and r.bytes < 0 for r in rows):  # written before: a line now
            return dataclasses.replace(b, rows=tuple(r for r in rows if r.kind != RECONCILE)
                                       ).reconciled(sum(r.bytes for r in rows))
        return b



def _cut(module: str | None, depth: int | None) -> str | None:
    return module if module is None or depth is None else ".".join(module.split(".")[:depth])



# -- will it fit -------------------------------------------------------------------------------

#: The parts of a peak that a fit summary adds up, and the kinds each holds.
FIT_PARTS = (
    ("parameters", ("parameter",)),
    ("optimizer state", ("optimizer state",)),
    ("gradients", ("gradient",)),
    ("residuals", ("saved residual", "offloaded residual")),
    ("temporaries", ("temporary (forward)", "temporary (backward)", "temporary (optimizer)")),
    ("inputs, outputs, slack", ("input batch", "output", "unwritten output", "allocator slack",
                                "other argument", RECONCILE)),
)


@dataclasses.dataclass(frozen=True)
class FitSummary:
    """A compiled step's peak against a device budget, in the parts a user plans memory by.

    Attributes:
      budget: the budget (bytes).
      peak: the compiled peak (bytes), the sum of ``parts`` (but where the breakdown's live
        values exceed it: :attr:`MemoryBreakdown.over`, which ``accounting`` says).
      parts: ``(part, bytes)`` per :data:`FIT_PARTS` entry.
      largest: the three largest ``(kind, module, bytes)`` groups at the peak.
      advice: the change that frees the most, read from the breakdown.
      accounting: how the compiler's peak and the buffer assignment's differ, where the
        compiler counts less (:meth:`MemoryBreakdown.accounting`).
    """

    budget: int
    peak: int
    parts: tuple[tuple[str, int], ...]
    largest: tuple[tuple[str, str | None, int], ...]
    advice: str
    accounting: str | None = None

    @property
    def fits(self) -> bool:
        return self.peak <= self.budget

    def lines(self) -> list[str]:
        verdict = (f"fits {fmt_bytes(self.budget)} with {fmt_bytes(self.budget - self.peak)} to "
                   "spare" if self.fits else
                   f"does not fit {fmt_bytes(self.budget)}: {fmt_bytes(self.peak - self.budget)} over")
        whole = sum(b for _, b in self.parts)
        of = "" if whole == self.peak else f"the rows' {fmt_bytes(whole)}: "  # see accounting
        out = [f"compiled peak {fmt_bytes(self.peak)} {verdict}",
               f"  {of}" + " + ".join(f"{name} {fmt_bytes(b)}" for name, b in self.parts if b)]
        if self.accounting:  # the compiler's own accounting: a line of its own, never a part
            out.append(f"  {self.accounting}")
        out.append("  largest: " + "; ".join(group_label(kind, m, b) for kind, m, b in self.largest))
        out.append("  " + self.advice)
        return out


def _less(parts: tuple[tuple[str, int], ...], nbytes: int) -> tuple[tuple[str, int], ...]:
    """``parts`` with ``nbytes`` taken from the optimizer state, then the parameters."""
    out = dict(parts)
    for name in ("optimizer state", "parameters", "inputs, outputs, slack"):
        take = min(out.get(name, 0), nbytes)
        out[name] -= take
        nbytes -= take
    return tuple(out.items())


def group_label(kind: str, module: str | None, nbytes: int) -> str:
    """``saved residual blocks.0 22.05 MiB``, ``parameter 4.32 MiB`` (a kind as a whole)."""
    if kind not in ACTIVATION_KINDS:
        return f"{kind} {fmt_bytes(nbytes)}"
    where = "<root>" if module == "" else module or "(no module)"
    return f"{kind} {where} {fmt_bytes(nbytes)}"


_LAYER = re.compile(r"^(.*)\.(\d+)(-\d+)?$")


def _advise_saved(b: MemoryBreakdown, top: str, nbytes: int, saved: Mapping[str | None, int]
                  ) -> str:
    """The plan change that frees the most saved activations: ``top``'s module, or, where it is
    one of a stack's or a list's layers (``blocks.2``, ``blocks.0-3``), all of those layers."""
    one = (f"the largest saved activations are {top!r}'s ({fmt_bytes(nbytes)} at the peak): "
           "annotating it 'recompute' (or 'offload') frees up to that much, for one more forward "
           "pass of it.")
    m = _LAYER.match(top)
    if m is None:
        return one
    stack = m.group(1)
    group = m.group(3) is not None  # a layer group (blocks.0-3): its rule is the stack's
    total = 0
    for path, v in saved.items():
        label = b.layer_of(path)[0] if path else None
        found = _LAYER.match(label) if label else None
        if found is not None and found.group(1) == stack:
            total += v
    if total <= nbytes and not group:
        return one
    return (f"the largest saved activations are {top!r}'s ({fmt_bytes(nbytes)} at the peak); the "
            f"layers {stack}.* keep {fmt_bytes(total)} together: annotating them 'recompute' (a "
            f'plan rule "{stack}.*": recompute, or offload) frees up to that much, for one more '
            "forward pass of each.")


def will_it_fit(b: MemoryBreakdown, budget: int, on_host: int = 0) -> FitSummary:
    """The peak of ``b`` against ``budget``: its parts, the three largest contributors, and the
    plan change that frees the most (read from the breakdown, not guessed). ``on_host``: bytes of
    training state the breakdown counts as device arguments that the plan keeps in host memory
    (a compiler that drops host placements, XLA:CPU): left out of the peak and of the parts."""
    kinds = b.by_kind()
    parts = tuple((name, sum(kinds.get(k, 0) for k in ks)) for name, ks in FIT_PARTS)
    if on_host:
        parts = _less(parts, on_host)
    part = dict(parts)
    peak = b.peak - on_host
    state = part["parameters"] + part["optimizer state"] + part["gradients"]
    saved = b.by_module(("saved residual",), depth=LAYER_DEPTH)
    bwd = b.by_module(("temporary (backward)", "temporary (forward)"), depth=LAYER_DEPTH)
    top_saved = next(((b.layer_of(m)[0], v) for m, v in saved.items() if m), None)
    top_tmp = next(((b.layer_of(m)[0], v) for m, v in bwd.items() if m), None)
    outputs = part["inputs, outputs, slack"]
    donate = (f" The step's outputs (new parameters and optimizer state) hold "
              f"{fmt_bytes(outputs)} beside the inputs: donating the step's arguments "
              "(jax.jit(step, donate_argnums=...)) lets them reuse the inputs' memory."
              if outputs >= peak / 4 else "")
    if state >= part["residuals"] + part["temporaries"]:
        advice = (f"parameters, optimizer state and gradients are {fmt_bytes(state)} "
                  f"({100 * state / max(peak, 1):.0f}% of the peak): no remat plan frees them; "
                  "keep them in host memory between steps (a plan's state: {optimizer: host, "
                  "params: host}), shard them over devices (FSDP: the examples' --mesh fsdp=N), "
                  "keep optimizer state in a lower precision, or use a smaller model.")
    elif top_saved and top_saved[1] >= (top_tmp[1] if top_tmp else 0):
        advice = _advise_saved(b, str(top_saved[0]), top_saved[1], saved)
    elif top_tmp:
        advice = (f"the peak is inside {top_tmp[0]!r}'s backward pass ({fmt_bytes(top_tmp[1])} of "
                  "temporaries, its recomputed activations among them): a boundary on its "
                  "submodules, or saving its cheapest tagged names, lowers it.")
    else:
        advice = ("no activation at the peak is attributed to a module: run the model through an "
                  "adapter (annotate it) to see which module to change.")
    largest = tuple((k, m, v) for k, m, v in b.largest(3) if v)
    return FitSummary(budget, peak, parts, largest, advice + donate, b.accounting())
