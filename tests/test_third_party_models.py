"""Models written by others (examples/third_party), opted in by plan files alone (examples/llms).

The vendored sources are the upstream files byte for byte; annotating them changes no parameter
and no module's class as ``isinstance`` sees it; every shipped plan keeps the gradients of the
model as written (bfloat16 compute: a tolerance from bfloat16's precision) and keeps on device or
host the names its ``tag`` rules give; the MFU formula matches a count by hand.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import remat_common as rc

ROOT = Path(__file__).resolve().parents[1]
THIRD = ROOT / "examples" / "third_party"
PLANS = ROOT / "examples" / "llms" / "plans"
TINY = dict(vocab=64, d_model=32, n_layers=2, n_heads=2, seq_len=16)


@pytest.fixture(autouse=True)
def _standard_promotion():
    """The upstream models mix bfloat16 and float32 as their authors run them (standard dtype
    promotion), not under the suite's strict promotion."""
    with jax.numpy_dtype_promotion("standard"):
        yield


@pytest.mark.lock_only  # file digests: no JAX
def test_the_vendored_sources_are_the_upstream_files() -> None:
    record = json.loads((THIRD / "upstream.json").read_text())
    assert set(record) == {"bonsai_qwen3", "bonsai_llama3_2", "eqx_llama"}
    for name, entry in record.items():
        assert len(entry["commit"]) == 40 and entry["repository"].startswith("https://github.com/")
        on_disk = {p.relative_to(THIRD / name).as_posix() for p in (THIRD / name).rglob("*")
                   if p.is_file() and p.name != "__init__.py" and "__pycache__" not in p.parts}
        on_disk |= {p.relative_to(THIRD / name).as_posix()
                    for p in (THIRD / name).rglob("__init__.py") if p.parent != THIRD / name}
        assert on_disk == set(entry["files"]), name  # nothing added beside them, nothing missing
        for rel, f in entry["files"].items():
            digest = hashlib.sha256((THIRD / name / rel).read_bytes()).hexdigest()
            assert digest == f["sha256"], f"{name}/{rel} differs from {entry['repository']}@{entry['commit']}"


def _target(model: str, plan: rc.Plan | None):
    if model == "eqx_llama":
        pytest.importorskip("equinox")
        pytest.importorskip("chex")
        from examples.llms import eqx_llms

        return eqx_llms.measure_target(plan, batch=2, **TINY)
    pytest.importorskip("flax")
    from examples.llms import nnx_llms

    return nnx_llms.measure_target(plan, batch=2, family=model, n_kv_heads=1, **TINY)


@functools.cache
def _grads(model: str, plan_file: str | None) -> tuple[float, list[np.ndarray]]:
    plan = None if plan_file is None else rc.Plan.load(PLANS / model / plan_file)
    t = _target(model, plan)
    loss, grads = jax.jit(jax.value_and_grad(t.loss_fn))(*t.loss_args)
    return float(loss), [np.asarray(g, np.float32) for g in jax.tree.leaves(grads)]


SHIPPED = [(m, p.name) for m in ("qwen3", "llama3_2", "eqx_llama")
           for p in sorted((PLANS / m).glob("*.yaml"))]
#: llama3_2's plans are qwen3's rules under its module names, on a model of the same source and
#: adapter (bonsai's NNX models; qwen3 adds query/key norms): on the lock's JAX only (lock_only).
#: Of qwen3's and eqx_llama's (one model per adapter), the jax 0.12 stage runs these, the others
#: are lock_only too (fixtures/matrix.py): on jax 0.12 each model runs at least one plan
#: that saves tagged names and one that offloads them, and one model full recompute. A plan file
#: is rules only: the policy paths under it are checked on every version by the core and adapter
#: tests (tests/test_core_remat.py, tests/test_eqx_remat.py, tests/test_flax_*.py). Stage 1 runs
#: every plan.
_NEWEST = {("qwen3", "layer_input_qkvo_offloaded.yaml"), ("qwen3", "save_qkv_proj.yaml"),
           ("eqx_llama", "full.yaml"), ("eqx_llama", "layer_input_out_offloaded.yaml")}
_SHIPPED_PARAMS = [pytest.param(m, p, id=f"{m}-{p}",
                                marks=[] if (m, p) in _NEWEST else [pytest.mark.lock_only])
                   for m, p in SHIPPED]


@pytest.mark.parametrize("model,plan_file", _SHIPPED_PARAMS)
def test_every_shipped_plan_keeps_the_gradients(model: str, plan_file: str) -> None:
    loss0, g0 = _grads(model, None)
    loss1, g1 = _grads(model, plan_file)
    eps = float(jnp.finfo(jnp.bfloat16).eps)  # bfloat16 compute: what recomputation may change
    assert loss1 == pytest.approx(loss0, rel=4 * eps)
    assert len(g0) == len(g1)
    for a, b in zip(g0, g1):
        scale = max(float(np.abs(a).max()), 1e-30)
        assert float(np.abs(a - b).max()) <= 16 * eps * scale


@pytest.mark.parametrize("model", ["qwen3", "llama3_2", "eqx_llama"])
def test_tag_rules_name_what_the_plan_keeps(model: str) -> None:
    plan_file = "layer_input_out_offloaded.yaml" if model == "eqx_llama" else "minimal.yaml"
    plan = rc.Plan.load(PLANS / model / plan_file)
    t = _target(model, plan)
    residuals = rc.saved_residuals(t.loss_fn, *t.loss_args).residuals
    named = {(r.name.rpartition("/")[2], r.placement) for r in residuals if r.name}
    if model == "eqx_llama":
        assert ("out_proj", "host") in named and ("__input__", "host") in named
    else:
        assert {("query_proj", "device"), ("key_proj", "device"), ("value_proj", "device"),
                ("out_proj", "device"), ("mlpwi_0", "device"), ("mlpwi_1", "device")} <= named


def test_opting_in_changes_no_parameter_and_no_class() -> None:
    pytest.importorskip("flax")
    from flax import nnx

    import flax_remat_plugin
    from examples.llms import nnx_llms

    plain = nnx_llms._model("llama3_2", nnx_llms._config(
        "llama3_2", vocab=64, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=16,
        d_ff=64), 0)
    before = {p: type(m) for p, m in nnx.iter_modules(plain)}
    params = jax.tree.map(lambda x: (x.shape, x.dtype), nnx.state(plain, nnx.Param))
    flax_remat_plugin.annotate(plain, rc.Plan.load(PLANS / "llama3_2" / "minimal.yaml"))
    assert jax.tree.map(lambda x: (x.shape, x.dtype), nnx.state(plain, nnx.Param)) == params
    for p, m in nnx.iter_modules(plain):
        assert isinstance(m, before[p]) and type(m).__name__ == before[p].__name__


def test_a_tag_is_one_plain_name() -> None:
    assert rc.parse_annotation({"tag": "query_proj"}).to_config() == {"tag": "query_proj"}
    both = rc.parse_annotation({"remat": "offload", "tag": "out_proj"})
    assert (both.kind, both.tag) == ("offload", "out_proj")
    assert rc.Plan.from_config(rc.Plan.from_mapping({"a.*": both}).to_config()).rules[0].annotation == both
    for bad in ("", "a/b", "*", " x", "__input__", 3, ["q"]):
        with pytest.raises(rc.AnnotationError, match="'tag' .* must be one activation name"):
            rc.parse_annotation({"tag": bad}, path="layers.0.q_proj")


def test_model_flops_match_a_count_by_hand() -> None:
    from remat_common.measurement import ModelFlops, mfu

    # qwen3 as measured on the chip: d 2048, 4 layers, 16 heads of 128, 8 key/value heads, d_ff 6144
    f = ModelFlops.from_sizes(dict(d_model=2048, n_layers=4, n_heads=16, n_kv_heads=8,
                                   head_dim=128, d_ff=6144, vocab=32000, seq_len=1024))
    per_layer = 2048 * 2048 + 2 * 2048 * 1024 + 2048 * 2048 + 3 * 2048 * 6144
    assert f.matmul_params == 4 * per_layer + 2048 * 32000
    assert f.per_token == 6 * f.matmul_params + 12 * 4 * 16 * 128 * 1024
    assert mfu(f.per_token, 1e12 / f.per_token, 1e12) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="model FLOPs need the model's seq_len"):
        ModelFlops.from_sizes(dict(d_model=8, n_layers=1, n_heads=1, vocab=8))


@pytest.mark.tooling  # a training run (stage 1 only); the gradients above are checked everywhere
@pytest.mark.parametrize("model,plan", [("llama3_2", "minimal"), ("eqx_llama", "layer_input_out_offloaded")])
def test_the_train_command_trains_on_the_shipped_text(model: str, plan: str, tmp_path: Path) -> None:
    pytest.importorskip("chex" if model == "eqx_llama" else "flax")
    from examples.llms import train

    losses = train.main([model, "--plan", plan, "--steps", "12", "--batch", "4", "--seq-len", "32",
                         "--d-model", "32", "--n-heads", "2", "--log-every", "6",
                         "--workdir", str(tmp_path)])
    assert losses[12] < losses[1] - 0.5
    events = [json.loads(line)["event"] for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert events.count("step") == 12 and events.count("throughput") == 2
    with pytest.raises(SystemExit, match="neither a plan of"):
        train.main([model, "--plan", "nope"])


def test_throughput_and_the_devices_peak() -> None:
    from remat_common.measurement import device_peak, throughput

    assert device_peak("TPU v5 lite") == 197e12 and device_peak("TPU v5 lite", 4) == 4 * 197e12
    assert device_peak("cpu") is None
    sizes = dict(d_model=32, n_layers=1, n_heads=2, seq_len=16, vocab=64, batch=4)
    tokens, util = throughput(sizes, 0.5, 1e12)
    assert tokens == 128.0 and util is not None and util > 0
    assert throughput({**sizes, "batch": 4}, None, 1e12) is None
    assert throughput({"batch": 4}, 0.5, 1e12) is None  # sizes that do not say the shape


@pytest.mark.target
def test_a_third_party_model_compiles_for_a_v5e_chip() -> None:
    """bonsai's Llama 3.2 under two MaxText presets, compiled deviceless for one v5e chip (the
    target stage's libtpu): both fit, and the offload preset's named values go to host memory."""
    from remat_common.measurement import compiler_available

    missing = compiler_available("tpu")
    if missing is not None:
        pytest.skip(f"{missing} (./scripts/test's target stage)")
    import remat_common.internal as ri

    config = ri.ReportConfig.load(ROOT / "examples" / "llms" / "llama3_2.yaml")
    config = config.with_sizes(ri.parse_size(["n_layers=1", "d_model=128", "seq_len=128", "batch=2"]))
    config = config.select(["full", "layer_input_qkvo_offloaded"])
    report = ri.run_report(ri.with_target(config, "v5e:1x1", None), steps=0, warmup=0)
    assert not report.refused and report.accelerator["name"] == "v5e:1x1"
    offloaded = report["layer_input_qkvo_offloaded"]
    assert offloaded.host_bytes > 0 and report["full"].host_bytes == 0
    assert offloaded.memory.host_temp_size_in_bytes > 0  # XLA:TPU placed them on host
