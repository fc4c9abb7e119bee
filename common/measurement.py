"""Measuring what plans cost: memory, FLOPs, compile and step time, residuals per plan.

Tooling, apart from the runtime: nothing in the core's runtime imports it. :func:`measure` returns
a :class:`Report`, plain frozen data (JSON in and out); the renderers are functions of the report
(:func:`report_table`, :func:`peak_table`, :func:`render_text`, :func:`plot_report`,
:func:`plot_timeline`). ``remat report`` is the command
line over the same functions; :func:`tune` (``remat tune``) searches plans for the cheapest one
whose compiled step fits a memory budget.
"""

from ._compiler import Compiler as Compiler
from ._compiler import compiler_change as compiler_change
from ._compiler import compiler_identity as compiler_identity
from ._tooling import accelerators as _accelerators
from ._tooling import breakdown as _breakdown
from ._tooling import measurement as _measurement
from ._tooling import report as _report
from ._tooling import tune as _tune
from ._tooling.accelerators import *  # noqa: F403 - each package's face names what it offers
from ._tooling.breakdown import *  # noqa: F403
from ._tooling.measurement import *  # noqa: F403
from ._tooling.report import *  # noqa: F403
from ._tooling.tune import *  # noqa: F403

__all__ = sorted(["Compiler", "compiler_change", "compiler_identity", *_breakdown.__all__,
                  *_measurement.__all__, *_report.__all__, *_accelerators.__all__, *_tune.__all__])
