"""``remat lint``: exact rule ids and positions on the sample files, near-misses, suppression,
the command line (text and JSON), and the JAX behaviour each rule rests on."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from remat_common import saved_residuals
from remat_common.internal import main, python_files
from remat_common.lint import LINT_RULES, Finding, lint_paths, lint_source
from fixtures.tolerance import assert_close

pytestmark = pytest.mark.compat  # the checker is pure ast; the premise tests gate themselves

SAMPLES = Path(__file__).parent / "lint_samples"

#: (rule, line, col) of every finding in each sample file, in report order.
EXPECTED: dict[str, list[tuple[str, int, int]]] = {
    "policies_import.py": [
        ("RM001", 3, 8),   # import jax.checkpoint_policies
        ("RM001", 4, 8),   # import jax.checkpoint_policies as cp
        ("RM001", 5, 1),   # from jax.checkpoint_policies import ...
        ("RM001", 6, 12),  # import os, jax.ad_checkpoint.checkpoint_policies
        ("RM001", 7, 1),   # from jax.ad_checkpoint.checkpoint_policies import ...
    ],
    "empty.py": [
        ("RM002", 8, 5),    # jnp.empty
        ("RM002", 9, 5),    # jnp.empty_like
        ("RM002", 10, 5),   # jax.numpy.empty
        ("RM002", 11, 5),   # np2.empty (from jax import numpy as np2)
        ("RM002", 11, 20),  # empty (from jax.numpy import empty)
        ("RM002", 11, 31),  # el (empty_like as el)
        ("RM002", 12, 5),   # j.numpy.empty_like (import jax as j)
        ("RM002", 13, 8),   # make = jnp.empty (a reference, not a call)
        ("RM002", 18, 12),  # xp.empty, imported inside a function
    ],
    "policies.py": [
        ("RM003", 20, 31),  # cp.save_from_both_policies(...)
        ("RM003", 21, 31),  # policy=lambda
        ("RM003", 22, 26),  # jax.remat(f, policy=my_policy)
        ("RM003", 23, 37),  # partial(jax.checkpoint, policy=my_policy)
        ("RM003", 24, 26),  # nnx.remat(f, policy=lambda ...)
        ("RM003", 25, 38),  # eqx.filter_checkpoint(f, policy=functools.partial(my_policy))
        ("RM004", 26, 31),  # save_anything_except_these_names
        ("RM003", 27, 8),   # both = cp.save_from_both_policies
        ("RM003", 30, 43),  # @functools.partial(jax.checkpoint, policy=lambda ...)
    ],
    "custom_remat.py": [
        ("RM005", 26, 8),  # bare = jax.custom_remat(...), only ever under jax.grad
        ("RM005", 30, 2),  # @partial(jax.custom_remat, ...) def decorated
    ],
    "jit_cse.py": [
        ("RM006", 13, 16),  # jax.jit(f, inline=True)
        ("RM006", 14, 32),  # functools.partial(jax.jit, inline=True)
        ("RM006", 15, 16),  # nnx.jit(f, inline=True)
        ("RM006", 16, 23),  # eqx.filter_jit(f, inline=True)
        ("RM007", 17, 23),  # jax.checkpoint(f, prevent_cse=False)
        ("RM007", 19, 15),  # nnx.remat(f,\n prevent_cse=False): the keyword's own line
        ("RM007", 20, 30),  # eqx.filter_checkpoint(f, prevent_cse=False)
    ],
    "suppressed.py": [
        ("RM002", 8, 5),    # ignore[RM001] does not silence RM002
        ("RM002", 10, 13),  # ignore[RM006] silences only the inline=True on that line
        ("RM002", 11, 28),  # "# remat: ignore" inside a string is not a comment
    ],
    "clean/near_misses.py": [],
}


def _positions(findings: tuple[Finding, ...] | list[Finding]) -> list[tuple[str, int, int]]:
    return [(f.rule, f.line, f.col) for f in findings]


@pytest.fixture(scope="module")
def report():
    return lint_paths([SAMPLES])


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_sample_findings_exact(name: str) -> None:
    path = SAMPLES / name
    findings = lint_source(path.read_text(), str(path))
    assert _positions(findings) == EXPECTED[name]
    for f in findings:
        rule = LINT_RULES[f.rule]
        assert (f.path, f.name, f.fix) == (str(path), rule.name, rule.fix)
        assert f.message


def test_directory_is_linted_recursively(report) -> None:
    rel = sorted(str(Path(p).relative_to(SAMPLES)) for p in report.files)
    assert rel == sorted([*EXPECTED, "conftest.py"])
    by_file: dict[str, list[tuple[str, int, int]]] = {}
    for f in report.findings:
        by_file.setdefault(str(Path(f.path).relative_to(SAMPLES)), []).append((f.rule, f.line, f.col))
    assert by_file == {k: v for k, v in EXPECTED.items() if v}
    assert report.counts == {"RM001": 5, "RM002": 12, "RM003": 8, "RM004": 1, "RM005": 2,
                             "RM006": 4, "RM007": 3}
    assert report.suppressed == 6
    assert report.summary() == (
        "remat lint: 35 problem(s) in 6 of 8 file(s) (RM001: 5, RM002: 12, RM003: 8, RM004: 1, "
        "RM005: 2, RM006: 4, RM007: 3; 6 suppressed)")


def test_suppression_forms() -> None:
    src = textwrap.dedent("""\
        import jax.numpy as jnp
        a = jnp.empty(3)
        b = jnp.empty(3)  # remat: ignore[RM002]
        c = jnp.empty(3)  # remat: ignore
        d = jnp.empty(3)  #remat:ignore[ uninitialized-empty ]
        e = jnp.empty(3)  # remat: ignore[rm002,RM006]
        f = jnp.empty(3)  # remat: ignore[RM006]
        g = jnp.empty(  # remat: ignore[RM002]
            3)
        h = (3,
             jnp.empty(3))  # remat: ignore[RM002]
        """)
    assert _positions(lint_source(src)) == [("RM002", 2, 5), ("RM002", 7, 5)]


@pytest.mark.parametrize("source, expected", [
    # An alias through assignment, and a module-level alias shadowed by a parameter.
    ("import jax\ncp = jax.checkpoint_policies\np = cp.save_anything_except_these_names('a')\n",
     [("RM004", 3, 5)]),
    ("import jax.numpy as jnp\ndef f(jnp):\n    return jnp.empty(3)\n", []),
    # A class attribute does not shadow the module name inside methods (Python's scoping).
    ("from jax.numpy import empty\nclass A:\n    empty = None\n    def m(self):\n"
     "        return empty(3)\n", [("RM002", 5, 16)]),
    ("from jax.numpy import empty\nclass A:\n    empty = None\n    x = empty\n", []),
    # Two different bindings in one scope: ambiguous, so not flagged.
    ("import numpy as xp\nimport jax.numpy as xp\nxp.empty(3)\n", []),
    # `global` makes the function's import the module's binding.
    ("def setup():\n    global xp\n    import jax.numpy as xp\ndef use():\n    return xp.empty(3)\n",
     [("RM002", 5, 12)]),
    # Comprehension variables shadow; relative imports are unknown; star imports are not followed.
    ("import jax.numpy as jnp\nys = [jnp.empty(1) for jnp in range(3)]\n", []),
    ("from . import jnp\njnp.empty(3)\n", []),
    ("from jax.numpy import *\nempty(3)\n", []),
    # `jax.remat` is `jax.checkpoint`; flax.linen.checkpoint is flax.linen.remat.
    ("import jax\ndef p(*a, **k):\n    return True\ng = jax.remat(abs, policy=p)\n",
     [("RM003", 4, 27)]),
    ("import flax.linen as nn\nM = nn.checkpoint(object, policy=lambda *a: True)\n",
     [("RM003", 2, 34)]),
    # A lambda passed as policy= to something that is not a remat call is not flagged.
    ("import jax\njax.tree.map(abs, [1], is_leaf=lambda x: True)\n", []),
    ("from functools import partial\nimport jax\ng = partial(jax.jit, inline=True)\n",
     [("RM006", 3, 22)]),
    ("import jax\ng = jax.jit(abs, inline=jax.Inline.JAX_EARLY)\n", []),
])
def test_resolution_cases(source: str, expected: list[tuple[str, int, int]]) -> None:
    assert _positions(lint_source(source)) == expected


@pytest.mark.parametrize("source, expected", [
    # Only differentiated, never checkpointed: flagged at the custom_remat call.
    ("import jax\ncr = jax.custom_remat(abs, 1, 2, 3)\ng = jax.grad(cr)\n", [("RM005", 2, 6)]),
    # Defined and never used in this file (e.g. a library module): flagged, see docs/lint.md.
    ("import jax\ncr = jax.custom_remat(abs, 1, 2, 3)\n", [("RM005", 2, 6)]),
    # Through a chain of local functions that ends in a checkpoint.
    ("import jax\ncr = jax.custom_remat(abs, 1, 2, 3)\ndef a(x):\n    return cr(x)\n"
     "def b(x):\n    return a(x)\ng = jax.checkpoint(b)\n", []),
    # jax.checkpoint through functools.partial, eqx.filter_checkpoint, a factory call.
    ("import functools, jax\ncr = jax.custom_remat(abs, 1, 2, 3)\n"
     "g = functools.partial(jax.checkpoint, prevent_cse=True)(cr)\n", []),
    ("import equinox as eqx, jax\ncr = jax.custom_remat(abs, 1, 2, 3)\n"
     "g = eqx.filter_checkpoint(cr)\n", []),
    ("from flax import nnx\nimport jax\ncr = jax.custom_remat(abs, 1, 2, 3)\n"
     "g = nnx.remat(policy=None)(cr)\n", []),
    # A class instantiated inside a checkpoint covers its methods.
    ("import jax\nclass L:\n    def __init__(self):\n        self.r = jax.custom_remat(abs, 1, 2, 3)\n"
     "    def __call__(self, x):\n        return self.r(x)\n"
     "g = jax.checkpoint(lambda x: L()(x))\n", []),
    # A custom_remat built inside a checkpointed function.
    ("import jax\n@jax.checkpoint\ndef g(x):\n    return jax.custom_remat(abs, 1, 2, 3)(x)\n", []),
])
def test_custom_remat_heuristic(source: str, expected: list[tuple[str, int, int]]) -> None:
    assert _positions(lint_source(source)) == expected


def test_syntax_error_is_reported() -> None:
    (f,) = lint_source("def broken(:\n    pass\n", "bad.py")
    assert (f.rule, f.name, f.line, f.col) == ("RM000", "syntax-error", 1, 12)
    assert f.message.startswith("cannot parse: ")


def test_select_and_ignore() -> None:
    report = lint_paths([SAMPLES], select="RM001,uninitialized-empty")
    assert report.counts == {"RM001": 5, "RM002": 12}
    report = lint_paths([SAMPLES], ignore=["RM002", "prevent-cse-false"])
    assert set(report.counts) == {"RM001", "RM003", "RM004", "RM005", "RM006"}
    with pytest.raises(ValueError, match=r"unknown lint rule 'RM9' in select\. Allowed ids: "
                                         r"'RM000', 'RM001'.*'uninitialized-empty'"):
        lint_paths([SAMPLES], select="RM9")


def test_directory_walk_skips_hidden_and_venvs(tmp_path: Path) -> None:
    hazard = "import jax.numpy as jnp\nx = jnp.empty(2)\n"
    for rel in ("pkg/a.py", "pkg/sub/b.py", ".hidden/c.py", "env/lib/d.py", "pkg/__pycache__/e.py",
                "pkg/notes.txt"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(hazard)
    (tmp_path / "env/pyvenv.cfg").write_text("home = /usr\n")
    found = [str(Path(p).relative_to(tmp_path)) for p in python_files([tmp_path])]
    assert found == ["pkg/a.py", "pkg/sub/b.py"]
    # A file given by name is checked whatever its suffix.
    assert lint_paths([tmp_path / "pkg/notes.txt"]).counts == {"RM002": 1}


def test_cli_text(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lint", str(SAMPLES / "jit_cse.py")]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (f"{SAMPLES / 'jit_cse.py'}:13:16: RM006 [jit-inline-true] jax.jit(inline=True) "
                      "means JAX_EARLY on JAX 0.11.0 but JAX_LATE on 0.11.2+")
    assert out[1] == "    fix: " + LINT_RULES["RM006"].fix
    assert out[-1] == "remat lint: 7 problem(s) in 1 of 1 file(s) (RM006: 4, RM007: 3)"
    assert main(["lint", str(SAMPLES / "clean")]) == 0
    assert capsys.readouterr().out == "remat lint: no problems in 1 file(s)\n"


def test_cli_json(capsys: pytest.CaptureFixture[str], report) -> None:
    assert main(["lint", "--format", "json", str(SAMPLES)]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["findings"] == [f.to_json() for f in report.findings]
    assert data["summary"] == {"files": 8, "findings": 35, "suppressed": 6,
                               "by_rule": report.counts}
    assert set(data["findings"][0]) == {"path", "line", "col", "rule", "name", "message", "fix"}
    assert main(["lint", "--format", "json", str(SAMPLES / "clean")]) == 0
    assert json.loads(capsys.readouterr().out)["findings"] == []


def test_cli_usage_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["lint", str(tmp_path / "missing.py")]) == 2
    err = capsys.readouterr().err
    assert re.search(r"remat lint: error: '.*missing\.py' is neither a file nor a directory\. "
                     r"Fix: ", err)
    assert main(["lint", "--ignore", "nope", str(SAMPLES)]) == 2
    assert "unknown lint rule 'nope' in ignore" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["lint", "--jobs", "0", str(SAMPLES)])
    assert info.value.code == 2 and "--jobs takes a positive integer, got '0'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="lint_paths: jobs must be an integer >= 1, got bool True"):
        lint_paths([SAMPLES], jobs=True)


@pytest.mark.tooling
def test_worker_processes_give_the_same_report(report) -> None:
    """Files are checked one by one, so two worker processes find exactly what one finds."""
    assert lint_paths([SAMPLES], jobs=2) == report


# -- the JAX behaviour the rules rest on (re-checked on the installed version) -------------------
_V011 = hasattr(jax, "custom_remat")  # 0.11.x; 0.12 removed custom_remat and the policy classes


def test_rm001_flags_exactly_the_imports_that_fail() -> None:
    """On 0.11.x and 0.12 alike ``jax.checkpoint_policies`` is an attribute (a namespace), not a
    module: the flagged imports fail, the attribute imports work."""
    import ast

    path = SAMPLES / "policies_import.py"
    flagged = {line for _, line, _ in EXPECTED["policies_import.py"]}
    for node in ast.parse(path.read_text()).body:
        if not isinstance(node, ast.Import | ast.ImportFrom):
            continue
        stmt = ast.unparse(node)
        if node.lineno in flagged:
            with pytest.raises(ModuleNotFoundError):
                exec(stmt, {})  # noqa: S102 - the sample's own import statement
        else:
            exec(stmt, {})  # noqa: S102


def _tagged(x: jax.Array) -> jax.Array:
    h = jax.ad_checkpoint.checkpoint_name(jnp.sin(x), "h")
    return jnp.sum(jnp.cos(h))


def test_rm004_save_anything_except_ignores_its_argument() -> None:
    """On 0.11.x and 0.12 alike; the replacement is the class on 0.11.x, its factory on 0.12
    (the class is gone there), as RM004's fix says."""
    cp = jax.checkpoint_policies
    but_h = (cp.SaveAnyNamesButThese(frozenset({"h"})) if _V011
             else cp.save_any_names_but_these("h"))
    x = jnp.linspace(0.0, 1.0, 8)
    def kept(policy):
        return [(r.kind, r.shape, r.source)
                for r in saved_residuals(jax.checkpoint(_tagged, policy=policy), x).residuals]

    # Told not to save h, it keeps exactly what everything_saveable keeps: sin's output (h) and cos'.
    told = kept(cp.save_anything_except_these_names("h"))
    assert told == kept(cp.everything_saveable)
    assert [(k, shape) for k, shape, _ in told] == [("other", (8,)), ("other", (8,))]
    assert any(src.startswith("output of sin") for _, _, src in told)
    # The suggested replacement keeps no named value but h... and h is the only one: the input only.
    assert [k for k, _, _ in kept(but_h)] == ["argument"]
    want = jax.grad(_tagged)(x)
    for pol in (cp.save_anything_except_these_names("h"), but_h):
        assert_close(jax.grad(jax.checkpoint(_tagged, policy=pol))(x), want)


@pytest.mark.skipif(not _V011, reason="jax.custom_remat exists on JAX 0.11.x only")
def test_rm005_custom_remat_needs_an_enclosing_checkpoint(remat3: bool) -> None:
    def f(x):
        return jnp.tanh(x)

    def f_fwd(policy, x):
        return f(x), None

    def f_rem(res, x):
        return f(x), x

    def f_bwd(x, g):
        return (g * (1 - jnp.tanh(x) ** 2),)

    cr = jax.custom_remat(f, f_fwd, f_rem, f_bwd)
    x = jnp.linspace(-1.0, 1.0, 6)
    with pytest.raises(NotImplementedError):
        jax.grad(lambda v: jnp.sum(cr(v)))(x)
    got = jax.grad(lambda v: jnp.sum(jax.checkpoint(cr)(v)))(x)
    assert_close(got, jax.grad(lambda v: jnp.sum(f(v)))(x))
