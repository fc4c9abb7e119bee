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
from collections.abc import Callable
from typing import Any, Final

from ..._errors import RematError, short, sorted_list
from ..._state import StatePlacement
from ..accelerators._units import fmt_bytes
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
#: first under which a plan fits) and ``any`` (each, the cheapest plan that fits under any).
STATE_MODES: Final = ("auto", "any")


def state_choices(state: str | Any) -> tuple[str, tuple[str, ...]]:
    """``(mode, placements)`` for ``state``: a name of :data:`STATE_CHOICES` (that one), ``auto``
    or ``any`` (all of them in order), or names joined by ``+`` or in a list (``auto`` over
    them).

    >>> state_choices("auto")
    ('auto', ('device', 'optimizer', 'all'))
    >>> state_choices("device+all")
    ('auto', ('device', 'all'))
    """
    if isinstance(state, str) and state in STATE_MODES:
        return state, tuple(STATE_CHOICES)
    names = state.split("+") if isinstance(state, str) else list(state) if isinstance(
        state, list | tuple) else None
    if names is None or not names or any(n not in STATE_CHOICES for n in names):
        raise RematError(
            f"remat_common.tune_states: state must be one of {sorted_list((*STATE_MODES, *STATE_CHOICES))} "
            f"or placements joined by '+' (device+optimizer), got {short(state)}. 'device': the "
            "training state on device; 'optimizer': the optimizer state on host between steps; "
            "'all': optimizer state and parameters on host; 'auto' (default): the first of them "
            "under which a plan fits; 'any': the cheapest plan under any of them.")
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
    if "state" in kwargs:
        raise RematError("remat_common.tune_states: give the placement as state='optimizer' (or "
                         "auto, any, device, all), not as a tune() argument.")
    results: list[tuple[str, TuneResult]] = []
    refused: dict[str, str] = {}
    for i, name in enumerate(names):
        # each placement its own cache entries (Runner.key), one shared dict
        try:
            r = tune(target, budget, state=STATE_CHOICES[name], progress=progress, cache=cache,
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
    lines = [f"state {n} ({STATE_CHOICES[n].describe()}): {why}" for n, why in refused.items()]
    for n, r in results:
        if n == name:
            continue
        best = r.best
        lines.append(f"state {n} ({STATE_CHOICES[n].describe()}): " + (
            f"nothing fits {fmt_bytes(r.budget)} (smallest peak {fmt_bytes(r.smallest_peak.peak)})"
            if best is None else f"{best.name} fits, peak {fmt_bytes(best.peak)}, cost "
                                 f"{best.cost:.4g}"))
    why = ("the first placement under which a plan fits" if mode == "auto"
           else "the cheapest plan that fits under any placement")
    tried = ", ".join([*refused, *(n for n, _ in results)])
    note = (f"training state placements searched ({tried}; state={state!r}): chose {name} "
            f"({STATE_CHOICES[name].describe()}), {why}"
            + ("; " + "; ".join(lines) if lines else "") + ".")
    compiles = sum(r.compiles for _, r in results)
    return dataclasses.replace(chosen, notes=(note, *chosen.notes), compiles=compiles)
