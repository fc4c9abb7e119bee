"""Checking a report's JSON before :meth:`Report.from_json` reads it: the format version, each
field's type, the numbers (no negative byte counts, no NaN), and the derived fields a reader
sees (``device_bytes``, ``bytes_by_path``, ...) against what the report's own figures give.

One table per level (:data:`REPORT_FIELDS`, :data:`PLAN_FIELDS`): a new field is one line.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from ..._errors import RematError, clip, short, sorted_list

#: The format this version writes and reads.
FORMAT: Final = "remat-report/1"


class ReportFormatError(RematError):
    """A report JSON that this version cannot read: its field, what it holds, the fix."""


_MSG_FIX: Final = ("Fix: write the report again with `remat report CONFIG --json FILE` (or "
                   "Report.save); a report is read back only as it was written.")

Check = Callable[[Any], bool]


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _opt(check: Check) -> Check:
    return lambda v: v is None or check(v)


def _list_of(check: Check) -> Check:
    return lambda v: isinstance(v, list) and all(check(x) for x in v)


_str: Check = lambda v: isinstance(v, str)  # noqa: E731
_map: Check = lambda v: isinstance(v, Mapping)  # noqa: E731
_list: Check = lambda v: isinstance(v, list)  # noqa: E731
_count: Check = lambda v: _is_int(v) and v >= 0  # noqa: E731
_amount: Check = lambda v: _is_num(v) and math.isfinite(v) and v >= 0  # noqa: E731
_ratio: Check = lambda v: _is_num(v) and math.isfinite(v) and v > 0  # noqa: E731

#: ``field: (required, check, what it must be)`` of the report's top level.
REPORT_FIELDS: Final[dict[str, tuple[bool, Check, str]]] = {
    "format": (True, _str, f"the string {FORMAT!r}"),
    "baseline": (True, _str, "the name of one of its plans"),
    "capabilities": (True, _map, "a mapping (python, jax, backend, ...)"),
    "figures": (True, _list_of(_map), "a list of {figure, meaningful, note}"),
    "plans": (True, lambda v: _list_of(_map)(v) and bool(v), "a non-empty list of plans"),
    "accelerator": (False, _opt(_map), "null or a mapping"),
    "refused": (False, _list_of(_map), "a list of {name, plan, error, compile_s}"),
    "sizes": (False, _opt(_map), "null or a mapping of the sizes measured"),
    "compiler": (False, _opt(lambda v: _map(v) and _str(v.get("platform")) and _str(v.get("jax"))),
                 "null or a mapping {platform, name, jax, jaxlib, plugins, ...}"),
}

#: The same for each plan (``plans[i]``).
PLAN_FIELDS: Final[dict[str, tuple[bool, Check, str]]] = {
    "name": (True, _str, "a string"),
    "plan": (True, _opt(_map), "null or a plan config"),
    "boundaries": (True, _list_of(_str), "a list of module paths"),
    "residuals": (True, _list_of(_map), "a list of residuals"),
    "problems": (True, _list_of(_str), "a list of strings"),
    "notes": (True, _list_of(_str), "a list of strings"),
    "memory": (True, _map, "a mapping of compiled memory figures"),
    "flops": (True, _opt(_amount), "null or a non-negative number"),
    "flop_ratio": (True, _opt(_ratio), "null or a positive number"),
    "placement": (True, _opt(_map), "null or a mapping"),
    "timing": (True, _map, "a mapping {lower_s, compile_s, steps, warmup}"),
    "step_time_ratio": (False, _opt(_ratio), "null or a positive number"),
    "flops_counted": (False, _opt(_amount), "null or a non-negative number"),
    "flops_unknown": (False, _opt(_str), "null or a string"),
    "breakdown": (False, _opt(_map), "null or a mapping"),
    "xla_remat": (False, _opt(_str), "null or a string"),
    "shared": (False, _list_of(_list), "a list of [first layer, layers]"),
    "layout": (False, _list_of(_map), "a list of layout checks"),
    "state": (False, _opt(lambda v: _map(v) and _map(v.get("placement"))
                          and _count(v.get("host_argument_bytes"))
                          and _count(v.get("transfer_bytes"))
                          and isinstance(v.get("counted_on_device"), bool)),
              "null or a mapping {placement, state_bytes, host_state_bytes, host_argument_bytes, "
              "transfer_bytes, counted_on_device, link, link_bytes_per_s}"),
}

#: The same for ``accelerator`` (:func:`accelerator_record`), where the report has one.
ACCELERATOR_FIELDS: Final[dict[str, tuple[bool, Check, str]]] = {
    "name": (True, _str, "a string (h100x8, v5e:2x2)"),
    "platform": (True, lambda v: v in ("cuda", "tpu"), "'cuda' or 'tpu'"),
    "description": (True, _str, "a string"),
    "memory_bytes": (True, _opt(_count), "null or a non-negative integer (bytes per device)"),
    "host_link_bytes_per_s": (False, _opt(_amount), "null or a non-negative number"),
    "flops_per_s": (False, _opt(_amount), "null or a non-negative number"),
    "source": (True, _str, "a string (where the figures come from)"),
    "mesh": (False, _opt(_map), "null or a mapping {axis: devices}"),
}

#: Fields written for readers of the JSON and recomputed on load: a file whose values differ
#: was edited or corrupted, and would render figures that are not its own. (``peak_breakdown``,
#: which earlier versions wrote, repeated the breakdown's rows: it is read no more.)
DERIVED: Final = ("device_bytes", "host_bytes", "argument_bytes", "host_transfer_bytes",
                  "bytes_by_path", "per_layer")

#: Keys whose numbers are byte counts, seconds or FLOPs: never negative.
_NON_NEGATIVE = ("bytes", "_s", "flops", "peak", "nbytes", "warmup", "steps", "compile_s")


def _bad(where: str, value: Any, must: str, source: str | None) -> ReportFormatError:
    at = f"{source}: " if source else ""
    return ReportFormatError(f"Report.from_json: {at}{where} is {short(value)}, but it must be "
                             f"{must} ({FORMAT}). {_MSG_FIX}")


def _fields(data: Mapping[str, Any], table: Mapping[str, tuple[bool, Check, str]], where: str,
            source: str | None) -> None:
    for key, (required, check, must) in table.items():
        if key not in data:
            if required:
                raise ReportFormatError(
                    f"Report.from_json: {source + ': ' if source else ''}{where}{key} is missing "
                    f"({FORMAT} has {sorted_list(k for k, (r, _, _) in table.items() if r)}). "
                    f"{_MSG_FIX}")
            continue
        if not check(data[key]):
            raise _bad(f"{where}{key}", data[key], must, source)


def _numbers(value: Any, where: str, source: str | None, key: str = "") -> None:
    """No NaN or infinity anywhere; no negative count of bytes, seconds or FLOPs."""
    if isinstance(value, Mapping):
        if value.get("kind") == "compiler accounting":  # negative in files written before:
            value = {k: v for k, v in value.items() if k != "bytes"}  # read as a line now
        for k, v in value.items():
            _numbers(v, f"{where}.{k}" if where else str(k), source, str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _numbers(v, f"{where}[{i}]", source, key)
    elif _is_num(value):
        if not math.isfinite(value):
            raise _bad(where, value, "a finite number", source)
        if value < 0 and any(key.endswith(s) or key == s.strip("_") for s in _NON_NEGATIVE):
            raise _bad(where, value, "a non-negative number", source)


def _breakdown(b: Mapping[str, Any], where: str, source: str | None) -> None:
    """A breakdown's rows name known kinds, and its timelines (where written: ``--timeline-json``)
    are one series per kind, all of one length, with the peak a point of them."""
    from ..breakdown._figures import KINDS

    for key in ("rows", "host_rows", "saved"):
        for j, r in enumerate(b.get(key) or ()):
            if not isinstance(r, Mapping) or r.get("kind") not in KINDS or not _is_int(
                    r.get("bytes")):
                raise _bad(f"{where}.{key}[{j}]", r, f"a row {{kind, module, name, bytes}} "
                           f"with a kind of {sorted_list(KINDS)}", source)
    from ..breakdown._figures import UNLIVE

    taken = b.get("taken", [])
    if not (_list_of(lambda x: isinstance(x, list) and len(x) == 2 and x[0] in UNLIVE
                     and _count(x[1]))(taken)):
        raise _bad(f"{where}.taken", taken, f"a list of [kind, bytes] with a kind of "
                   f"{sorted_list(UNLIVE)}", source)
    if not _count(b.get("over", 0)):
        raise _bad(f"{where}.over", b.get("over"), "a non-negative integer (bytes)", source)
    for key in ("timeline", "host_timeline"):
        t = b.get(key)
        if t is None:
            continue
        if not isinstance(t, Mapping):
            raise _bad(f"{where}.{key}", t, "a timeline {kinds, bytes, peak, ...}", source)
        kinds, series = t.get("kinds") or [], t.get("bytes") or []
        peak: int = t["peak"] if _is_int(t.get("peak")) else -1
        if not (_list_of(lambda k: k in KINDS)(kinds) and _list_of(_list_of(_is_int))(series)
                and len(kinds) == len(series) and len({len(x) for x in series}) <= 1):
            raise _bad(f"{where}.{key}", {"kinds": kinds, "bytes": series}, "one series of "
                       f"bytes per kind of {sorted_list(KINDS)}, all of one length", source)
        n = len(series[0]) if series else 0
        if not (0 <= peak < n or n == peak == 0):
            raise _bad(f"{where}.{key}.peak", t.get("peak"), f"a point of the timeline, 0 to {n - 1}",
                       source)


def check_report_json(data: Any, source: str | None = None) -> None:
    """Raises :class:`ReportFormatError` naming the first field of ``data`` that a report of
    :data:`FORMAT` cannot hold (``source``: the file, for the message)."""
    if not isinstance(data, Mapping):
        raise _bad("the report", data, "a JSON object", source)
    fmt = data.get("format")
    if fmt != FORMAT:
        written = "has no 'format'" if "format" not in data else f"has format {short(fmt)}"
        raise ReportFormatError(
            f"Report.from_json: {source + ': ' if source else ''}the report {written}; this "
            f"version reads {FORMAT!r} only. {_MSG_FIX}")
    _fields(data, REPORT_FIELDS, "", source)
    names = []
    for i, p in enumerate(data["plans"]):
        _fields(p, PLAN_FIELDS, f"plans[{i}].", source)
        names.append(p["name"])
        for key, v in p["memory"].items():
            if key == "platform":  # the compiling platform's name
                if not _opt(_str)(v):
                    raise _bad(f"plans[{i}].memory.platform", v, "null or a string", source)
            elif not _opt(_count)(v):
                raise _bad(f"plans[{i}].memory.{key}", v, "null or a non-negative integer (bytes)",
                           source)
        if p.get("breakdown") is not None:
            _breakdown(p["breakdown"], f"plans[{i}].breakdown", source)
        for j, r in enumerate(p["residuals"]):
            if r.get("placement") not in ("device", "host"):
                raise _bad(f"plans[{i}].residuals[{j}].placement", r.get("placement"),
                           "'device' or 'host'", source)
    acc = data.get("accelerator")
    if acc is not None:  # what the renderers read: a mapping that lacked them read, then raised
        _fields(acc, ACCELERATOR_FIELDS, "accelerator.", source)  # KeyError: 'description'
        for axis, n in (acc.get("mesh") or {}).items():
            if not (_is_int(n) and n >= 1):
                raise _bad(f"accelerator.mesh.{axis}", n, "a positive integer (devices)", source)
    if len(set(names)) != len(names):
        raise _bad("plans[].name", names, "one name per plan", source)
    if data["baseline"] not in names:
        raise _bad("baseline", data["baseline"], f"one of its plans {sorted_list(names)}", source)
    _numbers({k: v for k, v in data.items() if k != "capabilities"}, "", source)


def check_derived(data: Mapping[str, Any], written: Mapping[str, Any],
                  source: str | None = None) -> None:
    """The derived fields of ``data``'s plans against ``written`` (the report read back and
    written again): a field a reader sees must say what the report's figures give."""
    for i, (given, again) in enumerate(zip(data["plans"], written["plans"])):
        for key in DERIVED:
            if key in given and _normal(given[key]) != _normal(again.get(key)):
                raise ReportFormatError(
                    f"Report.from_json: {source + ': ' if source else ''}plans[{i}].{key} is "
                    f"{short(given[key])}, which is not what the plan's own figures give (it is "
                    f"derived from them): the file was edited or corrupted. {_MSG_FIX}")


def _normal(v: Any) -> Any:
    return json.loads(json.dumps(v))


def wrap(where: str, source: str | None, fn: Callable[[], Any]) -> Any:
    """``fn()``, with a malformed field inside ``where`` raised as a :class:`ReportFormatError`."""
    try:
        return fn()
    except RematError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
        what = f"no field {e}" if isinstance(e, KeyError) else f"{type(e).__name__}: {e}"
        raise ReportFormatError(
            f"Report.from_json: {source + ': ' if source else ''}{where} cannot be read ({clip(what, 200)}). "
            f"{_MSG_FIX}") from None


__all__: Sequence[str] = ("FORMAT", "ReportFormatError", "check_derived", "check_report_json",
                          "wrap")
