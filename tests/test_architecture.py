"""The shape of the code, checked with ``ast`` (no imports run, but for what an import loads):
who may import what, and no cycles.

- Outside the core (adapters, benchmarks, examples, tests, fixtures) nobody imports a private
  ``remat_common._*`` module: they use ``remat_common`` and its namespaces (``rules``,
  ``measurement``, ``lint``, ``adapter``, ``testing``; ``internal`` for this repository only).
- The core never imports an adapter, an example, a benchmark or a test; the runtime core never
  imports the tooling (``remat_common._tooling``: lint, doctor, measurement, CLI).
- The adapters never import each other; benchmarks never import ``tests``.
- Each adapter registers one record with the core, ``register_framework(Framework(...))`` in its
  ``_framework.py``; the class swap and the lookup of the module running now are the core's
  (``common/_framework.py``): no adapter assigns ``__class__`` or walks ``sys._getframe``. Both
  adapters hold each role in the file of the same name, each named in docs/architecture.md.
- The core and each adapter have no import cycle (function-level imports count too), no core
  file imports another's private names, and only ``_context.py`` holds runtime state.
- The tooling's packages import one way (:data:`TOOLING_LAYERS`, docs/architecture.md).
- No module (examples, benchmarks, scripts and the tests included) is over :data:`MAX_LINES`
  lines; a Python script, an entry point into the package, is at most :data:`MAX_SCRIPT_LINES`.
- ``jax._src`` is imported by ``common/_jaxcompat.py`` only.
- ``import remat_common`` (or an adapter) loads the runtime only, never the tooling: the namespaces
  and the tooling's names load on first use (checked in a fresh interpreter).
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytestmark = [pytest.mark.compat, pytest.mark.lock_only]  # reads source files only

REPO = Path(__file__).resolve().parents[1]
CORE = REPO / "common"
CORE_PKG = "remat_common"
ADAPTERS = ("flax_remat_plugin", "equinox_remat_plugin")
OUTSIDE = (*ADAPTERS, "benchmarks", "examples", "tests", "fixtures")
#: Modules of the core that are not runtime: the public namespaces over the tooling, and the CLI.
NOT_RUNTIME = frozenset({
    "remat_common", "remat_common.__main__", "remat_common.internal", "remat_common.lint",
    "remat_common.measurement",
})


def _module_name(path: Path, root: Path, package: str) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([package, *parts])


def _imports(path: Path, module: str) -> Iterator[tuple[str, int]]:
    """Every module ``path`` imports (absolute names; ``from x import y`` yields ``x`` and ``x.y``)."""
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_pkg else 0)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if node.module:  # ``from . import x`` imports the submodule x, not the package again
                yield target, node.lineno
            for a in node.names:
                yield f"{target}.{a.name}", node.lineno


def _files(top: str) -> list[Path]:
    root = REPO / top
    return sorted(p for p in root.rglob("*.py") if ".venv" not in p.parts) if root.exists() else []


def _core_modules() -> dict[str, Path]:
    return {_module_name(p, CORE, CORE_PKG): p for p in _files("common")}


def _violations(tops: tuple[str, ...], bad: Callable[[str, str, str], str]) -> list[str]:
    out = []
    for top in tops:
        for p in _files(top):
            mod = (_module_name(p, CORE, CORE_PKG) if top == "common"
                   else _module_name(p, REPO, "").lstrip("."))
            for target, line in _imports(p, mod):
                why = bad(top, mod, target)
                if why:
                    out.append(f"{p.relative_to(REPO)}:{line}: imports {target} ({why})")
    return sorted(set(out))


def _private(name: str) -> bool:
    parts = name.split(".")
    return parts[0] == CORE_PKG and any(s.startswith("_") and not s.startswith("__") for s in parts[1:2])


def test_nothing_outside_the_core_imports_its_private_modules() -> None:
    assert _violations(OUTSIDE, lambda top, mod, t: "private core module" if _private(t) else "") == []


def test_the_core_never_imports_adapters_examples_benchmarks_or_tests() -> None:
    def bad(top: str, mod: str, target: str) -> str:
        head = target.split(".")[0]
        return "outside the core" if head in OUTSIDE or head == "common" else ""

    assert _violations(("common",), bad) == []


def test_the_runtime_core_never_imports_the_tooling() -> None:
    out = []
    for mod, p in _core_modules().items():
        if mod in NOT_RUNTIME or mod.startswith(f"{CORE_PKG}._tooling"):
            continue
        out += [f"{mod}:{line}: imports {t}" for t, line in _imports(p, mod)
                if t.startswith(f"{CORE_PKG}._tooling")]
    assert out == []


def test_core_modules_import_no_private_names_from_each_other() -> None:
    """``from ._x import _y`` would couple two files through a private name (the old
    ``_scope._NAMES`` read by ``_custom``): shared state goes through ``_context.py`` instead."""
    out = []
    for p in _files("common"):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level and node.module:
                out += [f"{p.relative_to(REPO)}:{node.lineno}: {a.name}" for a in node.names
                        if a.name.startswith("_") and not a.name.startswith("__")]
    assert out == []


def test_only_the_context_module_declares_context_variables() -> None:
    users = sorted(str(p.relative_to(REPO)) for p in _files("common")
                   if "ContextVar(" in p.read_text())
    assert users == ["common/_context.py"]


def test_adapters_never_import_each_other() -> None:
    def bad(top: str, mod: str, target: str) -> str:
        head = target.split(".")[0]
        return "another adapter" if head in ADAPTERS and head != top else ""

    assert _violations(ADAPTERS, bad) == []


def _called(path: Path) -> Iterator[tuple[str, int]]:
    """The name of every function ``path`` calls (``f(...)``, ``x.f(...)``), with its line."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            yield name, node.lineno


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_each_adapter_registers_one_framework_record(adapter: str) -> None:
    """One ``register_framework`` call, in ``_framework.py``; none of the deprecated
    ``register_*`` calls (path finder, module locator, model check, model binder, stateful)."""
    calls = [(p.name, name) for p in _files(adapter) for name, _ in _called(p)
             if name.startswith("register_")]
    assert calls == [("_framework.py", "register_framework")]


def _swaps_and_frame_walks(top: str) -> list[str]:
    out = []
    for p in _files(top):
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            targets = (node.targets if isinstance(node, ast.Assign) else
                       [node.target] if isinstance(node, ast.AugAssign | ast.AnnAssign) else [])
            if any(isinstance(t, ast.Attribute) and t.attr == "__class__" for t in targets):
                out.append(f"{p.relative_to(REPO)}:{node.lineno}: assigns __class__")
            if isinstance(node, ast.Attribute) and node.attr == "_getframe":
                out.append(f"{p.relative_to(REPO)}:{node.lineno}: sys._getframe")
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "new_class":
                out.append(f"{p.relative_to(REPO)}:{node.lineno}: types.new_class")
    return out


def test_the_class_swap_and_the_module_lookup_are_the_cores() -> None:
    """The adapters neither swap classes nor walk frames themselves (they call
    ``annotated_class``/``with_class`` and register ``Framework.paths``); in the core, only
    ``_framework.py`` does (and a measurement's ``sys.monitoring`` callbacks read their frame)."""
    assert [line for a in ADAPTERS for line in _swaps_and_frame_walks(a)] == []
    core = {line.split(":")[0] for line in _swaps_and_frame_walks("common")}
    assert core == {"common/_framework.py", "common/_module_calls.py"}
    assert [line for line in _swaps_and_frame_walks("common")
            if line.startswith("common/_module_calls.py") and not line.endswith("sys._getframe")] == []


def test_both_adapters_name_each_role_alike() -> None:
    """The same file names in both adapters, each a row of docs/architecture.md's table of
    where each concern lives."""
    names = [sorted(p.name for p in _files(a)) for a in ADAPTERS]
    assert names[0] == names[1]
    doc = (REPO / "docs" / "architecture.md").read_text()
    assert [n for n in names[0] if n != "__init__.py" and f"`{n}`" not in doc] == []


def test_benchmarks_never_import_tests() -> None:
    assert _violations(("benchmarks",), lambda top, mod, t: (
        "the test suite" if t.split(".")[0] == "tests" else "")) == []


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module, or a module importing itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph[v]:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    return {m: {t for t, _ in _imports(p, m) if t in mods and t != m} for m, p in mods.items()}


def _core_graph() -> dict[str, set[str]]:
    return _graph(_core_modules())


def test_the_core_has_no_import_cycles() -> None:
    assert _cycles(_core_graph()) == []


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_the_adapters_have_no_import_cycles(adapter: str) -> None:
    mods = {_module_name(p, REPO / adapter, adapter): p for p in _files(adapter)}
    assert _cycles(_graph(mods)) == []


#: The tooling's packages (``remat_common._tooling.<name>``), top first: a package imports only
#: packages of a lower layer (and the core); two packages of one layer never import each other.
TOOLING_LAYERS = (
    ("checks",),
    ("cli",),
    ("tune", "doctor"),
    ("report",),
    ("measurement",),
    ("breakdown",),
    ("accelerators", "lint"),
)


def _tooling_package(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if parts[:2] == [CORE_PKG, "_tooling"] and len(parts) > 2 else None


def test_the_tooling_packages_import_one_way() -> None:
    rank = {pkg: len(TOOLING_LAYERS) - i for i, layer in enumerate(TOOLING_LAYERS) for pkg in layer}
    out = []
    for mod, p in _core_modules().items():
        src = _tooling_package(mod)
        if src is None:
            continue
        assert src in rank, f"{p.relative_to(REPO)}: a tooling package missing from TOOLING_LAYERS"
        for t, line in _imports(p, mod):
            dst = _tooling_package(t)
            if dst is not None and dst != src and rank.get(dst, 0) >= rank[src]:
                out.append(f"{p.relative_to(REPO)}:{line}: {src} imports {dst} ({t})")
    assert sorted(set(out)) == []


#: The most ``remat_common`` modules importing each package loads, none of them tooling: the
#: runtime's user API (``common/__init__.py`` loads its namespaces and the tooling's names on first
#: use, ``_LAZY``); an adapter adds ``remat_common.adapter`` and what only it imports.
MAX_LOADED = {CORE_PKG: 30, "flax_remat_plugin": 33, "equinox_remat_plugin": 33}


@pytest.mark.parametrize("package", [CORE_PKG, *ADAPTERS])
def test_importing_a_package_loads_the_runtime_only(package: str) -> None:
    import importlib.util
    import json
    import subprocess
    import sys

    framework = {"flax_remat_plugin": "flax", "equinox_remat_plugin": "equinox"}.get(package)
    if framework is not None and importlib.util.find_spec(framework) is None:
        pytest.skip(f"{framework} is not installed")
    code = (f"import json, sys, {package}; print(json.dumps(sorted(m for m in sys.modules"
            f" if m.split('.')[0] == {CORE_PKG!r})))")
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    loaded = json.loads(run.stdout.splitlines()[-1])
    tooling = [m for m in loaded if m.startswith(f"{CORE_PKG}._tooling")]
    assert tooling == [], f"import {package} loads the tooling: {tooling}"
    assert len(loaded) <= MAX_LOADED[package], (
        f"import {package} loads {len(loaded)} {CORE_PKG} modules (at most {MAX_LOADED[package]}):"
        f" {loaded}")


def test_the_tooling_packages_each_have_a_face() -> None:
    """Each tooling package's ``__init__`` says what it offers: a docstring and a sorted
    ``__all__`` of the names it re-exports."""
    out = []
    for layer in TOOLING_LAYERS:
        for pkg in layer:
            tree = ast.parse((CORE / "_tooling" / pkg / "__init__.py").read_text())
            names = [a.asname or a.name for n in tree.body if isinstance(n, ast.ImportFrom)
                     for a in n.names]
            all_ = next((ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                         and any(getattr(x, "id", "") == "__all__" for x in n.targets)), None)
            if not ast.get_docstring(tree) or not names or all_ != sorted(names):
                out.append(pkg)
    assert out == []


#: The most lines a module has, the tests' included: a module a newcomer can read in one sitting.
MAX_LINES = 800


def test_no_module_is_over_max_lines() -> None:
    tops = ("common", *ADAPTERS, "examples", "benchmarks", "fixtures", "scripts", "tests")
    files = [p for top in tops for p in _files(top)] + sorted(REPO.glob("*.py"))
    over = {str(p.relative_to(REPO)): n for p in files
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert over == {}


#: The most lines a script has: an entry point into the package, whose work lives and is tested
#: there (``common/_tooling/checks/``).
MAX_SCRIPT_LINES = 60


def test_scripts_are_entry_points() -> None:
    long = {str(p.relative_to(REPO)): n for p in _files("scripts")
            if (n := len(p.read_text().splitlines())) > MAX_SCRIPT_LINES}
    assert long == {}


def test_the_cycle_finder_finds_cycles() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_every_private_jax_use_is_in_jaxcompat() -> None:
    """``jax._src`` is named in one file of the shipped code, imports and strings alike:
    ``common/_jaxcompat.py`` (tests may probe JAX directly, to measure what the code relies on
    independently of it; ``common/README.md`` says where the one file is)."""
    shipped = ("common", *ADAPTERS, "examples", "benchmarks", "fixtures")
    users = sorted(str(p.relative_to(REPO)) for top in shipped for p in _files(top)
                   if any(t.startswith("jax._src") for t, _ in _imports(p, "x")))
    assert users == ["common/_jaxcompat.py"]
    named = sorted(str(p.relative_to(REPO)) for top in shipped for p in _files(top)
                   if "jax._src" in p.read_text())
    assert named == ["common/_jaxcompat.py"]


#: What a core-only install has besides the standard library and the core (``pip install
#: jax-remat-plan`` and pytest: the sdist's tests in tests/test_dist.py); the adapters need their
#: framework.
COMPAT_ROOTS = frozenset({"jax", "jaxlib", "numpy", "scipy", "ml_dtypes", "opt_einsum", "pytest",
                          "yaml", "packaging", "remat_common", "__future__"})
ADAPTER_NEEDS = {"flax_remat_plugin": {"flax"}, "equinox_remat_plugin": {"equinox"}}


def _local_module(name: str, near: Path) -> Path | None:
    """The repository file behind a local import (``fixtures.x``, ``examples.a.b``, a helper next
    to the test or in its ``data/`` folder), or None."""
    rel = name.replace(".", "/")
    for base in (REPO, near, near / "data"):
        for p in (base / f"{rel}.py", base / rel / "__init__.py"):
            if p.is_file():
                return p
    return None


def _top_level_needs(path: Path, seen: frozenset[Path] = frozenset()) -> list[tuple[int, str]]:
    """(line, package) for each module-level import of ``path`` that a core-only install lacks,
    up to the first ``pytest.importorskip`` of such a package (the module is skipped there); local
    modules count with what they import."""
    import sys

    out = []
    for node in ast.parse(path.read_text(), str(path)).body:
        call = node.value if isinstance(node, (ast.Expr, ast.Assign)) else None
        if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                and call.func.attr == "importorskip" and call.args
                and isinstance(call.args[0], ast.Constant)
                and str(call.args[0].value).split(".")[0] not in COMPAT_ROOTS):
            break
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [f"{node.module}.{a.name}" if _local_module(f"{node.module}.{a.name}", path.parent)
                     else node.module for a in node.names]
        else:
            continue
        for name in names:
            root = name.split(".")[0]
            local = _local_module(name, path.parent)
            if root in COMPAT_ROOTS or root in sys.stdlib_module_names:
                needs: set[str] = set()
            elif root in ADAPTER_NEEDS:
                needs = ADAPTER_NEEDS[root]
            elif local is not None:
                needs = ({n for _, n in _top_level_needs(local, seen | {path})}
                         if local not in seen else set())
            else:
                needs = {root}
            out += [(node.lineno, n) for n in sorted(needs)]
    return out


def _function_needs(path: Path) -> list[tuple[int, str]]:
    """(line, package) for each import inside a module-level function of ``path`` (a test, a
    fixture) that a core-only install lacks and that no ``pytest.importorskip`` of that package
    in the function guards: there the test errors instead of being skipped."""
    import sys

    out = []
    for fn in ast.parse(path.read_text(), str(path)).body:
        if not isinstance(fn, ast.FunctionDef):
            continue
        skipped = {str(c.args[0].value).split(".")[0] for c in ast.walk(fn)
                   if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
                   and c.func.attr == "importorskip" and c.args and isinstance(c.args[0], ast.Constant)}
        for node in ast.walk(fn):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                root = name.split(".")[0]
                if root in COMPAT_ROOTS or root in sys.stdlib_module_names:
                    continue
                local = _local_module(name, path.parent)
                needs = (ADAPTER_NEEDS[root] if root in ADAPTER_NEEDS else
                         {n for _, n in _top_level_needs(local)} if local is not None else {root})
                out += [(node.lineno, n) for n in sorted(needs - skipped)]
    return out


def test_test_functions_import_frameworks_only_behind_importorskip() -> None:
    """The same for imports inside a test or fixture (a core-only install runs the module, so
    such an import must follow ``pytest.importorskip`` of the package in the function: the test
    is then skipped there, not failed; ``pip install <sdist> && pytest`` passes)."""
    import fnmatch

    needs = _conftest_needs()
    module_level = {"flax", "equinox", "optax", "orbax", "matplotlib", "rich"}
    bad = []
    for p in _files("tests"):
        rel = str(p.relative_to(REPO))
        if not p.name.startswith("test_"):
            continue
        skipped_file = {pkg for pkg, globs in needs.items() if any(fnmatch.fnmatch(rel, g) for g in globs)}
        top = ast.parse(p.read_text()).body
        skipped_file |= {str(c.value.args[0].value).split(".")[0] for c in top
                         if isinstance(c, (ast.Expr, ast.Assign)) and isinstance(c.value, ast.Call)
                         and isinstance(c.value.func, ast.Attribute)
                         and c.value.func.attr == "importorskip" and c.value.args
                         and isinstance(c.value.args[0], ast.Constant)}
        if "flax" in skipped_file:  # flax installs optax and orbax-checkpoint with it
            skipped_file |= {"optax", "orbax"}
        bad += [f"{rel}:{line}: imports {pkg} without pytest.importorskip({pkg!r})"
                for line, pkg in _function_needs(p) if pkg not in skipped_file
                and pkg in module_level]
    assert bad == []


def _conftest_needs() -> dict[str, list[str]]:
    """The root conftest's ``_NEEDS``: package -> globs of files not collected without it."""
    for node in ast.parse((REPO / "conftest.py").read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "_NEEDS" for t in node.targets):
            return ast.literal_eval(node.value)  # type: ignore[no-any-return]
    raise AssertionError("conftest.py no longer defines _NEEDS")


def test_test_modules_import_frameworks_only_behind_importorskip() -> None:
    """A core-only install collects the test modules without flax, equinox, optax or orbax
    installed: a module-level import of one of them must follow ``pytest.importorskip``, or
    the root conftest's ``_NEEDS`` must leave the file out there."""
    import fnmatch

    needs = _conftest_needs()
    bad = []
    for p in [*_files("tests"), *_files("fixtures")]:
        rel = str(p.relative_to(REPO))
        if not p.name.startswith("test_"):
            continue
        if any(fnmatch.fnmatch(rel, g) for globs in needs.values() for g in globs):
            continue  # not collected where one of those packages is missing
        bad += [f"{rel}:{line}: imports {pkg} before pytest.importorskip({pkg!r})"
                for line, pkg in _top_level_needs(p)]
    assert bad == []
