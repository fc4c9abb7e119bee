"""The table of ``docs/targets.md``: per plan, a target's compiled figures next to the CPU's.

Reads ``remat report --json`` files (one compiled for the accelerator, optionally one compiled by the
local CPU compiler with the same layout) and prints a Markdown table: per-device peak (arguments +
outputs + temp - aliased), host temp, FLOP ratio, whether the peak fits the device, whether XLA
rematerialized on its own, compile time; and the CPU's peak and host temp beside. Make the reports
first (each 8B GPU compile takes minutes on 2 cores)::

    JAX_PLATFORMS=cpu remat report examples/nnx_gpt/llama3_8b_h100x8.yaml --json h100.json
    XLA_FLAGS=--xla_force_host_platform_device_count=8 JAX_PLATFORMS=cpu remat report \\
        examples/nnx_gpt/llama3_8b_h100x8.yaml --accelerator local --mesh fsdp=8 --json cpu.json
    python benchmarks/targets_table.py h100.json cpu.json
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from remat_common.internal import fmt_bytes  # noqa: E402
from remat_common.measurement import Report  # noqa: E402


def table(target: Report, cpu: Report | None = None) -> str:
    acc = target.accelerator or {}
    head = ["plan", "peak/device", "host temp", "FLOP ratio", "fits", "XLA remat on its own",
            "compile"]
    if cpu is not None:
        head += ["CPU peak/device", "CPU host temp"]
    rows = [f"{acc.get('description', 'local')}, mesh "
            + ",".join(f"{k}={v}" for k, v in (acc.get("mesh") or {}).items()), "",
            "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for p in target.plans:
        over = target.exceeds_by(p.name)
        fits = "?" if over is None else "yes" if over == 0 else f"no (+{fmt_bytes(over)})"
        cells = [p.name, fmt_bytes(p.memory.device_total), fmt_bytes(p.memory.host_temp_size_in_bytes),
                 "-" if p.flop_ratio is None else f"{p.flop_ratio:.3f}", fits,
                 "yes" if p.xla_remat else "no", f"{p.timing.lower_s + p.timing.compile_s:.0f} s"]
        if cpu is not None:
            c = cpu[p.name] if p.name in cpu.names else None
            cells += ["-" if c is None else fmt_bytes(c.memory.device_total),
                      "-" if c is None else fmt_bytes(c.memory.host_temp_size_in_bytes)]
        rows.append("| " + " | ".join(cells) + " |")
    for r in target.refused:  # out of the target's memory: no figures
        cells = [r.name, "refused", "-", "-", "no (refused)", "-", f"{r.compile_s:.0f} s"]
        if cpu is not None:
            c = cpu[r.name] if r.name in cpu.names else None
            cells += ["-" if c is None else fmt_bytes(c.memory.device_total),
                      "-" if c is None else fmt_bytes(c.memory.host_temp_size_in_bytes)]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main(argv: list[str]) -> int:
    if not 1 <= len(argv) <= 2:
        print(__doc__, file=sys.stderr)
        return 2
    target = Report.load(argv[0])
    cpu = Report.load(argv[1]) if len(argv) > 1 else None
    print(table(target, cpu))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
