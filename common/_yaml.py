"""Safe YAML for plan files, report configs and device profiles: one pass over the parser's events.

PyYAML's own loaders first compose a node graph (a Python object per node, resolver calls on the
way in and out) and then construct the data from it: about 14 s of CPU for a 10 MB plan written as
a list of rules. Building the data straight from the event stream costs a seventh of that and lets
every check happen on the way, with the line it concerns:

- a key that appears twice in one mapping (YAML would keep only the last, silently);
- aliases that expand to far more values than the file has characters (a "billion laughs"), and
  an alias to a value that contains it (a recursive alias);
- more than one document, anchors defined twice, aliases to no anchor, unhashable keys.

Scalars are resolved and constructed exactly as :class:`yaml.SafeLoader` does (YAML 1.1:
unquoted ``off`` is False), merge keys (``<<: *base``) are honoured, and tags other than the
standard ones are refused as SafeLoader refuses them.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, Final

from ._errors import PlanError, short

#: The most values a YAML text may expand to through aliases, per character of the text (plus a
#: constant, so that small files may use aliases freely).
EXPANSION_PER_CHAR: Final = 2
EXPANSION_SLACK: Final = 10_000

_TAG = "tag:yaml.org,2002:"
_STR, _MAP, _SEQ = _TAG + "str", _TAG + "map", _TAG + "seq"
_MERGE: Final = object()  # the key of a merge (<<) while its value is read
_SETS = (_TAG + "set",)
_PAIRS = (_TAG + "omap", _TAG + "pairs")
_COLLECTION_TAGS = frozenset({_MAP, _SEQ, *_SETS, *_PAIRS})


def value_error(e: ValueError) -> str:
    """What a ValueError from reading a number says, without Python's advice to raise its limit."""
    text = str(e)
    if "Exceeds the limit" in text and "digits" in text:
        return ("a number of more than 4,300 digits, longer than Python reads; a plan holds no such "
                "number. Fix: remove it.")
    return text[:200]


def _yaml_error(e: Exception, source: str) -> PlanError:
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    line = f":{mark.line + 1}" if mark is not None else ""
    problem = " ".join(str(getattr(e, "problem", None) or e).split())
    if len(problem) > 300:
        problem = problem[:297] + "..."
    return PlanError(f"{source}{line}: invalid YAML: {problem}")


class _Frame:
    """A mapping or sequence being built."""

    __slots__ = ("value", "is_map", "key", "has_key", "key_lines", "merges", "anchor", "start",
                 "line", "tag", "lines")

    def __init__(self, is_map: bool, anchor: str | None, start: int, line: int, tag: str | None,
                 lines: list[int] | None) -> None:
        self.value: Any = {} if is_map else []
        self.is_map = is_map
        self.key: Any = None
        self.has_key = False
        self.key_lines: dict[Any, int] = {}
        self.merges: list[tuple[Any, int]] = []
        self.anchor = anchor
        self.start = start  # the expansion count when the collection began
        self.line = line
        self.tag = tag
        self.lines = lines  # where to record the line of each item (the top-level 'rules' only)


def load_yaml(text: str, source: str, *, rules_key: str | None = "rules") -> tuple[Any, list[int]]:
    """Parses YAML safely: ``(data, lines)``, ``lines`` holding the line of each item of the
    top-level mapping's ``rules_key`` value (a mapping's keys or a sequence's items).

    Raises:
      PlanError: invalid YAML, or any of the refusals in the module docstring, with file and line.

    >>> load_yaml("rules:\\n  a: save\\n  b: {save: [x]}\\n", "p.yaml")
    ({'rules': {'a': 'save', 'b': {'save': ['x']}}}, [2, 3])
    """
    try:
        import yaml
        from yaml import events as ev
    except ImportError:  # pragma: no cover - PyYAML ships with every extra but the bare core
        raise PlanError(
            f"{source}: reading YAML needs PyYAML. Fix: pip install PyYAML (or use TOML/JSON)."
        ) from None
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)(text)
    limit = EXPANSION_PER_CHAR * len(text) + EXPANSION_SLACK
    scalar_node = yaml.ScalarNode
    constructors = loader.yaml_constructors
    scalar_t, alias_t = ev.ScalarEvent, ev.AliasEvent
    map_t, seq_t = ev.MappingStartEvent, ev.SequenceStartEvent
    end_t = (ev.MappingEndEvent, ev.SequenceEndEvent)
    anchors: dict[str, tuple[Any, int]] = {}  # name -> (value, values it expands to)
    open_anchors: set[str] = set()
    stack: list[_Frame] = []
    rule_lines: list[int] = []
    root: Any = None
    documents = 0
    count = 0  # values so far, aliases counted by what they expand to
    e: Any = None  # the event being read

    def where(e: Any) -> str:
        return f"{source}:{e.start_mark.line + 1}"

    def scalar(e: Any) -> Any:
        tag = e.tag
        if tag is None or tag == "!":
            tag = loader.resolve(scalar_node, e.value, e.implicit)
        if tag == _STR:
            return e.value
        if tag in _COLLECTION_TAGS:
            raise PlanError(f"{where(e)}: YAML tag {short(tag, 60)} on a scalar "
                            f"({short(e.value)}). Fix: remove the tag.")
        node = scalar_node(tag, e.value, e.start_mark, e.end_mark, e.style)
        make = constructors.get(tag) or constructors[None]  # None: SafeLoader's refusal
        return make(loader, node)

    def anchor_of(e: Any) -> None:
        name = e.anchor
        if name is not None and (name in anchors or name in open_anchors):
            raise PlanError(f"{where(e)}: the YAML anchor &{name[:60]} is defined twice. "
                            "Fix: give each anchor its own name.")

    def finish(f: _Frame) -> Any:
        value = f.value
        if f.merges:  # '<<: *base': the keys written here win, then the first mapping merged
            merged: dict[Any, Any] = {}
            for m, line in reversed(f.merges):
                for sub in (m if isinstance(m, list) else [m]):
                    if not isinstance(sub, dict):
                        raise PlanError(f"{source}:{line}: a YAML merge key (<<) takes a mapping "
                                        f"or a list of mappings, got {type(sub).__name__} "
                                        f"{short(sub)}.")
                for sub in reversed(m if isinstance(m, list) else [m]):
                    merged.update(sub)
            merged.update(value)
            value = merged
        if f.tag is not None and f.tag not in (_MAP, _SEQ):
            if f.tag in _SETS and f.is_map:
                value = set(value)
            elif f.tag in _PAIRS and not f.is_map:
                value = [next(iter(d.items())) if isinstance(d, dict) and len(d) == 1 else d
                         for d in value]
            else:
                raise PlanError(f"{source}:{f.line}: YAML tag {short(f.tag, 60)} is not "
                                "supported here (a plan file holds mappings, lists and "
                                "scalars). Fix: remove the tag.")
        return value

    def add(value: Any, line: int, merge_key: bool = False) -> None:
        nonlocal root
        if not stack:
            root = value
            return
        f = stack[-1]
        if not f.is_map:
            if f.lines is not None:
                f.lines.append(line)
            f.value.append(value)
            return
        if not f.has_key:
            if merge_key:
                f.key, f.has_key = _MERGE, True
                f.key_lines[_MERGE] = line
                return
            if not isinstance(value, Hashable):
                raise PlanError(f"{source}:{line}: a YAML mapping key must be a scalar, got "
                                f"{type(value).__name__} {short(value)}. Fix: quote the key.")
            first = f.key_lines.get(value)
            if first is not None:
                if f.lines is not None:
                    raise PlanError(f"{source}:{line}: pattern {short(value)} appears twice "
                                    f"(first at line {first}). Later rules win, so the first is "
                                    "dead. Fix: merge them.")
                raise PlanError(f"{source}:{line}: key {short(value)} appears twice in one "
                                f"mapping (first at line {first}); YAML would silently keep "
                                "only the last. Fix: remove or merge one.")
            f.key_lines[value] = line
            if f.lines is not None:
                f.lines.append(line)
            f.key, f.has_key = value, True
            return
        if f.key is _MERGE:
            f.merges.append((value, f.key_lines[_MERGE]))
        else:
            f.value[f.key] = value
        f.key, f.has_key = None, False

    try:
        while True:
            e = loader.get_event()
            t = type(e)
            if t is scalar_t:
                anchor_of(e)
                count += 1
                if (e.value == "<<" and e.tag is None and e.implicit[0] and stack
                        and stack[-1].is_map and not stack[-1].has_key):
                    add(None, e.start_mark.line + 1, merge_key=True)
                    continue
                value = scalar(e)
                if e.anchor is not None:
                    anchors[e.anchor] = (value, 1)
                add(value, e.start_mark.line + 1)
            elif t is map_t or t is seq_t:
                anchor_of(e)
                count += 1
                lines = None
                if (len(stack) == 1 and stack[0].is_map and stack[0].has_key
                        and rules_key is not None and stack[0].key == rules_key):
                    lines = rule_lines = []
                tag = None if e.tag in (None, "!") else e.tag
                stack.append(_Frame(t is map_t, e.anchor, count, e.start_mark.line + 1, tag,
                                    lines))
                if e.anchor is not None:
                    open_anchors.add(e.anchor)
            elif t in end_t:
                f = stack.pop()
                value = finish(f)
                if f.anchor is not None:
                    open_anchors.discard(f.anchor)
                    anchors[f.anchor] = (value, count - f.start + 1)
                add(value, f.line)
            elif t is alias_t:
                name = e.anchor
                if name in open_anchors:
                    raise PlanError(f"{where(e)}: a YAML alias refers to a value that contains it "
                                    "(a recursive alias). Fix: remove the alias.")
                if name not in anchors:
                    raise PlanError(f"{where(e)}: invalid YAML: the alias *{name[:60]} refers "
                                    "to no anchor defined before it. Fix: define "
                                    f"&{name[:60]} first, or remove the alias.")
                value, size = anchors[name]
                count += size
                if count > limit:
                    raise PlanError(
                        f"{where(e)}: the YAML aliases (*name) here expand to more than {limit} "
                        f"values, far more than the text's {len(text)} characters hold (an alias "
                        "bomb). Fix: write the plan without nested aliases.")
                add(value, e.start_mark.line + 1)
            elif t is ev.DocumentStartEvent:
                documents += 1
                if documents > 1:
                    raise PlanError(f"{where(e)}: invalid YAML: the file holds more than one "
                                    "document ('---'). Fix: keep one.")
            elif t is ev.StreamEndEvent:
                break
    except yaml.YAMLError as err:
        raise _yaml_error(err, source) from None
    except PlanError:  # a ValueError too: the refusals above, as they are
        raise
    except ValueError as err:  # a scalar's constructor: an integer longer than int() reads
        raise PlanError(f"{where(e) if e is not None else source}: invalid YAML: "
                        f"{value_error(err)}") from None
    finally:
        loader.dispose()
    return root, rule_lines
