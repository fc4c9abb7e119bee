"""The tuner's model of a stack: finding the stack of layers, the choices to try on it, and the
peak and cost a plan is predicted to have from a few calibration compiles (:class:`Model`: a
Pareto front over runs of layers)."""

from __future__ import annotations

import bisect
import dataclasses
import functools
import itertools
import math
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax

from ..._context import collect_tags
from ..._errors import PlanTypeError, RematError, short, sorted_list
from ..._nested import NESTED_KEY, SQRT, sqrt_block
from ..._plan import Plan
from ..._shipped import doc_url
from ..measurement._target import MeasureTarget


Builder = Callable[[Plan | None], MeasureTarget]

# -- discovery -----------------------------------------------------------------------------------

_LAYER = re.compile(r"^(.*)\.(\d+)$")

_MSG_NO_STACK = """\
remat_common.tune: found no stack of layers to tune in the model's module paths ({paths}).
tune assigns one choice per layer of a stack (paths STACK.0, STACK.1, ...). Fix: pass
layers='STACK' naming the stack, or tune a model that has one."""


def model_paths(build: Builder, tags: Mapping[str, Any] | None = None
                ) -> tuple[tuple[str, ...], tuple[str, ...], dict[str, set[str]], tuple[str, ...]]:
    """Module paths (from an annotation with an empty plan), the paths of modules that define
    their own rules (``__remat_custom__``), the tags per module path (the model's own and those
    of the ``tags`` rules), and the stacks the adapter scans (``stacks=`` / ``__remat_stacks__``
    in Flax, ``Stacked`` in Equinox)."""
    # A rule that matches every module but changes nothing: adapters then report every path.
    target = build(Plan.from_mapping({"**": "inherit", **(tags or {})}))
    if not isinstance(target, MeasureTarget):
        raise RematError(f"remat_common.tune: the builder returned a {type(target).__name__}; it "
                         "must return a remat_common.MeasureTarget.")
    paths: tuple[str, ...] = ()
    stacks: tuple[str, ...] = ()
    if target.plan is not None:
        paths = tuple(target.plan.resolution.paths)
        stacks = tuple(target.plan.resolution.stacks)
    custom = target.plan.custom_paths if target.plan is not None else ()
    with collect_tags() as seen:
        jax.make_jaxpr(target.loss_fn)(*target.loss_args)
    by_path: dict[str, set[str]] = {}
    for t in seen:
        leaf = t.name.rpartition("/")[2]
        by_path.setdefault(t.path or "", set()).add(leaf)
    if not paths:  # no compiled plan: the module paths the tags were made under, and their parents
        found: set[str] = set()
        for p in by_path:
            parts = p.split(".")
            found.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
        paths = tuple(sorted(found))
    return paths, custom, by_path, stacks


def tag_rules(value: Any, what: str) -> dict[str, Any]:
    """The ``{tag: NAME}`` rules of a plan (file, mapping, :class:`Plan`), as a config."""
    try:
        plan = Plan.coerce(value)
    except PlanTypeError as e:
        raise PlanTypeError(f"{what}: {e}") from None
    out = {r.pattern: {"tag": r.annotation.tag} for r in plan.rules if r.annotation.tag is not None}
    if not out:
        raise RematError(f"{what}: the plan has no {{tag: NAME}} rule, so it names nothing for the "
                         "choices to keep. Fix: give a plan whose rules tag modules' outputs "
                         "(\"layers.*.attn.q_proj\": {tag: query_proj}), such as the plan "
                         "files a third-party model is opted in by.")
    return out


def find_stack(paths: Sequence[str], layers: str | None) -> tuple[str, int]:
    counts: dict[str, set[int]] = {}
    for p in paths:
        m = _LAYER.match(p)
        if m:
            counts.setdefault(m.group(1), set()).add(int(m.group(2)))
    if layers is not None:
        n = counts.get(layers)
        if not n:
            raise RematError(f"remat_common.tune: layers={layers!r} names no stack of the model; "
                             f"stacks: {sorted_list(counts) or 'none'}. Fix: pass one of them.")
        return layers, max(n) + 1
    if not counts:
        raise RematError(_MSG_NO_STACK.format(paths=short(list(paths)[:8])))
    stack = max(counts, key=lambda s: (len(counts[s]), -len(s)))
    return stack, max(counts[stack]) + 1


@dataclasses.dataclass(frozen=True)
class LayerRules:
    """A choice written as rules on and below each layer: ``(relative path, annotation)``, ``""``
    the layer itself (``(("", "save"), ("mlp", "custom"))``: the layer saves, its ``mlp`` runs its
    own rules)."""

    rules: tuple[tuple[str, Any], ...]

    def on(self, layers: str) -> dict[str, Any]:
        """The rules for ``layers`` (``blocks.*``, ``blocks.[0-3]``)."""
        return {f"{layers}.{sub}" if sub else layers: ann for sub, ann in self.rules}

    def to_json(self) -> dict[str, Any]:
        return {"rules": {sub or ".": ann for sub, ann in self.rules}}


def custom_choice(stack: str, layers: int, custom_paths: Sequence[str]) -> Any:
    """The ``custom`` choice where every layer of ``stack`` declares its own rules
    (``__remat_custom__``) on the layer itself (``"custom"``) or on modules inside it (those
    annotated ``custom``, the layer ``save``: a :class:`LayerRules`); ``None`` where none or not
    every layer does.

    >>> custom_choice("blocks", 2, ["blocks.0.mlp", "blocks.1.mlp", "head"])
    LayerRules(rules=(('', 'save'), ('mlp', 'custom')))
    >>> custom_choice("blocks", 2, ["blocks.0", "blocks.0.mlp", "blocks.1"])
    'custom'
    """
    per_layer: list[set[str]] = [set() for _ in range(layers)]
    for p in custom_paths:
        m = re.match(rf"^{re.escape(stack)}\.(\d+)(?:\.(.+))?$", p)
        if m and int(m.group(1)) < layers:
            per_layer[int(m.group(1))].add(m.group(2) or "")
    common = set.intersection(*per_layer) if per_layer else set()
    if not common:
        return None
    if "" in common:
        return "custom"
    # the outermost ones: a custom module inside another runs under the outer one's rules
    top = sorted(s for s in common if not any(s.startswith(o + ".") for o in common))
    return LayerRules((("", "save"), *((s, "custom") for s in top)))


_MSG_NESTED_NOT_SCANNED = """\
remat_common.tune: choice {choice!r} needs a scanned stack, and {stack!r} is not one: its layers
are called one by one, so there is no scan to run as checkpointed blocks. Nesting applies to the
stacks the adapters scan: Flax layers built with nnx.vmap, run by flax_remat_plugin.scan_layers
and declared with annotate(..., stacks=[...]) or __remat_stacks__; Equinox layers in an
equinox_remat_plugin.Stacked ({docs}). Fix: tune the model with its layers stacked (the
examples: --size layout=scan), or leave {choice!r} out of the choices."""

_MSG_NESTED_SIZE = """\
remat_common.tune: choice {choice!r} on the stack {stack!r} of {n} layers: {why}. Fix: {fix}"""


def nested_choice(choice: str, stack: str, layers: int, *, scanned: bool) -> dict[str, Any]:
    """The whole-stack candidate of a ``nested`` choice: ``nested`` (blocks of about √L layers)
    or ``nested:K`` (blocks of K layers), each layer recomputed inside its block, as a plan
    ``{stack: {remat: recompute, nested: ...}}``; :class:`RematError` where it cannot apply (a
    stack that is not scanned, a block size out of range).

    >>> nested_choice("nested", "blocks", 16, scanned=True)
    {'blocks': {'remat': 'recompute', 'nested': 'sqrt'}}
    >>> nested_choice("nested:4", "blocks", 16, scanned=True)
    {'blocks': {'remat': 'recompute', 'nested': 4}}
    """
    _, _, size = choice.partition(":")
    if not scanned:
        raise RematError(_MSG_NESTED_NOT_SCANNED.format(
            choice=choice, stack=stack, docs=doc_url("semantics", "nested-stacks-n-checkpointing")))
    spec: int | str
    if size in ("", SQRT):
        spec = SQRT
        if sqrt_block(layers) < 2:
            raise RematError(_MSG_NESTED_SIZE.format(
                choice=choice, stack=stack, n=layers,
                why="a block holds at least 2 layers and fewer than the whole stack",
                fix="nest a deeper stack, or leave 'nested' out of the choices."))
    elif size.isdigit() and 2 <= int(size) <= layers:
        spec = int(size)
    else:
        raise RematError(_MSG_NESTED_SIZE.format(
            choice=choice, stack=stack, n=layers,
            why=f"{size!r} is not a block size from 2 to {layers}",
            fix=f"write nested:K with K from 2 to {layers}, or nested (blocks of about "
                f"√{layers}: {sqrt_block(layers)} layers)."))
    return {stack: {"remat": "recompute", NESTED_KEY: spec}}


def nesting_pays(layers: int) -> bool:
    """Whether √L nesting keeps fewer layer inputs than per-layer recompute: ``ceil(L/k)`` block
    inputs plus the ``k`` layer inputs of the block being recomputed, against ``L`` (from 6
    layers on); :func:`tune` adds the ``nested`` candidate by default only then.

    >>> [n for n in range(2, 10) if nesting_pays(n)]
    [6, 7, 8, 9]
    """
    k = sqrt_block(layers)
    return k >= 2 and -(-layers // k) + k < layers


def default_choices(tags: Sequence[str], *, offload: bool = True,
                    custom: Any = None) -> dict[str, Any]:
    """The choices a layer gets by default: no remat, the dots policies, the tagged names kept,
    the modules' own rules (``custom``, where the layers declare them: :func:`custom_choice`),
    the block input or the matmul outputs offloaded (where the backend has host memory), full
    recompute."""
    out: dict[str, Any] = {"save": "save", "dots": "dots", "dots_no_batch": "dots_no_batch"}
    if tags:
        out["names"] = {"save": sorted(tags)}
    if custom is not None:
        out["custom"] = custom
    if offload:
        out["offload"] = "offload"
        out["offload_dots_no_batch"] = "offload_dots_no_batch"
    out["recompute"] = "recompute"
    return out


def name_choice(choice: str, tags: Sequence[str]) -> dict[str, list[str]]:
    """A per-name choice: ``save:q+k+v`` keeps those tagged values on device, ``offload:mlp_hidden``
    moves them to host; everything else in the layer is recomputed.

    >>> name_choice("save:q+k", ["k", "q", "v"])
    {'save': ['k', 'q']}
    """
    where, _, rest = choice.partition(":")
    names = sorted({n for n in rest.split("+") if n})
    unknown = sorted(set(names) - set(tags))
    if not names or unknown:
        raise RematError(f"remat_common.tune: choice {choice!r} names "
                         f"{sorted_list(unknown) if unknown else 'no value'}; the layers tag "
                         f"{sorted_list(tags) or 'nothing'}. Fix: write {where}:NAME[+NAME...] "
                         "with tagged names.")
    return {where: names}


# -- the search ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Model:
    """Per choice: a layer's marginal device bytes ``w`` and cost, and the transient ``g`` of a
    run of layers of it (the part of the peak that is not residuals: arguments, outputs, what
    the backward pass of the run's layers holds on top of the residuals); ``g1``: the transient
    of a run of one layer (on a scanned stack a one-layer group runs unrolled, without the scan
    loop's copy of one iteration's residuals: less than ``g``; elsewhere ``g1 == g``).

    The backward pass runs the layers last to first and frees each run's residuals when the run
    is done, so while run ``r`` is differentiated the step holds the residuals of the runs up to
    it and its transient: the peak is ``max_r (g_r + sum of w over the runs up to r)``. The last
    run's residuals are consumed first, so what keeps the most goes last.
    """

    names: tuple[str, ...]
    w: tuple[float, ...]
    c: tuple[float, ...]
    g: tuple[float, ...]
    g1: tuple[float, ...]
    layers: int

    def predict(self, assign: Sequence[int]) -> tuple[float, float]:
        """Predicted (peak, cost) of one choice per layer, in layer order."""
        mem, s = -math.inf, 0.0
        for k, run in itertools.groupby(assign):
            x = len(list(run))
            s += x * self.w[k]
            mem = max(mem, (self.g1 if x == 1 else self.g)[k] + s)
        return mem, sum(self.c[k] for k in assign)

    def frontier(self) -> list[tuple[float, float, tuple[int, ...]]]:
        """Every assignment on the (predicted peak, cost) Pareto front, exactly, among those with
        at most one run of layers per choice (one scan group per choice on a scanned stack) and,
        where a one-layer run's transient is smaller (``g1 < g``), one more one-layer run of it.

        The runs' order is the one that minimises the peak: by transient, largest first (swapping
        two neighbouring runs ``a, b`` with ``g_a >= g_b`` can only lower the larger of their
        terms). So the DP walks the runs in that order, growing each one layer at a time, and
        keeps every state that no other beats on residuals so far, peak so far and cost; a run
        never directly follows one of its own choice (the two would be one run).
        """
        n, m = self.layers, len(self.names)
        # states closer than this in residuals and peak are taken as equal (the compiled peaks
        # the model is fitted to are bytes; 1e-4 of the largest uniform peak keeps the DP small)
        tol = 1e-4 * max((self.g[k] + n * self.w[k] for k in range(m)), default=0.0) + 0.5
        prune = functools.partial(_prune, tol=tol)
        split = {k for k in range(m) if self.g1[k] < self.g[k]}
        items = [(self.g[k], False, k) for k in range(m)]
        items += [(self.g1[k], True, k) for k in split]
        items.sort(key=lambda t: (-t[0], t[1], t[2]))
        # closed[used][last]: states after whole runs over `used` layers; `last` is the last
        # run's choice where it has a one-layer item still to come (else -1)
        closed: list[dict[int, list[_State]]] = [{} for _ in range(n + 1)]
        closed[0][-1] = [(0.0, -math.inf, 0.0, ())]
        for _, single, k in items:
            w, c, tag = self.w[k], self.c[k], (k if k in split else -1)
            new = [{last: list(v) for last, v in by.items()} for by in closed]  # k left out
            starts = [[st for last, v in by.items() if last != k for st in v] for by in closed]
            if single:
                for used in range(n):
                    for s, peak, cost, a in starts[used]:
                        new[used + 1].setdefault(tag, []).append(
                            (s + w, max(peak, self.g1[k] + s + w), cost + c, a + ((k, 1),)))
            else:
                # open runs of k: (residuals, peak of the closed runs, cost, assignment), by the
                # run's length so far: one layer, or more
                one: list[_State] = []
                more: list[_State] = []
                for used in range(n):
                    more = prune([(s + w, p, cost + c, a[:-1] + ((k, a[-1][1] + 1),))
                                  for s, p, cost, a in one + more])
                    one = prune([(s + w, p, cost + c, a + ((k, 1),))
                                 for s, p, cost, a in starts[used]])
                    out = new[used + 1].setdefault(tag, [])
                    out += [(s, max(p, self.g1[k] + s), cost, a) for s, p, cost, a in one]
                    out += [(s, max(p, self.g[k] + s), cost, a) for s, p, cost, a in more]
            closed = [{last: prune(v) for last, v in by.items()} for by in new]
        return _pareto([(peak, cost, tuple(k for k, x in a for _ in range(x)))
                        for v in closed[n].values() for _, peak, cost, a in v])


#: From this many layers on a scanned stack, the one-layer-last transients are not compiled.
DEEP_SCAN = 8


def dominated(bounded: Sequence[str], order: Sequence[str], w: Mapping[str, float],
               g: Mapping[str, float], c: Mapping[str, float], unreliable: set[str]
               ) -> dict[str, str]:
    """``{choice: the choice that dominates it}`` among the bounded choices: one whose residuals
    per layer ``w``, transient ``g`` and cost per layer ``c`` are all at least another's (where
    all three are equal, the later one in ``order``) never makes a plan better than that one in
    its place. A choice whose uniform plan XLA rematerialized on its own (``unreliable``: its
    figures are not the plan's) dominates none.

    >>> dominated(["a", "b", "c"], ["a", "b", "c"], {"a": 2, "b": 1, "c": 1},
    ...            {"a": 5, "b": 5, "c": 5}, {"a": 1, "b": 1, "c": 1}, set())
    {'a': 'b', 'c': 'b'}
    """
    out: dict[str, str] = {}
    for k in bounded:
        for j in bounded:
            if j == k or j in out or j in unreliable:
                continue
            if w[j] <= w[k] and g[j] <= g[k] and c[j] <= c[k] and (
                    (w[j], g[j], c[j]) != (w[k], g[k], c[k]) or order.index(j) < order.index(k)):
                out[k] = j
                break
    return out


def run_orders(assign: Sequence[int]) -> list[tuple[int, ...]]:
    """The assignments with the same runs of layers as ``assign`` in every other order.

    >>> run_orders((0, 1, 1))
    [(1, 1, 0)]
    """
    runs = [(k, len(list(g))) for k, g in itertools.groupby(assign)]
    out: list[tuple[int, ...]] = []
    for order in itertools.permutations(runs):
        b = tuple(k for k, x in order for _ in range(x))
        if b != tuple(assign) and b not in out:
            out.append(b)
    return out


#: A DP state of :meth:`Model.frontier`: residuals so far, peak so far, cost, and the runs so far
#: as ``(choice, layers)``.
_State = tuple[float, float, float, tuple[tuple[int, int], ...]]


def _prune(states: list[_State], tol: float = 0.5) -> list[_State]:
    """The states no other beats on residuals, peak and cost at once, to ``tol`` bytes (ties: the
    first by assignment): by cost, each kept only if no cheaper one has both fewer residuals and
    a lower peak (a staircase of the kept ones' (residuals, peak), residuals rising, peaks
    falling)."""
    states.sort(key=lambda t: (t[2], t[0], t[1], t[3]))
    kept: list[_State] = []
    xs: list[float] = []
    ys: list[float] = []
    for st in states:
        s, p = st[0], st[1]
        i = bisect.bisect_right(xs, s + tol)
        if i and ys[i - 1] <= p + tol:
            continue
        kept.append(st)
        j = bisect.bisect_left(xs, s)
        e = j
        while e < len(xs) and ys[e] >= p:
            e += 1
        xs[j:e] = [s]
        ys[j:e] = [p]
    return kept


def _pareto(items: list[tuple[float, float, tuple[int, ...]]]
            ) -> list[tuple[float, float, tuple[int, ...]]]:
    """The items no other item beats on both memory and cost (ties: the first, smaller tuple)."""
    items.sort(key=lambda t: (round(t[0]), t[1], sorted(t[2]), t[2]))
    out: list[tuple[float, float, tuple[int, ...]]] = []
    best = math.inf
    for m, c, a in items:
        if c < best * (1 - 1e-12) - 1e-9:
            out.append((m, c, a))
            best = c
    return out


def assignment_plan(stack: str, assign: Sequence[str], choices: Mapping[str, Any]) -> dict[str, Any]:
    """A short plan for one choice per layer: the most common choice on ``STACK.*``, then a range
    rule per run of layers that differ from it (later rules win).

    >>> assignment_plan("blocks", ["save", "recompute", "recompute", "recompute"],
    ...                 {"save": "save", "recompute": "recompute"})
    {'blocks.*': 'recompute', 'blocks.0': 'save'}
    >>> assignment_plan("blocks", ["save", "save", "dots", "recompute"],
    ...                 {"save": "save", "dots": "dots", "recompute": "recompute"})
    {'blocks.*': 'save', 'blocks.2': 'dots', 'blocks.3': 'recompute'}
    >>> custom = LayerRules((("", "save"), ("mlp", "custom")))
    >>> assignment_plan("blocks", ["custom", "custom", "recompute"],
    ...                 {"custom": custom, "recompute": "recompute"})
    {'blocks.*': 'recompute', 'blocks.[0-1]': 'save', 'blocks.[0-1].mlp': 'custom'}
    """
    counts = Counter(assign)
    order = list(choices)
    # a choice written as rules below the layers is on the glob only when every layer takes it
    plain = [k for k in counts if not isinstance(choices[k], LayerRules)] or list(counts)
    common = max(plain, key=lambda k: (counts[k], -order.index(k)))
    out: dict[str, Any] = rules_on(f"{stack}.*", choices[common])
    for choice, run in itertools.groupby(enumerate(assign), key=lambda t: t[1]):
        idx = [i for i, _ in run]
        if choice == common:
            continue
        key = f"{stack}.{idx[0]}" if len(idx) == 1 else f"{stack}.[{idx[0]}-{idx[-1]}]"
        rules = rules_on(key, choices[choice])
        if isinstance(choices[choice], LayerRules) and rules[key] == out[f"{stack}.*"]:
            del rules[key]  # the layers' own annotation is the glob's already
        out.update(rules)
    return out


def has_boundary(choice: Any) -> bool:
    """Whether a choice puts a remat boundary on the layer itself (``save`` does not, nor a
    :class:`LayerRules` that leaves the layer saved)."""
    if isinstance(choice, LayerRules):
        choice = dict(choice.rules).get("", "save")
    return choice not in ("save", "inherit")


def rules_on(layers: str, choice: Any) -> dict[str, Any]:
    return choice.on(layers) if isinstance(choice, LayerRules) else {layers: choice}
