"""Known failures of JAX and XLA that a plan can walk into, seen while a boundary's body is traced
(each tag of a name the boundary keeps passes here): warned about before anything is compiled.

- On a TPU, the gradient of a ``checkpoint`` whose policy offloads a name, inside a ``scan`` and
  a ``vmap`` (either order), taken eagerly (no ``jax.jit`` around the differentiation), is wrong
  (jax 0.11.2, libtpu 0.0.48.1; exact under ``jax.jit``): :class:`EagerOffloadWarning`, whose
  fix is to jit the step.
- On a TPU, ``jax.checkpoint`` puts a ``reduce_precision`` on every saved or offloaded residual,
  which XLA:TPU cannot compile in float64: :class:`Float64ResidualWarning`, whose fix is float32
  or a boundary that saves nothing.

https://github.com/jax-remat-plan/jax-remat-plan/blob/main/docs/jax_behaviour.md#host-offload
measures both; ``tests/test_known_failures.py`` rebuilds them and says when a JAX release fixes them.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from ._compile import CompiledBoundary
from ._jaxcompat import trace_chain
from ._paths import display


class EagerOffloadWarning(UserWarning):
    """An offloading boundary under an eager gradient of ``vmap(scan(...))`` on a TPU, where XLA
    computes wrong gradients."""


class Float64ResidualWarning(UserWarning):
    """A float64 value a boundary keeps on a TPU, where XLA:TPU cannot compile the program."""


_MSG_EAGER = """\
module {path!r}: the plan offloads {name!r} inside a scan and a jax.vmap, differentiated eagerly
(jax.grad / jax.vjp with no jax.jit around them; a jit inside does not help) on a TPU. XLA computes
wrong gradients there (off by 40.6 in a 4-wide example on a v5e, jax 0.11.2, libtpu 0.0.48.1; the
same under jax.jit is exact): see {doc}. Fix: wrap the differentiation in jax.jit
(jax.jit(jax.grad(loss))), as a training step is; or save {name!r} on device instead."""

_MSG_FLOAT64 = """\
module {path!r}: the plan keeps {name!r} ({dtype}{shape}) on a TPU. jax.checkpoint puts a
reduce_precision on every value it saves or offloads, and XLA:TPU cannot compile one in float64
("UNIMPLEMENTED: While rewriting computation to not contain X64 element types"), with any saving
policy, plain JAX included: the compile that follows fails. Fix: compute in float32 (turn
jax_enable_x64 off or cast), or annotate the module 'recompute' (a boundary that saves nothing
compiles); see {doc}."""

_DOC = "https://github.com/jax-remat-plan/jax-remat-plan/blob/main/docs/jax_behaviour.md#host-offload"


def platform() -> str:
    """The platform the traced program runs on: JAX's default backend (``cpu``, ``gpu``, ``tpu``).
    A function of its own so that tests on a CPU can stand in for a TPU."""
    return jax.default_backend()


def eager_scan_under_vmap(chain: Sequence[str] | None) -> bool:
    """Whether a trace chain (:func:`~._jaxcompat.trace_chain`, innermost first) is the case
    measured wrong on a TPU: a ``scan`` and a ``vmap`` (in either order), differentiated (``grad``,
    ``vjp``), with no ``jit`` around the differentiation (a ``jit`` inside it does not help; the
    same under an outer ``jit``, or without the ``vmap`` or the ``scan``, is exact).

    >>> eager_scan_under_vmap(["checkpoint / remat", "scan", "vmap", "linearize"])
    True
    >>> eager_scan_under_vmap(["checkpoint / remat", "scan", "jit", "vmap", "linearize"])
    True
    >>> eager_scan_under_vmap(["checkpoint / remat", "scan", "vmap", "linearize", "jit"])
    False
    """
    if not chain or "scan" not in chain or "vmap" not in chain:
        return False
    ad = [i for i, k in enumerate(chain) if k in ("linearize", "jvp")]
    return bool(ad) and not any(k in ("jit", "pjit") for k in chain[ad[-1] + 1:])


def check_tag(boundary: CompiledBoundary | None, qualified: str, x: Any) -> None:
    """Warns where tagging ``x`` as ``qualified`` inside ``boundary`` (the innermost open one)
    walks into a known failure; nothing off a TPU or for a name the boundary does not keep."""
    if boundary is None:
        return
    spec = boundary.spec
    if qualified not in spec.save and qualified not in spec.offload:
        return
    if platform() != "tpu":
        return
    if qualified in spec.offload and eager_scan_under_vmap(trace_chain()):
        warnings.warn(_MSG_EAGER.format(path=display(boundary.path), name=qualified, doc=_DOC),
                      EagerOffloadWarning, stacklevel=3)
    for leaf in jax.tree_util.tree_leaves(x):
        dtype = getattr(leaf, "dtype", None)
        if dtype is not None and np.dtype(dtype) == np.float64:
            warnings.warn(_MSG_FLOAT64.format(path=display(boundary.path), name=qualified,
                                              dtype="float64", shape=list(np.shape(leaf)), doc=_DOC),
                          Float64ResidualWarning, stacklevel=3)
            return
