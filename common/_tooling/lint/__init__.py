"""``remat lint``: static checks for hand-written remat code, from Python's :mod:`ast` alone.

The rules (:data:`LINT_RULES`) and what a run finds (:class:`Finding`, :class:`LintReport`) are in
``_rules.py``; name resolution through a file's imports in ``_names.py``; the checks and the file
walk (:func:`lint_source`, :func:`lint_paths`) in ``_lint.py``. Imports the core only.
"""

from ._lint import lint_paths as lint_paths
from ._lint import lint_source as lint_source
from ._rules import Finding as Finding
from ._rules import LINT_RULES as LINT_RULES
from ._rules import LintReport as LintReport
from ._rules import LintRule as LintRule

__all__ = [
    "Finding",
    "LINT_RULES",
    "LintReport",
    "LintRule",
    "lint_paths",
    "lint_source",
]
