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

import dataclasses
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax

from ..._errors import RematError, short
from ._units import fmt_bytes


_DATA = Path(__file__).parent / "gpu_targets"
_GIB = 2**30

#: Per GPU: (target-config file, peak dense bf16 FLOP/s, host link bytes/s per direction, where
#: those figures come from). Device memory and bandwidths are read from the file itself; the host
#: link is the data sheet's, not the file's ``pcie_bandwidth`` (XLA's, in GiB/s).
GPUS: Mapping[str, tuple[str, float, float, str]] = {
    "a100-40g": ("a100-40g.txtpb", 312e12, 32e9, "NVIDIA A100 data sheet: 312 TFLOP/s dense BF16, "
                 "PCIe Gen4 x16 32 GB/s per direction"),
    "a100-80g": ("a100-80g.txtpb", 312e12, 32e9, "NVIDIA A100 data sheet: 312 TFLOP/s dense BF16, "
                 "PCIe Gen4 x16 32 GB/s per direction"),
    "h100": ("h100.txtpb", 989.4e12, 64e9, "NVIDIA H100 SXM5 data sheet: 989.4 TFLOP/s dense BF16, "
             "PCIe Gen5 x16 64 GB/s per direction"),
    "h200": ("h200.txtpb", 989.4e12, 64e9, "NVIDIA H200 SXM data sheet: 989.4 TFLOP/s dense BF16, "
             "PCIe Gen5 x16 64 GB/s per direction"),
    "b200": ("b200.txtpb", 2250e12, 64e9, "NVIDIA HGX B200 data sheet: 2.25 PFLOP/s dense BF16 per "
             "GPU, PCIe Gen5 x16 64 GB/s per direction"),
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
_FILE_COUNT = re.compile(r"^(?P<path>.+?\.(?:txtpb|pbtxt|textproto))(?::(?P<n>\d+))?$", re.IGNORECASE)


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


def _name_error(name: Any, why: str, *, listing: bool = True) -> RematError:
    """``accelerator NAME: WHY.`` and, with ``listing``, the forms a name may take."""
    if not listing:
        return RematError(f"accelerator {short(name)}: {why}")
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
      host_link_bytes_per_s: host <-> device bandwidth per direction (GPU: :data:`GPUS`, or
        ``pcie_bandwidth`` of one's own config).
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
        mem = f", {fmt_bytes(self.memory_bytes)} each" if self.memory_bytes else ""
        if self.platform == "cuda":
            return f"{self.name}: {self.count} x {self.chip} GPU on {self.hosts} host(s){mem}"
        return f"{self.name}: TPU slice {self.topology}{mem}"


LOCAL = Accelerator("local", "local", "local")


_MSG_CONFIG_FIELD = (
    "the target-config file {path!r} {problem}, so {why}. Fix: set {field}: N inside its "
    "gpu_device_info block, N {example}, as XLA's own specs do "
    "(xla/backends/gpu/target_config/specs/*.txtpb).")


def _config_figure(text: str, field: str, *, path: str = "", name: str = "",
                   required: bool = False) -> float | None:
    """A positive number of the target config (``device_memory_size: 84942979072``); ``None``
    where the field is absent and not ``required``. A field present with a value that is not a
    positive number (``-5``, ``0``, ``lots``), or absent where ``required``, is refused: it read
    as absent before, and the device's memory became unknown without a word."""
    m = re.search(rf"\b{field}\s*:\s*(\S+)", text)
    why, example = {
        "device_memory_size": ("the device's memory is unknown: no plan could be checked against "
                               "it", "the device's memory in bytes (84942979072 for an H100 80GB)"),
        "pcie_bandwidth": ("the host link's speed is unknown: transfers could not be priced",
                           "the host link in bytes per second (34359738368 for PCIe Gen4 x16)"),
    }[field]
    if m is None:
        if not required:
            return None
        problem = f"sets no {field}"
    else:
        try:
            value = float(m.group(1))
        except ValueError:
            value = math.nan
        if math.isfinite(value) and value > 0:
            return value
        problem = f"sets {field}: {short(m.group(1))}, which is not a positive number"
    raise _name_error(name, _MSG_CONFIG_FIELD.format(path=path, problem=problem, why=why,
                                                     field=field, example=example), listing=False)


def _gpu(chip: str, config: str, count: int, name: str, flops: float | None, link: float | None,
         source: str) -> Accelerator:
    if count < 1:
        raise _name_error(name, "the count must be at least 1")
    if count > GPUS_PER_HOST and count % GPUS_PER_HOST:
        raise _name_error(name, f"{count} GPUs do not split into hosts of {GPUS_PER_HOST}; give a "
                                f"count up to {GPUS_PER_HOST} or a multiple of it")
    hosts = max(1, count // GPUS_PER_HOST) if count > GPUS_PER_HOST else 1
    per_host = count // hosts
    mem = _config_figure(config, "device_memory_size", path=chip, name=name, required=True)
    if link is None:
        link = _config_figure(config, "pcie_bandwidth", path=chip, name=name)
        source += "; host link (pcie_bandwidth) from the target config"
    src = source + "; device memory (device_memory_size) from the target config"
    return Accelerator(name, "cuda", chip, count, hosts, f"1x{hosts}x{per_host}", config,
                       None if mem is None else int(mem), link, flops, src)


def parse_accelerator(name: str | Accelerator | None) -> Accelerator:
    """The :class:`Accelerator` a name stands for (``None`` and ``"local"``: this machine).

    >>> parse_accelerator("h100x8").describe()
    'h100x8: 8 x h100 GPU on 1 host(s), 79.11 GiB each'
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
    if not key:  # `--accelerator ""` read as local before: compiled for this machine unasked
        raise _name_error(name, "an empty name names no accelerator (leave --accelerator out, "
                                "or write local, for this machine)")
    if key.lower() == "local":
        return LOCAL
    f = _FILE_COUNT.match(key)
    if f is not None:
        path = Path(f.group("path")).expanduser()
        if path.is_dir():
            raise _name_error(name, f"{str(path)!r} is a directory, not a target-config file. "
                                    "Fix: give the .txtpb file itself (a GpuTargetConfigProto in "
                                    "text form).", listing=False)
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
        return _gpu(str(path), text, int(f.group("n") or 1), key, None, None, f"from {path}")
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
        file, flops, link, source = GPUS[chip]
        n = int(g.group("n") or 1)
        return _gpu(chip, (_DATA / file).read_text(), n, f"{chip}x{n}" if g.group("n") else chip,
                    flops, link, source)
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
        # Where JAX looks (its cloud_tpu_init's get_tpu_library_path): the file that
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


#: ``device_kind`` fragments of the GPUs a target config ships for, most specific first; a
#: superchip (GH200, GB200) has other memory than the GPU it is named after: no match.
_KINDS = (("gh200", None), ("gb200", None), ("h200", "h200"), ("h100", "h100"),
          ("b200", "b200"), ("a100", "a100"))


#: ``device_kind`` of each TPU generation (JAX's names for them), most specific first.
_TPU_KINDS = (("tpu v5 lite", "v5e"), ("tpu v5e", "v5e"), ("tpu v6 lite", "v6e"),
              ("tpu v6e", "v6e"), ("tpu v5p", "v5p"), ("tpu v5", "v5p"), ("tpu v4", "v4"))
#: Chips -> topology of the slices that TPU hosts come in: 2-D generations, and 3-D ones.
_TPU_SLICES = {1: "1x1", 2: "2x1", 4: "2x2", 8: "2x4"}
_TPU_SLICES_3D = {1: "1x1x1", 2: "2x1x1", 4: "2x2x1", 8: "2x2x2"}


def accelerator_for(device_kind: str, count: int = 1) -> str | None:
    """The deviceless accelerator name of ``count`` devices of ``device_kind``: a shipped GPU
    target config (``NVIDIA H200`` -> ``h200``, eight of them ``h200x8``), or a TPU slice
    (``TPU v5 lite`` -> ``v5e:1x1``, four ``v5e:2x2``); ``None`` where none ships or the count
    is not a slice.

    >>> accelerator_for("NVIDIA H100 80GB HBM3"), accelerator_for("NVIDIA A100-SXM4-40GB", 8)
    ('h100', 'a100-40gx8')
    >>> accelerator_for("NVIDIA GH200 480GB") is None
    True
    >>> accelerator_for("TPU v5 lite"), accelerator_for("TPU v5 lite", 4), accelerator_for("TPU v4", 4)
    ('v5e:1x1', 'v5e:2x2', 'v4:2x2x1')
    """
    kind = device_kind.lower()
    for frag, gen in _TPU_KINDS:
        if kind.startswith(frag):
            # a v4 device is a TensorCore (two per chip) but JAX reports each chip's as one
            slices = _TPU_SLICES_3D if gen in ("v4", "v5p") else _TPU_SLICES
            return f"{gen}:{slices[count]}" if count in slices else None
    for frag, name in _KINDS:
        if frag in kind:
            if name == "a100":
                name = "a100-80g" if "80g" in kind.replace(" ", "") else "a100-40g"
            if name is None or name not in GPUS:
                return None
            return name if count == 1 else f"{name}x{count}"
    return None
