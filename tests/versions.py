"""What the installed JAX does that tests must know (docs/jax_behaviour.md)."""

from __future__ import annotations

from typing import Any

import jax
from packaging.version import Version

JAX = Version(jax.__version__)

#: jax 0.11.0's XLA:CPU merges a recomputation back into the forward pass ("CSE").
CSE_UNDOES_REMAT = jax.default_backend() == "cpu" and JAX < Version("0.11.1")

#: Whether XLA:CPU's compiled temp memory tracks the activations a plan keeps: jax 0.11.1-0.11.x only
#: (0.11.0 and 0.12 do not); elsewhere ``remat report`` marks the figure as not meaningful.
TEMP_TRACKS_RESIDUALS = jax.default_backend() != "cpu" or Version("0.11.1") <= JAX < Version("0.12")


def temp_is_flagged() -> bool:
    """The report's figure notes say temp memory is not meaningful here (where it does not track)."""
    import remat_common as rc
    from remat_common.internal import backend_notes

    notes = {f.figure: f for f in backend_notes(rc.capabilities())}
    return not notes["temp_size_in_bytes"].meaningful


#: The names ``compile_boundary`` reports name-based policies under: 0.11.x's classes, 0.12's
#: factories of the same meaning (the classes are gone there).
SAVE_NAMES, SAVE_AND_OFFLOAD = (
    ("SaveOnlyTheseNames", "SaveAndOffloadOnlyTheseNames") if JAX < Version("0.12")
    else ("save_only_these_names", "save_and_offload_only_these_names"))

#: Compiler options under which remat shows in compiled FLOPs and memory on every version:
#: without CSE where CSE undoes it, nothing otherwise.
SHOW_REMAT: dict[str, Any] = {"xla_disable_hlo_passes": "cse"} if CSE_UNDOES_REMAT else {}

#: jax 0.11.0 on CPU compiled with ``SHOW_REMAT`` (CSE off): the backward pass holds larger
#: temporaries (the tuner tests' 3-layer NNX GPT: 18.7 MB where 0.11.2 holds 7.8 MB), and they set
#: the peak of every plan that keeps at most one layer's activations: those plans peak alike, and
#: √L nesting peaks above full recompute. ``tests/test_tune*.py`` assert what the tuner chooses
#: from those figures there.
BACKWARD_TEMPS_SET_THE_PEAK = CSE_UNDOES_REMAT
