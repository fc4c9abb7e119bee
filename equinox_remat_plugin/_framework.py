"""Equinox as the core knows it: the one record this adapter registers (``register_framework``)."""

from __future__ import annotations

import remat_common as rc

from ._annotate import bind_declared_models, check_verified_models
from ._paths import bound_path, is_module, paths_under, scoped

rc.adapter.register_framework(rc.adapter.Framework(
    "equinox", is_module=is_module, paths=paths_under, bound_path=bound_path, scoped=scoped,
    check_models=check_verified_models, bind_models=bind_declared_models))
