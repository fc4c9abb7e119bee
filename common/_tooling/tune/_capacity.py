"""Capacity: the largest size of a model (batch, sequence, width) whose step fits a memory budget
under the tuned plan, found by compiling a few sizes (:func:`capacity`, :class:`CapacityRow`)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from ..._errors import RematError, check_count, short
from ..._plan import Plan
from ..accelerators._accelerators import Accelerator
from ..measurement._target import CompilerRefused, Where
from ..accelerators._compilers import xla_remat_fits
from ..accelerators._units import fmt_bytes, parse_bytes
from ._model import Builder
from ._result import TuneEvent
from ._runner import Runner as _Runner
from ._runner import config_of as _config_of
from ._search import default_budget, local_device


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
      state: the plan's ``state:`` where it keeps training state on host between steps (its
        peaks leave that out), else ``None``.
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
    state: dict[str, str] | None = None

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
      plans: ``{name: plan}`` (``None``: the un-annotated model); a :class:`Plan` keeps its
        ``state:`` (training state on host between steps, left out of the peaks).
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
    # a plan's state: (training state on host between steps) kept: its peaks leave it out
    states = {name: None if value is None else Plan.coerce(value).state
              for name, value in plans.items()}
    where = Where.of(accelerator, mesh, compiler_options, fn=fn)
    if budget is None:
        if where.acc.is_local and local_device(where.acc).memory_bytes is None:
            raise RematError(f"{fn}: give a budget ('12GiB'), or an accelerator whose device "
                             "memory is the default (accelerator='h100x8').")
        cap = default_budget(where.acc, reserve)[0]
    else:
        cap = parse_bytes(budget)
    run = _Runner(builder_for(start), "flops", None, max_compiles, None, progress, where)
    rows = []
    for name, config in configs.items():
        plan = None if config is None else Plan.from_mapping(config, state=states[name])
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
                except RematError as e:  # a model size the model or the plan cannot take
                    why = (str(e).strip().splitlines() or [type(e).__name__])[0]
                    peaks[v] = NoFit(None, f"it cannot be built at this size: {why}")
                else:
                    peak = run.peak(r)[0]
                    peaks[v] = (NoFit(peak, f"XLA rematerialized on its own: {r.xla_remat}")
                                if r.xla_remat and not xla_remat_fits(r.xla_remat, peak, cap)
                                else peak)
            return peaks[v]

        lo, hi, first = largest_fit(peak_at, cap, start, step, limit, lambda: run.exhausted,
                                    where.acc.memory_bytes)
        nxt = hi if hi is not None and hi - lo <= step else None
        over = peaks.get(nxt) if nxt is not None else None
        why = (None if nxt is None else over.why if isinstance(over, NoFit)
               else f"over the budget of {fmt_bytes(cap)}")
        st = states[name]
        rows.append(CapacityRow(
            str(name), config, lo, _peak_of(peaks.get(lo)), nxt,
            None if nxt is None else _peak_of(over), run.compiles - before, first, why,
            None if st is None or st.is_default else st.to_config()))
    return tuple(rows)


def _peak_of(p: int | NoFit | None) -> int | None:
    return p.peak if isinstance(p, NoFit) else p
