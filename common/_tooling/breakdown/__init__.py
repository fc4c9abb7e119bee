"""The breakdown: every byte of a compiled step at its peak, by kind and module, and whether it fits.

:func:`breakdown_of` reads XLA's buffer-assignment dumps of a step (compiled with
:func:`~remat_common._tooling.targets.dump_compile`) into a :class:`MemoryBreakdown`: the rows live at
the peak (:class:`PeakRow`), the timeline of live bytes (:class:`Timeline`), and, against a budget,
a :class:`FitSummary`. Imports the targets and the core.
"""

from ._breakdown import breakdown_from_dump as breakdown_from_dump
from ._breakdown import breakdown_of as breakdown_of
from ._breakdown import step_facts as step_facts
from ._breakdown import StepFacts as StepFacts
from ._figures import FitSummary as FitSummary
from ._figures import MemoryBreakdown as MemoryBreakdown
from ._figures import PeakRow as PeakRow
from ._figures import Timeline as Timeline
from ._figures import will_it_fit as will_it_fit

__all__ = [
    "FitSummary",
    "MemoryBreakdown",
    "PeakRow",
    "StepFacts",
    "Timeline",
    "breakdown_from_dump",
    "breakdown_of",
    "step_facts",
    "will_it_fit",
]
