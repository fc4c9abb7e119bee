"""Plans: ordered ``(path pattern, annotation)`` rules with defaults, from Python or from files."""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import json
import os
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Final

from ._annotation import DEFAULT_OFFLOAD_DST, DEFAULT_OFFLOAD_SRC, Annotation, parse_annotation
from ._errors import PlanError, sorted_list

ROOT_PATTERN: Final = "."
_DEFAULT_KEYS: Final = frozenset({"offload_src", "offload_dst", "mode", "nesting"})
_TOP_KEYS: Final = frozenset({"defaults", "rules"})
_RULE_KEYS: Final = frozenset({"pattern", "remat"})
_MODES: Final = frozenset({"strict", "lenient"})
_RANGE = re.compile(r"^\[(\d+)-(\d+)\]$")

_MSG_FILE_LAYOUT = """\
{source}: a plan file has the top-level keys {top} and nothing else, for example

    defaults:            # optional
      offload_dst: pinned_host
      mode: strict       # or lenient: patterns that match nothing only warn
    rules:               # later rules win
      "layers.*": recompute
      "layers.*.attn": {{save: [attn_out]}}

Found: {found}."""


def _check_pattern(pattern: Any, source: str | None) -> str:
    loc = f"{source}: " if source else ""
    if not isinstance(pattern, str) or not pattern.strip():
        raise PlanError(
            f"{loc}empty or non-string path pattern {pattern!r}. Fix: write a dotted module path "
            f"such as 'layers.*.mlp' or 'layers.[0-3]', or {ROOT_PATTERN!r} for the whole model."
        )
    if pattern != ROOT_PATTERN and any(seg == "" for seg in pattern.split(".")):
        raise PlanError(
            f"{loc}path pattern {pattern!r} has an empty segment. Fix: separate module names by "
            "single dots, e.g. 'layers.0.attn'."
        )
    return pattern


def _segment_match(seg: str, pat: str) -> bool:
    m = _RANGE.match(pat)
    if m:
        return seg.isdigit() and int(m.group(1)) <= int(seg) <= int(m.group(2))
    return fnmatch.fnmatchcase(seg, pat)


def _match(segs: tuple[str, ...], pats: tuple[str, ...]) -> bool:
    if not pats:
        return not segs
    if pats[0] == "**":
        return any(_match(segs[i:], pats[1:]) for i in range(len(segs) + 1))
    return bool(segs) and _segment_match(segs[0], pats[0]) and _match(segs[1:], pats[1:])


def path_matches(pattern: str, path: str) -> bool:
    """Whether a dotted module path matches a plan pattern.

    Segments are globs (``*`` one segment, ``**`` any number, ``[0-3]`` a numeric range,
    ``?`` and ``[ab]`` as in :mod:`fnmatch`); ``.`` alone is the root module.

    >>> path_matches("layers.*.mlp", "layers.3.mlp")
    True
    >>> path_matches("layers.[0-11]", "layers.10")
    True
    >>> path_matches("layers.*", "layers.3.mlp")
    False
    """
    if pattern == ROOT_PATTERN:
        return path == ""
    if path == "":
        return False
    return _match(tuple(path.split(".")), tuple(pattern.split(".")))


@dataclasses.dataclass(frozen=True)
class Rule:
    """One plan rule: modules whose path matches ``pattern`` get ``annotation``."""

    pattern: str
    annotation: Annotation
    source: str | None = dataclasses.field(default=None, compare=False)

    def matches(self, path: str) -> bool:
        return path_matches(self.pattern, path)


PlanLike = "Plan | Mapping[str, Any] | Iterable[tuple[str, Any]] | str | os.PathLike[str]"


@dataclasses.dataclass(frozen=True)
class Plan:
    """An ordered list of rules over dotted module paths, plus defaults. Later rules win.

    Attributes:
      rules: the rules, in order.
      offload_src, offload_dst: default memory kinds for offloading (``device`` → ``pinned_host``).
      strict: a pattern that matches no module (or a name no tag produces) is an error; when False
        it is a warning.
      nesting: allow a remat boundary inside another one. Off by default: nested semantics differ
        between JAX versions, so the plan is resolved into one policy per boundary instead.
      source: the file the plan was loaded from, if any.

    >>> plan = Plan.from_mapping({"layers.*": "recompute", "layers.*.attn": {"save": ["attn_out"]}})
    >>> [str(r.annotation) for r in plan.rules]
    ['recompute', "{'save': ['attn_out'], 'offload': []}"]
    """

    rules: tuple[Rule, ...] = ()
    offload_src: str = DEFAULT_OFFLOAD_SRC
    offload_dst: str = DEFAULT_OFFLOAD_DST
    strict: bool = True
    nesting: bool = False
    source: str | None = dataclasses.field(default=None, compare=False)

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def from_mapping(cls, rules: Mapping[str, Any], **defaults: Any) -> Plan:
        """A plan from ``{pattern: annotation}`` (insertion order is rule order)."""
        return cls.from_rules(list(rules.items()), **defaults)

    @classmethod
    def from_rules(
        cls, rules: Iterable[Any], *, sources: Iterable[str | None] | None = None, **defaults: Any
    ) -> Plan:
        """A plan from ``(pattern, annotation)`` pairs or ``{"pattern": P, "remat": A}`` items."""
        items = list(rules)
        srcs = list(sources) if sources is not None else [None] * len(items)
        out = []
        for item, src in zip(items, srcs, strict=True):
            if isinstance(item, Rule):
                out.append(item)
                continue
            if isinstance(item, Mapping):
                if set(item) == _RULE_KEYS:
                    pattern, value = item["pattern"], item["remat"]
                elif len(item) == 1:
                    ((pattern, value),) = item.items()
                else:
                    raise PlanError(
                        f"{src + ': ' if src else ''}rule {dict(item)!r} must be "
                        "{pattern: annotation} or {'pattern': P, 'remat': A}."
                    )
            elif isinstance(item, tuple | list) and len(item) == 2:
                pattern, value = item
            else:
                raise PlanError(
                    f"{src + ': ' if src else ''}cannot read rule {item!r}: expected a "
                    "(pattern, annotation) pair."
                )
            pattern = _check_pattern(pattern, src)
            out.append(Rule(pattern, parse_annotation(value, path=pattern, source=src), src))
        return cls(rules=tuple(out), **_check_defaults(defaults, None))

    @classmethod
    def from_config(cls, config: Any, *, source: str | None = None,
                    lines: Callable[[Any], str | None] | None = None) -> Plan:
        """A plan from the parsed contents of a plan file (``defaults`` and ``rules``)."""
        src = source or "<config>"
        if not isinstance(config, Mapping) or not set(config) <= _TOP_KEYS or "rules" not in config:
            found = sorted_list(config) if isinstance(config, Mapping) else type(config).__name__
            raise PlanError(_MSG_FILE_LAYOUT.format(source=src, top=sorted_list(_TOP_KEYS), found=found))
        defaults = _check_defaults(config.get("defaults") or {}, src)
        rules = config["rules"]
        if isinstance(rules, Mapping):
            items: list[Any] = list(rules.items())
        elif isinstance(rules, list):
            items = rules
        else:
            raise PlanError(f"{src}: 'rules' must be a mapping or a list, got {type(rules).__name__}.")
        sources = [lines(i) if lines else src for i in range(len(items))]
        plan = cls.from_rules(items, sources=sources, **defaults)
        return dataclasses.replace(plan, source=source)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Plan:
        """Loads a plan from a YAML (``.yaml``/``.yml``), TOML (``.toml``) or JSON file."""
        p = Path(path)
        if not p.is_file():
            raise PlanError(f"plan file {str(p)!r} does not exist.")
        text = p.read_text()
        suffix = p.suffix.lower()
        if suffix in (".yaml", ".yml"):
            return _load_yaml(text, str(p))
        if suffix == ".toml":
            return _load_toml(text, str(p))
        if suffix == ".json":
            try:
                return cls.from_config(json.loads(text), source=str(p))
            except json.JSONDecodeError as e:
                raise PlanError(f"{p}:{e.lineno}: invalid JSON: {e.msg}") from None
        raise PlanError(
            f"plan file {str(p)!r}: unknown format {suffix!r}. Allowed: '.json', '.toml', '.yaml', '.yml'."
        )

    @classmethod
    def coerce(cls, plan: Any) -> Plan:
        """Accepts a Plan, a ``{pattern: annotation}`` mapping, a list of rules, or a file path."""
        if isinstance(plan, Plan):
            return plan
        if isinstance(plan, str | os.PathLike):
            return cls.load(plan)
        if isinstance(plan, Mapping):
            return cls.from_mapping(plan)
        if isinstance(plan, Iterable):
            return cls.from_rules(plan)
        raise PlanError(
            f"cannot make a plan from {type(plan).__name__} {plan!r}. Give a remat_common.Plan, a "
            "{pattern: annotation} mapping, a list of (pattern, annotation) pairs, or a YAML/TOML path."
        )

    # -- inspection -------------------------------------------------------------------------------
    def to_config(self) -> dict[str, Any]:
        """A JSON/YAML-able dict that :meth:`from_config` reads back to an equal plan."""
        return {
            "defaults": {
                "offload_src": self.offload_src, "offload_dst": self.offload_dst,
                "mode": "strict" if self.strict else "lenient", "nesting": self.nesting,
            },
            "rules": [{"pattern": r.pattern, "remat": r.annotation.to_config()} for r in self.rules],
        }

    def fingerprint(self) -> str:
        """A short stable hash of the plan's content (not of where it was loaded from)."""
        blob = json.dumps(self.to_config(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def with_defaults(self, **defaults: Any) -> Plan:
        return dataclasses.replace(self, **_check_defaults(defaults, self.source))

    def __add__(self, other: Plan) -> Plan:
        """Rules of ``self`` then ``other`` (so ``other`` wins); defaults of ``self``."""
        return dataclasses.replace(self, rules=self.rules + Plan.coerce(other).rules)


def _check_defaults(defaults: Any, source: str | None) -> dict[str, Any]:
    loc = f"{source}: " if source else ""
    if not isinstance(defaults, Mapping):
        raise PlanError(f"{loc}'defaults' must be a mapping, got {type(defaults).__name__}.")
    bad = set(defaults) - _DEFAULT_KEYS - {"strict"}
    if bad:
        raise PlanError(
            f"{loc}unknown default(s) {sorted_list(bad)}. Allowed: {sorted_list(_DEFAULT_KEYS)}."
        )
    out: dict[str, Any] = {}
    for key in ("offload_src", "offload_dst"):
        if key in defaults:
            v = defaults[key]
            if not isinstance(v, str) or not v:
                raise PlanError(f"{loc}default {key} must be a memory kind string, got {v!r}.")
            out[key] = v
    if "mode" in defaults:
        if defaults["mode"] not in _MODES:
            raise PlanError(
                f"{loc}unknown mode {defaults['mode']!r}. Allowed: {sorted_list(_MODES)}."
            )
        out["strict"] = defaults["mode"] == "strict"
    if "strict" in defaults:
        out["strict"] = bool(defaults["strict"])
    if "nesting" in defaults:
        if not isinstance(defaults["nesting"], bool):
            raise PlanError(f"{loc}nesting must be true or false, got {defaults['nesting']!r}.")
        out["nesting"] = defaults["nesting"]
    return out


def _load_yaml(text: str, source: str) -> Plan:
    try:
        import yaml
    except ImportError:  # pragma: no cover - PyYAML ships with every extra but the bare core
        raise PlanError(
            f"{source}: reading YAML plans needs PyYAML. Fix: pip install PyYAML (or use TOML/JSON)."
        ) from None
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise PlanError(f"{source}{line}: invalid YAML: {getattr(e, 'problem', e)}") from None
    rule_lines: list[int] = []
    if isinstance(root, yaml.MappingNode):
        for key, value in root.value:
            if key.value == "rules":
                if isinstance(value, yaml.MappingNode):
                    seen: dict[str, int] = {}
                    for k, _ in value.value:
                        line = k.start_mark.line + 1
                        if k.value in seen:
                            raise PlanError(
                                f"{source}:{line}: pattern {k.value!r} appears twice (first at line "
                                f"{seen[k.value]}). Later rules win, so the first is dead. Fix: merge them."
                            )
                        seen[k.value] = line
                        rule_lines.append(line)
                elif isinstance(value, yaml.SequenceNode):
                    rule_lines = [item.start_mark.line + 1 for item in value.value]

    def lines(i: int) -> str:
        return f"{source}:{rule_lines[i]}" if i < len(rule_lines) else source

    return Plan.from_config(data, source=source, lines=lines)


def _load_toml(text: str, source: str) -> Plan:
    import tomllib

    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise PlanError(f"{source}: invalid TOML: {e}") from None
    text_lines = text.splitlines()
    keys = list(data.get("rules", {})) if isinstance(data.get("rules"), Mapping) else []

    def lines(i: int) -> str:
        if i < len(keys):  # tomllib gives no positions: find the quoted key in the text
            for n, line in enumerate(text_lines, 1):
                stripped = line.lstrip()
                if stripped.startswith((f'"{keys[i]}"', f"'{keys[i]}'", f"{keys[i]} ", f"{keys[i]}=")):
                    return f"{source}:{n}"
        return source

    return Plan.from_config(data, source=source, lines=lines)
