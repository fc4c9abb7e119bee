"""Choosing where the training state lives, beside the activation plan: :func:`tune_states` runs
the search (:func:`tune`) under each state placement it may choose, and takes the first (``auto``)
or the cheapest (``any``) under which a plan fits.

State kept on host (a plan's ``state: {optimizer: host, params: host}``) frees its bytes from the
device between steps, and costs its trip to the device and back each step over the host link
(priced in the objective, :class:`~._runner.Runner`). By default it is chosen only where nothing
fits with the state on device: a plan that fits without it never moves more bytes over the link.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any, Final

from ..._errors import PlanError, RematError, short, sorted_list
from ..._state import STATE_PLACES, StatePlacement
from ..accelerators._units import fmt_bytes, parse_bytes
from ..measurement._host_memory import ENV
from ._model import Builder
from ._result import TuneResult
from ._runner import NoUsablePlan, StateNotApplicable
from ._search import tune

#: The state placements the tuner may choose, by the names ``--state`` takes, in the order
#: ``auto`` tries them (the fewest bytes over the host link first).
STATE_CHOICES: Final[dict[str, StatePlacement]] = {
    "device": StatePlacement(),
    "optimizer": StatePlacement(optimizer="host"),
    "all": StatePlacement(optimizer="host", params="host"),
}
#: What ``state=`` may name besides one of :data:`STATE_CHOICES`: ``auto`` (each in order, the
#: first under which a plan fits), ``any`` (each, the cheapest plan that fits under any) and
#: ``eighths`` (the fewest eighths of the layers on host under which a plan fits: :func:`eighths`).
STATE_MODES: Final = ("auto", "any", "eighths")


def state_placement(name: str) -> StatePlacement:
    """The placement a ``state=`` name says: one of :data:`STATE_CHOICES`, or parts ``KIND=PART``
    joined by ``,``: ``optimizer=0.5`` (a fraction of the layers on host), ``params=blocks.*`` (a
    pattern), ``optimizer=host`` (a plan's ``state: {optimizer: {host: 0.5}}``, in one word).

    >>> state_placement("optimizer=0.5,params=head").to_config()
    {'optimizer': {'host': 0.5}, 'params': {'host': 'head'}}
    """
    if name in STATE_CHOICES:
        return STATE_CHOICES[name]
    parts: dict[str, Any] = {}
    for item in name.split(","):
        kind, sep, part = item.partition("=")
        if not sep or not kind or not part:
            raise PlanError(f"state {name!r}: {item!r} is not KIND=PART")
        try:
            parts[kind] = part if part in STATE_PLACES else {"host": float(part)}
        except ValueError:
            parts[kind] = {"host": part}
    return StatePlacement.coerce(parts, f"state {name!r}")


def state_choices(state: str | Any) -> tuple[str, tuple[str, ...]]:
    """``(mode, placements)`` for ``state``: a placement (:func:`state_placement`: a name of
    :data:`STATE_CHOICES`, or parts), ``auto`` or ``any`` (all of :data:`STATE_CHOICES` in
    order), or placements joined by ``+`` or in a list (``auto`` over them).

    >>> state_choices("auto")
    ('auto', ('device', 'optimizer', 'all'))
    >>> state_choices("device+optimizer=0.5")
    ('auto', ('device', 'optimizer=0.5'))
    """
    if isinstance(state, str) and state in STATE_MODES:
        return state, tuple(STATE_CHOICES)
    names = state.split("+") if isinstance(state, str) else list(state) if isinstance(
        state, list | tuple) else None
    why = ""
    try:
        for n in names or ():
            state_placement(n)
    except (PlanError, TypeError) as e:
        why = " (" + str(e).splitlines()[0] + ")"
    if names is None or not names or why:
        raise RematError(
            "remat_common.tune_states: state must be one of "
            f"{sorted_list((*STATE_MODES, *STATE_CHOICES))}, "
            f"parts KIND=PART (optimizer=0.5: the last half of the layers' optimizer state on "
            f"host; params=blocks.*: a pattern) or placements joined by '+' (device+optimizer), "
            f"got {short(state)}{why}. 'device': the training state on device; 'optimizer': the "
            "optimizer state on host between steps; 'all': optimizer state and parameters on "
            "host; 'auto' (default): the first of them under which a plan fits; 'any': the "
            "cheapest plan under any of them.")
    return "auto", tuple(dict.fromkeys(names))


def tune_states(target: Builder, budget: int | str | None = None, *, state: str | Any = "auto",
                progress: Callable[[Any], None] | None = None, cache: dict[str, Any] | None = None,
                **kwargs: Any) -> TuneResult:
    """:func:`tune` over activation plans *and* where the training state lives between steps.

    ``state``: ``"auto"`` (default): the search with the state on device, then, only where no
    plan fits, with the optimizer state on host, then with optimizer state and parameters on host
    (:data:`STATE_CHOICES`): the first placement under which a plan fits is chosen, so a model
    whose activations alone can be made to fit never pays the host link for its state.
    ``"any"``: the search under every placement, the cheapest plan that fits under any (the
    transfers priced in the objective: at a profile's host link with ``objective="time"``).
    One name (``"optimizer"``) searches under that placement only. The result is the chosen
    placement's search (its ``state`` and plan's ``state:`` say it), its notes saying what the
    others found; nothing fits: the last one's. Every other argument is :func:`tune`'s.
    """
    mode, names = state_choices(state)
    if mode == "eighths":
        return eighths(target, budget, progress=progress, cache=cache, **kwargs)
    if "host_budget" in kwargs:
        raise RematError("remat_common.tune_states: host_budget= bounds state='eighths' only; "
                         f"state={state!r} puts whole kinds on host. Fix: state='eighths'.")
    if "state" in kwargs:
        raise RematError("remat_common.tune_states: give the placement as state='optimizer' (or "
                         "auto, any, device, all), not as a tune() argument.")
    results: list[tuple[str, TuneResult]] = []
    refused: dict[str, str] = {}
    for i, name in enumerate(names):
        # each placement its own cache entries (Runner.key), one shared dict
        try:
            r = tune(target, budget, state=state_placement(name), progress=progress, cache=cache,
                     **kwargs)
        except NoUsablePlan as e:  # every plan refused by the compiler (or not buildable)
            if i == len(names) - 1 and not results:  # nothing under any placement
                tried = "; ".join(f"state {n}: {why}" for n, why in refused.items())
                raise NoUsablePlan(f"{e}{' Before: ' + tried if tried else ''}",
                                   e.compiles) from None
            refused[name] = (f"none of its {e.compiles} plan(s) could be used (each left out: "
                             "refused by the compiler, or not buildable)")
            continue
        except StateNotApplicable as e:  # the target keeps nothing there: not a placement
            if len(names) == 1:
                raise
            refused[name] = f"not searched: {e.why}"
            if i == len(names) - 1 and not results:
                raise StateNotApplicable(f"{e} (state={state!r}: " + "; ".join(
                    f"state {n}: {why}" for n, why in refused.items()) + ")", e.why) from None
            continue
        results.append((name, r))
        if mode == "auto" and r.plan is not None:
            break
    fitting = [(n, r) for n, r in results if r.plan is not None and r.best is not None]
    if mode == "any" and fitting:
        name, chosen = min(fitting, key=lambda nr: (nr[1].best.cost, nr[1].best.peak))  # type: ignore[union-attr]
    else:
        name, chosen = (fitting or results)[-1]  # nothing fits: the last (the smallest peaks)
    if len(names) == 1:
        return chosen
    lines = [f"state {n} ({state_placement(n).describe()}): {why}" for n, why in refused.items()]
    for n, r in results:
        if n == name:
            continue
        best = r.best
        lines.append(f"state {n} ({state_placement(n).describe()}): " + (
            f"nothing fits {fmt_bytes(r.budget)} (smallest peak {fmt_bytes(r.smallest_peak.peak)})"
            if best is None else f"{best.name} fits, peak {fmt_bytes(best.peak)}, cost "
                                 f"{best.cost:.4g}"))
    why = ("the first placement under which a plan fits" if mode == "auto"
           else "the cheapest plan that fits under any placement")
    tried = ", ".join([*refused, *(n for n, _ in results)])
    note = (f"training state placements searched ({tried}; state={state!r}): chose {name} "
            f"({state_placement(name).describe()}), {why}"
            + ("; " + "; ".join(lines) if lines else "") + ".")
    compiles = sum(r.compiles for _, r in results)
    return dataclasses.replace(chosen, notes=(note, *chosen.notes), compiles=compiles)


def eighths(target: Builder, budget: int | str | None = None, *, host_budget: int | None = None,
            progress: Callable[[Any], None] | None = None, cache: dict[str, Any] | None = None,
            **kwargs: Any) -> TuneResult:
    """:func:`tune_states` (``state="eighths"``) under a device ``budget`` and a host one
    together: the state on device where a plan fits; else the fewest eighths of the layers'
    optimizer state on host (``optimizer=k/8``, :func:`state_placement`) under which a plan fits
    and whose state on host (``TunePoint.state_host_bytes``, per device) is within
    ``host_budget`` (``None``: ``REMAT_HOST_MEMORY`` where set, else no limit); else all of it and
    the fewest eighths of the parameters'. Each ``k`` is found by bisection, taking more on host
    never to raise the device peak (a search per ``k`` tried: at most four a kind). A target whose
    state has no numbered layers (a scanned stack) cannot take a fraction: the whole kinds are
    searched instead, as ``auto`` does."""
    limit = host_budget if host_budget is not None else (
        parse_bytes(os.environ[ENV], ENV) if os.environ.get(ENV) else None)
    found: dict[str, TuneResult | None] = {}
    why: dict[str, str] = {}

    def fits(name: str) -> bool:
        """Whether a plan fits the device budget with ``name``'s placement."""
        if name not in found:
            try:
                found[name] = tune_states(target, budget, state=name, progress=progress,
                                          cache=cache, **kwargs)
            except (NoUsablePlan, StateNotApplicable, PlanError) as e:
                found[name], why[name] = None, str(e).splitlines()[0]
        r = found[name]
        return r is not None and r.plan is not None and r.best is not None

    def host_fits(name: str) -> bool:
        held = found[name].best.state_host_bytes  # type: ignore[union-attr]
        if limit is not None and held > limit:
            why[name] = f"{fmt_bytes(held)} on host, over {fmt_bytes(limit)}"
            return False
        return True

    chosen = "device" if fits("device") else None
    for prefix, kind in (("", "optimizer"), ("optimizer=host,", "params")):
        if chosen is not None or not fits(name := f"{prefix}{kind}=host"):
            continue
        lo, hi = 1, 8  # the fewest eighths that fit the device: more on host fits the host less
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if fits(f"{prefix}{kind}={mid / 8}") else (mid + 1, hi)
        name = f"{prefix}{kind}={'host' if lo == 8 else lo / 8}"
        if not host_fits(name):
            break  # more on host (the next kind) holds more there
        chosen = name
    tried = [n for n in found if n != chosen]
    result = found[chosen] if chosen else next(
        (r for r in reversed(found.values()) if r is not None), None)
    if result is None:
        raise NoUsablePlan("remat_common.tune_states(state='eighths'): no placement could be "
                           "searched: " + "; ".join(f"{n}: {w}" for n, w in why.items()), 0)
    lines = [f"{n}: " + (why.get(n) or "nothing fits") for n in tried]
    note = (f"training state placements searched in eighths of the layers (state='eighths'"
            + (f", host budget {fmt_bytes(limit)}" if limit is not None else "") + "): "
            + (f"chose {chosen} ({state_placement(chosen).describe()})" if chosen else
               "nothing fits") + ("; " + "; ".join(lines) if lines else "") + ".")
    compiles = sum(r.compiles for r in found.values() if r is not None)
    if chosen is None:  # the last search's points; its plan, if any, is over the host budget
        result = dataclasses.replace(result, chosen=None, plan=None, message=note)
    return dataclasses.replace(result, notes=(note, *result.notes), compiles=compiles)
