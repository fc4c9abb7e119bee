"""Where the memory goes: every byte of a compiled step at its peak, by kind and module.

XLA writes, for each compiled program, its buffer assignment (allocations, the values each holds,
their sizes and offsets), the live range of every value over the program's schedule, and the HLO
instruction that made each value, whose ``op_name`` metadata carries JAX's name stack. The
adapters run every module a plan acts on in a ``jax.named_scope`` of its path
(:func:`remat_common.adapter.module_scope`), and a measurement traces every other module call in
one too (``remat_common._module_calls``), so ``op_name`` names the module
(``jit(step)/transpose(jvp(blocks.0))/.../dot_general``). :func:`dump_compile` compiles a lowered
step with those dumps on; :func:`breakdown_from_dump` reads them.

The model of memory is the one ``memory_analysis()`` counts (the project's compiled peak:
arguments + outputs + temporaries - aliases): every argument and output allocation is held for the
whole step, the temporary allocation too; at each point of the schedule some values are live in
them. The peak is the point where the most bytes are live; its rows are what is live there, by
kind, module and tagged name, plus the bytes allocated but holding no live value then (outputs not
yet written, the temporary buffer's slack), so the rows sum to the allocations' total; a
measurement then makes the peak the compiler's own accounting (:meth:`MemoryBreakdown.reconciled`:
what ``memory_analysis()`` counts beyond the rows is a ``compiler accounting`` row; what it counts
short of them is taken out of the bytes that hold no live value, and said in a line).
"""

from __future__ import annotations

import bisect
import dataclasses
import glob
import os
import re
import shutil
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from ..._errors import RematError
from ..._paths import common_path, in_subtree, kept_for, module_of
from ._figures import (KINDS, ACTIVATION_KINDS, LAYER_DEPTH, NO_MODULE, OTHER_MODULES, MAX_SERIES,
                       PeakRow, Timeline, MemoryBreakdown)


_NOTE_UNWRITTEN = ("output buffers the runtime holds for the whole step, not yet written at the "
                   "peak (their values are made later)")
_NOTE_SLACK = ("XLA's temporary buffer holds no live value in these bytes at the peak "
               "(alignment, fragmentation)")
_NOTE_NO_SCOPE = ("made outside every module: the step's code outside the model (the loss, the "
                  "optimizer) or XLA's own buffers (copies, a loop's carry)")


# -- what the step's arguments and outputs are ---------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Leaf:
    """One argument or output leaf of the compiled step: its kind, module and name."""

    kind: str
    module: str | None
    name: str | None


def _keys(path: Sequence[Any]) -> list[Any]:
    out: list[Any] = []
    for k in path:
        for attr in ("key", "idx", "name"):
            if hasattr(k, attr):
                out.append(getattr(k, attr))
                break
        else:
            out.append(str(k))
    return out


def _strip(keys: list[Any]) -> tuple[str, ...]:
    """A leaf's keys without the argument positions in front and a Variable's ``value`` behind."""
    keys = list(keys)
    while keys and isinstance(keys[0], int):
        keys.pop(0)
    if keys and keys[-1] in ("value", "raw_value"):
        keys.pop()
    return tuple(str(k) for k in keys)


def leaf_keys(path: Sequence[Any]) -> tuple[str, ...]:
    """A leaf's key path as strings, without argument positions and a Variable's ``value``."""
    return _strip(_keys(path))


def leaf_roles(loss_args: tuple[Any, ...], step_leaves: Sequence[tuple[Any, Any]],
               module_paths: Iterable[str] = ()) -> list[Leaf]:
    """The kind, module and name of each step leaf ``(key path, array)``.

    The loss's first argument holds the parameters and its other arguments the batch
    (``loss(params, *batch)``): a step leaf that is also a leaf of those is a parameter or the
    input batch. Any other is optimizer state, placed at the parameter whose path ends its own
    (``mu``/``nu`` of ``blocks.0.attn.query.kernel``).
    """
    args = tuple(loss_args)
    batch_ids = {id(x) for x in jax.tree_util.tree_leaves(args[1:])}
    param_paths = {}
    if args:
        for p, x in jax.tree_util.tree_flatten_with_path(args[0])[0]:
            param_paths[id(x)] = _strip(_keys(p))
    params = {v for v in param_paths.values() if v}
    modules = set(module_paths)
    out = []
    for path, x in step_leaves:
        keys = _strip(_keys(path))
        if id(x) in batch_ids:
            out.append(Leaf("input batch", None, ".".join(keys) or None))
        elif id(x) in param_paths:
            k = param_paths[id(x)]
            out.append(Leaf("parameter", _module(k[:-1], modules), k[-1] if k else None))
        else:
            out.append(_placed("optimizer state", keys, params, modules))
    return out


def _module(keys: tuple[str, ...], modules: set[str]) -> str:
    if not keys:
        return ""  # the root module
    dotted = ".".join(keys)
    if not modules or dotted in modules:
        return dotted
    for n in range(len(keys), 0, -1):  # the longest module path that starts the keys
        if ".".join(keys[:n]) in modules:
            return ".".join(keys[:n])
    return dotted


def _placed(kind: str, keys: tuple[str, ...], params: set[tuple[str, ...]], modules: set[str]
            ) -> Leaf:
    """A leaf placed at the parameter whose keys end its own (optimizer moments, updates)."""
    for n in range(min(len(keys), 12), 0, -1):
        tail = keys[-n:]
        if tail in params:
            extra = keys[-n - 1] if len(keys) > n else None
            name = tail[-1] + (f" ({extra})" if extra else "")
            return Leaf(kind, _module(tail[:-1], modules), name)
    return Leaf(kind, None, ".".join(keys) or None)


def output_roles(out_paths: Sequence[tuple[str, ...]], arg_leaves: Sequence[Leaf],
                 arg_keys: Sequence[tuple[str, ...]], module_paths: Iterable[str] = ()) -> list[Leaf]:
    """Each output leaf, placed at the parameter (or optimizer state) whose keys end its own."""
    params = {k for k, leaf in zip(arg_keys, arg_leaves) if leaf.kind == "parameter"}
    modules = set(module_paths)
    return [_placed("output", k, params, modules) for k in out_paths]

def _read(folder: str, suffix: str) -> str:
    files = sorted(glob.glob(os.path.join(folder, f"*after_optimizations{suffix}")))
    if not files:
        raise RematError(f"remat_common.measurement: XLA wrote no *{suffix} into {folder}.")
    with open(files[-1]) as f:
        return f.read()


# -- parsing -----------------------------------------------------------------------------------

_ALLOC = re.compile(r"^allocation (\d+): size (\d+)(.*):$")
_VALUE = re.compile(r"^ value: <(\d+) ([^ {>]+)(\{[\d,]*\})?( \(phi\))? @\d+> "
                    r"\(size=(\d+),offset=(\d+)\): (.*)$")
_SHAPE = re.compile(r"^(\w+)\[([\d,]*)\]")
_OPNAME = re.compile(r'op_name="([^"]*)"')
_RANGE = re.compile(r"^    (\S+?)(\{[\d,]*\}):(\d+)-(\d+)$")
_SEQ = re.compile(r"^    (\d+):(\S+)$")
_POS_OUT = re.compile(r"^  (\S+) \{(\d+)\}$")


@dataclasses.dataclass
class _Value:
    id: int
    name: str          # defining instruction
    index: str         # shape index, "{}" for the whole
    phi: bool
    size: int
    offset: int
    shape: str
    alloc: int
    start: int = -1
    end: int = -1
    op_name: str = ""
    output: int | None = None
    uses: tuple[str, ...] = ()
    frame: int = 0
    copy_of: str = ""


@dataclasses.dataclass
class _Alloc:
    index: int
    size: int
    parameter: int | None
    output: bool
    temp: bool
    color: int
    values: list[_Value]


def _parse_allocations(text: str) -> list[_Alloc]:
    allocs: list[_Alloc] = []
    for line in text.splitlines():
        m = _ALLOC.match(line)
        if m:
            attrs = m.group(3)
            p = re.search(r"parameter (\d+)", attrs)
            c = re.search(r"color (\d+)", attrs)
            allocs.append(_Alloc(int(m.group(1)), int(m.group(2)), int(p.group(1)) if p else None,
                                 "live-out" in attrs, "preallocated-temp" in attrs,
                                 int(c.group(1)) if c else 0, []))
            continue
        v = _VALUE.match(line)
        if v and allocs:
            allocs[-1].values.append(_Value(
                int(v.group(1)), v.group(2), v.group(3) or "{}", bool(v.group(4)),
                int(v.group(5)), int(v.group(6)), v.group(7), allocs[-1].index))
    return allocs


def _parse_values(text: str, root: str | None
                  ) -> dict[int, tuple[str, int | None, tuple[str, ...], str, int, str]]:
    """``value id -> (op_name of its instruction, ROOT tuple index it is output at, the
    instructions that use it, its instruction's name, its stack frame id (0: none), the operand
    it copies when the instruction is a copy)``."""
    out: dict[int, tuple[str, int | None, tuple[str, ...], str, int, str]] = {}
    vid: int | None = None
    output: int | None = None
    uses: list[str] = []
    section = ""
    for line in text.splitlines():
        if line.startswith("<"):
            vid, output, uses, section = int(line[1:line.index(" ")]), None, [], ""
        elif vid is None:
            continue
        elif line.startswith(" from instruction:"):
            m = _OPNAME.search(line)
            name = re.match(r" from instruction: %(\S+) =", line)
            frame = re.search(r"stack_frame_id=(\d+)", line)
            copy = re.search(r" copy(?:-start|-done)?\(%([\w.\-]+)\)", line)
            out[vid] = (m.group(1) if m else "", output, tuple(uses), name.group(1) if name else "",
                        int(frame.group(1)) if frame else 0, copy.group(1) if copy else "")
        elif line in (" positions:", " uses:"):
            section = line.strip()
        elif section == "uses:" and line.startswith("  ") and ", operand" in line:
            uses.append(line.strip().split(",")[0])
        elif section == "positions:" and root is not None:
            p = _POS_OUT.match(line)
            if p and p.group(1) == root:
                output = int(p.group(2))
    return out


def _parse_live_ranges(text: str) -> tuple[list[str], dict[str, tuple[int, int]]]:
    seq: list[str] = []
    ranges: dict[str, tuple[int, int]] = {}
    for line in text.splitlines():
        if line.startswith("  Live ranges at"):
            break
        m = _RANGE.match(line)
        if m:
            ranges[m.group(1) + m.group(2)] = (int(m.group(3)), int(m.group(4)))
            continue
        s = _SEQ.match(line)
        if s:
            seq.append(s.group(2))
    return seq, ranges


#: Source files of libraries, not the model: a value's source is the innermost frame outside them.
_LIBRARY = re.compile(r"(site-packages|dist-packages)/|/(jax|jaxlib|flax|equinox|optax|remat_common)/"
                      r"|/common/_|/(flax|equinox)_remat_plugin/")


class _SourceFrames:
    """The stack frames of the HLO text (``FileNames`` ... ``StackFrames``): the model code an
    instruction came from (``Block.__call__ (model.py:103)``)."""

    def __init__(self, hlo: str) -> None:
        self.files: dict[int, str] = {}
        self.functions: dict[int, str] = {}
        self.locations: dict[int, tuple[int, int, int]] = {}
        self.frames: dict[int, tuple[int, int]] = {}
        section = ""
        for line in hlo.splitlines():
            if line in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
                section = line
                continue
            if not line.strip():
                section = ""
                continue
            if not section:
                continue
            head, _, rest = line.partition(" ")
            if not head.isdigit():
                continue
            k = int(head)
            if section == "FileNames":
                self.files[k] = rest.strip().strip('"')
            elif section == "FunctionNames":
                self.functions[k] = rest.strip().strip('"')
            elif section == "FileLocations":
                f = re.search(r"file_name_id=(\d+) function_name_id=(\d+) line=(\d+)", rest)
                if f:
                    self.locations[k] = (int(f.group(1)), int(f.group(2)), int(f.group(3)))
            else:
                f = re.search(r"file_location_id=(\d+) parent_frame_id=(\d+)", rest)
                if f:  # the parent is printed one above its id; 1 (0 + 1) is no parent
                    self.frames[k] = (int(f.group(1)), int(f.group(2)) - 1)

    def user_frame(self, frame: int) -> str | None:
        """``function (file:line)`` of the innermost frame outside the libraries, else None."""
        seen = 0
        while frame and frame in self.frames and seen < 200:
            loc, frame_parent = self.frames[frame]
            if loc in self.locations:
                file_id, fn_id, line = self.locations[loc]
                path = self.files.get(file_id, "")
                if path and not _LIBRARY.search(path):
                    return f"{self.functions.get(fn_id, '?')} ({os.path.basename(path)}:{line})"
            frame, seen = frame_parent, seen + 1
        return None


def _loop_modules(hlo: str, modules: frozenset[str] | None) -> dict[str, str]:
    """``instruction -> module`` for each while loop and the instructions of its body: the
    common path of the modules its body's operations carry (else the most frequent). What a scan
    over layers keeps, and what its body makes (the carry, a layer's slice of the stacked
    residuals), is the layer's, though JAX's plumbing around the body names no module."""
    bodies: dict[str, list[str]] = {}
    names: dict[str, list[str]] = {}  # computation -> its instructions
    loops: dict[str, str] = {}
    current: list[str] | None = None
    here: list[str] = []
    for line in hlo.splitlines():
        if line.startswith(("%", "ENTRY %")) and line.rstrip().endswith("{"):
            comp = line.removeprefix("ENTRY ")[1:].split(" ", 1)[0]
            current = bodies.setdefault(comp, [])
            here = names.setdefault(comp, [])
        elif line.startswith("}"):
            current = None
        elif current is not None:
            m = _OPNAME.search(line)
            if m:
                current.append(m.group(1))
            i = re.match(r"\s*(?:ROOT )?%([\w.\-]+) = ", line)
            if i:
                here.append(i.group(1))
            w = re.match(r"\s*(?:ROOT )?%([\w.\-]+) = .* while\(.*body=%([\w.\-]+)", line)
            if w:
                loops[w.group(1)] = w.group(2)
    out: dict[str, str] = {}
    found_for: dict[str, str] = {}
    for loop, body in loops.items():
        counts: dict[str, int] = defaultdict(int)
        for op in bodies.get(body, ()):
            found = module_of(op, modules)
            if found:  # the root's own plumbing around the body says nothing of the loop
                counts[found] += 1
        if counts:  # the modules' common path (a layer's, for a scan over layers)
            parts = [m.split(".") for m in counts]
            common = []
            for segs in zip(*parts):
                if len(set(segs)) != 1:
                    break
                common.append(segs[0])
            found_for[loop] = (".".join(common) if common
                               else max(counts, key=lambda k: (counts[k], k)))
            out.update((name, found_for[loop]) for name in names.get(body, ()))
    out.update(found_for)  # a loop inside a body: its own module, not its enclosing loop's
    return out


_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = .*? [a-z][\w\-]*\(%([\w.\-]+)")


def _instructions(hlo: str) -> dict[str, tuple[str, str]]:
    """``instruction -> (op_name, its first operand)`` for every instruction of the program."""
    out: dict[str, tuple[str, str]] = {}
    for line in hlo.splitlines():
        m = _INSTRUCTION.match(line)
        if m:
            op = _OPNAME.search(line)
            out[m.group(1)] = (op.group(1) if op else "", m.group(2))
    return out


def _root_tuple(hlo: str) -> str | None:
    entry = hlo.find("\nENTRY ")
    if entry < 0:
        return None
    m = re.search(r"^\s*ROOT %(\S+) = \(", hlo[entry:], re.M)
    return m.group(1) if m else None


# -- attribution -------------------------------------------------------------------------------

def _shape_key(shape: str) -> str:
    m = _SHAPE.match(shape)
    return f"{m.group(1)}[{m.group(2)}]" if m else shape


def _take_tag(left: dict[str, list[tuple[str, str]]], module: str, key: str, *,
              keep: bool = False, devices: int = 1) -> tuple[str, str] | None:
    """Removes and returns the first ``(module, name)`` tag of ``key`` whose module is
    ``module`` or inside it (a tag made in a submodule that opens no scope of its own), else
    around it (the output of a submodule, ``layers.2.up``, tagged by its caller); on ``devices``
    devices, else one of k times its elements, k a divisor of ``devices`` (the traced value of
    which each device holds a shard). ``keep``: leave it for another value (an offloaded
    residual's host copy and its copy back to device hold the same tagged value)."""
    dtype, _, count = key.partition(":")
    keys = [key]
    if devices > 1 and count.isdigit():
        keys += [f"{dtype}:{int(count) * k}" for k in range(2, devices + 1) if devices % k == 0]
    for near in (lambda m: m == module or m.startswith(module + "."),  # its own, or inside it
                 lambda m: in_subtree(module, m)):  # or around it (a value made in a submodule)
        for k in keys:
            cands = left.get(k, [])
            for i, (m, n) in enumerate(cands):
                if near(m):
                    return cands[i] if keep else cands.pop(i)
    return None


def _elements_key(shape: str) -> str:
    """``f32:65536``: dtype and element count (XLA reshapes values: [8,64,256] is [512,256])."""
    m = _SHAPE.match(shape)
    if not m:
        return shape
    return f"{m.group(1)}:{int(np.prod([int(d) for d in m.group(2).split(',') if d]))}"


def _union(intervals: list[tuple[int, int, Any]]) -> list[tuple[int, Any]]:
    """Each interval's bytes not covered by an earlier one: ``[(bytes, payload)]``."""
    covered: list[tuple[int, int]] = []  # disjoint, sorted
    out = []
    for lo, hi, payload in intervals:
        new, cur = 0, lo
        i = bisect.bisect_left(covered, (lo, lo))
        if i and covered[i - 1][1] > lo:
            i -= 1
        while cur < hi:
            if i < len(covered) and covered[i][0] <= cur:
                cur = max(cur, covered[i][1])
                i += 1
                continue
            nxt = covered[i][0] if i < len(covered) else hi
            new += min(nxt, hi) - cur
            cur = min(nxt, hi)
        if new:
            out.append((new, payload))
        _cover(covered, lo, hi)
    return out


def _cover(covered: list[tuple[int, int]], lo: int, hi: int) -> None:
    """Adds ``[lo, hi)`` to ``covered`` (disjoint, sorted, touching intervals merged), merging
    it with the neighbours it overlaps or touches only (not the whole list again: a segment of
    a large step holds thousands of live values)."""
    i = bisect.bisect_left(covered, (lo, lo))
    if i and covered[i - 1][1] >= lo:
        i -= 1
        lo, hi = covered[i][0], max(hi, covered[i][1])
    j = i
    while j < len(covered) and covered[j][0] <= hi:
        hi = max(hi, covered[j][1])
        j += 1
    covered[i:j] = [(lo, hi)]


def _merge(iv: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for lo, hi in iv:
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


@dataclasses.dataclass(frozen=True)
class StepFacts:
    """What the breakdown needs to know about the step beyond XLA's dumps."""

    args: tuple[Leaf, ...]
    outputs: tuple[Leaf, ...]
    modules: frozenset[str] | None = None
    #: ``(module, "dtype:elements") -> [tag names]`` of the residuals the verifier saw.
    tags: Mapping[tuple[str, str], tuple[str, ...]] = dataclasses.field(default_factory=dict)
    #: The devices the step is laid out on (each holds a shard of a batch-sized value).
    devices: int = 1


def breakdown_from_dump(folder: str, facts: StepFacts, *, compiler: str = "cpu") -> MemoryBreakdown:
    """Reads XLA's dumps in ``folder`` (:func:`dump_compile`) into a :class:`MemoryBreakdown`."""
    hlo = _read(folder, ".txt")
    allocs = _parse_allocations(_read(folder, "-buffer-assignment.txt"))
    info = _parse_values(_read(folder, "-buffer-assignment-values.txt"), _root_tuple(hlo))
    seq, ranges = _parse_live_ranges(_read(folder, "-live-range.txt"))
    n = max(len(seq), 1)
    op_of = {name: op for op, _, _, name, _, _ in info.values()}
    sources = _SourceFrames(hlo)
    for a in allocs:
        for v in a.values:
            v.op_name, v.output, v.uses, _, v.frame, v.copy_of = info.get(
                v.id, ("", None, (), "", 0, ""))
            v.start, v.end = ranges.get(v.name + v.index, (0, n))
    # the backward pass: from where 95% of the operations that came from a transpose run, to
    # the last of them (XLA schedules a few early, where their inputs are ready)
    backward = [i for i, name in enumerate(seq) if "transpose(" in op_of.get(name, "")]
    bw = (backward[len(backward) // 20], backward[-1]) if backward else None
    grad_shapes = {_shape_key(v.shape) for a in allocs if a.parameter is not None
                   and a.parameter < len(facts.args) and facts.args[a.parameter].kind == "parameter"
                   for v in a.values}
    tag_left: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for (m, key), names in facts.tags.items():
        tag_left[key].extend((m, n) for n in names)
    tag_all = {k: list(v) for k, v in tag_left.items()}  # what host copies are named from
    label_cache: dict[int, tuple[str, str | None, str | None, str | None]] = {}

    loop_module = _loop_modules(hlo, facts.modules)
    instructions = _instructions(hlo)
    # a donated argument's buffer (a parameter that is also live-out) holds the argument, then
    # the step's update of it: only the argument's own value is the argument
    params = dict(re.findall(r"^\s*%(\S+) = \S+ parameter\((\d+)\)", hlo, re.M))
    arg_of = {v.name: a.parameter for a in allocs if a.parameter is not None for v in a.values
              if not a.output or v.name in params}
    whole = {v.name: v for a in allocs for v in a.values if v.index == "{}" and not v.phi}
    by_name: dict[str, list[_Value]] = defaultdict(list)
    for a in allocs:
        for v in a.values:
            by_name[v.name].append(v)

    def module_at(v: _Value) -> str | None:
        return instruction_module(v.name, v.op_name)

    def instruction_module(name: str, op_name: str) -> str | None:
        # a loop's values are its body's (a scan over layers: the layer's), unless made deeper
        found, loop = module_of(op_name, facts.modules), loop_module.get(name)
        return loop if loop is not None and (found is None or in_subtree(loop, found)) else found

    def readers(v: _Value) -> set[str | None]:
        """The modules of the backward pass's instructions that read ``v``."""
        return {instruction_module(u, op_of[u]) for u in v.uses if "transpose(" in op_of.get(u, "")}

    def label(v: _Value, host: bool, depth: int = 0) -> tuple[str, str | None, str | None, str | None]:
        if v.id in label_cache:
            return label_cache[v.id]
        if v.copy_of and depth < 20 and not host:  # XLA's copy of a value: what it copies
            arg = arg_of.get(v.copy_of)
            if arg is not None and arg < len(facts.args):
                leaf = facts.args[arg]
                label_cache[v.id] = (leaf.kind, leaf.module, f"{leaf.name or ''} (copy)".strip(),
                                     "XLA's copy of the argument (a loop's carry, or the value kept while its donated buffer takes the update)")
                return label_cache[v.id]
            src = whole.get(v.copy_of)
            if src is not None:
                label_cache[v.id] = label(src, host, depth + 1)
                return label_cache[v.id]
        module = module_at(v)
        name = None
        to_backward = any("transpose(" in op_of.get(u, "") for u in v.uses)
        if host and "transpose(" not in v.op_name:
            # host memory holds what a plan offloads (XLA's copies to host carry no op_name:
            # their module is the value they copy's)
            copied, hops = v.copy_of, 0
            while module is None and copied and hops < 8:  # copy-done <- copy-start <- bitcast <- value
                op, operand = instructions.get(copied, ("", ""))
                module = instruction_module(copied, op)
                copied, hops = operand, hops + 1
            kind = "offloaded residual"
            tag = (_take_tag(tag_all, module, _elements_key(v.shape), keep=True,
                             devices=facts.devices) if module else None)
            if tag is not None:
                module, name = tag
        elif "transpose(" in v.op_name:
            kind = "gradient" if _shape_key(v.shape) in grad_shapes else "temporary (backward)"
        elif to_backward and not v.op_name:
            kind = "temporary (backward)"  # made by XLA (zeros, a broadcast) for the backward pass
        elif to_backward:
            kind = "offloaded residual" if host else "saved residual"
            tag = (_take_tag(tag_left, module, _elements_key(v.shape), devices=facts.devices)
                   if module else None)
            if tag is not None:  # the tag's module: the value's own, or one inside it
                module, name = tag
            else:  # a layer's input, made before it: kept for the layer whose backward reads it
                module = kept_for(module, readers(v))
        elif bw is not None and v.start > bw[1]:
            kind = "temporary (optimizer)"
        else:
            kind = "temporary (forward)"
        if module is None:  # made by XLA (a loop's zeros, a copy): the module of what reads it
            module = common_path(m for u in v.uses if (m := instruction_module(u, op_of.get(u, ""))))
        note = None
        if module is None:
            where = sources.user_frame(v.frame)
            note = f"{_NOTE_NO_SCOPE}; made in {where}" if where else _NOTE_NO_SCOPE
        label_cache[v.id] = (kind, module, name, note)
        return label_cache[v.id]

    device = [a for a in allocs if a.color != 5 and (a.parameter is not None or a.output or a.temp)]
    host = [a for a in allocs if a.color == 5 and (a.parameter is not None or a.output or a.temp)]
    rows, timeline = _space(device, facts, label, n, bw, host=False)
    host_rows, host_timeline = _space(host, facts, label, n, bw, host=True) if host else ((), None)
    saved = (_saved(device, label, host=False, arguments=params)
             + _saved(host, label, host=True, arguments=params))
    return MemoryBreakdown(rows, timeline, host_rows, host_timeline, compiler, saved)


def _saved(allocs: list[_Alloc], label: Any, *, host: bool,
           arguments: Mapping[str, Any] | None = None) -> tuple[PeakRow, ...]:
    """The residuals among the values of ``allocs``, each buffer counted once (values that
    overlap another in both bytes and live range share its storage); a donated argument's buffer
    too, where XLA keeps a residual once the argument is read for the last time."""
    rows: dict[Any, int] = defaultdict(int)
    for a in allocs:
        if a.parameter is not None and not a.output:
            continue
        kept: list[_Value] = []
        for v in sorted(a.values, key=lambda v: (v.phi, v.start, v.id)):
            if v.name in (arguments or {}):  # the argument itself (``arguments``: their names)
                continue
            kind, module, name, note = label(v, host)
            if kind not in ("saved residual", "offloaded residual"):
                continue
            lo, hi = v.offset, v.offset + v.size
            covered = _merge(sorted((max(lo, k.offset), min(hi, k.offset + k.size)) for k in kept
                                    if k.offset < hi and lo < k.offset + k.size
                                    and k.start <= v.end and v.start <= k.end))
            new = v.size - sum(h - l for l, h in covered)
            kept.append(v)
            if new > 0:
                rows[(kind, module, name, note)] += new
    return tuple(PeakRow(k, m, n, b, note) for (k, m, n, note), b in
                 sorted(rows.items(), key=lambda kv: -kv[1]))


def _segments(a: _Alloc) -> Iterable[tuple[int, int, list[tuple[int, _Value]]]]:
    """``(lo, hi, [(bytes, value)])``: the values live in ``a`` over schedule points ``[lo, hi)``
    (a value is live from its definition to its last use, both included), each with the bytes
    no earlier one covers: values that share a buffer (a loop's carry, its body's parameter)
    count once, the value that made the bytes first."""
    pts = sorted({v.start for v in a.values} | {v.end + 1 for v in a.values})
    starts = sorted(a.values, key=lambda v: v.start)
    active: list[_Value] = []
    k = 0
    for lo, hi in zip(pts, pts[1:]):
        active = [v for v in active if v.end + 1 > lo]
        while k < len(starts) and starts[k].start <= lo:
            if starts[k].end + 1 > lo:
                active.append(starts[k])
            k += 1
        if active:
            live = sorted(active, key=lambda v: (v.phi, v.start, v.id))
            yield lo, hi, _union([(v.offset, v.offset + v.size, v) for v in live])


def _arg_key(facts: StepFacts, parameter: int) -> tuple[str, str | None, str | None, str | None]:
    leaf = facts.args[parameter] if parameter < len(facts.args) else None
    return ((leaf.kind, leaf.module, leaf.name, None) if leaf is not None
            else ("other argument", None, None, "an argument the step does not describe"))


def _space(allocs: list[_Alloc], facts: StepFacts, label: Any, n: int,
           bw: tuple[int, int] | None, *, host: bool) -> tuple[tuple[PeakRow, ...], Timeline]:
    """The peak rows and timeline of one memory space.

    Every allocation is held for the whole step. The timeline stacks, at each schedule point,
    the arguments, the values live in the output and temporary allocations by kind, and the
    output buffers' bytes not yet written; the peak is its largest point. The peak's rows add the
    temporary buffer's slack there, so they sum to the allocations' total. A donated argument's
    buffer counts as the argument for the whole step: the state a loop donates is held whole
    between steps, and the update the step writes into it is that state's next value.
    """
    Key = tuple[str, "str | None", "str | None", "str | None"]
    fixed: dict[Any, int] = defaultdict(int)
    for a in allocs:  # arguments: held, and holding their value, for the whole step
        if a.parameter is not None:
            fixed[_arg_key(facts, a.parameter)] += a.size

    def key_of(v: _Value) -> Any:
        if v.output is not None and v.output < len(facts.outputs):
            o = facts.outputs[v.output]
            return ("output", o.module, o.name, None)
        return label(v, host)

    kinds_t: dict[str, np.ndarray] = defaultdict(lambda: np.zeros(n, dtype=np.int64))
    modules_t: dict[str, np.ndarray] = defaultdict(lambda: np.zeros(n, dtype=np.int64))
    for (kind, *_), b in fixed.items():
        kinds_t[kind] += b
    held = [a for a in allocs if a.parameter is None]
    for a in held:
        if a.output and not a.temp:
            kinds_t["unwritten output"] += a.size
        for lo, hi, parts in _segments(a):
            lo, hi = min(lo, n), min(hi, n)
            for b, v in parts:
                kind, module, *_ = key_of(v)
                kinds_t[kind][lo:hi] += b
                if kind in ACTIVATION_KINDS:
                    modules_t[_series(module)][lo:hi] += b
                if a.output and not a.temp:
                    kinds_t["unwritten output"][lo:hi] -= b
    order = tuple(k for k in KINDS if k in kinds_t and kinds_t[k].any())
    total = sum((kinds_t[k] for k in order), np.zeros(n, dtype=np.int64))
    peak = int(np.argmax(total)) if n else 0
    rows: dict[Any, int] = defaultdict(int, fixed)
    for a in held:
        used = 0
        for lo, hi, parts in _segments(a):
            if lo <= peak < hi:
                for b, v in parts:
                    rows[key_of(v)] += b
                    used += b
        if a.size - used:
            key: tuple[str, str | None, str | None, str | None]
            if a.output and not a.temp:  # placed at the output leaf the buffer will hold
                o = next((facts.outputs[v.output] for v in a.values if v.output is not None
                          and v.output < len(facts.outputs)), None)
                key = ("unwritten output", o.module if o else None, o.name if o else None,
                       _NOTE_UNWRITTEN)
            else:
                key = ("allocator slack", None, None, _NOTE_SLACK)
            rows[key] += a.size - used
    modules, module_bytes = _module_series(modules_t)
    timeline = Timeline(order, tuple(tuple(int(x) for x in kinds_t[k]) for k in order), bw, peak,
                        modules, module_bytes)
    out = tuple(PeakRow(k, m, nm, b, note) for (k, m, nm, note), b in sorted(
        rows.items(), key=lambda kv: (KINDS.index(kv[0][0]) if kv[0][0] in KINDS else 99, -kv[1]))
        if b)
    return out, timeline

def _series(module: str | None) -> str:
    """The timeline series a module's activations go to: its path at layer depth."""
    return NO_MODULE if module is None else ".".join(module.split(".")[:LAYER_DEPTH])


def _module_series(series: Mapping[str, np.ndarray]
                   ) -> tuple[tuple[str, ...], tuple[tuple[int, ...], ...]]:
    """The :data:`MAX_SERIES` largest series (by their largest point), the rest summed into
    :data:`OTHER_MODULES`, largest first."""
    ranked = sorted(((m, b) for m, b in series.items() if b.any()),
                    key=lambda mb: (-int(mb[1].max()), mb[0]))
    kept = ranked[:MAX_SERIES]
    if len(ranked) > MAX_SERIES:
        kept.append((OTHER_MODULES, sum((b for _, b in ranked[MAX_SERIES:]),
                                        np.zeros_like(ranked[0][1]))))
    return (tuple(m for m, _ in kept), tuple(tuple(int(x) for x in b) for _, b in kept))


def step_facts(loss_args: tuple[Any, ...], arg_leaves: Sequence[tuple[Any, Any]],
               out_paths: Sequence[Any], residuals: Iterable[Any] = (),
               module_paths: Iterable[str] | None = None, devices: int = 1) -> StepFacts:
    """What :func:`breakdown_from_dump` needs about a step: its inputs' and outputs' kinds and
    modules (:func:`leaf_roles`), the model's module paths where known, the tags of the
    residuals the verifier saw (``(module, shape) -> names``), which name saved values, and the
    devices it is laid out on."""
    paths = tuple(module_paths) if module_paths is not None else ()
    args = leaf_roles(loss_args, arg_leaves, paths)
    keys = [_strip(_keys(p)) for p, _ in arg_leaves]
    outs = output_roles([_strip(_keys(p)) for p in out_paths], args, keys, paths)
    tags: dict[tuple[str, str], list[str]] = defaultdict(list)
    for r in residuals:
        if r.name and r.kind != "argument":
            module = r.path or r.module or ""
            leaf = r.name.rpartition("/")[2]
            n = int(np.prod(r.shape)) if r.shape else 1  # a scan's: all its layers, stacked
            tags[(module, f"{_dtype(r.dtype)}:{n}")].append(leaf)
    return StepFacts(tuple(args), tuple(outs),
                     frozenset(p for p in paths if p) if module_paths is not None else None,
                     {k: tuple(v) for k, v in tags.items()}, devices)


_DTYPES = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64",
           "int32": "s32", "int64": "s64", "int8": "s8", "uint8": "u8", "uint32": "u32",
           "bool": "pred", "int16": "s16", "uint16": "u16", "float8_e4m3fn": "f8e4m3fn"}


def _dtype(name: str) -> str:
    return _DTYPES.get(name, name)


def breakdown_of(folder: str | None, facts: StepFacts, *, compiler: str) -> MemoryBreakdown | None:
    """The breakdown of the program dumped into ``folder`` (removed afterwards); ``None`` when
    there is no dump."""
    if folder is None:
        return None
    try:
        return breakdown_from_dump(folder, facts, compiler=compiler)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
