"""Both GPT examples sharded over a 2 x 2 mesh in two processes (``jax.distributed`` on localhost,
gloo collectives), against one process with the same four devices, and resumed from the
two-process checkpoint in one process.

Everything runs in subprocesses: the device count is fixed when JAX starts. Three launches in all:
the pair of processes (both examples, 3 steps each under ``plans/names.yaml``, which keeps named
activations and offloads one), then one process with 4 CPU devices that trains the same runs
(4 steps, the reference), resumes each two-process checkpoint (written by both processes, each its
own shards) to step 4, and trains 3 steps on one device without a mesh.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("flax")
pytest.importorskip("equinox")
pytest.importorskip("optax")
pytest.importorskip("orbax.checkpoint")

from fixtures.tolerance import assert_close  # noqa: E402

# Tooling (launching and checkpointing two processes): slow, marked `tooling` (`-m "not tooling"` leaves it out of a
# quick local run); every stage of scripts/test runs it.
pytestmark = pytest.mark.tooling

REPO = Path(__file__).resolve().parents[1]
MESHES = {"nnx_gpt": "data=2,tensor=2", "eqx_gpt": "fsdp=2,tensor=2"}
TIMEOUT_S = 600  # per launch; a loaded 2-core machine compiles these tiny steps in < 1 min

WORKER = r"""
import json, sys
from pathlib import Path
import jax
from examples.eqx_gpt import train as eqx_train
from examples.nnx_gpt import train as nnx_train

mode, work = sys.argv[1], Path(sys.argv[2])
MESHES = json.loads(sys.argv[3])
TINY = dict(d_model=32, n_layers=2, n_heads=2, seq_len=16, batch=4, warmup_steps=2, decay_steps=20,
            checkpoint_every=2, eval_batches=0, sample_chars=0, report=False, quiet=True,
            plan="names")
MAINS = {"nnx_gpt": nnx_train.main, "eqx_gpt": eqx_train.main}

def run(main, **kw):
    r = main(**TINY, **kw)
    return {"start": r.start_step, "losses": {str(k): v for k, v in r.losses.items()},
            "checkpoints": list(r.checkpoints)}

out = {}
if mode == "multi":
    coord, n, pid = sys.argv[4], int(sys.argv[5]), int(sys.argv[6])
    for name, main in MAINS.items():
        out[name] = run(main, steps=3, mesh=MESHES[name], workdir=str(work / "multi" / name),
                        coordinator=coord, num_processes=n, process_id=pid)
    out["processes"], out["devices"] = jax.process_count(), jax.device_count()
else:
    for name, main in MAINS.items():
        out[name] = {
            "reference": run(main, steps=4, mesh=MESHES[name], workdir=str(work / "one" / name)),
            "resumed": run(main, steps=4, mesh=MESHES[name], workdir=str(work / "multi" / name)),
            "unsharded": run(main, steps=3, workdir=str(work / "plain" / name)),
        }
    out["processes"], out["devices"] = jax.process_count(), jax.device_count()
print("RESULT " + json.dumps(out), flush=True)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(devices: int, cache: Path) -> dict[str, str]:
    return {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONWARNINGS": "error",
            # every run here compiles with the same flags; these two cut the compile time by a third
            "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices} "
                         "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true",
            # the resumed runs compile the reference's step again: read it from this cache
            "JAX_COMPILATION_CACHE_DIR": str(cache),
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
            "REMAT_EXAMPLES_INIT_TIMEOUT": "120",
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


def _launch(argvs: list[list[str]], env: dict[str, str], logs: Path) -> list[dict[str, Any]]:
    """Runs the processes together, in their own process groups; waits at most TIMEOUT_S; on any
    failure kills them all and fails with every process's output."""
    procs, files = [], []
    for i, argv in enumerate(argvs):
        f = open(logs / f"process{i}.log", "w+")
        files.append(f)
        procs.append(subprocess.Popen([sys.executable, "-c", WORKER, *argv], cwd=REPO, env=env,
                                      stdout=f, stderr=subprocess.STDOUT, start_new_session=True))
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while any(p.poll() is None for p in procs):
            if time.monotonic() > deadline or any(p.returncode not in (None, 0) for p in procs):
                break
            time.sleep(0.5)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    outputs = []
    for f in files:
        f.seek(0)
        outputs.append(f.read())
        f.close()
    shown = "\n".join(f"--- process {i} (exit {p.returncode}) ---\n{o[-6000:]}"
                      for i, (p, o) in enumerate(zip(procs, outputs)))
    assert all(p.returncode == 0 for p in procs), f"a process failed or timed out:\n{shown}"
    results = []
    for out in outputs:
        lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
        assert len(lines) == 1, shown
        results.append(json.loads(lines[0][len("RESULT "):]))
    return results


def _losses(run: dict[str, Any]) -> list[float]:
    return [run["losses"][str(s)] for s in sorted(map(int, run["losses"]))]


@pytest.mark.slow
def test_two_processes_train_as_one_and_resume_in_one(tmp_path: Path) -> None:
    meshes = json.dumps(MESHES)
    cache = tmp_path / "jax_cache"
    coordinator = f"127.0.0.1:{_free_port()}"
    multi = _launch([["multi", str(tmp_path), meshes, coordinator, "2", str(i)] for i in (0, 1)],
                    _env(2, cache), tmp_path)
    (one,) = _launch([["single", str(tmp_path), meshes]], _env(4, cache), tmp_path)

    assert [(m["processes"], m["devices"]) for m in multi] == [(2, 4), (2, 4)]
    assert (one["processes"], one["devices"]) == (1, 4)
    table = []
    for name in MESHES:
        a, b = multi[0][name], multi[1][name]
        ref, resumed, plain = (one[name][k] for k in ("reference", "resumed", "unsharded"))
        # 1. the two processes run one program: the same loss in each, every step
        assert sorted(map(int, a["losses"])) == [1, 2, 3]
        assert a["losses"] == b["losses"]
        assert a["checkpoints"] == b["checkpoints"] == [2, 3]
        # 2. ... the program one process runs on the same four devices
        assert_close(_losses(a), _losses(ref)[:3], err_msg=name)
        # 3. the sharded step is the unsharded step
        assert_close(_losses(plain), _losses(ref)[:3], err_msg=name)
        # 4. each process wrote its shards; one process restores them (model and optimiser) and
        #    continues as the uninterrupted run
        state = tmp_path / "multi" / name / "checkpoints" / "3" / "state"
        for p in (0, 1):
            assert any((state / f"ocdbt.process_{p}").rglob("*")), f"process {p} wrote no shards"
        assert resumed["start"] == 3 and sorted(resumed["losses"]) == ["4"]
        assert_close(resumed["losses"]["4"], ref["losses"]["4"], err_msg=name)
        for s in (1, 2, 3):
            table.append(f"{name} step {s}: process 0 {a['losses'][str(s)]!r}  process 1 "
                         f"{b['losses'][str(s)]!r}  one process {ref['losses'][str(s)]!r}  "
                         f"unsharded {plain['losses'][str(s)]!r}")
        table.append(f"{name} step 4: one process {ref['losses']['4']!r}  resumed from the "
                     f"two-process checkpoint {resumed['losses']['4']!r}")
    print("\n".join(table))
