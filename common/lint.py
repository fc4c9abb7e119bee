r"""Static checks for hand-written remat code (``remat lint``): rules RM001...

Tooling, apart from the runtime. Every rule and the JAX behaviour behind it:
https://github.com/jax-remat-plan/jax-remat-plan/blob/main/docs/lint.md#remat-lint.

>>> from remat_common.lint import lint_source
>>> [f.rule for f in lint_source("import jax.checkpoint_policies\n")]
['RM001']
"""

from ._tooling.lint import LINT_RULES as LINT_RULES
from ._tooling.lint import Finding as Finding
from ._tooling.lint import LintReport as LintReport
from ._tooling.lint import LintRule as LintRule
from ._tooling.lint import lint_paths as lint_paths
from ._tooling.lint import lint_source as lint_source

__all__ = [
    "Finding",
    "LINT_RULES",
    "LintReport",
    "LintRule",
    "lint_paths",
    "lint_source",
]
