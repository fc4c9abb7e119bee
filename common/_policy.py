"""JAX policy objects read as annotations: migrating ``jax.checkpoint(f, policy=...)`` code.

Every entry of ``jax.checkpoint_policies`` (the 0.11 classes, the factory functions, and the
closures those factories return on 0.12) is mapped to the annotation that means the same thing
(https://github.com/jax-remat-plan/jax-remat-plan/blob/main/docs/semantics.md#migrating-from-jaxcheckpoint);
the compiler then emits its own name-based policy, which JAX honours with ``jax_remat3`` off and
on. A policy the vocabulary cannot express
(``SaveAnyNamesButThese``, a lambda, ``save_from_both_policies`` of matmuls and names) is refused
with the annotation to write instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import jax

from ._errors import AnnotationError, short, sorted_list, where
from ._jaxcompat import POLICY_MODULE
from ._shipped import doc_url

#: Where the measured behaviour behind two refusals is written down.
_SILENTLY: Final = doc_url("jax_behaviour", "policies-remat3-changes-silently")

_MSG_UNREADABLE = """\
{where}the policy {value} is a function the annotation vocabulary cannot read: which values it
keeps is decided by code, and jax_remat3 silently changes what lambda and primitive-inspecting
policies keep ({silently}).
Fix: tag the values to keep with checkpoint_name(x, "name") and write {{"save": ["name", ...]}}
(or {{"offload": [...]}}); for matmul outputs write 'dots' or 'dots_no_batch'; for no boundary
'save'; to recompute everything 'recompute'."""

_MSG_ALL_BUT = """\
{where}{value} keeps every checkpoint_name value except {names}: a plan lists what is kept, never
what is not, so that a name no tag produces is an error rather than a silent no-op.
Fix: list the names to keep: {{"save": [every name you tag except {names}]}}."""

_MSG_EXCEPT = """\
{where}{value}: JAX's save_anything_except_these_names ignores its names and saves every value
(its source says it "probably just doesn't work"), so it cannot mean what it says.
Fix: 'save' for what JAX does with it (no boundary), or {{"save": [the names to keep]}} for what
its name says."""

_MSG_BOTH_KINDS = """\
{where}save_from_both_policies({first}, {second}) keeps matmul outputs and named values in one
boundary; jax_remat3 drops one of the two ({silently}). Fix: tag the matmul outputs to keep
with checkpoint_name and list them with the other names: {{"save": [{names}, ...]}}."""

_MSG_BOTH_OFFLOAD = """\
{where}save_from_both_policies({first}, {second}) combines an offloading policy, which JAX refuses
when the step is traced ("The return value of the policies should be a boolean").
Fix: one mapping with both lists: {fix}."""


def _closure(fun: Any) -> dict[str, Any]:
    """The variables a function closes over, by name (the 0.12 factories' arguments)."""
    code, cells = getattr(fun, "__code__", None), getattr(fun, "__closure__", None) or ()
    out: dict[str, Any] = {}
    for name, cell in zip(getattr(code, "co_freevars", ()), cells):
        try:
            out[name] = cell.cell_contents
        except ValueError:  # an empty cell
            pass
    return out


def _names(values: Any) -> list[str]:
    return sorted(str(v) for v in values)


def _mapping(save: Any = (), offload: Any = (), src: Any = None, dst: Any = None
             ) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if save:
        out["save"] = _names(save)
    if offload:
        out["offload"] = _names(offload)
        out["offload_src"], out["offload_dst"] = src, dst
    return out


def jax_policy_entry(value: Any) -> str | None:
    """The ``jax.checkpoint_policies`` entry ``value`` is or comes from (``"dots_saveable"``,
    ``"SaveOnlyTheseNames"``, ``"save_only_these_names"``), or ``None`` for anything else (a
    function of the user's own may be a policy too: :func:`is_jax_policy`)."""
    cp = jax.checkpoint_policies
    for name, entry in vars(cp).items():
        if value is entry:
            return name
    return _kind(value)


def is_jax_policy(value: Any) -> bool:
    """Whether ``value`` may be a ``jax.checkpoint`` policy (a callable that is no annotation)."""
    return callable(value) and not isinstance(value, str | type)


def from_jax_policy(policy: Any, *, path: str | None = None, source: str | None = None) -> Any:
    """The annotation value (as written in a plan file) that means what ``policy`` means.

    Args:
      policy: a ``jax.checkpoint`` policy: an entry of ``jax.checkpoint_policies`` (a 0.11
        class instance such as ``SaveOnlyTheseNames(...)``, a factory's result such as
        ``save_only_these_names("a")`` on any version, or ``nothing_saveable`` ...), or ``None``
        (``jax.checkpoint``'s default: recompute everything).
      path, source: where the value was given, for error messages.

    Returns:
      A string or a mapping that :func:`parse_annotation` reads.

    Raises:
      AnnotationError: the policy cannot be expressed as an annotation; the message names the one
        to write.

    >>> import jax
    >>> cp = jax.checkpoint_policies
    >>> from_jax_policy(cp.save_only_these_names("attn_out")), from_jax_policy(cp.dots_saveable)
    ({'save': ['attn_out']}, 'dots')
    """
    loc = where(path, source)
    cp = jax.checkpoint_policies
    if policy is None or policy is getattr(cp, "nothing_saveable", None):
        return "recompute"
    if policy is getattr(cp, "everything_saveable", None):
        return "save"  # "as if jax.checkpoint were not being used at all" (its docstring)
    for name, kind in (("dots_saveable", "dots"),
                       ("dots_with_no_batch_dims_saveable", "dots_no_batch")):
        if policy is getattr(cp, name, None):
            return kind
    entry = _kind(policy)
    reader = None if entry is None else _READERS.get(entry)
    if reader is None:
        raise AnnotationError(_MSG_UNREADABLE.format(where=loc, value=_show(policy),
                                                     silently=_SILENTLY))
    return reader(policy, loc)


def _kind(policy: Any) -> str | None:
    """The ``jax.checkpoint_policies`` entry a policy object comes from: its class on 0.11, the
    factory whose closure it is on 0.12 (``save_only_these_names``), else ``None``."""
    cls = type(policy)
    if cls.__module__ == POLICY_MODULE and cls.__name__ != "function":
        return cls.__name__
    if getattr(policy, "__module__", None) == POLICY_MODULE:
        qual = getattr(policy, "__qualname__", "")
        head, _, tail = qual.partition(".<locals>.")
        if tail:
            return head
    return None


def _show(policy: Any) -> str:
    kind = _kind(policy)
    if kind is not None and type(policy).__name__ == "function":
        return f"{kind}(...) (a jax.checkpoint_policies factory's function)"
    return short(policy)


def _read_dots(policy: Any, loc: str) -> Any:  # DotsSaveable (0.11), a copy not the module's
    return "dots_no_batch" if policy.only_if_no_batch_dims else "dots"


def _read_offload_dots(policy: Any, loc: str) -> Any:
    f = vars(policy) if hasattr(policy, "offload_src") else _closure(policy)
    return {"remat": "offload_dots_no_batch", "offload_src": f["offload_src"],
            "offload_dst": f["offload_dst"]}


def _read_save(policy: Any, loc: str) -> Any:
    names = getattr(policy, "saveable_names", None)
    if names is None:
        names = _closure(policy)["names_which_can_be_saved"]
    return _mapping(names) or "recompute"  # no names: nothing is saved


def _read_save_offload(policy: Any, loc: str) -> Any:
    f = vars(policy) if hasattr(policy, "offload_src") else _closure(policy)
    out = _mapping(f["names_which_can_be_saved"], f["names_which_can_be_offloaded"],
                   f["offload_src"], f["offload_dst"])
    return out or "recompute"


def _read_all_but(policy: Any, loc: str) -> Any:
    names = getattr(policy, "names", None)
    if names is None:
        names = _closure(policy).get("names_not_to_save", ())
    raise AnnotationError(_MSG_ALL_BUT.format(where=loc, value=_show(policy),
                                              names=sorted_list(names)))


def _read_except(policy: Any, loc: str) -> Any:
    raise AnnotationError(_MSG_EXCEPT.format(where=loc, value=_show(policy)))


def _read_both(policy: Any, loc: str) -> Any:
    f = _closure(policy)
    one, two = (from_jax_policy(f[k], path=None) for k in ("policy_1", "policy_2"))
    if "save" in (one, two):
        return "save"
    if one == "recompute" or two == "recompute":
        return two if one == "recompute" else one
    if isinstance(one, str) and isinstance(two, str):  # dots and dots_no_batch: dots keeps both
        return "dots" if "dots" in (one, two) else one
    if isinstance(one, str) or isinstance(two, str):
        names = [n for m in (one, two) if isinstance(m, dict) for n in m.get("save", [])]
        raise AnnotationError(_MSG_BOTH_KINDS.format(
            where=loc, first=_show(f["policy_1"]), second=_show(f["policy_2"]),
            names=", ".join(repr(n) for n in names), silently=_SILENTLY))
    merged = _mapping(set(one.get("save", ())) | set(two.get("save", ())))
    if "offload" in one or "offload" in two:
        off = {k: v for m in (one, two) for k, v in m.items() if k != "save"}
        fix = {**merged, **off}
        raise AnnotationError(_MSG_BOTH_OFFLOAD.format(
            where=loc, first=_show(f["policy_1"]), second=_show(f["policy_2"]), fix=fix))
    return merged


_READERS: Final[dict[str, Callable[[Any, str], Any]]] = {
    "DotsSaveable": _read_dots,
    "OffloadDotWithNoBatchDims": _read_offload_dots,
    "offload_dot_with_no_batch_dims": _read_offload_dots,
    "SaveOnlyTheseNames": _read_save,
    "save_only_these_names": _read_save,
    "SaveAndOffloadOnlyTheseNames": _read_save_offload,
    "save_and_offload_only_these_names": _read_save_offload,
    "SaveAnyNamesButThese": _read_all_but,
    "save_any_names_but_these": _read_all_but,
    "save_anything_except_these_names": _read_except,
    "save_from_both_policies": _read_both,
}
