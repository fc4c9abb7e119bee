"""The distribution as a user gets it: the wheel and the sdist built from this checkout, each
installed into a clean virtual environment (no repository on ``sys.path``), where ``remat doctor``
runs, ``remat report`` measures a model outside the repository, a shipped preset loads by name, and
the sdist's own tests run. Dependencies install with uv from its cache where it can (offline), at
the versions of the environment running this suite.
"""

from __future__ import annotations

import os
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


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The sdist and the wheel (built from the sdist, as an index's users get it), and a
    constraints file pinning this environment's versions."""
    uv = _uv()
    out = tmp_path_factory.mktemp("dist")
    src = tmp_path_factory.mktemp("src")
    # build from a copy of the tracked files, so the build leaves nothing in the checkout
    files = _run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                 cwd=ROOT).stdout.split("\0")
    for f in filter(None, files):
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
    assert not any(n.startswith(("tests/", "fixtures/", "examples/")) for n in names)
    meta = zipfile.ZipFile(dist["wheel"]).read(
        next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: Apache-2.0" in meta and "Project-URL: Documentation" in meta
    assert "Classifier: Typing :: Typed" in meta and "Keywords: jax," in meta
    all_extra = [ln for ln in meta.splitlines() if ln.endswith('extra == "all"')]
    assert all_extra and not any("pytest" in ln or "mypy" in ln for ln in all_extra), all_extra
    top = {n.split("/", 1)[1] for n in tarfile.open(dist["sdist"]).getnames() if "/" in n}
    assert {"LICENSE", "conftest.py", "fixtures/tolerance.py", "tests/conftest.py",
            "tests/test_plan.py"} <= top
    license_text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in license_text and "END OF TERMS AND CONDITIONS" in license_text


@pytest.mark.parametrize("kind", ["wheel", "sdist"])
def test_installed_in_a_clean_venv(kind: str, dist: dict[str, Path], tmp_path: Path) -> None:
    """``remat doctor``, a ``remat report`` on a model outside the repository, a preset by name,
    and (sdist) a few of the sdist's own test files, run from the unpacked sdist against the
    installed package."""
    uv = str(dist["uv"])
    venv = tmp_path / "venv"
    _run([uv, "venv", "--python", sys.executable, str(venv)])
    py = venv / "bin" / "python"
    _install(uv, venv, [f"{dist[kind]}[report]", "pytest"], dist["constraints"])
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"
    work = tmp_path / "user"
    work.mkdir()
    where = _run([str(py), "-c", "import remat_common, sys; print(remat_common.__file__)"],
                 cwd=work, env=env).stdout.strip()
    assert where.startswith(str(venv)), where  # the installed package, not the checkout

    doctor = _run([str(venv / "bin" / "remat"), "doctor"], cwd=work, env=env).stdout
    assert "jax" in doctor

    shutil.copy(OUTSIDE_MODEL, work / "mymodel.py")
    (work / "report.yaml").write_text(
        "target: mymodel.py:measure_target\nmodel: {d_model: 16, n_layers: 2}\nbatch: 4\n"
        "plans: {none: null, recompute: {\"layers.*\": recompute}}\n")
    report = _run([str(venv / "bin" / "remat"), "report", "report.yaml", "--json", "r.json"],
                  cwd=work, env=env).stdout
    assert "recompute" in report and (work / "r.json").stat().st_size > 0

    preset = _run([str(py), "-c", "import remat_common as rc; "
                   "print(rc.Plan.preset('maxtext:minimal_offloaded').rules[0].pattern)"],
                  cwd=work, env=env).stdout.strip()
    assert preset == "blocks.*"

    if kind == "sdist":
        with tarfile.open(dist["sdist"]) as t:
            t.extractall(tmp_path / "unpacked", filter="data")
        (top,) = (tmp_path / "unpacked").iterdir()
        tests = _run([str(py), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                      "tests/test_plan.py", "tests/test_annotation.py", "docs/semantics.md"],
                     cwd=top, env=env).stdout
        assert " passed" in tests and "failed" not in tests, tests
