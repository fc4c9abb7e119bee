"""``remat doctor`` and :func:`manifest`: what is installed, what is active, and what to do about it.

JAX 0.11 moved the floors (Python >= 3.12, NumPy >= 2.1, SciPy >= 1.15) and changed which
rematerialization machinery runs depending on ``jax_remat3``; two jobs that both "run JAX 0.11"
can behave differently. :func:`diagnose` turns the capability record of the core into problems
with a fix each, and :func:`manifest` records the facts (plus a plan's fingerprint) as JSON.
"""

from __future__ import annotations

import dataclasses
import os
import platform
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, Literal

import jax

from ..._capabilities import Capabilities, capabilities, distribution_version
from ..._compiler import compiler_identity
from ..._jaxcompat import is_jax_0110, parse_version, policy_classes_removed, release
from ..._compile import CompiledPlan
from ..._errors import sorted_list
from ..._model import PlanLike
from ..._plan import Plan
from ..._resolve import Resolution
from ..._residuals import residuals_readable
from ..._version import __version__

Severity = Literal["error", "warning", "note"]
Version = tuple[int, ...]

#: Minimum versions JAX 0.11 itself requires (hard floors: an unmet one is an error).
FLOORS: Final[Mapping[str, Version]] = {"python": (3, 12), "numpy": (2, 1), "scipy": (1, 15)}
#: Supported JAX range, as in pyproject.toml: ``[low, high)``.
JAX_RANGE: Final[tuple[Version, Version]] = ((0, 11, 0), (0, 13))
#: Optional packages: distribution -> (supported range ``[low, high)``, the extra that installs it).
OPTIONAL: Final[Mapping[str, tuple[Version, Version, str]]] = {
    "flax": ((0, 12, 8), (0, 13), "flax"),
    "equinox": ((0, 13, 8), (0, 14), "equinox"),
    "optax": ((0, 2, 8), (0, 3), "examples"),
    "orbax-checkpoint": ((0, 12, 8), (0, 13), "examples"),
    "rich": ((13,), (16,), "report"),
    "matplotlib": ((3, 9), (4,), "report"),
}
#: The distributions whose versions are reported, in report order.
DISTRIBUTIONS: Final = ("jax", "jaxlib", "numpy", "scipy", "packaging", "PyYAML", "flax", "equinox",
                        "optax", "orbax-checkpoint", "rich", "matplotlib")
#: JAX configuration values that change what a training step computes or keeps.
JAX_CONFIG: Final = ("jax_remat3", "jax_enable_x64", "jax_default_matmul_precision",
                     "jax_numpy_dtype_promotion")
#: Environment variables that change what JAX compiles or where it runs.
ENV_VARS: Final = ("JAX_PLATFORMS", "JAX_REMAT3", "JAX_ENABLE_X64", "XLA_FLAGS",
                   "XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_MEM_FRACTION",
                   "TPU_LIBRARY_PATH", "LIBTPU_INIT_ARGS")

_SET_REMAT3 = ("call jax.config.update('jax_remat3', True) at program start, before anything is "
               "traced, or set JAX_REMAT3=1 in the environment")


@dataclasses.dataclass(frozen=True)
class Feature:
    """A capability that ``remat doctor --require NAME`` can insist on."""

    name: str
    meaning: str
    available: Callable[[Capabilities], bool]
    fix: Callable[[Capabilities], str]


def _fix_custom_remat(c: Capabilities) -> str:
    if not c.custom_remat:
        return (f"jax.custom_remat exists only in JAX 0.11.x (installed: {c.jax}); install "
                "jax>=0.11.1,<0.12 (0.11.2 recommended), or let 'custom' rule sets take the "
                "portable custom_vjp path (impl='auto').")
    return f"{_SET_REMAT3}; with remat3 off JAX never calls the forward rule."


def _fix_offload(c: Capabilities) -> str:
    return (f"the {c.backend} backend's devices have the memory kinds "
            f"{sorted_list(c.memory_kinds) or '(none reported)'}; run on a backend with "
            "'pinned_host' (GPU, TPU, recent CPU jaxlib), or annotate 'recompute' instead of "
            "'offload'.")


def _fix_offload_placed(c: Capabilities) -> str:
    return (f"offloaded values stay in place on the {c.backend} backend (the CPU compiler drops "
            "the placement); run on GPU or TPU. On CPU, verify an offload plan through "
            "jax.export(..., platforms=['cuda']) instead.")


#: Every feature ``--require`` accepts, by name.
FEATURES: Final[Mapping[str, Feature]] = {f.name: f for f in (
    Feature("custom_remat", "jax.custom_remat exists and jax_remat3 is on (its forward rule only "
            "runs under remat3)", lambda c: c.custom_remat_usable, _fix_custom_remat),
    Feature("inline", "jax.Inline exists (explicit jit inlining modes)", lambda c: c.inline,
            lambda c: f"jax {c.jax} has no jax.Inline; install jax>=0.11.0."),
    Feature("offload", "the default device has the 'pinned_host' memory kind, so offload plans "
            "compile", lambda c: "pinned_host" in c.memory_kinds, _fix_offload),
    Feature("offload_placed", "offloaded values really move to host memory (a GPU or TPU "
            "backend with 'pinned_host'; on CPU offload compiles but is a no-op)",
            lambda c: c.host_offload_placed, _fix_offload_placed),
    Feature("policy_classes", "jax.checkpoint_policies.SaveOnlyTheseNames, SaveAnyNamesButThese "
            "and SaveAndOffloadOnlyTheseNames exist (JAX 0.11.x)", lambda c: c.policy_classes,
            lambda c: (f"JAX {c.jax} has no policy classes (0.12 removed them); install "
                       "jax<0.12, or let remat_common.compile_plan use the factory functions.")),
    Feature("remat3", "jax_remat3 is on", lambda c: c.remat3, lambda c: _SET_REMAT3 + "."),
    Feature("saved_residuals", "remat_common.saved_residuals (and so verify) reads this JAX's "
            "jaxprs: a probe's one named residual is found by name",
            lambda c: residuals_readable(),
            lambda c: (f"jax {c.jax} changed the jaxpr layout remat_common.saved_residuals reads; "
                       f"install a supported JAX ({range_spec(*JAX_RANGE)}).")),
)}


@dataclasses.dataclass(frozen=True)
class Problem:
    """One finding of :func:`diagnose`: what is wrong (or worth knowing) and what to do."""

    severity: Severity
    code: str
    message: str
    fix: str

    def to_json(self) -> dict[str, str]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Diagnosis:
    """The result of :func:`diagnose`.

    Attributes:
      capabilities: the capability record of the core.
      versions: ``(distribution, version or None)`` for every reported distribution.
      features: ``(name, available)`` for every feature in :data:`FEATURES`.
      required: the features that were required (``--require``).
      problems: errors, warnings and notes, errors first.
    """

    capabilities: Capabilities
    versions: tuple[tuple[str, str | None], ...]
    features: tuple[tuple[str, bool], ...]
    required: tuple[str, ...]
    problems: tuple[Problem, ...]
    targets: tuple[tuple[str, str | None], ...] = ()

    @property
    def unmet(self) -> tuple[str, ...]:
        have = dict(self.features)
        return tuple(n for n in self.required if not have[n])

    @property
    def ok(self) -> bool:
        """No floor is broken and every required feature is available."""
        return not any(p.severity == "error" for p in self.problems)

    def count(self, severity: Severity) -> int:
        return sum(p.severity == severity for p in self.problems)

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "remat_common": __version__,
            "capabilities": self.capabilities.to_json(),
            "versions": dict(self.versions),
            "floors": {
                **{k: floor_spec(v) for k, v in FLOORS.items()},
                "jax": range_spec(*JAX_RANGE),
                **{k: range_spec(lo, hi) for k, (lo, hi, _) in OPTIONAL.items()},
            },
            "features": {
                n: {"available": a, "meaning": FEATURES[n].meaning} for n, a in self.features
            },
            "required": list(self.required),
            "unmet": list(self.unmet),
            "problems": [p.to_json() for p in self.problems],
            "targets": {k: {"available": why is None, "why_not": why} for k, why in self.targets},
        }


def floor_spec(v: Version) -> str:
    """``>=0.11.0``: a requirement specifier for a floor."""
    return ">=" + ".".join(map(str, v))


def range_spec(lo: Version, hi: Version) -> str:
    """``>=0.11.0,<0.13``: a requirement specifier for a tested range."""
    return f">={'.'.join(map(str, lo))},<{'.'.join(map(str, hi))}"


def installed_versions() -> dict[str, str | None]:
    """Versions of the reported distributions from the installed metadata (None: not installed)."""
    return {dist: distribution_version(dist) for dist in DISTRIBUTIONS}


def _floor_problems(caps: Capabilities, versions: Mapping[str, str | None]) -> list[Problem]:
    out = []
    have = {"python": caps.python, "numpy": versions.get("numpy"), "scipy": versions.get("scipy")}
    for name, floor in FLOORS.items():
        v = have[name]
        if v is None or parse_version(v) < release(*floor):
            msg = (f"{name} is not installed; JAX 0.11 needs {name}{floor_spec(floor)}." if v is None
                   else f"{name} {v} is below the JAX 0.11 floor {floor_spec(floor)}.")
            fix = ("install Python 3.12 or newer and recreate the environment (e.g. "
                   "`REMAT_PYTHON=python3.12 ./scripts/test`)" if name == "python"
                   else f"pip install '{name}{floor_spec(floor)}'")
            out.append(Problem("error", f"floor:{name}", msg, fix + "."))
    jv = parse_version(caps.jax)
    if not release(*JAX_RANGE[0]) <= jv < release(*JAX_RANGE[1]):
        out.append(Problem(
            "error", "floor:jax",
            f"jax {caps.jax} is outside the supported range {range_spec(*JAX_RANGE)}.",
            f"pip install 'jax{range_spec(*JAX_RANGE)}' (0.11.2 is the newest release with "
            "jax.custom_remat)."))
    if caps.jaxlib is not None and parse_version(caps.jaxlib).release[:3] != jv.release[:3]:
        out.append(Problem(
            "warning", "jaxlib-mismatch",
            f"jaxlib {caps.jaxlib} does not match jax {caps.jax}.",
            f"pip install 'jaxlib=={caps.jax}' (or reinstall jax with its matching jaxlib)."))
    for dist, (lo, hi, extra) in OPTIONAL.items():
        v = versions.get(dist)
        if v is None:
            out.append(Problem(
                "note", f"missing:{dist}", f"{dist} is not installed.",
                f"only needed for the {extra!r} extra: pip install 'jax-remat-plan[{extra}]'."))
        elif not release(*lo) <= parse_version(v) < release(*hi):
            out.append(Problem(
                "warning", f"range:{dist}",
                f"{dist} {v} is outside the tested range {range_spec(lo, hi)}.",
                f"pip install '{dist}{range_spec(lo, hi)}'."))
    return out


def _jax_problems(caps: Capabilities) -> list[Problem]:
    out = []
    jv = parse_version(caps.jax)
    if is_jax_0110(caps.jax):
        out.append(Problem(
            "warning", "jax-0.11.0",
            "jax 0.11.0 with jax_remat3 on saves nothing for save_from_both_policies, lambda "
            "policies and everything_saveable, ignores prevent_cse=False, and breaks "
            "eqx.filter_checkpoint (unhashable static argument; this project's Equinox adapter "
            "does not use it); on CPU its CSE pass merges recomputation back, so remat report "
            "shows recompute plans at the FLOPs and memory of no remat; a custom rule set inside "
            "your own jax.checkpoint sees its own boundary's policy, not yours.",
            "pip install 'jax>=0.11.2,<0.12'; to measure remat on CPU with 0.11.0 set "
            "XLA_FLAGS=--xla_disable_hlo_passes=cse."))
    if policy_classes_removed(caps.jax):
        out.append(Problem(
            "note", "jax-0.12",
            f"jax {caps.jax} has no jax.custom_remat and no policy classes: the plan compiler "
            "emits the factory functions instead, and 'custom' rule sets take the portable "
            "custom_vjp path.",
            "nothing to do; to run rule sets through jax.custom_remat itself, install "
            "jax>=0.11.1,<0.12 and turn jax_remat3 on."))
    if caps.custom_remat and not caps.remat3:
        out.append(Problem(
            "note", "remat3-off",
            "jax_remat3 is off (the default): jax.custom_remat functions are simply recomputed "
            "under a checkpoint and their forward rule never runs, so 'custom' rule sets take "
            "the portable custom_vjp path.",
            f"to run them through jax.custom_remat, {_SET_REMAT3}. Nothing else needs it."))
    if not caps.checkpoint_policies_importable:
        out.append(Problem(
            "note", "checkpoint-policies-attribute",
            "`import jax.checkpoint_policies` fails here (it is an attribute of jax, not a "
            "module), whatever the JAX 0.11.0 release note says.",
            "use attribute access, jax.checkpoint_policies.X; `remat lint` finds the imports "
            "(rule RM001)."))
    if not residuals_readable():
        out.append(Problem(
            "warning", "no-saved-residuals",
            f"remat_common.saved_residuals cannot read jax {caps.jax}'s jaxprs (a probe's named "
            "residual was not found): verify would report residuals it cannot name.",
            f"install a supported JAX ({range_spec(*JAX_RANGE)})."))
    if "pinned_host" not in caps.memory_kinds:
        out.append(Problem(
            "warning", "no-host-memory",
            f"the {caps.backend} devices have no 'pinned_host' memory kind "
            f"(they have {sorted_list(caps.memory_kinds) or 'none'}): plans that offload fail "
            "to compile with a CapabilityError.",
            "use 'recompute' on this backend, or set offload_dst to a kind the devices have."))
    elif not caps.host_offload_placed:
        out.append(Problem(
            "note", "offload-no-op",
            f"on the {caps.backend} backend offload plans compile and give correct gradients "
            "but place nothing on host (the compiler drops the placement).",
            "measure offloading on GPU or TPU; on CPU check it through jax.export(..., "
            "platforms=['cuda'])."))
    if caps.backend == "cpu":
        out.append(Problem(
            "note", "cpu-empty-zeros",
            "on CPU jnp.empty/empty_like return zeros, on GPU and TPU uninitialised memory: "
            "tests on this machine cannot catch a read before write.",
            "run `remat lint` over the code (rule RM002)."))
    return out


def _severity_rank(p: Problem) -> int:
    return {"error": 0, "warning": 1, "note": 2}[p.severity]


def check_required(required: Iterable[str]) -> tuple[str, ...]:
    """Validates ``--require`` names (comma-separated strings are split).

    Raises:
      ValueError: for an unknown feature name, listing the allowed ones.
    """
    out: list[str] = []
    for item in required:
        for name in (n.strip() for n in item.split(",")):
            if not name:
                continue
            if name not in FEATURES:
                raise ValueError(
                    f"unknown feature {name!r} in require. Allowed: "
                    f"{sorted_list(FEATURES)}. See `remat doctor --help` for what each means."
                )
            if name not in out:
                out.append(name)
    return tuple(out)


def diagnose(
    caps: Capabilities | None = None,
    versions: Mapping[str, str | None] | None = None,
    *,
    require: Iterable[str] = (),
) -> Diagnosis:
    """Checks the floors, the JAX surface and the required features; a fix for every problem.

    Args:
      caps: a capability record (default: :func:`capabilities` now).
      versions: distribution versions (default: the installed ones).
      require: feature names from :data:`FEATURES` that must be available.

    Returns:
      A :class:`Diagnosis`; ``ok`` is False when a floor is not met or a required feature is
      unavailable.

    >>> import dataclasses
    >>> caps = dataclasses.replace(capabilities(), numpy="2.0.2")
    >>> d = diagnose(caps)
    >>> d.ok, [p.message for p in d.problems if p.code == "floor:numpy"]
    (False, ['numpy 2.0.2 is below the JAX 0.11 floor >=2.1.'])
    """
    caps = capabilities() if caps is None else caps
    versions = installed_versions() if versions is None else dict(versions)
    versions = {**versions, "jax": caps.jax, "jaxlib": caps.jaxlib,
                "numpy": caps.numpy, "scipy": caps.scipy}
    required = check_required(require)
    features = tuple((n, bool(f.available(caps))) for n, f in sorted(FEATURES.items()))
    have = dict(features)
    problems = _floor_problems(caps, versions) + [
        p for p in _jax_problems(caps)  # an unmet requirement already says it, with its fix
        if not (p.code == "remat3-off" and {"custom_remat", "remat3"} & set(required))
    ]
    for name in required:
        if not have[name]:
            problems.append(Problem(
                "error", f"require:{name}",
                f"required feature {name!r} is not available: {FEATURES[name].meaning}.",
                FEATURES[name].fix(caps)))
    problems.sort(key=_severity_rank)
    from ..accelerators._accelerators import target_kinds

    return Diagnosis(
        targets=target_kinds(),
        capabilities=caps,
        versions=tuple((d, versions.get(d)) for d in DISTRIBUTIONS),
        features=features,
        required=required,
        problems=tuple(problems),
    )


# -- manifest -------------------------------------------------------------------------------------
def _jax_config() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in JAX_CONFIG:
        try:
            v = getattr(jax.config, name)
        except AttributeError:
            continue
        out[name] = v if isinstance(v, bool | int | float | str) or v is None else str(v)
    return out


def _plan_section(plan: PlanLike | Resolution | CompiledPlan) -> dict[str, Any]:
    compiled = plan if isinstance(plan, CompiledPlan) else None
    resolution = compiled.resolution if compiled else (
        plan if isinstance(plan, Resolution) else None)
    p = resolution.plan if resolution else Plan.coerce(plan)
    out: dict[str, Any] = {
        "fingerprint": p.fingerprint(),
        "source": p.source,
        "config": p.to_config(),
        "boundaries": None,
    }
    if resolution is not None:
        policies = {b.path: b for b in compiled.boundaries} if compiled else {}
        out["boundaries"] = [
            {
                "path": b.path, "kind": b.kind, "save": sorted(b.save),
                "offload": sorted(b.offload), "offload_src": b.offload_src,
                "offload_dst": b.offload_dst,
                "policy": policies[b.path].policy_name if b.path in policies else None,
            }
            for b in resolution.boundaries
        ]
    return out


def manifest(plan: PlanLike | Resolution | CompiledPlan = None) -> dict[str, Any]:
    """The facts that tell two runs apart, as a JSON-able dict.

    Versions (Python, jax, jaxlib, numpy, scipy, flax, equinox, optax, orbax-checkpoint, this
    package), the compiler the process's steps are compiled by (:func:`compiler_identity`:
    XLA:CPU in jaxlib, libtpu's or the CUDA plugin's version), the platform, the capability
    record (backend, devices, memory kinds, ``jax_remat3``, which JAX surface exists), the JAX configuration values and environment
    variables that change what is compiled, and -- when a plan is given -- its fingerprint, its
    rules and, for a resolution or compiled plan, its boundaries and policies. It is
    deterministic: the same environment and plan give an equal dict (no timestamps).

    Args:
      plan: None, or a :class:`Plan` (or anything :meth:`Plan.coerce` accepts: a mapping, a
        list of rules, a YAML/TOML/JSON path), a :class:`Resolution` or a :class:`CompiledPlan`.

    Returns:
      A dict of JSON types only; write it with ``json.dump`` next to a checkpoint.

    >>> import json
    >>> m = manifest(Plan.from_mapping({"layers.*": "recompute"}))
    >>> m["plan"]["fingerprint"] == Plan.from_mapping({"layers.*": "recompute"}).fingerprint()
    True
    >>> json.loads(json.dumps(m)) == m
    True
    """
    caps = capabilities()
    versions = {**installed_versions(), "jax": caps.jax, "jaxlib": caps.jaxlib}
    return {
        "remat_manifest": 1,
        "remat_common": __version__,
        "platform": {"system": platform.system(), "machine": platform.machine(),
                     "implementation": platform.python_implementation()},
        "versions": {"python": caps.python, **{d: versions.get(d) for d in DISTRIBUTIONS}},
        "capabilities": caps.to_json(),
        "compiler": compiler_identity().to_json(),
        "jax_config": _jax_config(),
        "env": {k: os.environ[k] for k in ENV_VARS if k in os.environ},
        "plan": None if plan is None else _plan_section(plan),
    }
