"""Plans: ordered ``(path pattern, annotation)`` rules with defaults, from Python or from files."""

from __future__ import annotations

import bisect
import dataclasses
import errno
import hashlib
import json
import os
import stat
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Final

from ._annotation import (
    MAPPING_KEYS,
    DEFAULT_OFFLOAD_DST,
    DEFAULT_OFFLOAD_SRC,
    STRING_KINDS,
    Annotation,
    check_memory_kinds,
    parse_annotation,
)
from ._errors import PlanError, PlanTypeError, short, sorted_list, type_error
from ._pattern import check_pattern, compiled, compiled_or_error
from ._state import StatePlacement
from ._yaml import load_yaml as load_yaml
from ._yaml import value_error

#: Plan files larger than this are refused (a plan is rules, not data): a file at the limit loads
#: in about 10 s of CPU in any format (benchmarks/bad_input_scaling.py).
MAX_PLAN_BYTES: Final = 16 * 1024 * 1024
#: The JSON Schema of plan files, package data of ``remat_common`` (:meth:`Plan.json_schema`).
SCHEMA_FILE: Final = "plan.schema.json"
_DEFAULT_KEYS: Final = frozenset({"offload_src", "offload_dst", "mode", "nesting"})
_TOP_KEYS: Final = frozenset({"defaults", "rules", "state"})
_RULE_KEYS: Final = frozenset({"pattern", "remat"})
_MODES: Final = frozenset({"strict", "lenient"})

_MSG_FILE_LAYOUT = """\
{source}: a plan file has the top-level keys {top} and nothing else, for example

    defaults:            # optional
      offload_dst: pinned_host
      mode: strict       # or lenient: patterns that match nothing only warn
    rules:               # later rules win
      "layers.*": recompute
      "layers.*.attn": {{save: [attn_out]}}
    state:               # optional: where training state lives between steps
      optimizer: host    # host | device (default device)

Found: {found}."""


def _check_pattern(pattern: Any, source: str | None) -> str:
    return check_pattern(pattern, source)


@dataclasses.dataclass(frozen=True)
class Rule:
    """One plan rule: modules whose path matches ``pattern`` get ``annotation``."""

    pattern: str
    annotation: Annotation
    source: str | None = dataclasses.field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.pattern, str):
            check_pattern(self.pattern, self.source)
        compiled_or_error(self.pattern, self.source)
        if not isinstance(self.annotation, Annotation):
            raise type_error("Rule", "annotation", self.annotation, "an Annotation",
                             "use parse_annotation(value), or Plan.from_rules([(pattern, value)]).")

    def matches(self, path: str) -> bool:
        return compiled(self.pattern).matches(path)


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
      state: where the training state lives between steps (:class:`StatePlacement`; a mapping
        ``{"optimizer": "host", "params": "device"}`` is accepted): all on device by default.
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
    state: StatePlacement = StatePlacement()

    def __post_init__(self) -> None:
        object.__setattr__(self, "state", StatePlacement.coerce(self.state, self.source))
        rules = self.rules
        if isinstance(rules, list) and all(isinstance(r, Rule) for r in rules):
            object.__setattr__(self, "rules", tuple(rules))
        elif not isinstance(rules, tuple) or not all(isinstance(r, Rule) for r in rules):
            raise type_error(
                "Plan", "rules", rules, "a tuple of remat_common.Rule",
                "build plans with Plan.from_mapping({pattern: annotation}), "
                "Plan.from_rules([(pattern, annotation), ...]) or Plan.coerce(...).")
        for key in ("strict", "nesting"):
            v = getattr(self, key)
            if not isinstance(v, bool):
                raise type_error("Plan", key, v, "True or False",
                                 "pass a bool (strings such as 'false' are not read as booleans).")
        check_memory_kinds(self.offload_src, self.offload_dst, "Plan", self.source)

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def from_mapping(cls, rules: Mapping[str, Any], **defaults: Any) -> Plan:
        """A plan from ``{pattern: annotation}`` (insertion order is rule order)."""
        if not isinstance(rules, Mapping):
            raise type_error("Plan.from_mapping", "rules", rules, "a mapping {pattern: annotation}",
                             "use Plan.from_rules for a list of (pattern, annotation) pairs.")
        return cls.from_rules(list(rules.items()), **defaults)

    @classmethod
    def from_rules(
        cls, rules: Iterable[Any], *, sources: Iterable[str | None] | None = None, **defaults: Any
    ) -> Plan:
        """A plan from ``(pattern, annotation)`` pairs or ``{"pattern": P, "remat": A}`` items."""
        if isinstance(rules, str | bytes | Mapping) or not isinstance(rules, Iterable):
            raise type_error(
                "Plan.from_rules", "rules", rules,
                "a list of (pattern, annotation) pairs or {'pattern': P, 'remat': A} items",
                "use Plan.from_mapping for a mapping, Plan.load for a file path.")
        state = defaults.pop("state", None)
        items = list(rules)
        srcs = list(sources) if sources is not None else [None] * len(items)
        out = []
        for item, src in zip(items, srcs, strict=True):
            loc = f"{src}: " if src else ""
            if isinstance(item, Rule):
                out.append(item)
                continue
            if isinstance(item, Mapping):
                keys = set(map(str, item))
                if keys == _RULE_KEYS:
                    pattern, value = item["pattern"], item["remat"]
                elif keys & _RULE_KEYS:
                    lacks, extra = _RULE_KEYS - keys, keys - _RULE_KEYS
                    what = " and ".join(  # only what is wrong ("has extra nothing" was printed)
                        ([f"lacks {sorted_list(lacks)}"] if lacks else [])
                        + ([f"has extra {sorted_list(extra)}"] if extra else []))
                    fix = " and ".join((["add the missing key"] if lacks else [])
                                       + (["remove the extra one(s)"] if extra else []))
                    raise PlanError(
                        f"{loc}rule {short(dict(item))} {what}. A rule in list form is "
                        "{'pattern': P, 'remat': A} (both keys, nothing else) or {P: A}. "
                        f"Fix: {fix}."
                    )
                elif len(item) == 1:
                    ((pattern, value),) = item.items()
                else:
                    raise PlanError(
                        f"{loc}rule {short(dict(item))} must be "
                        "{pattern: annotation} or {'pattern': P, 'remat': A}. Fix: one rule per "
                        "list item."
                    )
            elif isinstance(item, tuple | list) and len(item) == 2:
                pattern, value = item
            else:
                raise PlanError(
                    f"{loc}cannot read rule {short(item)} ({type(item).__name__}): expected a "
                    "(pattern, annotation) pair. Fix: write each rule as (pattern, annotation)."
                )
            pattern = _check_pattern(pattern, src)
            out.append(Rule(pattern, parse_annotation(value, path=pattern, source=src), src))
        return cls(rules=tuple(out), state=StatePlacement.coerce(state),
                   **_check_defaults(defaults, None))

    @classmethod
    def from_config(cls, config: Any, *, source: str | None = None,
                    lines: Callable[[Any], str | None] | None = None) -> Plan:
        """A plan from the parsed contents of a plan file (``defaults`` and ``rules``)."""
        src = source or "<config>"
        if not isinstance(config, Mapping) or not set(config) <= _TOP_KEYS or "rules" not in config:
            found = sorted_list(config) if isinstance(config, Mapping) else (
                f"a {type(config).__name__} {short(config)}")
            raise PlanError(_MSG_FILE_LAYOUT.format(source=src, top=sorted_list(_TOP_KEYS), found=found))
        raw_defaults = config.get("defaults")
        defaults = _check_defaults({} if raw_defaults is None else raw_defaults, src)
        rules = config["rules"]
        if isinstance(rules, Mapping):
            items: list[Any] = list(rules.items())
        elif isinstance(rules, list):
            items = rules
        else:
            raise PlanError(
                f"{src}: 'rules' must be a mapping {{pattern: annotation}} or a list of rules, got "
                f"{type(rules).__name__} {short(rules)}."
            )
        sources = [lines(i) if lines else src for i in range(len(items))]
        state = StatePlacement.coerce(config.get("state"), src)
        plan = cls.from_rules(items, sources=sources, state=state, **defaults)
        return dataclasses.replace(plan, source=source)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Plan:
        """Loads a plan from a YAML (``.yaml``/``.yml``), TOML (``.toml``) or JSON file.

        Raises:
          PlanError: the file is missing, not a regular file, larger than
            :data:`MAX_PLAN_BYTES`, not UTF-8, or not a valid plan (with file and line).
        """
        if not isinstance(path, str | os.PathLike):
            raise type_error("Plan.load", "path", path, "a file path (str or os.PathLike)")
        p = Path(path)
        suffix = p.suffix.lower()
        if suffix not in (".yaml", ".yml", ".toml", ".json"):
            if p.is_dir() or p.is_symlink():  # a directory or a link loop: say that, not the suffix
                read_text_file(p, "plan file", MAX_PLAN_BYTES)
            hint = ""
            if isinstance(path, str) and path in STRING_KINDS:  # annotate(model, "recompute")
                hint = (f" {path!r} is an annotation, not a plan: for the whole model write "
                        f"{{'.': {path!r}}}, for each layer {{'layers.*': {path!r}}}.")
            raise PlanError(
                f"plan file {short(str(p))}: unknown format {short(suffix)}. Allowed: '.json', "
                f"'.toml', '.yaml', '.yml'.{hint} Fix: rename the file or convert it."
            )
        text = read_text_file(p, "plan file", MAX_PLAN_BYTES)
        if suffix in (".yaml", ".yml"):
            return _load_yaml(text, str(p))
        if suffix == ".toml":
            return _load_toml(text, str(p))
        return _load_json(text, str(p))

    @classmethod
    def preset(cls, name: str) -> Plan:
        """A plan shipped with the package, by ``GROUP:NAME`` (:func:`presets` lists them):
        MaxText's ``remat_policy`` presets, one boundary per layer of a stack at ``blocks``, by
        the example GPTs' tag names (``remat tune --plans maxtext:minimal_offloaded``).

        >>> Plan.preset("maxtext:full").rules[0].pattern
        'blocks.*'
        """
        group, sep, stem = name.partition(":") if isinstance(name, str) else ("", "", "")
        known = presets()
        if not sep or name not in known:
            raise PlanError(
                f"unknown preset {short(name)}. Presets: {sorted_list(known)}. Fix: give one of "
                "them as GROUP:NAME, or a plan file path.")
        return cls.load(known[name])

    @classmethod
    def coerce(cls, plan: Any) -> Plan:
        """Accepts a Plan, a ``{pattern: annotation}`` mapping, a list of rules, or a file path."""
        if isinstance(plan, Plan):
            return plan
        if isinstance(plan, str | os.PathLike):
            return cls.load(plan)
        if isinstance(plan, Mapping):
            return cls.from_mapping(plan)
        if isinstance(plan, Iterable) and not isinstance(plan, bytes):
            return cls.from_rules(plan)
        raise PlanTypeError(
            f"Plan.coerce: cannot make a plan from {type(plan).__name__} {short(plan)}. Give a "
            "remat_common.Plan, a {pattern: annotation} mapping, a list of (pattern, annotation) "
            "pairs, or a YAML/TOML/JSON path."
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
            # only when set: plans without it keep their fingerprints
            **({} if self.state.is_default else {"state": self.state.to_config()}),
        }

    @staticmethod
    def json_schema() -> dict[str, Any]:
        """The JSON Schema (draft 2020-12) of plan files, shipped with the package as
        ``remat_common/plan.schema.json``: point an editor at it for completion and checks
        (https://github.com/jax-remat-plan/jax-remat-plan/blob/main/docs/semantics.md#plan-files-in-an-editor).
        ``Plan.load`` remains the judge: it also checks what a schema cannot (patterns, duplicate
        keys, a name listed twice).

        >>> Plan.json_schema()["required"]
        ['rules']
        """
        from importlib.resources import files

        return dict(json.loads(files("remat_common").joinpath(SCHEMA_FILE).read_text("utf-8")))

    def describe(self) -> str:
        """The plan in a few lines: each rule, its defaults, and where training state lives.

        >>> print(Plan.from_mapping({"blocks.*": "recompute"}, state={"optimizer": "host"}).describe())
        blocks.*: recompute
        state between steps: optimizer state on host (pinned_host), parameters on device
        """
        lines = [f"{r.pattern}: {r.annotation}" for r in self.rules] or ["(no rules)"]
        if (self.offload_src, self.offload_dst) != (DEFAULT_OFFLOAD_SRC, DEFAULT_OFFLOAD_DST):
            lines.append(f"offload: {self.offload_src} -> {self.offload_dst}")
        if not self.strict or self.nesting:
            lines.append(f"mode: {'strict' if self.strict else 'lenient'}, nesting: {self.nesting}")
        if not self.state.is_default:
            lines.append(f"state between steps: {self.state.describe()}")
        return "\n".join(lines)

    def fingerprint(self) -> str:
        """A short stable hash of the plan's content (not of where it was loaded from)."""
        blob = json.dumps(self.to_config(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def with_defaults(self, **defaults: Any) -> Plan:
        state = defaults.pop("state", self.state)
        return dataclasses.replace(self, state=StatePlacement.coerce(state, self.source),
                                   **_check_defaults(defaults, self.source))

    def __add__(self, other: Plan) -> Plan:
        """Rules of ``self`` then ``other`` (so ``other`` wins); defaults of ``self``."""
        return dataclasses.replace(self, rules=self.rules + Plan.coerce(other).rules)


#: The folder of the shipped presets (package data: ``remat_common/presets/GROUP/NAME.yaml``).
PRESETS_DIR: Final = Path(__file__).resolve().parent / "presets"


def presets() -> dict[str, Path]:
    """``{"GROUP:NAME": file}`` for every plan shipped in the package (:meth:`Plan.preset`).

    >>> "maxtext:minimal_offloaded" in presets()
    True
    """
    return {f"{f.parent.name}:{f.stem}": f for f in sorted(PRESETS_DIR.glob("*/*.yaml"))}


def _check_defaults(defaults: Any, source: str | None) -> dict[str, Any]:
    loc = f"{source}: " if source else ""
    if not isinstance(defaults, Mapping):
        raise PlanError(
            f"{loc}'defaults' must be a mapping such as {{mode: strict, offload_dst: pinned_host}}, "
            f"got {type(defaults).__name__} {short(defaults)}. Fix: write a mapping, or leave it out."
        )
    bad = set(map(str, defaults)) - _DEFAULT_KEYS - {"strict"}
    if bad:
        raise PlanError(
            f"{loc}unknown default(s) {sorted_list(bad)}. Allowed: {sorted_list(_DEFAULT_KEYS)}."
        )
    out: dict[str, Any] = {}
    for key in ("offload_src", "offload_dst"):
        if key in defaults:
            v = defaults[key]
            if not isinstance(v, str) or not v:
                raise PlanError(
                    f"{loc}default {key} must be a memory kind string such as 'device' or "
                    f"'pinned_host', got {type(v).__name__} {short(v)}."
                )
            out[key] = v
    if "mode" in defaults:
        mode = defaults["mode"]
        if not isinstance(mode, str) or mode not in _MODES:
            raise PlanError(
                f"{loc}unknown mode {short(mode)}. Allowed: {sorted_list(_MODES)}."
                + _yaml_bool_hint(mode)
            )
        out["strict"] = mode == "strict"
    for key in ("strict", "nesting"):
        if key in defaults:
            v = defaults[key]
            if not isinstance(v, bool):
                raise PlanError(
                    f"{loc}{key} must be true or false (a boolean), got {type(v).__name__} "
                    f"{short(v)}. Fix: write {key}: true or {key}: false, unquoted."
                )
            if key == "strict" and "strict" in out and out["strict"] != v:
                raise PlanError(
                    f"{loc}mode: {defaults['mode']} and strict: {str(v).lower()} disagree. "
                    "Fix: give only one of them (mode: strict | lenient)."
                )
            out[key] = v
    check_memory_kinds(out.get("offload_src", DEFAULT_OFFLOAD_SRC),
                       out.get("offload_dst", DEFAULT_OFFLOAD_DST), "defaults", source)
    return out


def _yaml_bool_hint(value: Any) -> str:
    if isinstance(value, bool):
        return (" YAML 1.1 reads unquoted on/off/yes/no/true/false as booleans. Fix: quote the "
                "value (e.g. 'off').")
    return ""


# -- files ----------------------------------------------------------------------------------------
def read_text_file(path: Path, what: str, limit: int) -> str:
    """The UTF-8 text of a regular file, or a :class:`PlanError` that says what is wrong with it."""
    name = short(str(path))
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise PlanError(f"{what} {name} does not exist. Fix: check the path.") from None
    except OSError as e:
        why = ("is a symbolic link loop" if e.errno == errno.ELOOP
               else f"cannot be read ({e.strerror})")
        raise PlanError(f"{what} {name} {why}. Fix: point at a readable file.") from None
    if stat.S_ISDIR(st.st_mode):
        raise PlanError(f"{what} {name} is a directory. Fix: give the path of a file inside it.")
    if not stat.S_ISREG(st.st_mode):
        raise PlanError(
            f"{what} {name} is not a regular file (a device, FIFO or socket). Fix: give the path "
            "of a file."
        )
    if st.st_size > limit:
        raise PlanError(
            f"{what} {name} is {st.st_size / 2**20:.1f} MiB; at most {limit / 2**20:.0f} MiB are "
            "read. Fix: a plan is a list of rules: use globs ('layers.*', '**.mlp') and ranges "
            "('layers.[0-11]') instead of one rule per module."
        )
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise PlanError(f"{what} {name} cannot be read ({e.strerror}).") from None
    if len(data) > limit:
        raise PlanError(f"{what} {name} is larger than {limit / 2**20:.0f} MiB.")
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise PlanError(
            f"{path}:{line}: {what} is not UTF-8 text (byte {data[e.start]:#04x} at offset "
            f"{e.start}). Fix: save the file as UTF-8."
        ) from None


class _Lines:
    """Line numbers of offsets in a text (binary search over newline offsets)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.starts = [0]
        pos = text.find("\n")
        while pos != -1:
            self.starts.append(pos + 1)
            pos = text.find("\n", pos + 1)

    def line(self, offset: int) -> int:
        return bisect.bisect_right(self.starts, offset)


def _load_yaml(text: str, source: str) -> Plan:
    data, rule_lines = load_yaml(text, source)

    def lines(i: int) -> str:
        return f"{source}:{rule_lines[i]}" if i < len(rule_lines) else source

    return Plan.from_config(data, source=source, lines=lines)


def _rule_offsets(text: str, needles: list[list[str]], start: int) -> list[int]:
    """For each rule, the offset of the first of its spellings found after the previous rule's."""
    out = []
    pos = start
    full_scans = 64  # a spelling that does not occur must not cost a scan of the rest of the file
    find = text.find

    def earliest(spellings: list[str], end: int | None) -> int:
        best = -1
        for n in spellings:  # each later spelling only before the best found so far
            i = find(n, pos, end if best < 0 else best + len(n))
            if i >= 0 and (best < 0 or i + (n[0] == "\n") < best):
                best = i + (n[0] == "\n")
        return best

    for spellings in needles:  # per rule (that would be quadratic): search a window first
        best = earliest(spellings, pos + 512 + 8 * max(map(len, spellings), default=0))
        if best < 0 and spellings and full_scans > 0:
            full_scans -= 1
            best = earliest(spellings, None)
        out.append(best)
        if best >= 0:
            pos = best + 1
    return out


def _rule_needles(rules: Any, quote: Callable[[str], list[str]]) -> list[list[str]]:
    if isinstance(rules, Mapping):
        return [quote(str(k)) for k in rules]
    if isinstance(rules, list):
        out = []
        for item in rules:
            if isinstance(item, Mapping) and isinstance(item.get("pattern"), str):
                out.append(quote(item["pattern"]))
            elif isinstance(item, Mapping) and "pattern" in item:
                out.append(["pattern"])
            elif isinstance(item, Mapping) and len(item) == 1:
                out.append(quote(str(next(iter(item)))))
            else:
                out.append([])
        return out
    return []


def _lines_for(text: str, source: str, rules: Any, quote: Callable[[str], list[str]],
               anchor: str) -> Callable[[int], str]:
    start = max(text.find(anchor), 0)
    offsets = _rule_offsets(text, _rule_needles(rules, quote), start)
    index = _Lines(text)

    def lines(i: int) -> str:
        if i < len(offsets) and offsets[i] >= 0:
            return f"{source}:{index.line(offsets[i])}"
        return f"{source}:{index.line(start)}"  # not found: where the rules begin

    return lines


def _load_toml(text: str, source: str) -> Plan:
    import tomllib

    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise PlanError(f"{source}: invalid TOML: {short(str(e), 300)}") from None
    except RecursionError:  # tomllib parses nested arrays and tables recursively
        raise PlanError(f"{source}: TOML nested too deeply to be a plan.") from None
    except ValueError as e:  # an integer longer than int() reads (4,300 digits)
        raise PlanError(f"{source}: invalid TOML: {value_error(e)}") from None
    rules = data.get("rules")
    if isinstance(rules, Mapping):
        for key, value in rules.items():
            if isinstance(value, Mapping) and not set(value) <= MAPPING_KEYS and all(
                    isinstance(v, Mapping) or v in STRING_KINDS for v in value.values()):
                raise PlanError(
                    f"{source}: rule {short(key)} is a table with keys {sorted_list(value)}: TOML "
                    "reads an unquoted dotted key (layers.0 = ...) as nested tables. Fix: quote "
                    f"the pattern: \"{key}.{next(iter(value))}\" = ..."
                )

    def quote(k: str) -> list[str]:
        return [f'"{k}"', f"'{k}'", f"\n{k} ", f"\n{k}="]

    return Plan.from_config(data, source=source,
                            lines=_lines_for(text, source, rules, quote, "rules"))


def _load_json(text: str, source: str) -> Plan:
    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in pairs:
            if k in out:
                raise _DuplicateKey(k)
            out[k] = v
        return out

    try:
        data = json.loads(text, object_pairs_hook=unique)
    except json.JSONDecodeError as e:
        raise PlanError(f"{source}:{e.lineno}: invalid JSON: {e.msg} (column {e.colno}).") from None
    except ValueError as e:  # an integer longer than int() reads (4,300 digits)
        raise PlanError(f"{source}: invalid JSON: {value_error(e)}") from None
    except _DuplicateKey as e:
        needle = json.dumps(e.key, ensure_ascii=False)
        idx = _Lines(text)
        first = text.find(needle)
        second = text.find(needle, first + 1) if first >= 0 else -1
        where_ = f":{idx.line(second)}" if second >= 0 else ""
        first_at = f" (first at line {idx.line(first)})" if first >= 0 else ""
        raise PlanError(
            f"{source}{where_}: key {short(e.key)} appears twice in one JSON object{first_at}; "
            "JSON readers silently keep only the last. Fix: remove or merge one."
        ) from None
    except RecursionError:
        raise PlanError(f"{source}: JSON nested too deeply to be a plan.") from None

    def quote(k: str) -> list[str]:
        if k.isascii() and k.isprintable() and '"' not in k and "\\" not in k:
            return [f'"{k}"']
        return [json.dumps(k, ensure_ascii=False), json.dumps(k)]

    rules = data.get("rules") if isinstance(data, Mapping) else None
    return Plan.from_config(data, source=source,
                            lines=_lines_for(text, source, rules, quote, '"rules"'))


class _DuplicateKey(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key
