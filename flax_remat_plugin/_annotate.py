"""``annotate``: a plan applied to an existing NNX model, by a per-instance class swap.

How a model is changed
----------------------
Each module the plan names (a rule matches it) or acts on (a boundary, tagged inputs, ``custom``),
and a declared stack whose layers hold one, gets its class swapped in place for a subclass ``S``
of its own class that the core makes once per (class, module path, compiled plan)
(:func:`remat_common.adapter.annotated_class`);
with ``share_alike_layers``, a module inside a list layer that runs as an earlier alike layer gets
the class made for its counterpart there (``CompiledPlan.canonical_path``), so the layers of a
group have equal graphdefs and JAX traces their boundary once.
Every other module keeps its class (``type(m) is Cls``): a module running inside a swapped one is
placed, when it tags a name, by the core's lookup of the module running now, among the paths of
NNX's graph traversal of the swapped module (``_paths.graph_paths``), so its names are qualified
by its path all the same.
``S`` only overrides ``__call__``: it runs the original ``__call__`` through
:func:`remat_common.adapter.call_module`, which sets the module scope (so ``checkpoint_name`` tags are
qualified by the module's path), tags the inputs when the plan offloads them, and wraps the call in
the module's remat boundary built with ``nnx.remat`` (unbound form, the module passed as an
argument, so rng streams and batch statistics updated inside survive).

Effect on NNX: the model's state (``nnx.state(model)``: paths, values, variable types) and its
attributes are untouched; the class of each swapped module in its graphdef is ``S`` instead of the
original (same ``__name__``, so reprs read the same; ``isinstance`` against the original class holds). Because
the plan lives on the class, it survives ``nnx.split``/``nnx.merge``, ``nnx.jit``, ``nnx.grad``,
``nnx.scan`` and ``nnx.clone``; a checkpoint of the state restores either way. ``unannotate`` puts the
original classes back. Pickling an annotated module or its graphdef is refused with a
``pickle.PicklingError`` that says so (its classes are made at run time): pickle
``nnx.state(model)``, or unannotate first.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import jax
from flax import nnx
from remat_common import Annotation, CompiledPlan, Plan, PlanError, PlanLike, Rule
from remat_common.adapter import (
    MAPPING_KEYS,
    ROOT_PATTERN,
    ModelView,
    annotated_class,
    binding_of,
    check_bool,
    coerce_plan,
    display,
    in_subtree,
    original_class,
    plan_model,
    str_sequence,
    with_class,
)

from ._binding import CLASS_RULES, CUSTOM, FRAMEWORK, INSTANCE_RULES, Binding, has_call
from ._call import check_touched
from ._paths import ModuleTree, check_module, module_tree

M = TypeVar("M", bound=nnx.Module)

_MSG_SEVERAL = """\
compiled_plan: the modules of this model were annotated by {n} separate annotate() calls (at
{roots}). Fix: annotate the whole model once, or ask a submodule for its own plan."""


_MSG_ADDED = """\
{fn}module {path!r} ({cls}) is not in the model the plan was compiled for: it was added after
annotate (an append to a list, an assignment), so it runs outside the plan. Fix: annotate the
model again after the change, frp.annotate(model, plan, replace=True), and verify with
frp.compiled_plan(model)."""


def added_modules(model: nnx.Module, binding: Binding) -> list[tuple[str, str]]:
    """``(path, class name)`` of the outermost modules of ``model`` (the module ``binding`` was
    annotated at) that the plan was not resolved for: added after ``annotate``."""
    tree = module_tree(model, [s for s, _ in binding.stacks], fn="compiled_plan")
    known = set(binding.plan.resolution.paths)
    out: list[tuple[str, str]] = []
    for path in tree.plan_paths:
        if path not in known and not any(in_subtree(path, p) for p, _ in out):
            module = tree.module(tree.real(path))
            out.append((path, original_class(type(module)).__name__))
    return out


def _root_binding(model: nnx.Module) -> Binding | None:
    """The binding of the ``annotate`` call ``model`` was annotated by, when ``model`` is that
    call's root (every swapped module sits at the path it was annotated for) and one call
    annotated it; None otherwise."""
    found: set[Binding] = set()
    for keys, node in nnx.iter_graph(model):
        b = binding_of(node) if isinstance(node, nnx.Module) else None
        if b is None:
            continue
        if b[0] != b[1].plan.canonical_path(".".join(map(str, keys))):
            return None
        found.add(b[1])
    return next(iter(found)) if len(found) == 1 else None


def check_verified_models(plan: CompiledPlan, arguments: Any) -> list[str]:
    """``verify``'s check of the NNX models among its arguments (see
    :attr:`remat_common.adapter.Framework.check_models`): modules added after ``annotate``."""
    out: list[str] = []
    seen: set[int] = set()
    for leaf in jax.tree_util.tree_leaves(arguments, is_leaf=lambda x: isinstance(x, nnx.Module)):
        if not isinstance(leaf, nnx.Module) or id(leaf) in seen:
            continue
        seen.add(id(leaf))
        binding = _root_binding(leaf)
        if binding is None or not (binding.plan is plan or binding.plan == plan):
            continue
        out += [_MSG_ADDED.format(fn="", path=p, cls=c) for p, c in added_modules(leaf, binding)]
    return out


# ------------------------------------------------------------------------------------------------
# Rules: what classes and instances declare, then the user's plan.


def _depth(path: str) -> int:
    return 0 if not path else path.count(".") + 1


def _declared_pattern(tree: ModuleTree, path: str, rel: str) -> str:
    stack = tree.stack_of(path)
    if stack is not None:
        if path == stack and rel == ROOT_PATTERN:
            return stack  # an annotation on the stack applies to each layer
        path = tree.virtual(path, "*")
    if rel == ROOT_PATTERN:
        return path or ROOT_PATTERN
    return f"{path}.{rel}" if path else rel


def declared_rules(tree: ModuleTree) -> tuple[Rule, ...]:
    """The rules that decorated classes and ``remat=`` keywords declare, children first (so that a
    module's declaration about its children wins over theirs)."""
    out: list[Rule] = []
    for path, module in sorted(tree.modules, key=lambda pm: -_depth(pm[0])):
        cls = original_class(type(module))
        where = display(path)
        for rel, ann in getattr(cls, CLASS_RULES, ()):
            out.append(Rule(_declared_pattern(tree, path, rel), ann,
                            f"@remat on {cls.__qualname__} at {where}"))
        for rel, ann in vars(module).get(INSTANCE_RULES, ()):
            out.append(Rule(_declared_pattern(tree, path, rel), ann,
                            f"{cls.__qualname__}(remat=...) at {where}"))
    return tuple(out)


def _describe(tree: ModuleTree) -> Callable[[str], tuple[str, bool, bool] | None]:
    def describe(path: str) -> tuple[str, bool, bool] | None:
        module = tree.module(tree.real(path))
        if module is None:  # pragma: no cover - every plan path is a module path
            return None
        cls = original_class(type(module))
        return cls.__name__, has_call(cls), getattr(cls, CUSTOM, None) is not None

    return describe


def model_view(tree: ModuleTree) -> ModelView:
    """The model as :func:`remat_common.adapter.plan_model` sees it."""
    stacked = {p: (s, n) for s, n in tree.stacks for p, _ in tree.modules
               if p != s and tree.stack_of(p) == s}
    return ModelView(
        paths=tree.plan_paths, stacks=tree.stack_paths, declared=declared_rules(tree),
        others=dict(tree.others), stacked=stacked, aliases=dict(tree.aliases),
        describe=_describe(tree),
        modules=tuple((p, tree.module(tree.real(p))) for p in tree.plan_paths))


_MSG_TRACED = """\
annotate: the model's variables are tracers: annotate runs inside a transform (nnx.jit, nnx.grad,
nnx.vmap, ...), which checks on the way out that every module kept its class, and annotate swaps
them (NNX then reports 'Expected a node of type Block ..., but got a node of type Block').
Fix: annotate the model once, before the transform: frp.annotate(model, plan); then call
nnx.jit(step)(model, ...): the plan travels with the model into every transform (a model built
inside one: annotate what it returns)."""

_MSG_ANNOTATED = """\
annotate: this model already runs a plan given to an earlier annotate() call
({where}); annotating it again would silently drop that plan's
boundaries. Fix: frp.annotate(model, plan, replace=True) to replace it, or frp.unannotate(model)
first; to keep both, annotate once with one plan holding both plans' rules (later rules win)."""


def _check_not_annotated(model: nnx.Module) -> None:
    """Refuses a model that an earlier ``annotate`` call gave a plan (``replace=True`` replaces it)."""
    where: list[str] = []
    for keys, node in nnx.iter_graph(model):
        b = binding_of(node) if isinstance(node, nnx.Module) else None
        if b is not None and b[1].planned:
            where.append(display(".".join(map(str, keys))))
    if where:
        shown = ", ".join(map(repr, where[:4])) + (f", ... ({len(where) - 4} more)"
                                                   if len(where) > 4 else "")
        raise PlanError(_MSG_ANNOTATED.format(where=f"modules {shown}"))


def annotate(model: M, plan: PlanLike = None, *, stacks: Iterable[str] = (),
             prevent_cse: bool = True, share_alike_layers: bool = True,
             replace: bool = False) -> M:
    """Applies a remat plan to an existing NNX model, in place; its state is left untouched.

    Every module of ``model`` then runs in its module scope (so
    :func:`remat_common.checkpoint_name` tags are qualified: ``layers.3.attn/attn_out``), and each
    module the plan annotates runs inside its compiled remat boundary, built with ``nnx.remat``.
    What classes declare with :func:`remat` (and ``remat=`` constructor keywords) applies first;
    ``plan`` then overrides it (later rules win). See
    https://docs.jax.dev/en/latest/gradient-checkpointing.html for what the boundaries do.

    Args:
      model: any ``nnx.Module``, including models whose classes you cannot edit.
      plan: a :class:`remat_common.Plan`, a ``{pattern: annotation}`` mapping, a list of
        ``(pattern, annotation)`` pairs, or a path to a YAML/TOML/JSON plan file. Patterns are
        dotted NNX paths (``layers.0.attn``; ``nnx.List`` indices and ``nnx.Dict`` keys included)
        with globs (``layers.*.mlp``, ``layers.[0-3]``, ``**``); ``.`` is the model itself.
        ``None`` applies only what the classes declare.
      stacks: paths of stacked-layer modules (built with ``nnx.vmap`` and run by
        :func:`scan_layers`), besides those that classes list in ``__remat_stacks__``. Their layers
        are addressed per layer (``layers.3.mlp``); a plan that treats some layers differently
        splits the scan into layer groups.
      prevent_cse: as in ``jax.checkpoint``, for every boundary.
      share_alike_layers: list layers the plan treats alike (``self.layers = nnx.List([...])``
        called in a Python loop; see :func:`remat_common.compile_plan`) run as the first layer of
        their group: one class, one boundary, one policy and the first layer's names
        (``layers.0/h`` for every layer of the group), so JAX traces the layer body once per
        group instead of once per layer (the default: the build of a 96-layer model costs what
        hand-written ``nnx.remat`` does). ``verify`` and the report count a shared boundary's
        residuals once per layer it runs for and list those layers. ``False`` gives every layer
        its own boundary and names (``layers.7/h``), traced per layer.
      replace: annotate a model that an earlier ``annotate`` call gave a plan, replacing that
        plan (the earlier plan's boundaries go; what the classes declare applies again). Without
        it such a model is refused: a second plan never silently drops the first.

    Returns:
      ``model`` itself (annotated in place).

    With ``nnx.split``/``nnx.merge`` and plain JAX transforms (``jax.grad``), merge with
    ``copy=True`` inside the transform, as for ``nnx.remat`` itself: a boundary writes the module's
    variables back, and variables made outside a trace cannot be updated inside it. NNX transforms
    (``nnx.jit``, ``nnx.grad``, ``nnx.value_and_grad``, ``nnx.scan``) need nothing special.

    Raises:
      PlanError: a pattern matches no module (the nearest paths are listed), names a variable or a
        path inside a stack, or annotates a module without ``__call__``; a ``custom`` annotation on
        a module without ``__remat_custom__``; the model already runs a plan (without ``replace``).
      TypeError: ``model`` is not a module (a bound method, a function, a state).

    >>> import jax.numpy as jnp
    >>> from flax import nnx
    >>> import flax_remat_plugin as frp
    >>> class MLP(nnx.Module):
    ...     def __init__(self, rngs):
    ...         self.layers = nnx.List([nnx.Linear(4, 4, rngs=rngs) for _ in range(3)])
    ...     def __call__(self, x):
    ...         for layer in self.layers:
    ...             x = jnp.tanh(layer(x))
    ...         return x
    >>> model = frp.annotate(MLP(nnx.Rngs(0)), {"layers.*": "recompute", "layers.0": "offload"})
    >>> [(b.path, b.spec.kind, sorted(b.spec.offload)) for b in frp.compiled_plan(model).boundaries]
    [('layers.0', 'offload', ['layers.0/__input__']), ('layers.1', 'recompute', []), ('layers.2', 'recompute', [])]
    >>> model(jnp.ones((2, 4))).shape
    (2, 4)
    """
    check_module(model, "annotate")
    stacks = str_sequence("annotate", "stacks", stacks)
    check_bool("annotate", "prevent_cse", prevent_cse)
    check_bool("annotate", "share_alike_layers", share_alike_layers)
    check_bool("annotate", "replace", replace)
    if plan is not None and any(isinstance(x, jax.core.Tracer)
                                for x in jax.tree_util.tree_leaves(nnx.state(model))):
        raise PlanError(_MSG_TRACED)  # (declarations alone apply anywhere: a model built in nnx.jit)
    if not replace:
        _check_not_annotated(model)
    tree = module_tree(model, stacks, fn="annotate")
    try:
        compiled = plan_model(model_view(tree), plan, share_alike_layers=share_alike_layers)
    except PlanError:
        _check_self_scanned(plan, tree)  # a clearer error for per-layer patterns, when it applies
        _check_nested_on_list(plan, tree)
        raise
    touched = touched_paths(tree, compiled)
    binding = Binding(compiled, tree.stacks, prevent_cse, touched, plan is not None)
    for path, module in tree.modules:
        orig = original_class(type(module))
        # A module inside a shared layer runs as its counterpart in the group's first layer: the
        # same class, so NNX's graphdef (part of JAX's trace cache key) is the same for every
        # layer of the group.
        with_class(module, annotated_class(FRAMEWORK, orig, compiled.canonical_path(path), binding)
                   if path in touched else orig)
    return model


_MSG_SCANS_ITSELF = """\
flax_remat_plugin.annotate: pattern {pattern!r} addresses layers of {path!r}, one {cls} whose
arrays share a leading axis of {n}: a stack the model scans itself. A plan sees it as one module,
and {path!r} applies to every layer (its scan body). Fix: annotate {path!r}; for per-layer control
declare the stack (annotate(model, plan, stacks=[{path!r}])) and run it with
frp.scan_layers(self.{attr}, x), which scans it in layer groups."""


_MSG_NESTED_LIST = """\
flax_remat_plugin.annotate: pattern {pattern!r} nests {path!r} (nested: {spec}), but {path!r} is
a list of {n} modules, not a stack: nesting splits one scan over stacked layers into checkpointed
blocks, and a list is called layer by layer. Fix: build the layers as one stacked module
(nnx.vmap over the layer's constructor), declare it (annotate(model, plan, stacks=[{path!r}]) or
__remat_stacks__) and run it with frp.scan_layers(self.{attr}, x). Without nesting, annotate the
layers of the list ('{path}.*')."""


def _check_nested_on_list(plan: PlanLike, tree: ModuleTree) -> None:
    """Refuses ``nested`` aimed at an ``nnx.List`` of layers, saying how to declare a stack."""
    view = model_view(tree)
    for rule in coerce_plan(plan, view).rules:
        if rule.annotation.nested is None:
            continue
        for path in (p for p in view.paths if rule.matches(p) and tree.stack_of(p) is None):
            layers = [p for p, _ in tree.modules if p.startswith(path + ".")
                      and p[len(path) + 1:].isdigit()]
            if layers:
                raise PlanError(_MSG_NESTED_LIST.format(
                    pattern=rule.pattern, path=path, spec=rule.annotation.nested, n=len(layers),
                    attr=path.rpartition(".")[2] or "layers"))


def _check_self_scanned(plan: PlanLike, tree: ModuleTree) -> None:
    """Refuses a per-layer pattern (``layers.0``) aimed at an undeclared stack, saying so."""
    view = model_view(tree)
    for rule in coerce_plan(plan, view).rules:
        if any(rule.matches(p) for p in view.paths):
            continue
        segs = rule.pattern.split(".")
        for k in range(1, len(segs)):
            path = ".".join(segs[:k])
            module = tree.module(path)
            if (module is None or tree.stack_of(path) is not None
                    or tree.module(".".join(segs[:k + 1])) is not None
                    or not re.fullmatch(r"\d+|\[\d+-\d+\]", segs[k])
                    or any(p.startswith(path + ".") and p[len(path) + 1:].partition(".")[0].isdigit()
                           for p, _ in tree.modules)):  # a list of modules, not a stack
                continue
            sizes = {int(x.shape[0]) if getattr(x, "ndim", 0) else 0
                     for x in jax.tree_util.tree_leaves(nnx.state(module))}
            if len(sizes) == 1 and min(sizes) >= 2:
                raise PlanError(_MSG_SCANS_ITSELF.format(
                    pattern=rule.pattern, path=path, cls=original_class(type(module)).__name__,
                    n=sizes.pop(), attr=path.rpartition(".")[2]))


def touched_paths(tree: ModuleTree, plan: CompiledPlan) -> frozenset[str]:
    """The real paths ``annotate`` swaps: the callable modules the plan names (a rule matches them)
    or acts on (boundaries, tagged inputs, ``custom``), and a stack whose layers hold one of them
    (``scan_layers`` splits its scan into layer groups) or inside one. The root only when the plan
    names it."""
    res = plan.resolution
    named = {tree.real(p) for matched in res.matches for p in matched}
    named |= {tree.real(p) for p in res.active_paths}
    # a declared stack runs as copies inside nnx.scan: it carries its path when the plan names
    # something inside it or around it
    named |= {s for s, _ in tree.stacks if any(in_subtree(p, s) or in_subtree(s, p) for p in named)}
    callables = {p for p, m in tree.modules if has_call(original_class(type(m)))}
    return frozenset(named & callables)


def unannotate(model: M) -> M:
    """Removes any plan from ``model`` (in place): every module gets its original class back.

    What classes declare with :func:`remat` stays declared; ``annotate(model)`` applies it again.

    >>> from flax import nnx
    >>> import flax_remat_plugin as frp
    >>> lin = frp.annotate(nnx.Linear(2, 2, rngs=nnx.Rngs(0)), {".": "recompute"})
    >>> type(frp.unannotate(lin)) is nnx.Linear
    True
    """
    check_module(model, "unannotate")
    for _, node in nnx.iter_graph(model):
        if isinstance(node, nnx.Module):
            with_class(node, original_class(type(node)))
    return model


def bind_declarations(model: nnx.Module) -> bool:
    """Annotates ``model`` as a whole with what its classes declare (in place, as
    ``annotate(model)`` does) when its annotations are all written in model code and were applied
    below it (each decorated module annotates its own subtree when it is built); returns whether
    it did. Declarations then run at their paths in ``model`` (``blocks.1/__input__``)."""
    bound = [(".".join(map(str, k)), binding_of(n)) for k, n in nnx.iter_graph(model)
             if isinstance(n, nnx.Module) and binding_of(n) is not None]
    bindings = {b[1] for _, b in bound if b is not None}
    if bindings and not any(b.planned for b in bindings) and (len(bindings) > 1 or any(
            here != b[0] and (here.endswith("." + b[0]) if b[0] else True)
            for here, b in bound if b is not None)):  # declared below the model, not around it
        annotate(model)  # only model-code declarations: apply them to the whole model
        return True
    return False


def bind_declared_models(arguments: Any) -> Any:
    """``saved_residuals``' (and so ``verify``'s) binding of its NNX model arguments (see
    :attr:`remat_common.adapter.Framework.bind_models`): :func:`bind_declarations`, in place, so
    a model of decorated blocks shows the names :func:`compiled_plan` would give it before as
    after that call."""
    seen: set[int] = set()
    for leaf in jax.tree_util.tree_leaves(arguments, is_leaf=lambda x: isinstance(x, nnx.Module)):
        if isinstance(leaf, nnx.Module) and id(leaf) not in seen:
            seen.add(id(leaf))
            bind_declarations(leaf)
    return arguments



def compiled_plan(model: nnx.Module) -> CompiledPlan | None:
    """The compiled plan ``model`` was annotated with, or ``None`` for a plain model.

    Hand it to :func:`remat_common.verify` to check the residuals of a loss over ``model``.

    A model whose annotations are all written in model code (``@frp.remat`` classes,
    ``remat=`` constructor keywords: each decorated module annotates its own subtree when it is
    built) is first annotated as a whole with them, in place, as ``annotate(model)`` would: the
    plan returned is the one the model runs from then on, with path-qualified names
    (``blocks.1/__input__``) and one boundary per decorated module at its path. Until then each
    decorated block runs as its own one-boundary plan (two ``remat="offload"`` blocks both tag
    ``__input__``); :func:`remat_common.saved_residuals` and :func:`remat_common.verify` bind such
    a model among their arguments the same way first, so they show the qualified names whether
    or not this was called.

    >>> import jax.numpy as jnp
    >>> from flax import nnx
    >>> import flax_remat_plugin as frp
    >>> @frp.remat
    ... class Block(nnx.Module):
    ...     def __init__(self, rngs):
    ...         self.lin = nnx.Linear(4, 4, rngs=rngs)
    ...     def __call__(self, x):
    ...         return jnp.tanh(self.lin(x))
    >>> class Net(nnx.Module):
    ...     def __init__(self, rngs):
    ...         self.blocks = nnx.List([Block(rngs), Block(rngs, remat="offload")])
    ...     def __call__(self, x):
    ...         return self.blocks[1](self.blocks[0](x))
    >>> [(b.path, b.spec.kind) for b in frp.compiled_plan(Net(nnx.Rngs(0))).boundaries]
    [('blocks.0', 'recompute'), ('blocks.1', 'offload')]
    """
    check_module(model, "compiled_plan")
    bind_declarations(model)
    # Bindings are compared by value: swapped classes are cached per (class, path, binding), so two
    # annotate() calls with the same plan on models of one shape share classes (and binding objects).
    found: dict[Binding, tuple[str, Binding]] = {}
    where: dict[Binding, str] = {}  # binding -> the shortest graph path of a module that runs it
    for keys, node in nnx.iter_graph(model):
        b = binding_of(node) if isinstance(node, nnx.Module) else None
        if b is not None:
            found.setdefault(b[1], b)
            here = ".".join(map(str, keys))
            if b[1] not in where or len(here) < len(where[b[1]]):
                where[b[1]] = here
    if not found:
        return None
    if len(found) > 1:
        roots = sorted(display(p) for p in where.values())
        raise PlanError(_MSG_SEVERAL.format(n=len(found), roots=", ".join(map(repr, roots))))
    path, binding = next(iter(found.values()))
    if _root_binding(model) is not None:  # ``model`` is what was annotated
        check_touched(model, "", binding, fn="compiled_plan")
        for p, c in added_modules(model, binding)[:1]:
            raise PlanError(_MSG_ADDED.format(fn="compiled_plan: ", path=p, cls=c))
    return binding.plan


plan_of = compiled_plan


def declared_annotation(value: Any, *, owner: str) -> tuple[tuple[str, Annotation], ...]:
    """Parses what ``@remat(value)`` or ``remat=value`` declares: one annotation for the module
    itself, or a ``{relative pattern: annotation}`` mapping (``"."`` is the module itself)."""
    if isinstance(value, Mapping) and value and not set(map(str, value)) & MAPPING_KEYS:
        plan = Plan.from_rules(list(value.items()), sources=[owner] * len(value))
        return tuple((r.pattern, r.annotation) for r in plan.rules)
    plan = Plan.from_rules([(ROOT_PATTERN, value)], sources=[owner])
    return ((ROOT_PATTERN, plan.rules[0].annotation),)
