"""Flax NNX as the core knows it: the one record this adapter registers (``register_framework``);
its in-place objects (``pytree=False``, the default before Flax 0.12) are split and merged by NNX."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flax import nnx

import remat_common as rc

from ._annotate import bind_declared_models, check_verified_models
from ._binding import FRAMEWORK
from ._call import annotated_call
from ._paths import graph_paths, is_module

_BASE: type = getattr(nnx, "Pytree", None) or nnx.Object

_MSG_PICKLE = """\
flax_remat_plugin: {cls} at {path!r} runs a plan: its class was made by annotate() at run time,
so pickle cannot save it by reference, and a pickled graphdef or module could not bring the plan
back. Fix: pickle nnx.state(model) (annotate does not change it) and restore into a model built
and annotated the same way (nnx.update(model, state)); or frp.unannotate(model) before pickling
its graphdef (then annotate again after loading)."""


def _class_keywords(orig: type) -> Mapping[str, Any]:
    return {"pytree": getattr(orig, "_pytree__is_pytree", True)}  # as the original class was made


def _split(objects: tuple[Any, ...]) -> tuple[Any, Any]:
    return nnx.split(objects)  # one split: references shared between objects stay shared


def _merge(static: Any, state: Any) -> tuple[Any, ...]:
    return nnx.merge(static, state)  # type: ignore[no-any-return]


def _state(objects: tuple[Any, ...]) -> Any:
    return nnx.split(objects)[1]


rc.adapter.register_framework(rc.adapter.Framework(
    FRAMEWORK, is_module=is_module, paths=graph_paths, call=annotated_call,
    class_keywords=_class_keywords, pickle_message=_MSG_PICKLE,
    check_models=check_verified_models, bind_models=bind_declared_models,
    stateful=rc.adapter.StatefulKind(name=FRAMEWORK, claims=lambda x: isinstance(x, _BASE),
                                     split=_split, merge=_merge, state=_state)))
