"""Compiling for an accelerator this machine does not have (docs/targets.md).

The ``target`` tests compile small programs for an H100 target config and a TPU v5e slice with no
device: they need the compilers (``jax-remat-plan[target-gpu,target-tpu]``), which ./scripts/test's
target stage installs in .venv-target. Elsewhere they are skipped, unless REMAT_REQUIRE_TARGETS is
set (the stage sets it), where a missing compiler fails them.
"""

from __future__ import annotations

import functools
import importlib.metadata
import itertools
import json
import os
import re

import jax
import jax.numpy as jnp
import pytest

from remat_common import RematError, capabilities
from remat_common.measurement import (
    Report,
    compile_for,
    compiler_available,
    count_flops,
    host_placements,
    parse_accelerator,
    render_text,
)


def _needs(platform: str) -> pytest.MarkDecorator:
    why = compiler_available(platform)
    if why is not None and os.environ.get("REMAT_REQUIRE_TARGETS"):
        pytest.fail(f"REMAT_REQUIRE_TARGETS is set but {why}", pytrace=False)
    return pytest.mark.skipif(why is not None, reason=f"{why} (./scripts/test's target stage)")


needs_gpu = _needs("cuda")
needs_tpu = _needs("tpu")


# -- a TPU's memory: the HBM its compiler makes available -----------------------------------------

@needs_tpu
@pytest.mark.target
@pytest.mark.parametrize("generation", ["v4", "v5e", "v5p", "v6e"])
def test_tpu_memory_is_what_its_compiler_makes_available(generation) -> None:
    """Each generation's device memory is the HBM XLA:TPU refuses a program over (v5p: 95.73 GiB,
    where "95 GB" had made 'fits' and the default budget 7 % too small), and its slice compiles
    (v4's compile-only devices are TensorCores, two per chip, which jax's mesh maker refused)."""
    from remat_common.measurement import device_count

    acc = parse_accelerator(generation)
    n = device_count(acc)
    x = jax.ShapeDtypeStruct((n, 1 << 28), jnp.float32)  # 1 GiB per device

    def many(a):  # 120 GiB per device of scan outputs
        return jax.lax.scan(lambda c, i: (c * 1.0001 + i, jnp.sin(c)), a, jnp.arange(120.0))[1]

    tc = compile_for(many, [x], acc)
    got = re.search(r"exceeds available HBM \(([\d.]+)G\)", tc.error or "")
    assert got is not None, tc.error
    assert f"{acc.memory_bytes / 2**30:.2f}" == got[1]


# -- compiles -------------------------------------------------------------------------------------

L, D, B, T = 4, 1024, 8, 64


def _block(w, x):
    h = jax.ad_checkpoint.checkpoint_name(x @ w[0], "h")
    return x + jnp.tanh(h) @ w[1]


def _grad(policy, unroll=False):
    def loss(ws, x):
        f = jax.checkpoint(_block, policy=policy) if policy is not None else _block
        if unroll:
            y = x
            for i in range(L):
                y = f(ws[i], y)
        else:
            y, _ = jax.lax.scan(lambda c, w: (f(w, c), None), x, ws)
        return (y.astype(jnp.float32) ** 2).mean()
    # w.r.t. the input too: otherwise the unrolled program skips the first layer's input gradient,
    # which a scan body computes at every step (one matmul of the 24 fewer)
    return jax.grad(loss, argnums=(0, 1))


_ARGS = (jax.ShapeDtypeStruct((L, 2, D, D), jnp.bfloat16), jax.ShapeDtypeStruct((B, T, D), jnp.bfloat16))
_POLICIES = {
    "save": None,
    "recompute": jax.checkpoint_policies.nothing_saveable,
    "offload": jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=[], names_which_can_be_offloaded=["h"],
        offload_src="device", offload_dst="pinned_host"),
}


@pytest.fixture(scope="module")
def local() -> dict:
    return {name: compile_for(_grad(p), _ARGS, "local") for name, p in _POLICIES.items()}


def _check_target(acc: str, local: dict, args: tuple = _ARGS) -> dict:
    got = {name: compile_for(_grad(p), args, acc) for name, p in _POLICIES.items()}
    mem = {n: c.compiled.memory_analysis() for n, c in got.items()}
    # offload: on host there, a lower device footprint than save (the CPU compiler drops it)
    assert mem["offload"].host_temp_size_in_bytes > 0 == mem["save"].host_temp_size_in_bytes
    assert mem["offload"].temp_size_in_bytes < mem["save"].temp_size_in_bytes
    assert local["offload"].compiled.memory_analysis().host_temp_size_in_bytes == 0
    # the placements are read from the target's compiled program (memory space 5)
    assert host_placements(got["offload"].compiled.as_text()).get("pinned_host", 0) > 0
    assert host_placements(got["offload"].compiled.as_text()).get("device", 0) > 0
    assert host_placements(got["save"].compiled.as_text()) == {}
    assert not any(c.xla_remat or c.error for c in got.values())
    return got


@needs_gpu
@pytest.mark.target
def test_gpu_target_figures(local) -> None:
    got = _check_target("h100x2", local)
    for name, c in got.items():  # per device: half the batch of the local (1 device) program
        per_device = count_flops(c.compiled).flops
        assert per_device == pytest.approx(count_flops(local[name].compiled).flops / 2, rel=0.02)
    # FLOPs of the scanned program, counted from the target's HLO with the trip counts, equal
    # those of the same program unrolled (no loop), compiled for the target too
    unrolled = compile_for(_grad(_POLICIES["recompute"], unroll=True), _ARGS, "h100x2")
    assert count_flops(got["recompute"].compiled).flops == pytest.approx(
        count_flops(unrolled.compiled).flops, rel=0.02)


@needs_tpu
@pytest.mark.target
def test_tpu_target_figures(local) -> None:
    # XLA:TPU keeps small residuals in on-chip memory (temp 0): a batch whose residuals do not fit
    args = (_ARGS[0], jax.ShapeDtypeStruct((16, 1024, D), jnp.bfloat16))
    got = _check_target("v5e:2x2", local, args)
    assert got["save"].compiled.memory_analysis().generated_code_size_in_bytes > 0  # XLA:TPU's
    # XLA:TPU records no trip counts (and peels an iteration off the offload plan's loops): the
    # counter reads them from the loops' conditions; the unrolled program agrees
    unrolled = compile_for(_grad(_POLICIES["offload"], unroll=True), args, "v5e:2x2")
    assert count_flops(got["offload"].compiled).flops == pytest.approx(
        count_flops(unrolled.compiled).flops, rel=0.02)


@needs_tpu
@pytest.mark.target
def test_tpu_fsdp_matmul_loops_are_counted() -> None:
    """Laid out with FSDP over a v5p slice's 8 chips, XLA:TPU runs the matmuls whose parameters
    it gathers as windowed einsum loops (shard by shard, 2 per iteration), with no trip count
    recorded: the counter reads it from each loop's condition, start and step. Per chip, the
    FLOPs equal those of the data-parallel layout's unrolled program (no loop at all) within 2 %
    (measured: +0.7 %). The smallest case found: width 512, 1024 tokens per chip."""
    args = (jax.ShapeDtypeStruct((L, 2, 512, 512), jnp.bfloat16),
            jax.ShapeDtypeStruct((8, 1024, 512), jnp.bfloat16))
    fsdp = compile_for(_grad(_POLICIES["recompute"]), args, "v5p:2x2x2", mesh="fsdp=8")
    assert "windowed_dot_general" in fsdp.compiled.as_text()
    counted = count_flops(fsdp.compiled)
    assert counted.uncounted == () and counted.flops is not None and counted.loops > 2
    plain = compile_for(_grad(_POLICIES["recompute"], unroll=True), args, "v5p:2x2x2",
                        mesh="data=8")
    assert " while(" not in plain.compiled.as_text()
    assert counted.flops == pytest.approx(count_flops(plain.compiled).flops, rel=0.02)


@needs_gpu
@pytest.mark.target
def test_batch_that_does_not_split_is_an_error() -> None:
    with pytest.raises(RematError, match="does not split over the mesh's 3 devices"):
        compile_for(_grad(None), _ARGS, "h100x3")


# -- measure(accelerator=...) ---------------------------------------------------------------------

def _measure_build(plan):
    from remat_common import compile_plan, resolve
    from remat_common.adapter import call_module
    from remat_common.measurement import MeasureTarget

    compiled = None if plan is None else compile_plan(resolve(plan, ["mlp"]))

    def layer(w, x):
        return jnp.tanh(jax.ad_checkpoint.checkpoint_name(x @ w[0], "h")) @ w[1]

    def loss(w, x):
        y = layer(w, x) if plan is None else call_module(compiled, "mlp", layer, w, x)
        return jnp.mean(y.astype(jnp.float32) ** 2)

    def step(w, x):
        return w - 0.1 * jax.grad(loss)(w, x).astype(w.dtype)

    args = (jax.ShapeDtypeStruct((2, 512, 512), jnp.bfloat16),  # abstract: nothing allocated
            jax.ShapeDtypeStruct((8, 256, 512), jnp.bfloat16))
    return MeasureTarget(loss, args, step, args, compiled)


_PLANS = {"none": None, "recompute": {"mlp": "recompute"}, "offload": {"mlp": {"offload": ["h"]}}}


@pytest.fixture(scope="module")
def h100x2() -> Report:
    """:data:`_PLANS` measured for two H100s (``mesh="data=2"``): one report for the two tests
    that read it (three compiles)."""
    from remat_common.measurement import measure

    return measure(_measure_build, _PLANS, accelerator="h100x2", mesh="data=2")


@needs_gpu
@pytest.mark.target
def test_measure_on_a_gpu_target(h100x2: Report) -> None:
    rep = h100x2
    assert rep.accelerator["name"] == "h100x2" and rep.accelerator["mesh"] == {"data": 2}
    assert rep.device_memory == 84942979072
    off, none = rep["offload"], rep["none"]
    assert off.memory.host_temp_size_in_bytes > 0 == none.memory.host_temp_size_in_bytes
    assert off.placement.platform == "h100x2" and off.placement.placed
    assert off.placement.host_bytes_per_device == off.memory.host_temp_size_in_bytes
    assert rep["recompute"].flop_ratio > 1.0 and all(p.timing.steps == () for p in rep.plans)
    assert rep.exceeds_by("none") == 0 and not any(p.xla_remat for p in rep.plans)
    assert rep.problems == ()  # the offload is placed in host memory by the target compiler
    assert Report.from_json(rep.to_json()) == rep
    from remat_common.measurement import render_text

    text = render_text(rep)
    assert "compiled for h100x2: 2 x h100 GPU" in text and "nothing ran" in text
    pjrt = importlib.metadata.version("jax-cuda12-pjrt")  # the compiler, named with its version
    assert rep.compiler.platform == "cuda" and dict(rep.compiler.plugins)["jax-cuda12-pjrt"] == pjrt
    assert f"compiled by XLA:GPU, jax-cuda12-pjrt {pjrt}" in " ".join(text.split())


_TARGET_MODEL = """\
import sys
sys.path.insert(0, {tests!r})
from test_targets import _measure_build


def measure_target(plan, *, batch):
    return _measure_build(plan)
"""


@needs_gpu
@pytest.mark.target
def test_the_breakdown_on_a_gpu_target(h100x2: Report, tmp_path, capsys) -> None:
    """The target compiler's buffer assignment: the offload plan's host memory at its peak is
    the offloaded residual, by module and tag, summing to the host memory the compiler reports;
    remat report --accelerator prints it and, with no --budget, whether each plan fits the
    target's device memory. REMAT_WRITE_FIXTURES=1 writes the report to
    tests/data/target_offload_report.json, which tests/test_breakdown.py renders on any machine."""
    from pathlib import Path

    from remat_common.internal import main
    from remat_common.measurement import render_text

    rep = h100x2
    off = rep["offload"]
    b = off.breakdown
    assert b is not None and b.compiler == "cuda" and b.host_timeline is not None
    assert sum(r.bytes for r in b.host_rows) == off.memory.host_temp_size_in_bytes > 0
    assert [(r.kind, r.module, r.name) for r in b.host_rows] == [("offloaded residual", "mlp", "h")]
    assert b.host_timeline.modules == ("mlp",)
    assert all(p.breakdown.host_rows == () for p in (rep["none"], rep["recompute"]))
    assert abs(b.total - off.memory.device_total) <= 0.01 * off.memory.device_total
    text = render_text(rep, width=240)
    assert "host: offloaded residual" in text and "host peak" in text
    if os.environ.get("REMAT_WRITE_FIXTURES"):
        rep.save(Path(__file__).parent / "data" / "target_offload_report.json")
    model = tmp_path / "model.py"
    model.write_text(_TARGET_MODEL.format(tests=str(Path(__file__).parent)))
    cfg = tmp_path / "r.yaml"
    cfg.write_text("target: model.py:measure_target\nbatch: 8\nplans: {none: null, offload: "
                   "{mlp: {offload: [h]}}}\n")
    capsys.readouterr()
    assert main(["report", str(cfg), "--accelerator", "h100x2", "--mesh", "data=2"]) == 0
    out = capsys.readouterr().out
    assert "will offload fit? compiled peak" in out and "fits 79.11 GiB" in out


@needs_gpu
@pytest.mark.target
def test_a_plan_over_the_device_memory_says_so(tmp_path) -> None:
    from remat_common.measurement import measure, render_text

    small = tmp_path / "tiny.txtpb"  # an H100 with 2 MiB of memory: every plan exceeds it
    small.write_text(parse_accelerator("h100").config.replace("84942979072", str(2 * 2**20)))
    rep = measure(_measure_build, {"none": None}, accelerator=str(small))
    assert rep.exceeds_by("none") > 0
    assert "none: DOES NOT FIT: the peak per device exceeds the device memory by" in render_text(rep)


#: The NNX GPT example at a small size: XLA:GPU's own rematerialization pass reaches an 11 MiB
#: H100's target (peak 8.09 MiB; 9.64 MiB with 1000 MiB) and cannot reach a 4 MiB one's
_TINY_GPT = {"n_layers": 2, "d_model": 64, "n_heads": 2, "seq_len": 64}


def _h100_with(tmp_path, mib: int) -> str:
    f = tmp_path / f"h100_{mib}mib.txtpb"
    f.write_text(parse_accelerator("h100").config.replace("84942979072", str(mib * 2**20)))
    return str(f)


@needs_gpu
@pytest.mark.target
def test_xla_rematerialization_is_read_from_the_compiled_program(tmp_path,
                                                                 standard_promotion) -> None:
    """Where XLA:GPU's own rematerialization pass brings the step under the device memory, the
    compiler says nothing: the report reads it from the compiled program (the instructions it
    cloned to recompute, ``*.remat``). Where it cannot, the compiler's message comes with it, and
    the program alone (what a program from the persistent cache gives) still shows the change."""
    from pathlib import Path

    pytest.importorskip("flax")
    from remat_common.internal import ReportConfig, jittable, program_remat
    from remat_common.measurement import measure, render_text

    root = Path(__file__).resolve().parents[1]
    build = ReportConfig.load(root / "examples" / "nnx_gpt" / "report.yaml").with_sizes(
        _TINY_GPT).builder()
    rep = measure(build, {"none": None}, accelerator=_h100_with(tmp_path, 11), steps=0)
    changed = rep["none"].xla_remat
    assert changed is not None and changed.startswith("XLA's rematerialization pass recomputes")
    assert "Can't reduce" not in changed and "matmuls" in changed
    assert rep.exceeds_by("none") == 0  # it fits: the program XLA changed does
    assert "none: XLA CHANGED THE PROGRAM" in render_text(rep)

    t = build(None)
    fn, args = jittable(t.step_fn, tuple(t.step_args))
    tc = compile_for(fn, args, _h100_with(tmp_path, 4))  # the last input is the batch
    assert tc.xla_remat is not None and tc.xla_remat.startswith("Can't reduce memory use below")
    from_program = program_remat(tc.compiled.as_text())
    assert from_program is not None and tc.xla_remat.endswith(from_program)


def _mlp_loss(plan: dict):
    """A loss over one module ``mlp`` under ``plan`` (its hidden value tagged ``h``), abstract."""
    from remat_common import Plan, compile_plan, resolve
    from remat_common.adapter import call_module

    compiled = compile_plan(resolve(Plan.coerce(plan), ["mlp"]))

    def layer(w, x):
        return jnp.tanh(jax.ad_checkpoint.checkpoint_name(x @ w[0], "h")) @ w[1]

    def loss(w, x):
        return jnp.mean(call_module(compiled, "mlp", layer, w, x).astype(jnp.float32) ** 2)

    args = (jax.ShapeDtypeStruct((2, 256, 256), jnp.bfloat16),
            jax.ShapeDtypeStruct((8, 128, 256), jnp.bfloat16))
    return loss, args, compiled


def test_verify_on_this_machine_says_its_compiler_drops_the_offload() -> None:
    """On the local CPU an offload compiles to nothing on host: verify_on says so (strict: it
    raises), where verify alone passes; the fix it names (keep the value on device) passes."""
    from remat_common import VerificationError, verify
    from remat_common.measurement import verify_on

    if jax.default_backend() != "cpu":
        pytest.skip("the local compiler places host memory here")
    loss, args, plan = _mlp_loss({"mlp": {"offload": ["h"]}})
    assert verify(loss, *args, plan=plan, strict=False).ok  # traced: h is on host
    v = verify_on(loss, *args, plan=plan, accelerator="local", strict=False)
    problem = " ".join(v.problems[0].split())  # the message's line breaks as spaces
    assert len(v.problems) == 1
    assert "the plan offloads 'h' of module 'mlp'" in problem and "the local compiler" in problem
    assert "places nothing in host memory" in problem and "keep the values on device" in problem
    with pytest.raises(VerificationError, match=r"places nothing in host\smemory"):
        verify_on(loss, *args, plan=plan, accelerator="local", strict=True)
    loss, args, plan = _mlp_loss({"mlp": {"save": ["h"]}})  # the fix
    assert verify_on(loss, *args, plan=plan, accelerator="local", strict=True).ok


def test_verify_on_says_when_a_report_came_from_another_compiler() -> None:
    """``against``: a report from another compiler (libtpu 0.0.48 where this process compiles
    with XLA:CPU, a CUDA plugin's where it compiles with XLA:TPU) is named as such, with the
    command that re-measures its figures."""
    import dataclasses

    from remat_common.measurement import Compiler, Report, compiler_identity, verify_on

    here = compiler_identity()
    loss, args, plan = _mlp_loss({"mlp": {"save": ["h"]}})
    other = (Compiler("tpu", "0.11.2", "0.11.2", (("libtpu", "0.0.48"),)) if here.platform != "tpu"
             else Compiler("cuda", "0.11.2", "0.11.2", (("jax-cuda12-plugin", "0.11.2"),)))
    old = Report((), "none", capabilities(), (), compiler=other)
    v = verify_on(loss, *args, plan=plan, accelerator="local", strict=True, against=old)
    notes = " ".join(v.notes)
    assert (f"the report given: these figures came from {other.describe()}; this process "
            f"compiles with {here.describe()}: its memory figures may not hold here; re-measure "
            "them with remat report CONFIG --check FILE.") in notes
    assert f"compiled for local by {here.describe()}:" in notes
    same = dataclasses.replace(old, compiler=here)
    v = verify_on(loss, *args, plan=plan, accelerator="local", strict=True, against=same)
    assert f"the report given: its figures came from this compiler ({here.describe()})." in v.notes


@needs_gpu
@pytest.mark.target
def test_verify_on_a_gpu_target_reads_the_placements() -> None:
    """One compile for the H100 target: the offload the plan asks for is placed in host memory
    (no problem, a note with the placements); host placements the plan did not ask for (a
    jax.checkpoint with an offload policy inside the module) are a problem."""
    from remat_common.measurement import verify_on

    loss, args, plan = _mlp_loss({"mlp": {"offload": ["h"]}})
    v = verify_on(loss, *args, plan=plan, accelerator="h100x2", strict=True)
    assert v.ok and v.report.nbytes("host") == 8 * 128 * 256 * 2
    [note] = [n for n in v.notes if n.startswith("host placements")]
    assert "compiled for h100x2 by XLA:GPU, jax-cuda12-pjrt" in note  # its compiler, named
    assert "to host" in note and "back" in note
    assert "host temp 0 B" not in note

    _, _, recompute = _mlp_loss({"mlp": "recompute"})
    inner = jax.checkpoint(loss, policy=_POLICIES["offload"])  # not the plan's doing
    v = verify_on(inner, *args, plan=recompute, accelerator="h100x2", strict=False)
    assert any("write into host memory" in " ".join(p.split()) and "the plan offloads nothing"
               in " ".join(p.split()) for p in v.problems), v.problems


@needs_gpu
@pytest.mark.target
def test_the_same_plans_compiled_here_and_for_a_target() -> None:
    """What scripts/device_check compares on a device (its compile beside its topology's),
    here for this machine's compiler beside the H200 target's: per plan, peak, temp and host
    temp both ways and their differences; the offload is on host only on the target."""
    from remat_common.internal import both_ways_table, compare_reports
    from remat_common.measurement import measure

    here = measure(_measure_build, _PLANS, steps=0)
    there = measure(_measure_build, _PLANS, accelerator="h200", steps=0)
    rows = compare_reports(here, there)
    assert [r.plan for r in rows] == list(_PLANS)
    for r in rows:
        assert (r.first, r.second) == (jax.default_backend(), "h200")
        assert r.peak == (here[r.plan].memory.device_total, there[r.plan].memory.device_total)
        assert r.temp == (here[r.plan].memory.temp_size_in_bytes,
                          there[r.plan].memory.temp_size_in_bytes)
        assert r.peak_diff == r.peak[1] - r.peak[0] and r.temp_diff == r.temp[1] - r.temp[0]
    off = rows[list(_PLANS).index("offload")]
    assert off.host_temp[0] == 0 < off.host_temp[1]
    table = both_ways_table(rows).splitlines()
    assert table[0].split()[:3] == ["plan", "peak", jax.default_backend()]
    assert [line.split()[0] for line in table[1:]] == list(_PLANS)


def test_abstract_step_cannot_be_timed() -> None:
    from remat_common.measurement import measure

    with pytest.raises(RematError, match="abstract .* so it can be compiled but not run"):
        measure(_measure_build, {"none": None}, steps=1, warmup=0)
    rep = measure(_measure_build, {"none": None, "recompute": {"mlp": "recompute"}}, steps=0)
    # compiled and traced from shapes: residuals and FLOPs as for a real model
    assert rep["recompute"].device_bytes < rep["none"].device_bytes
    assert rep["recompute"].flop_ratio > 1.0


# -- the tuner on a target ------------------------------------------------------------------------

_LAYERS, _W, _TOK = 3, 512, (8, 512)


def _stack_at(batch: int, layers: int = _LAYERS):
    """:func:`_stack_build` with a batch of ``batch`` sequences (and ``layers`` layers)."""
    return functools.partial(_stack_build, batch=batch, layers=layers)


def _stack_build(plan, batch: int = _TOK[0], layers: int = _LAYERS):
    """Three residual MLP layers ``blocks.{i}``, bf16, abstract (compiled from shapes)."""
    from remat_common import compile_plan, resolve
    from remat_common.adapter import call_module
    from remat_common.measurement import MeasureTarget

    paths = ["blocks", *(f"blocks.{i}" for i in range(layers))]
    compiled = None if plan is None else compile_plan(resolve(plan, paths))

    def layer(w, x):
        h = jax.ad_checkpoint.checkpoint_name(jnp.tanh(x @ w[0]), "h")
        return x + h @ w[1]

    def loss(ws, x):
        for i in range(layers):
            x = (layer(ws[i], x) if compiled is None
                 else call_module(compiled, f"blocks.{i}", layer, ws[i], x))
        return jnp.mean(x.astype(jnp.float32) ** 2)

    def step(ws, x):
        return ws - 0.1 * jax.grad(loss)(ws, x).astype(ws.dtype)

    args = (jax.ShapeDtypeStruct((layers, 2, _W, _W), jnp.bfloat16),
            jax.ShapeDtypeStruct((batch, _TOK[1], _W), jnp.bfloat16))
    return MeasureTarget(loss, args, step, args, compiled)


@needs_gpu
@pytest.mark.target
def test_tune_on_a_gpu_target_never_over_its_budget() -> None:
    """The search on the H100 target's compiler: at five budgets from full recompute's peak to
    save-all's (the target's peaks), the tuned plan's peak is within the budget and its FLOPs
    within 2 % of the best of all 8 assignments of two choices to the three layers; the
    default budget is the device memory minus the stated reserve. (Three choices, 27
    assignments, took 63-217 s of the target stage for the same proof.)"""
    from remat_common import tune
    from remat_common.internal import assignment_plan

    names = ("save", "recompute")
    choices = {n: n for n in names}
    every = {"+".join(a): assignment_plan("blocks", a, choices)
             for a in itertools.product(names, repeat=_LAYERS)}
    cache: dict = {}
    full = tune(_stack_build, "1TiB", choices=list(names[1:]), plans=every, cache=cache,
                max_compiles=100, accelerator="h100")
    space = [p for p in full.points if p.source == "extra"]
    assert len(space) == 8 and not any(p.estimated for p in full.points)
    low, high = full["recompute"].peak, full["save"].peak
    assert low < high
    for k in range(5):
        budget = low + (high - low) * k // 4
        r = tune(_stack_build, budget, choices=list(names[1:]), cache=cache, accelerator="h100")
        assert r.best is not None and r.best.peak <= budget, r.message
        best = min((p for p in space if p.fits(budget)), key=lambda p: p.flops)
        assert r.best.flops <= best.flops * 1.02, (budget, r.best, best)
    d = tune(_stack_build, choices=["recompute"], cache=cache, accelerator="h100")
    assert d.budget == int(84942979072 * 0.75)
    assert any("minus a reserve of 25%" in n and "XLA_PYTHON_CLIENT_MEM_FRACTION" in n
               for n in d.notes)
    with pytest.raises(RematError, match="nothing runs on the target"):
        tune(_stack_build, "1GiB", accelerator="h100", measure=2)


@needs_gpu
@pytest.mark.target
def test_tune_on_a_mesh_models_residuals_per_device() -> None:
    """The tuner's per-layer model sets residual bytes against compiled peaks, which are per
    device: on a batch split over two H100s, a point's residuals are half the whole batch's (the
    report's). Whole-batch residuals against per-device peaks predicted -20 GiB to 277 GiB for
    plans that compiled to 51-62 GiB on the Llama-3-8B config for h100x8 (fsdp=8)."""
    from remat_common import tune
    from remat_common.measurement import measure

    plans = {"save": {"blocks.*": "save"}}
    rep = measure(_stack_build, plans, accelerator="h100x2", mesh="data=2")
    r = tune(_stack_build, "1TiB", choices=["recompute"], accelerator="h100x2", mesh="data=2")
    assert rep["save"].device_bytes > 0 and r["save"].peak == rep["save"].memory.device_total
    assert r["save"].device_bytes == rep["save"].device_bytes // 2, (r["save"], rep["save"])


def _deep_stack(plan):
    """An Equinox stack of 8 residual MLP layers (width 256, batch 1024) run as one scan
    (``erp.Stacked``), with an SGD step: a deep scanned stack that compiles in about a second."""
    from fixtures.nested_models import build
    from remat_common.measurement import MeasureTarget

    loss, args, compiled = build("equinox", 8, 256, 1024, plan)

    def step(params, x):
        grads = jax.grad(loss)(params, x)
        return jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grads)

    return MeasureTarget(loss, args, step, args, compiled)


@needs_gpu
@pytest.mark.target
def test_tune_on_a_deep_scan_compiles_no_one_layer_transients() -> None:
    """On a scan of 8 layers the search compiles no one-layer-last transient (a one-layer run's
    transient is taken as a longer run's), never returns a plan over the budget on the H100
    target's compiler, and shows how far its model was from the compiler (the calibration
    error of each plan it compiled, and of the chosen one)."""
    pytest.importorskip("equinox")
    from remat_common import tune

    cache: dict = {}
    for mib in (44, 32, 38):  # save-all: 49.3 MiB, full recompute 25.3 MiB
        r = tune(_deep_stack, f"{mib}MiB", choices=["recompute"], accelerator="h100", cache=cache)
        assert r.best is not None and r.best.peak <= mib * 2**20, r.message
        assert not any(p.name.endswith("x1-last") for p in r.points)
        assert any("one-layer-last transients were not compiled" in n for n in r.notes)
    # at 38 MiB the search compiles plans the model proposed: how far off it was, each and chosen
    assert r.calibration and all(c == r[n].peak for n, _, c, _ in r.calibration)
    assert all(e == pytest.approx((c - p) / p) for _, p, c, e in r.calibration)
    [note] = [n for n in r.notes if n.startswith("calibration error")]
    assert r.best.predicted_peak is not None and f"for {r.chosen}, predicted" in note
    assert r.to_json()["calibration"][0]["name"] == r.calibration[0][0]


# -- capacity: the largest batch that fits ---------------------------------------------------------

@pytest.mark.cpu_figures(
    "a CPU has no device memory to take a budget from (a TPU has)")
def test_capacity_without_a_budget_needs_an_accelerator() -> None:
    """On this machine there is no device memory to take a budget from: the error says to give
    one (or an accelerator), and with one the search runs (one compile: the limit is the start)."""
    from remat_common.measurement import capacity

    plans = {"recompute": {"blocks.*": "recompute"}}
    with pytest.raises(RematError, match=r"capacity: give a budget \('12GiB'\), or an accelerator"):
        capacity(_stack_at, None, plans, start=4)
    (r,) = capacity(_stack_at, "1GiB", plans, start=4, limit=4)
    assert (r.largest, r.compiles) == (4, 1) and r.peak is not None and r.peak <= 2**30


@needs_gpu
@pytest.mark.target
def test_capacity_on_a_gpu_target(tmp_path) -> None:
    """The largest batch per plan on two GPUs (an H100 config with 256 MiB): batches step by the
    2 devices they split over (a step that does not split is refused, naming one that does), the
    budget defaults to the memory minus the reserve, each answer's compiled peak is within the
    budget and the next batch's over it, in at most 5 compiles per plan (start included)."""
    from remat_common.internal import size_step
    from remat_common.measurement import capacity

    acc = _h100_with(tmp_path, 256) + ":2"
    plans = {"save": None, "recompute": {"blocks.*": "recompute"}}
    assert size_step(acc, None, None) == 2 and size_step(None, None, None) == 1
    with pytest.raises(RematError, match=r"(?s)step=3: a batch must split over the 2 devices.*"
                                         r"Fix: step=2"):
        capacity(_stack_at, None, plans, start=8, step=3, accelerator=acc)
    rows = capacity(_stack_at, None, plans, start=8, step=2, accelerator=acc, reserve=0.4)
    budget = int(256 * 2**20 * 0.6)
    for r in rows:
        assert r.largest % 2 == 0 and r.peak is not None and 0 < r.peak <= budget, r
        assert r.next == r.largest + 2 and r.next_peak is not None and r.next_peak > budget, r
        assert r.next_why is not None and r.next_why.startswith("over the budget") and r.compiles <= 5
    assert rows[1].largest > rows[0].largest  # recompute keeps less per sequence


@needs_tpu
@pytest.mark.target
def test_capacity_on_a_tpu_topology() -> None:
    """The largest batch on a v5e slice (4 chips: batches in steps of 4) under 1 GiB, one layer
    (XLA:TPU compiles take seconds): within the budget, the next step over it. A batch the
    compiler refuses (out of HBM) is a refusal, not a crash, and does not fit."""
    from remat_common.measurement import capacity, measure

    plans = {"recompute": {"blocks.*": "recompute"}}
    (r,) = capacity(lambda b: _stack_at(b, layers=1), "1GiB", plans, start=512,
                    accelerator="v5e:2x2")
    assert r.largest % 4 == 0 and r.peak is not None and r.peak <= 2**30, r
    assert r.next == r.largest + 4 and r.next_peak is not None and r.next_peak > 2**30, r
    assert r.compiles <= 6
    with pytest.raises(RematError, match="v5e:2x2 compiler refused every plan .* RESOURCE_EXHAUSTED"):
        measure(_stack_at(65536, layers=1), plans, accelerator="v5e:2x2")
    # among others, a refused plan is a row of the report (it ended the report before): no
    # figures, does not fit; the baseline it would have been falls to the first plan compiled
    rep = measure({"huge": _stack_at(65536, layers=1)(None), "small": _stack_at(512, layers=1)(None)},
                  accelerator="v5e:2x2")
    assert rep.names == ("small",) and rep.baseline == "small"
    (refused,) = rep.refused
    assert refused.name == "huge" and refused.error.startswith("RESOURCE_EXHAUSTED"), refused
    assert Report.from_json(json.loads(json.dumps(rep.to_json()))).refused == rep.refused
    text = render_text(rep, width=220)
    assert re.search(r"huge +(│ +- +){6}│ NO \(refused\)", text), text
    assert ("huge: REFUSED: the v5e:2x2 compiler refused the step as out of its device memory, so it "
            "does not fit and has no figures (the ratios are against 'small'): RESOURCE_EXHAUSTED"
            in text)


# -- abstract models: real sizes on a small machine -----------------------------------------------

_RSS_SCRIPT = """
import json, resource, sys
sys.path.insert(0, {example!r})
import jax
jax.config.update("jax_numpy_dtype_promotion", "standard")
import model
from remat_common import Plan
from remat_common.measurement import measure
build = lambda plan: model.measure_target(plan, batch=1, preset="llama3-70b", abstract=True,
                                          n_layers=2, seq_len=128)
rep = measure(build, {{"recompute": {{"blocks.*": "recompute"}}}}, steps=0)
m = rep["recompute"].memory
print(json.dumps({{"arguments": m.argument_size_in_bytes,
                  "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}}))
"""


@pytest.mark.slow
@pytest.mark.tooling  # two processes of ~45 s: once (stage 1) is enough
@pytest.mark.parametrize("example", ["nnx_gpt", "eqx_gpt"])
def test_a_model_larger_than_ram_compiles_from_shapes(example) -> None:
    """Two layers of Llama-3-70B's shape with its 128k vocabulary and AdamW: a training state of
    45 GB (more than this 24 GiB machine holds) compiled from shapes on the local CPU, in a fresh
    process whose peak RSS stays under 4 GiB: nothing the size of the model is allocated."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("flax")
    pytest.importorskip("equinox")
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", _RSS_SCRIPT.format(
        example=str(root / "examples" / example))], capture_output=True, text=True, timeout=600,
        env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["arguments"] > 40 * 10**9  # parameters and both AdamW moments, float32
    assert got["rss"] < 4 * 2**30, got


def test_a_missing_compiler_is_an_error_with_the_install_line(monkeypatch) -> None:
    """Where the compiler is not installed (here made so, to test it on every machine), asking for
    its target says so, with the line that installs it, before anything is traced."""
    import sys

    _accelerators = sys.modules[parse_accelerator.__module__]  # where compile_for looks the check up

    monkeypatch.setattr(_accelerators, "compiler_available",
                        lambda platform: f"the {platform} compiler is not installed")
    monkeypatch.setattr(_accelerators, "_TOPOLOGIES", {})
    for name, extra in (("v5e:2x2", "target-tpu"), ("h100x8", "target-gpu")):
        with pytest.raises(RematError) as e:
            compile_for(_grad(None), _ARGS, name)
        msg = str(e.value)
        assert f"accelerator {name}: cannot compile for" in msg
        assert f"pip install 'jax-remat-plan[{extra}]'" in msg and jax.__version__ in msg


def test_libtpu_in_use_elsewhere_says_so(monkeypatch) -> None:
    """libtpu serves one process at a time: a TPU compile while another runs was 'refused the
    topology ... give a topology it supports', a fix that cannot help. It says what happened."""
    import sys

    from jax.experimental import topologies

    _accelerators = sys.modules[parse_accelerator.__module__]

    def locked(**kwargs):
        raise RuntimeError("ABORTED: Internal error when accessing libtpu multi-process lockfile. "
                           'Run "$ sudo rm /tmp/libtpu_lockfile".')

    monkeypatch.setattr(_accelerators, "compiler_available", lambda platform: None)
    monkeypatch.setattr(_accelerators, "_TOPOLOGIES", {})
    monkeypatch.setattr(topologies, "get_topology_desc", locked)
    with pytest.raises(RematError, match=r"accelerator v5p:2x2x2: libtpu is in use by another "
                       r"process on this machine .* Fix: wait for that process to end"):
        compile_for(_grad(None), _ARGS, "v5p:2x2x2")
