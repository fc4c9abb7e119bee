"""The files here are data for tests/test_lint.py: hazards for ``remat lint`` to find. They are
never imported or collected (several fail to import on the shipped JAX wheels on purpose)."""

collect_ignore_glob = ["*.py"]
