"""The adapter interface: what an adapter for a framework needs from the core.

``flax_remat_plugin`` and ``equinox_remat_plugin`` are built on these names only, and an adapter for
a third framework would be too (where it plugs in:
https://github.com/jax-remat-plan/jax-remat-plan/blob/main/common/README.md). An adapter describes
its framework once, :func:`register_framework` (a :class:`Framework` record: which objects are its
modules, the paths inside one, the call of its annotated classes, what ``verify`` checks of its
models). Then it does two things: it describes the model (:class:`ModelView`: module paths, stacks,
what each path is) so that :func:`plan_model` can compile the plan, and it runs every module call
through :func:`call_module` (or :func:`wrap_call` for a bare boundary), with the framework's
``jax.checkpoint`` as the :class:`CheckpointImpl`: a module the plan names gets a class made by the
core (:func:`annotated_class`, swapped in by :func:`with_class`) whose ``__call__`` does that.
Module paths are dotted strings; the helpers below show, join and compare them the same way in
every adapter. The ``register_*`` calls but :func:`register_framework`, and ``ModuleLocator``,
are deprecated (a :class:`Framework` holds their hooks) and go in the next release.

Stable for adapter authors, but not part of the user API (``remat_common``).
"""

from ._annotation import MAPPING_KEYS as MAPPING_KEYS
from ._arrays import is_array as is_array
from ._arrays import is_float as is_float
from ._checkpoint import CheckpointImpl as CheckpointImpl
from ._checkpoint import call_module as call_module
from ._checkpoint import compile_annotation as compile_annotation
from ._checkpoint import wrap_call as wrap_call
from ._compile import EMITTED_POLICIES as EMITTED_POLICIES
from ._compile import CompiledBoundary as CompiledBoundary
from ._compile import compile_boundary as compile_boundary
from ._errors import check_bool as check_bool
from ._context import collect_tags as collect_tags
from ._context import current_module_path as current_module_path
from ._context import effective_path as effective_path
from ._context import layer_scope as layer_scope
from ._context import module_scope as module_scope
from ._framework import Framework as Framework
from ._framework import ModuleLocator as ModuleLocator
from ._framework import StatefulKind as StatefulKind
from ._framework import binding_of as binding_of
from ._framework import original_class as original_class
from ._framework import register_framework as register_framework
from ._framework import register_model_binder as register_model_binder
from ._framework import register_model_check as register_model_check
from ._framework import register_module_locator as register_module_locator
from ._framework import register_path_finder as register_path_finder
from ._framework import register_stateful as register_stateful
from ._context import running_module as running_module
from ._groups import Group as Group
from ._groups import Step as Step
from ._groups import StreamWarning as StreamWarning
from ._groups import fetch_whole as fetch_whole
from ._groups import scan_groups as scan_groups
from ._groups import streams as streams
from ._model import ModelView as ModelView
from ._module_calls import place_scanned_layer as place_scanned_layer
from ._model import coerce_plan as coerce_plan
from ._model import plan_model as plan_model
from ._nested import block_size as block_size
from ._paths import CUSTOM_METHOD as CUSTOM_METHOD
from ._policy import jax_policy_entry as jax_policy_entry
from ._paths import INPUT_NAME as INPUT_NAME
from ._paths import ROOT_DISPLAY as ROOT_DISPLAY
from ._paths import SEP as SEP
from ._paths import ancestors as ancestors
from ._paths import display as display
from ._paths import in_subtree as in_subtree
from ._paths import join as join
from ._paths import nearest as nearest
from ._paths import qualify as qualify
from ._pattern import ROOT_PATTERN as ROOT_PATTERN
from ._pattern import path_matches as path_matches
from ._records import Tag as Tag
from ._resolve import BoundarySpec as BoundarySpec
from ._resolve import LayerGroup as LayerGroup
from ._resolve import layer_groups as layer_groups
from ._resolve import str_sequence as str_sequence
from ._framework import annotated_class as annotated_class
from ._framework import with_class as with_class
from ._targets import check_modules as check_modules
from ._targets import check_targets as check_targets
from ._targets import no_custom_error as no_custom_error

__all__ = [
    "BoundarySpec",
    "CUSTOM_METHOD",
    "CheckpointImpl",
    "CompiledBoundary",
    "EMITTED_POLICIES",
    "Framework",
    "Group",
    "INPUT_NAME",
    "LayerGroup",
    "MAPPING_KEYS",
    "ModelView",
    "ModuleLocator",
    "ROOT_DISPLAY",
    "ROOT_PATTERN",
    "SEP",
    "StatefulKind",
    "Step",
    "StreamWarning",
    "Tag",
    "ancestors",
    "annotated_class",
    "binding_of",
    "block_size",
    "call_module",
    "check_bool",
    "check_modules",
    "check_targets",
    "coerce_plan",
    "collect_tags",
    "compile_annotation",
    "compile_boundary",
    "current_module_path",
    "display",
    "effective_path",
    "fetch_whole",
    "in_subtree",
    "is_array",
    "is_float",
    "jax_policy_entry",
    "join",
    "layer_groups",
    "layer_scope",
    "module_scope",
    "nearest",
    "no_custom_error",
    "original_class",
    "path_matches",
    "place_scanned_layer",
    "plan_model",
    "qualify",
    "register_framework",
    "register_model_binder",
    "register_model_check",
    "register_module_locator",
    "register_path_finder",
    "register_stateful",
    "running_module",
    "scan_groups",
    "str_sequence",
    "streams",
    "with_class",
    "wrap_call",
]
