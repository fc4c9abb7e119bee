"""Reading a compiled program's HLO text: what XLA's own rematerialization recomputed
(:func:`program_remat`), and the values it placed in host memory (:func:`host_placements`)."""

from __future__ import annotations

import math
import re
from collections import Counter

from ..._jaxcompat import split_top


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

# -- host placements in a compiled program ------------------------------------------------------------

_HOST_SPACE = "S(5)}"
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s+([a-z][\w\-]*)\((.*)$")
_CALLS = re.compile(r"calls=%?([\w.\-]+)")
_OPERAND = re.compile(r"%([\w.\-]+)")
_PLUMBING = frozenset({"parameter", "get-tuple-element", "tuple", "while", "bitcast", "call",
                       "conditional", "custom-call", "opt-barrier", "constant"})


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
            parts = split_top(shape.strip()[1:-1])  # (destination, source, context)
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
