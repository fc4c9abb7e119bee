"""``examples/scale.py`` and the examples' shardings, in this process (one CPU device): the mesh
flag, the logical-to-mesh rules, each weight's sharding in both frameworks (on an abstract
2 x 2 x 2 mesh), batches, and the errors for a mesh, a model size or process flags that cannot work.
The sharded and multi-process runs themselves are in ``test_multihost.py``."""

from __future__ import annotations

import doctest
import sys
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from jax.sharding import AbstractMesh, AxisType, NamedSharding, PartitionSpec

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # the examples are not an installed package
    sys.path.insert(0, str(REPO))

from examples import scale  # noqa: E402
from examples.scale import ScaleError  # noqa: E402

MESH = AbstractMesh((2, 2, 2), scale.MESH_AXES, axis_types=(AxisType.Auto,) * 3)
SIZES = dict(vocab=256, d_model=32, n_layers=2, n_heads=2, seq_len=16)


def test_parse_mesh_orders_the_axes() -> None:
    assert scale.parse_mesh("tensor=2,data=4") == {"data": 4, "tensor": 2}
    assert list(scale.parse_mesh(" fsdp=2 , data=1")) == ["data", "fsdp"]


@pytest.mark.parametrize(("text", "problem"), [
    ("data=2,model=2", "unknown axis 'model'"),
    ("data=2,data=2", "axis 'data' given twice"),
    ("data=0", "size '0' of 'data' is not a positive integer"),
    ("data", "'data' is not AXIS=SIZE"),
])
def test_bad_mesh_text_says_what_and_how(text: str, problem: str) -> None:
    with pytest.raises(ScaleError, match=problem) as info:
        scale.parse_mesh(text)
    assert "--mesh data=2,fsdp=2,tensor=2" in str(info.value) and len(str(info.value)) < 600


def test_mesh_must_use_every_device() -> None:
    assert scale.make_mesh(None) is None and scale.make_mesh("none") is None
    mesh = scale.make_mesh("data=1")
    assert mesh is not None and dict(mesh.shape) == {"data": 1}
    with pytest.raises(ScaleError, match=r"needs 4 devices .* JAX sees 1") as info:
        scale.make_mesh("data=2,tensor=2")
    assert "XLA_FLAGS=--xla_force_host_platform_device_count=4" in str(info.value)


def test_logical_rules_keep_only_the_mesh_axes() -> None:
    assert dict(scale.logical_rules(MESH)) == {
        "batch": ("data", "fsdp"), "embed": "fsdp", "heads": "tensor", "mlp": "tensor",
        "vocab": "tensor"}
    tensor_only = AbstractMesh((2,), ("tensor",), axis_types=(AxisType.Auto,))
    assert scale.logical_spec(("embed", "mlp"), tensor_only) == PartitionSpec(None, "tensor")
    data_only = AbstractMesh((4,), ("data",), axis_types=(AxisType.Auto,))
    assert scale.batch_sharding(data_only).spec == PartitionSpec("data", None)


def test_an_axis_the_mesh_cannot_split_is_an_error() -> None:
    sharding = NamedSharding(MESH, scale.logical_spec(("batch", None), MESH))
    scale.check_divisible("tokens", (8, 17), sharding)  # 8 rows over data x fsdp = 4
    with pytest.raises(ScaleError, match=r"(?s)batch tokens has shape \(6, 17\); its axis 0 \(size 6\) "
                       r"is split over mesh axes \['data', 'fsdp'\]\s+\(4 parts\)") as info:
        scale.check_divisible("tokens", (6, 17), sharding, what="batch")
    assert "--batch" in str(info.value)


def test_one_device_mesh_batches_and_state_keep_their_values() -> None:
    mesh = scale.make_mesh("data=1")
    assert mesh is not None
    tokens = np.arange(2 * 5, dtype=np.int32).reshape(2, 5)
    sharding = scale.batch_sharding(mesh)
    assert scale.process_rows(sharding, tokens.shape) == slice(0, 2)
    batch = scale.global_batch(tokens, sharding)
    assert batch.sharding == sharding
    np.testing.assert_array_equal(np.asarray(batch), tokens)
    tree = {"w": np.ones((4, 2), np.float32), "n": np.int32(3)}
    placed = scale.place(tree, {"w": NamedSharding(mesh, PartitionSpec("data")),
                                "n": scale.replicated(mesh)})
    np.testing.assert_array_equal(np.asarray(placed["w"]), tree["w"])
    assert int(placed["n"]) == 3 and placed["w"].sharding.mesh == mesh


@pytest.mark.parametrize(("coordinator", "n", "i", "problem"), [
    (None, 2, 0, "no --coordinator HOST:PORT"),
    ("127.0.0.1:1234", 2, None, "both are needed"),
    ("127.0.0.1:1234", 2, 2, r"the id must be in 0 \.\.\. N-1"),
])
def test_bad_process_flags_are_refused_before_joining(coordinator: str | None, n: int,
                                                      i: int | None, problem: str) -> None:
    with pytest.raises(ScaleError, match=problem) as info:
        scale.init_distributed(coordinator, n, i)
    assert "--coordinator auto" in str(info.value)
    assert not jax.distributed.is_initialized()


def test_no_process_flags_is_one_process() -> None:
    assert scale.init_distributed(None, None, None) is False


def test_scale_doctests() -> None:
    result = doctest.testmod(scale, verbose=False)
    assert result.attempted >= 3 and result.failed == 0


def _specs(shardings: Any) -> dict[str, tuple[Any, ...]]:
    flat = jax.tree_util.tree_flatten_with_path(shardings)[0]
    return {jax.tree_util.keystr(p): tuple(s.spec) for p, s in flat}


#: The spec of each weight of block 0 on the 2 x 2 x 2 mesh: (in, out) for NNX kernels,
#: (out, in) for Equinox weights, which name the same logical axes.
WANT = {"query": ("fsdp", "tensor"), "out": ("tensor", "fsdp"), "gate": ("fsdp", "tensor"),
        "down": ("tensor", "fsdp")}


def test_nnx_shardings_come_from_with_partitioning() -> None:
    pytest.importorskip("flax")
    from examples.nnx_gpt import model

    from flax import nnx

    def build() -> tuple[Any, Any]:  # as model.build does, abstractly (shapes, no values)
        gpt = model.GPT(**SIZES, rngs=nnx.Rngs(0))  # type: ignore[arg-type]
        return gpt, nnx.Optimizer(gpt, model.optimizer(), wrt=nnx.Param)

    graphdef, state = nnx.split(nnx.eval_shape(build))
    specs = _specs(model.shardings(graphdef, state, MESH, scale.logical_rules(MESH)))
    for layer, want in WANT.items():
        part = "attn" if layer in ("query", "out") else "mlp"
        key = f"[0]['blocks'][0]['{part}']['{layer}']['kernel'].value"
        assert specs[key] == want, key
        # AdamW's moments are laid out as their weight
        moment = f"[1]['opt_state'][1][0]['mu']['blocks'][0]['{part}']['{layer}']['kernel'].value"
        assert specs[moment] == want
    assert specs["[0]['embed']['embedding'].value"] == ("tensor", "fsdp")
    assert specs["[0]['head']['kernel'].value"] == ("fsdp", "tensor")
    assert specs["[0]['blocks'][0]['attn_norm']['scale'].value"] == ()
    assert specs["[1]['step'].value"] == ()


def test_eqx_shardings_come_from_the_key_path_table() -> None:
    pytest.importorskip("equinox")
    from examples.eqx_gpt import model

    for layout, prefix in (("list", ".blocks[0]"), ("scan", ".blocks.layers")):
        import equinox as eqx

        static, state, _ = eqx.filter_eval_shape(model.build, None, tx=model.optimizer(),
                                                 layout=layout, **SIZES)
        specs = _specs(model.shardings(static, state, MESH, scale.logical_rules(MESH)))
        stacked = (None,) if layout == "scan" else ()
        assert len(specs) == len(jax.tree.leaves(state))
        for layer, want in WANT.items():
            part = "attn" if layer in ("query", "out") else "mlp"
            assert specs[f"[0]{prefix}.{part}.{layer}.weight"] == stacked + want[::-1]
        assert specs["[0].embed.weight"] == ("tensor", "fsdp")
        assert specs["[0].head.weight"] == ("tensor", "fsdp")
        assert specs[f"[0]{prefix}.attn_norm.weight"] == (None,) * (1 + len(stacked))


@pytest.mark.parametrize(("argv", "message"), [
    (["--mesh", "data=3"], r"--mesh 'data=3' needs 3 devices"),
    (["--num-processes", "2", "--process-id", "0"], r"no --coordinator HOST:PORT"),
])
def test_the_command_line_stops_with_the_message(argv: list[str], message: str, tmp_path: Path) -> None:
    """Before any model is built: the flags of ``train.py`` as a user gives them."""
    pytest.importorskip("flax")
    from examples import training
    from examples.nnx_gpt import train

    with pytest.raises(SystemExit, match=message):
        training.cli(train.main, [*argv, "--workdir", str(tmp_path)], config=train.CONFIG)
    assert not (tmp_path / "log.jsonl").exists()

