"""Custom remat rules: for authors of a module's own forward / rematerialize / backward rules.

A module annotated ``"custom"`` computes its output through rule sets (its ``__remat_custom__``
method; https://github.com/jax-remat-plan/jax-remat-plan/blob/main/docs/custom_rules.md). The
ready-made rule sets (``attention_rules``, ``rms_norm_rules``, ...) and the tools to build and
inspect new ones live here.

>>> from remat_common.rules import RuleSet, custom_path
>>> custom_path("custom_vjp")
'custom_vjp'
"""

from ._custom import IMPL_CHOICES as IMPL_CHOICES
from ._custom import RuleSet as RuleSet
from ._custom import custom_impl as custom_impl
from ._custom import custom_path as custom_path
from ._context import collect_rule_runs as collect_rule_runs
from ._records import Ambient as Ambient
from ._records import RuleRun as RuleRun
from ._rules import attention as attention
from ._rules import attention_rules as attention_rules
from ._rules import gated_mlp as gated_mlp
from ._rules import gated_mlp_rules as gated_mlp_rules
from ._rules import layer_norm as layer_norm
from ._rules import layer_norm_rules as layer_norm_rules
from ._rules import rms_norm as rms_norm
from ._rules import rms_norm_rules as rms_norm_rules

__all__ = [
    "Ambient",
    "IMPL_CHOICES",
    "RuleRun",
    "RuleSet",
    "attention",
    "attention_rules",
    "collect_rule_runs",
    "custom_impl",
    "custom_path",
    "gated_mlp",
    "gated_mlp_rules",
    "layer_norm",
    "layer_norm_rules",
    "rms_norm",
    "rms_norm_rules",
]
