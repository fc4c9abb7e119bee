"""Reports: a measurement's figures as tables, text, HTML and plots, compared and re-checked.

Functions of a :class:`~remat_common._tooling.measurement.Report` (the report imports none of
them): rich tables (:func:`report_table`, :func:`peak_table`, :func:`print_report`), plain text
(:func:`render_text`), will each plan fit a budget (:func:`fit_lines`), matplotlib figures (:func:`plot_report`, :func:`plot_timeline`), one HTML
page (:func:`write_html`); :func:`check_report` says whether a stored report still holds for this
compiler, :func:`report_drift` which figures moved between two reports' compilers. Imports
measurement and below.
"""

from ._drift import Drift as Drift
from ._drift import report_drift as report_drift
from ._html import write_html as write_html
from ._plots import plot_report as plot_report
from ._plots import plot_timeline as plot_timeline
from ._recheck import check_report as check_report
from ._recheck import PlanCheck as PlanCheck
from ._recheck import ReportCheck as ReportCheck
from ._render import fit_lines as fit_lines
from ._render import peak_table as peak_table
from ._render import print_report as print_report
from ._render import render_text as render_text
from ._render import report_table as report_table

__all__ = [
    "Drift",
    "PlanCheck",
    "ReportCheck",
    "check_report",
    "fit_lines",
    "peak_table",
    "plot_report",
    "plot_timeline",
    "print_report",
    "render_text",
    "report_drift",
    "report_table",
    "write_html",
]
