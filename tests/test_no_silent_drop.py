"""The two places where a plan could have been dropped without a word (issue 11).

On jax 0.11.x with ``jax_remat3`` on, a boundary around ``custom`` modules (and a ``custom`` module's
own boundary) must know whether a ``vmap`` runs inside the differentiation, through any ``jit`` or
``scan``: there JAX drops name policies and defeats ``custom_remat``. The core reads JAX's private
trace stack to know. That reading works on every supported JAX (asserted here, with the boundary
kept through ``jit`` and ``scan``); where it could not be read, the boundary is refused with a
short message, never run as if no ``vmap`` were there.
"""

from __future__ import annotations

import re
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import equinox_remat_plugin as erp
import remat_common as rc
from fixtures import eqx_models as em
from fixtures.tolerance import assert_close
from remat_common.internal import jaxcompat as jc


class Batched(eqx.Module):
    mlp: em.MLP
    nesting: str = eqx.field(static=True)

    def __call__(self, xs):
        f = self.mlp

        def scanned(x):
            return jax.lax.scan(lambda h, _: (f(h), None), x, None, length=1)[0]

        inner = {"plain": f, "jit": jax.jit(lambda x: f(x)), "scan": scanned}[self.nesting]
        return jax.vmap(inner)(xs)


def _loss(m, xs):
    return jnp.sum(m(xs) ** 2)


def test_the_trace_stack_is_read_through_jit_and_scan():
    seen = []

    def f(x):
        seen.append(jc.nearest_ad_trace())
        return jnp.sin(x)

    assert jc.trace_stack_readable()
    jax.grad(lambda x: jax.vmap(jax.jit(f))(x).sum())(jnp.ones(3))
    jax.grad(lambda x: jax.vmap(lambda y: jax.lax.scan(
        lambda h, _: (f(h), None), y, None, length=1)[0])(x).sum())(jnp.ones(3))
    jax.vmap(jax.grad(lambda x: f(x)))(jnp.ones(3))
    assert seen == ["vmap", "vmap", "vjp"]


@pytest.mark.parametrize("nesting", ["plain", "jit", "scan"])
def test_custom_under_vmap_keeps_its_boundary_at_any_depth(nesting, remat3):
    model = Batched(em.MLP(8, 8, rng=np.random.default_rng(0)), nesting)
    a = erp.annotate(model, {"mlp": "custom"})
    xs = jax.random.normal(jax.random.key(8), (3, 2, 8))
    assert_close(erp.unwrap(eqx.filter_grad(_loss)(a, xs)), eqx.filter_grad(_loss)(model, xs))
    # 0.11.x: the module's boundary is in the differentiated program (a remat equation), as with
    # remat3 off. JAX 0.12 (no custom_remat) with remat3 on runs the rule set on the portable
    # custom_vjp path with the boundary left out (remat3 would recompute its residuals).
    text = str(jax.make_jaxpr(eqx.filter_grad(_loss))(a, xs))
    boundaries = len(re.findall(r"\b(?:remat2?|checkpoint|RematTraced)\[", text))
    assert boundaries == (1 if jc.has_custom_remat() or not remat3 else 0), text


def test_an_unreadable_trace_stack_is_refused(remat3_on, monkeypatch):
    """Simulates a JAX whose private trace context is gone (only our probe is replaced)."""
    if not jc.remat3_drops_names_under_vmap():
        pytest.skip("this JAX keeps name policies under vmap: nothing to decide")
    monkeypatch.setattr(jc, "trace_stack_readable", lambda: False)
    a = erp.annotate(Batched(em.MLP(8, 8, rng=np.random.default_rng(0)), "plain"), {"mlp": "custom"})
    with pytest.raises(rc.CapabilityError, match=r"module 'mlp': this 'custom' module must know "
                       r"whether it runs under jax\.vmap(.|\n)*Fix: turn jax_remat3 off") as e:
        eqx.filter_grad(_loss)(a, jnp.ones((3, 2, 8)))
    assert len(str(e.value)) < 600
