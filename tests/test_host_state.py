"""Training state kept on host between steps (a plan's ``state:``), honoured by the adapters' roles
and the examples' steps: the step that takes the state in ``pinned_host`` memory computes exactly
what the all-on-device step computes, under ``jit``, on one device and on an 8-device mesh; the
state comes back in host memory, checkpoints round-trip it there, and compiled for a TPU v5e chip
with no device the host parts are host argument bytes, not device argument bytes; exported for
CUDA they are ``pinned_host`` arguments and results.

On CPU the placement runs (CPU devices list ``pinned_host``) but the compiler drops it
(``../shared/JAX_FACTS.md``): the values are the proof there, the TPU compile the proof of where
the bytes live. AdamW's first moment after a step is a multiple of the (clipped) gradients, so
equal optimizer states mean equal gradients.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import remat_common as rc
from remat_common.measurement import compiler_available, parse_accelerator
from remat_common.internal import target_mesh

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # the examples are not an installed package
    sys.path.insert(0, str(REPO))

from examples.checkpoints import Checkpoints  # noqa: E402
from examples.eqx_gpt import model as eqx_model  # noqa: E402
from examples.eqx_gpt import train as eqx_train  # noqa: E402
from examples.nnx_gpt import model as nnx_model  # noqa: E402
from examples.nnx_gpt import train as nnx_train  # noqa: E402
from devices import run_on_cpu_devices  # noqa: E402
from fixtures.matrix import alternate  # noqa: E402
from fixtures.tolerance import assert_close  # noqa: E402

EXAMPLES = {"nnx_gpt": (nnx_model, nnx_train), "eqx_gpt": (eqx_model, eqx_train)}
SIZES = dict(d_model=32, n_layers=2, n_heads=2, seq_len=16)
RULES = {"blocks.*": "recompute"}
PLACEMENTS = {"optimizer": {"optimizer": "host"}, "params": {"params": "host"},
              "both": {"optimizer": "host", "params": "host"}}
pytestmark = pytest.mark.usefixtures("standard_promotion")


def _tokens(batch: int = 2, seq_len: int = 16, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (batch, seq_len + 1), dtype=np.int32)


# Of the jax 0.11.0 and 0.12 stages, each runs the tests on this fixture for one example, the
# other example's (fixtures/matrix.py): remat_common.state has no JAX-version branch, and each
# example's adapter and remat paths are checked on every version elsewhere (tests/test_examples.py);
# test_a_scanned_stack_with_its_state_on_host runs both examples on each. Stage 1 runs both.
@pytest.fixture(scope="module", params=alternate(sorted(EXAMPLES)))
def example(request: pytest.FixtureRequest, standard_promotion: None) -> dict[str, Any]:
    """The example's model under a recompute plan, its step, and three steps on device."""
    model = EXAMPLES[request.param][0]
    tx = model.optimizer()
    static, state, _ = model.build(rc.Plan.from_mapping(RULES), tx=tx, **SIZES)
    step = model.train_step_fn(static, tx)
    on_device = jax.jit(step, donate_argnums=0)
    s = jax.tree.map(jnp.copy, state)
    losses = []
    for i in range(3):
        s, loss = on_device(s, _tokens(seed=i))
        losses.append(float(loss))
    return dict(name=request.param, model=model, state=state, step=step,
                roles=model.state_roles(state), want=(s, losses))


def test_roles_name_parameters_and_optimizer_state(example: dict[str, Any]) -> None:
    roles, state = example["roles"], example["state"]
    n_params = len(jax.tree.leaves(state[0]))
    assert roles[:n_params] == ("params",) * n_params  # the model part first, in both examples
    assert set(roles[n_params:]) == {"optimizer"}
    sizes = rc.state.state_bytes(state, roles)
    assert sizes["optimizer"] == pytest.approx(2 * sizes["params"], abs=64)  # AdamW: mu, nu (+counts)


@pytest.mark.parametrize("where", sorted(PLACEMENTS))
def test_host_state_step_equals_the_on_device_step(example: dict[str, Any], where: str) -> None:
    placement = rc.StatePlacement.coerce(PLACEMENTS[where])
    roles = example["roles"]
    shardings = rc.state.default_shardings(example["state"])
    step = rc.state.jit_state_step(example["step"], shardings, roles, placement, fetches=True)
    s = rc.state.place_state(jax.tree.map(jnp.copy, example["state"]), shardings, roles, placement)
    kinds = [x.sharding.memory_kind for x in jax.tree.leaves(s)]
    assert kinds == [placement.memory_kind(r) for r in roles]
    losses = []
    for i in range(3):
        s, loss = step(s, _tokens(seed=i))
        losses.append(float(loss))
    want, want_losses = example["want"]
    assert losses == want_losses  # the same program on CPU: equal to the bit
    assert_close(jax.tree.leaves(s), jax.tree.leaves(want), err_msg=where)
    # between steps the state is where the plan says: host parts in pinned_host, donated in place
    assert [x.sharding.memory_kind for x in jax.tree.leaves(s)] == kinds
    assert "pinned_host" in kinds


#: One scan, or layer groups under one ``custom_vjp`` (which JAX 0.12 differentiates by a path of
#: its own: common/_jaxcompat.py).
SCAN_RULES = {"one-scan": RULES, "layer-groups": {"blocks.[0-1]": "recompute", "blocks.2": "save"}}


# Of the jax 0.11.0 and 0.12 stages, each runs both examples and both layouts of the stack, one
# example per layout (fixtures/matrix.py); stage 1 runs all four.
@pytest.mark.parametrize("name,rules", alternate(
    [(n, SCAN_RULES[r]) for n, r in [("eqx_gpt", "one-scan"), ("nnx_gpt", "one-scan"),
                                     ("nnx_gpt", "layer-groups"), ("eqx_gpt", "layer-groups")]],
    ids=["eqx_gpt-one-scan", "nnx_gpt-one-scan", "nnx_gpt-layer-groups", "eqx_gpt-layer-groups"]))
def test_a_scanned_stack_with_its_state_on_host(name: str, rules: Any) -> None:
    """``layout="scan"`` with the parameters and optimizer state on host: one scan, or layer
    groups under one ``custom_vjp``; losses and state equal the on-device step's, and the state is
    back in host memory after each step."""
    model = EXAMPLES[name][0]
    tx = model.optimizer()
    sizes = {**SIZES, "n_layers": 3, "layout": "scan"}
    static, state, _ = model.build(rc.Plan.from_mapping(rules), tx=tx, **sizes)
    step_fn = model.train_step_fn(static, tx)
    roles = model.state_roles(state)
    on_device = jax.jit(step_fn, donate_argnums=0)
    placement = rc.StatePlacement.coerce(PLACEMENTS["both"])
    shardings = rc.state.default_shardings(state)
    step = rc.state.jit_state_step(step_fn, shardings, roles, placement, fetches=True)
    s = rc.state.place_state(jax.tree.map(jnp.copy, state), shardings, roles, placement)
    want = jax.tree.map(jnp.copy, state)
    for i in range(2):
        want, want_loss = on_device(want, _tokens(seed=i))
        s, loss = step(s, _tokens(seed=i))
        assert float(loss) == float(want_loss)
    assert_close(jax.tree.leaves(s), jax.tree.leaves(want))
    assert {x.sharding.memory_kind for x in jax.tree.leaves(s)} == {"pinned_host"}


def test_checkpoints_round_trip_host_state(example: dict[str, Any], tmp_path: Path) -> None:
    placement = rc.StatePlacement(optimizer="host", params="host")
    roles, model = example["roles"], example["model"]
    shardings = rc.state.default_shardings(example["state"])
    s = rc.state.place_state(example["state"], shardings, roles, placement)
    ckpt = Checkpoints(tmp_path / "ckpt", every=1)
    ckpt.save(1, model.checkpoint_view(s), manifest={"plan": None})
    ckpt.committed(wait=True)
    restored, _ = ckpt.restore(model.checkpoint_view(s))
    ckpt.close()
    back = model.from_checkpoint_view(s, restored)
    assert {x.sharding.memory_kind for x in jax.tree.leaves(back)} == {"pinned_host"}
    assert_close(jax.tree.leaves(back), jax.tree.leaves(s))


@pytest.mark.tooling  # the training script and orbax: runs in the jax 0.11.2 stage only
def test_training_run_with_state_on_host(example: dict[str, Any], tmp_path: Path) -> None:
    """The example's training run under a plan whose state lives on host: the losses of the run
    on device, a checkpoint resumed into host memory continues them."""
    train = EXAMPLES[example["name"]][1]
    tiny = dict(SIZES, batch=2, warmup_steps=2, decay_steps=20, checkpoint_every=2,
                eval_batches=1, sample_chars=0, log_every=100, quiet=True, report=False)
    host = rc.Plan.from_mapping(RULES, state={"optimizer": "host", "params": "host"})
    device = rc.Plan.from_mapping(RULES)
    want = train.main(**tiny, steps=4, plan=device, workdir=str(tmp_path / "device"))
    first = train.main(**tiny, steps=2, plan=host, workdir=str(tmp_path / "host"))
    resumed = train.main(**tiny, steps=4, plan=host, workdir=str(tmp_path / "host"))
    assert first.losses == {k: v for k, v in want.losses.items() if k <= 2}
    assert resumed.start_step == 2 and resumed.losses == {k: v for k, v in want.losses.items() if k > 2}
    assert resumed.eval_loss == want.eval_loss


_MESH_SCRIPT = """
import sys
sys.path.insert(0, {repo!r})
import jax, jax.numpy as jnp, numpy as np
import remat_common as rc
from examples import scale
from examples.nnx_gpt import model as nnx_model
from examples.eqx_gpt import model as eqx_model
jax.config.update("jax_numpy_dtype_promotion", "standard")
mesh = scale.make_mesh("data=2,fsdp=2,tensor=2")
rules = scale.logical_rules(mesh)
placement = rc.StatePlacement(optimizer="host", params="host")
for model in (nnx_model, eqx_model):
    tx = model.optimizer()
    static, state, _ = model.build(rc.Plan.from_mapping({{"blocks.*": "recompute"}}), tx=tx,
                                   d_model=32, n_layers=2, n_heads=2, seq_len=16)
    shardings = model.shardings(static, state, mesh, rules)
    device = scale.Layout(mesh, shardings)
    host = scale.host_layout(device, state, placement, model.state_roles(state))
    out = {{}}
    for name, layout in (("device", device), ("host", host)):
        s = layout.put(jax.tree.map(jnp.copy, state))
        step = layout.jit_step(model.train_step_fn(static, tx))
        losses = []
        for i in range(3):
            tokens = np.random.default_rng(i).integers(0, 256, (8, 17), dtype=np.int32)
            s, loss = step(s, layout.batch(tokens))
            losses.append(float(loss))
        out[name] = (s, losses)
    (sd, ld), (sh, lh) = out["device"], out["host"]
    np.testing.assert_allclose(lh, ld, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(sh), jax.tree.leaves(sd)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)
        assert a.sharding.memory_kind == "pinned_host" and b.sharding.memory_kind == "device"
        assert a.sharding.spec == b.sharding.spec and a.sharding.mesh == b.sharding.mesh
    split = sum(1 for a in jax.tree.leaves(sh) if any(p is not None for p in a.sharding.spec))
    evalf = host.jit_eval(model.eval_loss_fn(static))
    e = float(evalf(sh, host.batch(np.random.default_rng(9).integers(0, 256, (8, 17), dtype=np.int32))))
    print(model.__name__, "OK", lh, "split", split, "eval", e)
"""


@pytest.mark.slow
def test_eight_device_mesh(tmp_path: Path) -> None:
    """Sharded over data=2, fsdp=2, tensor=2: the host-resident state keeps the device layout
    (the same ``PartitionSpec`` per array, in ``pinned_host``), and the steps' losses and state
    equal the on-device step's."""
    proc = run_on_cpu_devices(_MESH_SCRIPT.format(repo=str(REPO)), tmp_path, 8)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if " OK " in ln]
    assert len(lines) == 2, proc.stdout
    assert all(int(ln.split(" split ")[1].split()[0]) > 0 for ln in lines)  # some arrays are split


# -- compiled for a TPU v5e chip, no device: where the bytes live ---------------------------------

_tpu_missing = compiler_available("tpu")
needs_tpu = pytest.mark.skipif(
    _tpu_missing is not None and not os.environ.get("REMAT_REQUIRE_TARGETS"),
    reason=f"{_tpu_missing} (./scripts/test's target stage)")


def compile_on_target(model: Any, placement: rc.StatePlacement, acc: str = "v5e:1x1",
                      batch: int = 8, **sizes: Any) -> tuple[Any, dict[str, int]]:
    """The example's step compiled for ``acc`` from shapes, the state where ``placement`` says;
    its memory analysis and the state's bytes per role."""
    tx = model.optimizer()
    static, state, _ = model.build(None, tx=tx, abstract=True, **sizes)
    roles = model.state_roles(state)
    mesh = target_mesh(parse_accelerator(acc), {"data": 1})
    rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    shardings = jax.tree.map(lambda _: rep, state)
    stored, _ = rc.state.state_shardings(shardings, roles, placement)
    args = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state, stored)
    tokens = jax.ShapeDtypeStruct((batch, sizes["seq_len"] + 1), jnp.int32, sharding=rep)
    step = rc.state.jit_state_step(model.train_step_fn(static, tx), shardings, roles, placement,
                                   batch=rep, result=rep, fetches=True)
    return step.lower(args, tokens).compile().memory_analysis(), rc.state.state_bytes(state, roles)


#: The size both v5e tests compile at, where the update sets the peak (d_model=1024, two layers,
#: 32 tokens, batch 1: 273 MB of optimizer state, 137 MB of parameters, little activation).
V5E_SIZES = dict(d_model=1024, n_layers=2, n_heads=8, seq_len=32)
#: The three placements the v5e tests compare: all on device, the optimizer state on host, both.
V5E_PLACEMENTS = {"device": rc.StatePlacement(), "optimizer": rc.StatePlacement(optimizer="host"),
                  "both": rc.StatePlacement(optimizer="host", params="host")}


@functools.cache
def v5e_compile(name: str, where: str) -> tuple[Any, dict[str, int]]:
    """The example's step compiled for a v5e chip at :data:`V5E_SIZES`, batch 1, the state where
    ``V5E_PLACEMENTS[where]`` says: its memory analysis and the state's bytes per role. Compiled
    once per test session (XLA:TPU takes seconds at this size); both v5e tests read the same three
    compiles per example."""
    return compile_on_target(EXAMPLES[name][0], V5E_PLACEMENTS[where], batch=1, **V5E_SIZES)


#: The v5e compiles: one example. Where the state lives is remat_common.state's placement, the same
#: for both frameworks; both examples' host state steps run on CPU in every stage, and the
#: Equinox GPT's streamed step compiles for v5e in tests/test_stream_params.py. (Both examples
#: here were 155 s of the target stage's 2-core time.)
V5E_EXAMPLES = ["nnx_gpt"]


@needs_tpu
@pytest.mark.target
@pytest.mark.parametrize("name", V5E_EXAMPLES)
def test_v5e_compile_holds_the_state_on_host(name: str) -> None:
    """The host parts are host argument and result bytes, to the byte but for the scalars' tile
    padding, and that many fewer device argument bytes (at :data:`V5E_SIZES`, the compiles of
    the streaming test below)."""
    base, nbytes = v5e_compile(name, "device")
    assert base.host_argument_size_in_bytes == 0 == base.host_output_size_in_bytes
    for where, moved in (("optimizer", nbytes["optimizer"]),
                         ("both", nbytes["optimizer"] + nbytes["params"])):
        got, _ = v5e_compile(name, where)
        pad = 1024 * 4  # XLA:TPU pads scalars (the step counts) to a tile
        assert moved <= got.host_argument_size_in_bytes <= moved + pad, where
        assert moved <= got.host_output_size_in_bytes <= moved + pad, where
        down = base.argument_size_in_bytes - got.argument_size_in_bytes
        assert moved - pad <= down <= moved + pad, where


def _peak(m: Any) -> int:
    """The device bytes a compiled step needs: arguments, results and temporaries, less what the
    results share with (donated) arguments."""
    return (m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
            - m.alias_size_in_bytes)


@needs_tpu
@pytest.mark.target
@pytest.mark.parametrize("name", V5E_EXAMPLES)
def test_v5e_compile_streams_the_host_state_through_the_device(name: str) -> None:
    """The update streams the host-resident state: the device's peak falls by most of what is
    kept on host, not only by the argument bytes.

    At :data:`V5E_SIZES`, where the update sets the peak. Measured (jax 0.11.2, MB of device
    peak = arguments + results + temporaries - aliased), all on device / optimizer state on host /
    parameters too: eqx 510.0 / 313.8 / 217.7, nnx 514.6 / 345.4 / 256.7; the peak falls by 72 %
    (eqx) and 62 % (nnx) of the optimizer state's bytes, then by 70 % and 65 % of the
    parameters'. The whole optimizer state fetched before the update instead
    (``fetch(opt_state, after=grads)``, as before streaming) raised the peak (d_model=512: eqx
    114.8 -> 121.5, nnx 115.2 -> 121.9): it is on device whole at the update, beside the
    gradients. What streaming keeps is a window of a few arrays (the largest arrays' moments and
    their new values in flight) and the copies where XLA updated donated device buffers in place.
    Bounds: 50 % of the optimizer state's bytes, then 40 % of the parameters'.
    """
    base, nbytes = v5e_compile(name, "device")
    opt, _ = v5e_compile(name, "optimizer")
    both, _ = v5e_compile(name, "both")
    assert _peak(base) - _peak(opt) >= 0.5 * nbytes["optimizer"], (_peak(base), _peak(opt))
    assert _peak(opt) - _peak(both) >= 0.4 * nbytes["params"], (_peak(opt), _peak(both))
    assert both.host_temp_size_in_bytes == 0  # written back into the donated host buffers



#: Shapes whose rows XLA:TPU may lay along a vector register's lanes (a last axis narrower than
#: 128: it lays the longest axis there), each with a window of a few rows: the blocks it was
#: given before (64 rows of ``(256, 64)``, 500 of ``(1000,)``, 8 of ``(64, 8, 4)``) it refused to
#: compile ("Slicing lane dimension is only supported when the lane slice size is a multiple of
#: LaneCount"), on the chip and for ``v5e:1x1``. Now: by rows in blocks of 128 where the window
#: holds them, else whole; an array with a last axis of 128 or more by rows as before.
LANE_SHAPES = [((8, 4), 32, False), ((256, 4), 1024, False), ((256, 4), 2048, True),
               ((256, 64), 16384, False), ((256, 64), 32768, True), ((1000,), 2000, False),
               ((1024,), 512, True), ((64, 8, 4), 1024, False), ((8, 128), 1024, True),
               ((6, 64, 256), 131072, True)]


def _lane_step(shape: tuple[int, ...], window: int, dev: Any, host: Any) -> Any:
    """``stream_update`` of a two-array state (a moment and a weight in ``host``) of ``shape``,
    jitted, lowered from shapes."""
    def update(s: dict[str, Any], g: jax.Array) -> dict[str, Any]:
        m = 0.9 * s["m"] + 0.1 * g
        return {"m": m, "w": s["w"] - 0.1 * m}

    state = {k: jax.ShapeDtypeStruct(shape, jnp.float32, sharding=host) for k in "mw"}
    g = jax.ShapeDtypeStruct(shape, jnp.float32, sharding=dev)
    step = jax.jit(lambda s, g: rc.state.stream_update(update, s, g, after=g, window=window),
                   out_shardings={"m": host, "w": host})
    return step.lower(state, g)


@pytest.mark.parametrize("shape, window, rows", LANE_SHAPES, ids=str)
def test_rows_that_may_lie_on_lanes_are_updated_in_blocks_of_128(
        shape: tuple[int, ...], window: int, rows: bool) -> None:
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
    dev = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    host = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(), memory_kind="pinned_host")
    text = _lane_step(shape, window, dev, host).as_text()
    assert ("while" in text) == rows, text[-2000:]


@needs_tpu
@pytest.mark.target
def test_v5e_compiles_every_row_block_the_update_takes() -> None:
    mesh = target_mesh(parse_accelerator("v5e:1x1"), {"data": 1})
    dev = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    host = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(), memory_kind="pinned_host")
    for shape, window, rows in LANE_SHAPES:
        lowered = _lane_step(shape, window, dev, host)
        assert ("while" in lowered.as_text()) == rows, shape
        assert lowered.compile().memory_analysis().host_argument_size_in_bytes > 0, shape

# -- for a GPU: exported for CUDA (the compile-only GPU targets list no memories, so JAX drops a
# host memory kind from their arguments; the export keeps it, and runs on a CPU-only machine) ----

@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_cuda_export_holds_the_state_on_host(name: str) -> None:
    from jax import export

    model = EXAMPLES[name][0]
    tx = model.optimizer()
    static, state, _ = model.build(None, tx=tx, abstract=True, **SIZES)
    roles = model.state_roles(state)
    placement = rc.StatePlacement(optimizer="host")
    shardings = rc.state.default_shardings(state)
    stored, _ = rc.state.state_shardings(shardings, roles, placement)
    args = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state, stored)
    step = rc.state.jit_state_step(model.train_step_fn(static, tx), shardings, roles, placement,
                                   fetches=True)
    text = export.export(step, platforms=["cuda"])(args, jax.ShapeDtypeStruct((2, 17), jnp.int32)
                                                   ).mlir_module()
    main = next(ln for ln in text.splitlines() if "func.func public @main(" in ln)
    signature, _, results = main.partition(") -> (")
    host = 'mhlo.memory_kind = "pinned_host"'
    n_opt = roles.count("optimizer")
    # the optimizer state's arguments and results in host memory, nothing else
    assert signature.count(host) == n_opt and results.count(host) == n_opt
    assert text.count("annotate_device_placement") >= 2 * n_opt  # moved to device and back


def test_state_transfer_prices_the_host_parts(example: dict[str, Any]) -> None:
    from remat_common.measurement import host_link, load_profile, state_transfer

    sizes = rc.state.state_bytes(example["state"], example["roles"])
    link = host_link(load_profile("tpu-v5e"))
    none = state_transfer(sizes, rc.StatePlacement())
    opt = state_transfer(sizes, rc.StatePlacement(optimizer="host"))
    both = state_transfer(sizes, rc.StatePlacement(optimizer="host", params="host"))
    assert none.host_bytes == none.transfer_bytes == 0 and none.seconds(link) == 0
    assert opt.host_bytes == sizes["optimizer"] and opt.transfer_bytes == 2 * sizes["optimizer"]
    assert both.host_bytes == sizes["optimizer"] + sizes["params"]
    assert both.seconds(link) == pytest.approx(both.transfer_bytes / 32e9)
    assert "MiB over the host link per step" in opt.describe(link) and "GB/s" in opt.describe(link)


@pytest.mark.parametrize("window, w_on_host", [(rc.state.WINDOW, False), (1024, False), (1024, True)],
                         ids=["whole", "rows", "rows-both-on-host"])
def test_stream_update_equals_the_update(window: int, w_on_host: bool) -> None:
    """``stream_update`` on its own: an update with a global reduction (a clip by the global
    norm), an inner ``jit`` (inlined, its arrays not made one group) and an array it leaves as it
    is, over a state partly in ``pinned_host``: the update's values, the host arrays' results in
    host memory (the others on device), and what it does with nothing on host. With a ``window``
    of 1 KiB the (8, 128) arrays are updated two rows at a time (the moment on host, the weight
    on device or on host, written in place), the clip's scale computed first."""
    dev = jax.devices()[0]
    host = jax.sharding.SingleDeviceSharding(dev, memory_kind="pinned_host")
    rng = np.random.default_rng(0)
    state = {"w": rng.normal(size=(8, 128)).astype(np.float32),
             "m": rng.normal(size=(8, 128)).astype(np.float32),
             "b": rng.normal(size=(128,)).astype(np.float32),
             "n": np.float32(3.0)}
    grads = {"w": rng.normal(size=(8, 128)).astype(np.float32),
             "b": rng.normal(size=(128,)).astype(np.float32)}
    inner = jax.jit(lambda m, g: 0.9 * m + 0.1 * g)

    def update(s: dict[str, Any], g: dict[str, Any]) -> dict[str, Any]:
        norm = jnp.sqrt(sum(jnp.sum(x * x) for x in jax.tree.leaves(g)))
        scale = jnp.minimum(1.0, 1.0 / norm)
        m = inner(s["m"], g["w"] * scale)
        return {"w": s["w"] - 0.1 * m, "m": m, "b": s["b"] - 0.1 * g["b"] * scale, "n": s["n"]}

    want = jax.jit(update)(state, grads)
    on_host = {"w": w_on_host, "m": True, "b": True, "n": True}
    placed = {k: jax.device_put(v, host if on_host[k] else dev) for k, v in state.items()}
    streamed = jax.jit(lambda s, g: rc.state.stream_update(update, s, g, after=g, window=window))
    got = streamed(placed, grads)
    assert_close(jax.tree.leaves(got), jax.tree.leaves(want))
    assert {k: v.sharding.memory_kind for k, v in got.items()} == {
        k: "pinned_host" if h else "device" for k, h in on_host.items()}
    if window < rc.state.WINDOW:  # a loop over row blocks: what the update computes per row
        text = streamed.lower(placed, grads).as_text()
        assert "while" in text and "dynamic_update_slice" in text
    plain = jax.jit(lambda s, g: rc.state.stream_update(update, s, g, window=window))(state, grads)
    assert_close(jax.tree.leaves(plain), jax.tree.leaves(want))


@pytest.mark.parametrize("given", ["default_shardings", "SingleDeviceSharding"])
def test_without_a_mesh_the_step_sees_its_host_arrays(given: str) -> None:
    """One device and no mesh, as a single chip trains: JAX 0.11 types an argument of a
    ``SingleDeviceSharding`` in ``pinned_host`` as device memory, so a step given one could not
    tell its host arrays apart and ``stream_update`` brought the whole state to the device (on a
    TPU v5e chip: 28.46 GB asked at 107 layers, refused; 13.1 GB once fixed). Given
    :func:`default_shardings` or one's own ``SingleDeviceSharding``, the step sees the host arrays
    as host memory and the update runs a loop over row blocks; its values are the update's."""
    dev = jax.devices()[0]
    rng = np.random.default_rng(0)
    state = {"m": rng.normal(size=(8, 128)).astype(np.float32),
             "w": rng.normal(size=(8, 128)).astype(np.float32)}
    roles = ["optimizer", "params"]  # jax.tree.leaves order
    placement = rc.StatePlacement(optimizer="host", params="host")
    shardings = (rc.state.default_shardings(state) if given == "default_shardings"
                 else jax.tree.map(lambda _: jax.sharding.SingleDeviceSharding(dev), state))
    seen: list[Any] = []

    def update(s: dict[str, Any], g: jax.Array) -> dict[str, Any]:
        m = 0.9 * s["m"] + g
        return {"m": m, "w": s["w"] - 0.1 * m}

    def step(s: dict[str, Any], x: jax.Array) -> tuple[dict[str, Any], jax.Array]:
        seen.extend(jax.typeof(v).memory_space for v in jax.tree.leaves(s))
        g = jnp.broadcast_to(x, (8, 128))
        return rc.state.stream_update(update, s, g, after=g, window=1024), jnp.sum(x)

    jitted = rc.state.jit_state_step(step, shardings, roles, placement, fetches=True)
    placed = rc.state.place_state(state, shardings, roles, placement)
    stored, _ = rc.state.state_shardings(shardings, roles, placement)
    # compiled ahead from shapes (what report, tune and capacity_check compile; the arrays' own
    # placement typed them right even before), and from the arrays, as a loop calls it
    shapes = jax.tree.map(lambda v, s: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=s),
                          state, stored)
    x = np.arange(128, dtype=np.float32)
    texts = [jitted.lower(args, x).as_text() for args in (shapes, placed)]
    assert seen and set(seen) == {jax.memory.Space.Host}, seen  # traced once: the same types
    assert texts[0] == texts[1] and "while" in texts[0] and "dynamic_update_slice" in texts[0]
    new, _ = jitted(placed, x)
    want = jax.jit(update)(state, jnp.broadcast_to(x, (8, 128)))
    assert_close(jax.tree.leaves(new), jax.tree.leaves(want))
    assert {v.sharding.memory_kind for v in jax.tree.leaves(new)} == {"pinned_host"}
