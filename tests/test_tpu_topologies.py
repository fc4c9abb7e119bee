"""TPU slices as they are rented (docs/targets.md#tpu-slices): single chips and slices smaller than a
host compile (libtpu refuses them with its default host of 2x2x1 chips), names no slice has are
refused before libtpu is asked, and libtpu is found where JAX finds it (``TPU_LIBRARY_PATH``).

The compiles are ``target`` tests (./scripts/test's target stage, .venv-target); the names and the
library look-up need no compiler.
"""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from remat_common import RematError
from remat_common.measurement import compile_for, compiler_available, parse_accelerator, target_kinds

_accelerators = sys.modules[parse_accelerator.__module__]  # tpu_host_bounds, the topology cache

_tpu_missing = compiler_available("tpu")
needs_tpu = pytest.mark.skipif(
    _tpu_missing is not None and not os.environ.get("REMAT_REQUIRE_TARGETS"),
    reason=f"{_tpu_missing} (./scripts/test's target stage)")

_W = jax.ShapeDtypeStruct((2, 256, 256), jnp.float32)  # 512 KiB of parameters
_X = jax.ShapeDtypeStruct((16, 256), jnp.float32)  # 16 KiB of batch


def _step(w: jax.Array, x: jax.Array) -> jax.Array:
    def loss(w: jax.Array) -> jax.Array:
        h = x
        for i in range(2):
            h = jnp.tanh(h @ w[i])
        return jnp.sum(h * h)

    return jax.grad(loss)(w)


# -- names: no compiler needed -------------------------------------------------------------------

def test_slices_smaller_than_a_host_are_names() -> None:
    tpu_host_bounds = _accelerators.tpu_host_bounds
    for name in ("v5e:1x1", "v6e:1x1", "v5e:2x1", "v4:1x1", "v5p:2x2x1", "v5e:16x16", "v5p:16x16x24"):
        assert parse_accelerator(name).topology == name
    assert [tpu_host_bounds(t) for t in ("1x1", "2x1", "1x2", "2x2", "4x8", "2x2x2", "1x1x1")] == [
        (1, 1, 1), (2, 1, 1), (1, 2, 1), (2, 2, 1), (2, 2, 1), (2, 2, 1), (1, 1, 1)]


@pytest.mark.parametrize("name, why, suggest", [
    ("v5e:1000x1000", "accelerator 'v5e:1000x1000': 1000x1000 is 1,000,000 chips, more than the "
                      "largest v5e slice.", "v5e:16x16"),
    ("v5e:3x3", "accelerator 'v5e:3x3': a side of 3 is not a power of two.", "v5e:4x4"),
    ("v6e:1x32", "1x32 is longer on a side than the largest v6e slice", "v6e:4x8"),
    ("v5e:2x2x2", "a v5e slice has two sides (AxB), not 3", "v5e:2x4"),
    ("v5e:0x2", "0x2 has a side of 0", "v5e:1x1"),
    ("v5p:3x3x3", "a side of 3 is neither 1, 2 nor a multiple of 4", "v5p:2x4x4"),
    ("v4:32x32x32", "32,768 chips, more than the largest v4 slice", "v4:16x16x16"),
])
def test_slices_no_one_rents_are_refused_before_libtpu(name, why, suggest) -> None:
    """libtpu compiles for v5e:32x32 (1024 chips of a 256-chip pod) and, given the host bounds,
    for v5e:3x3: the name is checked first, and the refusal gives the generation's largest slice
    and the rented shapes."""
    with pytest.raises(RematError) as e:
        parse_accelerator(name)
    msg = str(e.value)
    assert why in msg and f"Fix: give one of those, e.g. {suggest}." in msg
    chip = name.split(":")[0]
    largest = {"v4": "16x16x16 (4,096 chips)", "v5e": "16x16 (256 chips)",
               "v6e": "16x16 (256 chips)", "v5p": "16x16x24 (6,144 chips)"}[chip]
    assert f"A {chip} slice is " in msg and f"at most {largest}; Google Cloud rents " in msg


# -- where libtpu is found ---------------------------------------------------------------------

def test_libtpu_from_tpu_library_path(monkeypatch, tmp_path) -> None:
    """JAX loads libtpu from the file TPU_LIBRARY_PATH names (a TPU host's own; no libtpu package
    there): that counts; a path that is not a file is said, with the fix, not "not installed"."""
    so = tmp_path / "libtpu.so"
    so.write_bytes(b"\x7fELF")
    monkeypatch.setenv("TPU_LIBRARY_PATH", str(so))
    assert compiler_available("tpu") is None
    assert dict(target_kinds())["tpu (v4, v5e, v5p, v6e slices)"] is None
    missing = tmp_path / "gone" / "libtpu.so"
    monkeypatch.setenv("TPU_LIBRARY_PATH", str(missing))
    why = compiler_available("tpu")
    assert why is not None and why.startswith(f"TPU_LIBRARY_PATH is set to {str(missing)!r}, which "
                                              "is not a file")
    assert "Fix: point TPU_LIBRARY_PATH at the libtpu .so" in why
    assert dict(target_kinds())["tpu (v4, v5e, v5p, v6e slices)"] == why  # no install line
    monkeypatch.setattr(_accelerators, "_TOPOLOGIES", {})
    with pytest.raises(RematError, match=r"^accelerator v5e:1x1: cannot compile for tpu on this "
                                         r"machine: TPU_LIBRARY_PATH is set to .*unset it to use "
                                         r"the libtpu package\.$"):
        compile_for(_step, (_W, _X), "v5e:1x1")


_NO_PACKAGE = """
import sys
sys.modules["libtpu"] = None  # no libtpu package, as on a TPU host: only TPU_LIBRARY_PATH
import jax, jax.numpy as jnp
from jax._src import xla_bridge
from remat_common.measurement import compile_for, compiler_available
assert compiler_available("tpu") is None, compiler_available("tpu")
w, x = jax.ShapeDtypeStruct((2, 256, 256), jnp.float32), jax.ShapeDtypeStruct((16, 256), jnp.float32)
m = compile_for(lambda w, x: jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w[0]) @ w[1]))(w), (w, x),
                "v5e:1x1").compiled.memory_analysis()
print(xla_bridge.get_tpu_library_path(), m.argument_size_in_bytes)
"""


@needs_tpu
@pytest.mark.target
def test_a_target_compile_with_libtpu_from_tpu_library_path_alone() -> None:
    """What a TPU host has: libtpu as a file, no package. In a process where the package cannot be
    imported, TPU_LIBRARY_PATH at the package's .so compiles v5e:1x1 (ALLOW_MULTIPLE_LIBTPU_LOAD:
    this process may hold libtpu too)."""
    import libtpu

    so = libtpu.get_library_path()
    env = {**os.environ, "TPU_LIBRARY_PATH": so, "JAX_PLATFORMS": "cpu",
           "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}
    out = subprocess.run([sys.executable, "-c", _NO_PACKAGE], capture_output=True, text=True,
                         timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-2:] == [so, str(2 * 256 * 256 * 4 + 16 * 256 * 4)]


# -- compiles --------------------------------------------------------------------------------------

@needs_tpu
@pytest.mark.target
@pytest.mark.parametrize("name, chips", [("v5e:1x1", 1), ("v6e:1x1", 1), ("v5e:2x1", 2)])
def test_slices_smaller_than_a_host_compile(name, chips) -> None:
    """One chip, and two: memory_analysis() is per chip (the parameters whole, the batch split)."""
    tc = compile_for(_step, (_W, _X), name)
    assert tc.error is None
    m = tc.compiled.memory_analysis()
    assert m.argument_size_in_bytes == 2 * 256 * 256 * 4 + 16 * 256 * 4 // chips
    assert m.output_size_in_bytes == 2 * 256 * 256 * 4
    assert m.generated_code_size_in_bytes > 0  # XLA:TPU's program, not XLA:CPU's


def _scanned_mlp_grad(w: jax.Array, x: jax.Array) -> jax.Array:
    def loss(w: jax.Array) -> jax.Array:
        h, _ = jax.lax.scan(lambda h, wi: (jnp.tanh(h @ wi), None), x, w)
        return jnp.sum(h)

    return jax.grad(loss)(w)


@needs_tpu
@pytest.mark.target
def test_xla_tpu_holds_a_step_to_its_heap_peak() -> None:
    """XLA:TPU refuses a program whose heap peak (``peak_memory_in_bytes``) exceeds the chip, and
    accepts one whose arguments + outputs + temp - aliased exceed it: that sum is no bound on a
    TPU, so the device peak there is the heap's (``MemoryFigures.device_total``). On a TPU v5e
    chip the same held for the example GPT: steps ran at 15.65 and 15.71 GiB of heap peak with
    sums of 18.4 and 22.1 GiB, and the next batch was refused (docs/tpu.md)."""
    from remat_common.measurement import MemoryFigures

    chip = parse_accelerator("v5e:1x1").memory_bytes  # 15.75 GiB
    w = jax.ShapeDtypeStruct((4, 1024, 1024), jnp.float32)
    # the saved activations grow with the batch: 416 rows of 1,024 fit, 448 do not
    fits = compile_for(_scanned_mlp_grad, (w, jax.ShapeDtypeStruct((416 * 1024, 1024), jnp.float32)),
                       "v5e:1x1")
    assert fits.error is None
    m = MemoryFigures.from_compiled(fits.compiled)
    total = (m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes  # type: ignore[operator]
             - m.alias_size_in_bytes)
    assert m.platform == "tpu" and m.device_total == m.peak_memory_in_bytes
    assert m.device_total < chip < total
    over = compile_for(_scanned_mlp_grad, (w, jax.ShapeDtypeStruct((448 * 1024, 1024), jnp.float32)),
                       "v5e:1x1")
    assert over.error is not None and "exceeds available HBM" in over.error
