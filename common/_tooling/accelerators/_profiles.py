"""Device profiles: the figures ``remat tune`` turns FLOPs and host traffic into a step-time estimate."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..._errors import PlanError, RematError, short, sorted_list
from ..._plan import MAX_PLAN_BYTES, read_text_file
from ..._yaml import load_yaml
from ._accelerators import GPUS, TPUS, Accelerator, parse_accelerator
from ._units import parse_bytes

@dataclasses.dataclass(frozen=True)
class DeviceProfile:
    """What one accelerator can do, as public data sheets state it.

    Attributes:
      name: the profile's name (``h100``).
      flops_per_s: peak dense bf16 FLOP/s (no sparsity).
      hbm_bytes: device memory (the default budget when none is given).
      host_link_bytes_per_s: host <-> device bandwidth per direction (what an offload uses).
      source: where the figures come from.
      exposed_transfer_share: the share of an activation offload's transfer time that the step
        waits for (0: XLA's copies all overlap the compute, a data sheet's assumption; 1: none
        does). Fitted to measured steps by :func:`fit_profile`.
    """

    name: str
    flops_per_s: float
    hbm_bytes: int
    host_link_bytes_per_s: float
    source: str = ""
    exposed_transfer_share: float = 0.0

    def step_seconds(self, flops: float, host_transfer_bytes: float,
                     state_transfer_bytes: float = 0.0) -> float:
        """Estimated step time: the compute (``flops`` at :attr:`flops_per_s`) plus the exposed
        share of the activation offload's transfers (``host_transfer_bytes``: residuals to host and
        back, which XLA copies beside the compute), and never less than the transfers take; plus
        the transfers of training state kept on host (``state_transfer_bytes``: it comes to the
        device and goes back while the update runs, which has little compute to hide them behind).

        On a TPU v5e chip, with every transfer overlapped, this predicted seven steps of both
        example GPTs (no plan, offload, state on host at 8 and 107 layers) between -17 % and +15 %
        (https://github.com/jax-remat-plan/jax-remat-plan/blob/main/docs/tpu.md); adding the whole
        offload's transfers to the compute instead overestimated offload steps by 42-44 %, and the
        LLMs' offload steps were 5-17 % slower than the overlapped estimate
        (https://github.com/jax-remat-plan/jax-remat-plan/blob/main/docs/models.md).

        >>> p = DeviceProfile("x", 1e12, 1, 1e9)
        >>> p.step_seconds(2e12, 1e9), p.step_seconds(2e12, 3e9), p.step_seconds(2e12, 1e9, 5e8)
        (2.0, 3.0, 2.5)
        >>> dataclasses.replace(p, exposed_transfer_share=0.5).step_seconds(2e12, 1e9)
        2.5
        """
        link = self.host_link_bytes_per_s
        moved = host_transfer_bytes / link
        return (max(flops / self.flops_per_s + self.exposed_transfer_share * moved, moved)
                + state_transfer_bytes / link)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def fit_profile(base: DeviceProfile, steps: Sequence[tuple[float, float, float]]
                ) -> tuple[DeviceProfile, tuple[float, ...]]:
    """``base`` with the FLOP rate (and, where steps offload, the exposed share of their
    transfers) that best explains measured steps, and each step's relative error under it
    (predicted / measured - 1).

    A data sheet's peak is what a chip does on ideal matrix products in bf16; a real step runs
    below it (other operations, float32 passes), by a factor that holds across plans of one
    model on one device. Each step is ``(flops, host bytes moved, seconds)``, with no training
    state on host; the host link is kept. Seconds are fitted by least squares as ``flops / rate +
    share x transfer time`` over the steps longer than their transfers
    (:meth:`DeviceProfile.step_seconds`), the share within [0, 1]; with no step that offloads,
    the share stays ``base``'s. Plans measured on the device then rank, and a tuner given the
    fitted profile predicts, in seconds.

    >>> p, err = fit_profile(PROFILES["v5e"], [(2e12, 0, 0.02), (3e12, 0, 0.03)])
    >>> round(p.flops_per_s / 1e12), [round(e, 6) for e in err]
    (100, [0.0, 0.0])
    >>> link = PROFILES["v5e"].host_link_bytes_per_s  # a step waiting for 40 % of its transfers
    >>> p, err = fit_profile(PROFILES["v5e"], [(2e12, 0, 0.02), (2e12, link * 0.01, 0.024)])
    >>> round(p.flops_per_s / 1e12), round(p.exposed_transfer_share, 6)
    (100, 0.4)
    """
    link = base.host_link_bytes_per_s
    # the compute is the step where the offload's transfers are shorter (step_seconds): a step
    # as long as its transfers says nothing about the FLOP rate
    compute = [(f, b / link, t) for f, b, t in steps if f > 0 and t > 0 and b / link < t]
    if not compute:
        raise RematError("remat_common.fit_profile: no step with FLOPs and a measured time longer "
                         "than its host transfers to fit.")

    def rate_given(share: float) -> float:  # seconds per FLOP: sum(f (t - share x)) / sum(f^2)
        return (sum(f * (t - share * x) for f, x, t in compute)
                / sum(f * f for f, _, _ in compute))

    share = base.exposed_transfer_share
    sff = sum(f * f for f, _, _ in compute)
    sfx = sum(f * x for f, x, _ in compute)
    sxx = sum(x * x for _, x, _ in compute)
    det = sff * sxx - sfx * sfx
    if sxx > 0 and det > 1e-9 * sff * sxx:  # steps that offload, not all in one proportion
        sft = sum(f * t for f, _, t in compute)
        sxt = sum(x * t for _, x, t in compute)
        share = min(1.0, max(0.0, (sff * sxt - sfx * sft) / det))
    a = rate_given(share)
    said = (f"; {100 * share:.0f} % of the offload transfers exposed" if sxx > 0 else "")
    fitted = dataclasses.replace(
        base, name=f"{base.name}-fitted", flops_per_s=1.0 / a, exposed_transfer_share=share,
        source=f"{base.name}'s host link; FLOP rate fitted to {len(compute)} measured step(s) "
               f"({100 / a / base.flops_per_s:.0f} % of {base.name}'s {base.flops_per_s / 1e12:g} "
               f"TFLOP/s){said}")
    errors = tuple(fitted.step_seconds(f, b) / t - 1 if t > 0 else math.nan for f, b, t in steps)
    return fitted, errors


def profile_yaml(profile: DeviceProfile, comment: str = "") -> str:
    """``profile`` as the YAML file :func:`load_profile` reads back (every field written out,
    floats exact), with ``comment`` as its first lines.

    >>> p = PROFILES["v5e"]
    >>> text = profile_yaml(dataclasses.replace(p, name="mine", flops_per_s=6.2e13))
    >>> print(text.splitlines()[1])
    flops_per_s: 62000000000000.0
    """
    import json

    head = "".join(f"# {line}\n" for line in comment.splitlines())
    return (f"{head}name: {json.dumps(profile.name)}\nflops_per_s: {float(profile.flops_per_s)!r}\n"
            f"hbm_bytes: {int(profile.hbm_bytes)}\n"
            f"host_link_bytes_per_s: {float(profile.host_link_bytes_per_s)!r}\n"
            f"exposed_transfer_share: {float(profile.exposed_transfer_share)!r}\n"
            f"source: {json.dumps(profile.source)}\n")


def target_profile(acc: Accelerator, name: str | None = None) -> DeviceProfile | None:
    """The device profile of an accelerator's own figures (peak FLOP/s, device memory, host link),
    named ``name`` (default: the accelerator's)."""
    if acc.is_local or None in (acc.flops_per_s, acc.memory_bytes, acc.host_link_bytes_per_s):
        return None
    assert acc.flops_per_s is not None and acc.memory_bytes is not None
    assert acc.host_link_bytes_per_s is not None
    return DeviceProfile(name or acc.name, acc.flops_per_s, acc.memory_bytes,
                         acc.host_link_bytes_per_s, acc.source)


#: Built-in profiles, one per chip of the accelerator table (:data:`GPUS`, :data:`TPUS`), named
#: as it is and with its figures (override any of them with a YAML file, see :func:`load_profile`).
PROFILES: Mapping[str, DeviceProfile] = {
    chip: p for chip in (*GPUS, *TPUS) if (p := target_profile(parse_accelerator(chip), chip))}
#: Names the built-in profiles had before, still read.
ALIASES: Mapping[str, str] = {"tpu-v5e": "v5e"}

#: What a built-in profile's FLOP rate missed by where steps were measured on its chip: the rates
#: fitted to them (:func:`fit_profile`) as a share of the data sheet's
#: (https://github.com/jax-remat-plan/jax-remat-plan/blob/main/docs/models.md).
MEASURED_AGAINST: Mapping[str, str] = {
    "v5e": "steps measured on a TPU v5e chip ran at 32-62 % of its 197 TFLOP/s (bfloat16 LLMs "
           "36-62 %, float32 GPTs 32 %), so the step times it predicts are 38-68 % short",
}


def data_sheet_note(profile: DeviceProfile) -> str | None:
    """The note for a built-in profile used as it is (its data sheet's figures): not calibrated
    on a device, what it missed by where it was checked, and how to calibrate it; ``None`` for
    any other profile (a file, a fitted one).

    >>> print(data_sheet_note(PROFILES["h100"]))  # doctest: +ELLIPSIS
    the h100 profile is its data sheet's, not calibrated on a device (never checked against ...
    """
    name = next((n for n, p in PROFILES.items() if dataclasses.replace(p, name=profile.name)
                 == profile), None)
    if name is None:
        return None
    return (f"the {name} profile is its data sheet's, not calibrated on a device ("
            f"{MEASURED_AGAINST.get(name, 'never checked against steps measured on the device')})"
            f": rank plans by it, read its seconds as estimates. Calibrate it there: remat tune "
            f"--measure K --profile {name} --profile-out FILE.yaml, then --profile FILE.yaml.")


#: The profile whose host link prices offload transfers when the tuner is given no profile.
DEFAULT_LINK_PROFILE = "h100"


@dataclasses.dataclass(frozen=True)
class HostLink:
    """The host <-> device link that offload transfers are priced at.

    Attributes:
      name: where the figure comes from (a profile's name).
      bytes_per_s: bandwidth per direction.
      flops_per_s: the device's FLOP rate, to count a transfer as the FLOPs the device could do
        meanwhile (the FLOPs objective's unit).
      source: the data sheet (or file) behind the figures.
    """

    name: str
    bytes_per_s: float
    flops_per_s: float
    source: str = ""

    def seconds(self, nbytes: float) -> float:
        return nbytes / self.bytes_per_s

    def flop_equivalent(self, nbytes: float) -> float:
        """``nbytes`` moved over the link, counted as the FLOPs the device does meanwhile."""
        return self.seconds(nbytes) * self.flops_per_s

    def describe(self) -> str:
        return (f"{self.bytes_per_s / 1e9:g} GB/s per direction, the {self.name} profile's host "
                f"link, counted at its {self.flops_per_s / 1e12:g} TFLOP/s")


def host_link(profile: DeviceProfile | None) -> HostLink:
    """The link offload transfers are priced at: the profile's, else the
    :data:`DEFAULT_LINK_PROFILE`'s (an accelerator target's host link plugs in here too).

    >>> host_link(None).describe()
    "64 GB/s per direction, the h100 profile's host link, counted at its 989.4 TFLOP/s"
    """
    p = profile if profile is not None else PROFILES[DEFAULT_LINK_PROFILE]
    return HostLink(p.name, p.host_link_bytes_per_s, p.flops_per_s, p.source)


_KEYS = frozenset({"name", "flops_per_s", "hbm_bytes", "host_link_bytes_per_s", "source", "base",
                   "exposed_transfer_share"})

_MSG_PROFILE = """\
{what}
A profile is a built-in name ({names}) or a YAML file such as

    base: h100                   # optional: start from a built-in profile
    name: my-gpu
    flops_per_s: 7.0e14          # peak dense FLOP/s of the dtype you train in
    hbm_bytes: 48GiB             # bytes or units
    host_link_bytes_per_s: 2.5e10
    exposed_transfer_share: 0.3  # optional: the share of offload transfers the step waits for
    source: where the figures come from"""


def _profile_error(what: str) -> PlanError:
    return PlanError(_MSG_PROFILE.format(what=what, names=sorted_list(PROFILES)))


def load_profile(profile: str | os.PathLike[str] | DeviceProfile | None) -> DeviceProfile | None:
    """A :class:`DeviceProfile` from a built-in name, a YAML file, or a profile (``None``: none).

    >>> load_profile("h100").hbm_bytes
    84942979072
    """
    if profile is None or isinstance(profile, DeviceProfile):
        return profile
    key = str(profile)
    if ALIASES.get(key, key) in PROFILES:
        return PROFILES[ALIASES.get(key, key)]
    p = Path(key)
    if p.suffix.lower() not in (".yaml", ".yml"):
        raise _profile_error(f"profile {key!r} is neither a built-in profile nor a YAML file.")
    data, _ = load_yaml(read_text_file(p, "device profile", MAX_PLAN_BYTES), key)
    if not isinstance(data, Mapping):
        raise _profile_error(f"{key}: the file holds a {type(data).__name__}, not a mapping.")
    bad = set(map(str, data)) - _KEYS
    if bad:
        raise _profile_error(f"{key}: unknown key(s) {sorted_list(bad)}; allowed: "
                             f"{sorted_list(_KEYS)}.")
    base: dict[str, Any] = {}
    if "base" in data:
        name = data["base"]
        if not isinstance(name, str) or ALIASES.get(name, name) not in PROFILES:
            raise _profile_error(f"{key}: base {short(name)} is not a built-in profile.")
        base = PROFILES[ALIASES.get(name, name)].to_json()
    fields = {**base, **{k: v for k, v in data.items() if k != "base"}}
    missing = [k for k in ("flops_per_s", "hbm_bytes", "host_link_bytes_per_s") if k not in fields]
    if missing:
        raise _profile_error(f"{key}: missing key(s) {sorted_list(missing)}.")
    rates = {k: _rate(fields[k], k, key) for k in ("flops_per_s", "host_link_bytes_per_s")}
    for k in ("name", "source"):
        if k in data and not isinstance(data[k], str):
            raise _profile_error(f"{key}: {k} must be a string, got {type(data[k]).__name__} "
                                 f"{short(data[k])}.")
    try:
        hbm = parse_bytes(fields["hbm_bytes"], "hbm_bytes")
    except RematError as e:
        raise _profile_error(f"{key}: {str(e).splitlines()[0]} Write bytes or a number with a unit "
                             "(48GiB, 80GB).") from None
    share = fields.get("exposed_transfer_share", 0.0)
    if isinstance(share, bool) or not isinstance(share, int | float) or not 0 <= share <= 1:
        raise _profile_error(f"{key}: exposed_transfer_share {short(share)}: it must be a number "
                             "from 0 (every offload transfer overlapped) to 1 (none).")
    return DeviceProfile(name=str(fields.get("name", p.stem)), hbm_bytes=hbm,
                         source=str(fields.get("source", f"from {key}")),
                         exposed_transfer_share=float(share), **rates)


def _rate(value: Any, name: str, source: str) -> float:
    """A positive, finite per-second rate: a number (``7.0e14``; a quoted number is read too),
    never a boolean (YAML's ``yes``) nor a figure with units."""
    v = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        v = float(value)
    elif isinstance(value, str):
        try:
            v = float(value)
        except ValueError:
            v = None
    if v is None or not math.isfinite(v) or v <= 0:
        why = ("units are not read: write the number per second, e.g. 9.894e14"
               if isinstance(value, str) and v is None else "it must be a positive, finite number")
        raise _profile_error(f"{source}: {name} {short(value)}: {why}.")
    return v
