"""Measuring what plans cost: memory, FLOPs, compile and step time, residuals per plan.

Tooling, apart from the runtime: nothing in the core's runtime imports it. :func:`measure` returns
a :class:`Report`, plain frozen data (JSON in and out); the renderers are functions of the report
(:func:`report_table`, :func:`peak_table`, :func:`render_text`, :func:`plot_report`,
:func:`plot_timeline`). ``remat report`` is the command
line over the same functions; :func:`tune` (``remat tune``) searches plans for the cheapest one
whose compiled step fits a memory budget.
"""

from ._tooling._accelerators import Accelerator as Accelerator
from ._tooling._accelerators import TargetCompile as TargetCompile
from ._tooling._accelerators import compile_for as compile_for
from ._tooling._accelerators import compiler_available as compiler_available
from ._tooling._accelerators import device_count as device_count
from ._tooling._accelerators import host_placements as host_placements
from ._tooling._accelerators import parse_accelerator as parse_accelerator
from ._tooling._accelerators import parse_mesh as parse_mesh
from ._tooling._accelerators import target_kinds as target_kinds
from ._tooling._breakdown import FitSummary as FitSummary
from ._tooling._breakdown import MemoryBreakdown as MemoryBreakdown
from ._tooling._breakdown import PeakRow as PeakRow
from ._tooling._breakdown import Timeline as Timeline
from ._tooling._html import write_html as write_html
from ._tooling._layout import LayoutCheck as LayoutCheck
from ._tooling._measure import MeasureEvent as MeasureEvent
from ._tooling._measure import MeasureTarget as MeasureTarget
from ._tooling._measure import measure as measure
from ._tooling._placements import Placement as Placement
from ._tooling._placements import export_placements as export_placements
from ._tooling._report import FigureNote as FigureNote
from ._tooling._report import MemoryFigures as MemoryFigures
from ._tooling._report import PlacementCheck as PlacementCheck
from ._tooling._report import PlanReport as PlanReport
from ._tooling._report import RefusedPlan as RefusedPlan
from ._tooling._report import Report as Report
from ._tooling._report import StepTiming as StepTiming
from ._tooling._report_json import ReportFormatError as ReportFormatError
from ._tooling._flops import Flops as Flops
from ._tooling._flops import count_flops as count_flops
from ._compiler import Compiler as Compiler
from ._compiler import compiler_change as compiler_change
from ._compiler import compiler_identity as compiler_identity
from ._tooling._profiles import DeviceProfile as DeviceProfile
from ._tooling._recheck import PlanCheck as PlanCheck
from ._tooling._recheck import ReportCheck as ReportCheck
from ._tooling._recheck import check_report as check_report
from ._tooling._profiles import HostLink as HostLink
from ._tooling._profiles import fit_profile as fit_profile
from ._tooling._profiles import load_profile as load_profile
from ._tooling._profiles import host_link as host_link
from ._tooling._render import peak_table as peak_table
from ._tooling._render import plot_report as plot_report
from ._tooling._render import plot_timeline as plot_timeline
from ._tooling._render import print_report as print_report
from ._tooling._render import render_text as render_text
from ._tooling._render import report_table as report_table
from ._tooling._tune import CapacityRow as CapacityRow
from ._tooling._tune import LayerRules as LayerRules
from ._tooling._tune import TunePoint as TunePoint
from ._tooling._tune import TuneResult as TuneResult
from ._tooling._tune import capacity as capacity
from ._tooling._profiles import parse_bytes as parse_bytes
from ._tooling._tune import tune as tune
from ._tooling._state import StateTransfer as StateTransfer
from ._tooling._state import state_transfer as state_transfer
from ._tooling._verify_target import verify_on as verify_on

__all__ = [
    "Accelerator",
    "CapacityRow",
    "Compiler",
    "DeviceProfile",
    "FigureNote",
    "FitSummary",
    "Flops",
    "HostLink",
    "LayerRules",
    "LayoutCheck",
    "MeasureEvent",
    "MeasureTarget",
    "MemoryBreakdown",
    "MemoryFigures",
    "PeakRow",
    "Placement",
    "PlacementCheck",
    "PlanCheck",
    "PlanReport",
    "RefusedPlan",
    "Report",
    "ReportCheck",
    "ReportFormatError",
    "StateTransfer",
    "StepTiming",
    "TargetCompile",
    "Timeline",
    "TunePoint",
    "TuneResult",
    "capacity",
    "check_report",
    "compile_for",
    "compiler_available",
    "compiler_change",
    "compiler_identity",
    "count_flops",
    "device_count",
    "export_placements",
    "fit_profile",
    "host_link",
    "host_placements",
    "load_profile",
    "measure",
    "parse_accelerator",
    "parse_bytes",
    "parse_mesh",
    "peak_table",
    "plot_report",
    "plot_timeline",
    "print_report",
    "render_text",
    "report_table",
    "state_transfer",
    "target_kinds",
    "tune",
    "verify_on",
    "write_html",
]
