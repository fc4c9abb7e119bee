"""FLOPs of a compiled step with every loop body counted once per iteration.

XLA's ``cost_analysis()`` counts a while-loop body once, whatever its trip count
(https://github.com/jax-remat-plan/jax-remat-plan/blob/main/docs/jax_behaviour.md#measuring-on-cpu):
the FLOPs of a scanned stack of ``L`` layers read as those of one layer. Here each computation
that holds a loop is costed on its own (the compiled HLO re-parsed with it as entry computation) and every while body is multiplied by the trip count XLA
recorded for the loop (``known_trip_count``: XLA's own analysis of the loop's induction variable,
its start, step and bound; where XLA recorded none, as XLA:TPU does, the count the loop's condition
``i < N`` and counter give: from a constant, up by a constant step, 2 in XLA:TPU's windowed einsum
loops of an FSDP matmul), through the whole call graph: loops in loops, and loops inside called
computations (XLA:CPU outlines the threefry generator's loop of ``jax.random`` into a ``call``:
every step that draws random numbers, dropout or diffusion noise, has one).
A loop whose trip count XLA does not know (a ``while_loop`` whose bound is a run-time value) is
named, with its source line; its body is counted once (``counted``) and ``flops`` is unknown.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from typing import Any

import jax

from ..._jaxcompat import hlo_cost_functions

_HEAD = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s")
_NAME = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=")
_WHILE = re.compile(r"\bwhile\(.*?\bcondition=%?([\w.\-]+), body=%?([\w.\-]+)")
_TRIP = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"(\d+)"')
_TO_APPLY = re.compile(r"\bto_apply=%?([\w.\-]+)")
_BRANCHES = re.compile(r"\b(?:branch_computations=\{([^}]*)\}|true_computation=%?([\w.\-]+), "
                       r"false_computation=%?([\w.\-]+))")
_CALLS = re.compile(r"\bcalls=%?([\w.\-]+)")
_OP_NAME = re.compile(r'\bop_name="([^"]*)"')
_FRAME = re.compile(r"\bstack_frame_id=(\d+)")
_SOURCE = re.compile(r'\bsource_file="([^"]*)" source_line=(\d+)')


@dataclasses.dataclass(frozen=True)
class Flops:
    """FLOPs of a compiled program.

    Attributes:
      flops: with loop bodies multiplied by their trip counts; ``None`` when unknown.
      xla_flops: ``cost_analysis()['flops']`` as XLA reports it (each loop body once).
      loops: how many while loops were multiplied out.
      reason: why ``flops`` is unknown (``None`` when it is known): the loops that cannot be
        counted, each with its op name and source line.
      counted: the part that can be counted: every loop XLA knows the trip count of multiplied
        out, the others counted once (a lower bound of the step's FLOPs); equal to ``flops`` when
        that is known, ``None`` when nothing can be costed.
      uncounted: the loops not counted per iteration (no trip count XLA knows, or no way to
        cost a loop body with this jaxlib), one line each (op name and source line).
    """

    flops: float | None
    xla_flops: float | None
    loops: int = 0
    reason: str | None = None
    counted: float | None = None
    uncounted: tuple[str, ...] = ()


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


@dataclasses.dataclass
class _Loop:
    """A while instruction: its body, condition, trip count (None: unknown) and where it is from."""

    body: str
    cond: str
    trip: int | None
    where: str


@dataclasses.dataclass
class _Comp:
    """What a computation runs besides its own instructions: loops, calls, conditionals, and the
    computations its other instructions apply (fusions, reductions: never a loop on their own)."""

    loops: list[_Loop] = dataclasses.field(default_factory=list)
    calls: list[str] = dataclasses.field(default_factory=list)
    branches: list[tuple[str, tuple[str, ...]]] = dataclasses.field(default_factory=list)
    applies: list[tuple[str, str]] = dataclasses.field(default_factory=list)


def _source_lines(lines: list[str]) -> Callable[[str], str | None]:
    """``where(instruction line) -> 'file.py:12 (fn)'`` from the module's stack-frame tables (or
    the older ``source_file``/``source_line`` metadata)."""
    tables: dict[str, dict[int, str]] = {}
    section = None
    for line in lines[1:]:
        if line.rstrip().endswith("{") and not line[:1].isspace():
            break  # the computations start
        head = line.strip()
        if head in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
            section = head
            tables[section] = {}
        elif section is not None and head[:1].isdigit():
            k, _, v = head.partition(" ")
            tables[section][int(k)] = v
    files, funcs = tables.get("FileNames", {}), tables.get("FunctionNames", {})
    locs, frames = tables.get("FileLocations", {}), tables.get("StackFrames", {})

    def field(text: str, key: str) -> int | None:
        m = re.search(rf"\b{key}=(\d+)", text)
        return int(m.group(1)) if m else None

    def where(line: str) -> str | None:
        m = _SOURCE.search(line)
        if m:
            return f"{m.group(1)}:{m.group(2)}"
        f = _FRAME.search(line)
        frame = frames.get(int(f.group(1)), "") if f else ""
        loc = locs.get(field(frame, "file_location_id") or -1, "")
        file, line_no = files.get(field(loc, "file_name_id") or -1), field(loc, "line")
        if file is None or line_no is None:
            return None
        fn = funcs.get(field(loc, "function_name_id") or -1)
        return f"{file.strip(chr(34))}:{line_no}" + (f" ({fn.strip(chr(34))})" if fn else "")

    return where


def _describe(line: str, where: Callable[[str], str | None]) -> str:
    name = _NAME.match(line)
    op = _OP_NAME.search(line)
    src = where(line)
    return (f"{name.group(1) if name else 'while'}"
            + (f" ({op.group(1)})" if op else "") + (f" at {src}" if src else ""))


_DEF = re.compile(r"^\s*(?:ROOT\s+)?%([\w.\-]+)\s*=\s*.*?\s([a-z][\w\-]*)\((.*)$")
_CONST = re.compile(r"constant\((-?\d+)\)")
_INDEX = re.compile(r"\bindex=(\d+)")


def _args(rest: str) -> list[str]:
    """The operand names of an instruction (the text after its opening parenthesis)."""
    depth, i = 1, 0
    while i < len(rest) and depth:
        depth += {"(": 1, ")": -1}.get(rest[i], 0)
        i += 1
    return re.findall(r"%([\w.\-]+)", rest[:i - 1])


_PASS_THROUGH = ("copy", "bitcast", "convert")


def _through(defs: dict[str, tuple[str, str]], name: str) -> str:
    """The value ``name`` is a copy (bitcast, conversion) of, through up to 8 such steps."""
    for _ in range(8):
        d = defs.get(name)
        if d is None or d[0] not in _PASS_THROUGH:
            return name
        ops = _args(d[1])
        if len(ops) != 1:
            return name
        name = ops[0]
    return name


def _constant(defs: dict[str, tuple[str, str]], name: str) -> int | None:
    """The integer a value is, through copies and bitcasts, if it is a constant."""
    d = defs.get(_through(defs, name))
    if d is None or d[0] != "constant":
        return None
    m = _CONST.match("constant(" + d[1])
    return int(m.group(1)) if m else None


def _element(defs: dict[str, tuple[str, str]], name: str) -> int | None:
    """``k`` where a value is (a copy of) ``get-tuple-element(param, index=k)``, else ``None``."""
    d = defs.get(_through(defs, name))
    if d is None or d[0] != "get-tuple-element":
        return None
    k = _INDEX.search(d[1])
    return int(k.group(1)) if k else None


#: compare directions as ``i OP N`` with the counter on the left (the right: mirrored)
_MIRROR = {"LT": "GT", "LE": "GE", "GT": "LT", "GE": "LE"}


def _inferred_trip(line: str, comp_defs: dict[str, tuple[str, str]],
                   defs: dict[str, dict[str, tuple[str, str]]],
                   roots: dict[str, str]) -> int | None:
    """A while loop's trip count from its condition (``i < N``, ``i <= N``, or the same written
    ``N > i``; ``N`` a constant), the constant its counter starts at, and the constant step its
    body adds to the counter (XLA:TPU records no ``known_trip_count``; its windowed einsum loops,
    which run an FSDP matmul shard by shard, step by 2)."""
    w = _WHILE.search(line)
    if w is None or w.group(1) not in roots or w.group(2) not in roots:
        return None
    cond_name, body_name = w.group(1), w.group(2)
    cond = defs[cond_name]
    root = cond.get(roots[cond_name])
    direction = re.search(r"direction=(\w+)", root[1]) if root is not None else None
    if root is None or root[0] != "compare" or direction is None:
        return None
    lhs_rhs = _args(root[1])
    if len(lhs_rhs) != 2:
        return None
    op, (counter, limit) = direction.group(1), lhs_rhs
    if _element(cond, counter) is None:  # N > i: the counter on the right
        op, (limit, counter) = _MIRROR.get(op, ""), lhs_rhs
    idx, bound = _element(cond, counter), _constant(cond, limit)
    init = _args(line.split(" while(", 1)[1])
    if op not in ("LT", "LE") or idx is None or bound is None or len(init) != 1 \
            or init[0] not in comp_defs:
        return None
    elems = _args(comp_defs[init[0]][1]) if comp_defs[init[0]][0] == "tuple" else []
    start = _constant(comp_defs, elems[idx]) if idx < len(elems) else None
    body = defs[body_name]  # the counter's next value: get-tuple-element(param, idx) + step
    nxt = body.get(roots[body_name])
    if start is None or nxt is None or nxt[0] != "tuple":
        return None
    out = _args(nxt[1])
    step = body.get(_through(body, out[idx])) if idx < len(out) else None
    if step is None or step[0] != "add":
        return None
    terms = _args(step[1])
    if len(terms) != 2:
        return None
    for a, b in (terms, terms[::-1]):
        by = _constant(body, b)
        if by is not None and by > 0 and _element(body, a) == idx:
            span = bound - start + (1 if op == "LE" else 0)
            return max(0, -(-span // by))
    return None


def _computations(lines: list[str]) -> tuple[str | None, dict[str, _Comp]]:
    """The entry computation's name and, per computation, the computations it runs. A loop's trip
    count is the one XLA recorded, else the one its condition and counter give (XLA:TPU)."""
    where = _source_lines(lines)
    entry, cur = None, None
    comps: dict[str, _Comp] = {}
    defs: dict[str, dict[str, tuple[str, str]]] = {}
    roots: dict[str, str] = {}
    pending: list[tuple[str, _Loop, str]] = []
    for line in lines:
        if line and not line[0].isspace() and line.rstrip().endswith("{"):
            m = _HEAD.match(line)
            if m is None:
                continue
            cur = m.group(2)
            comps[cur] = _Comp()
            defs[cur] = {}
            if m.group(1):
                entry = cur
            continue
        if cur is None or "=" not in line:
            continue
        c = comps[cur]
        d = _DEF.match(line)
        if d is not None:
            defs[cur][d.group(1)] = (d.group(2), d.group(3))
            if line.lstrip().startswith("ROOT"):
                roots[cur] = d.group(1)
        if " while(" in line and (w := _WHILE.search(line)) is not None:
            t = _TRIP.search(line)
            c.loops.append(_Loop(w.group(2), w.group(1), int(t.group(1)) if t else None,
                                 _describe(line, where)))
            if t is None:
                pending.append((cur, c.loops[-1], line))
        elif " call(" in line and (a := _TO_APPLY.search(line)) is not None:
            c.calls.append(a.group(1))
        elif " conditional(" in line and (b := _BRANCHES.search(line)) is not None:
            names = (b.group(1) or "").replace("%", "").split(",") if b.group(1) else b.groups()[1:]
            c.branches.append((_describe(line, where), tuple(n.strip() for n in names if n)))
        else:
            for ref in (*_TO_APPLY.findall(line), *_CALLS.findall(line)):
                c.applies.append((ref, _describe(line, where)))
    for comp, loop, line in pending:
        loop.trip = _inferred_trip(line, defs[comp], defs, roots)
    return entry, comps


_WORD = re.compile(r"[\w.\-]+")


class _Module:
    """The compiled HLO text split by computation, to cost one computation on its own: as the
    entry of a module holding it and the computations it reaches (what it calls, fuses, loops
    over, applies), not the whole module again for each of them (a step with dropout has
    hundreds of computations and dozens of loops)."""

    def __init__(self, lines: list[str]) -> None:
        self.header: list[str] = []  # what precedes the computations (stack-frame tables)
        self.blocks: dict[str, list[str]] = {}  # name -> its lines, header line first
        cur: list[str] | None = None
        for line in lines[1:]:
            if line and not line[0].isspace() and line.rstrip().endswith("{"):
                m = _HEAD.match(line)
                if m is not None:
                    cur = self.blocks[m.group(2)] = [line[len(m.group(1) or ""):]]
                    continue
            (self.header if cur is None else cur).append(line)
        self._refs: dict[str, set[str]] = {}

    def refs(self, name: str) -> set[str]:
        """The computations ``name``'s instructions name (any word that is a computation's name:
        one too many only makes a module larger, never wrong)."""
        got = self._refs.get(name)
        if got is None:
            words = {w for line in self.blocks[name][1:] for w in _WORD.findall(line)}
            got = self._refs[name] = (words & self.blocks.keys()) - {name}
        return got

    def as_entry(self, name: str) -> str:
        """A module with ``name`` as its entry computation and what it reaches, in the
        original order (callees before callers)."""
        reach, todo = {name}, [name]
        while todo:
            for r in self.refs(todo.pop()) - reach:
                reach.add(r)
                todo.append(r)
        out = ["HloModule m", *self.header]
        for comp, block in self.blocks.items():
            if comp in reach:
                out.append(("ENTRY " if comp == name else "") + block[0])
                out.extend(block[1:])
        return "\n".join(out)


def count_flops(compiled: Any) -> Flops:
    """FLOPs of ``compiled`` (a ``jax.stages.Compiled``) with every loop counted per iteration.

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
        return Flops(raw, raw, counted=raw)
    lines = text.splitlines()
    entry, comps = _computations(lines)
    if entry is None or tools is None:
        loops = [loop.where for c in comps.values() for loop in c.loops]
        listed = "; ".join(loops[:5]) + (f"; and {len(loops) - 5} more" if len(loops) > 5 else "")
        return Flops(None, raw, reason=f"the step has while loops (scans: {listed}) and this jaxlib "
                     f"{jax.__version__} offers no way to cost them per iteration",
                     uncounted=tuple(loops))
    parse, cost = tools
    has_loop: dict[str, bool] = {}

    def loops_in(comp: str) -> bool:  # whether running ``comp`` runs a while loop
        if comp not in has_loop:
            has_loop[comp] = False  # a cycle cannot happen in HLO; this only ends the recursion
            c = comps.get(comp, _Comp())
            has_loop[comp] = bool(c.loops) or any(loops_in(k) for k in c.calls) or any(
                loops_in(b) for _, bs in c.branches for b in bs) or any(
                loops_in(r) for r, _ in c.applies)
        return has_loop[comp]

    raw_of: dict[str, float] = {entry: raw}
    module = _Module(lines)
    memo: dict[str, float] = {}
    uncounted: list[str] = []
    n = 0

    def raw_cost(comp: str) -> float:
        if comp not in raw_of:
            raw_of[comp] = float(cost(parse(module.as_entry(comp))).get("flops", 0.0))
        return raw_of[comp]

    def true_cost(comp: str) -> float:
        """``comp``'s FLOPs, each loop in it (or in what it calls) counted per iteration: XLA's
        figure, plus for each loop (trip - 1) more bodies and trip more conditions, for each call
        what the callee's loops add, for a conditional what its costliest branch's loops add (XLA
        takes the costliest branch)."""
        nonlocal n
        if comp in memo:
            return memo[comp]
        c = comps.get(comp, _Comp())
        total = raw_cost(comp)
        for loop in c.loops:
            if loop.trip is None:
                uncounted.append(loop.where)
                trip = 1
            else:
                n += 1
                trip = loop.trip
            total += trip * true_cost(loop.body) - raw_cost(loop.body)
            total += (trip + 1) * true_cost(loop.cond) - raw_cost(loop.cond)
        for callee in c.calls:
            if loops_in(callee):
                total += true_cost(callee) - raw_cost(callee)
        for where, branches in c.branches:
            if any(loops_in(b) for b in branches):
                total += max(true_cost(b) for b in branches) - max(raw_cost(b) for b in branches)
        for ref, where in c.applies:
            if loops_in(ref):
                uncounted.append(f"a loop inside {ref}, applied by {where}")
        memo[comp] = total
        return total

    try:
        flops = true_cost(entry)
    except Exception as e:  # noqa: BLE001 - parsing/costing internals: report, never guess
        first = (str(e).strip().splitlines() or [""])[0][:200]
        return Flops(None, raw, reason=f"costing a loop body failed ({type(e).__name__}: {first})")
    if uncounted:
        listed = "; ".join(uncounted[:5]) + (f"; and {len(uncounted) - 5} more"
                                             if len(uncounted) > 5 else "")
        return Flops(None, raw, n, reason=f"{len(uncounted)} while loop(s) without a trip count "
                     f"XLA knows, each counted once: {listed}", counted=flops,
                     uncounted=tuple(uncounted))
    return Flops(flops, raw, n, counted=flops)


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
