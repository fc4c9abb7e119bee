"""``remat tune``: per-name choices, the scanned layout and ``--maximize seq``.

Small on purpose (a 2-layer GPT, short sequences): a handful of compiles shared through one cache.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("flax")
pytest.importorskip("optax")
pytest.importorskip("rich")

from remat_common import RematError, tune  # noqa: E402
from remat_common.internal import ReportConfig, main  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "nnx_gpt" / "report.yaml"
TINY = {"vocab": 64, "d_model": 32, "n_layers": 2, "n_heads": 2, "seq_len": 64, "batch": 4}
QKV = "save:q+k+v"


@pytest.fixture(scope="module", autouse=True)
def standard_promotion() -> Any:
    """optax's AdamW raises a float to an int32 power; see tests/test_tune.py."""
    import jax

    old = jax.config.jax_numpy_dtype_promotion
    jax.config.update("jax_numpy_dtype_promotion", "standard")
    yield
    jax.config.update("jax_numpy_dtype_promotion", old)


@pytest.fixture(scope="module")
def scanned() -> tuple[Any, dict[str, Any], Any]:
    """The scanned NNX GPT with its uniform plans compiled once: (builder, cache, result)."""
    build = ReportConfig.load(CONFIG).with_sizes({**TINY, "layout": "scan"}).builder()
    cache: dict[str, Any] = {}
    return build, cache, tune(build, "1TiB", choices=[QKV, "recompute"], cache=cache)


def test_per_name_choice_on_the_scanned_layout(scanned: Any) -> None:
    """``save:q+k+v`` is compiled as its own uniform plan, verified, and lands between full
    recompute and save-all in memory and FLOPs. (Mixing choices per layer at a budget is
    tests/test_tune.py's subject, on the list layout.)"""
    _, _, everything = scanned
    assert everything.stack == "blocks" and everything.layers == TINY["n_layers"]
    qkv = everything[QKV]
    assert qkv.plan == {"blocks.*": {"save": ["k", "q", "v"]}} and not qkv.problems
    low, high = everything["recompute"], everything["save"]
    assert low.peak < qkv.peak < high.peak  # keeping q, k, v costs device bytes ...
    assert high.flops < qkv.flops < low.flops  # ... and saves their recomputation


def test_per_name_choice_errors(scanned: Any) -> None:
    build, cache, _ = scanned
    with pytest.raises(RematError, match=r"choice 'save:qq' names 'qq'; the layers tag .*'q'.*Fix"):
        tune(build, "1GiB", choices=["save:qq"], cache=cache)
    with pytest.raises(RematError, match=r"choice 'offload:' names no value.*Fix"):
        tune(build, "1GiB", choices=["offload:"], cache=cache)


def test_cli_maximize_seq(scanned: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """At the save-all peak of seq_len 64, the scanned GPT's sequence length is searched in steps of
    64: save-all fits 64 exactly and not 128 (three compiles: the tune, then 64 and 128)."""
    _, _, everything = scanned
    budget = everything["save"].peak
    js = tmp_path / "t.json"
    size = ["--size", *(f"{k}={v}" for k, v in {**TINY, "layout": "scan"}.items())]
    rc = main(["tune", str(CONFIG), *size, "--budget", str(budget), "--choices", "save",
               "--maximize", "seq", "--step", "64", "--limit", "128", "--no-progress",
               "--json", str(js)])
    text = capsys.readouterr().out
    assert rc == 0, text
    cap = json.loads(js.read_text())["capacity"]
    assert cap["axis"] == "seq"
    (save,) = cap["rows"]
    assert save["name"] == "save" and (save["largest"], save["peak"]) == (TINY["seq_len"], budget)
    assert save["next"] == 2 * TINY["seq_len"] and save["next_peak"] > budget
