"""``remat doctor``: what this installation can do, and what to fix where it cannot.

:func:`diagnose` checks the installed JAX, jaxlib and frameworks against the supported range and
probes each feature the plans rely on; :func:`manifest` is the same as data. Imports the targets
and the core.
"""

from ._doctor import diagnose as diagnose
from ._doctor import manifest as manifest

__all__ = [
    "diagnose",
    "manifest",
]
