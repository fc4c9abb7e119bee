"""The capacity check's work (``scripts/capacity_check``;
https://github.com/jax-remat-plan/jax-remat-plan/blob/main/docs/tpu.md): the largest example GPT
whose training step one device's compiler accepts under a plan, found by the tuner's search
(:func:`~..tune._capacity.largest_fit`), then trained on the shipped text.

The examples' steps are jitted as they train (``examples/NAME/model.py``: ``build``,
``train_step_fn``, ``state_roles``), with the plan's ``state:`` placing the training state; on a
``--target``'s compile-only device when one is given (``mesh``). Each function takes the repository's
``examples`` package as importable (:func:`._guard.checkout`).
"""

from __future__ import annotations

import contextlib
import importlib
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

from ..._plan import Plan
from ..._state import (StatePlacement, default_shardings, jit_state_step, state_bytes,
                       state_shardings)
from ..accelerators._compilers import OUT_OF_MEMORY
from ..accelerators._profiles import host_link
from ..accelerators._units import fmt_bytes
from ..measurement._flops import count_flops
from ..measurement._report import MemoryFigures
from ..measurement._state_transfer import state_transfer
from ..tune._capacity import NoFit, largest_fit
from ._guard import checkout

#: The state placements of kind (c) rows (``--states``).
STATES = {"optimizer": {"optimizer": "host"}, "both": {"optimizer": "host", "params": "host"}}


def example_model(example: str) -> Any:
    """``examples/EXAMPLE/model.py``."""
    return importlib.import_module(f"examples.{example}.model")


@contextlib.contextmanager
def concrete_builds(*examples: str) -> Iterator[None]:
    """Within the block, the examples build a model of any size for real: their guard against
    allocating a large model's state on this host (``MAX_CONCRETE_BYTES``) is lifted, because the
    checks make the state on the device, a part at a time. Put back after: the guard is a module
    global, and a process that goes on (a test session) must keep it (lifted for good, a later
    test that expects the refusal built 8 B parameters and was killed for memory)."""
    modules = [example_model(e) for e in examples]
    old = [m.MAX_CONCRETE_BYTES for m in modules]
    for m in modules:
        m.MAX_CONCRETE_BYTES = 1 << 50
    try:
        yield
    finally:
        for m, v in zip(modules, old):
            m.MAX_CONCRETE_BYTES = v


def example_plan(example: str, name: str | None, state: str | None) -> Any:
    """The plan ``name`` (an example's ``plans/NAME.yaml``, ``LABEL=FILE`` with ``{example}`` in
    FILE replaced, ``none``: no plan) with the training state placed as :data:`STATES` says."""
    if name is None or name == "none":
        rules = Plan()
    elif "=" in name:  # LABEL=FILE
        rules = Plan.load(name.split("=", 1)[1].replace("{example}", example))
    else:
        rules = Plan.load(checkout() / "examples" / example / "plans" / f"{name}.yaml")
    if state is None:
        return None if name in (None, "none") else rules
    return rules.with_defaults(state=STATES[state])


def plan_state(plan: Any) -> str:
    """``device``, ``optimizer`` or ``both``: where ``plan`` keeps the training state."""
    on_host = set(plan.state.on_host) if plan is not None else set()
    return "both" if on_host == {"optimizer", "params"} else "optimizer" if on_host == {
        "optimizer"} else "params" if on_host else "device"


def example_step(example: str, plan: Any, sizes: dict[str, Any], batch: int,
                 mesh: Any = None) -> dict[str, Any]:
    """The step of ``example`` under ``plan`` at ``sizes``, jitted as the examples train it (on
    ``mesh``'s compile-only device when one is given), with its abstract arguments."""
    import jax
    import jax.numpy as jnp

    model = example_model(example)
    tx = model.optimizer(learning_rate=3e-3, warmup_steps=5, decay_steps=100)
    static, state, _ = model.build(plan, tx=tx, abstract=True, **sizes)
    roles = model.state_roles(state)
    placement = plan.state if plan is not None else StatePlacement()
    one = None if mesh is None else jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    shardings = (default_shardings(state) if one is None
                 else jax.tree.map(lambda _: one, state))
    stored, _ = state_shardings(shardings, roles, placement)
    step = jit_state_step(model.train_step_fn(static, tx), shardings, roles, placement,
                                   batch=one, result=one, fetches=True)
    args = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state, stored)
    tokens = jax.ShapeDtypeStruct((batch, sizes["seq_len"] + 1), jnp.int32, sharding=one)
    nbytes = state_bytes(state, roles)
    params = sum(int(x.size) for x, r in zip(jax.tree.leaves(state), roles) if r == "params")
    return dict(model=model, tx=tx, stored=stored, step=step, args=args, tokens=tokens,
                params=params, state_bytes=nbytes)


def fits(example: str, plan: Any, sizes: dict[str, Any], batch: int, budget: int | None,
         link: Any = None, profile: Any = None, mesh: Any = None,
         host_memory: int | None = None) -> tuple[bool, dict[str, Any]]:
    """Whether the step compiles for this device or ``mesh``'s (and, with ``budget``, stays
    within it, and with ``host_memory`` keeps no more in host memory); its figures, the state's
    host traffic per step priced at ``link`` (a profile's host link) and, with ``profile``, the
    step time the time model predicts."""
    sizes = dict(sizes)
    batch = sizes.pop("batch", batch)  # --grow batch
    s = example_step(example, plan, sizes, batch, mesh)
    try:
        t0 = time.perf_counter()
        compiled = s["step"].lower(s["args"], s["tokens"]).compile()
    except Exception as e:  # noqa: BLE001 - the compiler's refusal is the answer
        if OUT_OF_MEMORY.search(str(e)):
            lines = [ln for ln in str(e).splitlines() if OUT_OF_MEMORY.search(ln)]
            return False, {"params": s["params"], "error": lines[0].strip()[:300]}
        raise
    m = compiled.memory_analysis()
    peak = MemoryFigures.from_compiled(compiled).device_total or 0
    placement = plan.state if plan is not None else StatePlacement()
    traffic = state_transfer(s["state_bytes"], placement)
    flops = count_flops(compiled).flops
    # over the host link per step: the host-resident state to the device and back, and what the
    # program keeps in host memory meanwhile (offloaded residuals, the gradients of parameters
    # kept on host) out and back
    moved = traffic.transfer_bytes + 2 * m.host_temp_size_in_bytes
    host_need = m.host_argument_size_in_bytes + m.host_temp_size_in_bytes
    info = {"params": s["params"], "compile_s": time.perf_counter() - t0, "device_bytes": peak,
            "temp_bytes": m.temp_size_in_bytes, "argument_bytes": m.argument_size_in_bytes,
            "alias_bytes": m.alias_size_in_bytes, "host_temp_bytes": m.host_temp_size_in_bytes,
            "host_argument_bytes": m.host_argument_size_in_bytes,
            "state_host_bytes": traffic.host_bytes, "transfer_bytes": traffic.transfer_bytes,
            "transfer_ms": 1e3 * traffic.seconds(link or host_link(None)), "flops": flops,
            "host_moved_bytes": moved, "host_bytes": host_need}
    if profile is not None and flops:
        # the program's host temporaries (offloaded residuals, the gradients of parameters kept
        # on host) go out and back beside the compute; the state's trips add to it
        info["predicted_ms"] = 1e3 * profile.step_seconds(flops, 2 * m.host_temp_size_in_bytes,
                                                          traffic.transfer_bytes)
    info["compiled"] = compiled  # for train(); left out of the JSON
    if host_memory is not None and host_need > host_memory:
        info["error"] = (f"host memory: the step keeps {fmt_bytes(host_need)} in host memory, "
                         f"over --host-memory {fmt_bytes(host_memory)}")
        return False, info
    return budget is None or peak <= budget, info


def largest(example: str, plan: Any, base: dict[str, Any], grow: str, batch: int, start: int,
            most: int, step: int, budget: int | None, log: Callable[[str], None],
            link: Any = None, memory: int | None = None, profile: Any = None, mesh: Any = None,
            host_memory: int | None = None) -> tuple[int | None, dict[str, Any]]:
    """The largest ``grow`` size (a multiple of ``step``, from ``start``, at most ``most``) whose
    step :func:`fits`, found by the tuner's search (:func:`largest_fit`): compiled peaks of two
    sizes give a line aimed at ``budget`` or ``memory`` (the device's bytes), the compiler's
    verdicts bracket the answer. Its figures, with the compiled step (``compiled``, for
    :func:`train`) and the smallest size refused above it (``next``)."""
    tried: dict[int, dict[str, Any]] = {}
    known: dict[int, int | NoFit] = {}
    kept: dict[int, Any] = {}  # the compiled step of the largest size that fits, for train()

    def peak_at(v: int) -> int | NoFit:
        if v in known:
            return known[v]
        good, info = fits(example, plan, {**base, grow: v}, batch, budget, link, profile, mesh,
                          host_memory)
        compiled = info.pop("compiled", None)
        if good and all(v > u for u in kept):
            kept.clear()
            kept[v] = compiled
        tried[v] = info
        log(f"  {grow}={v}: {'fits' if good else 'does not fit'} {info}")
        # over the budget only: a point on the line; refused, or over the host memory: no fit
        known[v] = (int(info["device_bytes"]) if "error" not in info
                    else NoFit(info.get("device_bytes"), info["error"]))
        return known[v]

    cap = budget if budget is not None else 1 << 62
    first = peak_at(start)
    if isinstance(first, NoFit) or first > cap:  # nothing below start is tried
        return None, {}
    lo, hi, _ = largest_fit(peak_at, cap, start, step, most, lambda: False, memory)
    nxt = hi if hi is not None and hi - lo <= step else None
    return lo, {**tried[lo], "compiled": kept.get(lo),
                "next": None if nxt is None else {grow: nxt, **tried[nxt]}}


def _state_init(model: Any, plan: Any, sizes: dict[str, Any], tx: Any, stored: Any,
                chunk: int = 4 << 30) -> Any:
    """The training state, made on the device a group of arrays at a time (``chunk`` bytes at
    most, parameters first) and each group moved where it is kept before the next is made: a
    state larger than the device (the point of keeping it on host) still starts."""
    import jax

    abstract = model.build(plan, tx=tx, abstract=True, **sizes)[1]
    leaves, treedef = jax.tree.flatten(abstract)
    where = jax.tree.leaves(stored, is_leaf=lambda x: isinstance(x, jax.sharding.Sharding))
    roles = model.state_roles(abstract)
    order = sorted(range(len(leaves)), key=lambda i: ("params", "other", "optimizer").index(roles[i]))
    groups: list[list[int]] = []
    size = 0
    for i in order:
        n = leaves[i].size * leaves[i].dtype.itemsize
        if not groups or size + n > chunk or roles[groups[-1][-1]] != roles[i]:
            groups.append([])
            size = 0
        groups[-1].append(i)
        size += n
    out: list[Any] = [None] * len(leaves)
    for group in groups:
        # the whole build traced (without the plan: the same arrays), only this group returned:
        # XLA keeps what it needs (initializers, the moments' zeros)
        make = jax.jit(lambda g=tuple(group): tuple(
            jax.tree.leaves(model.build(None, tx=tx, **sizes)[1])[i] for i in g),
            out_shardings=tuple(where[i] for i in group))
        for i, x in zip(group, make()):
            out[i] = x.block_until_ready()
    return jax.tree.unflatten(treedef, out)


def measure_link(nbytes: int = 1 << 30, repeats: int = 3) -> dict[str, float]:
    """The host link of this machine's first device, measured: seconds to move ``nbytes`` from
    pinned host memory to the device and back (best of ``repeats``), as bytes per second each
    way. What a profile's ``host_link_bytes_per_s`` stands for, where the profile assumed it."""
    import jax
    import jax.numpy as jnp

    dev = jax.devices()[0]
    host = jax.sharding.SingleDeviceSharding(dev, memory_kind="pinned_host")
    x = jax.jit(lambda: jnp.ones((nbytes // 4,), jnp.float32), out_shardings=host)()
    x.block_until_ready()
    # inside compiled programs, as a training step moves its state: host -> device (summed, so
    # nothing comes back), and host -> device -> host into the donated host buffer
    there = jax.jit(lambda a: jax.device_put(a, jax.memory.Space.Device).sum(),
                    in_shardings=host)
    both = jax.jit(lambda a: jax.device_put(jax.device_put(a, jax.memory.Space.Device) + 1.0,
                                            jax.memory.Space.Host),
                   in_shardings=host, out_shardings=host, donate_argnums=0)
    there(x).block_until_ready()
    x = both(x)
    x.block_until_ready()
    best = {"to_device": float("inf"), "round_trip": float("inf")}
    for _ in range(repeats):
        t0 = time.perf_counter()
        there(x).block_until_ready()
        t1 = time.perf_counter()
        x = both(x)
        x.block_until_ready()
        t2 = time.perf_counter()
        best["to_device"] = min(best["to_device"], t1 - t0)
        best["round_trip"] = min(best["round_trip"], t2 - t1)
    best = {"to_device": best["to_device"],
            "to_host": max(best["round_trip"] - best["to_device"], 1e-9)}
    return {k: nbytes / v for k, v in best.items()}


def train_example(example: str, plan: Any, sizes: dict[str, Any], batch: int, steps: int,
                  compiled: Any = None) -> dict[str, Any]:
    """``steps`` steps on the shipped text; the state made on the device, a part at a time, and
    kept where the plan says; ``compiled``: the step already compiled (by :func:`fits`)."""
    import numpy as np

    training = importlib.import_module("examples.training")
    sizes = dict(sizes)
    batch = sizes.pop("batch", batch)  # --grow batch
    s = example_step(example, plan, sizes, batch)
    model, tx = s["model"], s["tx"]
    t0 = time.perf_counter()
    state = _state_init(model, plan, sizes, tx, s["stored"])
    init_s = time.perf_counter() - t0
    print(f"    state made in {init_s:.1f} s", flush=True)
    if compiled is None:
        compiled = s["step"].lower(state, s["tokens"]).compile()
    data = training.TextBatches(training.split_text(training.encode(training.load_text()))[0],
                                batch=batch, seq_len=sizes["seq_len"], seed=0)
    losses, times = [], []
    for i in range(steps):
        tokens = np.asarray(data(i))
        t0 = time.perf_counter()
        state, loss = compiled(state, tokens)
        losses.append(float(loss))  # waits for the step
        times.append(time.perf_counter() - t0)
        print(f"    step {i}: {1e3 * times[-1]:.1f} ms, loss {losses[-1]:.4f}", flush=True)
    tail = times[1:] or times
    return {"losses": losses, "step_ms": 1e3 * statistics.median(tail), "init_s": init_s,
            "falling": losses[-1] < losses[0], "params": s["params"]}
