"""equinox_remat_plugin: declarative remat plans for Equinox models.

Annotate an ``eqx.Module`` tree by module path (``blocks.*.attn``), from a plan file, or with
``Remat`` wrappers in model code; run stacked layers with ``scan_layers`` / ``Stacked``. Plans,
their resolution, policies and verification come from :mod:`remat_common`.
"""

from remat_common import checkpoint_name as checkpoint_name

from ._annotate import annotate as annotate
from ._annotate import compiled_plan as compiled_plan
from ._annotate import module_paths as module_paths
from ._annotate import plan_of as plan_of
from ._annotate import unwrap as unwrap
from ._checkpoint import filter_checkpoint_impl as filter_checkpoint_impl
from ._remat import Remat as Remat
from ._scan import Stacked as Stacked
from ._scan import num_layers as num_layers
from ._scan import scan_layers as scan_layers
from ._state import state_roles as state_roles
from . import _framework  # noqa: F401  (registers Equinox with the core)

__all__ = sorted([
    "Remat", "Stacked", "annotate", "checkpoint_name", "compiled_plan", "filter_checkpoint_impl", "module_paths",
    "num_layers", "plan_of", "scan_layers", "state_roles", "unwrap",
])
