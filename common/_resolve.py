"""Resolution: one annotation per module path, the remat boundaries, and where each name lives."""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import functools
import heapq
import itertools
import re
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, Literal

from ._annotation import INHERIT, Annotation
from ._nested import (
    NestedSpec,
    block_size,
    check_nested,
    check_nested_boundaries,
    not_a_stack_error,
)
from ._errors import PlanError, short, sorted_list, type_error, where
from ._paths import INPUT_NAME, SEP, ancestors, display, in_subtree, qualify
from ._pattern import Pattern, PathIndex, Segment, compiled, is_index
from ._plan import Plan, Rule

Location = Literal["device", "host", "recompute"]

_MSG_NO_MATCH = """\
{source}pattern {pattern} (annotation {ann}) matches no module of this model.
Nearest existing paths: {near}.
Fix: correct the pattern (segments are globs: 'layers.*.mlp', 'layers.[0-3]', '**'), or set
defaults.mode: lenient to only warn."""

_MSG_RANGE_OUT = """\
{source}pattern {pattern} (annotation {ann}): the range {seg} reaches {missing}, but no such
module exists; the model has {have}.
Fix: narrow the range (or use '*'), or set defaults.mode: lenient to only warn."""

_MSG_REL_NO_MATCH = """\
{where}relative name {name!r} in {ann} matches no module: no descendant of {path!r} has the
sub-path {rel!r}. Descendants: {near}.
Fix: correct the sub-path before '/', or write just {leaf!r} (any descendant), or set
defaults.mode: lenient to only warn."""

_MSG_NESTED = """\
{where}annotation {ann!r} is inside the remat boundary at {outer!r} ({outer_ann}).
{why}
Fix: {fix}"""


#: The tag a ``custom`` module's rule sets give the residuals they keep by default; the module's
#: own boundary saves ``<path>/__rule__`` (see ``_custom.py``).
RULE_NAME: Final = "__rule__"


class UnmatchedPatternWarning(UserWarning):
    """A lenient plan has a pattern that matches no module."""


def _depth(path: str) -> int:
    return 0 if path == "" else path.count(".") + 1


@dataclasses.dataclass(frozen=True)
class BoundarySpec:
    """One remat boundary after resolution, before it is compiled into a JAX policy.

    Attributes:
      path: the module path where the boundary sits.
      kind: the boundary's own annotation kind.
      save: qualified activation names kept on device.
      offload: qualified activation names moved to host memory.
      offload_src, offload_dst: memory kinds for the offloaded names.
      requested: the bare or relative names the plan wrote for this boundary (for verification).
    """

    path: str
    kind: str
    save: frozenset[str] = frozenset()
    offload: frozenset[str] = frozenset()
    offload_src: str = "device"
    offload_dst: str = "pinned_host"
    requested: frozenset[str] = frozenset()

    @property
    def location(self) -> Mapping[str, Location]:
        return {**{n: "device" for n in self.save}, **{n: "host" for n in self.offload}}


@dataclasses.dataclass(frozen=True)
class Resolution:
    """A plan resolved against a model's module paths.

    Attributes:
      plan: the plan.
      paths: every module path of the model (``""`` is the root).
      annotations: ``(path, annotation)`` for every annotated path (``inherit`` omitted).
      boundaries: the remat boundaries, outermost first.
      tagged_inputs: ``(path, qualified name)`` for modules whose inputs are tagged for a policy.
      matches: for each rule (in order), the paths it matched.
      stacks: the stacked-layer paths the plan was resolved with (see :func:`layer_groups`).
      nested: ``(stack, block size or "sqrt")`` for the stacks the plan runs as nested scans
        (see :meth:`nested_block`).
    """

    plan: Plan
    paths: tuple[str, ...]
    annotations: tuple[tuple[str, Annotation], ...]
    boundaries: tuple[BoundarySpec, ...]
    tagged_inputs: tuple[tuple[str, str], ...]
    matches: tuple[tuple[str, ...], ...]
    stacks: tuple[str, ...] = ()
    nested: tuple[tuple[str, NestedSpec], ...] = ()

    def nested_block(self, stack: str, num_layers: int) -> int | None:
        """Layers per block when the plan nests the scan over ``stack`` (a group of
        ``num_layers`` layers of it), or ``None`` for one plain scan."""
        spec = dict(self.nested).get(stack)
        return None if spec is None else block_size(spec, num_layers)

    def __repr__(self) -> str:
        return (f"Resolution({len(self.plan.rules)} rules over {len(self.paths)} modules, "
                f"{len(self.boundaries)} boundaries; plan {self.plan.fingerprint()})")

    @functools.cached_property
    def _annotation_map(self) -> dict[str, Annotation]:
        return dict(self.annotations)

    @functools.cached_property
    def _boundary_map(self) -> dict[str, BoundarySpec]:
        out: dict[str, BoundarySpec] = {}
        for b in self.boundaries:
            out.setdefault(b.path, b)
        return out

    @functools.cached_property
    def _input_tags(self) -> dict[str, str]:
        return dict(self.tagged_inputs)

    def annotation(self, path: str) -> Annotation:
        return self._annotation_map.get(path, INHERIT)

    def boundary(self, path: str) -> BoundarySpec | None:
        return self._boundary_map.get(path)

    def input_tag(self, path: str) -> str | None:
        return self._input_tags.get(path)

    def enclosing_boundary(self, path: str) -> BoundarySpec | None:
        """The innermost boundary whose subtree holds ``path`` (the path's own boundary included)."""
        bmap = self._boundary_map
        if len(bmap) != len(self.boundaries):  # several boundaries at one path: the last deepest
            best = None
            for b in self.boundaries:
                if in_subtree(path, b.path) and (best is None or _depth(b.path) >= _depth(best.path)):
                    best = b
            return best
        for q in (path, *ancestors(path)):
            if q in bmap:
                return bmap[q]
        return None

    @property
    def active_paths(self) -> tuple[str, ...]:
        """Paths an adapter must wrap: boundaries, tagged inputs and custom-rule modules."""
        keep = {b.path for b in self.boundaries} | {p for p, _ in self.tagged_inputs}
        keep |= {p for p, a in self.annotations if a.kind == "custom"}
        return tuple(p for p in self.paths if p in keep)

    def describe(self) -> str:
        """A human-readable summary: one line per boundary."""
        lines = []
        for b in self.boundaries:
            parts = [f"{b.path or '<root>'}: {b.kind}"]
            if b.save:
                parts.append(f"save {sorted_list(b.save)}")
            if b.offload:
                parts.append(f"offload {sorted_list(b.offload)} -> {b.offload_dst}")
            lines.append("  ".join(parts))
        for stack, spec in self.nested:
            lines.append(f"{stack or '<root>'}: nested scans, blocks of {spec} layers, each block "
                         "one boundary that keeps its input")
        return "\n".join(lines) if lines else "(no remat boundaries: everything is saved)"


@dataclasses.dataclass(frozen=True)
class _NameRule:
    scope: str          # module path the rule applies to
    subtree: bool       # applies to the whole subtree (True) or only to ``scope`` itself
    name: str           # leaf name, or "*" for every name
    location: Location


Report = Callable[[str], None]


def _name_rules(path: str, ann: Annotation, index: PathIndex,
                report: Report | None = None, rule: Rule | None = None) -> list[_NameRule]:
    """What an annotation at ``path`` says about the location of names in its subtree."""
    out: list[_NameRule] = []
    if ann.kind in ("recompute", "offload"):
        out.append(_NameRule(path, True, "*", "recompute"))
    for names, loc in ((ann.save, "device"), (ann.offload, "host")):
        for n in sorted(names):
            if SEP in n:  # relative form "sub.path/name": exact modules under ``path``
                rel, _, leaf = n.rpartition(SEP)
                found = False
                for p in index.subtree(path):
                    if p != path:
                        sub = p[len(path) + 1:] if path else p
                        if fnmatch.fnmatchcase(sub, rel):
                            out.append(_NameRule(p, False, leaf, loc))  # type: ignore[arg-type]
                            found = True
                if not found and report is not None:
                    below = [p[len(path) + 1:] if path else p
                             for p in index.subtree(path)[:200] if p != path]
                    near = difflib.get_close_matches(rel, below, n=5, cutoff=0.3) or below[:5]
                    report(_MSG_REL_NO_MATCH.format(
                        where=where(path, rule.source if rule else None), name=n, ann=str(ann),
                        path=display(path), rel=rel, leaf=leaf,
                        near=sorted_list(near) if near else "(none: it has no submodules)"))
            else:
                out.append(_NameRule(path, True, n, loc))  # type: ignore[arg-type]
    return out


def _concretise(b_path: str, rules: list[_NameRule], own_rules: list[_NameRule],
                index: PathIndex) -> tuple[frozenset[str], frozenset[str]]:
    """Qualified save/offload sets of one boundary from its ordered name rules.

    For each name, the rules that speak of it (or of every name, ``*``) are applied in order to
    the paths they cover, later rules winning: each rule costs the paths it covers, not the
    boundary's subtree times all its rules (a root boundary over 10,000 modules with 2,000 merged
    name rules took 7 s that way).
    """
    save: set[str] = set()
    offload: set[str] = set()
    by_name: dict[str, list[int]] = {}
    for k, r in enumerate(rules):
        by_name.setdefault(r.name, []).append(k)
    stars = by_name.get("*", [])
    universe = sorted(n for n in by_name if n != "*")
    for n in universe:
        loc: dict[str, Location] = {}
        for k in heapq.merge(by_name[n], stars):
            r = rules[k]
            if r.location == "recompute":  # the default: only undoes what earlier rules set
                if not loc:
                    continue
                if not r.subtree:
                    loc.pop(r.scope, None)
                else:
                    for q in [q for q in loc if in_subtree(q, r.scope)]:
                        del loc[q]
            else:
                for q in (index.subtree(r.scope) if r.subtree else (r.scope,)):
                    loc[q] = r.location
        for q, where_ in loc.items():
            (save if where_ == "device" else offload).add(qualify(q, n))
    # Unqualified tags (JAX's own checkpoint_name, or ours outside any module) follow the
    # boundary's own words first, then any descendant that names them.
    own: dict[str, list[Location]] = {}
    for r in own_rules:
        if r.subtree and r.name != "*":
            own.setdefault(r.name, []).append(r.location)
    for n in universe:
        locs = own.get(n) or [rules[k].location for k in by_name[n] if rules[k].subtree]
        if locs and locs[-1] == "device":
            save.add(n)
        elif locs and locs[-1] == "host":
            offload.add(n)
    return frozenset(save), frozenset(offload - save)


def _nearest(pattern: str, index: PathIndex) -> str:
    head = pattern.split(".")[0]
    # difflib is quadratic in string length and linear in candidates: compare a bounded sample,
    # paths that share the pattern's first segment first (from the index: scanning every path
    # for each rule that matches nothing made 1,000 such rules on 10,000 paths take 5 s).
    paths = index.paths
    same = [p for p in index.subtree(head)[:30] if p] if head in index.position else []
    named = same + list(itertools.islice((p for p in paths if p), 10))
    pattern = pattern[:200]
    near = difflib.get_close_matches(pattern, named, n=5, cutoff=0.3)
    if not near:
        near = same[:5] or named[:5]
    return sorted_list(dict.fromkeys(near)) if near else "(the model has no submodules)"


_MERGEABLE: Final = frozenset({"names", "recompute", "offload"})


def _layers_of(stack: str, paths: Iterable[str] | PathIndex) -> tuple[str, ...]:
    pre = stack + "." if stack else ""
    if isinstance(paths, PathIndex):
        below = paths.matching(compiled(f"{stack}.*" if stack else "*"))
        return tuple(p for p in below if is_index(p[len(pre):]))
    return tuple(p for p in paths if p.startswith(pre) and is_index(p[len(pre):]))


def resolve(plan: Plan, paths: Iterable[str], *, stacks: Iterable[str] = ()) -> Resolution:
    """Resolves a plan against a model's module paths.

    Args:
      plan: the plan (see :meth:`Plan.coerce` for what else is accepted by the adapters).
      paths: every module path of the model, dotted (``layers.0.attn``); ``""`` is the root.
        Stacked layers (scan over layers) are listed per layer: ``layers.0``, ``layers.0.attn``, ...
      stacks: paths of stacked-layer modules. An annotation on a stack applies to each of its
        layers (the scan body), never to the scan as a whole.

    Returns:
      A :class:`Resolution`: one annotation per path, the boundaries and per boundary where each
      qualified name lives (device, host; anything else is recomputed).

    Raises:
      PlanError: a pattern matches nothing (strict mode), or a boundary inside a boundary cannot
        be merged into one policy (nesting off).

    >>> r = resolve(Plan.from_mapping({"layers.*": "recompute", "layers.*.attn": {"save": ["o"]}}),
    ...             ["", "layers", "layers.0", "layers.0.attn", "layers.1", "layers.1.attn"])
    >>> print(r.describe())
    layers.0: recompute  save 'layers.0.attn/o', 'o'
    layers.1: recompute  save 'layers.1.attn/o', 'o'
    """
    if not isinstance(plan, Plan):
        raise type_error("resolve", "plan", plan, "a remat_common.Plan",
                         "build one with Plan.coerce(...) (a mapping, a list of rules or a file).")
    all_paths, index, stack_layers = _model_paths(paths, stacks)
    report = _reporter(plan)
    direct, sources, matches, nested = _match_rules(plan, all_paths, index, stack_layers, report)
    owners = _Owners.assign(plan, direct, sources, index, report)
    annotations = tuple((p, direct[p]) for p in all_paths
                        if p in direct and (direct[p].kind != "inherit" or direct[p].tag is not None))
    boundaries = owners.boundaries(plan, direct, index)
    tagged = tuple((p, owners.tagged[p]) for p in all_paths if p in owners.tagged)
    for stack, spec in nested:
        check_nested_boundaries(stack, spec, ((b.path, b.save, b.offload) for b in boundaries),
                                tagged)
    return Resolution(
        plan=plan, paths=all_paths, annotations=annotations, boundaries=boundaries,
        tagged_inputs=tagged, matches=matches, stacks=tuple(stack_layers), nested=nested,
    )


# -- the stages of resolve() -----------------------------------------------------------------------

def _model_paths(paths: Iterable[str], stacks: Iterable[str]
                 ) -> tuple[tuple[str, ...], PathIndex, dict[str, tuple[str, ...]]]:
    """Every path (the root first), their index, and each stack's layer paths."""
    path_list = str_sequence("resolve", "paths", paths)
    stack_list = str_sequence("resolve", "stacks", stacks)
    for p in path_list:
        if p and ("" in p.split(".") or SEP in p):
            raise PlanError(
                f"resolve: module path {short(p)} is malformed: a module path is dotted segments "
                f"(attribute names, indices, dict keys), none empty, without {SEP!r} (which "
                "separates a path from an activation name); '' is the root. "
                "Fix: pass the model's paths as an adapter lists them (frp.module_paths(model), "
                "erp.module_paths(model)), e.g. 'layers.0.attn'.")
    all_paths = tuple(dict.fromkeys(["", *path_list]))
    index = PathIndex(all_paths)
    unknown = [s for s in stack_list if s not in index.position]
    if unknown:
        raise PlanError(
            f"resolve: stack(s) {sorted_list(unknown)} are not module paths of this model; stacks "
            f"must be listed in paths too. Nearest paths: {_nearest(unknown[0], index)}. "
            "Fix: pass the stacked module's path (e.g. 'layers') in both."
        )
    return all_paths, index, {s: _layers_of(s, index) for s in stack_list}


_LENIENT_FIX: Final = re.compile(r",?\s+or\s+set\s+defaults\.mode:\s+lenient\s+to\s+only\s+warn")


def _reporter(plan: Plan) -> Report:
    """A problem with the plan: an error in strict mode, an :class:`UnmatchedPatternWarning` else."""
    def report(msg: str) -> None:
        if plan.strict:
            raise PlanError(msg)
        # already lenient: the fix cannot be to set the mode it runs in
        msg = _LENIENT_FIX.sub("", msg) + "\n(defaults.mode is lenient: a warning, not an error.)"
        warnings.warn(msg, UnmatchedPatternWarning, stacklevel=4)

    return report


def _match_rules(plan: Plan, all_paths: tuple[str, ...], index: PathIndex,
                 stack_layers: Mapping[str, tuple[str, ...]], report: Report
                 ) -> tuple[dict[str, Annotation], dict[str, Rule], tuple[tuple[str, ...], ...],
                            tuple[tuple[str, NestedSpec], ...]]:
    """Each path's annotation (later rules win) and the rule it came from; each rule's matches;
    the stacks run as nested scans (the last rule on a stack decides)."""
    direct: dict[str, Annotation] = {}
    sources: dict[str, Rule] = {}
    nested: dict[str, NestedSpec | None] = {}
    matches = []
    for rule in plan.rules:
        pat = compiled(rule.pattern)
        hit = index.matching(pat)
        matches.append(hit)
        ann = rule.annotation
        for p in hit:
            if p in stack_layers:
                if ann.nested is not None:
                    check_nested(ann.nested, p, len(stack_layers[p]), rule.source)
                nested[p] = ann.nested
            elif ann.nested is not None:
                raise not_a_stack_error(ann.nested, p, list(stack_layers), rule.source)
        if ann.nested is not None:  # the layers get the annotation without the stack's nesting
            rule = dataclasses.replace(rule, annotation=dataclasses.replace(ann, nested=None))
        if hit and any(seg.kind == "range" for seg in pat.segments):
            _check_ranges(rule, pat, hit, index, report)
        hit = tuple(q for p in hit for q in stack_layers.get(p, (p,)))
        if not hit:
            report(_MSG_NO_MATCH.format(
                source=f"{rule.source}: " if rule.source else "", pattern=short(rule.pattern),
                ann=str(rule.annotation), near=_nearest(rule.pattern, index),
            ))
        for p in hit:
            direct[p] = rule.annotation
            sources[p] = rule
    return (direct, sources, tuple(matches),
            tuple((p, v) for p, v in nested.items() if v is not None))


@dataclasses.dataclass
class _Owners:
    """Which annotated paths open a boundary, and the name rules each boundary collects."""

    owner: dict[str, str] = dataclasses.field(default_factory=dict)  # boundary path -> itself
    rules_of: dict[str, list[_NameRule]] = dataclasses.field(default_factory=dict)
    own_of: dict[str, list[_NameRule]] = dataclasses.field(default_factory=dict)
    tagged: dict[str, str] = dataclasses.field(default_factory=dict)

    @classmethod
    def assign(cls, plan: Plan, direct: Mapping[str, Annotation], sources: Mapping[str, Rule],
               index: PathIndex, report: Report) -> _Owners:
        """Outermost first: each annotated path opens a boundary or merges into the enclosing one."""
        o = cls()
        for p in sorted((p for p, a in direct.items() if a.kind != "inherit"), key=_depth):
            ann, src_rule = direct[p], sources.get(p)
            outer = next((q for q in ancestors(p) if q in o.owner), None)
            if outer is None or (plan.nesting and ann.is_boundary):
                o._open(p, ann, index, report, src_rule)
            elif ann.kind != "custom":  # custom runs its rules under the enclosing boundary's policy
                o._merge(p, ann, outer, direct[outer], index, report, src_rule)
        return o

    def _open(self, p: str, ann: Annotation, index: PathIndex, report: Report,
              src_rule: Rule | None) -> None:
        if ann.is_boundary:
            self.owner[p] = p
            self.own_of[p] = self.rules_of[p] = _name_rules(p, ann, index, report, src_rule)
            if ann.kind == "offload":
                self.tagged[p] = qualify(p, INPUT_NAME)
        elif ann.kind == "custom":  # not inside any boundary: the adapter opens one for it
            self.owner[p] = p  # ... which keeps what the module's rule sets keep by default
            self.own_of[p], self.rules_of[p] = [], [_NameRule(p, False, RULE_NAME, "device")]

    def _merge(self, p: str, ann: Annotation, outer: str, outer_ann: Annotation, index: PathIndex,
               report: Report, src_rule: Rule | None) -> None:
        if ann.kind == "save" or ann.kind not in _MERGEABLE or outer_ann.kind not in _MERGEABLE | {"custom"}:
            raise PlanError(_nested_error(p, ann, outer, outer_ann, src_rule))
        self.rules_of[outer] = self.rules_of[outer] + _name_rules(p, ann, index, report, src_rule)
        if ann.kind == "offload":
            self.tagged[p] = qualify(p, INPUT_NAME)
            self.rules_of[outer].append(_NameRule(p, False, INPUT_NAME, "host"))

    def boundaries(self, plan: Plan, direct: Mapping[str, Annotation],
                   index: PathIndex) -> tuple[BoundarySpec, ...]:
        """One :class:`BoundarySpec` per boundary, outermost first, names made concrete."""
        out = []
        for p in sorted(self.owner, key=lambda q: (_depth(q), index.position[q])):
            ann = direct[p]
            own_rules = list(self.own_of[p])
            if ann.kind == "offload":
                own_rules.append(_NameRule(p, False, INPUT_NAME, "host"))
                self.rules_of[p] = self.rules_of[p] + [own_rules[-1]]
            save, off = _concretise(p, self.rules_of[p], own_rules, index)
            requested = frozenset(r.name for r in self.rules_of[p]
                                  if r.name not in ("*", INPUT_NAME, RULE_NAME))
            out.append(BoundarySpec(
                path=p, kind=ann.kind, save=save, offload=off,
                offload_src=ann.offload_src or plan.offload_src,
                offload_dst=ann.offload_dst or plan.offload_dst,
                requested=requested,
            ))
        return tuple(out)


def str_sequence(function: str, argument: str, value: Any) -> list[str]:
    """``value`` as a list of strings; a bare string, a mapping or non-strings are refused."""
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Iterable):
        raise type_error(function, argument, value, "a list of dotted module path strings",
                         f"pass [{short(value)}] if you meant one path." if isinstance(value, str)
                         else "pass a list such as ['layers.0', 'layers.0.mlp'].")
    out = list(value)
    for v in out:
        if not isinstance(v, str):
            raise type_error(function, f"each of {argument}", v, "a dotted module path string")
    return out


def _check_ranges(rule: Rule, pat: Pattern, hit: tuple[str, ...], index: PathIndex,
                  report: Report) -> None:
    """Reports range segments (``[0-5]``) that reach indices no module has."""
    segs = pat.segments
    for k, seg in enumerate(segs):
        if seg.kind != "range":
            continue
        if all(s.kind != "deep" for s in segs[:k]):  # the range is the k-th path segment
            seen = {int(p.split(".")[k]) for p in hit}
            span = seg.indices()  # len() of a huge range overflows: compare the ends
            missing = [v for v in span if v not in seen] if seg.hi - seg.lo < 4 * len(index.paths) + 64 \
                else [span[-1]]
        else:  # after a '**': which indices the matched paths hold there (only they can)
            seen = set()
            for p in hit:
                parts = p.split(".")
                for v in {int(x) for x in parts if is_index(x) and seg.in_range(int(x))} - seen:
                    fixed = Pattern(pat.text, (*segs[:k], Segment("lit", str(v)), *segs[k + 1:]))
                    if fixed.match_steps(parts)[0]:
                        seen.add(v)
            span = seg.indices()  # name the first thousand missing, and the last
            missing = [v for v in (*span[:1001], *span[1001:][-1:]) if v not in seen]
        if missing:
            have = sorted(seen)
            report(_MSG_RANGE_OUT.format(
                source=f"{rule.source}: " if rule.source else "", pattern=short(rule.pattern),
                ann=str(rule.annotation), seg=seg.text, missing=_ints(missing),
                have=("indices " + _ints(have) + " there") if have else "no module there"))


def _ints(values: list[int]) -> str:
    """``0-3, 7, 9-11`` for sorted integers (at most 8 runs shown)."""
    runs: list[list[int]] = []
    for v in sorted(values):
        if runs and v == runs[-1][1] + 1:
            runs[-1][1] = v
        else:
            runs.append([v, v])
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs[:8])
    return text + (", ..." if len(runs) > 8 else "")


def _nested_error(path: str, ann: Annotation, outer: str, outer_ann: Annotation,
                  rule: Rule | None) -> str:
    if ann.kind == "save":
        why = ("Inside a boundary, activations are kept by name; 'save' on a whole submodule "
               "cannot be expressed as one policy.")
        fix = (f"list what to keep, e.g. {{'save': ['out']}} on {path!r}, or annotate "
               f"{outer!r} 'inherit' so {path!r} is outside any boundary.")
    elif "dots" in (ann.kind + outer_ann.kind):
        why = ("Saving matmul outputs and name lists cannot be merged into one policy that "
               "jax_remat3 honours (save_from_both_policies drops the dots under remat3).")
        fix = (f"tag the matmul outputs with checkpoint_name and list them under 'save', or give "
               f"{path!r} and {outer!r} separate boundaries with defaults.nesting: true.")
    else:
        why = "Nested boundaries behave differently across JAX versions."
        fix = "annotate only one of them, or set defaults.nesting: true."
    return _MSG_NESTED.format(
        where=where(path, rule.source if rule else None), ann=str(ann), outer=outer,
        outer_ann=str(outer_ann), why=why, fix=fix,
    )


@dataclasses.dataclass(frozen=True)
class LayerGroup:
    """Consecutive stacked layers that the plan treats alike: one scan over ``[start, stop)``.

    ``path`` (``stack.start``) is the module path the group's scan body runs under, so every
    layer of a group carries the tag names of its first layer.
    """

    start: int
    stop: int
    path: str

    @property
    def size(self) -> int:
        return self.stop - self.start


def _rebase(name: str, old: str, new: str) -> str:
    """A path or qualified name under ``old`` re-rooted at ``new``; others unchanged."""
    if name == old or name.startswith((old + ".", old + SEP)):
        return new + name[len(old):]
    return name


def _rebase_spec(b: BoundarySpec, old: str, new: str) -> BoundarySpec:
    return dataclasses.replace(
        b, path=_rebase(b.path, old, new),
        save=frozenset(_rebase(n, old, new) for n in b.save),
        offload=frozenset(_rebase(n, old, new) for n in b.offload),
    )


def _layer_signatures(resolution: Resolution, stack: str, num_layers: int
                      ) -> list[tuple[object, ...]]:
    """What the plan says inside each of layers ``0 .. num_layers - 1`` of ``stack`` (annotations,
    boundaries, tagged inputs) with the layer's own path replaced by ``#``: two layers the plan
    treats alike have equal signatures. In one pass over
    the resolution (one pass per layer made a stack of 2,000 layers take 2 s)."""
    pre = f"{stack}." if stack else ""
    items: list[list[object]] = [[] for _ in range(num_layers)]

    def layer(path: str) -> int | None:
        if not path.startswith(pre):
            return None
        head = path[len(pre):].split(".", 1)[0]
        i = int(head) if is_index(head) else -1
        return i if 0 <= i < num_layers else None

    for p, a in resolution.annotations:
        if (i := layer(p)) is not None:
            items[i].append((_rebase(p, f"{pre}{i}", "#"), a))
    for bs in resolution.boundaries:
        if (i := layer(bs.path)) is not None:
            items[i].append(_rebase_spec(bs, f"{pre}{i}", "#"))
    for p, t in resolution.tagged_inputs:
        if (i := layer(p)) is not None:
            items[i].append((_rebase(p, f"{pre}{i}", "#"), _rebase(t, f"{pre}{i}", "#")))
    return [tuple(x) for x in items]


def layer_groups(resolution: Resolution, stack: str, num_layers: int) -> tuple[LayerGroup, ...]:
    """Splits a stack of ``num_layers`` layers into groups the plan treats alike.

    Two neighbouring layers share a group when their subtrees have the same annotations and
    boundaries (up to the layer index). A plan that treats the first ``k`` layers differently gives
    two groups, so the scan is split in two.

    >>> from remat_common import Plan, resolve
    >>> paths = ["layers"] + [f"layers.{i}{s}" for i in range(4) for s in ("", ".mlp")]
    >>> r = resolve(Plan.from_mapping({"layers": "recompute", "layers.[0-1]": "offload"}),
    ...             paths, stacks=["layers"])
    >>> [(g.start, g.stop) for g in layer_groups(r, "layers", 4)]
    [(0, 2), (2, 4)]
    """
    sigs = _layer_signatures(resolution, stack, num_layers)
    groups: list[LayerGroup] = []
    prev = None
    for i in range(num_layers):
        sig = sigs[i]
        if groups and sig == prev:
            g = groups[-1]
            groups[-1] = LayerGroup(g.start, i + 1, g.path)
        else:
            groups.append(LayerGroup(i, i + 1, f"{stack}.{i}" if stack else str(i)))
        prev = sig
    return tuple(groups)


def folded_paths(resolution: Resolution) -> frozenset[str]:
    """Stacked layers that run as another layer of their group, so their boundaries never open.

    A scan over a layer group runs every layer under the path of the group's first layer (see
    :func:`layer_scope`); the boundaries resolved for layers ``start + 1 .. stop - 1`` are never
    entered (the first layer's boundary, identical up to the index, runs for them).

    >>> from remat_common import Plan, resolve
    >>> r = resolve(Plan.from_mapping({"layers": "recompute"}), ["layers", "layers.0", "layers.1"],
    ...             stacks=["layers"])
    >>> sorted(folded_paths(r))
    ['layers.1']
    """
    out: set[str] = set()
    for stack in resolution.stacks:
        n = len(_layers_of(stack, resolution.paths))
        for g in layer_groups(resolution, stack, n):
            out.update(f"{stack}.{i}" if stack else str(i) for i in range(g.start + 1, g.stop))
    return frozenset(out)


def alike_layers(resolution: Resolution) -> dict[str, str]:
    """List layers that can run as an earlier layer the plan treats alike: ``{layer: first}``.

    A list layer is a module ``P.i`` (an index under its container, outside stacked layers). Layers
    of one container with equal signatures (:func:`_layer_signatures`) are alike; each runs under the path of the
    first (see ``CompiledPlan.shared``), so their boundaries, policies and tag names are one, and
    JAX traces the body once. Only layers with a boundary inside, none around them and no
    ``custom`` module are listed (elsewhere there is nothing to share, or a name outside the layer
    or a rule run would change meaning).

    >>> from remat_common import Plan, resolve
    >>> paths = ["layers"] + [f"layers.{i}" for i in range(4)]
    >>> r = resolve(Plan.from_mapping({"layers.*": "recompute", "layers.0": "dots"}), paths)
    >>> alike_layers(r)
    {'layers.2': 'layers.1', 'layers.3': 'layers.1'}
    """
    stacks = resolution.stacks
    candidates: dict[str, str] = {}  # layer -> its container
    for p in resolution.paths:
        parent, _, last = p.rpartition(".")
        if last.isdigit() and p and not any(in_subtree(p, s) for s in stacks):
            candidates[p] = parent
    if not candidates:
        return {}
    buckets: dict[str, list[object]] = {c: [] for c in candidates}
    has_boundary: set[str] = set()
    custom: set[str] = set()

    def owners(path: str) -> list[str]:
        return [q for q in (path, *ancestors(path)) if q in candidates]

    for p, a in resolution.annotations:
        for q in owners(p):
            buckets[q].append((_rebase(p, q, "#"), a))
            if a.kind == "custom":
                custom.add(q)
    for b in resolution.boundaries:
        for q in owners(b.path):
            buckets[q].append(_rebase_spec(b, q, "#"))
            has_boundary.add(q)
    for p, t in resolution.tagged_inputs:
        for q in owners(p):
            buckets[q].append((_rebase(p, q, "#"), _rebase(t, q, "#")))
    first: dict[tuple[str, tuple[object, ...]], str] = {}
    out: dict[str, str] = {}
    for q, parent in candidates.items():
        if q not in has_boundary or q in custom:
            continue
        if any(resolution.boundary(a) is not None for a in ancestors(q)):
            continue
        rep = first.setdefault((parent, tuple(buckets[q])), q)
        if rep != q:
            out[q] = rep
    return out
