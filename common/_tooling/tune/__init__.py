"""Tuning: the cheapest plan whose compiled step fits a memory budget, and the capacity it unlocks.

:func:`tune` calibrates each choice on the whole stack, predicts any per-layer assignment's peak
and cost from those compiles (the model: :class:`LayerRules`, ``_model.py``), searches a Pareto
front of assignments and compiles the cheapest one predicted to fit until one does (the search:
``_search.py``); :func:`tune_states` chooses where the training state lives (a plan's ``state:``)
beside it (``_states.py``); :func:`capacity` finds the largest size that fits (``_capacity.py``). The result
is a :class:`TuneResult` of compiled :class:`TunePoint` s. Imports report, measurement and below.
"""

from ._capacity import capacity as capacity
from ._capacity import CapacityRow as CapacityRow
from ._model import LayerRules as LayerRules
from ._result import TunePoint as TunePoint
from ._result import TuneResult as TuneResult
from ._search import tune as tune
from ._states import STATE_CHOICES as STATE_CHOICES
from ._states import tune_states as tune_states

__all__ = [
    "CapacityRow",
    "LayerRules",
    "STATE_CHOICES",
    "TunePoint",
    "TuneResult",
    "capacity",
    "tune",
    "tune_states",
]
