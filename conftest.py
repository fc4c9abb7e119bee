"""Collection rules for the whole repository (doctests in the packages, tests/).

The compatibility environment (jax 0.12, no Flax/Equinox/optax/orbax) runs only the core's
``compat`` tests; files that need a missing framework are not collected there.
"""

import importlib.util

_NEEDS = {
    "flax": ["flax_remat_plugin/*", "tests/test_flax_*.py", "fixtures/nnx_models.py",
             "tests/test_adapter_contract.py"],
    "equinox": ["equinox_remat_plugin/*", "tests/test_eqx_*.py", "fixtures/eqx_models.py",
                "tests/test_adapter_contract.py"],
    "optax": ["examples/*", "tests/test_examples.py"],
    "orbax": ["examples/*", "tests/test_examples.py"],
    "matplotlib": ["tests/test_report*.py"],
    "rich": ["tests/test_report*.py"],
}

collect_ignore_glob = ["examples/*", "benchmarks/*"]  # scripts, not test modules
for _module, _globs in _NEEDS.items():
    if importlib.util.find_spec(_module) is None:
        collect_ignore_glob += _globs

# Test files whose module fixtures compile or train for tens of seconds: under pytest-xdist each
# runs on one worker, so those fixtures are built once, not once per worker. (xdist's own
# `--dist loadgroup` does not group with pytest 9.2: it renames items through an attribute that
# pytest 9 no longer reads.)
_ONE_WORKER = frozenset({"tests/test_tune.py", "tests/test_examples.py", "tests/test_flax_annotate.py"})

if importlib.util.find_spec("xdist") is not None:

    def pytest_xdist_make_scheduler(config, log):  # type: ignore[no-untyped-def]
        """The default `--dist load`, but the files above go whole to one worker each."""
        if config.getvalue("dist") != "load":
            return None  # the user chose another distribution: xdist's own
        from xdist.scheduler import LoadScopeScheduling

        class _Scheduler(LoadScopeScheduling):
            def _split_scope(self, nodeid: str) -> str:
                path = nodeid.split("::", 1)[0]
                return path if path in _ONE_WORKER else nodeid

        return _Scheduler(config, log)
