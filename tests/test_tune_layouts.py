"""``remat_common.tune`` on a scanned layout: never over budget, as good as an exhaustive search,
no worse than a uniform plan.

The same check as ``tests/test_tune.py`` (the NNX GPT's list layout) on the NNX GPT's scanned
one, so each layout is searched. (The Equinox GPT's list and scanned layouts were a second and a
third, 174 s and 66 s of the suite's worker time: the tuner sees layers, a scanned stack and its
groups, not the framework that runs them, and both adapters' layouts are checked against each
other in ``tests/test_verify_real_models.py``.) On the layout,
one module-level cache of compiled figures, the space of ``fixtures/tune_space.py``
compiled once into it (every multiset of save / dots_no_batch / recompute over 3 layers, each in
the layer order with the smallest compiled peak among all of its orders; on a scanned stack three
of them split the scan into three one-layer groups), then ``tune`` at five budgets from full
recompute's peak to save-all's, taking what it can from the cache. The multisets alone are not
the exhaustive space, on a scan or a list: the order of the layers changes the peak by up to a
layer's residuals at the same FLOPs (``benchmarks/tune_orders.py`` compiles all 27 assignments
per layout; the fixture's docstring has the figures), so each multiset is compiled in its best
order, which makes this space's best plan at a budget the best of all 27 (to the 0.2% by which
FLOPs vary with the order).
"""

from __future__ import annotations

import functools
from typing import Any

import pytest

pytest.importorskip("flax")
pytest.importorskip("equinox")
pytest.importorskip("optax")

from fixtures.tune_space import CHOICES, check_tuned, config, space  # noqa: E402
from remat_common import RematError, tune  # noqa: E402
from remat_common.internal import fmt_bytes  # noqa: E402
from remat_common.measurement import TuneResult  # noqa: E402
from versions import SHOW_REMAT  # noqa: E402

# Tooling (the tuner's search): slow, marked `tooling` (`-m "not tooling"` leaves it out of a
# quick local run); every stage of scripts/test runs it.
pytestmark = [pytest.mark.tooling, pytest.mark.usefixtures("standard_promotion")]

#: The NNX GPT's scanned stack (tests/test_tune.py: its list). The Equinox GPT's list layout was a
#: second case, 174 s of a loaded 2-core run's worker time: the tuner sees layers, a stack and
#: its groups, not the framework, and both adapters' layouts are checked against each other in
#: tests/test_verify_real_models.py.
LAYOUTS = [("nnx_gpt", "scan")]


@functools.cache
def _space(example: str, kind: str) -> tuple[Any, dict[str, Any], TuneResult]:
    """One layout's space, compiled once per test session: (builder, cache, result). Compiled
    with ``SHOW_REMAT`` (jax 0.11.0's CPU: CSE off, which would merge each recomputation back,
    so that the peaks and FLOPs tell the plans apart; nothing elsewhere), as every search on it."""
    return space(example, kind, SHOW_REMAT)


@pytest.fixture(params=LAYOUTS, ids=["-".join(p) for p in LAYOUTS])
def layout(request: pytest.FixtureRequest,
           standard_promotion: None) -> tuple[str, str, Any, dict[str, Any], TuneResult]:
    """(example, layout, builder, cache, result) of one layout's space."""
    example, kind = request.param
    return (example, kind, *_space(example, kind))


def test_tuned_plans_fit_and_match_the_exhaustive_search(layout: Any) -> None:
    """At five budgets: within the budget, within 2% of the space's best, no worse than a uniform
    plan. At the smallest budget (full recompute's peak) the best plan that fits, measured by
    ``benchmarks/tune_orders.py`` (all 27 orders): on a scanned stack the layer groups share one
    custom_vjp and a lone ``save`` group keeps slices of the stacked parameters (a problem, so it
    does not fit): on nnx_gpt, RRD (9.32 MiB, FLOPs 600.3M) under RRR's 9.56 MiB (624.6M), on
    every version (compiled with CSE off on jax 0.11.0)."""
    example, kind, build, cache, everything = layout
    results = check_tuned(build, cache, everything, SHOW_REMAT)
    smallest = results[0].best
    assert smallest is not None
    assert smallest.assignment == ("recompute", "recompute", "dots_no_batch"), (example, kind)
    assert results[0].stack == "blocks" and results[0].layers == 3


@pytest.mark.parametrize(("example", "kind"), LAYOUTS, ids=["-".join(p) for p in LAYOUTS])
def test_nothing_fits_says_the_smallest_peak(example: str, kind: str,
                                             standard_promotion: None) -> None:
    build, cache, everything = _space(example, kind)
    smallest = min(p.peak for p in everything.points)
    r = tune(build, smallest - 1, choices=CHOICES, cache=cache, compiler_options=SHOW_REMAT)
    assert r.plan is None and r.best is None and r.yaml() == ""
    assert r.message.startswith(f"nothing fits {fmt_bytes(smallest - 1)}: the smallest compiled "
                                f"peak is {fmt_bytes(smallest)}")
    low = fmt_bytes(smallest - 1)
    assert (f"--budget {low.replace(' ', '')} --maximize batch finds the largest batch that fits "
            f"{low}") in r.message
    assert r.smallest_peak.peak == smallest


@pytest.mark.parametrize(("example", "kind"), LAYOUTS)
def test_nested_is_refused_where_it_cannot_apply(example: str, kind: str) -> None:
    """``nested`` needs a scanned stack, and a block size from 2 to the stack's depth; refused
    with the reason and the fix before anything is compiled."""
    build = config(example, layout=kind).builder()
    if kind == "list":
        with pytest.raises(RematError, match=r"(?s)choice 'nested' needs a scanned stack, and "
                                             r"'blocks' is not one.*Fix: tune the model with\s+"
                                             r"its\s+layers\s+stacked"):
            tune(build, "1GiB", choices=["nested"])
    else:
        with pytest.raises(RematError, match=r"choice 'nested:5' on the stack 'blocks' of 3 layers: '5' is not a block size from 2 to 3. Fix: write nested:K"):
            tune(build, "1GiB", choices=["nested:5"])
        with pytest.raises(RematError, match=r"'1' is not a block size from 2 to 3"):
            tune(build, "1GiB", choices=["nested:1"])
