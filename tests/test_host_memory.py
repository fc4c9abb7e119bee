"""The host RAM guard (``remat_common.measurement.check_host_memory``): a tool that puts training
state on host predicts the bytes before it allocates them and refuses, with the figures, a size
over the budget (``REMAT_HOST_MEMORY``, a script's ``--host-memory``, else 90 % of
``MemAvailable``); a budget over what the machine can give is refused itself. The budgets here are made small (or the
machine's memory made small), so nothing large is allocated.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

import remat_common as rc
from remat_common.measurement import HostMemoryError, check_host_memory

REPO = Path(__file__).resolve().parents[1]
GiB = 2**30
#: the guard's module (``remat_common.internal`` exports its functions)
host_memory = sys.modules[check_host_memory.__module__]
pytestmark = [pytest.mark.usefixtures("standard_promotion"),
              pytest.mark.lock_only]  # the guard's arithmetic and refusals: no JAX version in it


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine with 10 GiB available, and no budget in the environment."""
    monkeypatch.setattr(host_memory, "available", lambda: 10 * GiB)
    monkeypatch.delenv(host_memory.ENV, raising=False)


def test_sizes_over_the_budget_are_refused_with_the_figures(
        machine: None, monkeypatch: pytest.MonkeyPatch) -> None:
    assert host_memory.over_memory(9 * GiB, "x", "y") is None  # 90 % of 10 GiB
    with pytest.raises(HostMemoryError, match=r"host memory: the state: 9\.10 GiB, over 90% of "
                                              r"the 10\.00 GiB this machine has available "
                                              r"\(MemAvailable\); .*Fix: less"):
        check_host_memory(int(9.1 * GiB), "the state", "less")
    with pytest.raises(HostMemoryError, match=r"2\.00 KiB, over --host-memory 1\.00 KiB"):
        check_host_memory(2048, "the state", "less", limit=1024)
    monkeypatch.setenv(host_memory.ENV, "1KiB")
    with pytest.raises(HostMemoryError, match=r"2\.00 KiB, over REMAT_HOST_MEMORY=1KiB"):
        check_host_memory(2048, "the state", "less")


def test_a_budget_over_the_machine_is_refused(machine: None,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    assert "36.00 GiB is more than this machine can give: 90% of the 10.00 GiB" in str(
        host_memory.beyond_machine(36 * GiB))
    assert host_memory.beyond_machine(9 * GiB) is None
    monkeypatch.setenv(host_memory.ENV, "36GiB")
    with pytest.raises(HostMemoryError, match=r"REMAT_HOST_MEMORY=36GiB: 36\.00 GiB is more than "
                                              r"this machine can give.*Fix: at most 9\.00 GiB"):
        check_host_memory(1, "the state", "less")
    monkeypatch.setenv(host_memory.ENV, "lots")
    with pytest.raises(rc.RematError, match=r"REMAT_HOST_MEMORY 'lots': not a number with a unit"):
        check_host_memory(1, "the state", "less")


def test_the_measured_step_is_refused_before_it_puts_state_on_host(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``remat report`` and ``remat tune`` build their steps with ``with_state``: over the budget,
    it raises before the host copy is made (which would fail this test)."""
    pytest.importorskip("flax")
    pytest.importorskip("optax")
    if str(REPO) not in sys.path:  # the examples are not an installed package
        sys.path.insert(0, str(REPO))
    from examples.nnx_gpt import model as nnx_model

    def never(x: Any) -> Any:
        raise AssertionError("allocated on host before the budget was checked")

    monkeypatch.setenv(host_memory.ENV, "4KiB")
    plan = rc.Plan.from_mapping({"blocks.*": "recompute"}, state={"optimizer": {"host": 0.5}})
    # compiled from shapes, nothing is allocated here: no budget to check
    target = nnx_model.measure_target(plan, batch=2, d_model=8, n_layers=2, n_heads=2, seq_len=8,
                                      vocab=32, abstract=True)
    assert target.host_state_bytes is not None and target.host_state_bytes["optimizer"] > 4096
    monkeypatch.setattr(sys.modules[rc.measurement.with_state.__module__], "_on_host", never)
    with pytest.raises(HostMemoryError, match=(
            r"host memory: the state on host \(optimizer state: the last 50% of the layers on "
            r"host .*\), 8\.12 KiB, and the measured step's copy of it \(its arguments and "
            r"results\): 16\.25 KiB, over REMAT_HOST_MEMORY=4KiB")):
        nnx_model.measure_target(plan, batch=2, d_model=8, n_layers=2, n_heads=2, seq_len=8,
                                 vocab=32)
