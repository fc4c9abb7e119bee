r"""Static checks for hand-written remat code (``remat lint``): rules RM001...

Tooling, apart from the runtime. Every rule and the JAX behaviour behind it:
https://github.com/jax-remat-plan/jax-remat-plan/blob/main/docs/lint.md#remat-lint.

>>> from remat_common.lint import lint_source
>>> [f.rule for f in lint_source("import jax.checkpoint_policies\n")]
['RM001']
"""

from ._tooling import lint as _lint
from ._tooling.lint import *  # noqa: F403 - the package's face names what it offers

__all__ = sorted(_lint.__all__)
