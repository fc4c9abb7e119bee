"""Naming a target and sizing for one, with no compiler (docs/targets.md): accelerator names and
target config files, meshes, device kinds, the doctor's list of targets, a report config's
``accelerator``/``mesh`` keys, and the capacity search's arithmetic (peaks as functions of the
batch). What compiles for a target is tests/test_targets.py.
"""

from __future__ import annotations

import jax
import pytest

from remat_common import RematError
from remat_common.measurement import parse_accelerator, parse_mesh, target_kinds

GPUS = ("a100-40g", "a100-80g", "h100", "h200", "b200")


# -- names, meshes, doctor ------------------------------------------------------------------------

def test_gpu_names_counts_and_hosts() -> None:
    a = parse_accelerator("h100x8")
    assert (a.platform, a.chip, a.count, a.hosts, a.topology) == ("cuda", "h100", 8, 1, "1x1x8")
    assert a.memory_bytes == 84942979072  # device_memory_size of the shipped target config
    assert a.host_link_bytes_per_s == 64e9  # the data sheet's (the config's pcie_bandwidth: 2**35)
    two = parse_accelerator("H200x16")
    assert (two.hosts, two.topology, two.name) == (2, "1x2x8", "h200x16")
    for name in GPUS:  # every shipped config names its source
        cfg = parse_accelerator(name).config
        assert cfg is not None and "xla/backends/gpu/target_config/specs/" in cfg
    assert parse_accelerator(None).is_local and parse_accelerator("local").is_local


def test_tpu_names() -> None:
    assert parse_accelerator("v5p:2x2x2").topology == "v5p:2x2x2"
    assert parse_accelerator("v5e").topology == "v5e:2x2"  # the generation's default slice
    assert parse_accelerator("v6e:2x2").memory_bytes == int(31.24 * 2**30)  # XLA:TPU's, of 32 GiB


def test_each_profile_is_its_accelerator() -> None:
    """One table per fact: a built-in profile per chip of the accelerator table, named as it is,
    with its figures; the old name ``tpu-v5e`` reads as ``v5e``."""
    from remat_common.internal import PROFILES
    from remat_common.measurement import load_profile

    assert list(PROFILES) == [*GPUS, "v4", "v5e", "v5p", "v6e"]
    for chip, p in PROFILES.items():
        a = parse_accelerator(chip)
        assert p.name == chip and (p.hbm_bytes, p.flops_per_s, p.host_link_bytes_per_s) == (
            a.memory_bytes, a.flops_per_s, a.host_link_bytes_per_s)
    assert PROFILES["v5e"].hbm_bytes == int(15.75 * 2**30)  # XLA:TPU's, of 16 GiB
    assert PROFILES["h100"].hbm_bytes == 84942979072  # device_memory_size of its target config
    assert load_profile("tpu-v5e") is PROFILES["v5e"]


def test_own_target_config_file(tmp_path) -> None:
    f = tmp_path / "mygpu.txtpb"
    f.write_text(parse_accelerator("a100-80g").config.replace("85100068864", "50000000000"))
    a = parse_accelerator(f"{f}:4")
    assert (a.platform, a.count, a.memory_bytes, a.chip) == ("cuda", 4, 50_000_000_000, str(f))
    bad = tmp_path / "notes.txtpb"
    bad.write_text("hello")
    with pytest.raises(RematError, match="holds no gpu_device_info"):
        parse_accelerator(str(bad))


@pytest.mark.parametrize("name, why", [
    ("rtx9000", "unknown accelerator"),
    ("v9:2x2", "unknown TPU generation 'v9'"),
    ("h100x12", "12 GPUs do not split into hosts of 8"),
    ("h100x0", "the count must be at least 1"),
    ("missing.txtpb", "does not exist"),
    (3, "a int is not an accelerator name"),
])
def test_bad_names_say_what_to_write(name, why) -> None:
    with pytest.raises(RematError) as e:
        parse_accelerator(name)
    assert why in str(e.value) and "h100x8" in str(e.value) and "v5p:2x2x2" in str(e.value)


def test_mesh() -> None:
    assert parse_mesh("data=2,fsdp=4", 8) == {"data": 2, "fsdp": 4}
    assert parse_mesh(None, 8) == {"data": 8}
    for text, why in [("data=3", "multiply to 3, not 8"), ("model=8", "unknown axis 'model'"),
                      ("data", "is not AXIS=N"), ("data=x", "is not an integer"),
                      ("data=4,data=2", "given twice")]:
        with pytest.raises(RematError, match=why):
            parse_mesh(text, 8)


@pytest.mark.parametrize("kind, name", [
    ("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA B200", "b200"),
    ("NVIDIA A100-SXM4-40GB", "a100-40g"), ("NVIDIA A100 80GB PCIe", "a100-80g"),
    ("NVIDIA GH200 480GB", None), ("NVIDIA GeForce RTX 4090", None), ("TPU v5 lite", "v5e:1x1"),
    ("TPU v6 lite", "v6e:1x1"), ("TPU v5", "v5p:1x1x1"),
])
def test_a_device_kind_names_its_target_config(kind, name) -> None:
    """scripts/device_check compiles for the deviceless twin of the device it runs on: found by
    the device's device_kind (a superchip, GH200, has other memory than an H200: none)."""
    from remat_common.internal import accelerator_for

    assert accelerator_for(kind) == name


def test_doctor_lists_targets_with_install_lines() -> None:
    kinds = dict(target_kinds())
    assert kinds["local (this machine's backend)"] is None
    for kind, why in kinds.items():
        if why is not None:
            assert "pip install 'jax-remat-plan[target-" in why and jax.__version__ in why


# -- a report config's keys -----------------------------------------------------------------------

def test_report_config_accelerator_keys(tmp_path) -> None:
    from remat_common.internal import ConfigError, ReportConfig, with_target

    cfg = tmp_path / "r.yaml"
    cfg.write_text("target: m.py:f\nplans: {none: null}\naccelerator: h100x8\nmesh: fsdp=8\n")
    c = ReportConfig.load(cfg)
    assert (c.accelerator, c.mesh) == ("h100x8", "fsdp=8")
    assert with_target(c, "local", None).accelerator is None  # --accelerator local wins
    with pytest.raises(RematError, match=f"not {len(jax.devices())}"):  # this machine's devices
        with_target(c, "local", f"data={len(jax.devices()) + 1}")
    with pytest.raises(RematError, match="multiply to 4, not 8"):
        parse_mesh("fsdp=4", 8)
    cfg.write_text("target: m.py:f\nplans: {none: null}\naccelerator: 8\n")
    with pytest.raises(ConfigError, match="accelerator must be a string"):
        ReportConfig.load(cfg)


# -- capacity: the largest batch that fits ---------------------------------------------------------

def _brute(fits, step: int, top: int) -> int:
    return max((b for b in range(step, top + 1, step) if fits(b)), default=0)


@pytest.mark.parametrize("case", ["affine", "jumps", "refused", "xla_remat", "start_over"])
def test_largest_fit_is_exact_in_few_compiles(case) -> None:
    """The capacity search (no compiler here: peaks as functions of the batch): the answer fits,
    the next step does not (each compiled), as a search of every batch finds; about three
    compiles where the peak is affine, a few more where it jumps or the compiler refuses."""
    from remat_common.internal import NoFit, largest_fit

    cap, step, start = 10_000, 4, 8
    peak = {"affine": lambda b: 1_000 + 70 * b,
            "jumps": lambda b: 1_000 + 61 * b + 400 * (b // 32),
            "refused": lambda b: 1_000 + 70 * b if b < 100 else NoFit(None, "refused"),
            "xla_remat": lambda b: 1_000 + 50 * b if b <= 160 else NoFit(9_000, "XLA"),
            "start_over": lambda b: 1_000 + 1_500 * b}[case]
    big = {"refused": 10**9}.get(case, cap)  # a budget above the device memory: the compiler decides
    compiled: list[int] = []

    def peak_at(b: int):
        compiled.append(b)
        return peak(b)

    def fits(b: int) -> bool:
        p = peak(b)
        return not isinstance(p, NoFit) and p <= big

    lo, hi, first = largest_fit(peak_at, big, start, step, None, lambda: False,
                                ceiling=8_000 if case == "refused" else None)
    assert lo == _brute(fits, step, 4_000) and hi == lo + step, (lo, hi, compiled)
    assert len(compiled) == len(set(compiled))  # no size compiled twice
    # XLA rematerializes short of the budget: the line cannot tell where, so the bracket is bisected
    most = {"affine": 4, "jumps": 6, "refused": 5, "xla_remat": 9, "start_over": 5}[case]
    assert len(compiled) <= most, compiled
    if case == "affine":  # start, one more, the prediction (128) and the step above it
        assert first == 128 and compiled == [8, 16, 128, 132]
