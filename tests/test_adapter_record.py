"""The adapter record (issue 49): a framework described once, ``register_framework(Framework(...))``.

A third framework of plain Python classes, registered here, gets the core's class swap (one class
per class, path and plan; ``isinstance`` kept; pickling refused with its own message) and the
core's lookup of the module running now (a tag in a module that keeps its class reads with its
path), with the residuals the plan asks for. The five ``register_*`` calls of the interface before
the record still work for one release, each with a ``DeprecationWarning`` naming the fix.
"""

from __future__ import annotations

import pickle
from typing import Any

import jax
import jax.numpy as jnp
import pytest

import remat_common as rc

NAME = "tests.plain-python"


class Mod:
    """A module of the framework: its children are its attributes."""


class Scale(Mod):
    def __init__(self, w: float) -> None:
        self.w = w

    def __call__(self, x: jax.Array) -> jax.Array:
        return jnp.sin(rc.checkpoint_name(x * self.w, "h"))


class Net(Mod):
    def __init__(self) -> None:
        self.a, self.b = Scale(2.0), Scale(3.0)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.b(self.a(x))


def _paths(module: Any, path: str) -> dict[int, str]:
    out = {id(module): path}
    for key, child in vars(module).items():
        if isinstance(child, Mod):
            out.update(_paths(child, rc.adapter.join(path, key)))
    return out


def _call(self: Mod, *args: Any, **kwargs: Any) -> Any:
    bound = rc.adapter.binding_of(self)
    assert bound is not None
    path, plan = bound
    method = rc.adapter.original_class(type(self)).__call__  # type: ignore[operator]

    def call(*a: Any, **k: Any) -> Any:
        return method(self, *a, **k)

    return rc.adapter.call_module(plan, path, call, *args, **kwargs)


rc.adapter.register_framework(rc.adapter.Framework(
    NAME, is_module=lambda x: isinstance(x, Mod), paths=_paths, call=_call,
    pickle_message="tests: {cls} at {path!r} runs a plan; pickle its weights instead."))


def _annotated(plan: Any, *, copy: bool) -> tuple[Net, Net]:
    plain = Net()
    compiled = rc.compile_plan(rc.resolve(rc.Plan.coerce(plan), ("", "a", "b")))
    cls = rc.adapter.annotated_class(NAME, Net, "", compiled)
    assert rc.adapter.annotated_class(NAME, Net, "", compiled) is cls  # made once
    return plain, rc.adapter.with_class(plain, cls, copy=copy)


@pytest.mark.parametrize("copy", [False, True], ids=["in-place", "copy"])
def test_a_third_framework_gets_the_class_swap_and_the_module_lookup(copy: bool) -> None:
    plain, net = _annotated({".": {"save": ["a/h"]}}, copy=copy)
    assert (net is plain) is not copy and isinstance(net, Net) and type(net).__name__ == "Net"
    assert type(net.a) is Scale and rc.adapter.original_class(type(net)) is Net
    x = jnp.linspace(0.1, 1.0, 4)
    want = jax.grad(lambda x: jnp.sum(Net()(x)))(x)
    assert jnp.allclose(jax.grad(lambda x: jnp.sum(net(x)))(x), want)
    report = rc.saved_residuals(lambda x: jnp.sum(net(x)), x)
    # a and b keep their class: their tags are placed by the core's lookup, by identity
    assert {t.name for t in report.tags} == {"a/h", "b/h"}
    assert report.names("device") == {"a/h"}
    with pytest.raises(pickle.PicklingError, match=r"tests: Net at '<root>' runs a plan"):
        pickle.dumps(net)


def test_register_framework_takes_a_record() -> None:
    with pytest.raises(TypeError, match=r"register_framework: framework must be a Framework"):
        rc.adapter.register_framework({"name": "x"})  # type: ignore[arg-type]
    with pytest.raises(KeyError, match=r"no framework 'nobody' with a call is registered"):
        rc.adapter.annotated_class("nobody", Net, "", None)


def test_the_old_register_calls_warn_and_still_register() -> None:
    seen: list[Any] = []

    def check(plan: Any, arguments: Any) -> list[str]:
        seen.append(plan)
        return []

    def binder(arguments: Any) -> Any:
        seen.append("bound")
        return arguments

    def finder() -> tuple[str, bool] | None:
        return None

    calls = [
        (rc.adapter.register_model_check, check, "check_models"),
        (rc.adapter.register_model_binder, binder, "bind_models"),
        (rc.adapter.register_path_finder, finder, "find"),
        (rc.adapter.register_module_locator,
         rc.adapter.ModuleLocator(lambda x: False, lambda x: False, lambda m, p: {}), "is_module"),
        (rc.adapter.register_stateful, rc.adapter.StatefulKind(
            "tests.nothing", lambda x: False, lambda o: (None, ()), lambda s, t: (), lambda o: ()),
         "stateful"),
    ]
    for register, hook, field in calls:
        with pytest.warns(DeprecationWarning, match=rf"(?s)adapter\.{register.__name__} is deprecated.*"
                                                    rf"register_framework\(Framework\(name, {field}="):
            register(hook)
    f = rc.checkpoint(lambda x: jnp.sum(jnp.sin(x)), "recompute")
    plan = rc.compile_plan(rc.resolve(rc.Plan.coerce({".": "recompute"}), ("",)))
    rc.verify(f, jnp.ones(3), plan=plan, strict=False)
    assert seen[:2] == ["bound", plan]  # saved_residuals binds, then verify checks
