"""Parameters kept on host stream through a scanned stack a layer at a time (``fetch(params,
stream="blocks")`` in the examples' steps; ``remat_common.adapter.scan_groups`` brings each layer
to the device, the next one's while this one computes, in the forward and the backward pass, and
writes each layer's gradient back into a gradient of the stack in host memory).

On CPU the compiler drops the placement (``../shared/JAX_FACTS.md``), so the values and the
program's types are the proof there: the streamed step equals the on-device step, the stack's
gradient is typed host, and no whole stack is moved to the device, only layers. Compiled for a
TPU v5e chip without one, the optimized program reads each layer out of host memory inside the
scan's loops (``dynamic-slice-start`` of an ``S(5)`` operand) and writes each layer's gradient into
host memory (``dynamic-update-slice-start`` into ``S(5)``), and its device peak falls by about the
stack's parameter bytes.
"""

from __future__ import annotations

import functools
import math
import os
import re
import sys
import warnings
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import remat_common as rc
from remat_common.internal import target_mesh
from remat_common.measurement import compiler_available, parse_accelerator

pytest.importorskip("flax")
pytest.importorskip("equinox")
pytest.importorskip("optax")

import equinox as eqx  # noqa: E402
from flax import nnx  # noqa: E402

import equinox_remat_plugin as erp  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # the examples are not an installed package
    sys.path.insert(0, str(REPO))

from examples.eqx_gpt import model as eqx_model  # noqa: E402
from examples.nnx_gpt import model as nnx_model  # noqa: E402
from fixtures.tolerance import assert_close  # noqa: E402

EXAMPLES: dict[str, Any] = {"nnx_gpt": nnx_model, "eqx_gpt": eqx_model}
SIZES: dict[str, Any] = dict(d_model=32, n_layers=4, n_heads=2, seq_len=16, layout="scan")
#: One scan, layer groups, nested blocks: every way scan_groups runs a stack.
PLANS: dict[str, Any] = {"one group": {"blocks.*": "recompute"},
         "layer groups": {"blocks.[0-1]": "recompute", "blocks.[2-3]": "save"},
         "nested": {"blocks": {"remat": "recompute", "nested": 2}}}
BOTH = rc.StatePlacement(optimizer="host", params="host")
pytestmark = pytest.mark.usefixtures("standard_promotion")


def _tokens(batch: int = 2, seq_len: int = 16) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, (batch, seq_len + 1), dtype=np.int32)


def _loss_of_params(name: str, static: Any, state: Any, stream: tuple[str, ...]) -> tuple[Any, Any]:
    """``(loss(params, tokens), params)``: the example's loss of its parameters, the parameters
    fetched as its training step fetches them."""
    model = EXAMPLES[name]
    if name == "nnx_gpt":
        gpt, _ = nnx.merge(static, state)
        graph, params, rest = nnx.split(gpt, nnx.Param, ...)  # type: ignore[misc]

        def nnx_loss(p: Any, tokens: Any) -> Any:
            return model.loss_fn(nnx.merge(graph, rc.state.fetch(p, stream=stream), rest), tokens)
        return nnx_loss, params

    def eqx_loss(p: Any, tokens: Any) -> Any:
        return model.loss_fn(eqx.combine(rc.state.fetch(p, stream=stream), static), tokens)
    return eqx_loss, state[0]


def _host(aval: Any) -> bool:
    return bool(aval.memory_space == jax.memory.Space.Host)


def _device_puts(jaxpr: Any) -> list[tuple[tuple[int, ...], bool]]:
    """``(shape, from host)`` of every ``device_put`` to device memory in ``jaxpr`` and the
    jaxprs inside it."""
    out = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "device_put" and eqn.params["devices"] == (
                jax.memory.Space.Device,):
            out += [(tuple(v.aval.shape), _host(v.aval)) for v in eqn.invars]
        for v in eqn.params.values():
            for sub in v if isinstance(v, tuple | list) else (v,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    out += _device_puts(inner)
    return out


@pytest.mark.parametrize("plan", sorted(PLANS))
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_the_gradient_streams_layer_by_layer(name: str, plan: str) -> None:
    """The loss and gradients of parameters in host memory equal those on device; the stack's
    gradients are in host memory; what is moved to the device from host is layers of the stack
    (and the arrays outside it), never a whole stack."""
    static, state, _ = EXAMPLES[name].build(rc.Plan.from_mapping(PLANS[plan]),
                                            tx=EXAMPLES[name].optimizer(), **SIZES)
    loss, params = _loss_of_params(name, static, state, ("blocks",))
    tokens = _tokens()
    want = jax.jit(jax.value_and_grad(loss))(params, tokens)
    dev = rc.state.default_shardings(params)
    host = jax.tree.map(lambda s: s.with_memory_kind("pinned_host"), dev)
    on_host = jax.device_put(params, host)
    got = jax.jit(jax.value_and_grad(loss))(on_host, tokens)
    assert_close(got, want)

    closed = jax.make_jaxpr(jax.value_and_grad(loss))(on_host, tokens)
    stacks = {tuple(x.shape) for x in jax.tree.leaves(params) if x.shape[:1] == (4,)}
    grads = jax.tree_util.tree_flatten_with_path(closed.out_avals[1:])[0]
    assert grads and all(_host(a) for _, a in grads)  # every gradient back on host
    moved = _device_puts(closed.jaxpr)
    assert not [s for s, h in moved if h and s in stacks]  # no stack brought whole
    layers = {s for s, h in moved if h and (4, *s) in stacks}
    assert layers == {s[1:] for s in stacks}  # each stacked array a layer at a time


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_the_streamed_step_equals_the_on_device_step(name: str) -> None:
    """Three training steps with parameters and optimizer state on host, streamed, equal the
    steps with everything on device (AdamW's moments carry the gradients)."""
    model = EXAMPLES[name]
    tx = model.optimizer()
    static, state, _ = model.build(rc.Plan.from_mapping(PLANS["layer groups"]), tx=tx, **SIZES)
    step = model.train_step_fn(static, tx, stream=True)
    roles = model.state_roles(state)
    shardings = rc.state.default_shardings(state)
    on_host = rc.state.jit_state_step(step, shardings, roles, BOTH, fetches=True)
    s_dev = jax.tree.map(jnp.copy, state)
    s_host = rc.state.place_state(state, shardings, roles, BOTH)
    for i in range(3):
        s_dev, want = jax.jit(step)(s_dev, _tokens())
        s_host, got = on_host(s_host, _tokens())
        assert_close(got, want, err_msg=f"loss of step {i}")
    assert_close(jax.device_get(s_host), jax.device_get(s_dev))


def test_a_stack_that_cannot_stream_is_fetched_whole_with_a_warning() -> None:
    """A stack no plan declares cannot stream (nothing says its layers are scanned per plan):
    it is brought to the device whole, with a StreamWarning naming why and the fix, and the
    values are the on-device ones."""
    layers = eqx.filter_vmap(lambda k: eqx.nn.Linear(8, 8, key=k))(
        jax.random.split(jax.random.key(0), 3))
    params, static = eqx.partition(layers, eqx.is_array)

    def loss(p: Any) -> Any:
        return erp.scan_layers(eqx.combine(p, static), jnp.ones(8)).sum()

    host = jax.tree.map(lambda s: s.with_memory_kind("pinned_host"),
                        rc.state.default_shardings(params))
    with pytest.warns(rc.adapter.StreamWarning, match=r"(?s)not a stack of the plan.*Fix:"):
        got = jax.jit(jax.grad(loss))(jax.device_put(params, host))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        want = jax.jit(jax.grad(loss))(params)
    assert_close(got, want)


# -- compiled for a TPU v5e chip, no device -------------------------------------------------------

_tpu_missing = compiler_available("tpu")
needs_tpu = pytest.mark.skipif(
    _tpu_missing is not None and not os.environ.get("REMAT_REQUIRE_TARGETS"),
    reason=f"{_tpu_missing} (./scripts/test's target stage)")
#: d_model=1024, four scanned layers, 32 tokens, batch 1: 268 MB of stacked parameters.
V5E_SIZES: dict[str, Any] = dict(d_model=1024, n_layers=4, n_heads=8, seq_len=32, layout="scan")


@functools.cache
def v5e_step(name: str, stream: bool, batch: int = 1, **sizes: Any) -> tuple[Any, str, int]:
    """The example's step under ``recompute``, parameters and optimizer state on host, compiled
    for ``v5e:1x1`` from shapes (at :data:`V5E_SIZES`, updated by ``sizes``): its memory
    analysis, its optimized HLO and the stack's parameter bytes. docs/tpu.md's figures::

        v5e_step("nnx_gpt", True, batch=8, seq_len=1024, n_layers=8, vocab=256)
    """
    model = EXAMPLES[name]
    tx = model.optimizer()
    static, state, _ = model.build(rc.Plan.from_mapping(PLANS["one group"]), tx=tx,
                                   abstract=True, **{**V5E_SIZES, **sizes})
    roles = model.state_roles(state)
    mesh = target_mesh(parse_accelerator("v5e:1x1"), {"data": 1})
    rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    shardings = jax.tree.map(lambda _: rep, state)
    stored, _ = rc.state.state_shardings(shardings, roles, BOTH)
    args = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        state, stored)
    seq = sizes.get("seq_len", V5E_SIZES["seq_len"])
    tokens = jax.ShapeDtypeStruct((batch, seq + 1), jnp.int32, sharding=rep)
    step = rc.state.jit_state_step(model.train_step_fn(static, tx, stream=stream), shardings,
                                   roles, BOTH, batch=rep, result=rep, fetches=True)
    compiled = step.lower(args, tokens).compile()
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(state)[0]]
    stack = sum(x.size * x.dtype.itemsize for r, x, p in zip(roles, jax.tree.leaves(state), paths)
                if r == "params" and "blocks" in p)
    return compiled.memory_analysis(), compiled.as_text(), stack


_LAYER_READ = re.compile(  # ((stack{..S(5)}, indices...), layer[1, ...], context)
    r"= \(\(\w+\[[\d,]+\]\{[^}]*S\(5\)\}[^\n]*?\}\), \w+\[1,[^\n]* dynamic-slice-start\(")
_LAYER_WRITE = re.compile(  # ((stack{..S(5)}, layer[1, ...], indices...), stack, context)
    r"= \(\(\w+\[[\d,]+\]\{[^}]*S\(5\)\}, \w+\[1,[^\n]* dynamic-update-slice-start\(")


def _loop_transfers(hlo: str) -> tuple[int, int]:
    """Inside while bodies: reads of one layer out of a stack in host memory (``S(5)``), and
    writes of one layer into one."""
    bodies = set(re.findall(r"body=%([\w.\-]+)", hlo))
    reads = writes = 0
    for block in re.split(r"\n(?=\S)", hlo):
        head = re.match(r"%([\w.\-]+) ", block)
        if head is not None and head.group(1) in bodies:
            reads += len(_LAYER_READ.findall(block))
            writes += len(_LAYER_WRITE.findall(block))
    return reads, writes


_DTYPE_BYTES = {"f32": 4, "bf16": 2, "s32": 4, "u32": 4, "f16": 2, "pred": 1, "s8": 1, "u8": 1}


def link_bytes(hlo: str) -> tuple[int, int]:
    """``(down, up)``: the bytes an optimized TPU program moves from host memory (``S(5)``) to
    the device and back per run: each asynchronous copy, slice or update between them, times the
    trip count of the loops around it (read from each loop's condition)."""
    def size(shape: str) -> int:
        dtype, dims = re.match(r"(\w+)\[([\d,]*)\]", shape).groups()  # type: ignore[union-attr]
        return math.prod(int(d) for d in dims.split(",") if d) * _DTYPE_BYTES.get(dtype, 4)

    comps: dict[str, list[str]] = {}
    for block in re.split(r"\n(?=\S)", hlo):
        head = re.match(r"(?:ENTRY )?%(\S+) ", block)
        if head is not None:
            comps[head.group(1)] = block.splitlines()
    calls: dict[str, list[tuple[str, int]]] = {}
    for name, lines in comps.items():
        for line in lines:
            loop = re.search(r" while\(.*condition=%([\w.\-]+), body=%([\w.\-]+)", line)
            if loop is not None:
                trips = [int(c) for ln in comps.get(loop.group(1), [])
                         for c in re.findall(r"s32\[\]\{[^}]*\} constant\((\d+)\)", ln)]
                calls.setdefault(name, []).append((loop.group(2), max(trips, default=1)))
            else:
                calls.setdefault(name, []).extend(
                    (c, 1) for c in re.findall(r"(?:calls|to_apply)=%([\w.\-]+)", line))
    times: dict[str, int] = {}

    def walk(name: str, k: int) -> None:
        times[name] = times.get(name, 0) + k
        for callee, n in calls.get(name, []):
            walk(callee, k * n)
    walk(re.search(r"^ENTRY %(\S+)", hlo, re.M).group(1), 1)  # type: ignore[union-attr]
    down = up = 0
    for name, lines in comps.items():
        for line in lines:
            op = re.match(r"\s*(?:ROOT )?%\S+ = (.*?) ([\w\-]+)\(", line)
            if op is None:
                continue
            shapes = re.findall(r"(\w+\[[\d,]*\])(\{[^}]*\})", op.group(1))
            k, kind = times.get(name, 0), op.group(2)
            if kind == "dynamic-slice-start" and "S(5)" in shapes[0][1]:
                down += k * size(shapes[-2][0])
            elif kind == "dynamic-update-slice-start" and "S(5)" in shapes[0][1]:
                up += k * size(shapes[1][0])
            elif kind == "copy-start" and ("S(5)" in shapes[0][1]) != ("S(5)" in shapes[1][1]):
                if "S(5)" in shapes[1][1]:
                    down += k * size(shapes[0][0])
                else:
                    up += k * size(shapes[0][0])
    return down, up


def _peak(m: Any) -> int:
    return (m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
            - m.alias_size_in_bytes)


@needs_tpu
@pytest.mark.target
@pytest.mark.parametrize("name", ["eqx_gpt"])  # the NNX GPT's state on host: tests/test_host_state.py
def test_v5e_program_streams_each_layer_inside_the_loops(name: str) -> None:
    """The streamed step's backward loop writes each layer's gradient into host memory, which
    the step that fetches the parameters whole never does, and its device peak falls.

    Reading each layer out of host memory inside the loops (``dynamic-slice-start`` of an
    ``S(5)`` stack) is XLA's choice: at :data:`V5E_SIZES` it copies the stacks whole before the
    loops (they fit), and the peak falls by what the gradient no longer holds (measured, jax
    0.11.2 / libtpu 0.0.48.1, stack 268.5 MB: nnx 1,117.9 -> 753.5 MB, eqx 947.9 -> 824.1 MB;
    bound: 40 % of the stack). At 8 layers of 1024 tokens it reads the MLP's weights a layer at
    a time and the device's temporaries fall by 1.9x (nnx) and 2.3x (eqx) the stack
    (docs/tpu.md)."""
    whole, whole_hlo, stack = v5e_step(name, False)
    streamed, hlo, _ = v5e_step(name, True)
    assert _loop_transfers(hlo)[1] >= 3, _loop_transfers(hlo)  # a gradient per stacked weight
    assert _loop_transfers(whole_hlo) == (0, 0)
    assert _peak(whole) - _peak(streamed) >= 0.4 * stack, (_peak(whole), _peak(streamed), stack)
    down, up = link_bytes(hlo)
    assert up >= stack  # every layer's gradient (and the updated state) goes up
