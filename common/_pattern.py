"""Path patterns: parsing, a linear matcher, and an index that matches many patterns fast.

A pattern is a dotted list of segments. ``*`` (or any :mod:`fnmatch` glob) matches one segment,
``**`` any number of segments, ``[LO-HI]`` one integer segment in the closed range
(``[LO-HI:STEP]`` every STEP-th of them), ``name[LO-HI]`` a name with a numeric suffix in the
range (``down[1-2]``: ``down1``, ``down2``), and ``.`` alone is the root module. Matching runs as a set of states over the pattern (an NFA), one pass
over the path's segments: time ``O(len(path) * len(pattern))``, no backtracking, no recursion.
"""

from __future__ import annotations

import bisect
import dataclasses
import fnmatch
import functools
import re
from collections.abc import Iterable, Sequence
from typing import Final, Literal

from ._errors import PlanError, short

ROOT_PATTERN: Final = "."
#: Longest pattern accepted (characters); longer ones are refused with a clear error.
MAX_PATTERN_CHARS: Final = 10_000

_RANGE: Final = re.compile(r"^\[([0-9]+)-([0-9]+)(?::([0-9]+))?\]$")
# ``down[1-2]``: a numeric range over the numeric suffix of a name (``down1``, ``down2``).
_NAMED_RANGE: Final = re.compile(r"^([^\[\]*?0-9][^\[\]*?]*?)\[([0-9]+)-([0-9]+)(?::([0-9]+))?\]$")
# A bracket group holding a digit and a dash: meant as a numeric range whatever else it holds
# (also left unclosed, or with non-ASCII digits).
_RANGE_LIKE: Final = re.compile(r"\[[^\]]*(\d[^\]]*-|-[^\]]*\d)[^\]]*(\]|$)")
#: The most digits a range end may have (a module index is a machine integer).
_MAX_RANGE_DIGITS: Final = 18
_GLOB_CHARS: Final = frozenset("*?[")

SegKind = Literal["lit", "any", "deep", "range", "glob"]

_MSG_RANGE = """\
{loc}pattern {pattern} has segment {seg}, which is not a numeric range.
A range is '[LO-HI]' with LO <= HI, non-negative integers and no spaces, and an optional stride
'[LO-HI:STEP]': a whole segment ranges over layer indices ('layers.[0-3]', 'layers.[0-31:2]'),
after a name over its numeric suffix ('mlp.down[1-2]': down1, down2); '*' and other glob
characters cannot be added to it.
Fix: {fix}."""


@dataclasses.dataclass(frozen=True)
class Segment:
    """One parsed pattern segment."""

    kind: SegKind
    text: str
    lo: int = 0
    hi: int = -1
    regex: re.Pattern[str] | None = dataclasses.field(default=None, compare=False)
    step: int = 1
    #: ``name[LO-HI]``: the name whose numeric suffix the range covers (kind ``glob``).
    prefix: str = ""

    def matches(self, seg: str) -> bool:
        if self.kind == "lit":
            return seg == self.text
        if self.kind == "any":
            return True
        if self.kind == "range":
            return is_index(seg) and self.in_range(int(seg))
        assert self.regex is not None
        m = self.regex.match(seg)
        if m is None:
            return False
        return not self.prefix or self.in_range(int(m.group(1)))

    def in_range(self, value: int) -> bool:
        """Whether ``value`` is one of the range's indices (``lo``, ``lo + step``, ... ``<= hi``)."""
        return self.lo <= value <= self.hi and (value - self.lo) % self.step == 0

    def indices(self) -> range:
        return range(self.lo, self.hi + 1, self.step)


def is_index(seg: str) -> bool:
    """Whether a path segment is a layer index: ASCII digits only (``str.isdigit`` also accepts
    ``'²'``, which ``int`` refuses)."""
    return seg.isascii() and seg.isdigit()


def _range_error(pattern: str, seg: str, source: str | None, fix: str) -> PlanError:
    loc = f"{source}: " if source else ""
    return PlanError(_MSG_RANGE.format(loc=loc, pattern=short(pattern), seg=short(seg), fix=fix))


_LITERALS: dict[str, Segment] = {}


def _segment(seg: str, pattern: str, source: str | None) -> Segment:
    if "*" not in seg and "?" not in seg and "[" not in seg:
        lit = _LITERALS.get(seg)
        if lit is None:
            lit = Segment("lit", seg)
            if len(_LITERALS) < 65536:
                _LITERALS[seg] = lit
        return lit
    if seg == "**":
        return Segment("deep", seg)
    if seg == "*":
        return Segment("any", seg)
    m = _RANGE.match(seg)
    named = None if m else _NAMED_RANGE.match(seg)
    if named:
        prefix, m = named.group(1), _RANGE.match(seg[len(named.group(1)):])
    if m:
        lo_s, hi_s, step_s = m.group(1), m.group(2), m.group(3)
        if max(len(lo_s), len(hi_s), len(step_s or "")) > _MAX_RANGE_DIGITS:
            raise _range_error(pattern, seg, source,
                               f"write ends of at most {_MAX_RANGE_DIGITS} digits")
        lo, hi, step = int(lo_s), int(hi_s), int(step_s) if step_s is not None else 1
        head = prefix if named else ""
        tail = f":{step_s}" if step_s is not None else ""
        if lo > hi:
            raise _range_error(pattern, seg, source, f"write '{head}[{hi}-{lo}{tail}]'")
        if step < 1:
            raise _range_error(pattern, seg, source,
                               f"a stride is a positive integer: write '{head}[{lo}-{hi}:1]'")
        if named:
            return Segment("glob", seg, lo, hi, re.compile(re.escape(prefix) + r"([0-9]+)\Z"),
                           step, prefix)
        return Segment("range", seg, lo, hi, step=step)
    if _RANGE_LIKE.search(seg):
        nums = [int(n) for n in re.findall(r"[0-9]+", seg)[:3] if len(n) <= _MAX_RANGE_DIGITS]
        head = re.split(r"[\[*?]", seg, maxsplit=1)[0]
        if len(nums) == 2:
            lo, hi = min(nums), max(nums)
            fix = (f"write '{head}[{lo}-{hi}]' (the names {head}{lo} ... {head}{hi})"
                   if head and not head[0].isdigit() and not _GLOB_CHARS & set(head)
                   else f"write '[{lo}-{hi}]' as the whole segment (layer indices)")
        else:
            fix = "write both ends, e.g. '[0-3]'"
        raise _range_error(pattern, seg, source, fix + ", or '*' for any index")
    if not _GLOB_CHARS & set(seg):
        return Segment("lit", seg)
    return Segment("glob", seg, regex=re.compile(fnmatch.translate(seg)))


@dataclasses.dataclass(frozen=True)
class Pattern:
    """A parsed pattern: its segments (consecutive ``**`` folded into one)."""

    text: str
    segments: tuple[Segment, ...]

    @functools.cached_property
    def eps(self) -> tuple[tuple[int, ...], ...]:
        """For each state, the states reached without reading a segment (past any ``**``)."""
        pats = self.segments
        eps = []
        for i in range(len(pats) + 1):
            reach = [i]
            j = i
            while j < len(pats) and pats[j].kind == "deep":
                j += 1
                reach.append(j)
            eps.append(tuple(reach))
        return tuple(eps)

    def closure(self, states: Iterable[int]) -> frozenset[int]:
        """``states`` plus the states after any ``**`` they sit at (``**`` may match nothing)."""
        out: set[int] = set()
        for i in states:
            out.update(self.eps[i])
        return frozenset(out)

    @property
    def is_root(self) -> bool:
        return self.text == ROOT_PATTERN

    @property
    def is_literal(self) -> bool:
        return all(s.kind == "lit" for s in self.segments)

    def match_steps(self, segs: Sequence[str]) -> tuple[bool, int]:
        """Whether ``segs`` (a split module path) matches, and how many steps that took.

        A step is one (pattern state, path segment) test; at most ``len(segs) * len(pattern)``.
        """
        pats = self.segments
        n = len(pats)
        if self.is_root:
            return len(segs) == 0, 1
        if not any(p.kind == "deep" for p in pats):
            if len(segs) != n:
                return False, 1
            steps = 0
            for s, p in zip(segs, pats):
                steps += 1
                if not p.matches(s):
                    return False, steps
            return True, steps
        active = self.closure((0,))
        steps = 0
        for s in segs:
            live = [i for i in active if i != n]
            steps += len(live)
            nxt = self.advance(live, s)
            if not nxt:
                return False, steps
            active = self.closure(nxt)
        return n in active, steps

    def advance(self, live: Iterable[int], seg: str) -> set[int]:
        """The states after one more path segment ``seg`` from the states ``live`` (each before
        the last segment): a ``**`` stays, a segment that matches moves on."""
        nxt: set[int] = set()
        for i in live:
            p = self.segments[i]
            if p.kind == "deep":
                nxt.add(i)
            elif p.matches(seg):
                nxt.add(i + 1)
        return nxt

    def matches(self, path: str) -> bool:
        if self.is_root:
            return path == ""
        if path == "":
            return False
        return self.match_steps(path.split("."))[0]


def check_pattern(pattern: object, source: str | None = None) -> str:
    """Validates a pattern's syntax; returns it. Raises :class:`PlanError` naming the fix."""
    parse_pattern(pattern, source)
    return pattern  # type: ignore[return-value]


def parse_pattern(pattern: object, source: str | None = None) -> Pattern:
    """Parses and validates a pattern (see the module docstring).

    Raises:
      PlanError: an empty or non-string pattern, an empty segment, a malformed range, or a
        pattern longer than :data:`MAX_PATTERN_CHARS`; the message names the fix.
    """
    loc = f"{source}: " if source else ""
    if not isinstance(pattern, str) or not pattern.strip():
        hint = ""
        if pattern is None or isinstance(pattern, bool | int | float):  # `0:`, `on:` in YAML
            spelled = (f"('{pattern}')" if isinstance(pattern, int | float)
                       and not isinstance(pattern, bool) else "(the word you wrote)")
            hint = (" A plan file reads an unquoted 0, 1.5, on/off/yes/no or null as a number, a "
                    f"boolean or null: if you meant a module path, quote it {spelled}.")
        raise PlanError(
            f"{loc}empty or non-string path pattern {short(pattern)} ({type(pattern).__name__}).{hint} "
            "Fix: write a dotted module path such as 'layers.*.mlp' or 'layers.[0-3]', or "
            f"{ROOT_PATTERN!r} for the whole model."
        )
    if len(pattern) > MAX_PATTERN_CHARS:
        raise PlanError(
            f"{loc}path pattern {short(pattern)} is {len(pattern)} characters long; at most "
            f"{MAX_PATTERN_CHARS} are allowed. Fix: use '*' and '**' to shorten it."
        )
    try:
        return _parse(pattern)
    except PlanError as e:
        if not source:
            raise
        raise PlanError(f"{source}: {e}") from None


@functools.lru_cache(maxsize=65536)
def _parse(pattern: str) -> Pattern:
    source = None
    if pattern == ROOT_PATTERN:
        return Pattern(pattern, ())
    segs = pattern.split(".")
    if "" in segs:
        loc = f"{source}: " if source else ""
        raise PlanError(
            f"{loc}path pattern {short(pattern)} has an empty segment. Fix: separate module names "
            "by single dots, e.g. 'layers.0.attn' (and no leading or trailing dot)."
        )
    if not pattern.isprintable() or " " in pattern and any(seg != seg.strip() for seg in segs):
        loc = f"{source}: " if source else ""
        raise PlanError(
            f"{loc}path pattern {short(pattern)} has whitespace or control characters in a "
            "segment; module paths have none. Fix: remove them."
        )
    if "*" not in pattern and "?" not in pattern and "[" not in pattern:  # literal segments only
        get = _LITERALS.get
        return Pattern(pattern, tuple([get(seg) or _segment(seg, pattern, source) for seg in segs]))
    out: list[Segment] = []
    for seg in segs:
        s = _segment(seg, pattern, source)
        if s.kind == "deep" and out and out[-1].kind == "deep":
            continue  # '**.**' is '**'
        out.append(s)
    return Pattern(pattern, tuple(out))


def compiled_or_error(pattern: str, source: str | None) -> Pattern:
    """:func:`parse_pattern` for a string: the cached parse, or the error with ``source``."""
    try:
        return _parse(pattern)
    except PlanError:
        return parse_pattern(pattern, source)


def compiled(pattern: str) -> Pattern:
    """The parsed pattern, cached (for patterns already validated)."""
    return _parse(pattern)


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
    return parse_pattern(pattern).matches(path)


@functools.lru_cache(maxsize=4096)
def _reversed(pat: Pattern) -> Pattern:
    """``pat`` read from its last segment (for matching paths read from their last segment)."""
    return Pattern(pat.text, tuple(reversed(pat.segments)))


class _Node:
    __slots__ = ("children", "by_int", "index")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.by_int: dict[int, list[tuple[str, _Node]]] | None = None
        self.index = -1  # position of the path ending here, -1 if none


class PathIndex:
    """Module paths arranged for matching many patterns: a trie of segments.

    :meth:`matching` walks the trie with the pattern's state set, looking literal segments and
    small ranges up by key, so a rule costs what it can match rather than the model's size.

    >>> idx = PathIndex(["", "layers", "layers.0", "layers.0.mlp", "layers.1", "layers.1.mlp"])
    >>> idx.matching("layers.*.mlp")
    ('layers.0.mlp', 'layers.1.mlp')
    >>> idx.subtree("layers.1")
    ('layers.1', 'layers.1.mlp')
    """

    def __init__(self, paths: Iterable[str]) -> None:
        self.paths: tuple[str, ...] = tuple(dict.fromkeys(paths))
        self.position = {p: i for i, p in enumerate(self.paths)}
        self.root = _Node()
        self.steps = 0  # pattern-state tests made by matching() (for complexity tests)
        self._rroot: _Node | None = None
        self._subtrees: dict[str, tuple[str, ...]] = {}
        for i, p in enumerate(self.paths):
            node = self.root
            if p:
                for seg in p.split("."):
                    nxt = node.children.get(seg)
                    if nxt is None:
                        nxt = node.children[seg] = _Node()
                    node = nxt
            node.index = i

    def _node(self, path: str) -> _Node | None:
        node: _Node | None = self.root
        if path:
            for seg in path.split("."):
                assert node is not None
                node = node.children.get(seg)
                if node is None:
                    return None
        return node

    def matching(self, pattern: str | Pattern) -> tuple[str, ...]:
        """The indexed paths that match ``pattern``, in index order."""
        pat = pattern if isinstance(pattern, Pattern) else compiled(pattern)
        if pat.is_root:
            self.steps += 1
            return ("",) if "" in self.position else ()
        if pat.is_literal:
            self.steps += 1
            return (pat.text,) if pat.text in self.position else ()
        pats = pat.segments
        if pats[0].kind in ("lit", "range") or pats[-1].kind == "deep":
            if pats[-1].kind in ("lit", "glob") and not self._some_last_name(pats[-1]):
                self.steps += 1
                return ()  # 'layers.*.m*5': no module's name ends so; the walk would test them all
            return self._walk(self.root, pat)  # a selective head: literal lookups from the front
        # '**.x', '*.mlp', '**.[0-5].m*': walk the paths' segments from the end, where the
        # pattern is selective (from the front every rule would visit every module)
        return self._walk(self._reversed_root(), _reversed(pat))

    def _some_last_name(self, seg: Segment) -> bool:
        """Whether some path's last segment matches ``seg`` (a literal or a glob): the names that
        share the glob's literal prefix are found by bisection."""
        if seg.kind == "lit":
            return seg.text in self._last_names_set
        names = self._last_names
        prefix = re.split(r"[*?\[]", seg.text, maxsplit=1)[0]
        i = bisect.bisect_left(names, prefix)
        while i < len(names) and names[i].startswith(prefix):
            self.steps += 1
            if seg.matches(names[i]):
                return True
            i += 1
        return False

    @functools.cached_property
    def _last_names(self) -> list[str]:
        return sorted(self._last_names_set)

    @functools.cached_property
    def _last_names_set(self) -> frozenset[str]:
        return frozenset(p.rpartition(".")[2] for p in self.paths if p)

    def _reversed_root(self) -> _Node:
        """A trie of the paths' segments read from the last (built on first use)."""
        if self._rroot is None:
            self._rroot = _Node()
            for i, p in enumerate(self.paths):
                if not p:
                    continue
                node = self._rroot
                for seg in reversed(p.split(".")):
                    nxt = node.children.get(seg)
                    if nxt is None:
                        nxt = node.children[seg] = _Node()
                    node = nxt
                node.index = i
        return self._rroot

    def _walk(self, root: _Node, pat: Pattern) -> tuple[str, ...]:
        """The paths of a trie that ``pat`` matches: its state set carried down the trie."""
        pats = pat.segments
        n = len(pats)
        found: list[int] = []
        stack: list[tuple[_Node, frozenset[int]]] = [(root, pat.closure((0,)))]
        while stack:
            node, active = stack.pop()
            live = [i for i in active if i < n]
            if not live:
                continue
            for seg, child in self._candidates(node, [pats[i] for i in live]):
                self.steps += len(live)
                nxt = pat.advance(live, seg)
                if not nxt:
                    continue
                closed = pat.closure(nxt)
                if n in closed and child.index >= 0:
                    found.append(child.index)
                stack.append((child, closed))
        return tuple(self.paths[i] for i in sorted(set(found)))

    def _candidates(self, node: _Node, pats: list[Segment]) -> Iterable[tuple[str, _Node]]:
        """Children of ``node`` that some of ``pats`` may match, by key lookup when possible."""
        if all(p.kind == "lit" for p in pats):
            return [(p.text, node.children[p.text]) for p in {p.text: p for p in pats}.values()
                    if p.text in node.children]
        if all(p.kind in ("lit", "range") for p in pats):
            span = sum(len(p.indices()) for p in pats if p.kind == "range")
            if span < len(node.children):
                if node.by_int is None:
                    node.by_int = {}
                    for name, c in node.children.items():
                        if is_index(name):
                            node.by_int.setdefault(int(name), []).append((name, c))
                out: dict[int, tuple[str, _Node]] = {}
                for p in pats:
                    if p.kind == "lit":
                        hit = node.children.get(p.text)
                        if hit is not None:
                            out[id(hit)] = (p.text, hit)
                    else:
                        for k in p.indices():
                            for name, c in node.by_int.get(k, ()):
                                out[id(c)] = (name, c)
                return list(out.values())
        return list(node.children.items())

    def subtree(self, path: str) -> tuple[str, ...]:
        """``path`` and every indexed path below it, in index order (cached)."""
        got = self._subtrees.get(path)
        if got is not None:
            return got
        node = self._node(path)
        found: list[int] = []
        stack = [node] if node is not None else []
        while stack:
            nd = stack.pop()
            if nd.index >= 0:
                found.append(nd.index)
            stack.extend(nd.children.values())
        got = tuple(self.paths[i] for i in sorted(found))
        self._subtrees[path] = got
        return got
