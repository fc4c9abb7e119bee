"""Accelerators: the chips, meshes and compilers a step is compiled for, with no device needed.

An accelerator is parsed from a name (``h100x8``, ``v5e:2x2``, a GPU target config:
:func:`parse_accelerator`), a mesh from its axes (:func:`parse_mesh`); :func:`compile_for` lowers
and compiles a step for them and returns what the compiler says (:class:`TargetCompile`). Device
profiles (:class:`DeviceProfile`, the host link) give the figures a budget and a step time are
read against. Imports the core only.
"""

from ._accelerators import Accelerator as Accelerator
from ._accelerators import compiler_available as compiler_available
from ._accelerators import device_count as device_count
from ._accelerators import parse_accelerator as parse_accelerator
from ._accelerators import target_kinds as target_kinds
from ._compilers import compile_for as compile_for
from ._compilers import TargetCompile as TargetCompile
from ._hlo import host_placements as host_placements
from ._meshes import parse_mesh as parse_mesh
from ._profiles import DeviceProfile as DeviceProfile
from ._profiles import data_sheet_note as data_sheet_note
from ._profiles import fit_profile as fit_profile
from ._profiles import host_link as host_link
from ._profiles import HostLink as HostLink
from ._profiles import load_profile as load_profile
from ._units import parse_bytes as parse_bytes

__all__ = [
    "Accelerator",
    "DeviceProfile",
    "HostLink",
    "TargetCompile",
    "compile_for",
    "compiler_available",
    "data_sheet_note",
    "device_count",
    "fit_profile",
    "host_link",
    "host_placements",
    "load_profile",
    "parse_accelerator",
    "parse_bytes",
    "parse_mesh",
    "target_kinds",
]
