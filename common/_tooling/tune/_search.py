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

import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax

from ..._compiler import compiler_identity
from ..._annotation import parse_annotation
from ..._errors import RematError, check_bool, check_count, short, sorted_list
from ..._plan import Plan
from ..._state import StatePlacement
from ..accelerators._accelerators import Accelerator
from ..accelerators._compilers import xla_remat_original
from ..measurement._target import CompilerRefused, Where
from ..accelerators._profiles import DeviceProfile, data_sheet_note, load_profile, target_profile
from ..accelerators._units import fmt_bytes, fmt_seconds, parse_bytes
from ._model import DEEP_SCAN, Builder, LayerRules, assignment_plan, custom_choice, default_choices
from ._model import Model as _Model
from ._model import dominated as _dominated
from ._model import find_stack as _find_stack
from ._model import has_boundary as _has_boundary
from ._model import model_paths as _model_paths
from ._model import name_choice, nested_choice, nesting_pays, tag_rules
from ._model import rules_on as _rules_on
from ._model import run_orders as _run_orders
from ._result import Objective, TunePoint, TuneResult, TuneEvent
from ._runner import flops_countable
from ._runner import Runner as _Runner
from ._runner import Unrankable as _Unrankable
from ._runner import NoUsablePlan as _NoUsablePlan
from ._runner import MSG_UNRANKABLE as _MSG_UNRANKABLE
from ._runner import Job as _Job
from ._runner import config_of as _config_of


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
    from ..breakdown._figures import group_label

    parts = [group_label(kind, m, b) for kind, m, b in p.dominant]
    return f" At that peak the most is held by: {'; '.join(parts)}."


#: What the default budget on an accelerator leaves free of its device memory: on GPUs JAX's
#: allocator takes 75 % of the memory by default (XLA_PYTHON_CLIENT_MEM_FRACTION=.75), so 25 %; on
#: TPUs 5 % for the runtime (an assumption).
RESERVE = {"cuda": 0.25, "tpu": 0.05}


def local_device(acc: Accelerator) -> Accelerator:
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
        acc = local_device(acc)
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
              "XLA_PYTHON_CLIENT_MEM_FRACTION=.75)"
              if reserve is None and acc.platform == "cuda" and not local
              else " (runtime and fragmentation)" if reserve is None else ""))
    return kept, why


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
    state: StatePlacement | Mapping[str, str] | None = None,
    tags: Any = None,
    accept_xla_remat: bool = False,
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
      tags: a plan (file, mapping, :class:`Plan`) whose ``{tag: NAME}`` rules every plan compiled
        carries (its other rules are not used): names for a model that tags nothing itself (a
        third-party model opted in by plan files), which the choices then keep (``names``,
        ``save:NAME``); the plan chosen carries them.
      accept_xla_remat: on an accelerator, a plan its compiler's own rematerialization pass
        brought under the device memory counts as fitting where its compiled peak is within the
        budget (the program that runs is XLA's; its FLOPs include what the pass recomputes).
        Default: such a plan fits only where, as written, its peak plus every value the pass
        recomputes is within the budget. MaxText's ``minimal`` at a size that fills a chip is
        such a plan, and may be the fastest that runs.
      objective: ``"flops"`` (default without a profile) or ``"time"`` (FLOPs at the profile's
        peak plus host transfers at its link bandwidth; the default with a profile). With
        ``"flops"`` an offloaded residual's trip to host and back counts too, as the FLOPs the
        device does meanwhile at the profile's host link (without a profile, the ``h100``
        profile's 64 GB/s: :func:`host_link`); the notes name the figure.
      profile: a device profile name (``h100``, ``v5e``, any accelerator chip), YAML file or
        :class:`DeviceProfile`.
      max_compiles: stop searching after this many compiles (calibration included).
      time_limit: stop searching after this many seconds.
      progress: called with a :class:`TuneEvent` before each compile.
      cache: a dict shared between calls on the same target and size: the figures of a plan
        compiled before are taken from it instead of compiling again (they are deterministic).
        ``compiles`` counts only real compiles; ``cached`` the plans taken from the cache.
      measure: after the search, time the ``measure`` cheapest compiled plans that fit, and every
        extra plan that fits (their
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
      state: where every plan keeps the training state between steps (a plan's ``state:``,
        :class:`StatePlacement`; default all on device): the builder gets plans that say so, the
        peaks leave the host part out, and its trip to the device and back each step is priced
        as host traffic; the chosen plan carries it. :func:`tune_states` chooses it.

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
        if acc.is_local and local_device(acc).memory_bytes is None:
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
    run.state = StatePlacement.coerce(state, "remat_common.tune: state")
    run.tags = {} if tags is None else tag_rules(tags, "remat_common.tune: tags")
    run.accept_xla_remat = bool(accept_xla_remat)
    paths, custom_paths, tags_by_path, stacks = _model_paths(target, run.tags)
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
    if obj == "time" and prof is not None and (sheet := data_sheet_note(prof)) is not None:
        notes.append(sheet)
    if not acc.is_local:
        notes.append(f"every plan compiled for {acc.describe()}"
                     + (f", mesh {','.join(f'{k}={v}' for k, v in (where.mesh or {}).items())}"
                        if where.mesh else "") + ": peaks per device from its compiler.")
    if not run.state.is_default:
        notes.append(f"every plan keeps the training state where its state: says between steps "
                     f"({run.state.describe()}): the peaks leave it out, and its trip to the "
                     f"device and back each step is priced at {run.link.describe()}"
                     + ("; this backend keeps it on device (it drops host placements): the peaks "
                        "(marked *) take its bytes out, an optimistic estimate (a TPU compiler "
                        "may hold the state it brings in, and its update, in device temporaries:"
                        " --accelerator gives its own figures)" if acc.is_local
                        and not caps.host_offload_placed else "") + ".")
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

        def take_last(k: str) -> None:
            e = deltas.get(f"{k}x1-last")
            if isinstance(e, TunePoint):
                points.append(e)
                # peak = max(g_ref + rest, g1_k + rest + w_k): g1_k is at most this
                g1[k] = min(g[k], e.peak - rest - w[k])
            elif isinstance(e, RematError):
                notes.append(f"one-layer delta of {k!r} (last) left out: {e}")

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
            take_last(k)
        for k in bounded:
            take_last(k)
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
        if p.xla_remat and not p.fits(limit):
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
        # (distinct as plans: a choice and a preset can be the same rules written in another order)
        def same(p: TunePoint, q: TunePoint) -> bool:
            return run.plan(p.plan) == run.plan(q.plan)

        top: list[TunePoint] = []
        for p in sorted(fitting, key=lambda p: (p.cost, p.peak)):
            if not any(same(p, q) for q in top):
                top.append(p)
        # the extra plans that fit are timed too: they were given to be compared against, so
        # the plan chosen is never slower than one of them as measured side by side
        top = top[:measure]
        for p in fitting:
            if p.source == "extra" and not any(same(p, q) for q in top):
                top.append(p)
        step_times, untimed = run.time_steps(top, measure_steps)
        for name, error in untimed.items():
            notes.append(f"plan {name!r} was not timed: the device ran out of memory running it "
                         f"after the plans timed before it ({error}); it is left out of the "
                         "choice. Fix: time it alone (remat report --plans, or fewer --plans "
                         "and a smaller --measure).")
        if not step_times:
            raise RematError(f"remat_common.tune: no plan could be timed: {notes[-1]}")
        top = [p for p in top if p.name in step_times]
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
    changed = [p.name for p in points if p.xla_remat and not p.fits(limit)]
    spare = [p.name for p in points if p.xla_remat and p.fits(limit) and not accept_xla_remat]
    accepted = [p.name for p in points if p.xla_remat and p.fits(limit) and accept_xla_remat]
    if accepted:
        notes.append(f"the {acc.name} compiler rematerialized values of {len(accepted)} plan(s) "
                     f"({', '.join(accepted[:4])}{' ...' if len(accepted) > 4 else ''}) that "
                     "count as fitting at their compiled peak (accept_xla_remat): the program "
                     "that runs is XLA's, its FLOPs include what the pass recomputes.")
    if spare:
        notes.append(f"the {acc.name} compiler rematerialized values of {len(spare)} plan(s) "
                     f"({', '.join(spare[:4])}{' ...' if len(spare) > 4 else ''}) although, as "
                     "written, their peak plus every value it recomputes is within the budget: "
                     "they count as fitting (XLA:TPU's pass runs on steps that keep gigabytes in "
                     "host memory).")
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
            raise _NoUsablePlan(f"remat_common.tune: none of the {run.compiles} plan(s) "
                                "compiled could be used (each was left out; the notes say why): "
                                + " ".join(notes), run.compiles)
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
        predicted = (f", predicted step {fmt_seconds(chosen.cost)} at the {prof.name} profile"
                     if obj == "time" and prof is not None else "")
        message = (f"{chosen.name} fits {fmt_bytes(limit)}: compiled peak "
                   f"{fmt_bytes(chosen.peak)}{' (estimate)' if chosen.estimated else ''}{ratio}"
                   f"{predicted}{timed}; {run.compiles} compiles, {wall:.1f} s.")
        plan = run.plan(chosen.plan)
    if progress is not None:
        progress(TuneEvent("done", None, run.compiles, run.compiles))
    return TuneResult(limit, obj, prof, stack, n, tuple((k, chosen_choices[k]) for k in names),
                      tuple(points), None if chosen is None else chosen.name, plan, run.compiles,
                      wall, message, tuple(notes), run.cached, tuple(step_times.items()),
                      tuple(whole.items()), tuple(warnings), run.link,
                      compiler_identity(None if acc.is_local else acc.platform), run.state)
