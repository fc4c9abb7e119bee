"""Tooling, apart from the runtime: packages by capability, importing one way.

``cli`` → ``tune``, ``doctor`` → ``report`` → ``measurement`` → ``breakdown`` → ``accelerators``,
``lint`` → the core. Each package's ``__init__`` names what it offers. Nothing in the runtime core
(``common/_*.py``) imports this package; its public names are re-exported by
``remat_common.lint``, ``remat_common.measurement`` and ``remat_common.manifest``. The layers:
https://github.com/jax-remat-plan/jax-remat-plan/blob/main/docs/architecture.md#the-layers.
"""
