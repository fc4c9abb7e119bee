"""The breakdown: every byte of a compiled step at its peak, by kind and module, and whether it fits.

``breakdown_of`` reads XLA's buffer-assignment dumps of a step (compiled with
``accelerators.dump_compile``) into a :class:`MemoryBreakdown`: the rows live at
the peak (:class:`PeakRow`), the timeline of live bytes (:class:`Timeline`), and, against a budget,
a :class:`FitSummary` (``will_it_fit``). Imports the accelerators and the core.
"""

from ._figures import FitSummary as FitSummary
from ._figures import MemoryBreakdown as MemoryBreakdown
from ._figures import PeakRow as PeakRow
from ._figures import Timeline as Timeline

__all__ = [
    "FitSummary",
    "MemoryBreakdown",
    "PeakRow",
    "Timeline",
]
