"""Measurement: compiling a model's step under each plan and keeping its figures.

:func:`measure` compiles the step a :class:`MeasureTarget` gives, on this machine or for a target, under each plan, verifies its residuals, counts its FLOPs (:func:`count_flops`),
reads its peak breakdown and times it; the figures are a :class:`Report`, plain frozen data with
JSON in and out (:class:`PlanReport` per plan). Imports the breakdown, the targets and the core;
rendering is the report package's.
"""

from ._flops import count_flops as count_flops
from ._fuzz import fuzz_plans as fuzz_plans
from ._host_memory import HostMemoryError as HostMemoryError
from ._host_memory import check_host_memory as check_host_memory
from ._flops import Flops as Flops
from ._layout import LayoutCheck as LayoutCheck
from ._measure import measure as measure
from ._mfu import ModelFlops as ModelFlops
from ._mfu import device_peak as device_peak
from ._mfu import mfu as mfu
from ._mfu import throughput as throughput
from ._measure import MeasureEvent as MeasureEvent
from ._parity import ParityReport as ParityReport
from ._parity import PlanParity as PlanParity
from ._parity import parity_tolerance as parity_tolerance
from ._parity import verify_parity as verify_parity
from ._placements import export_placements as export_placements
from ._placements import Placement as Placement
from ._report import FigureNote as FigureNote
from ._report import MemoryFigures as MemoryFigures
from ._report import PlacementCheck as PlacementCheck
from ._report import PlanReport as PlanReport
from ._report import RefusedPlan as RefusedPlan
from ._report import Report as Report
from ._report import StepTiming as StepTiming
from ._report_json import ReportFormatError as ReportFormatError
from ._state_transfer import StateFigures as StateFigures
from ._state_transfer import StateTransfer as StateTransfer
from ._state_transfer import state_transfer as state_transfer
from ._state_transfer import with_state as with_state
from ._target import MeasureTarget as MeasureTarget
from ._verify_target import verify_on as verify_on

__all__ = [
    "FigureNote",
    "Flops",
    "HostMemoryError",
    "LayoutCheck",
    "MeasureEvent",
    "MeasureTarget",
    "MemoryFigures",
    "ModelFlops",
    "ParityReport",
    "Placement",
    "PlacementCheck",
    "PlanParity",
    "PlanReport",
    "RefusedPlan",
    "Report",
    "ReportFormatError",
    "StateFigures",
    "StateTransfer",
    "StepTiming",
    "check_host_memory",
    "count_flops",
    "device_peak",
    "export_placements",
    "fuzz_plans",
    "measure",
    "mfu",
    "parity_tolerance",
    "state_transfer",
    "throughput",
    "verify_on",
    "verify_parity",
    "with_state",
]
