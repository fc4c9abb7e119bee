"""flax_remat_plugin: declarative remat plans for Flax NNX models.

Annotate an existing model by path or from a plan file (:func:`annotate`), declare intent in a
module class (:func:`remat`), and run ``nnx.vmap``-stacked layers with the plan applied to the
scan body (:func:`scan_layers`). All plan logic lives in :mod:`remat_common`.
"""

from remat_common import checkpoint_name as checkpoint_name

from ._annotate import annotate as annotate
from ._annotate import compiled_plan as compiled_plan
from ._annotate import plan_of as plan_of
from ._annotate import unannotate as unannotate
from ._paths import module_paths as module_paths
from ._remat import remat as remat
from ._scan import scan_layers as scan_layers
from ._state import state_roles as state_roles
from . import _framework  # noqa: F401  (registers Flax NNX with the core)

__all__ = sorted([
    "annotate", "checkpoint_name", "compiled_plan", "module_paths", "plan_of", "remat", "scan_layers", "state_roles",
    "unannotate",
])
