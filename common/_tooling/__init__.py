"""Tooling, apart from the runtime: packages by capability, importing one way (docs/architecture.md).

``cli`` → ``tune``, ``doctor`` → ``report`` → ``measurement`` → ``breakdown`` → ``targets``,
``lint`` → the core. Each package's ``__init__`` names what it offers. Nothing in the runtime core
(``common/_*.py``) imports this package; its public names are re-exported by
``remat_common.lint``, ``remat_common.measurement`` and ``remat_common.manifest``.
"""
