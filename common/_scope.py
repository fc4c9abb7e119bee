"""Path-qualified activation names: :func:`checkpoint_name` and the tag every adapter emits."""

from __future__ import annotations

from typing import Any, TypeVar

import jax
from jax.ad_checkpoint import checkpoint_name as _jax_checkpoint_name

from ._compile import CompiledBoundary
from ._context import current_module_path, open_boundary, running_module, tag_collectors
from ._errors import CapabilityError, PlanError, short, sorted_list
from ._hazards import check_tag
from ._jaxcompat import innermost_trace_is_vmap, remat3_drops_names_under_vmap
from ._paths import INPUT_NAME, SEP, display, qualify
from ._records import Tag
from ._resolve import RULE_NAME

T = TypeVar("T")

_MSG_VMAP_REMAT3 = """\
module {path!r}: this remat boundary keeps values by name ({names}) and runs under jax.vmap
with jax_remat3 on. jax {version} then silently ignores name-based policies: every named value
would be recomputed and every offload dropped (measured; per-example gradients, vmap(grad(...)),
are not affected).
Fix: differentiate inside the vmap (jax.vmap(jax.grad(loss))), or turn jax_remat3 off
(jax.config.update('jax_remat3', False)), or annotate this module 'recompute' or 'dots'."""


def check_vmap(boundary: CompiledBoundary) -> None:
    """Refuses a name-based boundary traced under vmap where JAX would ignore its policy
    (https://github.com/jax-remat-plan/jax-remat-plan/blob/main/docs/jax_behaviour.md#vmap-under-remat3)."""
    names = boundary.spec.save | boundary.spec.offload
    if names and remat3_drops_names_under_vmap() and innermost_trace_is_vmap():
        raise CapabilityError(_MSG_VMAP_REMAT3.format(
            path=boundary.path, names=sorted_list(names), version=jax.__version__))


def _check_batched_tag(qualified: str) -> None:
    boundary = open_boundary()
    if boundary is None or qualified not in boundary.spec.save | boundary.spec.offload:
        return
    check_vmap(boundary)


def _check_name(name: Any) -> str:
    # a plan cannot name ' h' (names there have no surrounding spaces) nor 'h*' (a '*' in a plan's
    # name is refused: the resolver's '*' stands for every name), and the reserved names are what
    # the core itself tags: a user's '__input__' would be offloaded with the module's input
    if (not isinstance(name, str) or not name or SEP in name or name != name.strip()
            or not name.isprintable() or name in (INPUT_NAME, RULE_NAME)):
        raise ValueError(
            f"remat_common.checkpoint_name: name must be a non-empty string without {SEP!r}, "
            f"surrounding spaces or control characters (the module path is added for you), and "
            f"not {INPUT_NAME!r} or {RULE_NAME!r} (the core's own tags), got {short(name)}. Fix: "
            "checkpoint_name(x, 'attn_out')."
        )
    if "*" in name:
        raise ValueError(
            f"remat_common.checkpoint_name: name {short(name)} contains '*', which no plan may "
            "name: a plan's names are matched exactly and a '*' in them is refused (it stands for "
            "every name), so nothing could keep or offload this value by name. Fix: a name "
            "without '*', checkpoint_name(x, 'attn_out')."
        )
    return name


def tag(x: T, qualified: str) -> T:
    """Tags every array leaf of ``x`` with an already qualified name."""
    collectors = tag_collectors()
    _check_batched_tag(qualified)
    check_tag(open_boundary(), qualified, x)  # known JAX/XLA failures on this platform

    def one(leaf: Any) -> Any:
        for c in collectors:
            c.append(Tag(qualified, current_module_path(), tuple(jax.numpy.shape(leaf)),
                         str(jax.numpy.result_type(leaf))))
        return _jax_checkpoint_name(leaf, qualified)

    return jax.tree_util.tree_map(one, x)


def checkpoint_name(x: T, name: str) -> T:
    """Tags ``x`` (an array or a pytree of arrays) for remat policies, qualified by module path.

    Inside a module run by an adapter the tag is ``<module path>/<name>`` (``layers.3.attn/attn_out``),
    so that a plan can treat two layers differently. Outside any module it is exactly
    ``jax.ad_checkpoint.checkpoint_name(x, name)``.

    Args:
      x: an array or pytree of arrays.
      name: the activation's name within its module, without ``/``.

    Returns:
      ``x``, unchanged in value.

    >>> import jax.numpy as jnp
    >>> checkpoint_name(jnp.ones(2), "h").shape
    (2,)
    """
    path, exact = running_module()
    name = _check_name(name)
    if not exact and path is not None:
        _check_unplaced(path, name)
    return tag(x, qualify(path, name))


_MSG_UNPLACED = """\
module {path!r}: checkpoint_name(x, {name!r}) runs in a submodule that {path!r} calls through a
framework transform (a copy of the submodule, e.g. nnx.vmap in model code), so its path is
unknown, and the boundary at {boundary!r} keeps {name!r} by path ({kept}).
Fix: name that submodule in the plan (any annotation, e.g. 'inherit'), so it carries its path."""


def _check_unplaced(path: str, name: str) -> None:
    """Refuses a tag whose module could not be placed when the open boundary keeps that name at a
    path below ``path``: qualified with ``path`` it would silently miss the plan."""
    boundary = open_boundary()
    if boundary is None:
        return
    below = sorted(q for q in boundary.spec.save | boundary.spec.offload
                   if q.endswith(SEP + name) and q != qualify(path, name)
                   and (not path or q.startswith(path + ".")))
    if below:
        raise PlanError(_MSG_UNPLACED.format(path=display(path), name=name,
                                             boundary=display(boundary.path),
                                             kept=sorted_list(below[:3])))
