"""√n nested checkpointing of stacked layers: the ``nested`` key of a stack's annotation.

``{"remat": "recompute", "nested": 4}`` on a stack runs its ``L`` layers as a scan over blocks of
4 layers that keeps only each block's input (the carry); the backward pass runs one block again at
a time, each layer under its own annotation, holding what the layers' own plan keeps for ``k``
layers (:func:`remat_common.adapter.scan_groups` runs it, every group of the stack under one
``custom_vjp`` with one gradient of the stack). The forward pass keeps ``ceil(L / k)`` carries. ``"sqrt"`` picks the ``k`` that minimises
``ceil(L / k) + k`` (``k = √L`` when ``L`` is a square). See Chen et al. 2016, "Training Deep Nets
with Sublinear Memory Cost", and JAX's gradient-checkpointing guide
(https://docs.jax.dev/en/latest/gradient-checkpointing.html).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any, Final

import jax

from ._errors import AnnotationError, PlanError, short, where

NESTED_KEY: Final = "nested"
SQRT: Final = "sqrt"

#: A parsed ``nested`` value: a block size (≥ 2) or ``"sqrt"``.
NestedSpec = int | str

_MSG_BAD = """\
{where}nested: {value} in {whole} is not a block size. It is a whole number of layers per
block, at least 2 (1 would checkpoint every layer twice), or the string 'sqrt' (a block size near
the square root of the stack's depth).{hint} Fix: write nested: 4 or nested: sqrt, or drop
'nested' for one scan over the layers."""

_MSG_NOT_STACK = """\
{where}nested: {value} on {path!r}, which is not a stack of layers: nesting splits the scan over
a stack's layers into blocks. Stacks of this model: {stacks}.
Fix: put the rule on the stack itself (e.g. {example!r}: {{remat: recompute, nested: {value}}}),
or declare {path!r} a stack (annotate(..., stacks=[...]) / __remat_stacks__ / Stacked)."""

_MSG_TOO_BIG = """\
{where}nested: {value} on stack {path!r} of {n} layers: a block is larger than the stack.
Fix: a block size from 2 to {n}, or nested: sqrt (here {sqrt})."""


def parse_nested(value: Any, whole: Any, *, path: str | None = None,
                 source: str | None = None) -> NestedSpec:
    """The block size of a ``nested`` value, or :class:`AnnotationError` naming the fix.

    >>> parse_nested(4, {}), parse_nested("sqrt", {})
    (4, 'sqrt')
    """
    if isinstance(value, str) and value == SQRT:
        return SQRT
    if isinstance(value, int) and not isinstance(value, bool) and value >= 2:
        return value
    hint = ""
    if isinstance(value, bool):
        hint = " A boolean is not a size (YAML reads yes/no/on/off/true/false as booleans)."
    elif isinstance(value, str) and value.strip().isdigit():
        hint = f" {value!r} is a string: write the number unquoted."
    raise AnnotationError(_MSG_BAD.format(where=where(path, source), value=short(value),
                                          whole=short(whole), hint=hint))


def sqrt_block(num_layers: int) -> int:
    """The block size ``k`` that minimises ``ceil(L / k) + k`` (carries kept + layers recomputed
    at once), the one nearest ``√L`` on ties.

    >>> [sqrt_block(n) for n in (1, 2, 10, 16, 64, 100)]
    [1, 1, 3, 4, 8, 10]
    """
    n = max(int(num_layers), 1)
    return min(range(1, n + 1), key=lambda k: (-(-n // k) + k, abs(k - math.sqrt(n)), k))


def block_size(spec: NestedSpec, num_layers: int) -> int:
    """The layers per block for a stack (or layer group) of ``num_layers`` layers."""
    if spec == SQRT:
        return sqrt_block(num_layers)
    return min(int(spec), max(num_layers, 1))


def check_nested(spec: NestedSpec, path: str, num_layers: int, source: str | None) -> None:
    """Refuses a block size larger than the stack (:class:`PlanError`)."""
    if isinstance(spec, int) and spec > num_layers:
        raise PlanError(_MSG_TOO_BIG.format(where=where(path, source), value=spec, path=path,
                                            n=num_layers, sqrt=sqrt_block(num_layers)))


def not_a_stack_error(value: NestedSpec, path: str, stacks: list[str],
                      source: str | None) -> PlanError:
    example = stacks[0] if stacks else "layers"
    listed = ", ".join(repr(s) for s in sorted(stacks)[:8]) if stacks else "(none declared)"
    return PlanError(_MSG_NOT_STACK.format(where=where(path, source), value=value, path=path,
                                           stacks=listed, example=example))


_MSG_HOST = """\
stack {stack!r} is nested (nested: {spec}) and {what}. A nested block keeps only its input
between the forward and the backward pass; {why}
Fix: {fix}"""


def check_nested_boundaries(stack: str, spec: NestedSpec,
                            boundaries: Iterable[tuple[str, frozenset[str], frozenset[str]]],
                            tagged: Iterable[tuple[str, str]]) -> None:
    """Refuses what a nested stack cannot honour exactly (:class:`PlanError`).

    ``boundaries`` are ``(path, save, offload)`` with qualified names; ``tagged`` are the module
    paths whose inputs a plan offloads. Inside a block, an offload would happen only while the
    block is recomputed in the backward pass (the values never cross the forward/backward gap on
    host); a boundary outside the stack that keeps names made inside it would need the block to
    keep them, which nested checkpoints do differently across JAX versions.
    """
    below = stack + "." if stack else ""

    def inside(name_or_path: str) -> bool:
        return name_or_path.startswith(below) if below else True

    for path, _ in tagged:
        if inside(path):
            raise PlanError(_MSG_HOST.format(
                stack=stack, spec=spec, what=f"the plan offloads the inputs of {path!r}",
                why="inside it an offload would only happen while the block is recomputed.",
                fix="drop 'nested' (offloading alone already keeps the layer inputs off device), "
                    "or use 'recompute' / {save: [...]} for the layers."))
    for path, save, offload in boundaries:
        if inside(path) and offload:
            raise PlanError(_MSG_HOST.format(
                stack=stack, spec=spec, what=f"the boundary at {path!r} offloads "
                f"{sorted(offload)[:3]}",
                why="inside it an offload would only happen while the block is recomputed.",
                fix="keep those names with 'save' inside the block, or drop 'nested'."))
        if not inside(path):
            held = sorted(n for n in save | offload if inside(n))
            if held:
                raise PlanError(_MSG_HOST.format(
                    stack=stack, spec=spec, what=f"the boundary at {path or '<root>'!r} keeps "
                    f"{held[:3]} from inside it",
                    why="a boundary outside the stack cannot reach values made inside a block.",
                    fix=f"name them in the layers' own annotation ({stack}: {{save: [...], "
                        f"nested: {spec}}}), or drop 'nested'."))
