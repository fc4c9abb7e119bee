"""Module calls that no plan wraps, traced in a named scope of their path for a measurement.

The adapters run every module a plan acts on through :func:`call_module`, which opens a
``jax.named_scope`` of its path: XLA keeps it in each instruction's ``op_name`` and JAX in each
equation's ``source_info``, which is how the peak breakdown and the verifier name the module a
value was made in. Every other module keeps its class and its own ``__call__`` (the adapters
promise it), so nothing of this project runs when it is called: an un-annotated model, or the
modules a plan leaves alone (the embedding, the head), would carry no module at all.

:func:`scoped_module_calls` covers them without changing any class or any computation: for the
duration of the block (a measurement tracing a step), Python's :mod:`sys.monitoring` reports the
start and the end of every ``__call__`` method, and each call of a module of a registered
framework (``Framework.is_module``) is traced in a ``jax.named_scope`` of its path. Only the
metadata of the traced program changes, never what it computes or the names it tags. Paths:

- the outermost module call of a trace is the model's root (path ``""``, its scope named
  ``<root>``): the modules inside it are placed by identity (``Framework.paths``);
- a module running inside an annotated one is placed by the core's lookup (``_framework.py``), as
  :func:`checkpoint_name` places it (inside a layer that runs as an earlier alike one, the
  paths are that layer's, as its boundary's are);
- the copy of a layer that a scan over stacked layers makes is placed by the adapter's scan
  (:func:`place_scanned_layer`) at the first layer's path (``blocks.0``), as a plan's scan body
  is, standing for the group of layers (``blocks.0-3``).

Where :mod:`sys.monitoring` has no free tool id (other tools took them all), nothing is scoped.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from types import CodeType, FrameType
from typing import Any

import jax

from ._context import effective_path, module_calls, module_calls_scope
from ._framework import Framework, frameworks, placed_module
from ._paths import ROOT_DISPLAY, join


def _locator(obj: Any) -> Framework | None:
    """The registered framework whose module ``obj`` is, if any."""
    for fw in frameworks():
        if fw.is_module(obj):
            return fw
    return None


class ModuleCalls:
    """What one :func:`scoped_module_calls` block traced.

    Attributes:
      scoped: the module paths traced in a named scope: by this record, or by the adapters'
        :func:`call_module` (:func:`module_scope`).
      groups: ``(first layer's path, label, layers, layer paths)`` of each stack whose layers
        a scan ran as copies of the first (``("blocks.0", "blocks.0-3", 4, (...))``).
    """

    def __init__(self) -> None:
        self.scoped: set[str] = set()
        self.groups: dict[str, tuple[str, str, int, tuple[str, ...]]] = {}
        self._paths: dict[int, str] = {}
        self._open: list[tuple[FrameType, Any, str | None]] = []  # (frame, named scope, path)

    def _enter(self, frame: FrameType, obj: Any, loc: Framework) -> None:
        path: str | None
        if not self._open:  # the outermost module call: the model's root
            self._paths = dict(loc.paths(obj, ""))
            path = ""
        else:
            found = placed_module()
            if found is not None:
                path = effective_path(found[0]) if found[1] else None
            else:
                path = self._paths.get(id(obj))
        inner = self._open[-1][2] if self._open else None  # the innermost module's path
        own = loc.scoped(obj)  # call_module opens its scope (or it opens none: a stack)
        scope = None
        if path == "" and not self._open:  # call_module opens no scope for the root
            scope = jax.named_scope(ROOT_DISPLAY)
        elif path and path != inner and not own:
            scope = jax.named_scope(path)
        if scope is not None:
            scope.__enter__()
            self.scoped.add(path or "")
        self._open.append((frame, scope, path if path is not None and (scope or own) else inner))

    def _exit(self, frame: FrameType) -> None:
        if self._open and self._open[-1][0] is frame:
            _, scope, _ = self._open.pop()
            if scope is not None:
                scope.__exit__(None, None, None)

    def _place(self, stack: Any, layer: Any, n: int) -> None:
        at = self._paths.get(id(stack))
        loc = _locator(layer)
        if at is None or loc is None:
            return
        first = join(at, "0")
        self._paths.update(loc.paths(layer, first))
        if n > 1:
            self.groups[first] = (first, f"{first}-{n - 1}", n,
                                  tuple(join(at, str(i)) for i in range(n)))


def place_scanned_layer(stack: Any, layer: Any, n: int) -> None:
    """Inside :func:`scoped_module_calls`, places ``layer``, the copy of one layer of ``stack``
    (``n`` stacked layers) that a scan body runs, at the stack's first layer (``blocks.0``); a
    no-op anywhere else. Adapters call it in the body of the scans they run without a plan."""
    calls = module_calls()
    if isinstance(calls, ModuleCalls):
        calls._place(stack, layer, n)


class _Monitor:
    """The :mod:`sys.monitoring` tool: held while any :func:`scoped_module_calls` block runs."""

    IDS = (4, 3)  # free by convention (0 debugger, 1 coverage, 2 profiler, 5 optimizer)

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0
        self.tool: int | None = None
        self.modules: set[CodeType] = set()  # the __call__ code objects of modules seen

    def acquire(self) -> bool:
        mon = sys.monitoring
        with self.lock:
            if self.users == 0:
                for tool in self.IDS:
                    try:
                        mon.use_tool_id(tool, "remat_common module scopes")
                    except ValueError:
                        continue
                    self.tool = tool
                    break
                else:
                    return False
                ev = mon.events
                mon.register_callback(self.tool, ev.PY_START, self.start)
                mon.register_callback(self.tool, ev.PY_RETURN, self.end)
                mon.register_callback(self.tool, ev.PY_UNWIND, self.unwind)
                mon.set_events(self.tool, ev.PY_START | ev.PY_RETURN | ev.PY_UNWIND)
            self.users += 1
            return True

    def release(self) -> None:
        mon = sys.monitoring
        with self.lock:
            self.users -= 1
            if self.users == 0 and self.tool is not None:
                mon.set_events(self.tool, 0)
                for event in (mon.events.PY_START, mon.events.PY_RETURN, mon.events.PY_UNWIND):
                    mon.register_callback(self.tool, event, None)
                mon.free_tool_id(self.tool)
                self.tool = None

    def start(self, code: CodeType, offset: int) -> Any:
        if code.co_name != "__call__" or not code.co_argcount:
            return sys.monitoring.DISABLE  # never a module call: not reported again
        calls = module_calls()
        if not isinstance(calls, ModuleCalls):
            return None  # another thread, or outside any block
        frame = sys._getframe(1)
        obj = frame.f_locals.get(code.co_varnames[0])
        loc = _locator(obj)
        if loc is None:
            return None if code in self.modules else sys.monitoring.DISABLE
        self.modules.add(code)
        calls._enter(frame, obj, loc)
        return None

    def end(self, code: CodeType, offset: int, value: Any) -> Any:
        if code.co_name != "__call__":
            return sys.monitoring.DISABLE  # never a module call (a module's may end before its
            # first start was seen: one begun before the block, in another thread)
        calls = module_calls()
        if code in self.modules and isinstance(calls, ModuleCalls):
            calls._exit(sys._getframe(1))
        return None

    def unwind(self, code: CodeType, offset: int, exc: BaseException) -> None:
        # PY_UNWIND cannot be disabled: returning DISABLE would remove the callback
        if code in self.modules:
            calls = module_calls()
            if isinstance(calls, ModuleCalls):
                calls._exit(sys._getframe(1))


_MONITOR = _Monitor()


@contextlib.contextmanager
def scoped_module_calls() -> Iterator[ModuleCalls]:
    """Inside the block, every call of a module that an adapter recognises and that runs in no
    module scope of its own is traced in a ``jax.named_scope`` of its path (see the module's
    documentation). Yields the :class:`ModuleCalls` record, complete when the block ends.

    >>> import jax, jax.numpy as jnp
    >>> with scoped_module_calls() as calls:
    ...     _ = jax.make_jaxpr(jnp.sin)(1.0)
    >>> sorted(calls.scoped)  # no adapter's module ran
    []
    """
    calls = ModuleCalls()
    held = _MONITOR.acquire()
    try:
        with module_calls_scope(calls):
            yield calls
    finally:
        while calls._open:  # left open by an exception no callback saw: close innermost first
            _, scope, _ = calls._open.pop()
            if scope is not None:
                scope.__exit__(None, None, None)
        if held:
            _MONITOR.release()
