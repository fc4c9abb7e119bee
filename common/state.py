"""Training state between steps: where a plan keeps parameters and optimizer state, and the jitted
step that honours it
(https://github.com/jax-remat-plan/jax-remat-plan/blob/main/docs/semantics.md#training-state-on-host).

A plan's ``state: {optimizer: host, params: device}`` keeps the optimizer state (and, when asked,
the parameters) in host memory (``pinned_host``) between steps, or a part of them
(``{optimizer: {host: 0.5}}``: the last half of the layers; ``{params: {host: "blocks.*"}}``:
:func:`host_roles` says which arrays); :func:`jit_state_step` compiles a
training step that takes them with host shardings, brings them to the device inside the program,
and writes the updated state back to host; :func:`stream_update` runs the update with the host
parts brought to the device a few arrays at a time. The adapters say which array is what
(``flax_remat_plugin.state_roles``, ``equinox_remat_plugin.state_roles``).
"""

from ._state import MEMORY_KINDS as MEMORY_KINDS
from ._state import STATE_KEYS as STATE_KEYS
from ._state import STATE_PLACES as STATE_PLACES
from ._state import StatePlacement as StatePlacement
from ._state import default_shardings as default_shardings
from ._state import fetch as fetch
from ._state import host_roles as host_roles
from ._state import jit_state_step as jit_state_step
from ._state import on_device as on_device
from ._state import place_state as place_state
from ._state import state_bytes as state_bytes
from ._state import state_shardings as state_shardings
from ._stream import WINDOW as WINDOW
from ._stream import stream_update as stream_update

__all__ = [
    "MEMORY_KINDS",
    "STATE_KEYS",
    "STATE_PLACES",
    "StatePlacement",
    "WINDOW",
    "default_shardings",
    "fetch",
    "host_roles",
    "jit_state_step",
    "on_device",
    "place_state",
    "state_bytes",
    "state_shardings",
    "stream_update",
]
