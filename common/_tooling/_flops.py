"""FLOPs of a compiled step with every loop body counted once per iteration.

XLA's ``cost_analysis()`` counts a while-loop body once, whatever its trip count
(docs/jax_behaviour.md "Measuring on CPU"): the FLOPs of a scanned stack of ``L`` layers read as
those of one layer. Here each while body is
costed on its own (the compiled HLO re-parsed with the body as entry computation) and multiplied
by the trip count XLA recorded for the loop (``known_trip_count``), nested loops included; where
XLA recorded none (XLA:TPU), by the count its condition (``i < N``) and counter (from a constant, up
by one) give.
A program whose loops cannot be counted that way (a dynamic trip count, a loop inside a called
computation) gets no figure, only the reason.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from typing import Any

import jax

from .._jaxcompat import hlo_cost_functions

_HEAD = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s")
_WHILE = re.compile(r"\bwhile\(.*?\bbody=%?([\w.\-]+)")
_TRIP = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"(\d+)"')


@dataclasses.dataclass(frozen=True)
class Flops:
    """FLOPs of a compiled program.

    Attributes:
      flops: with loop bodies multiplied by their trip counts; ``None`` when unknown.
      xla_flops: ``cost_analysis()['flops']`` as XLA reports it (each loop body once).
      loops: how many while loops were multiplied out.
      reason: why ``flops`` is unknown (``None`` when it is known).
    """

    flops: float | None
    xla_flops: float | None
    loops: int = 0
    reason: str | None = None


def _xla_flops(compiled: Any) -> float | None:
    try:
        ca = compiled.cost_analysis()
    except Exception:  # noqa: BLE001 - not every backend reports costs
        return None
    if isinstance(ca, list | tuple):
        ca = ca[0] if ca else None
    if not ca or "flops" not in ca:
        return None
    v = float(ca["flops"])
    return v if math.isfinite(v) and v >= 0 else None


def _hlo_tools() -> tuple[Callable[[str], Any], Callable[[Any], dict[str, Any]]] | None:
    """``(parse HLO text, cost analysis of a parsed module)`` from the installed jaxlib, or None."""
    return hlo_cost_functions()


_DEF = re.compile(r"^\s*(?:ROOT\s+)?%([\w.\-]+)\s*=\s*.*?\s([a-z][\w\-]*)\((.*)$")
_COND = re.compile(r"\bcondition=%?([\w.\-]+)")
_CONST = re.compile(r"constant\((-?\d+)\)")
_INDEX = re.compile(r"\bindex=(\d+)")


def _args(rest: str) -> list[str]:
    """The operand names of an instruction (the text after its opening parenthesis)."""
    depth, i = 1, 0
    while i < len(rest) and depth:
        depth += {"(": 1, ")": -1}.get(rest[i], 0)
        i += 1
    return re.findall(r"%([\w.\-]+)", rest[:i - 1])


def _constant(defs: dict[str, tuple[str, str]], name: str) -> int | None:
    """The integer a value is, through copies and bitcasts, if it is a constant."""
    for _ in range(8):
        d = defs.get(name)
        if d is None:
            return None
        op, rest = d
        if op == "constant":
            m = _CONST.match("constant(" + rest)
            return int(m.group(1)) if m else None
        if op not in ("copy", "bitcast", "convert"):
            return None
        ops = _args(rest)
        if len(ops) != 1:
            return None
        name = ops[0]
    return None


def _inferred_trip(line: str, comp_defs: dict[str, tuple[str, str]],
                   defs: dict[str, dict[str, tuple[str, str]]],
                   roots: dict[str, str]) -> int | None:
    """A while loop's trip count from its condition ``i < N`` (``N`` a constant) and the constant
    its counter starts at, counting up by one (XLA:TPU records no ``known_trip_count``)."""
    c, b = _COND.search(line), _WHILE.search(line)
    if c is None or b is None or c.group(1) not in roots or b.group(1) not in roots:
        return None
    cond = defs[c.group(1)]
    root = cond.get(roots[c.group(1)])
    if root is None or root[0] != "compare" or "direction=LT" not in root[1]:
        return None
    lhs_rhs = _args(root[1])
    if len(lhs_rhs) != 2 or cond.get(lhs_rhs[0], ("",))[0] != "get-tuple-element":
        return None
    k = _INDEX.search(cond[lhs_rhs[0]][1])
    bound = _constant(cond, lhs_rhs[1])
    init = _args(line.split(" while(", 1)[1])
    if k is None or bound is None or len(init) != 1 or init[0] not in comp_defs:
        return None
    elems = _args(comp_defs[init[0]][1]) if comp_defs[init[0]][0] == "tuple" else []
    idx = int(k.group(1))
    start = _constant(comp_defs, elems[idx]) if idx < len(elems) else None
    body = defs[b.group(1)]  # the counter's next value: get-tuple-element(param, k) + 1
    nxt = body.get(roots[b.group(1)])
    if start is None or nxt is None or nxt[0] != "tuple":
        return None
    out = _args(nxt[1])
    step = body.get(out[idx]) if idx < len(out) else None
    if step is None or step[0] != "add":
        return None
    terms = _args(step[1])
    if sorted(_constant(body, t) == 1 for t in terms) != [False, True]:
        return None
    return max(0, bound - start)


def _computations(lines: list[str]) -> tuple[str | None, dict[str, list[tuple[str, int | None]]]]:
    """The entry computation's name and, per computation, its while loops ``(body, trip count)``:
    the one XLA recorded, else the one its condition and counter give."""
    entry, cur = None, None
    loops: dict[str, list[tuple[str, int | None]]] = {}
    defs: dict[str, dict[str, tuple[str, str]]] = {}
    roots: dict[str, str] = {}
    pending: list[tuple[str, int, str]] = []
    for line in lines:
        if line and not line[0].isspace() and line.rstrip().endswith("{"):
            m = _HEAD.match(line)
            if m is None:
                continue
            cur = m.group(2)
            loops[cur] = []
            defs[cur] = {}
            if m.group(1):
                entry = cur
            continue
        if cur is None:
            continue
        d = _DEF.match(line)
        if d is not None:
            defs[cur][d.group(1)] = (d.group(2), d.group(3))
            if line.lstrip().startswith("ROOT"):
                roots[cur] = d.group(1)
        if " while(" in line:
            w = _WHILE.search(line)
            if w is not None:
                t = _TRIP.search(line)
                loops[cur].append((w.group(1), int(t.group(1)) if t else None))
                if t is None:
                    pending.append((cur, len(loops[cur]) - 1, line))
    for comp, i, line in pending:
        loops[comp][i] = (loops[comp][i][0], _inferred_trip(line, defs[comp], defs, roots))
    return entry, loops


def _as_entry(lines: list[str], name: str) -> str:
    """The module text with ``name`` as its entry computation (module attributes dropped)."""
    out = ["HloModule m"]
    for line in lines[1:]:
        if line and not line[0].isspace() and line.rstrip().endswith("{"):
            m = _HEAD.match(line)
            if m is not None:
                line = ("ENTRY " if m.group(2) == name else "") + line[len(m.group(1) or ""):]
        out.append(line)
    return "\n".join(out)


def count_flops(compiled: Any) -> Flops:
    """FLOPs of ``compiled`` (a ``jax.stages.Compiled``) with scans counted per iteration.

    >>> import jax, jax.numpy as jnp
    >>> def f(ws, h):
    ...     return jax.lax.scan(lambda c, w: (jnp.tanh(c @ w), None), h, ws)[0].sum()
    >>> args = (jnp.ones((4, 32, 32)), jnp.ones((8, 32)))
    >>> scanned = count_flops(jax.jit(f).lower(*args).compile())
    >>> scanned.loops, scanned.flops > 3.5 * scanned.xla_flops
    (1, True)
    """
    raw = _xla_flops(compiled)
    try:
        text = _parseable(compiled.as_text())
    except Exception as e:  # noqa: BLE001
        if raw is None:
            return Flops(None, None, reason="the backend reports no cost analysis")
        return Flops(None, raw, reason=f"the compiled HLO is not available ({type(e).__name__})")
    tools = _hlo_tools()
    if raw is None:  # XLA:GPU compiled for a target config: cost the compiled HLO text itself
        if tools is None:
            return Flops(None, None, reason="the backend reports no cost analysis")
        try:
            raw = float(tools[1](tools[0](text)).get("flops", 0.0))
        except Exception as e:  # noqa: BLE001 - parsing internals: report, never guess
            first = (str(e).strip().splitlines() or [""])[0][:200]
            return Flops(None, None, reason="the backend reports no cost analysis and its compiled "
                         f"HLO could not be costed ({type(e).__name__}: {first})")
    if " while(" not in text:
        return Flops(raw, raw)
    lines = text.splitlines()
    entry, loops = _computations(lines)
    if entry is None or tools is None:
        return Flops(None, raw, reason=f"the step has while loops (scans) and this jaxlib "
                     f"{jax.__version__} offers no way to cost them per iteration")
    parse, cost = tools
    memo: dict[str, float] = {}
    raw_of: dict[str, float] = {}
    visited: set[str] = set()
    n = 0

    def raw_cost(comp: str) -> float:
        if comp not in raw_of:
            raw_of[comp] = float(cost(parse(_as_entry(lines, comp))).get("flops", 0.0))
        return raw_of[comp]

    def true_cost(comp: str) -> float:
        nonlocal n
        if comp in memo:
            return memo[comp]
        visited.add(comp)
        total = raw if comp == entry else raw_cost(comp)
        for body, trip in loops.get(comp, []):
            if trip is None:
                raise _Unknown("a while loop has no known trip count (a while_loop or fori_loop "
                               "with a bound known only at run time)")
            n += 1
            total += trip * true_cost(body) - raw_cost(body)
        memo[comp] = total
        return total

    try:
        flops = true_cost(entry)
    except _Unknown as e:
        return Flops(None, raw, reason=str(e))
    except Exception as e:  # noqa: BLE001 - parsing/costing internals: report, never guess
        first = (str(e).strip().splitlines() or [""])[0][:200]
        return Flops(None, raw, reason=f"costing a loop body failed ({type(e).__name__}: {first})")
    hidden = sorted(c for c, ws in loops.items() if ws and c not in visited)
    if hidden:
        return Flops(None, raw, reason=f"while loops inside called computations ({', '.join(hidden[:3])}) "
                     "cannot be attributed a trip count")
    return Flops(flops, raw, n)


_UNPARSED = ("output_to_operand_aliasing=",)


def _parseable(text: str) -> str:
    """The compiled HLO without attributes the text parser does not take back (XLA:GPU's
    ``output_to_operand_aliasing`` on async collectives); they change no FLOP count."""
    for attr in _UNPARSED:
        while (i := text.find(", " + attr)) >= 0:
            j = i + 2 + len(attr)
            depth = 0
            while j < len(text):
                depth += {"{": 1, "}": -1}.get(text[j], 0)
                j += 1
                if depth == 0:
                    break
            text = text[:i] + text[j:]
    return text


class _Unknown(Exception):
    pass
