"""Every use of private JAX and every JAX version predicate, in one place.

When a JAX release changes something below, this is the only file to read. Each helper says what
it works around and on which versions (measured; the section of
https://github.com/jax-remat-plan/jax-remat-plan/blob/main/docs/jax_behaviour.md
that each cites names the test that measures it). The rest of the core asks these helpers and
never imports ``jax._src`` or compares versions itself.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Sequence
from typing import Any, Final, Literal

import jax
from packaging.version import InvalidVersion, Version

from ._errors import CapabilityError

Location = Literal["device", "host", "recompute"]

#: The 0.11.x policy classes (gone in 0.12;
#: https://github.com/jax-remat-plan/jax-remat-plan/blob/main/docs/jax_behaviour.md#versions-and-surface).
POLICY_CLASSES: Final = ("SaveOnlyTheseNames", "SaveAnyNamesButThese", "SaveAndOffloadOnlyTheseNames")
#: The module JAX's checkpoint policies (the 0.11 classes, the 0.12 closures) are defined in.
POLICY_MODULE: Final = "jax._src.ad_checkpoint"


def backends_started() -> bool:
    """Whether JAX has started a backend in this process (unknown: assumed started), read without
    starting one: forking after a start is unsafe."""
    import sys

    bridge = sys.modules.get("jax._src.xla_bridge")
    return bridge is None or bool(getattr(bridge, "_backends", True))


# -- versions ---------------------------------------------------------------------------------------

def parse_version(version: str) -> Version:
    """A PEP 440 version (``packaging.version``): pre-releases sort before their release, local
    tags after it
    (https://github.com/jax-remat-plan/jax-remat-plan/blob/main/docs/jax_behaviour.md#versions-and-surface).

    >>> parse_version("0.11.2rc1") < parse_version("0.11.2") < parse_version("0.11.2+cuda12")
    True
    >>> parse_version("0.12.0.1").release
    (0, 12, 0, 1)
    """
    try:
        return Version(version)
    except InvalidVersion:
        raise ValueError(f"remat_common: {version!r} is not a PEP 440 version string") from None


def release(*parts: int) -> Version:
    """The final release ``parts`` as a :class:`~packaging.version.Version`: ``release(0, 11, 1)``."""
    return Version(".".join(map(str, parts)))


def jax_at_least(*parts: int, version: str | None = None) -> bool:
    """JAX ``version`` (default: the installed one) is release ``parts`` or newer (its
    pre-releases count as older)."""
    return parse_version(version or jax.__version__) >= release(*parts)


def is_jax_0110(version: str) -> bool:
    """jax 0.11.0 exactly (any local tag): the release with the remat3 policy bugs and the CPU CSE
    that merges recomputation back:
    https://github.com/jax-remat-plan/jax-remat-plan/blob/main/docs/jax_behaviour.md#policies-remat3-changes-silently,
    https://github.com/jax-remat-plan/jax-remat-plan/blob/main/docs/jax_behaviour.md#cse."""
    return parse_version(version).release[:3] == (0, 11, 0)


def cse_undoes_remat_on_cpu(version: str) -> bool:
    """XLA:CPU's CSE merges a recomputation back into the forward pass: jax 0.11.0 only
    (0.11.1+ and 0.12 keep it;
    https://github.com/jax-remat-plan/jax-remat-plan/blob/main/docs/jax_behaviour.md#cse)."""
    v = parse_version(version)
    return v.release[:2] == (0, 11) and v < release(0, 11, 1)


def cpu_temp_tracks_residuals(version: str) -> bool:
    """``memory_analysis().temp_size_in_bytes`` on CPU tracks saved activations (at realistic
    sizes): 0.11.1+ but not 0.11.0 (CSE) nor 0.12
    (https://github.com/jax-remat-plan/jax-remat-plan/blob/main/docs/jax_behaviour.md#measuring-on-cpu)."""
    return not (jax_at_least(0, 12, version=version) or cse_undoes_remat_on_cpu(version))


def policy_classes_removed(version: str) -> bool:
    """jax 0.12 removed the policy classes and ``jax.custom_remat``
    (https://github.com/jax-remat-plan/jax-remat-plan/blob/main/docs/jax_behaviour.md#versions-and-surface)."""
    return jax_at_least(0, 12, version=version)


# -- what the installed JAX has and what is on now -------------------------------------------------

def remat3_on() -> bool:
    """The ``jax_remat3`` flag now (read, never set: off by default on every version)."""
    return bool(jax.config.jax_remat3)


def has_custom_remat() -> bool:
    """``jax.custom_remat`` exists: 0.11.x only
    (https://github.com/jax-remat-plan/jax-remat-plan/blob/main/docs/jax_behaviour.md#custom_remat)."""
    return hasattr(jax, "custom_remat")


def custom_remat_runs() -> bool:
    """``jax.custom_remat``'s forward rule really runs: it exists and remat3 is on (with remat3
    off it is silently recomputed;
    https://github.com/jax-remat-plan/jax-remat-plan/blob/main/docs/jax_behaviour.md#custom_remat)."""
    return has_custom_remat() and remat3_on()


def has_policy_classes() -> bool:
    """The name-based policy classes exist (0.11.x; 0.12 has only the factory functions)."""
    cp = jax.checkpoint_policies
    return all(hasattr(cp, n) for n in POLICY_CLASSES)


def remat3_drops_names_under_vmap() -> bool:
    """jax 0.11.x with remat3 on ignores name-based policies under vmap inside differentiation
    (measured on 0.11.0 and 0.11.2; 0.12 honours them;
    https://github.com/jax-remat-plan/jax-remat-plan/blob/main/docs/jax_behaviour.md#vmap-under-remat3)."""
    return remat3_on() and not jax_at_least(0, 12)


def local_remat3_off() -> contextlib.AbstractContextManager[Any]:
    """``jax_remat3`` off for one block, in a thread-local scope (``jax._src.config.remat3`` is a
    context-managed state, part of the trace context): the global flag is left as the user set it.
    Used on jax 0.11.x around name-keeping boundaries traced under vmap
    (https://github.com/jax-remat-plan/jax-remat-plan/blob/main/docs/jax_behaviour.md#vmap-under-remat3)."""
    from jax._src import config as jax_config

    return jax_config.remat3(False)  # type: ignore[no-any-return]


_FRESH = jax.make_user_context(None) if hasattr(jax, "make_user_context") else None
_FRESH_COUNT = itertools.count()


def fresh_trace() -> contextlib.AbstractContextManager[Any]:
    """A block in which ``jax.jit`` misses its trace cache (a new ``jax.make_user_context`` value
    per block), so the Python of every jitted function called inside runs again: what ``verify``
    needs to see which module calls and boundaries the traced function really runs. A no-op where
    JAX has no user contexts."""
    if _FRESH is None:
        return contextlib.nullcontext()
    return _FRESH(next(_FRESH_COUNT))  # type: ignore[no-any-return]


# -- the trace stack (private; every supported version keeps it linked through jit/scan) -----------

def trace_stack_readable() -> bool:
    """Whether the private trace context that :func:`nearest_ad_trace` and
    :func:`innermost_trace_is_vmap` read exists in the installed JAX. Where it does not, they
    cannot see a ``vmap``: callers that need to know (0.11.x with remat3 on) refuse instead."""
    try:
        from jax._src import core

        core.trace_ctx.trace  # noqa: B018 - the probe is the attribute access
        return True
    except (ImportError, AttributeError):  # pragma: no cover - depends on the installed JAX
        return False


_MSG_UNREADABLE = """\
module {path!r}: this {what} must know whether it runs under jax.vmap (jax {version} with
jax_remat3 on drops name-based policies there), but this JAX's private trace context cannot be
read, so the answer is unknown and the plan could be silently dropped.
Fix: turn jax_remat3 off (jax.config.update('jax_remat3', False)), or annotate it 'recompute'."""


def under_vmap(path: str | None, what: str) -> bool:
    """Whether a ``vmap`` runs inside the differentiation around this call (through jit and scan);
    a :class:`CapabilityError` where the installed JAX's trace context cannot be read."""
    if not trace_stack_readable():
        raise CapabilityError(_MSG_UNREADABLE.format(path=path or "", what=what,
                                                     version=jax.__version__))
    return nearest_ad_trace() == "vmap"


def innermost_trace_is_vmap() -> bool:
    """The trace that will process the next primitive is a vmap (batching) trace: ``vmap`` inside
    differentiation (``grad(vmap(f))``), where 0.11.x remat3 drops name policies. False when the
    private trace context cannot be read."""
    try:
        from jax._src import core
        from jax._src.interpreters.batching import BatchTrace

        return isinstance(core.trace_ctx.trace, BatchTrace)
    except (ImportError, AttributeError):  # pragma: no cover - depends on the installed JAX
        return False


def nearest_ad_trace() -> str | None:
    """The nearest transformation around this call that matters to a rule set: ``vmap``, ``jvp``
    (forward mode), ``linearize`` (forward mode, transposable) or ``vjp`` (``grad``, ``vjp``,
    ``jacrev``). None when none is active or the private trace stack cannot be read.

    Trace classes are matched by *name* (``BatchTrace``, ``JVPTrace``, ``LinearizeTrace``): their
    modules moved between 0.11.0 and 0.12, the names did not.
    """
    try:
        from jax._src import core

        t = core.trace_ctx.trace
    except Exception:  # noqa: BLE001 - private API; the message-based fallbacks still apply
        return None
    for _ in range(256):
        if t is None:
            return None
        name = type(t).__name__
        if name == "BatchTrace":
            return "vmap"
        if name == "JVPTrace":
            return "jvp"
        if name == "LinearizeTrace":
            return "vjp" if getattr(t, "is_vjp", True) else "linearize"
        t = getattr(t, "parent_trace", None)
    return None


def trace_chain() -> list[str] | None:
    """The transformations around this call, innermost first: ``vmap``, ``jvp``, ``linearize``
    (``grad``, ``vjp``), and for each jaxpr trace what it traces for (``jit``, ``scan``,
    ``checkpoint / remat``, ``while_loop``...: JAX's ``DebugInfo.traced_for``; ``"jaxpr"`` where
    unnamed). None when the private trace stack cannot be read. Eager differentiation has no
    ``jit`` in it (https://github.com/jax-remat-plan/jax-remat-plan/blob/main/docs/jax_behaviour.md#host-offload)."""
    names = {"BatchTrace": "vmap", "JVPTrace": "jvp", "LinearizeTrace": "linearize"}
    try:
        from jax._src import core

        t, out = core.trace_ctx.trace, list[str]()
        for _ in range(256):
            if t is None or type(t).__name__ == "EvalTrace":
                return out
            kind = names.get(type(t).__name__)
            if kind is None:
                info = getattr(t, "debug_info", None) or getattr(getattr(t, "frame", None),
                                                                "debug_info", None)
                kind = str(getattr(info, "traced_for", None) or "jaxpr")
            out.append(kind)
            t = getattr(t, "parent_trace", None)
    except Exception:  # noqa: BLE001 - private API: say "unknown" rather than guess
        return None
    return None


def open_trace_equations() -> list[Any] | None:
    """The equations recorded so far by the innermost jaxpr trace open around this call (the body
    of the ``jax.checkpoint`` being traced), through any vmap or AD traces above it; None when the
    private trace stack cannot be read (then the caller must not conclude anything)."""
    try:
        from jax._src import core

        t = core.trace_ctx.trace
        for _ in range(256):
            if t is None:
                return None
            frame = getattr(t, "frame", None)
            eqns = getattr(frame, "tracing_eqns", None)
            if isinstance(eqns, list):
                out = [e() if callable(e) and not hasattr(e, "primitive") else e for e in eqns]
                return [e for e in out if e is not None and hasattr(e, "primitive")]
            t = getattr(t, "parent_trace", None)
    except Exception:  # noqa: BLE001 - private API: say "unknown" rather than guess
        return None
    return None


def is_differentiated(x: Any) -> bool:
    """``x`` is a JVP or linearize tracer (it is being differentiated). The tracer classes are
    private; ``LinearizeTracer`` is missing on some versions."""
    try:
        from jax._src.interpreters import ad

        kinds = tuple(k for k in (getattr(ad, "JVPTracer", None), getattr(ad, "LinearizeTracer", None))
                      if k is not None)
    except ImportError:  # pragma: no cover - depends on the installed JAX
        return False
    return bool(kinds) and isinstance(x, kinds)


# -- errors JAX raises that only their text identifies ---------------------------------------------
# No exception type or attribute tells these apart, so the message text is read (tested on 0.11.0,
# 0.11.2 and 0.12.0.1 by tests/test_custom_guards.py, which runs on every version).

def is_custom_remat_vmap_error(e: BaseException) -> bool:
    """``jax.custom_remat`` has no batching rule: ``NotImplementedError`` naming ``CustomRemat``
    and ``vmap`` (0.11.x;
    https://github.com/jax-remat-plan/jax-remat-plan/blob/main/docs/jax_behaviour.md#custom_remat)."""
    return isinstance(e, NotImplementedError) and "CustomRemat" in str(e) and "vmap" in str(e)


def is_custom_vjp_forward_mode_error(e: BaseException) -> bool:
    """Forward-mode AD (``jvp``, ``linearize``) of a ``custom_vjp``: ``TypeError`` naming
    ``forward-mode autodiff`` and ``custom_vjp`` (every version)."""
    return isinstance(e, TypeError) and "forward-mode autodiff" in str(e) and "custom_vjp" in str(e)


# -- policies and jaxprs ---------------------------------------------------------------------------

def policy_location(policy: Any, names: Sequence[str]) -> tuple[Location, str | None, str | None]:
    """Asks a JAX policy object where named values go, as JAX itself does for ``checkpoint_name``
    (calls it with the private ``name_p`` primitive). An offload answer carries ``src``/``dst``;
    a ``Saveable`` answer is recognised by its type name (its class is private on 0.11.x)."""
    if policy is None:
        return "recompute", None, None
    from jax._src.ad_checkpoint import name_p

    for n in names:
        case = policy(name_p, name=n)
        if isinstance(case, bool):
            if case:
                return "device", None, None
            continue
        if hasattr(case, "dst") and hasattr(case, "src"):
            return "host", str(case.src), str(case.dst)
        if type(case).__name__ == "SaveableType":
            return "device", None, None
    return "recompute", None, None


def checkpoint_name_of(eqn: Any) -> str | None:
    """The ``checkpoint_name`` of a jaxpr equation, else None: the ``name`` primitive, or (remat3,
    0.11.x) a hi-primitive whose ``_prim`` param is a ``CheckpointName*`` object (matched by type
    name: the class is private and has no stable home)."""
    if eqn.primitive.name == "name" and "name" in eqn.params:
        return str(eqn.params["name"])
    prim = eqn.params.get("_prim")
    if prim is not None and type(prim).__name__.startswith("CheckpointName"):
        params = getattr(prim, "params", None)
        name = params.get("name") if isinstance(params, dict) else getattr(prim, "name", None)
        return None if name is None else str(name)
    return None


def is_checkpoint_name_object(obj: Any) -> bool:
    """A remat3 ``CheckpointName`` hi-primitive object with a ``params`` dict (by type name)."""
    return type(obj).__name__ == "CheckpointName" and isinstance(getattr(obj, "params", None), dict)


def is_literal(v: Any) -> bool:
    """A jaxpr ``Literal`` (by type name; literals are unhashable on some versions)."""
    return type(v).__name__ == "Literal"


def scan_split(eqn: Any) -> tuple[int, int] | None:
    """``(number of consts, number of carries)`` of a scan equation: ``num_consts``/``num_carry``
    params, or (jax 0.11.2+) the flat-tree ``ft_in`` of ``(consts, carry, xs)``; ``None`` when
    neither is there."""
    p = eqn.params
    if "num_consts" in p and "num_carry" in p:
        return int(p["num_consts"]), int(p["num_carry"])
    try:
        consts, carry, _ = p["ft_in"].unpack()
        return len(list(consts.vals)), len(list(carry.vals))
    except Exception:  # noqa: BLE001 - an unknown layout is reported as opaque by the caller
        return None


def summarize_source(eqn: Any) -> str:
    """Where an equation was traced, for messages (private ``source_info_util``)."""
    try:
        from jax._src import source_info_util

        return str(source_info_util.summarize(eqn.source_info))
    except Exception:  # noqa: BLE001 - a location is a courtesy in messages
        return "<unknown source>"


def name_stack_of(eqn: Any) -> str:
    """The name stack an equation was traced under (``jvp(blocks.0.mlp)/...``: the named scopes
    open then), ``""`` where the installed JAX keeps none."""
    try:
        return str(eqn.source_info.name_stack)
    except Exception:  # noqa: BLE001 - a module is a courtesy: the residual stands without it
        return ""


def hlo_cost_functions() -> tuple[Callable[[str], Any], Callable[[Any], dict[str, Any]]] | None:
    """``(parse HLO text, cost analysis of a module)``, looked up where jaxlib 0.11/0.12 keep them
    (``jaxlib._hlo`` or the private ``jax._src.lib.xla_client._xla``); None when neither has them."""
    parse = None
    try:
        import jaxlib._hlo as hlo  # type: ignore[import-not-found,unused-ignore]

        parse = getattr(hlo, "hlo_module_from_text", None)
    except ImportError:  # pragma: no cover - depends on jaxlib
        pass
    try:
        from jax._src.lib import xla_client

        xla = xla_client._xla
        parse = parse or getattr(xla, "hlo_module_from_text", None)
        cost = getattr(xla, "hlo_module_cost_analysis", None)
    except Exception:  # noqa: BLE001 - pragma: no cover - depends on jaxlib
        return None
    if parse is None or cost is None:
        return None
    # XLA:CPU's cost analysis, whatever the default backend: it costs any platform's HLO (a
    # target's too), and a TPU reached through the PJRT C API has none ("does not support
    # GetHloCostAnalysis", seen on a TPU v5e host with libtpu 0.0.42.1).
    try:
        client = jax.devices("cpu")[0].client
    except RuntimeError:  # pragma: no cover - a jaxlib without its CPU backend
        client = jax.devices()[0].client
    return parse, lambda module: dict(cost(client, module))


# -- sharding propagation of an exported program -----------------------------------------------------

#: The Shardy pass pipeline XLA runs before partitioning (jaxlib registers it with its MLIR bindings).
SHARDY_PIPELINE: Final = "builtin.module(sdy-propagation-pipeline)"


def device_placements(mlir_text: str) -> tuple[str, list[dict[str, Any]]] | None:
    """The ``annotate_device_placement`` ops of an exported (StableHLO) module after Shardy's
    propagation: ``(propagated module text, [{kind, shape, dtype, sharding, operand_sharding}])``,
    each sharding the attribute's text (``None`` where the value has none). ``None`` when this
    jaxlib has no MLIR bindings or no Shardy pipeline (the private ``jax._src.lib.mlir``).

    The exported module is what JAX hands XLA before propagation: there the placement ops carry no
    sharding at all, so whether an offloaded residual keeps the sharding of the value it moves is
    only visible once Shardy has propagated the inputs' shardings, as XLA's partitioner will.
    """
    try:
        from jax._src.interpreters import mlir as jmlir
        from jax._src.lib.mlir import ir, passmanager
    except ImportError:  # pragma: no cover - depends on jaxlib
        return None
    with jmlir.make_ir_context():
        module = ir.Module.parse(mlir_text)
        try:
            passmanager.PassManager.parse(SHARDY_PIPELINE).run(module.operation)
        except Exception:  # noqa: BLE001 - pragma: no cover - a jaxlib without the pipeline
            return None
        found: list[dict[str, Any]] = []

        def visit(op: Any) -> Any:
            if op.name == "stablehlo.custom_call" and "annotate_device_placement" in str(
                    op.attributes["call_target_name"]):
                attrs = str(op.attributes["mhlo.frontend_attributes"]) \
                    if "mhlo.frontend_attributes" in op.attributes else ""
                kind = attrs.split('_xla_buffer_placement = "', 1)[-1].split('"', 1)[0]
                value = ir.RankedTensorType(op.results[0].type)
                found.append({
                    "kind": kind, "shape": tuple(value.shape), "dtype": str(value.element_type),
                    "sharding": _sharding_of(op, 0, ir),
                    "operand_sharding": _value_sharding(op.operands[0], ir),
                })
            return ir.WalkResult.ADVANCE

        module.operation.walk(visit)
        return str(module), found


def _sharding_of(op: Any, index: int, ir: Any) -> str | None:
    """The sharding of result ``index`` of ``op`` (``sdy.sharding`` holds one per result)."""
    if "sdy.sharding" not in op.attributes:
        return None
    text = str(op.attributes["sdy.sharding"])
    if text.startswith("#sdy.sharding_per_value<["):
        parts = split_top(text[len("#sdy.sharding_per_value<["):-2])
        return parts[index] if index < len(parts) else None
    return text


def _value_sharding(value: Any, ir: Any) -> str | None:
    """The sharding of an SSA value: its defining op's, or the function argument's attribute, or
    for a block argument of a loop/region op the op's sharding of the matching result."""
    owner = value.owner
    if isinstance(owner, ir.Operation) or hasattr(owner, "attributes"):
        op = owner.operation if hasattr(owner, "operation") else owner
        if op.name in ("sdy.reshard", "sdy.sharding_constraint"):
            # the value before the reshard is the one computed; the reshard's target otherwise
            before = _value_sharding(op.operands[0], ir)
            return before if before is not None else str(op.attributes["sharding"])
        return _sharding_of(op, ir.OpResult(value).result_number, ir)
    arg = ir.BlockArgument(value)
    parent = owner.owner  # the Block's parent op
    parent = parent.operation if hasattr(parent, "operation") else parent
    if parent.name == "func.func":
        arg_attrs = parent.attributes["arg_attrs"] if "arg_attrs" in parent.attributes else None
        if arg_attrs is None:
            return None
        d = ir.DictAttr(ir.ArrayAttr(arg_attrs)[arg.arg_number])
        return str(d["sdy.sharding"]) if "sdy.sharding" in d else None
    return _sharding_of(parent, arg.arg_number, ir)


def split_top(text: str) -> list[str]:
    """``<@m, [...]>, <@m, [...]>`` (or an HLO tuple shape's elements) split at the top-level
    commas."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "<[{(":
            depth += 1
        elif ch in ">]})":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    if text[start:].strip():
        parts.append(text[start:].strip())
    return parts
