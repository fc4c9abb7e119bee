"""The checks a TPU or GPU machine runs on this repository's example GPTs: the capacity check
(``scripts/capacity_check``: the largest model one device trains, with no plan, an activation plan
and state on host) and the device check (``scripts/device_check``: the device's compile beside the
deviceless one, step times against the time model). Each is a ``main(argv) -> int``; the scripts
are their entry points.

The top of the layering, above the CLI, whose argument types and report config it takes: it may
import every other tooling package; none imports it. It imports the repository's ``examples``
package, which the scripts put on ``sys.path``.
"""

from ._capacity import concrete_builds as concrete_builds
from ._capacity import example_model as example_model
from ._capacity import example_plan as example_plan
from ._capacity import example_step as example_step
from ._capacity import train_example as train_example
from ._capacity_cli import main as capacity_check
from ._device_cli import main as device_check

__all__ = [
    "capacity_check",
    "concrete_builds",
    "device_check",
    "example_model",
    "example_plan",
    "example_step",
    "train_example",
]
