"""Verifying a plan's host placements in the program an accelerator's compiler makes.

:func:`remat_common.verify` checks what reverse-mode AD keeps against the plan in the traced
program, the same on every backend. Whether an offload really lands in host memory is decided
later, by the compiler: XLA:CPU drops every placement (offload is a no-op there), XLA:GPU and
XLA:TPU place values in host memory (memory space 5). :func:`verify_on` adds that check for a
named accelerator, from one compile of the function's backward pass, without the device
(``remat docs targets``). The runtime core never imports this module.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from ..._arrays import is_array
from ..._compile import CompiledPlan
from ..._compiler import compiler_change, compiler_identity
from ..._errors import VerificationError, sorted_list
from ..._paths import display
from ..._verify import Verification, verify
from ..accelerators._accelerators import Accelerator, parse_accelerator
from ..accelerators._compilers import compile_for
from ..accelerators._hlo import host_placements
from ..accelerators._units import fmt_bytes
from ._report import Report


_MSG_NOT_PLACED = """\
the plan offloads {what} but the program the {acc} compiler made from it places nothing in host
memory{why}: there the offload is a no-op and the values stay on the device. Fix: compile for an
accelerator whose compiler places host memory (a GPU or TPU: accelerator='h100', 'v5e:2x2'), or
keep the values on device ('save', 'dots_no_batch') or recompute them there."""

_MSG_UNPLANNED = """\
{n} instruction(s) of the program the {acc} compiler made write into host memory ({host}), but the
plan offloads nothing: something besides the plan moves values to host (a jax.checkpoint with an
offload policy inside the model, a device_put to a host memory kind). Fix: annotate that module
with an offload in the plan so it is verified, or remove the placement from the model."""


def offloads_asked(plan: CompiledPlan, host_names: frozenset[str], host_bytes: int = 0
                   ) -> str | None:
    """What the plan offloads, by module, described (``None``: nothing): the names it offloads
    that the traced backward pass keeps on host (``host_names``, ``host_bytes`` of residuals), and
    the matmul outputs of the boundaries that offload those."""
    parts = []
    for b in plan.boundaries:
        names = sorted(n.rpartition("/")[2] for n in b.spec.offload & host_names)
        if names:
            parts.append(f"{sorted_list(names)} of module {display(b.path)!r}")
        elif b.spec.kind == "offload_dots_no_batch":
            parts.append(f"the matmul outputs of module {display(b.path)!r}")
    if not parts:
        return None
    return "; ".join(parts) + (f" ({fmt_bytes(host_bytes)} of residuals, the whole batch)"
                               if host_bytes else "")


def placement_problems(asked: str | None, counts: Mapping[str, int], acc: str,
                       note: str = "") -> list[str]:
    """Problems of a compiled program's host placements (``counts``: :func:`host_placements`)
    against what the plan offloads (``asked``, :func:`offloads_asked`)."""
    to_host = counts.get("pinned_host", 0)
    if asked and not to_host:
        return [_MSG_NOT_PLACED.format(what=asked, acc=acc, why=note)]
    if not asked and to_host:
        return [_MSG_UNPLANNED.format(n=to_host, acc=acc, host=", ".join(
            f"{k}: {v}" for k, v in sorted(counts.items())))]
    return []


def _is_float(leaf: Any) -> bool:
    dtype = getattr(leaf, "dtype", None)
    return dtype is not None and jax.dtypes.issubdtype(dtype, jnp.inexact)


def backward_program(fun: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any],
                     batch_argnums: Sequence[int]
                     ) -> tuple[Callable[..., Any], tuple[Any, ...], list[bool]]:
    """``fun``'s forward and backward pass as one function of the array leaves of ``args`` and
    ``kwargs`` (w.r.t. the floating-point ones, as :func:`remat_common.saved_residuals`
    differentiates), those leaves, and which of them belong to a batch argument."""
    paths_leaves, tree = jax.tree_util.tree_flatten_with_path((args, dict(kwargs)))
    leaves = [leaf for _, leaf in paths_leaves]
    inputs = [i for i, leaf in enumerate(leaves)
              if is_array(leaf) or isinstance(leaf, jax.ShapeDtypeStruct)]
    diff = [i for i in inputs if _is_float(leaves[i])]
    batch = set(batch_argnums)
    flags = [bool(p) and getattr(p[0], "idx", None) == 0 and getattr(p[1], "idx", None) in batch
             for p in (paths_leaves[i][0] for i in inputs)]

    def step(*values: Any) -> Any:
        full = list(leaves)
        for i, v in zip(inputs, values):
            full[i] = v

        def g(*d: Any) -> Any:
            for i, v in zip(diff, d):
                full[i] = v
            a, k = jax.tree_util.tree_unflatten(tree, full)
            return fun(*a, **k)

        out, pull = jax.vjp(g, *(full[i] for i in diff))
        return pull(jax.tree_util.tree_map(jnp.ones_like, out))

    return step, tuple(leaves[i] for i in inputs), flags


def verify_on(fun: Callable[..., Any], *args: Any, plan: CompiledPlan,
              accelerator: str | Accelerator, mesh: str | Mapping[str, int] | None = None,
              strict: bool | None = None, batch_argnums: Sequence[int] | None = None,
              against: Report | str | Path | None = None, **kwargs: Any) -> Verification:
    """:func:`remat_common.verify`, and the plan's host placements checked in the program the
    accelerator's compiler makes of ``fun``'s backward pass (one compile, from shapes: no device).

    Problems besides :func:`~remat_common.verify`'s: an offload the plan asks for (names kept on
    host by the traced backward pass, or a boundary's matmul outputs) that the compiled program
    does not place in host memory; host placements the plan did not ask for. A note gives the
    placements found and the host memory per device.

    Args:
      fun, *args, **kwargs, plan, strict: as :func:`remat_common.verify` takes them (``strict``:
        raise :class:`VerificationError` on any problem, these included).
      accelerator: the compiler to check with (``h100``, ``v5e:2x2``, a GPU target-config file,
        ``local``: :func:`remat_common.measurement.parse_accelerator`).
      mesh: the accelerator's devices (``"fsdp=8"``; default data parallel over all of them).
      batch_argnums: which positional arguments are batches, split over the mesh (default: the
        last one).
      against: a report made before (a :class:`Report` or its JSON file), on another machine or
        compiler: a note says whether its figures came from the compiler used here (jax, jaxlib,
        libtpu or the CUDA plugin) and, where not, which; ``remat report CONFIG --check FILE``
        re-measures its memory figures (this compiles the backward pass only, not the step).

    Returns:
      A :class:`remat_common.Verification`.
    """
    acc = parse_accelerator(accelerator)
    v = verify(fun, *args, plan=plan, strict=False, **kwargs)
    strict = plan.resolution.plan.strict if strict is None else strict
    which = (len(args) - 1,) if batch_argnums is None else tuple(batch_argnums)
    step, leaves, flags = backward_program(fun, args, kwargs, which)
    tc = compile_for(step, leaves, acc, batch=flags, mesh=mesh)
    problems, notes = list(v.problems), list(v.notes)
    compiler = compiler_identity(None if acc.is_local else acc.platform)
    if against is not None:
        stored = against if isinstance(against, Report) else Report.load(against)
        change = compiler_change(stored.compiler, compiler)
        given = isinstance(against, Report)
        name, file = ("the report given", "FILE") if given else (str(against), str(against))
        notes.append(f"{name}: {change}: its memory figures may not hold here; re-measure them "
                     f"with remat report CONFIG --check {file}." if change else
                     f"{name}: its figures came from this compiler ({compiler.describe()}).")
    if tc.compiled is None:
        problems.append(f"the {acc.name} compiler refused the program, so its host placements "
                        f"were not checked: {tc.error}. Fix: a smaller batch, or more devices "
                        "(mesh).")
    else:
        counts = host_placements(tc.compiled.as_text())
        mem = tc.compiled.memory_analysis()
        host = getattr(mem, "host_temp_size_in_bytes", 0) or 0
        why = (" (XLA:CPU drops host placements)"
               if acc.is_local and jax.default_backend() == "cpu" else "")
        asked = offloads_asked(plan, v.report.names("host"), v.report.nbytes("host"))
        problems += placement_problems(asked, counts, acc.name, why)
        moved = ", ".join(f"{n} {'to host' if k == 'pinned_host' else 'back'}"
                          for k, n in sorted(counts.items(), reverse=True)) or "none"
        notes.append(f"host placements in the program compiled for {acc.name} by "
                     f"{compiler.describe()}: {moved}; host temp {fmt_bytes(host)} per device.")
        if tc.xla_remat:
            notes.append(f"the {acc.name} compiler rematerialized on its own: {tc.xla_remat}")
    if strict and problems:
        raise VerificationError("remat plan verification failed:\n- " + "\n- ".join(problems)
                                + "\n\nresiduals:\n" + v.report.table())
    return Verification(v.report, v.expected_device, v.expected_host, tuple(problems),
                        tuple(notes))
