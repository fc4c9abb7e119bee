"""remat_common: declarative, verified rematerialization plans for JAX.

The repository's ``common/`` folder installs as ``remat_common`` (``package-dir`` in
pyproject.toml), because a bare top-level ``common`` would collide with users' own ``common``
modules: import ``remat_common``, never ``common``.

The user API: the annotation vocabulary, plans, their resolution and compilation, the plain-JAX
:func:`checkpoint`, :func:`checkpoint_name`, the verifier, the capability probe, errors and
warnings. Everything else lives in a namespace for its audience:

- :mod:`remat_common.rules`: custom remat rules (rule sets, ready-made ones, what ran);
- :mod:`remat_common.measurement`: measuring plans side by side, rendering the report, and
  tuning a plan to a memory budget (:func:`tune` is also at the top level);
- :mod:`remat_common.lint`: static checks for hand-written remat code;
- :mod:`remat_common.adapter`: the interface a framework adapter is built on;
- :mod:`remat_common.testing`: test helpers (``poison_empty``);
- :mod:`remat_common.internal`: this repository's tests and benchmarks only; no stability guarantees.

The namespaces, :func:`tune`, :func:`verify_parity` and :func:`manifest` load on first use:
``import remat_common`` loads the runtime only, never the tooling.
"""

import typing as _typing
from importlib import import_module as _import_module

from ._annotation import Annotation as Annotation
from ._annotation import parse_annotation as parse_annotation
from ._capabilities import Capabilities as Capabilities
from ._capabilities import capabilities as capabilities
from ._checkpoint import OffloadArgumentsWarning as OffloadArgumentsWarning
from ._checkpoint import checkpoint as checkpoint
from ._compile import CompiledPlan as CompiledPlan
from ._compile import compile_plan as compile_plan
from ._custom import CustomRuleWarning as CustomRuleWarning
from ._errors import AnnotationError as AnnotationError
from ._errors import CapabilityError as CapabilityError
from ._errors import PlanError as PlanError
from ._errors import RematError as RematError
from ._errors import VerificationError as VerificationError
from ._hazards import EagerOffloadWarning as EagerOffloadWarning
from ._hazards import Float64ResidualWarning as Float64ResidualWarning
from ._model import PlanLike as PlanLike
from ._namecheck import UnproducedNameError as UnproducedNameError
from ._namecheck import UnproducedNameWarning as UnproducedNameWarning
from ._plan import Plan as Plan
from ._policy import from_jax_policy as from_jax_policy
from ._plan import Rule as Rule
from ._resolve import Resolution as Resolution
from ._resolve import UnmatchedPatternWarning as UnmatchedPatternWarning
from ._resolve import resolve as resolve
from ._scope import checkpoint_name as checkpoint_name
from ._state import StatePlacement as StatePlacement
from ._residuals import Residual as Residual
from ._residuals import ResidualReport as ResidualReport
from ._verify import Verification as Verification
from ._residuals import saved_residuals as saved_residuals
from ._verify import verify as verify
from ._version import __version__ as __version__

if _typing.TYPE_CHECKING:  # loaded on first use (below); type checkers see them here
    from . import adapter as adapter
    from . import internal as internal
    from . import lint as lint
    from . import measurement as measurement
    from . import rules as rules
    from . import state as state
    from . import testing as testing
    from ._tooling.doctor import manifest as manifest
    from ._tooling.measurement import verify_parity as verify_parity
    from ._tooling.tune import tune as tune

#: What loads on first use (PEP 562), so that ``import remat_common`` loads the runtime's user API
#: only: the namespaces, and the names that live in the tooling (``_tooling/``: measurement, lint,
#: doctor, the tuner, the CLI). ``remat_common.x``, ``from remat_common import x`` and ``import
#: remat_common.x`` work as if they were imported here. Name -> (module, attribute or None).
_LAZY: dict[str, tuple[str, str | None]] = {
    "adapter": (".adapter", None),
    "internal": (".internal", None),
    "lint": (".lint", None),
    "manifest": ("._tooling.doctor", "manifest"),
    "measurement": (".measurement", None),
    "rules": (".rules", None),
    "state": (".state", None),
    "testing": (".testing", None),
    "tune": ("._tooling.tune", "tune"),
    "verify_parity": ("._tooling.measurement", "verify_parity"),
}

if not _typing.TYPE_CHECKING:  # a module ``__getattr__`` would make every unknown ``rc.x`` Any to mypy

    def __getattr__(name: str) -> object:
        try:
            module, attr = _LAZY[name]
        except KeyError:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
        value = _import_module(module, __name__)
        if attr is not None:
            value = getattr(value, attr)
        globals()[name] = value
        return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "Annotation",
    "AnnotationError",
    "Capabilities",
    "CapabilityError",
    "CompiledPlan",
    "CustomRuleWarning",
    "EagerOffloadWarning",
    "Float64ResidualWarning",
    "OffloadArgumentsWarning",
    "Plan",
    "PlanError",
    "PlanLike",
    "RematError",
    "Residual",
    "ResidualReport",
    "Resolution",
    "Rule",
    "StatePlacement",
    "UnmatchedPatternWarning",
    "UnproducedNameError",
    "UnproducedNameWarning",
    "Verification",
    "VerificationError",
    "capabilities",
    "checkpoint",
    "checkpoint_name",
    "compile_plan",
    "from_jax_policy",
    "manifest",
    "parse_annotation",
    "resolve",
    "saved_residuals",
    "tune",
    "verify",
    "verify_parity",
]
