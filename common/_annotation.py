"""The annotation vocabulary: what should survive the forward pass of one module."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Final, Literal

from ._errors import AnnotationError, short, sorted_list, where
from ._nested import NESTED_KEY, NestedSpec, parse_nested
from ._policy import is_jax_policy, from_jax_policy

SEP: Final = "/"  # as in _scope: "path/name"

Kind = Literal["inherit", "save", "recompute", "offload", "dots", "dots_no_batch",
               "offload_dots_no_batch", "names", "custom"]

#: The annotations that can be written as a bare string.
STRING_KINDS: Final = frozenset(
    {"inherit", "save", "recompute", "offload", "dots", "dots_no_batch", "offload_dots_no_batch",
     "custom"}
)
#: Kinds that place a remat boundary at the annotated module.
BOUNDARY_KINDS: Final = frozenset({"recompute", "offload", "dots", "dots_no_batch",
                                   "offload_dots_no_batch", "names"})
#: Kinds that move activations to host memory by themselves (they take offload_src/offload_dst):
#: ``offload`` (the module input) and ``offload_dots_no_batch`` (every matmul output without batch
#: dimensions, JAX's ``offload_dot_with_no_batch_dims``).
OFFLOAD_KINDS: Final = frozenset({"offload", "offload_dots_no_batch"})
#: ``{"tag": NAME}``: the module's output is tagged ``NAME`` as ``checkpoint_name`` in model code would
#: tag it (no boundary by itself; beside ``remat`` or name lists, with them).
TAG_KEY: Final = "tag"
MAPPING_KEYS: Final = frozenset(
    {"save", "offload", "remat", "offload_src", "offload_dst", NESTED_KEY, TAG_KEY})
DEFAULT_OFFLOAD_SRC: Final = "device"
DEFAULT_OFFLOAD_DST: Final = "pinned_host"

_MSG_UNKNOWN = """\
{where}unknown remat annotation {value}.{hint}
Allowed strings: {allowed}; or a mapping such as {{"save": ["attn_out"], "offload": ["mlp_in"]}}
(keys: {keys}). Fix: use one of the allowed values."""

_MSG_BOTH = """\
{where}names {names} are listed both under "save" and under "offload" in {value}.
A value lives in one place: device (save) or host (offload). Fix: remove each name from one list."""


@dataclasses.dataclass(frozen=True)
class Annotation:
    """A parsed annotation: frozen, hashable, comparable.

    Attributes:
      kind: one of ``inherit``, ``save``, ``recompute``, ``offload``, ``dots``,
        ``dots_no_batch``, ``offload_dots_no_batch`` (matmul outputs without batch dimensions moved
        to host), ``names`` (a ``{"save": [...], "offload": [...]}`` mapping) or ``custom``.
      save: for ``names``: the names kept on device.
      offload: for ``names``: the names moved to host memory.
      offload_src, offload_dst: memory kinds for offloading; ``None`` means the plan's default
        (``device`` → ``pinned_host``).
      nested: on a stack of layers only: run the stack as nested scans over blocks of this many
        layers (or ``"sqrt"``), each block under one boundary (see ``_nested.py``); ``None``: one
        scan over the layers.
      tag: a name for the module's floating-point outputs, tagged as the caller's
        ``remat_common.checkpoint_name(module(x), tag)`` would tag them (qualified by the parent's
        path: ``layers.3.attn/query_proj`` for ``layers.3.attn.q_proj``), so a plan can keep by name
        what a model it cannot edit never tagged; ``None``: no tag.

    >>> parse_annotation({"save": ["attn_out"]})
    Annotation(kind='names', save=frozenset({'attn_out'}), offload=frozenset(), offload_src=None, offload_dst=None, nested=None, tag=None)
    >>> parse_annotation("offload").is_boundary
    True
    """

    kind: Kind
    save: frozenset[str] = frozenset()
    offload: frozenset[str] = frozenset()
    offload_src: str | None = None
    offload_dst: str | None = None
    nested: NestedSpec | None = None
    tag: str | None = None

    @property
    def is_boundary(self) -> bool:
        """Whether this annotation places a remat boundary (a ``jax.checkpoint``) at its module."""
        return self.kind in BOUNDARY_KINDS

    @property
    def names(self) -> frozenset[str]:
        return self.save | self.offload

    @property
    def moves_to_host(self) -> bool:
        return self.kind in OFFLOAD_KINDS or bool(self.offload)

    def to_config(self) -> str | dict[str, Any]:
        """The value as it would be written in a plan file (inverse of :func:`parse_annotation`)."""
        extra: dict[str, Any] = {}
        if self.offload_src is not None:
            extra["offload_src"] = self.offload_src
        if self.offload_dst is not None:
            extra["offload_dst"] = self.offload_dst
        if self.nested is not None:
            extra[NESTED_KEY] = self.nested
        if self.tag is not None:
            extra[TAG_KEY] = self.tag
        if self.kind == "names":
            return {"save": sorted(self.save), "offload": sorted(self.offload), **extra}
        if extra.keys() == {TAG_KEY} and self.kind == "inherit":
            return extra
        if extra:
            return {"remat": self.kind, **extra}
        return self.kind

    def __str__(self) -> str:
        cfg = self.to_config()
        return cfg if isinstance(cfg, str) else repr(cfg)


INHERIT: Final = Annotation("inherit")
_STRING_ANNOTATIONS: Final = {k: Annotation(k) for k in STRING_KINDS}  # type: ignore[arg-type]


def _names(value: Any, key: str, whole: Any, path: str | None, source: str | None) -> frozenset[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list | tuple | set | frozenset):
        raise AnnotationError(
            f"{where(path, source)}{key!r} in {short(whole)} must be a list of activation names, "
            f"got {type(value).__name__} {short(value)}. Fix: write {key}: [name, ...]."
        )
    out = []
    for n in value:
        if not isinstance(n, str) or not n.strip() or n != n.strip():
            raise AnnotationError(
                f"{where(path, source)}activation name {short(n)} in {short(whole)} must be a "
                "non-empty string without surrounding spaces, as passed to checkpoint_name(x, name)."
                + _bool_hint(n)
            )
        if "*" in n.rpartition(SEP)[2]:
            raise AnnotationError(
                f"{where(path, source)}activation name {short(n)} in {short(whole)} is a glob: names "
                "are matched exactly (the plan's '*' stands for every name internally, so a '*' name "
                f"would keep nothing). Fix: list the tagged names ({key}: [attn_out, ...]), or annotate "
                + ("the module 'save' to keep all it computes." if key == "save" else
                   "the module 'offload' to move its inputs to host.")
            )
        if SEP in n:
            rel, _, leaf = n.rpartition(SEP)
            if not leaf or not rel or SEP in rel or any(s == "" for s in rel.split(".")):
                raise AnnotationError(
                    f"{where(path, source)}relative name {short(n)} in {short(whole)} is malformed: "
                    f"it is SUBPATH{SEP}NAME with a non-empty dotted sub-path (a glob over the "
                    f"module's descendants, e.g. 'mlp{SEP}h', '*.mlp{SEP}h') and a non-empty name. "
                    f"Fix: write it that way, or just the name {leaf or rel!r}."
                )
        out.append(n)
    return frozenset(out)


_HOST_KINDS: Final = frozenset({"pinned_host", "unpinned_host"})


def _tag(value: Any, whole: Any, path: str | None, source: str | None) -> str:
    """The ``tag`` of an annotation: one plain name (what ``checkpoint_name`` would be given)."""
    ok = isinstance(value, str) and value.strip() == value and value and SEP not in value \
        and value != "*" and not value.startswith("__")
    if not ok:
        raise AnnotationError(
            f"{where(path, source)}'tag' in {short(whole)} must be one activation name, such as "
            f"'query_proj' (a non-empty string without '/', '*', surrounding spaces or a leading "
            f"'__'), got {short(value)}. Fix: write the name the plan's save/offload lists use for "
            f"this module's output.")
    return str(value)


def _memory_kind(value: Any, key: str, whole: Any, path: str | None, source: str | None) -> str:
    if not isinstance(value, str) or not value:
        raise AnnotationError(
            f"{where(path, source)}{key} in {short(whole)} must be a memory kind string such as "
            f"'device', 'pinned_host' or 'unpinned_host', got {short(value)}."
        )
    return value


def check_memory_kinds(src: str, dst: str, what: str, source: str | None = None,
                       path: str | None = None) -> None:
    """Raises :class:`AnnotationError` unless an offload moves from ``src`` to a different kind.

    An offload moves activations out of device memory: ``offload_dst`` must not be ``device``, and
    the two kinds must differ (``device`` → ``device`` moves nothing).
    """
    loc = where(path, source)
    if not isinstance(src, str) or not isinstance(dst, str) or not src or not dst:
        raise AnnotationError(
            f"{loc}{what}: offload_src and offload_dst must be memory kind strings, got "
            f"{short(src)} and {short(dst)}."
        )
    if src == dst or dst == "device":
        raise AnnotationError(
            f"{loc}{what}: offload_src={src!r}, offload_dst={dst!r} does not move activations off "
            f"the device. An offload goes from 'device' to a host kind ({sorted_list(_HOST_KINDS)})."
            " Fix: offload_src: device, offload_dst: pinned_host (the defaults), or use 'save' "
            "to keep activations on device."
        )


def _bool_hint(value: Any) -> str:
    if isinstance(value, bool):
        return ("\n(A boolean: YAML 1.1 reads unquoted on/off/yes/no/true/false as booleans. If "
                "you meant the word, quote it: 'off'.)")
    return ""


def parse_annotation(
    value: Any, *, path: str | None = None, source: str | None = None
) -> Annotation:
    """Parses an annotation value (a string, a mapping or an :class:`Annotation`).

    Args:
      value: ``"inherit"``, ``"save"``, ``"recompute"``, ``"offload"``, ``"dots"``,
        ``"dots_no_batch"``, ``"offload_dots_no_batch"``, ``"custom"``, a mapping ``{"save": [...], "offload": [...]}``
        (optionally with ``offload_src`` / ``offload_dst``), or ``{"remat": KIND, ...}``; or a
        ``jax.checkpoint`` policy (``jax.checkpoint_policies.dots_saveable``,
        ``save_only_these_names("h")``, ...), read as the annotation that means the same
        (:func:`from_jax_policy`; one the vocabulary cannot express is refused, naming the
        annotation to write).
      path: the module path the value belongs to, for error messages.
      source: ``file:line`` the value came from, for error messages.

    Returns:
      The frozen :class:`Annotation`.

    Raises:
      AnnotationError: naming the value, the allowed values and the fix.

    >>> parse_annotation("recompute")
    Annotation(kind='recompute', save=frozenset(), offload=frozenset(), offload_src=None, offload_dst=None, nested=None, tag=None)
    """
    if isinstance(value, Annotation):
        return value
    if isinstance(value, str) and value in _STRING_ANNOTATIONS:
        return _STRING_ANNOTATIONS[value]
    if is_jax_policy(value):  # migrating jax.checkpoint code: the annotation it means
        return parse_annotation(from_jax_policy(value, path=path, source=source), path=path,
                                source=source)

    def unknown(v: Any) -> AnnotationError:  # built only on failure, bounded in size
        return AnnotationError(_MSG_UNKNOWN.format(
            where=where(path, source), value=short(v), allowed=sorted_list(STRING_KINDS),
            keys=sorted_list(MAPPING_KEYS), hint=_bool_hint(v),
        ))

    if isinstance(value, str):
        if value not in STRING_KINDS:
            raise unknown(value)
        return _STRING_ANNOTATIONS[value]
    if not isinstance(value, Mapping):
        raise unknown(value)
    bad = set(map(str, value)) - MAPPING_KEYS
    if bad:
        raise AnnotationError(
            f"{where(path, source)}unknown key(s) {sorted_list(bad)} in annotation {short(value)}. "
            f"Allowed keys: {sorted_list(MAPPING_KEYS)}."
        )
    if TAG_KEY in value:  # the output's name; the rest of the mapping is the module's annotation
        tag = _tag(value[TAG_KEY], value, path, source)
        rest = {k: v for k, v in value.items() if k != TAG_KEY}
        inner = parse_annotation(rest or "inherit", path=path, source=source)
        return dataclasses.replace(inner, tag=tag)
    if NESTED_KEY in value:  # a stack's block size; the rest of the mapping is the layers' own
        nested = parse_nested(value[NESTED_KEY], value, path=path, source=source)
        rest = {k: v for k, v in value.items() if k != NESTED_KEY}
        inner = parse_annotation(rest or "inherit", path=path, source=source)
        return dataclasses.replace(inner, nested=nested)
    src = value.get("offload_src")
    dst = value.get("offload_dst")
    src = None if src is None else _memory_kind(src, "offload_src", value, path, source)
    dst = None if dst is None else _memory_kind(dst, "offload_dst", value, path, source)
    if "remat" in value:
        if "save" in value or "offload" in value:
            raise AnnotationError(
                f"{where(path, source)}annotation {short(value)} mixes 'remat' with name lists. "
                "Fix: use either {'remat': KIND} or {'save': [...], 'offload': [...]}."
            )
        kind = value["remat"]
        if not isinstance(kind, str) or kind not in STRING_KINDS:
            raise unknown(kind)
        if (src or dst) and kind not in OFFLOAD_KINDS:
            raise AnnotationError(
                f"{where(path, source)}offload_src/offload_dst given with remat={kind!r}, which moves "
                "nothing to host. Fix: drop them, or use remat: offload (or offload_dots_no_batch)."
            )
        if src or dst:
            check_memory_kinds(src or DEFAULT_OFFLOAD_SRC, dst or DEFAULT_OFFLOAD_DST,
                               "annotation", source, path)
        return Annotation(kind, offload_src=src, offload_dst=dst)  # type: ignore[arg-type]
    if "save" not in value and "offload" not in value:
        raise AnnotationError(
            f"{where(path, source)}annotation {short(value)} names no activations. "
            "Fix: add 'save': [...] and/or 'offload': [...], or use {'remat': KIND}."
        )
    save = _names(value.get("save", ()), "save", value, path, source)
    off = _names(value.get("offload", ()), "offload", value, path, source)
    if not save and not off:
        raise AnnotationError(
            f"{where(path, source)}annotation {short(value)} names no activations (its lists are "
            "empty): it would be a boundary that recomputes everything while looking like it keeps "
            "something. Fix: list names, or write 'recompute' if recomputing everything is meant."
        )
    both = save & off
    if both:
        raise AnnotationError(
            _MSG_BOTH.format(where=where(path, source), names=sorted_list(both), value=short(value))
        )
    if (src or dst) and not off:
        raise AnnotationError(
            f"{where(path, source)}offload_src/offload_dst given in {short(value)} but nothing is "
            "offloaded. Fix: list names under 'offload', or drop the memory kinds."
        )
    if src or dst:
        check_memory_kinds(src or DEFAULT_OFFLOAD_SRC, dst or DEFAULT_OFFLOAD_DST, "annotation",
                           source, path)
    return Annotation("names", save=save, offload=off, offload_src=src, offload_dst=dst)
