"""Collection rules for the whole repository (doctests in the packages, tests/).

A core-only install (``pip install jax-remat-plan``, no Flax/Equinox/optax/orbax; the sdist's tests
in tests/test_dist.py run there) collects what it can: files that need a missing framework are
not collected.
"""

import importlib.util

import pytest

_NEEDS = {
    "flax": ["flax_remat_plugin/*", "tests/test_flax_*.py", "fixtures/nnx_models.py",
             "fixtures/fat_mlp.py", "tests/test_adapter_contract.py", "tests/test_nnx_touch.py", "tests/test_verify_plans.py",
             "tests/test_shell_blocks.py", "tests/test_host_state.py", "tests/test_state_report.py"],
    "equinox": ["equinox_remat_plugin/*", "tests/test_eqx_*.py", "fixtures/eqx_models.py",
                "tests/test_adapter_contract.py", "tests/test_no_silent_drop.py",
                "tests/test_verify_plans.py", "tests/test_shell_blocks.py", "docs/equinox.md",
                "tests/test_host_state.py", "tests/test_state_report.py"],
    "optax": ["examples/*", "tests/test_examples.py", "tests/test_scale.py", "tests/test_multihost.py",
              "tests/test_shell_blocks.py", "tests/test_host_state.py", "tests/test_state_report.py"],
    "orbax": ["examples/*", "tests/test_examples.py", "tests/test_multihost.py",
              "tests/test_shell_blocks.py", "tests/test_host_state.py"],
    "matplotlib": ["tests/test_report*.py"],
    "rich": ["tests/test_report*.py"],
}

# scripts and the tests' data (models the tests import), not test modules
collect_ignore_glob = ["examples/*", "benchmarks/*", "tests/data/*"]
for _module, _globs in _NEEDS.items():
    if importlib.util.find_spec(_module) is None:
        collect_ignore_glob += _globs



def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--remat3", choices=("both", "on", "off"), default="both",
        help="the tests run with jax_remat3 off and on (the remat3 fixture, ids remat3-off and "
             "remat3-on): both (the default), or only the one named where a test has both")
    parser.addoption(
        "--version-paths", action="store_true",
        help="only the tests that take a JAX version's own code path or the framework's: those "
             "run with jax_remat3 (the remat3 and remat3_on fixtures) and the files of "
             "VERSION_FILES; the jax 0.11.0 stage of ./scripts/test "
             "(docs/testing.md)")


def _remat3_only(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``--remat3 on|off``: deselects a test's other ``jax_remat3`` value where it has both; a
    test parametrized with one value only (ids name ``remat3-on`` or ``remat3-off`` without the
    other) runs as it is. ``./scripts/test``'s jax 0.11.0 and 0.12 stages run ``--remat3 on``
    (docs/testing.md says why)."""
    keep = config.getoption("remat3", "both")
    if keep == "both":
        return
    drop = "off" if keep == "on" else "on"
    ids = {item.nodeid for item in items}
    out = [item for item in items if f"remat3-{drop}" in item.nodeid
           and item.nodeid.replace(f"remat3-{drop}", f"remat3-{keep}") in ids]
    if out:
        config.hook.pytest_deselected(items=out)
        gone = set(map(id, out))
        items[:] = [item for item in items if id(item) not in gone]


#: Besides the tests run with ``jax_remat3``, what ``--version-paths`` keeps: the Flax adapter's
#: tests (the jax 0.11.0 stage's lock has Flax 0.12.8, the others 0.12.12), JAX's known failures
#: (fixed in which version) and the version predicates.
VERSION_FILES = ("tests/test_flax_", "tests/test_nnx_", "flax_remat_plugin/",
                 "tests/test_known_failures.py", "tests/test_jaxcompat.py")


def _version_paths(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``--version-paths``: deselects every test but those that run with ``jax_remat3`` on (this
    project's code takes a JAX version's own path only there, common/_jaxcompat.py; JAX's remat3
    bugs are a version's own) and those of :data:`VERSION_FILES`."""
    if not config.getoption("version_paths", False):
        return
    keep = [item for item in items
            if {"remat3", "remat3_on"} & set(getattr(item, "fixturenames", ()))
            or item.nodeid.startswith(VERSION_FILES)]
    gone = [item for item in items if item not in keep]
    if gone:
        config.hook.pytest_deselected(items=gone)
        items[:] = keep


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skips the ``device`` tests where JAX's backend is the CPU (no TPU or GPU to run on), and
    the ``cpu_figures`` tests where it is not, each with its marker's reason. JAX picks its
    backend only when such a test is collected. With ``--remat3 on`` (or ``off``), deselects
    the other value of the tests that run with both."""
    _remat3_only(config, items)
    _version_paths(config, items)
    device = [item for item in items if item.get_closest_marker("device") is not None]
    cpu = [item for item in items if item.get_closest_marker("cpu_figures") is not None]
    if not device and not cpu:
        return
    import jax

    backend = jax.default_backend()
    if backend == "cpu":
        skip = pytest.mark.skip(reason="needs a real accelerator (TPU/GPU device); JAX's backend "
                                       "here is cpu")
        for item in device:
            item.add_marker(skip)
        return
    for item in cpu:
        mark = item.get_closest_marker("cpu_figures")
        why = mark.args[0] if mark is not None and mark.args else ""
        if not why:
            raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.cpu_figures needs its reason: "
                                    "what of XLA:CPU's compile it asserts, and where the "
                                    f"{backend} figures are checked instead")
        item.add_marker(pytest.mark.skip(reason=f"XLA:CPU's figures, the backend here is "
                                                f"{backend}: {why}"))


# Under pytest-xdist every test file runs whole on one worker, so the tests of a file share what
# their module and JAX's in-process caches build once (fixtures, models, traced and compiled
# programs). Measured on the jax 0.11.2 stage (2 workers): splitting five long files test by test
# over both workers cost 1465 s of test time against 1298 s whole (tests/test_verify_real_models.py
# alone 61 s more), 759 s against 667 s of wall time; xdist's count-ordered queue of files keeps
# both workers busy to the end either way. (The one exception, :data:`SPLIT`: three TPU compiles of
# tests/test_targets.py, which share three small CPU compiles with the rest of their file.)
# optionalhook: with xdist installed but not loaded (`-p no:xdist`) pytest does not know the hook.
if importlib.util.find_spec("xdist") is not None:

    #: Files that take long for their number of tests (processes started, installs, searches):
    #: handed out first, so that none is left running alone at a stage's end (xdist orders files
    #: by their number of tests; tests/test_multihost.py, one test of 42 s, came last in the jax
    #: 0.11.2 stage and tests/test_sharded_vocabulary.py in the others, 30-40 s of one idle core).
    #: The target stage's three long files lead it (tests/test_targets.py, 273 s there, started
    #: after tests/test_host_state.py and ran alone at the stage's end: 336 s for 294 s a worker);
    #: elsewhere tests/test_targets.py is skipped at once.
    LONG_FIRST = ("tests/test_targets.py", "tests/test_targets.py::(split)",
                  "tests/test_shell_blocks.py", "tests/test_host_state.py",
                  "tests/test_state_report.py", "tests/test_dist.py",
                  "tests/test_tune_layouts.py", "tests/test_tune.py", "tests/test_multihost.py",
                  "tests/test_sharded_vocabulary.py", "tests/test_flax_train.py",
                  "tests/test_eqx_sharding.py", "tests/test_capacity_check.py",
                  "tests/test_bad_input_cli.py")

    #: Tests that run as a work unit of their own (scope ``FILE::(split)``), apart from the rest
    #: of their file: tests/test_targets.py took 334 s of the target stage's 752 s of worker time
    #: (two workers: 407 s of wall time), on one worker beside tests/test_state_report.py and
    #: tests/test_host_state.py (192 s and 155 s) on the other. These three TPU compiles (159 s)
    #: go to whichever worker is free; the module fixture they share with the rest (three small
    #: CPU compiles) is built on both.
    SPLIT = {"tests/test_targets.py": ("test_capacity_on_a_tpu_topology", "test_tpu_target_figures",
                                       "test_tune_on_a_deep_scan_compiles_no_one_layer_transients")}

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_make_scheduler(config, log):  # type: ignore[no-untyped-def]
        """The default `--dist load`, scheduled by file (xdist's `--dist loadfile`; the tests of
        :data:`SPLIT` apart from their file), the files of :data:`LONG_FIRST` first."""
        if config.getvalue("dist") != "load":
            return None  # the user chose another distribution: xdist's own
        from xdist.scheduler import LoadFileScheduling

        class LongFirst(LoadFileScheduling):  # type: ignore[misc]
            def _assign_work_unit(self, node):  # type: ignore[no-untyped-def]
                if not getattr(self, "_long_first", False):  # before the first file is handed out
                    self._long_first = True
                    queue = self.workqueue
                    for scope in [s for s in reversed(LONG_FIRST) if s in queue]:
                        queue.move_to_end(scope, last=False)
                return super()._assign_work_unit(node)

            def _split_scope(self, nodeid: str) -> str:  # type: ignore[no-untyped-def]
                path, _, name = nodeid.partition("::")
                return f"{path}::(split)" if name.partition("[")[0] in SPLIT.get(path, ()) else path

        return LongFirst(config, log)
