"""``remat doctor`` and ``remat_common.manifest``: every field, floors, ``--require`` exit codes,
and the documented attribute path of the 0.11 policy classes."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import json
import re
import sys
import tomllib
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import remat_common
from remat_common import (
    Plan,
    PlanError,
    capabilities,
    compile_plan,
    manifest,
    resolve,
    saved_residuals,
)
from remat_common.internal import (
    DISTRIBUTIONS,
    FEATURES,
    FLOORS,
    JAX_RANGE,
    OPTIONAL,
    diagnose,
    installed_versions,
    main,
    parse_version,
)
from remat_common.measurement import compiler_identity
from fixtures.tolerance import assert_close

pytestmark = pytest.mark.compat  # nothing here needs Flax or Equinox; runs under jax 0.12 too

ROOT = Path(__file__).parent.parent
_V011 = jax.__version__.startswith("0.11.")
_POLICY_CLASSES = ("SaveOnlyTheseNames", "SaveAnyNamesButThese", "SaveAndOffloadOnlyTheseNames")


def _doctor_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict]:
    code = main(["doctor", "--json", *args])
    return code, json.loads(capsys.readouterr().out)


def _expected_features(remat3: bool) -> dict[str, bool]:
    """Each feature re-derived from JAX directly (not through capabilities())."""
    dev = jax.devices()[0]
    kinds = {m.kind for m in dev.addressable_memories()}
    probe = jax.checkpoint(  # the backward pass needs the named value, and keeps only it
        lambda x: jnp.sum(jnp.cos(jax.ad_checkpoint.checkpoint_name(jnp.sin(x), "p") * 2.0)),
        policy=jax.checkpoint_policies.save_only_these_names("p"))
    has_sr = saved_residuals(probe, jnp.ones(3)).names() == frozenset({"p"})
    return {
        "custom_remat": hasattr(jax, "custom_remat") and remat3,
        "inline": hasattr(jax, "Inline"),
        "offload": "pinned_host" in kinds,
        "offload_placed": jax.default_backend() in ("gpu", "cuda", "rocm", "tpu")
                          and "pinned_host" in kinds,
        "policy_classes": all(hasattr(jax.checkpoint_policies, n) for n in _POLICY_CLASSES),
        "remat3": remat3,
        "saved_residuals": has_sr,
    }


def test_doctor_json_has_every_field(capsys: pytest.CaptureFixture[str]) -> None:
    code, d = _doctor_json(capsys)
    assert set(d) == {"ok", "remat_common", "capabilities", "versions", "floors", "features",
                      "required", "unmet", "problems", "targets"}
    assert {k.split(" ")[0] for k in d["targets"]} == {"local", "cuda", "tpu"}
    assert all(set(v) == {"available", "why_not"} for v in d["targets"].values())
    caps = capabilities()
    assert d["capabilities"] == caps.to_json()
    assert {f.name for f in dataclasses.fields(caps)} | {"custom_remat_usable",
                                                        "host_offload_placed"} <= set(d["capabilities"])
    assert d["capabilities"]["backend"] == jax.default_backend()
    assert d["capabilities"]["remat3"] is bool(jax.config.jax_remat3)
    assert d["capabilities"]["python"] == ".".join(map(str, sys.version_info[:3]))
    assert list(d["versions"]) == list(DISTRIBUTIONS)
    assert d["versions"]["jax"] == jax.__version__
    assert d["versions"]["numpy"] == np.__version__
    for dist in DISTRIBUTIONS[2:]:
        try:
            want = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            want = None
        assert d["versions"][dist] == want, dist
    assert d["floors"] == {
        "python": ">=3.12", "numpy": ">=2.1", "scipy": ">=1.15", "jax": ">=0.11.0,<0.13",
        "flax": ">=0.12.8,<0.13", "equinox": ">=0.13.8,<0.14", "optax": ">=0.2.8,<0.3",
        "orbax-checkpoint": ">=0.12.8,<0.13", "rich": ">=13,<16", "matplotlib": ">=3.9,<4",
    }
    want = _expected_features(bool(jax.config.jax_remat3))
    assert {n: f["available"] for n, f in d["features"].items()} == want
    assert all(f["meaning"] for f in d["features"].values())
    assert (d["required"], d["unmet"]) == ([], [])
    for p in d["problems"]:
        assert set(p) == {"severity", "code", "message", "fix"}
        assert p["severity"] in ("error", "warning", "note") and p["message"] and p["fix"]
    floors_met = (sys.version_info[:2] >= (3, 12) and parse_version(np.__version__) >= parse_version("2.1"))
    assert code == (0 if floors_met and d["ok"] else 1)
    assert d["ok"] is (not any(p["severity"] == "error" for p in d["problems"]))


@pytest.mark.parametrize("feature", sorted(FEATURES))
def test_require_exit_code_follows_the_feature(
    capsys: pytest.CaptureFixture[str], remat3: bool, feature: str
) -> None:
    available = _expected_features(remat3)[feature]
    code, d = _doctor_json(capsys, "--require", feature)
    assert d["required"] == [feature]
    assert d["unmet"] == ([] if available else [feature])
    base_ok = not any(p["severity"] == "error" and not p["code"].startswith("require:")
                      for p in d["problems"])
    assert code == (0 if available and base_ok else 1)
    errors = [p for p in d["problems"] if p["code"] == f"require:{feature}"]
    assert len(errors) == (0 if available else 1)
    if errors:
        assert errors[0]["severity"] == "error"
        assert errors[0]["fix"] == FEATURES[feature].fix(capabilities())


def test_require_custom_remat_needs_remat3(capsys: pytest.CaptureFixture[str], remat3: bool) -> None:
    code, d = _doctor_json(capsys, "--require", "offload,custom_remat", "--require", "inline")
    assert d["required"] == ["offload", "custom_remat", "inline"]
    usable = hasattr(jax, "custom_remat") and remat3
    assert ("custom_remat" in d["unmet"]) is (not usable)
    if hasattr(jax, "custom_remat") and not remat3:
        (p,) = [p for p in d["problems"] if p["code"] == "require:custom_remat"]
        assert "jax.config.update('jax_remat3', True)" in p["fix"] and "JAX_REMAT3=1" in p["fix"]
    assert code == (0 if not d["unmet"] and d["ok"] else 1)


def test_require_unknown_feature_lists_the_allowed(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--require", "custom_remat,ofload"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("remat doctor: error: unknown feature 'ofload' in require. Allowed: "
                          "'custom_remat', 'inline', 'offload', 'offload_placed', "
                          "'policy_classes', 'remat3', 'saved_residuals'.")


def test_floors_each_reported_with_a_fix() -> None:
    caps = dataclasses.replace(capabilities(), python="3.11.9", numpy="2.0.2", scipy="1.14.1",
                               jax="0.10.7", jaxlib="0.10.7")
    d = diagnose(caps, installed_versions())
    errors = {p.code: p for p in d.problems if p.severity == "error"}
    assert set(errors) == {"floor:python", "floor:numpy", "floor:scipy", "floor:jax"}
    assert errors["floor:python"].message == "python 3.11.9 is below the JAX 0.11 floor >=3.12."
    assert errors["floor:numpy"].message == "numpy 2.0.2 is below the JAX 0.11 floor >=2.1."
    assert errors["floor:numpy"].fix == "pip install 'numpy>=2.1'."
    assert errors["floor:scipy"].fix == "pip install 'scipy>=1.15'."
    assert errors["floor:jax"].message == "jax 0.10.7 is outside the supported range >=0.11.0,<0.13."
    assert not d.ok and d.problems[:4] == tuple(errors.values())  # errors first


def test_floors_exactly_met_and_missing() -> None:
    caps = dataclasses.replace(capabilities(), python="3.12.0", numpy="2.1.0", scipy="1.15.0")
    assert not [p for p in diagnose(caps).problems if p.code.startswith("floor:")]
    d = diagnose(dataclasses.replace(caps, scipy=None))
    (p,) = [p for p in d.problems if p.code == "floor:scipy"]
    assert p.message == "scipy is not installed; JAX 0.11 needs scipy>=1.15."
    assert not d.ok


def test_cli_exit_code_follows_the_floors(monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    old = dataclasses.replace(capabilities(), numpy="1.26.4", scipy="1.15.0")  # numpy alone
    monkeypatch.setattr("remat_common._tooling.doctor._doctor.capabilities", lambda: old)
    assert main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert "[error] numpy 1.26.4 is below the JAX 0.11 floor >=2.1." in out
    assert "      fix: pip install 'numpy>=2.1'." in out
    assert re.search(r"remat doctor: FAILED \(1 error\(s\), \d+ warning\(s\), \d+ note\(s\)\)$",
                     out.strip())


def test_optional_packages_and_jax_versions() -> None:
    caps = capabilities()
    versions = {**installed_versions(), "flax": None, "equinox": "0.12.0"}
    d = diagnose(caps, versions)
    by_code = {p.code: p for p in d.problems}
    assert by_code["missing:flax"].severity == "note"
    assert by_code["missing:flax"].fix == (
        "only needed for the 'flax' extra: pip install 'jax-remat-plan[flax]'.")
    assert by_code["range:equinox"].severity == "warning"
    assert by_code["range:equinox"].fix == "pip install 'equinox>=0.13.8,<0.14'."
    old = diagnose(dataclasses.replace(caps, jax="0.11.0", jaxlib="0.11.0"))
    assert [p.severity for p in old.problems if p.code == "jax-0.11.0"] == ["warning"]
    assert "XLA_FLAGS=--xla_disable_hlo_passes=cse" in {p.code: p for p in old.problems}[
        "jax-0.11.0"].fix
    new = diagnose(dataclasses.replace(caps, jax="0.12.0.1", jaxlib="0.12.0", custom_remat=False,
                                       policy_classes=False))
    assert [p.severity for p in new.problems if p.code == "jax-0.12"] == ["note"]
    assert not [p for p in new.problems if p.code == "jaxlib-mismatch"]
    no_host = diagnose(dataclasses.replace(caps, memory_kinds=("device",)), require=["offload"])
    codes = {p.code: p.severity for p in no_host.problems}
    assert codes["no-host-memory"] == "warning" and codes["require:offload"] == "error"


def test_declared_ranges_match_pyproject() -> None:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def spec(reqs: list[str], dist: str) -> str:
        (s,) = [r[len(dist):] for r in reqs if re.match(rf"{re.escape(dist)}[<>=]", r)]
        return s

    def fmt(v: tuple[int, ...]) -> str:
        return ".".join(map(str, v))

    assert meta["requires-python"] == f">={fmt(FLOORS['python'])}"
    assert spec(meta["dependencies"], "numpy") == f">={fmt(FLOORS['numpy'])}"
    assert spec(meta["dependencies"], "jax") == f">={fmt(JAX_RANGE[0])},<{fmt(JAX_RANGE[1])}"
    extras = meta["optional-dependencies"]
    # The extras declare floors only (a library does not cap what it has not seen break); the
    # doctor's upper bound is the tested range's, and outside it the doctor warns, nothing refuses.
    for dist, (lo, _hi, extra) in OPTIONAL.items():
        assert spec(extras[extra], dist) == f">={fmt(lo)}", dist


def test_text_report_sections(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["doctor"])
    out = capsys.readouterr().out
    for heading in ("Versions", "Backend", "JAX remat surface", "Features (--require)"):
        assert f"\n{heading}\n" in out
    for dist in DISTRIBUTIONS:
        assert re.search(rf"^  {re.escape(dist)} +\S", out, re.M), dist
    assert re.search(rf"^  jax_remat3 +{'on' if jax.config.jax_remat3 else 'off'}$", out, re.M)
    assert out.rstrip().splitlines()[-1].startswith("remat doctor: OK" if code == 0 else
                                                    "remat doctor: FAILED")


# -- manifest -------------------------------------------------------------------------------------
_PLAN = {"layers.0": "recompute", "layers.1": {"save": ["h"], "offload": ["x"]}}
_PATHS = ["", "layers", "layers.0", "layers.1"]


def test_manifest_fields_and_json() -> None:
    m = manifest()
    assert set(m) == {"remat_manifest", "remat_common", "platform", "versions", "capabilities",
                      "compiler", "jax_config", "env", "plan"}
    assert m["compiler"] == compiler_identity().to_json()  # the process's compiler, named
    assert m["compiler"]["description"].startswith("XLA:")
    assert json.loads(json.dumps(m)) == m
    assert m["plan"] is None and m["remat_manifest"] == 1
    assert m["remat_common"] == remat_common.__version__
    assert m["versions"]["python"] == ".".join(map(str, sys.version_info[:3]))
    assert m["versions"]["jax"] == jax.__version__
    assert list(m["versions"])[1:] == list(DISTRIBUTIONS)
    assert m["capabilities"] == capabilities().to_json()
    assert m["jax_config"]["jax_remat3"] is bool(jax.config.jax_remat3)
    assert m["jax_config"]["jax_numpy_dtype_promotion"] == jax.config.jax_numpy_dtype_promotion
    assert manifest() == m  # deterministic: no timestamps


def test_manifest_tells_runs_apart(remat3: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    m = manifest()
    assert m["capabilities"]["remat3"] is remat3 and m["jax_config"]["jax_remat3"] is remat3
    monkeypatch.setenv("XLA_FLAGS", "--xla_disable_hlo_passes=cse")
    assert manifest()["env"] == {**m["env"], "XLA_FLAGS": "--xla_disable_hlo_passes=cse"}


def test_manifest_plan_forms(tmp_path: Path) -> None:
    plan = Plan.from_mapping(_PLAN)
    res = resolve(plan, _PATHS)
    compiled = compile_plan(res)
    f = tmp_path / "plan.json"
    f.write_text(json.dumps(plan.to_config()))
    sections = {name: manifest(p)["plan"] for name, p in
                [("plan", plan), ("mapping", _PLAN), ("file", str(f)), ("resolution", res),
                 ("compiled", compiled)]}
    for name, s in sections.items():
        assert s["fingerprint"] == plan.fingerprint(), name
        assert s["config"] == plan.to_config(), name
        assert json.loads(json.dumps(s)) == s
    assert sections["plan"]["boundaries"] is None and sections["file"]["source"] == str(f)
    got = {b["path"]: (b["kind"], b["save"], b["offload"], b["policy"])
           for b in sections["compiled"]["boundaries"]}
    assert got == {
        "layers.0": ("recompute", [], [], "nothing_saveable"),
        "layers.1": ("names", ["h", "layers.1/h"], ["layers.1/x", "x"],
                     "SaveAndOffloadOnlyTheseNames" if capabilities().policy_classes
                     else "save_and_offload_only_these_names"),
    }
    assert [b["policy"] for b in sections["resolution"]["boundaries"]] == [None, None]
    other = manifest({"layers.*": "recompute"})["plan"]["fingerprint"]
    assert other != plan.fingerprint()
    with pytest.raises(PlanError, match="cannot make a plan from int 3"):
        manifest(3)


# -- the documented attribute path of the 0.11 policy classes ------------------------------------
@pytest.mark.skipif(not _V011, reason="the policy classes exist on JAX 0.11.x (0.12 removed them)")
def test_policy_classes_by_attribute_on_0_11() -> None:
    cp = jax.checkpoint_policies
    for name in _POLICY_CLASSES:
        cls = getattr(cp, name)
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen, name
    with pytest.raises(ModuleNotFoundError, match="jax.checkpoint_policies"):
        importlib.import_module("jax.checkpoint_policies")
    with pytest.raises(ModuleNotFoundError):
        exec("from jax.checkpoint_policies import SaveOnlyTheseNames", {})  # noqa: S102
    assert capabilities().policy_classes and not capabilities().checkpoint_policies_importable

    # And the class reached that way does what it says: only the named value is kept.
    def f(x):
        h = jax.ad_checkpoint.checkpoint_name(jnp.sin(x), "h")
        return jnp.sum(jnp.cos(jax.ad_checkpoint.checkpoint_name(h * 2, "g")))

    x = jnp.linspace(0.0, 1.0, 8)
    g = jax.checkpoint(f, policy=cp.SaveOnlyTheseNames(frozenset({"h"})))
    assert saved_residuals(g, x).names() == frozenset({"h"})
    assert_close(jax.grad(g)(x), jax.grad(f)(x))


@pytest.mark.skipif(_V011, reason="checks that JAX 0.12 removed the policy classes")
def test_policy_classes_gone_after_0_11() -> None:  # pragma: no cover - needs JAX 0.12
    cp = jax.checkpoint_policies
    assert not any(hasattr(cp, n) for n in _POLICY_CLASSES)
    assert not capabilities().policy_classes
    assert hasattr(cp, "save_only_these_names")


def test_a_command_without_its_extra_names_the_install_line(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`remat report` needs the `report` extra; without it, one line says how to install it."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "rich" else real(name, *a))
    assert main(["report", "report.yaml"]) == 2
    err = capsys.readouterr().err
    assert "remat report: needs rich (its tables and progress bar), which cannot be imported" in err
    assert "pip install 'jax-remat-plan[report]'" in err
