"""The suite's own configuration on a TPU/GPU host (docs/testing.md): JAX's TPU runtime warnings at
import are not errors (every other warning is), ``device`` tests run only on an accelerator, and
matrix products run at full precision there."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import jax
import pytest

ROOT = Path(__file__).resolve().parents[1]

#: What JAX says at ``import jax`` on a TPU v5e host (jax/_src/cloud_tpu_init.py), seen there.
_HUGEPAGES = ('Transparent hugepages are not enabled. TPU runtime startup and shutdown time should '
              'be significantly improved on TPU v5e and newer. If not already set, you may need to '
              'enable transparent hugepages in your VM image (sudo sh -c "echo always > '
              '/sys/kernel/mm/transparent_hugepage/enabled")')


@pytest.mark.parametrize("message, ok", [
    (_HUGEPAGES, True),
    ("cloud_tpu_init failed: KeyError('x')\n This a JAX bug; please report an issue", True),
    ("something else", False),
])
def test_tpu_runtime_warnings_at_import_are_not_errors(tmp_path: Path, message: str, ok: bool
                                                       ) -> None:
    """The warning comes while conftest imports jax, under the pyproject's filters: those of the
    TPU runtime pass, any other stops the run."""
    (tmp_path / "conftest.py").write_text(f"import warnings\nwarnings.warn({message!r})\n")
    (tmp_path / "test_one.py").write_text("def test_one():\n    pass\n")
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "-p", "no:xdist", "-c", str(ROOT / "pyproject.toml"), str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert (out.returncode == 0) == ok, out.stdout[-2000:] + out.stderr[-2000:]
    if not ok:
        assert "UserWarning: something else" in out.stdout + out.stderr


@pytest.fixture(scope="module")
def _precision_in_a_module_fixture() -> str | None:
    return jax.config.jax_default_matmul_precision


@pytest.mark.device
def test_device_tests_run_on_an_accelerator_at_full_precision(
        _precision_in_a_module_fixture: str | None) -> None:
    """Skipped on the CPU by the root conftest; on a TPU/GPU, the autouse fixture has set every
    test's matrix products to "highest", module-scoped fixtures' (a baseline computed once) too."""
    assert jax.default_backend() != "cpu"
    assert jax.config.jax_default_matmul_precision == "highest"
    assert _precision_in_a_module_fixture == "highest"


def test_on_the_cpu_precision_is_left_alone() -> None:
    if jax.default_backend() != "cpu":
        pytest.skip("on an accelerator the fixture sets it (the test above)")
    assert jax.config.jax_default_matmul_precision is None
