"""Measuring what a plan costs: the target a model provides, and (later) the report."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from ._compile import CompiledPlan


@dataclasses.dataclass(frozen=True)
class MeasureTarget:
    """One training step under one plan, as a model provides it for measurement.

    Attributes:
      loss_fn: ``loss_fn(*loss_args) -> scalar``; its residuals under reverse-mode AD (w.r.t. all
        its array arguments) are what the plan changes.
      loss_args: the arguments of ``loss_fn``.
      step_fn: one training step (forward, backward, update), jit-able: ``step_fn(*step_args)``.
      step_args: the arguments of ``step_fn``.
      plan: the compiled plan the model was annotated with (``None`` for the un-annotated model).
    """

    loss_fn: Callable[..., Any]
    loss_args: tuple[Any, ...]
    step_fn: Callable[..., Any]
    step_args: tuple[Any, ...]
    plan: CompiledPlan | None = None
