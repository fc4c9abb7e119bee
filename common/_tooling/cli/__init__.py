"""The ``remat`` command line: one module per subcommand (``docs``, ``doctor``, ``lint``,
``report``, ``tune``), each registering its parser with :func:`main`'s.

The top of the layering: it may import every other tooling package; none imports it.
"""

from ._main import main as main

__all__ = [
    "main",
]
