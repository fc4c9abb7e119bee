"""The GPT examples, shrunk: they train, checkpoint, resume exactly, and a plan changes no loss.

Each example's ``main`` runs three times at a tiny size (module-scoped, shared by the tests):
``full`` trains 4 steps under the default plan with the report on; ``first`` trains 2 steps of the
model as written (no plan) and ``resumed`` continues that workdir to step 4 under the default plan.
So ``first`` against ``full`` compares losses with and without the plan, and ``resumed`` against
``full`` proves that a checkpoint restores model and optimiser state, across plans.
"""

from __future__ import annotations

import doctest
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import remat_common

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # the examples are not an installed package
    sys.path.insert(0, str(REPO))

from examples import config, training  # noqa: E402
from examples.eqx_gpt import model as eqx_model  # noqa: E402
from examples.eqx_gpt import train as eqx_train  # noqa: E402
from examples.nnx_gpt import model as nnx_model  # noqa: E402
from examples.nnx_gpt import train as nnx_train  # noqa: E402
from fixtures.tolerance import assert_close

EXAMPLES = {
    "nnx_gpt": (nnx_train, nnx_model),
    "eqx_gpt": (eqx_train, eqx_model),
}
SIZES = dict(d_model=32, n_layers=2, n_heads=2, seq_len=16)
TINY = dict(SIZES, batch=2, warmup_steps=2, decay_steps=20, checkpoint_every=2, eval_batches=1,
            sample_chars=0, log_every=100, quiet=True)
PLANS = ("default", "save", "recompute", "offload", "names")
#: The examples are user code with optax (see the fixture in tests/conftest.py).
pytestmark = pytest.mark.usefixtures("standard_promotion")


@pytest.fixture(scope="module", params=sorted(EXAMPLES))
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
         standard_promotion: None) -> dict[str, Any]:
    name = request.param
    main = EXAMPLES[name][0].main
    tmp = tmp_path_factory.mktemp(name)
    out = {"name": name, "full": main(**TINY, steps=4, workdir=str(tmp / "full"), report=True)}
    out["first"] = main(**{**TINY, "eval_batches": 0}, steps=2, plan="none", report=False,
                        workdir=str(tmp / "resume"))
    out["resumed"] = main(**TINY, steps=4, report=False, workdir=str(tmp / "resume"))
    return out


@pytest.mark.tooling  # the training script and orbax: runs in the jax 0.11.2 stage only
def test_trains_and_checkpoints(runs: dict[str, Any]) -> None:
    full = runs["full"]
    assert (full.start_step, full.step) == (0, 4)
    assert sorted(full.losses) == [1, 2, 3, 4]
    losses = np.array([full.losses[s] for s in range(1, 5)])
    # a fresh model predicts ~uniformly over 256 bytes, and AdamW lowers the loss from there
    np.testing.assert_allclose(losses[0], np.log(256), rtol=0.05)
    assert losses[-1] < losses[0]
    assert full.checkpoints == (2, 4)
    assert full.eval_loss is not None and np.isfinite(full.eval_loss)
    assert all(t > 0 for t in full.step_times.values()) and full.compile_s > 0


@pytest.mark.tooling  # the training script and orbax: runs in the jax 0.11.2 stage only
def test_resume_continues_exactly(runs: dict[str, Any]) -> None:
    """Stopped at step 2 (no plan) and resumed under the default plan: the run continues with the
    losses of the uninterrupted run, so model and optimiser state (step count, moments) were
    restored, and checkpoints are interchangeable between the plain and the annotated model."""
    first, resumed, full = runs["first"], runs["resumed"], runs["full"]
    assert (first.start_step, first.step, first.checkpoints) == (0, 2, (2,))
    assert (resumed.start_step, resumed.step) == (2, 4)
    assert sorted(resumed.losses) == [3, 4]
    for step in (3, 4):
        assert_close(resumed.losses[step], full.losses[step])
    assert resumed.eval_loss is not None and full.eval_loss is not None
    assert_close(resumed.eval_loss, full.eval_loss)
    assert resumed.checkpoints == (2, 4)
    records = [json.loads(line) for line in (resumed.workdir / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["event"] == "resume"] == [2]
    assert [r["manifest"]["plan"] is None for r in records if r["event"] == "start"] == [True, False]


@pytest.mark.tooling  # the training script and orbax: runs in the jax 0.11.2 stage only
def test_plan_changes_no_loss(runs: dict[str, Any]) -> None:
    full, plain = runs["full"], runs["first"]
    for step in (1, 2):
        assert_close(full.losses[step], plain.losses[step])


@pytest.mark.tooling  # the training script and orbax: runs in the jax 0.11.2 stage only
def test_manifest_next_to_checkpoints_and_in_log(runs: dict[str, Any]) -> None:
    full = runs["full"]
    plan = training.load_plan("default", REPO / "examples" / runs["name"])
    assert plan is not None
    for step in full.checkpoints:
        item = full.workdir / "checkpoints" / str(step) / "manifest" / "metadata"
        manifest = json.loads(item.read_text())
        assert manifest["step"] == step
        assert manifest["plan"]["fingerprint"] == plan.fingerprint()
        assert [b["path"] for b in manifest["plan"]["boundaries"]] == ["blocks.0", "blocks.1"]
        assert manifest["capabilities"]["jax"] == jax.__version__
    records = [json.loads(line) for line in (full.workdir / "log.jsonl").read_text().splitlines()]
    events = [r["event"] for r in records]
    assert events[0] == "start" and events[-1] == "end"
    assert events.count("step") == 4 and events.count("checkpoint") == 2 and events.count("report") == 1
    assert records[0]["manifest"]["plan"]["fingerprint"] == plan.fingerprint()
    assert records[0]["hyperparameters"]["d_model"] == SIZES["d_model"]
    steps = [r for r in records if r["event"] == "step"]
    assert [r["loss"] for r in steps] == [full.losses[s] for s in range(1, 5)]
    assert all(r["step_time_s"] > 0 for r in steps)


@pytest.mark.tooling  # the training script and orbax: runs in the jax 0.11.2 stage only
def test_report_shows_what_the_plan_keeps(runs: dict[str, Any]) -> None:
    report = runs["full"].report
    assert report is not None and report["baseline"] == "none"
    plans = {p["name"]: p for p in report["plans"]}
    assert sorted(plans) == ["default", "none"]
    default, none = plans["default"], plans["none"]
    assert default["problems"] == [] and default["boundaries"]
    named = [r["name"] for r in default["residuals"] if r["kind"] == "named"]
    # the default plan keeps the attention projections and output of every block, nothing else:
    # the blocks are alike under it, so they run as one shared trace (annotate's default) whose
    # residuals carry the first block's path, once per block, and the report lists the blocks
    layers = SIZES["n_layers"]
    assert default["shared"] == [["blocks.0", [f"blocks.{i}" for i in range(layers)]]]
    want = {f"blocks.0.attn/{n}" for n in ("q", "k", "v", "attn_out")}
    assert set(named) == want
    assert all(named.count(n) == layers for n in want), named
    assert default["host_bytes"] == 0
    assert default["device_bytes"] < none["device_bytes"]
    assert default["flop_ratio"] > 1.0 and none["flop_ratio"] == 1.0  # the MLP is recomputed


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_every_shipped_plan_is_verified_and_keeps_gradients(example: str, poisoned_empty: None) -> None:
    """Each plan file next to the example: what JAX keeps is what the plan says (strict
    verification), and the gradients equal the un-annotated model's, with ``jnp.empty`` poisoned
    (no buffer is read before it is written, as on a GPU)."""
    model = EXAMPLES[example][1]
    here = REPO / "examples" / example
    assert sorted(p.stem for p in (here / "plans").glob("*.yaml")) == sorted(PLANS)
    targets = {"none": model.measure_target(None, batch=2, **SIZES)}
    kept: dict[str, remat_common.ResidualReport] = {}
    for name in PLANS:
        plan = remat_common.Plan.load(here / "plans" / f"{name}.yaml")
        target = targets[name] = model.measure_target(plan, batch=2, **SIZES)
        assert target.plan is not None
        ver = remat_common.verify(target.loss_fn, *target.loss_args, plan=target.plan)
        assert ver.ok, ver.problems
        kept[name] = ver.report

    @jax.jit  # one compile for all plans
    def all_grads(args: dict[str, Any]) -> dict[str, Any]:
        return {n: jax.grad(t.loss_fn)(*args[n]) for n, t in targets.items()}

    grads = all_grads({n: t.loss_args for n, t in targets.items()})
    for name in PLANS:  # annotation keeps the parameter leaves and their order
        assert_close(grads[name], grads["none"], err_msg=name)
    dev = {n: r.nbytes("device") for n, r in kept.items()}
    assert dev["recompute"] < dev["default"] < dev["save"]
    assert kept["offload"].nbytes("host") > 0 and kept["recompute"].nbytes("host") == 0
    assert kept["names"].nbytes("host") > 0
    assert not kept["recompute"].names("device")
    assert {n.rpartition("/")[2] for n in kept["names"].names("device")} == {"q", "k", "v", "attn_out"}
    # names.yaml recomputes block 0 entirely: nothing named is kept there
    assert not {n for n in kept["names"].names("device") if n.startswith("blocks.0")}


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_report_config_matches_contract(example: str) -> None:
    import yaml

    here = REPO / "examples" / example
    config = yaml.safe_load((here / "report.yaml").read_text())
    file, function = config["target"].split(":")
    assert (here / file).is_file() and function == "measure_target"
    assert config["model"] == dict(vocab=256, d_model=128, n_layers=4, n_heads=4, seq_len=128)
    for name, path in config["plans"].items():
        assert path is None if name == "none" else (here / path).is_file()


def test_bad_plan_name_lists_the_shipped_plans(tmp_path: Path) -> None:
    shipped = r"one of \['default', 'names', 'offload', 'recompute', 'save'\]"
    with pytest.raises(FileNotFoundError, match=shipped):
        nnx_train.main(**TINY, steps=1, plan="recomptue", workdir=str(tmp_path))


@pytest.mark.tooling  # the training script and orbax: runs in the jax 0.11.2 stage only
def test_no_resume_refuses_to_overwrite(runs: dict[str, Any]) -> None:
    main = EXAMPLES[runs["name"]][0].main
    with pytest.raises(FileExistsError, match="already holds checkpoints up to step 4"):
        main(**TINY, steps=4, resume=False, report=False, workdir=str(runs["full"].workdir))


def test_command_line_from_main_signature() -> None:
    def main(*, steps: int = 3, plan: str | None = "x", lr: float = 0.1, report: bool = True) -> Any:
        """Doc.

        Args:
          steps: how many.
          plan: which plan.
        """
        return steps, plan, lr, report

    assert training.cli(main, []) == (3, "x", 0.1, True)
    argv = ["--steps", "7", "--plan", "none", "--lr", "2", "--no-report"]
    assert training.cli(main, argv) == (7, None, 2.0, False)
    assert config._arg_help(main) == {"steps": "how many.", "plan": "which plan."}


def test_help_says_each_default_once(capsys: pytest.CaptureFixture[str]) -> None:
    """The defaults --help prints are the docstring's: a field whose help words its default
    (d_ff: 4 * d_model; mesh: none, one device) gets no second, different one (was '(default 4 *
    d_model). (default: None)')."""
    with pytest.raises(SystemExit):
        training.cli(lambda config, **kw: None, ["--help"], config=training.TrainConfig())
    text = " ".join(capsys.readouterr().out.split())
    assert "(default 4 * d_model)." in text and "(default 4 * d_model). (default: None)" not in text
    # --mesh, --coordinator (was 'none: one device. ... (default: None)'), --num-processes, ...
    assert "(default: None)" not in text
    assert "(default none: one device)" in text and "(default none: one process)" in text
    assert "--steps STEPS train until this global step (a resumed run continues up to it). " \
           "(default: 300)" in text


@pytest.mark.parametrize("script", ["nnx_gpt", "eqx_gpt"])
def test_the_command_line_answers_before_jax_is_imported(script: str) -> None:
    """`train.py --help` and a refused flag print their answer without importing JAX, Flax or
    Equinox (the help took ~40 s when the script imported the training code first)."""
    path = REPO / "examples" / script / "train.py"
    probe = ("import runpy, sys\n"
             "sys.argv = [sys.argv[1], *sys.argv[2:]]\n"
             "try:\n    runpy.run_path(sys.argv[0], run_name='__main__')\n"
             "except SystemExit as e:\n    print('exit:', e.code)\n"
             "print('imported:', sorted({'jax', 'flax', 'equinox', 'optax'} & set(sys.modules)))\n")
    for argv, says in [(["--help"], "--steps STEPS"), (["--batch", "0"], "batch must be an integer >= 1")]:
        out = subprocess.run([sys.executable, "-c", probe, str(path), *argv], capture_output=True,
                             text=True, timeout=60, cwd=REPO)
        assert out.returncode == 0, out.stderr
        assert says in out.stdout + out.stderr, out.stdout + out.stderr
        assert "imported: []" in out.stdout, out.stdout


@pytest.mark.parametrize("argv, match", [
    (["--steps", "-5"], r"^error: steps must be an integer >= 0, got -5\. Fix: --steps"),  # trained 0
    (["--batch", "0"], r"^error: batch must be an integer >= 1, got 0"),  # a numpy error inside
    (["--log-every", "0"], r"^error: log_every must be an integer >= 1"),  # ZeroDivisionError
    (["--learning-rate", "nan"], r"^error: learning_rate must be a number > 0, got nan"),
    (["--plan", "nope"], r"^error: plan 'nope': no such file .*one of \['default'"),  # a traceback
    (["--plan", "{bad}"], r"^error: module 'blocks.\*' \(.*bad\.yaml:2\): unknown remat "
                          r"annotation 'bogus'"),  # a traceback
])
def test_command_line_errors_are_messages(tmp_path: Path, argv: list[str], match: str) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text('rules:\n  "blocks.*": bogus\n')
    argv = [a.replace("{bad}", str(bad)) for a in argv]
    with pytest.raises(SystemExit) as e:  # before any model is built or compiled
        training.cli(nnx_train.main, [*argv, "--workdir", str(tmp_path / "w"), "--no-report"],
                     config=nnx_train.CONFIG)
    assert re.search(match, str(e.value.code), re.S), e.value.code


def test_batches_are_deterministic_per_step() -> None:
    tokens = training.encode(training.load_text())
    assert len(tokens) > 4000 and tokens.max() < training.VOCAB
    a = training.TextBatches(tokens, batch=3, seq_len=16, seed=0)
    b = training.TextBatches(tokens, batch=3, seq_len=16, seed=0)
    assert a(5).shape == (3, 17) and a(5).dtype == np.int32
    np.testing.assert_array_equal(a(5), b(5))
    assert not np.array_equal(a(5), a(6))
    windows = np.lib.stride_tricks.sliding_window_view(tokens, 17)
    for row in a(5):  # every row is a contiguous window of the text
        assert (windows == row).all(axis=1).any()


@pytest.mark.parametrize("module", [training, config], ids=lambda m: m.__name__)
def test_training_doctests(module: Any) -> None:
    result = doctest.testmod(module, verbose=False)
    assert result.attempted >= 1 and result.failed == 0


@pytest.mark.slow
@pytest.mark.tooling  # the training script and orbax: runs in the jax 0.11.2 stage only
def test_script_runs_from_the_command_line(tmp_path: Path) -> None:
    """``python examples/nnx_gpt/train.py ...`` as a user runs it (not imported)."""
    args = [sys.executable, str(REPO / "examples" / "nnx_gpt" / "train.py"), "--steps", "2",
            "--workdir", str(tmp_path), "--no-report", "--sample-chars", "5", "--log-every", "1",
            "--eval-batches", "0"]
    for k, v in SIZES.items():
        args += [f"--{k.replace('_', '-')}", str(v)]
    out = subprocess.run(args, capture_output=True, text=True, cwd=tmp_path, timeout=300,
                         env={**os.environ, "PYTHONWARNINGS": "error"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert "step     1  loss" in out.stdout and "step     2  loss" in out.stdout
    assert "sample: A plan " in out.stdout
    assert (tmp_path / "checkpoints" / "2").is_dir()

