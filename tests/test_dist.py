"""The distribution as a user gets it: the wheel and the sdist built from this checkout (or from
an unpacked sdist: its files), installed into a clean virtual environment (no repository on
``sys.path``): ``remat doctor``, ``remat report`` on a model outside the
repository, a shipped preset by name, the shipped docs (``remat docs``), and a shipped example
config by name (``example:nnx_gpt``: refused with the extras to install, then, those installed,
reported and tuned), and the sdist's own tests against the installed package (every test module
collects; the core's tests and the doctests run). The wheel is built from the sdist, as
installing the sdist does, so one environment checks both.
Dependencies install with uv from its cache where it can (offline), at the versions of the
environment running this suite.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.tooling

#: The user's model, copied out of the repository: plain JAX, layers at ``layers.<i>``.
OUTSIDE_MODEL = ROOT / "tests" / "data" / "report_target.py"
#: The sdist's tests run in its clean environment (core and ``[report]``): the core's unit tests,
#: the package's and the docs' doctests (where a framework is missing, conftest.py leaves out what
#: needs it); every other test module is collected.
SDIST_TESTS = ("common", "docs", "tests/test_plan.py", "tests/test_annotation.py",
               "tests/test_resolve.py", "tests/test_plan_schema.py", "tests/test_docs_links.py",
               "tests/test_jaxcompat.py", "tests/test_readme.py")
#: ``remat report``/``tune`` on a shipped example at a size that compiles in seconds.
EXAMPLE_TINY = ["--size", "n_layers=1", "d_model=32", "n_heads=2", "seq_len=16", "batch=2"]


def _uv() -> str:
    for c in (ROOT / ".venv-tools" / "bin" / "uv", shutil.which("uv")):
        if c and Path(c).is_file():
            return str(c)
    pytest.skip("no uv here (./scripts/test fetches it into .venv-tools)")


def _run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, **kw)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def _install(uv: str, venv: Path, what: list[str], constraints: Path) -> None:
    """``uv pip install`` into ``venv``: offline from the cache first, then from the index."""
    base = [uv, "pip", "install", "--python", str(venv / "bin" / "python"), "-c", str(constraints)]
    if subprocess.run([*base, "--offline", *what], capture_output=True).returncode != 0:
        _run([*base, *what])


def _sources() -> list[str]:
    """The files a build takes: in a git checkout, the tracked ones and the untracked ones git does
    not ignore; elsewhere (an unpacked sdist) every file but environments and build outputs."""
    if (ROOT / ".git").exists():
        return [f for f in _run(["git", "ls-files", "-z", "--cached", "--others",
                                 "--exclude-standard"], cwd=ROOT).stdout.split("\0") if f]
    skip = ("__pycache__", "build", "dist", ".pytest_cache")
    return sorted(str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file() and not any(
        part in skip or part.startswith(".venv") or part.endswith(".egg-info")
        for part in p.relative_to(ROOT).parts))


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The sdist and the wheel (built from the sdist, as an index's users get it), and a
    constraints file pinning this environment's versions."""
    uv = _uv()
    out = tmp_path_factory.mktemp("dist")
    src = tmp_path_factory.mktemp("src")
    # build from a copy of the sources, so the build leaves nothing in the checkout
    for f in _sources():
        if (ROOT / f).is_file():
            (src / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, src / f)
    cmd = [uv, "build", "--out-dir", str(out), str(src)]
    if subprocess.run([*cmd, "--offline"], capture_output=True).returncode != 0:
        _run(cmd)
    freeze = _run([uv, "pip", "freeze", "--python", sys.executable]).stdout
    constraints = out / "constraints.txt"
    constraints.write_text("\n".join(ln for ln in freeze.splitlines()
                                     if ln and not ln.startswith(("-e", "jax-remat-plan"))) + "\n")
    (sdist,) = out.glob("*.tar.gz")
    (wheel,) = out.glob("*.whl")
    return {"sdist": sdist, "wheel": wheel, "constraints": constraints, "uv": Path(uv)}


def test_wheel_and_sdist_carry_the_license_and_the_presets(dist: dict[str, Path]) -> None:
    names = zipfile.ZipFile(dist["wheel"]).namelist()
    assert any(n.endswith("licenses/LICENSE") for n in names)
    assert "remat_common/presets/maxtext/minimal_offloaded.yaml" in names
    # the docs (remat docs) and the example report configs with their targets and plans
    assert {f"remat_common/docs/{p.name}" for p in (ROOT / "docs").glob("*.md")} <= set(names)
    assert "remat_common/README.md" in names
    for example in ("nnx_gpt", "eqx_gpt"):
        assert {f"remat_common/examples/{example}/{f}" for f in (
            "report.yaml", "model.py", "plans/default.yaml", "plans/recompute.yaml")} <= set(names)
    assert not any(n.endswith("train.py") for n in names)
    assert not any(n.startswith(("tests/", "fixtures/", "examples/")) for n in names)
    meta = zipfile.ZipFile(dist["wheel"]).read(
        next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: Apache-2.0" in meta and "Project-URL: Documentation" in meta
    assert "Classifier: Typing :: Typed" in meta and "Keywords: jax," in meta
    all_extra = [ln for ln in meta.splitlines() if ln.endswith('extra == "all"')]
    assert all_extra and not any("pytest" in ln or "mypy" in ln for ln in all_extra), all_extra
    top = {n.split("/", 1)[1] for n in tarfile.open(dist["sdist"]).getnames() if "/" in n}
    assert {"LICENSE", "conftest.py", "setup.py", "fixtures/tolerance.py", "tests/conftest.py",
            "tests/test_plan.py", "docs/semantics.md", "examples/nnx_gpt/model.py"} <= top
    license_text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in license_text and "END OF TERMS AND CONDITIONS" in license_text


def _venv(dist: dict[str, Path], where: Path, what: list[str]) -> tuple[Path, dict[str, str]]:
    """A clean virtual environment with ``what`` installed: its python, and an environment whose
    PATH starts with it (no PYTHONPATH)."""
    uv = str(dist["uv"])
    venv = where / "venv"
    _run([uv, "venv", "--python", sys.executable, str(venv)])
    _install(uv, venv, what, dist["constraints"])
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"
    return venv, env


def test_the_wheel_and_the_sdist_in_a_clean_venv(dist: dict[str, Path], tmp_path: Path) -> None:
    """The wheel, built from the sdist as an index's users get it (so installing the sdist builds
    and installs the same), in one clean environment: ``remat doctor``, a ``remat report`` on a
    model outside the repository, a preset and the docs by name; the sdist's own tests against
    the installed package (every test module collects, what a missing framework needs left out
    by conftest.py; the core's tests and the doctests pass); and a shipped example config,
    refused with the extras its target needs, which, installed, make ``remat tune`` and
    ``remat report`` run on it. One environment for both, and one interpreter for what needs no
    process of its own (each start imports jax): 291 s against 318 s as two tests, one for
    each, run side by side on a loaded 2-core machine."""
    venv, env = _venv(dist, tmp_path, [f"{dist['wheel']}[report]", "pytest"])
    py, remat = str(venv / "bin" / "python"), str(venv / "bin" / "remat")
    work = tmp_path / "user"
    work.mkdir()
    doctor = _run([remat, "doctor"], cwd=work, env=env).stdout
    assert "jax" in doctor

    # one interpreter (each start imports jax): where the package is imported from, a preset,
    # the docs by name and a report on a model outside the repository, each through `remat`'s
    # own entry point (_remat_cli.main, what the console script calls), its output after a mark
    shutil.copy(OUTSIDE_MODEL, work / "mymodel.py")
    (work / "report.yaml").write_text(
        "target: mymodel.py:measure_target\nmodel: {d_model: 16, n_layers: 2}\nbatch: 4\n"
        "plans: {none: null, recompute: {\"layers.*\": recompute}}\n")
    mark = "=== remat "
    script = "; ".join([
        "import _remat_cli, remat_common as rc", "print(rc.__file__)",
        "print(rc.Plan.preset('maxtext:minimal_offloaded').rules[0].pattern)",
        *(f"print({mark!r}, flush=True); assert _remat_cli.main({argv!r}) == 0" for argv in (
            ["docs", "tune#capacity"], ["docs", "semantics", "--path"],
            ["report", "report.yaml", "--json", "r.json"]))])
    head, docs, path, report = _run([py, "-c", script], cwd=work, env=env).stdout.split(
        mark + "\n")
    where, preset = head.split()
    assert where.startswith(str(venv)), where  # the installed package, not the checkout
    assert preset == "blocks.*"
    section = (ROOT / "docs" / "tune.md").read_text().split("\n## Capacity\n", 1)[1]
    assert docs == "## Capacity\n" + section.split("\n## ", 1)[0].rstrip() + "\n"
    path = path.strip()
    assert path.startswith(str(venv)) and Path(path).read_text() == (
        ROOT / "docs" / "semantics.md").read_text()
    assert "recompute" in report and (work / "r.json").stat().st_size > 0

    # the sdist's tests, in the core environment (no flax, equinox, optax or orbax yet)
    _check_the_sdist_tests(dist["sdist"], tmp_path, py, env)

    # a shipped example: without its framework, the message says what to install; installed, it runs
    refused = subprocess.run([remat, "tune", "example:nnx_gpt", "--budget", "1GiB"], cwd=work,
                             env=env, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    fix = "pip install 'jax-remat-plan[flax,examples]'"
    assert f"its target imports flax and optax, not installed. Fix: {fix}" in refused.stderr
    _install(str(dist["uv"]), venv, [f"{dist['wheel']}[flax,examples]"], dist["constraints"])
    tuned = _run([remat, "tune", "example:nnx_gpt", "--budget", "1GiB", "--no-progress",
                  *EXAMPLE_TINY], cwd=work, env=env).stdout
    assert "save fits 1.00 GiB" in tuned and '"blocks.*": save' in tuned, tuned
    report = _run([remat, "report", "example:nnx_gpt", "--plans", "recompute", "--steps", "0",
                   "--json", "example.json", *EXAMPLE_TINY], cwd=work, env=env).stdout
    assert json.loads((work / "example.json").read_text())["plans"][0]["name"] == "recompute"


def _check_the_sdist_tests(sdist: Path, tmp_path: Path, py: str, env: dict[str, str]) -> None:
    """The unpacked sdist's tests against the installed package: every test module collects (a
    collection error fails the session), the core's tests and the doctests (SDIST_TESTS) pass."""
    with tarfile.open(sdist) as t:
        t.extractall(tmp_path / "unpacked", filter="data")
    (top,) = (tmp_path / "unpacked").iterdir()
    # One interpreter and one pytest session (each start imports jax, each session collects):
    # where the package is imported from, then every test module collected and all but
    # SDIST_TESTS deselected, so that those run.
    others = sorted(f"{p.relative_to(top)}::" for p in (top / "tests").rglob("*.py")
                    if str(p.relative_to(top)) not in SDIST_TESTS)
    others += ["flax_remat_plugin/", "equinox_remat_plugin/"]
    args = ["-q", "-p", "no:cacheprovider", "-p", "no:randomly",
            *(f"--deselect={o}" for o in others)]
    out = _run([py, "-c", "import sys, remat_common, pytest; print(remat_common.__file__); "
                f"sys.exit(pytest.main({args!r}))"], cwd=top, env=env).stdout
    where, tests = out.split("\n", 1)
    assert where.startswith(str(Path(py).parents[1])), where
    summary = tests.strip().splitlines()[-1]  # "212 passed, 9 skipped, 1014 deselected in 31s"
    assert re.match(r"\d+ passed", summary) and "failed" not in tests, tests[-3000:]
    assert "error" not in summary, tests[-3000:]
    collected = sum(int(n) for n in re.findall(r"(\d+) (?:passed|skipped|deselected)", summary))
    assert collected > 1000, summary
