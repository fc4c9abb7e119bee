"""Compilation: one policy object per boundary that the installed JAX honours, remat3 off and on."""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Any

import jax

from ._capabilities import Capabilities, capabilities
from ._errors import CapabilityError, PlanError, check_bool, sorted_list, type_error
from ._paths import path_key
from ._resolve import BoundarySpec, Resolution, alike_layers

if TYPE_CHECKING:
    from ._state import StatePlacement

_MSG_MEMORY_KIND = """\
module {path!r}: the plan offloads {names} from {src!r} to {dst!r}, but the {backend} backend's
devices have the memory kinds {kinds}.
Fix: set offload_src/offload_dst (plan defaults or the annotation) to kinds the devices have, or
use 'recompute' on this backend."""

#: Every policy the compiler can emit, by the name it is reported under. Nothing else is ever
#: produced: in particular never ``save_from_both_policies``, ``everything_saveable``, lambdas or
#: closures, which ``jax_remat3`` silently changes
#: (https://github.com/jax-remat-plan/jax-remat-plan/blob/main/docs/jax_behaviour.md#policies-remat3-changes-silently).
EMITTED_POLICIES = (
    "nothing_saveable",
    "dots_saveable",
    "dots_with_no_batch_dims_saveable",
    "SaveOnlyTheseNames",
    "SaveAndOffloadOnlyTheseNames",
    "save_only_these_names",
    "save_and_offload_only_these_names",
    "offload_dot_with_no_batch_dims",
)


@dataclasses.dataclass(frozen=True)
class CompiledBoundary:
    """A boundary ready for ``jax.checkpoint``: its spec, the policy object and its description."""

    spec: BoundarySpec
    policy: Any
    policy_name: str
    input_tag: str | None = None

    @property
    def path(self) -> str:
        return self.spec.path

    def describe(self) -> str:
        s = self.spec
        bits = [self.policy_name]
        if s.save:
            bits.append(f"save={sorted(s.save)}")
        if s.offload:
            bits.append(f"offload={sorted(s.offload)} {s.offload_src}->{s.offload_dst}")
        elif s.kind == "offload_dots_no_batch":
            bits.append(f"{s.offload_src}->{s.offload_dst}")
        return " ".join(bits)


# The 0.12 factories return fresh closures; cache them so one spec always gives one object
# (JAX caches traces on policy identity).
@functools.lru_cache(maxsize=None)
def _factory_save(names: frozenset[str]) -> Any:
    return jax.checkpoint_policies.save_only_these_names(*sorted(names))


@functools.lru_cache(maxsize=None)
def _factory_offload(save: frozenset[str], off: frozenset[str], src: str, dst: str) -> Any:
    return jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=sorted(save), names_which_can_be_offloaded=sorted(off),
        offload_src=src, offload_dst=dst,
    )


@functools.lru_cache(maxsize=None)
def _factory_offload_dots(src: str, dst: str) -> Any:
    return jax.checkpoint_policies.offload_dot_with_no_batch_dims(src, dst)


def check_memory_kinds(spec: BoundarySpec, caps: Capabilities) -> None:
    """Raises CapabilityError when an offload's memory kinds do not exist on the devices."""
    if not spec.offload and spec.kind != "offload_dots_no_batch":
        return
    missing = {spec.offload_src, spec.offload_dst} - set(caps.memory_kinds)
    if missing:
        what = sorted_list(spec.offload) if spec.offload else "its matmul outputs"
        raise CapabilityError(_MSG_MEMORY_KIND.format(
            path=spec.path, names=what, src=spec.offload_src,
            dst=spec.offload_dst, backend=caps.backend, kinds=sorted_list(caps.memory_kinds),
        ))


def compile_boundary(
    spec: BoundarySpec, caps: Capabilities | None = None, *, input_tag: str | None = None
) -> CompiledBoundary:
    """The JAX policy for one boundary.

    Name sets are merged into one object of a name-based class (``SaveOnlyTheseNames`` /
    ``SaveAndOffloadOnlyTheseNames`` on 0.11; the same-named factories where the classes are gone),
    which every JAX version honours with ``jax_remat3`` off and on.

    >>> from remat_common.adapter import BoundarySpec
    >>> b = compile_boundary(BoundarySpec("layers.0", "names", save=frozenset({"layers.0/h"})))
    >>> b.policy_name in ("SaveOnlyTheseNames", "save_only_these_names")  # 0.11.x, 0.12
    True
    """
    caps = caps or capabilities()
    cp = jax.checkpoint_policies
    if spec.kind in ("dots", "dots_no_batch", "offload_dots_no_batch"):
        if spec.save or spec.offload:
            raise PlanError(
                f"module {spec.path!r}: a {spec.kind!r} boundary cannot also keep named values "
                f"{sorted_list(spec.save | spec.offload)} (jax_remat3 drops one of the two). Fix: tag "
                "the matmul outputs with checkpoint_name and list them under 'save' instead."
            )
        if spec.kind == "offload_dots_no_batch":  # honoured on 0.11.0-0.12, remat3 off and on
            check_memory_kinds(spec, caps)
            return CompiledBoundary(spec, _factory_offload_dots(spec.offload_src, spec.offload_dst),
                                    "offload_dot_with_no_batch_dims", input_tag)
        name = "dots_saveable" if spec.kind == "dots" else "dots_with_no_batch_dims_saveable"
        return CompiledBoundary(spec, getattr(cp, name), name, input_tag)
    if spec.offload:
        check_memory_kinds(spec, caps)
        if caps.policy_classes:
            pol = cp.SaveAndOffloadOnlyTheseNames(
                names_which_can_be_saved=spec.save, names_which_can_be_offloaded=spec.offload,
                offload_src=spec.offload_src, offload_dst=spec.offload_dst,
            )
            return CompiledBoundary(spec, pol, "SaveAndOffloadOnlyTheseNames", input_tag)
        pol = _factory_offload(spec.save, spec.offload, spec.offload_src, spec.offload_dst)
        return CompiledBoundary(spec, pol, "save_and_offload_only_these_names", input_tag)
    if spec.save:
        if caps.policy_classes:
            return CompiledBoundary(spec, cp.SaveOnlyTheseNames(spec.save), "SaveOnlyTheseNames",
                                    input_tag)
        return CompiledBoundary(spec, _factory_save(spec.save), "save_only_these_names", input_tag)
    return CompiledBoundary(spec, cp.nothing_saveable, "nothing_saveable", input_tag)


@dataclasses.dataclass(frozen=True)
class CompiledPlan:
    """A resolution with one compiled policy per boundary."""

    resolution: Resolution
    boundaries: tuple[CompiledBoundary, ...]
    #: ``(layer, first)``: list layers that run under the path of the first layer the plan treats
    #: alike (``compile_plan(..., share_alike_layers=True)``; see ``alike_layers``).
    shared: tuple[tuple[str, str], ...] = ()
    #: Module paths whose modules define their own rules (``__remat_custom__``: they can be
    #: annotated ``"custom"``), as the adapter described the model (:func:`plan_model`).
    custom_paths: tuple[str, ...] = ()

    @property
    def state(self) -> StatePlacement:
        """Where the plan keeps the training state between steps (its ``state:``): what
        ``remat_common.state.jit_state_step`` and ``place_state`` take, and the measured step
        (``remat_common.measurement.with_state``) with them.

        >>> from remat_common import Plan, compile_plan, resolve
        >>> plan = Plan.from_mapping({"mlp": "recompute"}, state={"optimizer": "host"})
        >>> compile_plan(resolve(plan, ["", "mlp"])).state.on_host
        ('optimizer',)
        """
        return self.resolution.plan.state

    @functools.cached_property
    def _shared_map(self) -> dict[str, str]:
        return dict(self.shared)

    def shared_groups(self) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """``(first, layers)`` per group of shared list layers: the path they all run under and
        every layer of the group (the first included), in layer order."""
        groups: dict[str, list[str]] = {}
        for layer, first in self.shared:
            groups.setdefault(first, [first]).append(layer)
        return tuple((first, tuple(sorted(ls, key=path_key))) for first, ls in sorted(groups.items()))

    def shared_as(self, path: str) -> str | None:
        """The layer whose path ``path`` (a list layer) runs under, or None when it runs as itself."""
        return self._shared_map.get(path) if self.shared else None

    def canonical_path(self, path: str) -> str:
        """The path that the module at ``path`` runs as: inside a shared layer, the same relative
        path inside the first layer of its group (``layers.5.mlp`` -> ``layers.0.mlp``); any other
        path is itself. Shared layers inside shared layers map level by level, as
        ``call_module``'s nested :func:`layer_scope` rewrites do.

        >>> from remat_common import Plan, compile_plan, resolve
        >>> paths = ["layers"] + [f"layers.{i}{s}" for i in range(3) for s in ("", ".mlp")]
        >>> plan = compile_plan(resolve(Plan.from_mapping({"layers.*.mlp": "recompute"}), paths),
        ...                     share_alike_layers=True)
        >>> plan.canonical_path("layers.2.mlp"), plan.canonical_path("layers")
        ('layers.0.mlp', 'layers')
        """
        if not self.shared or not path:
            return path
        out = ""
        for seg in path.split("."):
            out = f"{out}.{seg}" if out else seg
            out = self._shared_map.get(out, out)
        return out

    def boundary(self, path: str) -> CompiledBoundary | None:
        for b in self.boundaries:
            if b.path == path:
                return b
        return None

    def input_tag(self, path: str) -> str | None:
        return self.resolution.input_tag(path)

    def describe(self) -> str:
        """Every boundary, one line each: its path, policy and what it keeps (the long form of
        the ``repr``)."""
        if not self.boundaries:
            return "(no remat boundaries: everything is saved)"
        return "\n".join(f"{b.path or '<root>'}: {b.describe()}" for b in self.boundaries)

    def __repr__(self) -> str:
        """One short line whatever the model's size: counts, the first boundaries, the plan's
        fingerprint (``describe()`` lists every boundary).

        >>> from remat_common import Plan, compile_plan, resolve
        >>> paths = [f"layers.{i}" for i in range(32)]
        >>> compile_plan(resolve(Plan.from_mapping({"layers.*": "recompute"}), paths))  # doctest: +ELLIPSIS
        CompiledPlan(32 boundaries over 33 modules: layers.0 nothing_saveable, layers.1 nothing_saveable, ... (+30 more); plan ...; .describe() lists them)
        """
        r = self.resolution
        shown = ", ".join(f"{b.path or '<root>'} {b.policy_name}" for b in self.boundaries[:2])
        more = len(self.boundaries) - 2
        rest = f", ... (+{more} more)" if more > 0 else ""
        return (f"CompiledPlan({len(self.boundaries)} boundaries over {len(r.paths)} modules"
                f"{': ' + shown if shown else ''}{rest}; plan {r.plan.fingerprint()}; "
                ".describe() lists them)")


def compile_plan(resolution: Resolution, caps: Capabilities | None = None, *,
                 share_alike_layers: bool = False) -> CompiledPlan:
    """Compiles every boundary of a resolution (capabilities probed once).

    With ``share_alike_layers``, list layers the plan treats alike (``alike_layers``) run under
    the path of the first of them: one boundary, one policy object and one set of tag names
    (``layers.0/h`` for every layer of the group, as in a scanned stack), so JAX traces and
    differentiates the layer body once instead of once per layer when the caller passes the same
    function for each layer (``call_module``). ``verify`` attributes their residuals to the first
    layer of the group.
    """
    if not isinstance(resolution, Resolution):
        raise type_error("compile_plan", "resolution", resolution, "a remat_common.Resolution",
                         "compile_plan(resolve(plan, module_paths)); adapters do this for you.")
    check_bool("compile_plan", "share_alike_layers", share_alike_layers)
    caps = caps or capabilities()
    shared = tuple(sorted(alike_layers(resolution).items())) if share_alike_layers else ()
    return CompiledPlan(resolution, tuple(
        compile_boundary(b, caps, input_tag=resolution.input_tag(b.path)) for b in resolution.boundaries
    ), shared)
