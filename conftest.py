"""Collection rules for the whole repository (doctests in the packages, tests/).

A core-only install (``pip install jax-remat-plan``, no Flax/Equinox/optax/orbax; the sdist's tests
in tests/test_dist.py run there) collects what it can: files that need a missing framework are
not collected.
"""

import importlib.util

_NEEDS = {
    "flax": ["flax_remat_plugin/*", "tests/test_flax_*.py", "fixtures/nnx_models.py",
             "tests/test_adapter_contract.py", "tests/test_nnx_touch.py", "tests/test_verify_plans.py"],
    "equinox": ["equinox_remat_plugin/*", "tests/test_eqx_*.py", "fixtures/eqx_models.py",
                "tests/test_adapter_contract.py", "tests/test_no_silent_drop.py",
                "tests/test_verify_plans.py"],
    "optax": ["examples/*", "tests/test_examples.py", "tests/test_scale.py", "tests/test_multihost.py"],
    "orbax": ["examples/*", "tests/test_examples.py", "tests/test_multihost.py"],
    "matplotlib": ["tests/test_report*.py"],
    "rich": ["tests/test_report*.py"],
}

collect_ignore_glob = ["examples/*", "benchmarks/*"]  # scripts, not test modules
for _module, _globs in _NEEDS.items():
    if importlib.util.find_spec(_module) is None:
        collect_ignore_glob += _globs

# Under pytest-xdist every test file runs whole on one worker, so the tests of a file share what
# their module builds once (fixtures, models, compiled programs); the files in _SPLIT, long and
# made of independent tests, go test by test to whichever worker is free, which keeps both busy
# to the end. (xdist's own `--dist loadgroup` does not group with pytest 9.2: it renames items
# through an attribute that pytest 9 no longer reads.)
_SPLIT = frozenset({"tests/test_verify_real_models.py", "tests/test_bad_input.py",
                    "tests/test_custom_rules.py", "tests/test_maxtext_presets.py",
                    "tests/test_shell_blocks.py"})

if importlib.util.find_spec("xdist") is not None:

    def pytest_xdist_make_scheduler(config, log):  # type: ignore[no-untyped-def]
        """The default `--dist load`, scheduled by file except for the files in _SPLIT."""
        if config.getvalue("dist") != "load":
            return None  # the user chose another distribution: xdist's own
        from xdist.scheduler import LoadScopeScheduling

        class _Scheduler(LoadScopeScheduling):
            def _split_scope(self, nodeid: str) -> str:
                path = nodeid.split("::", 1)[0]
                return nodeid if path in _SPLIT else path

        return _Scheduler(config, log)
