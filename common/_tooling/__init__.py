"""Tooling, apart from the runtime: lint, doctor, measurement and its report, the ``remat`` CLI.

Nothing in the runtime core (``common/_*.py``) imports this package; its public names are
re-exported by ``remat_common.lint``, ``remat_common.measurement`` and ``remat_common.manifest``.
"""
