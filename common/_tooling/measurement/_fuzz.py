"""Random plans over a model's modules and tags, for the gradient-parity fuzz
(``remat verify --fuzz N --seed S``; :func:`fuzz_plans`).

The model is probed twice (its module paths and stacks, then the names its tags produce inside
each layer) and each plan is drawn from a seeded generator: a feature in turn (offload, names,
nested stacks, recompute, dots, state on host), so that any six consecutive plans of a model cover
them all, and the rest at random (layer ranges with two annotations, an annotation on a layer's
submodule merged into the layer's boundary, a boundary on a module outside the layers, the state
on host). A model that tags nothing (a third-party model) gets ``{"tag": NAME}`` rules on some of
its layers' leaf modules, whose names the plan then saves or offloads. Plans the project refuses
are drawn too: :func:`~remat_common.verify_parity` records them as refused.
"""

from __future__ import annotations

import dataclasses
import random
import re
from collections.abc import Callable
from typing import Any

from ..._errors import PlanError
from ..._paths import INPUT_NAME
from ..._plan import Plan
from ..._residuals import saved_residuals
from ._target import MeasureTarget

#: The feature each plan exercises, in turn.
FEATURES = ("offload", "names", "nested", "recompute", "dots", "state")
_BOUNDARY_KINDS = ("recompute", "offload", "dots", "dots_no_batch", "names", "offload_dots_no_batch")
_LAYER = re.compile(r"^(.+)\.(\d+)$")


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """What the fuzz draws from: the model's layer containers (``blocks``: ``blocks.0`` ...) with
    their layer counts, the stacks among them, each layer's submodules (relative paths) and leaf
    modules, the names tagged inside a layer by submodule (``{"attn": ("q", "k")}``, ``""`` for
    the layer itself), the modules outside the layers, and whether the step keeps state where a
    plan's ``state:`` says."""

    layers: tuple[tuple[str, int], ...]
    stacks: tuple[str, ...]
    children: tuple[str, ...]
    leaves: tuple[str, ...]
    names: tuple[tuple[str, tuple[str, ...]], ...]
    others: tuple[str, ...]
    keeps_state: bool


def model_shape(builder: Callable[[Plan | None], MeasureTarget]) -> ModelShape:
    """Probes the model ``builder`` builds (twice, with plans that change nothing and that
    recompute each layer) for what :func:`fuzz_plans` draws from."""
    t = builder(Plan.from_mapping({"*": "save"}))
    if t.plan is None:
        raise PlanError("remat verify --fuzz: the target's MeasureTarget.plan is None under a plan, "
                        "so its modules cannot be listed. Fix: set plan= to the compiled plan the "
                        "model was annotated with (frp.compiled_plan(model) / erp.plan_of(model)).")
    paths = t.plan.resolution.paths
    counts: dict[str, int] = {}
    for p in paths:
        m = _LAYER.match(p)
        if m:
            counts[m[1]] = max(counts.get(m[1], 0), int(m[2]) + 1)
    if not counts:
        raise PlanError("remat verify --fuzz: the model has no layers (module paths such as "
                        f"'layers.0'); its modules: {', '.join(sorted(paths)[:12])}. The fuzz draws "
                        "plans over layers. Fix: fuzz a model with a stack or list of layers.")
    first = min(counts, key=lambda x: (-counts[x], x))
    inner = sorted(p[len(first) + 3:] for p in paths if p.startswith(f"{first}.0."))
    children = tuple(p for p in inner if "." not in p)
    leaves = tuple(p for p in inner if not any(q.startswith(p + ".") for q in inner))
    others = tuple(p for p in paths if p and "." not in p and p not in counts)
    probe = builder(Plan.from_mapping({f"{x}.*": "recompute" for x in counts}))
    named: dict[str, set[str]] = {}
    for q in saved_residuals(probe.loss_fn, *probe.loss_args).produced:
        path, _, name = q.rpartition("/")
        m = re.match(rf"^{re.escape(first)}\.\d+\.?(.*)$", path)
        if m and name != INPUT_NAME and not name.startswith("__"):
            named.setdefault(m[1], set()).add(name)
    return ModelShape(tuple(sorted(counts.items())), tuple(t.plan.resolution.stacks), children,
                      leaves, tuple((k, tuple(sorted(v))) for k, v in sorted(named.items())),
                      others, t.state is not None)


def fuzz_plans(builder: Callable[[Plan | None], MeasureTarget] | ModelShape, n: int, *,
               seed: int = 0, start: int = 0) -> dict[str, dict[str, Any]]:
    """``n`` random plan configs over the model ``builder`` builds (or a probed
    :class:`ModelShape`): name (``fuzz-s{seed}-{i}``) -> config, as
    :meth:`~remat_common.Plan.from_config` reads. The same seed draws the same plans; plan ``i``
    exercises ``FEATURES[i % 6]``. ``start`` numbers them from there (and turns the features
    with them). Give them to :func:`~remat_common.verify_parity`."""
    shape = builder if isinstance(builder, ModelShape) else model_shape(builder)
    return {f"fuzz-s{seed}-{i}": draw(shape, random.Random(seed * 1_000_003 + i), FEATURES[i % 6])
            for i in range(start, start + n)}


def draw(shape: ModelShape, rng: random.Random, feature: str) -> dict[str, Any]:
    """One plan config exercising ``feature``."""
    stack, n_layers = rng.choice(shape.layers)
    layers = f"{stack}.*"
    rules: dict[str, Any] = {}
    names = {sub: list(ns) for sub, ns in shape.names}
    if not names:  # a model that tags nothing: name some leaf modules' outputs
        for leaf in rng.sample(shape.leaves, min(len(shape.leaves), rng.randint(2, 4))):
            tag = "t_" + leaf.replace(".", "_")
            rules[f"{layers}.{leaf}"] = {"tag": tag}
            names.setdefault(leaf.rpartition(".")[0], []).append(tag)
    tagged = {p.partition(".*.")[2] for p in rules}
    subs = [c for c in shape.children if c not in tagged]
    every = sorted({n for ns in names.values() for n in ns})
    state = None
    if feature == "nested" and stack in shape.stacks:
        rules[stack] = {"remat": rng.choice(["recompute", "save"]), "nested": rng.choice([2, "sqrt"])}
        sub = _pick_sub(rng, subs, names)
        if sub is not None and rng.random() < 0.6:
            rules[f"{layers}.{sub}"] = (
                {"save": rng.sample(names[sub], rng.randint(1, len(names[sub])))}
                if names.get(sub) else "recompute")
        return {"rules": rules}
    kind = {"offload": rng.choice(["offload", "names_offload", "offload_dots_no_batch"]),
            "names": "names", "nested": "recompute", "recompute": "recompute",
            "dots": rng.choice(["dots", "dots_no_batch"]),
            "state": rng.choice(["recompute", "names", "offload", "save"])}[feature]
    if feature == "state" and shape.keeps_state:
        state = rng.choice([{"optimizer": "host"}, {"params": "host"},
                            {"params": "host", "optimizer": "host"}])
    if n_layers >= 2 and rng.random() < 0.4:  # two groups of layers, each its own annotation
        k = rng.randint(1, n_layers - 1)
        outer = rules[f"{stack}.[0-{k - 1}]"] = _annotation(rng, kind, every)
        rules[f"{stack}.[{k}-{n_layers - 1}]"] = _annotation(rng, rng.choice(_BOUNDARY_KINDS), every)
    else:
        outer = rules[layers] = _annotation(rng, kind, every)
    sub = _pick_sub(rng, subs, names)
    # a submodule: merged into the layer's boundary (names, recompute, offload: a dots boundary
    # merges nothing), or a boundary of its own under a layer that has none
    # (under a names mapping, a submodule's recompute or offload would drop the names it tags)
    merged = (_BOUNDARY_KINDS if outer == "save" else ("recompute", "offload", "names")
              if outer in ("recompute", "offload") else ("names",) if isinstance(outer, dict) else ())
    if sub is not None and merged and rng.random() < 0.5:
        rules[f"{layers}.{sub}"] = _annotation(rng, rng.choice(merged), names.get(sub, []))
    if shape.others and rng.random() < 0.25:
        rules[rng.choice(shape.others)] = rng.choice(["recompute", "offload"])
    return {"rules": rules, **({"state": state} if state else {})}


def _pick_sub(rng: random.Random, subs: list[str], names: dict[str, list[str]]) -> str | None:
    with_names = [s for s in subs if names.get(s)]
    pool = with_names if with_names and rng.random() < 0.7 else subs
    return rng.choice(pool) if pool else None


def _annotation(rng: random.Random, kind: str, names: list[str]) -> Any:
    """The annotation of ``kind``; ``names`` / ``names_offload``: a mapping over ``names`` (at
    least one offloaded for ``names_offload``), ``recompute`` where there are none."""
    if kind not in ("names", "names_offload"):
        return kind
    if not names:
        return "offload" if kind == "names_offload" else "recompute"
    chosen = rng.sample(names, rng.randint(1, min(len(names), 4)))
    cut = rng.randint(0, len(chosen) - (1 if kind == "names_offload" else 0))
    out = {"save": sorted(chosen[:cut]), "offload": sorted(chosen[cut:])}
    return {k: v for k, v in out.items() if v}
