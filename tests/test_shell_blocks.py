"""The README's and docs' shell blocks, pasted as written into the environment the set-up built.

Every command of every ``bash``/``console`` block runs here (in a scratch folder that sees the
repository's ``examples/``, with this suite's environment first on ``PATH``, as after the README's
activation line), except the few listed in :data:`NOT_RUN` with the reason; the training runs and
the measuring commands get tiny sizes appended (the last value of a flag wins), so the flags,
files and plan names they name are checked at a fraction of the cost. The Python blocks are
doctests (``--doctest-glob``) or ``tests/test_readme.py``.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

pytestmark = pytest.mark.tooling

#: Commands not run here, by how they start, with the reason.
NOT_RUN = {
    "./scripts/demo": "builds .venv and trains: the set-up itself (CI runs ./scripts/test)",
    "./scripts/test": "the test suite itself",
    "XLA_FLAGS=": "the test suite itself, under other XLA flags",
    "pip install": "installs from the package index: tests/test_dist.py installs the built wheel",
    "./scripts/device_check": "needs a TPU or GPU (tests/test_device_check.py runs its CPU parts)",
    "./scripts/capacity_check": "needs a TPU or GPU (tests/test_capacity_check.py runs it tiny on CPU)",
    "export XLA_FLAGS=": "a two-process launch (tests/test_multihost.py runs one)",
}
#: Appended per program: tiny sizes and no end-of-run extras.
TRAIN_TINY = ("--steps 2 --batch 2 --seq-len 16 --d-model 32 --n-layers 1 --n-heads 2 "
              "--eval-batches 0 --sample-chars 0 --no-report")
MEASURE_TINY = "--size n_layers=1 batch=2 seq_len=16 d_model=32 n_heads=2"
REPORT_TINY = f"{MEASURE_TINY} --steps 0"  # compile only: step times are not what is checked
#: ``remat tune --budget 100MiB`` (the README's) at a size where, as at the config's own, save-all
#: does not fit 100 MiB and the other choices do, so the search chooses (at ``MEASURE_TINY``
#: save-all fits and it stops after one compile): two narrow layers, long sequences, a wide batch
#: (save-all 122 MiB, dots 68 MiB; 9 compiles, about 30 s).
TUNE_CHOOSES = "--size n_layers=2 d_model=32 n_heads=2 seq_len=128 batch=56"
#: Commands that fail by design where they run here, and what their output says then.
EXPECTED_FAILURE = {"remat doctor --require custom_remat,offload_placed": "offload_placed"}


def commands() -> list[tuple[str, str]]:
    """``(where, command)`` for each command of each shell block, continuation lines joined,
    comments and prompts dropped, in order, without repeats."""
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    for doc in DOCS:
        text = doc.read_text()
        for m in re.finditer(r"```(?:bash|sh|shell|console)\n(.*?)```", text, re.S):
            line = text[:m.start()].count("\n") + 2
            body = m.group(1).replace("\\\n", " ")
            if body.lstrip().startswith("export XLA_FLAGS="):  # one script, not separate commands
                cmds = [body.strip()]
            else:
                cmds = [c for c in (re.sub(r"(^|\s)#.*", "", ln).strip().removeprefix("$ ")
                                    for ln in body.splitlines()) if c]
            for c in cmds:
                c = " ".join(c.split()) if "\n" not in c else c
                if c not in seen:
                    seen.add(c)
                    out.append((f"{doc.relative_to(ROOT)}:{line}", c))
    return out


def _runnable(cmd: str) -> bool:
    return not any(cmd.startswith(p) for p in NOT_RUN)


def _with_sizes(cmd: str, sizes: str) -> str:
    """``cmd`` with ``sizes`` (``--size K=V ...``) in place of its own sizes of the same keys
    (one --size: ``remat`` refuses a size given twice)."""
    words = shlex.split(cmd)
    if "--size" not in words:
        return f"{cmd} {sizes}"
    new = dict(w.split("=", 1) for w in shlex.split(sizes) if "=" in w)
    i = words.index("--size")
    j = next((k for k in range(i + 1, len(words)) if words[k].startswith("--")), len(words))
    own = [w for w in words[i + 1:j] if w.split("=", 1)[0] not in new]
    rest = shlex.split(sizes)[len(new) + 1:]  # what follows the sizes (--steps 0)
    return shlex.join([*words[:i], *words[j:], "--size", *own,
                       *(f"{k}={v}" for k, v in new.items()), *rest])


def _sized(cmd: str, tmp: Path) -> str:
    cmd = cmd.replace("/tmp/", f"{tmp}/")
    words = shlex.split(cmd)
    if words[0] == "python" and words[1].endswith("train.py") and "--help" not in words:
        return f"{cmd} {TRAIN_TINY}"
    if words[0] == "remat" and words[1] == "report":
        return _with_sizes(cmd, REPORT_TINY)
    if words[0] == "remat" and words[1] == "verify":
        return _with_sizes(cmd, MEASURE_TINY)
    if words[0] == "remat" and words[1] == "tune":
        return _with_sizes(cmd, TUNE_CHOOSES if '100MiB' in words else MEASURE_TINY)
    return cmd


def test_every_block_is_found_and_every_skip_is_one_of_them() -> None:
    """The commands the README's sections promise are among those found, and each reason in
    NOT_RUN still applies to a command of the docs."""
    found = [c for _, c in commands()]
    for want in ("python examples/nnx_gpt/train.py", "python examples/eqx_gpt/train.py",
                 "remat report examples/nnx_gpt/report.yaml", "remat tune", "remat doctor",
                 "remat lint"):
        assert any(c.startswith(want) for c in found), want
    for prefix in NOT_RUN:
        assert any(c.startswith(prefix) for c in found), prefix


@pytest.mark.parametrize("where,cmd", [wc for wc in commands() if _runnable(wc[1])],
                         ids=[f"{w} {' '.join(c.split()[:2])}" for w, c in commands()
                              if _runnable(c)])
def test_shell_command_runs_as_written(where: str, cmd: str, tmp_path: Path) -> None:
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "VIRTUAL_ENV": sys.prefix, "COLUMNS": "150"}
    if cmd.startswith("source "):  # the activation line: in the repository, whose .venv it names
        if not (ROOT / ".venv" / "bin" / "activate").is_file():
            pytest.skip("no .venv here: ./scripts/test or ./scripts/demo builds it")
        r = subprocess.run(["bash", "-c", f"{cmd} && command -v python remat && python -c "
                            "'import jax, remat_common'"], cwd=ROOT, capture_output=True, text=True,
                           env={k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"})
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == [str(ROOT / ".venv" / "bin" / p) for p in ("python", "remat")]
        return
    sized = _sized(cmd, tmp_path)
    r = subprocess.run(["bash", "-c", sized], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=900)
    out = r.stdout + r.stderr
    if cmd in EXPECTED_FAILURE:
        assert r.returncode == 1 and EXPECTED_FAILURE[cmd] in out, out
        return
    assert r.returncode == 0, f"{where}: {sized}\n{out[-3000:]}"
    if TUNE_CHOOSES in sized:  # save-all does not fit: another plan is chosen, and fits
        chosen = re.search(r"^(\S+) fits 100\.00 MiB: compiled peak", r.stdout, re.M)
        assert chosen and chosen[1] != "save" and "save-all fits" not in out, out[-3000:]
        assert re.search(r"^\W+save\W.* no \W+savex2", r.stdout, re.M), r.stdout
    # what the command says it writes is there
    for flag in ("--json", "--plot", "--out"):
        words = shlex.split(sized)
        if flag in words:
            written = tmp_path / words[words.index(flag) + 1]
            assert written.is_file() and written.stat().st_size > 0, (flag, written)
