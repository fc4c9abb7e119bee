"""Equinox as the core knows it: the one record this adapter registers (``register_framework``)."""

from __future__ import annotations

import remat_common as rc

from ._annotate import bind_declared_models, check_verified_models
from ._binding import FRAMEWORK
from ._call import annotated_call
from ._paths import bound_path, is_module, paths_under, scoped

_MSG_PICKLE = """\
equinox_remat_plugin: {cls} at {path!r} runs a plan: its class was made by annotate() at run time,
so pickle cannot save it by reference, and a pickled model could not bring the plan back. Fix:
save the arrays, eqx.tree_serialise_leaves(file, model) (annotate does not change them), and load
them into a model built and annotated the same way; or pickle the plain model, erp.unwrap(model),
and annotate it again after loading."""

rc.adapter.register_framework(rc.adapter.Framework(
    FRAMEWORK, is_module=is_module, paths=paths_under, call=annotated_call,
    pickle_message=_MSG_PICKLE, bound_path=bound_path, scoped=scoped,
    check_models=check_verified_models, bind_models=bind_declared_models))
