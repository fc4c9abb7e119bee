"""Compiling a step for an accelerator this machine does not have: GPUs from target configs, TPU slices
by topology name, from shapes only.

JAX compiles for a device it cannot reach through a *topology*: ``jax.experimental.topologies.
get_topology_desc`` gives compile-only devices of a GPU (``jax[cuda12]`` installed, a
``GpuTargetConfigProto`` describing the device) or of a TPU slice (``jax[tpu]``: libtpu), and a
program lowered with inputs sharded on a mesh of those devices compiles with that platform's own
compiler: its ``memory_analysis()`` is the device's, per device, host memory included. Nothing runs
and no real GPU/TPU is opened: the devices are descriptions
(https://github.com/jax-remat-plan/jax-remat-plan/blob/main/docs/targets.md).

Names (:func:`parse_accelerator`): ``local`` (the default: this machine's backend), a GPU
(``a100-40g``, ``a100-80g``, ``h100``, ``h200``, ``b200``) with an optional count (``h100x8``; more
than 8 are several hosts of 8), a GPU target-config file of one's own (``my_gpu.txtpb``, ``my_gpu.txtpb:8``),
or a TPU slice by topology name (``v5e:2x2``, ``v5p:2x2x2``, ``v4``, ``v6e``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import re
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from ..._errors import RematError, short, sorted_list

_DATA = Path(__file__).parent / "gpu_targets"
_GIB = 2**30

#: Per GPU: (target-config file, peak dense bf16 FLOP/s, where that figure comes from). Device
#: memory, bandwidths and the host link (``pcie_bandwidth``) are read from the file itself.
GPUS: Mapping[str, tuple[str, float, str]] = {
    "a100-40g": ("a100-40g.txtpb", 312e12, "NVIDIA A100 data sheet: 312 TFLOP/s dense BF16"),
    "a100-80g": ("a100-80g.txtpb", 312e12, "NVIDIA A100 data sheet: 312 TFLOP/s dense BF16"),
    "h100": ("h100.txtpb", 989.4e12, "NVIDIA H100 SXM5 data sheet: 989.4 TFLOP/s dense BF16"),
    "h200": ("h200.txtpb", 989.4e12, "NVIDIA H200 SXM data sheet: 989.4 TFLOP/s dense BF16"),
    "b200": ("b200.txtpb", 2250e12, "NVIDIA HGX B200 data sheet: 2.25 PFLOP/s dense BF16 per GPU"),
}

#: Per TPU generation: (default topology, HBM bytes per device, peak bf16 FLOP/s per device, host
#: link bytes/s per direction, source). The HBM is what XLA:TPU makes available per device, the
#: limit its compiler refuses a program over (read from its out-of-memory message, libtpu for jax
#: 0.11.2: "exceeds available HBM (95.73G)"), a little below the chip's. A compile-only v4
#: topology has one device per TensorCore (two per chip), so its figures are per core. The host
#: link is not published per chip: PCIe Gen4 x16 assumed.
TPUS: Mapping[str, tuple[str, int, float, float, str]] = {
    "v4": ("v4:2x2x1", int(15.25 * _GIB), 137.5e12, 32e9,
           "Google Cloud TPU v4 system architecture page: 32 GiB HBM2, 275 TFLOP/s BF16 per chip "
           "of two TensorCores, each a device; XLA:TPU: 15.25 GiB available per core"),
    "v5e": ("v5e:2x2", int(15.75 * _GIB), 197e12, 32e9,
            "Google Cloud TPU v5e system architecture page: 16 GiB HBM2, 197 TFLOP/s BF16 per "
            "chip; XLA:TPU: 15.75 GiB available"),
    "v5p": ("v5p:2x2x1", int(95.73 * _GIB), 459e12, 32e9,
            "Google Cloud TPU v5p system architecture page: 95 GB HBM2e, 459 TFLOP/s BF16 per chip; "
            "XLA:TPU: 95.73 GiB available"),
    "v6e": ("v6e:2x2", int(31.24 * _GIB), 918e12, 32e9,
            "Google Cloud TPU v6e (Trillium) page: 32 GiB HBM, 918 TFLOP/s BF16 per chip; XLA:TPU: "
            "31.24 GiB available"),
}
_TPU_LINK_NOTE = "host link taken as PCIe Gen4 x16, 32 GB/s per direction (not published per chip)"

#: Per TPU generation, the slices Google Cloud rents (its TPU v4, v5e, v5p and v6e pages): the
#: dimensions a topology name has, the largest slice, and the shapes to suggest. libtpu compiles
#: for far larger ones (``v5e:32x32``, 1024 chips, of a 256-chip pod), so a name is checked
#: against these before libtpu is asked. 2D generations (v5e, v6e): each side a power of two up
#: to the largest (``v5e:2x1`` compiles, though Google rents 1x1, 2x2, 2x4, ...); 3D (v4, v5p):
#: each side 1, 2, 4 or a multiple of 4 (Google: "all <= 4 or all multiples of 4"; no side of 3
#: divides into hosts). A 3D generation also takes two sides (``v4:1x1`` is ``v4:1x1x1``).
TPU_SLICES: Mapping[str, tuple[int, tuple[int, ...], tuple[str, ...]]] = {
    "v4": (3, (16, 16, 16), ("2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8",
                             "4x8x8", "8x8x8", "8x8x16", "8x16x16", "16x16x16")),
    "v5e": (2, (16, 16), ("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16")),
    "v5p": (3, (16, 16, 24), ("2x2x1", "2x2x2", "2x4x4", "4x4x4", "4x4x8", "4x8x8",
                              "8x8x8", "8x8x16", "8x16x16", "16x16x16", "16x16x24")),
    "v6e": (2, (16, 16), ("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16")),
}
#: The chips of one host (one process) of a multi-host slice, as libtpu lays it out by default:
#: a slice smaller than that is one host of its own shape (libtpu refuses ``v5e:1x1`` with the
#: default: "not divisible by chips_per_host_bounds 2x2x1").
TPU_HOST_BOUNDS = (2, 2, 1)

#: GPUs per host when a count is larger than one host holds.
GPUS_PER_HOST = 8

_GPU_NAME = re.compile(r"^(?P<chip>[a-z0-9][a-z0-9-]*?)(?:x(?P<n>\d+))?$")
_TPU_NAME = re.compile(r"^(?P<chip>v\d+[a-z]*)(?::(?P<topo>\d+(?:x\d+){1,2}))?$")
_FILE_COUNT = re.compile(r"^(?P<path>.+?\.(?:txtpb|pbtxt|textproto))(?::(?P<n>\d+))?$")


def relative_to(name: str, folder: Path) -> str:
    """An accelerator name with its target-config file (``my_gpu.txtpb``, ``my_gpu.txtpb:8``)
    taken relative to ``folder`` when the path is relative; any other name as it is.

    >>> relative_to("gpu.txtpb:8", Path("/cfg")), relative_to("h100x8", Path("/cfg"))
    ('/cfg/gpu.txtpb:8', 'h100x8')
    """
    f = _FILE_COUNT.match(name)
    if f is None or Path(f.group("path")).expanduser().is_absolute():
        return name
    return str(folder / f.group("path")) + name[f.end("path"):]

INSTALL = {
    "cuda": "pip install 'jax-remat-plan[target-gpu]'   (jax[cuda12]=={v}; ~5.4 GB)",
    "tpu": "pip install 'jax-remat-plan[target-tpu]'   (jax[tpu]=={v}: libtpu; ~1.2 GB)",
}

_MSG_NAME = """\
accelerator {name}: {why}.
Give one of: local (this machine, the default); a GPU {gpus}, optionally with a count (h100x8; more
than {per_host} are several hosts of {per_host}: h100x16); a GPU target-config file of your own
(my_gpu.txtpb, my_gpu.txtpb:8 for 8 of them); or a TPU slice by topology name ({tpus}, e.g.
v5e:2x2, v5p:2x2x2)."""


_MSG_TPU_SLICE = """\
accelerator {name}: {why}.
A {chip} slice is {form}, at most {largest} ({most:,} chips); Google Cloud rents {rented}.
Fix: give one of those, e.g. {chip}:{suggest}."""


def _tpu_sides(topo: str) -> tuple[int, ...]:
    """The sides of a TPU topology, three of them (``v4:1x1`` is ``1x1x1``)."""
    sides = tuple(int(n) for n in topo.split("x"))
    return sides + (1,) * (3 - len(sides))


def tpu_host_bounds(topo: str) -> tuple[int, int, int]:
    """``chips_per_host_bounds`` of a TPU topology (``v5e:1x1`` -> ``(1, 1, 1)``): the host that
    libtpu lays a slice out on by default, :data:`TPU_HOST_BOUNDS`, cut down to the slice where
    the slice is smaller (``v5e:2x1`` is one host of 2x1 chips).

    >>> tpu_host_bounds("1x1"), tpu_host_bounds("2x1"), tpu_host_bounds("2x2x2")
    ((1, 1, 1), (2, 1, 1), (2, 2, 1))
    """
    a, b, c = _tpu_sides(topo)
    h = TPU_HOST_BOUNDS
    return (min(a, h[0]), min(b, h[1]), min(c, h[2]))


def _check_tpu_slice(name: str, chip: str, topo: str) -> None:
    """Refuses a topology no Google Cloud slice has (before libtpu, which compiles for more)."""
    dims, largest, rented = TPU_SLICES[chip]
    given = tuple(int(n) for n in topo.split("x"))
    sides = _tpu_sides(topo)
    chips = math.prod(sides)
    most = math.prod(largest)
    why = None
    if dims == 2 and len(given) != 2:
        why = f"a {chip} slice has two sides (AxB), not {len(given)}"
    elif 0 in given:
        why = f"{topo} has a side of 0"
    elif chips > most:
        why = f"{topo} is {chips:,} chips, more than the largest {chip} slice"
    elif any(s > m for s, m in zip(sorted(sides), sorted(largest + (1,) * (3 - dims)))):
        why = f"{topo} is longer on a side than the largest {chip} slice"
    elif dims == 2 and (bad := [s for s in given if s & (s - 1)]):
        why = f"a side of {bad[0]} is not a power of two"
    elif dims == 3 and (bad := [s for s in sides if s > 2 and s % 4]):
        why = f"a side of {bad[0]} is neither 1, 2 nor a multiple of 4"
    if why is None:
        return
    fits = [r for r in rented if math.prod(_tpu_sides(r)) >= chips]
    raise RematError(_MSG_TPU_SLICE.format(
        name=short(name), why=why, chip=chip, largest="x".join(map(str, largest)), most=most,
        form=("AxB, each side a power of two" if dims == 2
              else "AxBxC, each side 1, 2, 4 or a multiple of 4"),
        rented=", ".join(rented), suggest=fits[0] if fits else rented[-1]))


def _name_error(name: Any, why: str) -> RematError:
    return RematError(_MSG_NAME.format(name=short(name), why=why, gpus=", ".join(GPUS),
                                       tpus=", ".join(TPUS), per_host=GPUS_PER_HOST))


@dataclasses.dataclass(frozen=True)
class Accelerator:
    """What a step is compiled for.

    Attributes:
      name: as given, normalised (``h100x8``, ``v5p:2x2x2``, ``local``).
      platform: ``local``, ``cuda`` or ``tpu``.
      chip: ``h100``, ``v5p``, or the target-config file's path.
      count: GPUs (TPUs: ``None``, the topology decides).
      hosts: GPU hosts (``count`` split into hosts of :data:`GPUS_PER_HOST`).
      topology: what ``get_topology_desc`` is given (``1x1x8``, ``v5p:2x2x2``).
      config: the GPU target config (text), ``None`` otherwise.
      memory_bytes: device memory per device (GPUs: ``device_memory_size`` of the config; TPUs:
        :data:`TPUS`); ``None`` for ``local``.
      host_link_bytes_per_s: host <-> device bandwidth per direction (GPU: ``pcie_bandwidth`` of
        the config).
      flops_per_s: peak dense bf16 FLOP/s per device.
      source: where each figure comes from.
    """

    name: str
    platform: str
    chip: str
    count: int | None = None
    hosts: int = 1
    topology: str = ""
    config: str | None = dataclasses.field(default=None, repr=False)
    memory_bytes: int | None = None
    host_link_bytes_per_s: float | None = None
    flops_per_s: float | None = None
    source: str = ""

    @property
    def is_local(self) -> bool:
        return self.platform == "local"

    def describe(self) -> str:
        """One line: what it is, how many, device memory."""
        if self.is_local:
            return "local (this machine's backend)"
        mem = f", {self.memory_bytes / _GIB:.1f} GiB each" if self.memory_bytes else ""
        if self.platform == "cuda":
            return f"{self.name}: {self.count} x {self.chip} GPU on {self.hosts} host(s){mem}"
        return f"{self.name}: TPU slice {self.topology}{mem}"


LOCAL = Accelerator("local", "local", "local")


def _config_figure(text: str, field: str) -> float | None:
    m = re.search(rf"\b{field}\s*:\s*([0-9.eE+]+)", text)
    return float(m.group(1)) if m else None


def _gpu(chip: str, config: str, count: int, name: str, flops: float | None, source: str
         ) -> Accelerator:
    if count < 1:
        raise _name_error(name, "the count must be at least 1")
    if count > GPUS_PER_HOST and count % GPUS_PER_HOST:
        raise _name_error(name, f"{count} GPUs do not split into hosts of {GPUS_PER_HOST}; give a "
                                f"count up to {GPUS_PER_HOST} or a multiple of it")
    hosts = max(1, count // GPUS_PER_HOST) if count > GPUS_PER_HOST else 1
    per_host = count // hosts
    mem = _config_figure(config, "device_memory_size")
    link = _config_figure(config, "pcie_bandwidth")
    src = source + "; device memory (device_memory_size) and host link (pcie_bandwidth) from the " \
                   "target config"
    return Accelerator(name, "cuda", chip, count, hosts, f"1x{hosts}x{per_host}", config,
                       None if mem is None else int(mem), link, flops, src)


def parse_accelerator(name: str | Accelerator | None) -> Accelerator:
    """The :class:`Accelerator` a name stands for (``None`` and ``"local"``: this machine).

    >>> parse_accelerator("h100x8").describe()
    'h100x8: 8 x h100 GPU on 1 host(s), 79.1 GiB each'
    >>> a = parse_accelerator("h200x16"); (a.hosts, a.topology)
    (2, '1x2x8')
    >>> parse_accelerator("v5p:2x2x2").topology
    'v5p:2x2x2'

    Raises:
      RematError: an unknown name, a count that does not split into hosts, a missing file.
    """
    if isinstance(name, Accelerator):
        return name
    if name is None:
        return LOCAL
    if not isinstance(name, str):
        raise _name_error(name, f"a {type(name).__name__} is not an accelerator name")
    key = name.strip()
    if key.lower() in ("", "local"):
        return LOCAL
    f = _FILE_COUNT.match(key)
    if f is not None:
        path = Path(f.group("path")).expanduser()
        if not path.is_file():
            raise _name_error(name, f"the target-config file {str(path)!r} does not exist")
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise _name_error(name, f"the target-config file {str(path)!r} cannot be read "
                                    f"({type(e).__name__})") from None
        if "gpu_device_info" not in text:
            raise _name_error(name, f"{str(path)!r} holds no gpu_device_info: it is not a "
                                    "GpuTargetConfigProto in text form (see XLA's "
                                    "xla/backends/gpu/target_config/specs/*.txtpb)")
        return _gpu(str(path), text, int(f.group("n") or 1), key, None, f"from {path}")
    low = key.lower()
    t = _TPU_NAME.match(low)
    if t is not None and t.group("chip") in TPUS:
        chip = t.group("chip")
        default, mem, flops, link, source = TPUS[chip]
        if t.group("topo"):
            _check_tpu_slice(key, chip, t.group("topo"))
        topo = f"{chip}:{t.group('topo')}" if t.group("topo") else default
        return Accelerator(topo, "tpu", chip, None, 1, topo, None, mem, link, flops,
                           f"{source}; {_TPU_LINK_NOTE}")
    g = _GPU_NAME.match(low)
    if g is not None and g.group("chip") in GPUS:
        chip = g.group("chip")
        file, flops, source = GPUS[chip]
        n = int(g.group("n") or 1)
        return _gpu(chip, (_DATA / file).read_text(), n, f"{chip}x{n}" if g.group("n") else chip,
                    flops, source)
    if t is not None:
        raise _name_error(name, f"unknown TPU generation {t.group('chip')!r}")
    raise _name_error(name, "unknown accelerator")


# -- the compilers ---------------------------------------------------------------------------------

def _install_line(platform: str) -> str:
    return INSTALL[platform].format(v=jax.__version__)


def compiler_available(platform: str) -> str | None:
    """``None`` when this machine can compile for ``platform`` (``cuda``, ``tpu``), else why not."""
    import importlib.util

    def have(module: str) -> bool:
        try:
            return importlib.util.find_spec(module) is not None
        except ImportError:  # its parent package is missing
            return False

    if platform == "cuda" and not (have("jax_plugins.xla_cuda12") or have("jax_cuda12_plugin")):
        return "the CUDA compiler plugin (jax[cuda12]) is not installed"
    if platform == "tpu":
        # Where JAX looks (jax._src.cloud_tpu_init.get_tpu_library_path): the file that
        # TPU_LIBRARY_PATH names (a TPU host's own libtpu, no package needed), else the libtpu
        # package. JAX falls back to the package, with a warning, where the file is missing; the
        # figures depend on libtpu's version, so a missing file is said rather than passed over.
        path = os.environ.get("TPU_LIBRARY_PATH")
        if path is not None:
            return None if os.path.isfile(path) else _MSG_TPU_LIBRARY_PATH.format(path=path)
        if not have("libtpu"):
            return "libtpu (jax[tpu]) is not installed"
    return None


_MSG_TPU_LIBRARY_PATH = (
    "TPU_LIBRARY_PATH is set to {path!r}, which is not a file (JAX loads libtpu from there, "
    "falling back to the libtpu package with only a warning, whose version may differ). Fix: "
    "point TPU_LIBRARY_PATH at the libtpu .so (a TPU host's own, or the libtpu package's "
    "libtpu.so), or unset it to use the libtpu package")


def target_kinds() -> tuple[tuple[str, str | None], ...]:
    """For ``remat doctor``: each kind of target, and why this machine cannot compile for it
    (``None``: it can), with the install line."""
    out: list[tuple[str, str | None]] = [("local (this machine's backend)", None)]
    for platform, names in (("cuda", ", ".join(GPUS) + ", FILE.txtpb"),
                            ("tpu", ", ".join(TPUS) + " slices")):
        why = compiler_available(platform)
        if why is not None and not why.startswith("TPU_LIBRARY_PATH"):
            why = f"{why}; {_install_line(platform)}"
        out.append((f"{platform} ({names})", why))
    return tuple(out)


_MSG_NO_COMPILER = """\
accelerator {name}: cannot compile for {platform} on this machine: {why}.
Fix: install the compiler next to this jax ({v}):
    {install}
(a target compile needs no device: it compiles from shapes, on any machine)."""


def _check_compiler(acc: Accelerator) -> None:
    why = compiler_available(acc.platform)
    if why is not None and why.startswith("TPU_LIBRARY_PATH"):  # installing would not help
        raise RematError(f"accelerator {acc.name}: cannot compile for tpu on this machine: {why}.")
    if why is not None:
        raise RematError(_MSG_NO_COMPILER.format(name=acc.name, platform=acc.platform, why=why,
                                                 v=jax.__version__,
                                                 install=_install_line(acc.platform)))


_TOPOLOGIES: dict[tuple[str, str, str | None], Any] = {}


def topology(acc: Accelerator) -> Any:
    """The compile-only topology of ``acc`` (cached): ``jax.experimental.topologies`` devices that
    no program runs on. A real GPU or TPU of this machine is never opened for it."""
    acc = parse_accelerator(acc)
    if acc.is_local:
        raise RematError("remat_common: the local accelerator has no target topology; compile "
                         "for it with jax.jit as usual.")
    _check_compiler(acc)
    key = (acc.platform, acc.topology, acc.config)
    if key in _TOPOLOGIES:
        return _TOPOLOGIES[key]
    from jax.experimental import topologies

    # Without a CUDA driver the plugin's version check fails at cuInit; a compile-only topology
    # needs no driver (read when the plugins are discovered, the first time JAX picks a backend).
    os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
    try:
        if acc.platform == "cuda":
            topo = topologies.get_topology_desc(platform="cuda", target_config=acc.config,
                                                topology=acc.topology)
        else:  # a slice smaller than a host is one host of its own shape (v5e:1x1)
            topo = topologies.get_topology_desc(
                topology_name=acc.topology, platform="tpu",
                chips_per_host_bounds=tpu_host_bounds(acc.topology.partition(":")[2]))
    except NotImplementedError as e:
        raise RematError(
            f"accelerator {acc.name}: JAX has no {acc.platform} compiler registered ({e}). The CUDA "
            "plugin is registered when JAX first picks a backend; without a driver it is skipped "
            "unless JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1 is set by then. Fix: set "
            f"JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1 before the program starts, or install it: "
            f"{_install_line(acc.platform)}") from None
    except Exception as e:  # noqa: BLE001 - the compiler's own message, with the name given
        first = (str(e).strip().splitlines() or [""])[0][:300]
        if "libtpu_lockfile" in str(e):  # libtpu serves one process at a time
            raise RematError(
                f"accelerator {acc.name}: libtpu is in use by another process on this machine "
                f"(a TPU compile, or a program on a TPU), and it serves one process at a time: "
                f"{first}. Fix: wait for that process to end, then run this again; or, where "
                "this process only compiles (runs nothing on a TPU), start it with "
                "ALLOW_MULTIPLE_LIBTPU_LOAD=1.") from None
        raise RematError(f"accelerator {acc.name}: the {acc.platform} compiler refused the "
                         f"topology {acc.topology!r}: {type(e).__name__}: {first}. Fix: give a "
                         "topology it supports (TPU: e.g. v5e:1x1, v5e:2x2, v5p:2x2x1, v4:2x2x1).") from None
    _TOPOLOGIES[key] = topo
    return topo


def device_count(acc: Accelerator) -> int:
    """How many devices the step is laid out on (1 for ``local`` is not implied: local uses its own)."""
    if acc.is_local:
        return len(jax.devices())
    return len(topology(acc).devices)


_MSG_MESH = """\
--mesh {text}: {why}.
Give AXIS=N,... with the axes data (batch split, parameters replicated) and fsdp (batch split,
parameters split along their largest dimension), whose sizes multiply to the accelerator's {n}
devices, e.g. --mesh data={n} or --mesh fsdp={n} or --mesh data=2,fsdp={half}."""

MESH_AXES = ("data", "fsdp")


def parse_mesh(text: str | Mapping[str, int] | None, n: int) -> dict[str, int]:
    """``{axis: size}`` from ``data=2,fsdp=4`` (default: ``{"data": n}``), checked against ``n``.

    >>> parse_mesh("fsdp=8", 8), parse_mesh(None, 4)
    ({'fsdp': 8}, {'data': 4})
    """
    if text is None or text == "":
        return {"data": n}
    err = lambda why: RematError(_MSG_MESH.format(text=short(text), why=why, n=n,  # noqa: E731
                                                  half=max(1, n // 2)))
    items: list[tuple[str, Any]]
    if isinstance(text, Mapping):
        items = [(str(k), v) for k, v in text.items()]
    elif isinstance(text, str):
        items = []
        for part in text.split(","):
            axis, sep, size = part.strip().partition("=")
            if not sep:
                raise err(f"{part.strip()!r} is not AXIS=N")
            items.append((axis.strip(), size.strip()))
    else:
        raise err(f"a {type(text).__name__} is not a mesh")
    out: dict[str, int] = {}
    for axis, size in items:
        v: int
        if axis not in MESH_AXES:
            raise err(f"unknown axis {axis!r} (axes: {sorted_list(MESH_AXES)})")
        if axis in out:
            raise err(f"axis {axis!r} given twice")
        if isinstance(size, str):
            try:
                v = int(size)
            except ValueError:
                raise err(f"size {short(size)} of {axis!r} is not an integer") from None
        elif isinstance(size, int) and not isinstance(size, bool):
            v = size
        else:  # int(4.5) was 4: a float, a bool or anything else is refused, never truncated
            raise err(f"size {short(size)} of {axis!r} is a {type(size).__name__}, not an integer")
        if v < 1:
            raise err(f"size {short(size)} of {axis!r} must be a positive integer")
        out[axis] = v
    if math.prod(out.values()) != n:
        raise err(f"the sizes multiply to {math.prod(out.values())}, not {n}")
    return out


def target_mesh(acc: Accelerator, axes: Mapping[str, int]) -> jax.sharding.Mesh:
    """A mesh of ``acc``'s compile-only devices with ``axes`` (``{name: size}``)."""
    from jax.experimental import topologies

    topo = topology(acc)
    if acc.platform == "tpu" and len({d.core_on_chip for d in topo.devices}) > 1:
        # a device per TensorCore (v4): jax's mesh maker wants one per chip ("megacore"), so the
        # devices in topology order, each chip's cores side by side
        return jax.sharding.Mesh(np.array(topo.devices).reshape(tuple(axes.values())),
                                 tuple(axes))
    return topologies.make_mesh(topo, tuple(axes.values()), tuple(axes))


def _spec_for(shape: tuple[int, ...], batch: bool, mesh: jax.sharding.Mesh) -> Any:
    from jax.sharding import PartitionSpec as P

    sizes = dict(mesh.shape)
    if batch:
        axes = tuple(a for a in MESH_AXES if a in sizes)
        n = math.prod(sizes[a] for a in axes)
        if not shape or shape[0] % n:
            raise RematError(
                f"the batch {tuple(shape)} does not split over the mesh's {n} devices "
                f"({', '.join(f'{a}={sizes[a]}' for a in axes)}): its leading dimension must be a "
                f"multiple of {n}. Fix: choose a batch that is (--size batch={n * max(1, (shape[0] if shape else 1) // n or 1)}), "
                "or lay the step out on fewer devices (--mesh).")
        return P(axes if len(axes) > 1 else axes[0])
    f = sizes.get("fsdp", 1)
    if f > 1 and shape:
        dims = sorted(range(len(shape)), key=lambda d: -shape[d])
        for d in dims:
            if shape[d] % f == 0:
                return P(*([None] * d + ["fsdp"]))
    return P()


def abstract_args(args: Sequence[Any], batch: Sequence[bool], mesh: jax.sharding.Mesh
                  ) -> tuple[jax.ShapeDtypeStruct, ...]:
    """Each array (or ``ShapeDtypeStruct``) as a ``ShapeDtypeStruct`` sharded on ``mesh``: the
    ones flagged in ``batch`` split along their leading dimension over the mesh's axes, the others
    replicated (``data``) or split along their largest divisible dimension (``fsdp``)."""
    from jax.sharding import NamedSharding

    out = []
    for a, is_batch in zip(args, batch):
        shape = tuple(a.shape)
        out.append(jax.ShapeDtypeStruct(shape, a.dtype,
                                        sharding=NamedSharding(mesh, _spec_for(shape, is_batch, mesh))))
    return tuple(out)


# -- compiling ---------------------------------------------------------------------------------------

_XLA_REMAT = re.compile(r"(Can't reduce memory use below [^\n]*?by rematerialization[^\n]*)")
#: Instructions XLA's rematerialization pass cloned to recompute a value later (``fusion.3.remat``,
#: ``bitcast.remat.1``, ``copy.remat2``; compressed values ``.remat_compressed``).
_REMAT_NAME = re.compile(r"\.remat(?:_[a-z]+)?\d*(?:\.\d+)*$")
_ITEM_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4,
               "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}
_ARRAY = re.compile(r"\b([a-z]\w*)\[([\d,]*)\]")
_MATMUL = re.compile(r"dot|gemm|conv|cublas|matmul")


def _shape_bytes(shape: str) -> int:
    """Bytes of an HLO shape (a tuple's elements summed); 8-bit floats (``f8e4m3fn``) count 1."""
    total = 0
    for dtype, dims in _ARRAY.findall(shape):
        size = _ITEM_BYTES.get(dtype, 1 if dtype.startswith("f8") or dtype.startswith("f4") else 0)
        total += size * math.prod(int(d) for d in dims.split(",") if d)
    return total


def program_remat(hlo_text: str) -> str | None:
    """What XLA's own rematerialization pass changed in a compiled program, in a sentence, or
    ``None`` where it changed nothing.

    The pass (XLA:GPU and XLA:TPU run it when a program's peak exceeds the device memory) clones
    the instructions it recomputes, named ``NAME.remat``: the compiled program shows them whether
    the pass reached its target or not, and whether the program was compiled now or taken from
    JAX's persistent compilation cache (where the compiler wrote nothing).

    >>> program_remat("ENTRY %main {\\n  %dot.1 = f32[8,8]{1,0} dot(%a, %b)\\n}") is None
    True
    >>> print(program_remat("ENTRY %main {\\n  %dot.1.remat = f32[8,8]{1,0} dot(%a, %b)\\n}"))
    XLA's rematerialization pass recomputes 1 instruction (1 dot), 1 of them matmuls, 0.00 MiB of values: dot.1.remat f32[8,8]
    """
    from ..._paths import module_of

    fused: set[str] = set(_CALLS.findall(hlo_text))
    comp: str | None = None
    found: list[tuple[str, str, str, str]] = []  # name, shape, op, rest
    for line in hlo_text.splitlines():
        if line and not line[0].isspace() and line.rstrip().endswith("{"):
            head = re.match(r"^(?:ENTRY\s+)?%?([\w.\-]+)", line)
            comp = head.group(1) if head else None
            continue
        if comp in fused or ".remat" not in line:
            continue
        m = _INSTR.match(line)
        if m is not None and _REMAT_NAME.search(m.group(1)):
            found.append((m.group(1), m.group(2), m.group(3), m.group(4)))
    if not found:
        return None
    ops = Counter(op for _, _, op, _ in found)
    kinds = ", ".join(f"{n} {op}" for op, n in ops.most_common())
    matmuls = sum(1 for name, _, op, _ in found if _MATMUL.search(name) or _MATMUL.search(op))
    nbytes = sum(_shape_bytes(shape) for _, shape, op, _ in found if op != "bitcast")
    modules = sorted({mod for _, _, _, rest in found
                      if (op := re.search(r'op_name="([^"]*)"', rest)) is not None
                      and (mod := module_of(op.group(1))) is not None})
    big = sorted(found, key=lambda f: -_shape_bytes(f[1]))[:3]
    examples = ", ".join(f"{name} {re.sub(r'{[^}]*}', '', shape)}" for name, shape, _, _ in big)
    return (f"XLA's rematerialization pass recomputes {len(found)} instruction"
            f"{'s' if len(found) != 1 else ''} ({kinds})"
            + (f", {matmuls} of them matmuls" if matmuls else "")
            + f", {nbytes / 2**20:.2f} MiB of values"
            + (f", in {', '.join(modules[:6])}{' ...' if len(modules) > 6 else ''}" if modules else "")
            + f": {examples}")
_OVERFLOW = re.compile(r"overflow in static extent product[^\n]*")
_MSG_OVERFLOW = ("XLA refused the program: {said} (an array with more elements than it "
                 "can count). Fix: a smaller size (remat report --size seq_len=N d_model=N "
                 "vocab=N batch=N).")
_OOM = re.compile(r"RESOURCE_EXHAUSTED|[Oo]ut of memory|exceeds? (?:the )?(?:available )?memory")


#: Written to the captured stderr when the block returns: a watcher that reaches the end of the
#: stream without it saw the process die inside the compiler (an XLA ``Check failed`` abort).
_DONE = b"\n\x00remat-compile-returned\x00\n"

#: The watcher of :func:`_captured_stderr`, run as ``python -I -S -c _WATCHER OUT``: copies what
#: the compiler writes to ``OUT`` when the block returns; when the process dies first (an abort
#: is beyond Python: no ``finally`` runs), writes the diagnosis and what the compiler said to the
#: terminal's stderr, which it holds.
_WATCHER = r"""
import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the compiling process's to handle
done, data = DONE, bytearray()
while not data.endswith(done):
    b = os.read(0, 1 << 16)
    if not b:
        break
    data += b
if data.endswith(done):
    with open(sys.argv[1], "wb") as f:
        f.write(data[: -len(done)])
    sys.exit(0)
text = data.decode(errors="replace")
lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
said = next((ln for ln in lines if "Check failed" in ln), lines[-1] if lines else "nothing")
said = said if len(said) <= 300 else said[:297] + "..."
nl = chr(10)
os.write(2, (MSG.format(said=said) + nl + text + ("" if text.endswith(nl) else nl)).encode())
"""

_MSG_ABORT = (
    "remat: error: the XLA compiler aborted the process while compiling (exit 134, SIGABRT: "
    "an internal check failed, which no Python code can catch). XLA said: {said}. This happens "
    "when an array is beyond what the compiler can plan (sizes whose bytes near 2**63). Fix: "
    "a smaller size (remat report --size seq_len=N d_model=N batch=N); its full output follows.")


@contextlib.contextmanager
def quiet_libtpu() -> Iterator[None]:
    """A block whose stderr is passed on without libtpu's start-up lines (:func:`quiet_stderr`),
    for the first use of a TPU topology, which starts libtpu."""
    with _captured_stderr():
        yield


@contextlib.contextmanager
def _captured_stderr() -> Iterator[list[str]]:
    """What the C++ compiler writes to file descriptor 2 while the block runs (also passed on,
    start-up noise of libtpu left out: :func:`quiet_stderr`). A watcher process reads it through
    a pipe, so that what the compiler said reaches the user, with a diagnosis and the fix, even
    when it aborts the process (``Check failed``), where no ``finally`` runs."""
    import subprocess
    import sys

    out: list[str] = []
    try:
        saved = os.dup(2)
    except OSError:  # pragma: no cover - no fd 2
        yield out
        return
    fd, path = tempfile.mkstemp(prefix="remat-stderr-")
    os.close(fd)
    read, write = os.pipe()
    code = _WATCHER.replace("DONE", repr(_DONE)).replace("MSG", repr(_MSG_ABORT))
    try:
        watcher = subprocess.Popen([sys.executable, "-I", "-S", "-c", code, path], stdin=read,
                                   stdout=subprocess.DEVNULL, stderr=saved, close_fds=True)
    except OSError:  # no process to spare: the file, as before (an abort then loses the text)
        os.close(read)
        os.close(write)
        os.unlink(path)
        with _captured_to_file(saved) as out:
            yield out
        return
    os.close(read)
    os.dup2(write, 2)
    os.close(write)
    try:
        yield out
    finally:
        try:
            os.write(2, _DONE)
        except OSError:  # pragma: no cover - the watcher is gone
            pass
        os.dup2(saved, 2)
        os.close(saved)
        try:
            watcher.wait(timeout=30)
        except subprocess.TimeoutExpired:  # pragma: no cover - a child holds the pipe open
            watcher.kill()
            watcher.wait()
        data = Path(path).read_bytes().decode(errors="replace")
        os.unlink(path)
        out.append(data)
        shown = quiet_stderr(data)
        if shown:
            os.write(2, shown.encode())


@contextlib.contextmanager
def _captured_to_file(saved: int) -> Iterator[list[str]]:
    """:func:`_captured_stderr` through a temporary file (``saved``: the real fd 2, closed)."""
    out: list[str] = []
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield out
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            data = tmp.read().decode(errors="replace")
            out.append(data)
            shown = quiet_stderr(data)
            if shown:
                os.write(2, shown.encode())


#: What libtpu writes to stderr whenever it starts, on a run that goes well: absl's notices that
#: logging is not set up, its INFO/WARNING lines (``I1205 22:10:01.123 12345 file.cc:12] ...``),
#: and, off a TPU VM (a deviceless compile needs none), that it found no TPU host, worker or
#: accelerator type (an ``E0000 ... INVALID_ARGUMENT`` line and its source trace). They read as
#: failures; left out of what is passed on (``TargetCompile.log`` keeps them).
_LIBTPU_NOISE = re.compile("|".join((
    r"WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR",
    r"WARNING: Logging before InitGoogle\(\) is written to STDERR",
    r"Failed to find host bounds for accelerator type: .*",  # not on a TPU VM: nothing to find
    r"[IW]\d{4} [\d:.]+\s+\d+ [\w./-]+:\d+\] .*",  # absl INFO and WARNING lines
    r"E\d{4} [\d:.]+\s+\d+ [\w./-]+:\d+\] .*(?:TPU_WORKER_HOSTNAMES|TPU_ACCELERATOR_TYPE).*",
    r"=== Source Location Trace: ===\s*",
    r"[\w./-]+/libtpu_init_utils\.cc:\d+",
)).join(("^(?:", ")$")))


def quiet_stderr(text: str) -> str:
    r"""``text`` without libtpu's start-up lines (:data:`_LIBTPU_NOISE`): absl's INFO and WARNING
    lines, its logging notices, and the TPU host it did not find off a TPU VM. Other errors
    (``E...``, ``F...``, ``Check failed``) and anything else stay.

    >>> quiet_stderr("WARNING: All log messages before absl::InitializeLog() is called are "
    ...              "written to STDERR\nI0000 00:00:1764972601.1 4242 tpu_initializer.cc:60] "
    ...              "libtpu started\nreal problem\n")
    'real problem\n'
    """
    if not text:
        return text
    kept = [ln for ln in text.splitlines(keepends=True) if not _LIBTPU_NOISE.match(ln.rstrip("\n"))]
    return "".join(kept)


#: The largest array, in bytes, a program may hold before it is compiled: past it no accelerator
#: could run it, and near 2**63 bytes XLA's heap simulator aborts the process ("Check failed").
MAX_ARRAY_BYTES = 2 ** 52  # 4 PiB

_TENSOR = re.compile(r"tensor<((?:\d+x)+)([a-z]\w*)>")
_BITS = re.compile(r"(\d+)$")

_MSG_HUGE = (
    "the program holds an array of shape ({shape}) {dtype}, {size}: more than any "
    "accelerator holds, and near what XLA's compiler can count (it aborts the process on arrays "
    "near 2**63 bytes, or refuses dimensions whose product overflows). Fix: a smaller size "
    "(remat report --size seq_len=N d_model=N vocab=N batch=N).")


def check_array_sizes(text: str) -> None:
    """Refuses (:class:`RematError`) a lowered program (its StableHLO ``text``) holding an array
    over :data:`MAX_ARRAY_BYTES`, before the compiler aborts on it."""
    for m in _TENSOR.finditer(text):
        dims = [int(d) for d in m.group(1).rstrip("x").split("x")]
        n = math.prod(dims)
        bits = _BITS.search(m.group(2))
        nbytes = n * max(1, int(bits.group(1)) // 8 if bits else 1)
        if nbytes > MAX_ARRAY_BYTES:
            from ._profiles import fmt_bytes

            raise RematError(_MSG_HUGE.format(shape=", ".join(map(str, dims)), dtype=m.group(2),
                                              size=fmt_bytes(nbytes)))


@dataclasses.dataclass(frozen=True)
class TargetCompile:
    """One step compiled for an accelerator (the entry point other tools build on).

    Attributes:
      compiled: the ``jax.stages.Compiled`` (``memory_analysis()``, ``as_text()``); ``None`` when
        the compiler refused the program (``error``).
      lower_s, compile_s: seconds to lower, and to compile.
      xla_remat: what the target compiler's own rematerialization pass changed to bring the
        program under the device memory (:func:`xla_remat_of`: read from the compiled program, so
        a program from the persistent compilation cache shows it too, with the compiler's message
        where it could not), else ``None``.
      error: the compiler's refusal (out of memory), else ``None``.
      log: what the compiler wrote to stderr.
      dump: with ``dump=True``, the folder of XLA's dump of the compile (buffer assignment: the
        breakdown's input; the reader removes it), else ``None``.
    """

    compiled: Any
    lower_s: float
    compile_s: float
    xla_remat: str | None = None
    error: str | None = None
    log: str = ""
    dump: str | None = None


def compile_lowered(lowered: Any, *, dump: bool = False, reuse: bool = False,
                    options: Mapping[str, Any] | None = None) -> TargetCompile:
    """Compiles a lowered program with the compiler ``options`` (``{"xla_...": value}``), keeping
    what the compiler says about memory (and, with ``dump``, XLA's buffer-assignment dump:
    :func:`._dump.dump_compile`, which ``reuse`` lets take it from beside the persistent
    compilation cache)."""
    from ._dump import dump_compile

    try:
        text = lowered.as_text()
    except Exception:  # noqa: BLE001 - no text: the compiler is the judge
        text = ""
    check_array_sizes(text)
    t0 = time.perf_counter()
    compiled, error, folder = None, None, None
    with _captured_stderr() as log:
        try:
            if dump:
                compiled, folder = dump_compile(lowered, options, reuse=reuse)
            else:
                compiled = lowered.compile(compiler_options=dict(options) if options else None)
        except Exception as e:  # noqa: BLE001 - an out-of-memory refusal is a figure, not a crash
            if (over := _OVERFLOW.search(str(e))) is not None:
                raise RematError(_MSG_OVERFLOW.format(said=over.group(0))) from None
            if not _OOM.search(str(e)):
                raise
            error = (str(e).strip().splitlines() or [""])[0][:500]
    dt = time.perf_counter() - t0
    text = "".join(log)
    return TargetCompile(compiled, 0.0, dt, xla_remat_of(compiled, text), error, text, folder)


def xla_remat_of(compiled: Any, log: str = "") -> str | None:
    """What XLA's own rematerialization pass did to a compiled program (``None``: nothing): what
    it changed, read from the program (:func:`program_remat`), and, where the compiler said so
    while compiling (``log``, its stderr), that it could not bring the program under the device
    memory ("Can't reduce memory use below ... by rematerialization")."""
    found = _XLA_REMAT.findall(log)  # the last one is the whole program's
    said = found[-1].strip() if found else None
    changed = None
    if compiled is not None:
        try:
            changed = program_remat(compiled.as_text())
        except Exception:  # noqa: BLE001 - no program text: what the compiler said stands alone
            changed = None
    return "; ".join(m for m in (said, changed) if m) or None


_ORIGINALLY = re.compile(r"down from [\d.]+\w+ \((\d+) bytes\) originally")


def xla_remat_original(said: str | None) -> int | None:
    """The bytes a program needed as written, before XLA's rematerialization pass, where its
    message says so (``... down from 83.09GiB (89220883536 bytes) originally``: the last, the
    whole program's), else ``None`` (the pass brought it under the device memory silently).

    >>> xla_remat_original("Can't reduce memory use below 60.68GiB (65158918135 bytes) by "
    ...     "rematerialization; only reduced to 82.84GiB (88951841832 bytes), down from 83.09GiB "
    ...     "(89220883536 bytes) originally")
    89220883536
    """
    found = _ORIGINALLY.findall(said or "")
    return int(found[-1]) if found else None


def compile_for(fn: Any, args: Sequence[Any], acc: str | Accelerator, *,
                batch: Sequence[bool] | None = None, mesh: str | Mapping[str, int] | None = None,
                ) -> TargetCompile:
    """``jax.jit(fn)`` compiled for ``acc`` from the shapes of ``args`` (arrays or
    ``ShapeDtypeStruct``; nothing is allocated), laid out on ``mesh`` (default: data parallel over
    all of ``acc``'s devices). ``batch`` flags the arguments split along their leading dimension
    (default: the last one).

    Raises:
      RematError: the compiler is not installed, the topology is refused, the batch does not split.
    """
    acc = parse_accelerator(acc)
    flags = list(batch) if batch is not None else [i == len(args) - 1 for i in range(len(args))]
    jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
    if acc.is_local:
        structs: tuple[Any, ...] = tuple(args)
    else:
        m = target_mesh(acc, parse_mesh(mesh, device_count(acc)))
        structs = abstract_args(args, flags, m)
    t0 = time.perf_counter()
    lowered = jitted.lower(*structs)
    lower_s = time.perf_counter() - t0
    return dataclasses.replace(compile_lowered(lowered), lower_s=lower_s)


# -- host placements in a compiled program ------------------------------------------------------------

_HOST_SPACE = "S(5)}"
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s+([a-z][\w\-]*)\((.*)$")
_CALLS = re.compile(r"calls=%?([\w.\-]+)")
_OPERAND = re.compile(r"%([\w.\-]+)")
_PLUMBING = frozenset({"parameter", "get-tuple-element", "tuple", "while", "bitcast", "call",
                       "conditional", "custom-call", "opt-barrier", "constant"})


def _top_level(shape: str) -> list[str]:
    """The elements of a tuple shape ``(a, b, c)``, split at its top-level commas."""
    inner = shape.strip()[1:-1] if shape.strip().startswith("(") else shape
    out, depth, start = [], 0, 0
    for i, ch in enumerate(inner):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(inner[start:i].strip())
            start = i + 1
    out.append(inner[start:].strip())
    return out


def host_placements(hlo_text: str) -> dict[str, int]:
    """``{"pinned_host": n, "device": m}``: instructions of a compiled program (outside fusion
    bodies) that write a value into host memory (XLA's memory space 5), and that read one back to
    device. Plumbing (parameters, tuples, loops, buffer allocations) is not counted."""
    fused: set[str] = set(_CALLS.findall(hlo_text))
    to_host = to_device = 0
    comp: str | None = None
    host_names: set[str] = set()
    for line in hlo_text.splitlines():
        if line and not line[0].isspace() and line.rstrip().endswith("{"):
            head = re.match(r"^(?:ENTRY\s+)?%?([\w.\-]+)", line)
            comp = head.group(1) if head else None
            continue
        if comp in fused:
            continue
        m = _INSTR.match(line)
        if m is None:
            continue
        name, shape, op, rest = m.groups()
        if _HOST_SPACE in shape:
            host_names.add(name)
        if op in _PLUMBING or op.endswith("-done"):
            continue
        operands = set(_OPERAND.findall(rest.split("), ")[0])) if rest else set()
        if op == "copy-start":  # (destination, source, context)
            parts = _top_level(shape)
            if len(parts) >= 2 and _HOST_SPACE in parts[0]:
                to_host += 1
            elif len(parts) >= 2 and _HOST_SPACE in parts[1]:
                to_device += 1
            continue
        if op.endswith("-start") and shape.startswith("(("):
            # ((operands...), result, context): where the result lies says the direction
            inner = shape[2:]
            depth, i = 1, 0
            while i < len(inner) and depth:
                depth += {"(": 1, ")": -1}.get(inner[i], 0)
                i += 1
            ins, result = inner[:i], inner[i:]
            if _HOST_SPACE in result.split(", u32[]")[0]:
                to_host += 1
            elif _HOST_SPACE in ins:
                to_device += 1
            continue
        if _HOST_SPACE in shape:
            to_host += 1
        elif operands & host_names:
            to_device += 1
    return {k: v for k, v in (("device", to_device), ("pinned_host", to_host)) if v}
