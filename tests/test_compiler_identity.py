"""Every figure names its compiler: :func:`compiler_identity` (XLA:CPU in jaxlib, libtpu as JAX
finds it, the CUDA plugins), the report and its JSON, and ``remat report --check`` against a report
from another compiler."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import json
from pathlib import Path

import jax
import pytest

from remat_common.internal import main
from remat_common.measurement import (
    Compiler,
    Report,
    check_report,
    compiler_change,
    compiler_identity,
    render_text,
)

DATA = Path(__file__).parent / "data"
TINY = ["--size", "batch=8", "d_model=16", "n_layers=2", "--steps", "0", "--plans", "none",
        "recompute"]
BUILT = "Built on Jun 17 2026 11:08:48 (1781719728)"  # libtpu 0.0.42.1's, read on a TPU v5e host
JAXLIB = importlib.metadata.version("jaxlib")


def test_cpu_compiler_is_jaxlibs() -> None:
    c = compiler_identity("cpu")
    assert (c.platform, c.jax, c.jaxlib, c.plugins, c.build) == ("cpu", jax.__version__, JAXLIB,
                                                                 (), None)
    assert c.describe() == f"XLA:CPU, jax {jax.__version__} / jaxlib {JAXLIB}"
    assert Compiler.from_json(json.loads(json.dumps(c.to_json()))) == c
    if jax.default_backend() == "cpu":
        assert compiler_identity() == compiler_identity("local") == c


def _fake_libtpu(site: Path, *, version: str | None, built: bool = True) -> Path:
    """A ``libtpu`` package laid out as pip lays it (``libtpu/libtpu.so`` beside
    ``libtpu-VERSION.dist-info``), never loaded: the library holds a build string only."""
    lib = site / "libtpu" / "libtpu.so"
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"\x7fELF" + b"\0" * 64 + (f"{BUILT}\0".encode() if built else b"") + b"\0" * 64)
    if version is not None:
        info = site / f"libtpu-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: libtpu\nVersion: {version}\n")
        (info / "RECORD").write_text(f"libtpu/libtpu.so,,\nlibtpu-{version}.dist-info/METADATA,,\n")
    return lib


def test_tpu_compiler_is_the_library_jax_loads(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a TPU host whose libtpu is found through ``TPU_LIBRARY_PATH`` (no libtpu package in
    the Python that runs): the version from the dist-info beside that library, else its build
    string, else unknown, naming the path. Nothing is loaded, no device is opened."""
    lib = _fake_libtpu(tmp_path / "a", version="0.0.42.1")
    monkeypatch.setenv("TPU_LIBRARY_PATH", str(lib))
    c = compiler_identity("tpu")
    assert c.plugins == (("libtpu", "0.0.42.1"),) and c.build is None
    assert c.describe() == f"XLA:TPU, libtpu 0.0.42.1, jax {jax.__version__} / jaxlib {JAXLIB}"
    assert c.found == f"package metadata of the library at TPU_LIBRARY_PATH={lib}"

    lib = _fake_libtpu(tmp_path / "b", version=None)  # the library alone: its build string
    monkeypatch.setenv("TPU_LIBRARY_PATH", str(lib))
    c = compiler_identity("tpu")
    assert c.plugins == (("libtpu", None),) and c.build == BUILT
    assert c.describe().startswith(f"XLA:TPU, libtpu ({BUILT}), jax")
    assert Compiler.from_json(c.to_json()) == c

    lib = _fake_libtpu(tmp_path / "c", version=None, built=False)
    monkeypatch.setenv("TPU_LIBRARY_PATH", str(lib))
    c = compiler_identity("tpu")
    assert c.plugins == (("libtpu", None),) and c.build is None
    assert c.describe().startswith(f"XLA:TPU, libtpu unknown (the library at TPU_LIBRARY_PATH={lib}: "
                                   "no package metadata beside it, no build string), jax")

    monkeypatch.delenv("TPU_LIBRARY_PATH")
    if importlib.util.find_spec("libtpu") is None:
        c = compiler_identity("tpu")
        assert c.plugins == (("libtpu", None),)
        assert c.found == "not found: no TPU_LIBRARY_PATH, no libtpu package"


def test_a_change_of_compiler_is_said_plainly() -> None:
    old = Compiler("tpu", "0.11.2", "0.11.2", (("libtpu", "0.0.48"),), "package metadata")
    new = dataclasses.replace(old, plugins=(("libtpu", "0.0.42.1"),), found="TPU_LIBRARY_PATH")
    assert compiler_change(old, dataclasses.replace(old, found="elsewhere")) is None
    assert compiler_change(old, new) == ("these figures came from libtpu 0.0.48; this process "
                                         "compiles with libtpu 0.0.42.1")
    cpu = Compiler("cpu", "0.11.2", "0.11.2")
    assert compiler_change(old, cpu) == (
        "these figures came from XLA:TPU, libtpu 0.0.48, jax 0.11.2 / jaxlib 0.11.2; this "
        "process compiles with XLA:CPU, jax 0.11.2 / jaxlib 0.11.2")
    assert compiler_change(None, cpu).startswith("these figures do not name the compiler")


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("compiler") / "r.json"
    assert main(["report", str(DATA / "report.yaml"), *TINY, "--no-progress", "--json",
                 str(out)]) == 0
    return out


def test_the_report_and_its_json_name_the_compiler(stored: Path) -> None:
    data = json.loads(stored.read_text())
    here = compiler_identity()
    assert data["compiler"] == here.to_json() and data["format"] == "remat-report/1"
    assert data["compiler"]["jaxlib"] == JAXLIB and data["compiler"]["jax"] == jax.__version__
    rep = Report.load(stored)
    assert rep.compiler == here and Report.from_json(rep.to_json()) == rep
    text = " ".join(render_text(rep).split())
    assert f"compiled by {here.describe()}" in text  # table title and notes
    data.pop("compiler")  # a report written before reports recorded their compiler
    old = Report.from_json(data)
    assert old.compiler is None and old.plans == rep.plans
    assert f"compiler not recorded (jax {jax.__version__})" in " ".join(render_text(old).split())


def test_check_against_a_report_from_another_compiler(stored: Path) -> None:
    """The figures a libtpu 0.0.48 made, read where 0.0.42.1 compiles (the temps measured on a
    TPU v5e for one plan): the change of compiler, and the plan whose figures moved."""
    rep = Report.load(stored)
    mib = 2**20

    def with_temp(r: Report, name: str, temp: int) -> Report:
        plans = tuple(dataclasses.replace(p, memory=dataclasses.replace(
            p.memory, temp_size_in_bytes=temp)) if p.name == name else p for p in r.plans)
        return dataclasses.replace(r, plans=plans)

    tpu = Compiler("tpu", "0.11.2", "0.11.2", (("libtpu", "0.0.48"),))
    then = with_temp(dataclasses.replace(rep, compiler=tpu), "recompute", int(4613.6 * mib))
    now = with_temp(dataclasses.replace(
        rep, compiler=dataclasses.replace(tpu, plugins=(("libtpu", "0.0.42.1"),))),
        "recompute", int(3714.3 * mib))
    check = check_report(then, now, source="tuned.json")
    lines = check.lines()
    assert lines[0] == ("check against tuned.json: these figures came from libtpu 0.0.48; this "
                        "process compiles with libtpu 0.0.42.1: re-measured, figures below.")
    assert "  none: holds (peak/device, temp, host temp within 1%)" in lines
    assert any(ln.startswith("  recompute: DOES NOT HOLD: ") and
               "temp 4.51 GiB then, 3.63 GiB now (-19.5%)" in ln for ln in lines), lines
    assert not check.holds and check.to_json()["holds"] is False
    assert check_report(now, now).holds and check_report(now, now).change is None


def test_cli_check_says_so_and_fails_when_figures_moved(stored: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    data = json.loads(stored.read_text())
    data["compiler"]["jaxlib"] = "0.11.1"  # another compiler's report, another temp
    data["plans"][1]["memory"]["temp_size_in_bytes"] = int(  # 10 % more, on any backend
        data["plans"][1]["memory"]["temp_size_in_bytes"] * 1.1) + 4096
    other = tmp_path / "other.json"
    other.write_text(json.dumps(data))
    capsys.readouterr()
    assert main(["report", str(DATA / "report.yaml"), *TINY, "--check", str(other)]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert (f"check against {other}: these figures came from jax {jax.__version__} / jaxlib "
            f"0.11.1; this process compiles with jax {jax.__version__} / jaxlib {JAXLIB}: "
            "re-measured, figures below.") in out
    assert "recompute: DOES NOT HOLD: " in out and "none: holds" in out  # temp (and peak on a CPU)
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert main(["report", str(DATA / "report.yaml"), *TINY, "--check", str(bad)]) == 2
    assert "--check" in capsys.readouterr().err


@pytest.mark.target
def test_target_compilers_name_their_plugin_versions() -> None:
    """In the target environment (``jax[tpu]``, ``jax[cuda12]``): libtpu's version from its
    package, the CUDA plugins' from theirs, read without a device."""
    libtpu = importlib.util.find_spec("libtpu")
    cuda = importlib.util.find_spec("jax_plugins.xla_cuda12") if importlib.util.find_spec(
        "jax_plugins") else None
    if libtpu is None and cuda is None:
        pytest.skip("no TPU or CUDA compiler installed (./scripts/test's target stage)")
    if libtpu is not None:
        c = compiler_identity("tpu")
        v = importlib.metadata.version("libtpu")
        assert c.plugins == (("libtpu", v),) and c.build is None
        assert c.describe() == f"XLA:TPU, libtpu {v}, jax {jax.__version__} / jaxlib {JAXLIB}"
    if cuda is not None:
        c = compiler_identity("cuda")
        assert c.plugins == tuple((d, importlib.metadata.version(d))
                                  for d in ("jax-cuda12-pjrt", "jax-cuda12-plugin"))
        assert c.describe().startswith("XLA:GPU, jax-cuda12-pjrt ")
