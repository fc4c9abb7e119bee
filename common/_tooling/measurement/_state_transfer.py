"""What keeping training state on host costs a step: the bytes it moves over the host link.

A plan's ``state:`` keeps the optimizer state (and, when asked, the parameters) in host memory
between steps; each step brings them to the device and writes them back. This module prices that
traffic at a device profile's host link, apart from the activation offload a plan's rules move.
New beside the tuner and the breakdown, so that they can take it up with small hooks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from ..._state import STATE_KEYS, StatePlacement
from ..targets._profiles import HostLink


@dataclasses.dataclass(frozen=True)
class StateTransfer:
    """The host traffic of a state placement, per step and per device.

    Attributes:
      placement: where the state lives between steps.
      host_bytes: bytes of state kept in host memory between steps.
      transfer_bytes: bytes moved over the host link per step: each host part to the device and
        back (twice ``host_bytes``).

    >>> t = state_transfer({"params": 100, "optimizer": 200}, StatePlacement(optimizer="host"))
    >>> t.host_bytes, t.transfer_bytes
    (200, 400)
    """

    placement: StatePlacement
    host_bytes: int
    transfer_bytes: int

    def seconds(self, link: HostLink) -> float:
        """Seconds the transfers take at ``link`` (each direction at its bandwidth, one after the
        other: an upper bound where the link carries both at once)."""
        return link.seconds(self.transfer_bytes)

    def describe(self, link: HostLink | None = None) -> str:
        if not self.host_bytes:
            return "training state on device (no host traffic)"
        text = (f"{self.placement.describe()}: {self.host_bytes / 2**20:,.1f} MiB on host, "
                f"{self.transfer_bytes / 2**20:,.1f} MiB over the host link per step")
        if link is not None:
            text += f" ({1e3 * self.seconds(link):.2f} ms at {link.bytes_per_s / 1e9:g} GB/s)"
        return text


def state_transfer(state_bytes: Mapping[str, int], placement: StatePlacement) -> StateTransfer:
    """The traffic of ``placement`` for a state of ``state_bytes`` (``{role: bytes}``, as
    ``remat_common.state.state_bytes`` gives them)."""
    host = sum(int(state_bytes.get(k, 0)) for k in STATE_KEYS if k in placement.on_host)
    return StateTransfer(placement, host, 2 * host)
