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
