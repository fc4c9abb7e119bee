"""``remat report CONFIG``: measure a model under each plan of a config file, print and plot it."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import importlib.util
import inspect
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from ..._errors import PlanError, RematError, clip, short, sorted_list
from ..measurement._measure import MeasureEvent, Report, measure
from ..measurement._target import MeasureTarget
from ..._plan import MAX_PLAN_BYTES, Plan, read_text_file
from ..._shipped import doc_url, example_config
from ..._yaml import load_yaml
from ..targets._profiles import fmt_bytes, parse_bytes


_KEYS = frozenset({"target", "model", "batch", "plans", "baseline", "steps", "warmup", "framework",
                   "accelerator", "mesh"})
_REQUIRED = ("target", "plans")
_MODULE_NAME = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")

_MSG_LAYOUT = """\
{source}: {what}
A report config looks like

    target: model.py:measure_target   # file (relative to this config) and function,
                                      # or package.module:measure_target
    model: {{d_model: 128, n_layers: 4}}  # keyword arguments of that function
    batch: 8
    plans:                            # name -> plan file, inline {{pattern: annotation}}, or null
      none: null
      recompute: plans/recompute.yaml
      hidden: {{"layers.*": {{save: [hidden]}}}}
    accelerator: h100x8               # optional: compile for it; default local
    mesh: fsdp=8                      # optional: its devices' layout (default data parallel)

Allowed top-level keys: {keys}. Reading the report: {guide}; accelerators: {targets}."""


class ConfigError(PlanError):
    """A report config file that cannot be read."""


def _layout_error(source: str, what: str) -> ConfigError:
    return ConfigError(_MSG_LAYOUT.format(source=source, what=what, keys=sorted_list(_KEYS),
                                          guide=doc_url("choose_a_plan"),
                                          targets=doc_url("targets")))


@dataclasses.dataclass(frozen=True)
class ReportConfig:
    """A parsed report config: which function builds the model, its size, and the plans.

    Attributes:
      source: the config file.
      target_file, function: ``measure_target(plan, *, batch, **model) -> MeasureTarget``.
      module: set when the target names an importable module (``package.module:function``)
        instead of a file; the function is then imported from it by name.
      model: keyword arguments for the function (sizes).
      batch: the batch size.
      plans: ``(name, value)``: ``None``, a plan file path (relative to the config) or a mapping.
      baseline, steps, warmup: measurement settings (``None``: measure's defaults).
      framework: informational (``nnx``, ``equinox``, ``jax``).
      accelerator: what to compile for (``h100x8``, ``v5p:2x2x2``; ``None``: this machine).
      mesh: the accelerator's devices (``fsdp=8``; ``None``: data parallel over all).
      sizes: the command line's ``--size`` keys (but ``batch``), composed with ``model`` by
        :func:`compose_sizes` when the function is called.
    """

    source: Path
    target_file: Path
    function: str
    model: tuple[tuple[str, Any], ...]
    batch: int | None
    plans: tuple[tuple[str, Any], ...]
    baseline: str | None = None
    steps: int | None = None
    warmup: int | None = None
    framework: str | None = None
    module: str | None = None
    accelerator: str | None = None
    mesh: str | None = None
    sizes: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def load(cls, path: str | Path) -> ReportConfig:
        """Reads the config file ``path``, or a shipped example's, by name (``example:nnx_gpt``)."""
        p = example_config(str(path)) if str(path).startswith("example:") else Path(path)
        try:
            data, _ = load_yaml(read_text_file(p, "report config", MAX_PLAN_BYTES), str(p))
        except ConfigError:
            raise
        except PlanError as e:
            raise ConfigError(f"{e} (a report config is a YAML file such as "
                              "examples/nnx_gpt/report.yaml)") from None
        src = str(p)
        if not isinstance(data, Mapping):
            raise _layout_error(src, f"the file holds a {type(data).__name__}, not a mapping.")
        data = {str(k): v for k, v in data.items()}
        bad = set(map(str, data)) - _KEYS
        if bad:
            raise _layout_error(src, f"unknown key(s) {sorted_list(bad)}.")
        missing = [k for k in _REQUIRED if k not in data]
        if missing:
            raise _layout_error(src, f"missing key(s) {sorted_list(missing)}.")
        target = data["target"]
        if not isinstance(target, str) or target.count(":") != 1 or not all(target.split(":")):
            raise _layout_error(src, f"target must be 'FILE.py:FUNCTION' or 'package.module:FUNCTION', "
                                     f"got {short(target)}.")
        file, function = target.split(":")
        module = None
        if not file.endswith(".py"):
            if not _MODULE_NAME.match(file):
                raise _layout_error(src, f"target {target!r}: {file!r} is neither a .py file nor a "
                                         "dotted module name (package.module).")
            module = file
        model = {} if data.get("model") is None else data["model"]  # `model: []` is no mapping
        if not isinstance(model, Mapping) or not all(isinstance(k, str) for k in model):
            raise _layout_error(src, f"model must be a mapping of keyword arguments, got "
                                     f"{short(model)}.")
        plans = data["plans"]
        if not isinstance(plans, Mapping) or not plans:
            raise _layout_error(src, f"plans must be a non-empty mapping name -> plan, got "
                                     f"{short(plans)}.")
        for name, value in plans.items():
            if value is not None and not isinstance(value, str | Mapping):
                raise _layout_error(src, f"plan {short(name)} must be null, a plan file path or a "
                                         f"mapping {{pattern: annotation}}, got {short(value)}.")
        ints = {}
        for key in ("batch", "steps", "warmup"):
            v = data.get(key)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                raise _layout_error(src, f"{key} must be a non-negative integer, got {short(v)}.")
            ints[key] = v
        for key in ("accelerator", "mesh"):
            v = data.get(key)
            if v is not None and not isinstance(v, str):
                raise _layout_error(src, f"{key} must be a string (accelerator: h100x8, mesh: "
                                         f"fsdp=8), got {short(v)}.")
        baseline = data.get("baseline")
        if baseline is not None and (not isinstance(baseline, str) or baseline not in plans):
            raise _layout_error(src, f"baseline {short(baseline)} is not one of the plans "
                                     f"{sorted_list(map(str, plans))}.")
        return cls(
            source=p, target_file=(p.parent / file).resolve(), function=function, module=module,
            model=tuple(model.items()), batch=ints["batch"],
            plans=tuple((str(k), v) for k, v in plans.items()), baseline=baseline,
            steps=ints["steps"], warmup=ints["warmup"], framework=data.get("framework"),
            accelerator=data.get("accelerator"), mesh=data.get("mesh"),
        )

    def with_sizes(self, overrides: Mapping[str, Any]) -> ReportConfig:
        """The command line's sizes (``--size``): ``batch``, and model keyword arguments composed
        with the config's by :func:`compose_sizes` (a preset among them sets what it names)."""
        sizes = dict(self.sizes)
        batch = self.batch
        for k, v in overrides.items():
            if k == "batch":
                if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                    raise ConfigError(f"--size batch={short(v)}: the batch must be a positive "
                                      "integer.")
                batch = v
            else:
                sizes[k] = v
        return dataclasses.replace(self, sizes=tuple(sizes.items()), batch=batch)

    def select(self, names: Sequence[str] | None) -> ReportConfig:
        """Only the plans named (in the order given)."""
        if not names:
            return self
        have = dict(self.plans)
        unknown = [n for n in names if n not in have]
        if unknown:
            raise ConfigError(f"{self.source}: no plan(s) named {sorted_list(unknown)}; plans: "
                              f"{sorted_list(have)}. Fix: pass --plans with names from the config.")
        baseline = self.baseline if self.baseline in names else None
        return dataclasses.replace(self, plans=tuple((n, have[n]) for n in names),
                                   baseline=baseline)

    def plan_files(self) -> list[Path]:
        """The plan files the config names (relative to the config)."""
        return [self.source.parent / v for _, v in self.plans if isinstance(v, str)]

    def inputs(self) -> list[Path]:
        """Every file a run reads: the config, its target file and its plan files (which no
        output may overwrite)."""
        return [self.source, *([] if self.module else [self.target_file]), *self.plan_files()]

    def plan_objects(self) -> dict[str, Plan | None]:
        """Each plan loaded: files relative to the config, mappings as rules or full plan configs
        (errors in an inline plan name the config file and the plan)."""
        out: dict[str, Plan | None] = {}
        for name, value in self.plans:
            where = f"{self.source}: plans.{name}"
            if value is None:
                out[name] = None
            elif isinstance(value, str):
                out[name] = Plan.load(self.source.parent / value)
            elif "rules" in value and set(map(str, value)) <= {"rules", "defaults"}:
                out[name] = Plan.from_config(value, source=where)
            elif "rules" in value or "defaults" in value:
                raise ConfigError(
                    f"{where}: a full plan has the keys 'defaults' and 'rules' only, got "
                    f"{sorted_list(map(str, value))}. Fix: remove the others, or write the rules "
                    "alone as {pattern: annotation}.")
            else:
                items = list(value.items())
                out[name] = Plan.from_rules(items, sources=[where] * len(items))
        return out

    def target_function(self) -> Callable[..., Any]:
        """The config's function, imported from its module or loaded from its file."""
        if self.module is not None:
            near = [Path(self.source).resolve().parent] if self.source else []
            return import_function(self.module, self.function, source=str(self.source),
                                   search=[*near, Path.cwd()])
        return load_function(self.target_file, self.function, source=str(self.source))

    def kwargs(self, fn: Callable[..., Any] | None = None) -> dict[str, Any]:
        """The keyword arguments ``fn`` is called with: the sizes measured (:func:`compose_sizes`
        with the presets of ``fn``'s module) and ``batch``."""
        fn = self.target_function() if fn is None else fn
        presets = getattr(fn, "__globals__", {}).get("PRESETS")
        kwargs = compose_sizes(dict(self.model), dict(self.sizes), presets, str(self.source))
        if self.batch is not None:
            kwargs["batch"] = self.batch
        return kwargs

    def sizes_measured(self) -> dict[str, Any]:
        """The model keyword arguments the target is called with (the preset expanded), without
        ``batch``."""
        kwargs = self.kwargs()
        kwargs.pop("batch", None)
        return kwargs

    def builder(self) -> Callable[[Plan | None], MeasureTarget]:
        """The config's function, loaded from its file, with the model size and batch bound."""
        fn = self.target_function()
        name = f"{self.module or self.target_file}:{self.function}"
        kwargs = self.kwargs(fn)
        _check_kwargs(fn, kwargs, name, str(self.source))
        where = Path(self.target_file) if self.module is None else Path(self.module)

        def build(plan: Plan | None) -> MeasureTarget:
            try:
                return fn(plan, **kwargs)  # type: ignore[no-any-return]
            except RematError:
                raise  # the library's own message (a plan the model refuses, ...) says it all
            except Exception as e:  # the user's code: where it raised, not our traceback
                args = "".join(f", {k}={v!r}" for k, v in kwargs.items())
                said = clip(str(e), 500).rstrip(".")
                fix = (f" ({self.function}(None{args}) shows the full traceback)."
                       if " Fix: " in said else
                       f". Fix: make {self.function}(plan{args}) run on its own (call it with "
                       "plan=None for the full traceback).")
                raise ConfigError(
                    f"{self.source}: the target {name} raised while building the model for plan "
                    f"{'None (no plan)' if plan is None else 'of the config'}: "
                    f"{_where_raised(e, where)}{type(e).__name__}: {said}{fix}") from e

        return build


_MSG_PRESET_CONFLICT = """\
{source}: --size {key}={given} and --size preset={preset} disagree: the preset sets {key}={value}. \
A preset sets every size it names and the rest come from the config; one command line cannot \
give a size twice. Fix: drop --size {key}={given}, or write a config with \
`model: {{preset: {preset}}}` and give --size {key}={given} on it (a later layer wins)."""


def compose_sizes(model: Mapping[str, Any], overrides: Mapping[str, Any],
                  presets: Mapping[str, Mapping[str, Any]] | None, source: str) -> dict[str, Any]:
    """The sizes a target is called with, from the config's ``model`` and the command line's
    ``--size`` keys (``overrides``), by one rule: each layer (the config, then the command line)
    replaces what the layer below set; a ``preset`` (a key of the target module's ``PRESETS``)
    sets every size it names, as if written out in its layer, and the rest come from below; a
    size given beside the preset in the same layer that disagrees with it is refused. The preset
    is expanded (no ``preset`` key is passed) where the module has ``PRESETS``.

    >>> P = {"big": {"d_model": 4096, "n_layers": 32}}
    >>> compose_sizes({"d_model": 128, "n_layers": 4, "seq_len": 128}, {"preset": "big"}, P, "c")
    {'d_model': 4096, 'n_layers': 32, 'seq_len': 128}
    >>> compose_sizes({"preset": "big"}, {"n_layers": 2}, P, "c")
    {'d_model': 4096, 'n_layers': 2}
    """
    out: dict[str, Any] = {}
    for layer, where in ((model, "model"), (overrides, "--size")):
        layer = dict(layer)
        preset = layer.pop("preset", None)
        if preset is not None and presets is not None:
            if not isinstance(preset, str) or preset not in presets:
                raise ConfigError(
                    f"{source}: {where} preset={short(preset)} is not a preset of the target; "
                    f"presets: {sorted_list(map(str, presets))}. Fix: --size preset=NAME with one "
                    "of them, or give the sizes themselves (--size d_model=... n_layers=...).")
            named = dict(presets[preset])
            for key, value in layer.items():
                if key in named and value != named[key]:
                    if where == "model":
                        raise ConfigError(
                            f"{source}: model sets preset: {preset} and {key}: {short(value)}, but "
                            f"the preset sets {key}={short(named[key])}. A preset sets every size "
                            f"it names. Fix: remove {key} from 'model' and give --size "
                            f"{key}={short(value)} on the command line (a later layer wins).")
                    raise ConfigError(_MSG_PRESET_CONFLICT.format(
                        source=source, key=key, given=short(value), preset=preset,
                        value=short(named[key])))
            layer = {**named, **layer}
        elif preset is not None:  # a target without PRESETS reads the key itself
            layer["preset"] = preset
        out.update(layer)
    return out


def _check_kwargs(fn: Callable[..., Any], kwargs: Mapping[str, Any], name: str, source: str) -> None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # pragma: no cover - builtins
        return
    params = sig.parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    allowed = {n for n, p in params.items()
               if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)}
    bad = set(kwargs) - allowed
    if bad:
        raise ConfigError(f"{source}: {name} takes no argument(s) {sorted_list(bad)}; it takes "
                          f"{sorted_list(allowed)}. Fix: correct 'model'/'batch' or the --size keys.")
    for key, value in kwargs.items():  # `--size n_layers=two` reaches the model as a string
        default = params[key].default
        if isinstance(default, bool | int | float | str) and not _same_kind(value, default):
            raise ConfigError(
                f"{source}: {key}={short(value)} ({type(value).__name__}), but {name} has "
                f"{key}={default!r} ({type(default).__name__}) as its default. Fix: give "
                f"{key} {'an' if type(default).__name__[0] in 'aeiou' else 'a'} "
                f"{type(default).__name__} in 'model' or with --size {key}=...")


def _same_kind(value: Any, default: Any) -> bool:
    """Whether ``value`` has the kind of ``default``: bool, int (a float default also takes an
    int), float or str."""
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(default, bool)
    if isinstance(default, float):
        return isinstance(value, int | float)
    return isinstance(value, type(default))


def _load_module(file: Path) -> ModuleType:
    """Imports ``file`` by path; a file inside a package directory can use relative imports."""
    tag = hashlib.sha256(str(file).encode()).hexdigest()[:12]
    pkg_dir = file.parent
    package = None
    if (pkg_dir / "__init__.py").is_file():
        package = f"_remat_report_{tag}"
        if package not in sys.modules:
            spec = importlib.util.spec_from_file_location(
                package, pkg_dir / "__init__.py", submodule_search_locations=[str(pkg_dir)])
            assert spec is not None and spec.loader is not None
            mod = importlib.util.module_from_spec(spec)
            sys.modules[package] = mod
            spec.loader.exec_module(mod)
    name = f"{package}.{file.stem}" if package else f"_remat_report_{tag}_{file.stem}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    # Sibling modules (``from data import ...``) resolve while the file runs.
    sys.path.insert(0, str(pkg_dir))
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    finally:
        sys.path.remove(str(pkg_dir))
    return module


def load_function(file: str | Path, function: str, *, source: str = "") -> Callable[..., Any]:
    """The function ``function`` defined in the Python file ``file`` (imported by path)."""
    p = Path(file)
    loc = f"{source}: " if source else ""
    if p.suffix != ".py" or not p.is_file():
        raise ConfigError(f"{loc}target file {str(p)!r} is not an existing .py file. Fix: give "
                          "the model file relative to the config, e.g. 'model.py:measure_target'.")
    try:
        module = _load_module(p.resolve())
    except (Exception, SystemExit) as e:  # the user's file: any error while importing it
        raise ConfigError(f"{loc}importing the target file {str(p)!r} failed: {_where_raised(e, p)}"
                          f"{type(e).__name__}: {clip(str(e), 400)}. Fix: make the file import "
                          f"on its own (python {p}), e.g. install what it imports.") from None
    fn = getattr(module, function, None)
    if not callable(fn):
        have = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
                      and getattr(v, "__module__", None) == module.__name__)
        raise ConfigError(f"{loc}{p} defines no function {function!r}; its functions: "
                          f"{sorted_list(have)}. Fix: point 'target' at measure_target(plan, *, "
                          "batch, **model) -> remat_common.measurement.MeasureTarget.")
    return fn  # type: ignore[no-any-return]


def _where_raised(e: BaseException, file: Path) -> str:
    """``file.py:12: `` for the deepest frame of ``e`` in ``file`` (or in any file), else ``''``."""
    tb = e.__traceback__
    last = None
    while tb is not None:
        last = tb
        tb = tb.tb_next
    line = getattr(e, "lineno", None) if isinstance(e, SyntaxError) else None
    if line is not None:
        return f"{getattr(e, 'filename', file)}:{line}: "
    if last is not None:
        return f"{last.tb_frame.f_code.co_filename}:{last.tb_lineno}: "
    return ""


def import_function(module: str, function: str, *, source: str = "",
                    search: Sequence[Path] = ()) -> Callable[..., Any]:
    """The function ``function`` of the importable module ``module`` (``package.module``).

    Where ``module`` is not importable as it is, the folders in ``search`` (the config's folder,
    the working directory: what ``python -m`` and pytest make importable) are put first on
    ``sys.path`` and the import is tried again; they stay there, for what the module imports later.
    """
    loc = f"{source}: " if source else ""
    try:
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            dirs = [str(d) for d in search if str(d) not in sys.path]
            if not dirs or e.name is None or not module.startswith(e.name):
                raise
            sys.path[:0] = dirs
            mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        where = (f" (looked on sys.path, in the config's folder and the working directory: "
                 f"{sorted_list(str(d) for d in search)})"
                 if search and e.name is not None and module.startswith(e.name) else "")
        raise ConfigError(f"{loc}target module {module!r} cannot be imported ({e}){where}. Fix: "
                          "install the package that holds it, or give a file: 'path/to/model.py:"
                          f"{function}'.") from None
    fn = getattr(mod, function, None)
    if not callable(fn):
        raise ConfigError(f"{loc}module {module!r} has no function {function!r}. Fix: point "
                          "'target' at measure_target(plan, *, batch, **model) -> "
                          "remat_common.measurement.MeasureTarget.")
    return fn  # type: ignore[no-any-return]


def parse_size(items: Iterable[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--size {short(item)}: expected KEY=VALUE, e.g. --size d_model=32 "
                              "batch=2.")
        try:
            v, _ = load_yaml(value, f"--size {key.strip()}")
        except PlanError as e:
            raise ConfigError(f"{e}. Fix: quote the value as YAML (e.g. --size name='\"a: b\"').") \
                from None
        k = key.strip()
        if k in out and out[k] != v:  # `--size d_model=64 ... d_model=128`: which one was meant?
            raise ConfigError(f"--size {k}={short(out[k])} and --size {k}={short(v)}: one size "
                              f"given twice. Fix: give {k} once.")
        out[k] = v
    return out


def check_output(path: str, option: str, *, suffixes: Sequence[str] = (),
                 inputs: Iterable[Path] = ()) -> Path:
    """Creates the parent folders of an output path and checks it can be written, before measuring.

    The check opens the file (and removes it again when it did not exist): permission bits say
    nothing for root, nor for /proc or a read-only file system. ``suffixes``: the ones allowed;
    ``inputs``: files the run reads, which an output must not overwrite.
    """
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"{option} {path!r} is a directory. Fix: give a file name, e.g. "
                          f"{str(p / ('report.json' if option == '--json' else 'report.png'))!r}.")
    if suffixes and p.suffix.lower() not in suffixes:
        raise ConfigError(f"{option} {path!r}: unknown format {p.suffix or '(no suffix)'!r}. "
                          f"Allowed: {sorted_list(suffixes)}. Fix: name the file with one of them.")
    for q in inputs:
        if q.exists() and p.exists() and os.path.samefile(p, q):
            raise ConfigError(f"{option} {path!r} is {str(q)!r}, which this run reads: it would be "
                              "overwritten. Fix: write the output to another file.")
    parent = next((a for a in (p.parent, *p.parent.parents) if a.exists()), None)
    if parent is not None and not parent.is_dir():
        raise ConfigError(f"{option} {path!r}: {str(parent)!r} is a file, not a folder. Fix: "
                          "choose a location inside a folder.")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"{option} {path!r}: cannot create the folder {str(p.parent)!r} "
                          f"({e.strerror}). Fix: choose a writable location.") from None
    existed = p.exists()
    try:  # O_NONBLOCK: a FIFO nobody reads fails at once (ENXIO) instead of blocking here
        os.close(os.open(p, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, 0o666))
    except OSError as e:
        raise ConfigError(f"{option} {path!r} cannot be written ({e.strerror}). Fix: choose a "
                          "writable location.") from None
    if not existed:
        p.unlink(missing_ok=True)
    return p


@contextlib.contextmanager
def _writing(option: str, path: Path) -> Iterator[None]:
    """An output written after measuring: a failure (a full disk, ``/dev/full``) names the option,
    the path and the reason, and says the measurements were printed."""
    try:
        yield
    except OSError as e:
        raise ConfigError(f"{option} {str(path)!r} could not be written: {e.strerror or e}. The "
                          "measurements are printed above. Fix: free space, or give another "
                          f"path to {option}.") from None


def with_target(config: ReportConfig, accelerator: str | None, mesh: str | None) -> ReportConfig:
    """The config with ``--accelerator``/``--mesh`` in place of its own keys (checked now, before
    anything is built: an unknown name or a missing compiler fails at once). A target-config file
    the config names (``accelerator: my_gpu.txtpb``) is found next to the config, as its target
    and plans are; one given with ``--accelerator`` is relative to the working directory."""
    from ..targets._accelerators import device_count, parse_accelerator, relative_to
    from ..targets._meshes import parse_mesh
    from ..targets._compilers import quiet_libtpu

    acc = accelerator if accelerator is not None else config.accelerator
    if accelerator is None and acc is not None:  # a config's file: next to the config
        acc = relative_to(acc, Path(config.source).parent)
    m = mesh if mesh is not None else (config.mesh if accelerator is None else None)
    with quiet_libtpu():  # a TPU's topology starts libtpu, whose start-up lines read as failures
        a = parse_accelerator(acc)
        n = device_count(a) if a.platform == "tpu" else None
    if m is not None:
        parse_mesh(m, n if n is not None else device_count(a))
    if a.is_local:
        return dataclasses.replace(config, accelerator=None, mesh=m)
    return dataclasses.replace(config, accelerator=a.name, mesh=m)


def _non_negative(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"{v} is negative; give 0 or more")
    return v


class Heartbeat:
    """Progress without a bar (``--no-progress``): a line to ``console`` (``"remat tune:
    compiling save (1 of at most 7), 3 s"``) at each :meth:`update`, and the current one again
    every ``interval`` seconds while it lasts, so a long compile never looks like a hang."""

    def __init__(self, console: Any, command: str, interval: float = 30.0) -> None:
        import threading

        self.console, self.command, self.interval = console, command, interval
        self.t0 = time.monotonic()
        self.current = "starting"
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="remat-heartbeat", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _line(self) -> None:
        with self._lock:
            self.console.print(f"{self.command}: {self.current}, {time.monotonic() - self.t0:.0f} s",
                               highlight=False, markup=False)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._line()

    def update(self, current: str) -> None:
        """Says what runs now (and again every ``interval`` seconds while it does)."""
        self.current = current
        self._line()


def measure_stage(e: MeasureEvent) -> str:
    """What the measurement is doing, for the progress bar and the heartbeat."""
    return f"{e.plan}: {e.stage}" if e.plan else ("timing steps" if e.stage == "time" else e.stage)


def run_report(config: ReportConfig, *, steps: int | None = None, warmup: int | None = None,
               progress: Callable[[MeasureEvent], None] | None = None) -> Report:
    """Measures every plan of ``config`` (see :func:`remat_common.measurement.measure`). An
    exception raised in the target's own code (its loss or step, traced or run) is a
    :class:`ConfigError` naming the plan, the file and line, the error and the fix."""
    kwargs: dict[str, Any] = {}
    steps = steps if steps is not None else config.steps
    warmup = warmup if warmup is not None else config.warmup
    if steps is not None:
        kwargs["steps"] = steps
    if warmup is not None:
        kwargs["warmup"] = warmup
    at: list[MeasureEvent] = []

    def on_event(e: MeasureEvent) -> None:
        at[:] = [e]
        if progress is not None:
            progress(e)

    with users_code(config, lambda: (at[0].plan, at[0].stage if at[0].plan else measure_stage(at[0]))
                    if at else (None, "")):
        report = measure(config.builder(), config.plan_objects(), baseline=config.baseline,
                         progress=on_event, accelerator=config.accelerator, mesh=config.mesh,
                         **kwargs)
    return dataclasses.replace(report, sizes=config.kwargs())


def _library_dirs() -> tuple[str, ...]:
    """Where code that is not the user's lives: the standard library, installed packages, and
    this distribution's packages (an editable install keeps them outside site-packages)."""
    import sysconfig

    core = Path(__file__).resolve().parents[2]
    dirs = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    dirs |= {str(core), *(str(core.parent / a) for a in ("flax_remat_plugin", "equinox_remat_plugin"))}
    return tuple(str(Path(d).resolve()) + os.sep for d in dirs)


def users_frame(e: BaseException) -> str | None:
    """``file.py:12`` of the deepest frame of ``e``'s traceback in the user's code (not the
    standard library, an installed package or this distribution), or None."""
    library = _library_dirs()
    tb, found = e.__traceback__, None
    while tb is not None:
        file = tb.tb_frame.f_code.co_filename
        if not file.startswith("<") and not str(Path(file).resolve()).startswith(library):
            found = f"{file}:{tb.tb_lineno}"
        tb = tb.tb_next
    return found


def _head(e: BaseException, limit: int = 300) -> str:
    """The start of an exception's message (what it says first is what it is about), bounded.

    >>> _head(ValueError("Cannot mutate RngCount from a different trace level " + "x" * 400))[:30]
    "'Cannot mutate RngCount from a"
    """
    text = " ".join(str(e).split())
    return repr(text if len(text) <= limit else text[:limit - 3] + "...")


@contextlib.contextmanager
def users_code(config: ReportConfig, where: Callable[[], tuple[str | None, str]]) -> Iterator[None]:
    """Turns an exception raised in the target's own code while plans are measured (``where()``:
    the plan and the stage then) into a :class:`ConfigError`: the plan, the file and line, the
    error and the fix. The library's own errors, and exceptions raised outside the user's code
    (whose traceback is the useful part), pass through."""
    try:
        yield
    except Exception as e:
        line = None if isinstance(e, RematError | OSError) else users_frame(e)
        if line is None:
            raise
        plan, stage = where()
        what = (f"plan {plan!r} ({stage})" if plan else stage or
                "the model before any plan (its first build and trace, no plan)")
        raise ConfigError(
            f"{config.source}: the target's code raised while measuring {what}: {line}: "
            f"{type(e).__name__}: {_head(e)}. Fix: make the target's loss and step run "
            f"on their own: t = {config.function}(plan) (plan=None first), then t.loss_fn("
            "*t.loss_args), jax.grad(t.loss_fn)(*t.loss_args) (measuring differentiates the loss "
            "with JAX's own transforms, not your framework's) and jax.jit(t.step_fn)(*t.step_args), "
            "which show the full traceback."
        ) from e


_MSG_NO_MATPLOTLIB = """\
{what} draws its figures with matplotlib, which cannot be imported here ({error}).
Fix: pip install 'jax-remat-plan[report]' (or: pip install 'matplotlib>=3.9'), or leave --plot out:
the tables, --json and --html need no matplotlib."""


def require_matplotlib(what: str) -> None:
    """Raises :class:`ConfigError` with the install line where matplotlib cannot be imported (only
    the figures need it: checked before anything is measured)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as e:
        raise ConfigError(_MSG_NO_MATPLOTLIB.format(what=what, error=str(e)[:200])) from None


def _run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from ..report._render import plot_report, plot_timeline, print_report, timeline_path

    out = Console() if sys.stdout.isatty() else Console(width=130)
    err = Console(stderr=True)
    config = ReportConfig.load(args.config).select(args.plans).with_sizes(parse_size(args.size))
    config = with_target(config, args.accelerator, args.mesh)
    # Check the outputs (and load every plan) before measuring, which can take minutes.
    inputs = config.inputs()
    json_out = check_output(args.json, "--json", inputs=inputs) if args.json else None
    plot_out = (check_output(args.plot, "--plot", suffixes=(".png",), inputs=inputs)
                if args.plot else None)
    html_out = (check_output(args.html, "--html", suffixes=(".html",), inputs=inputs)
                if args.html else None)
    if plot_out is not None:
        require_matplotlib("remat report --plot")
    budget = parse_bytes(args.budget, "--budget") if args.budget is not None else None
    stored = load_stored(args.check) if args.check is not None else None
    config.plan_objects()
    if args.baseline is not None:
        if args.baseline not in dict(config.plans):
            raise ConfigError(f"--baseline {args.baseline!r} is not one of the plans "
                              f"{sorted_list(dict(config.plans))}.")
        config = dataclasses.replace(config, baseline=args.baseline)
    if len(config.plans) < 2 and not args.no_progress:
        report = run_report(config, steps=args.steps, warmup=args.warmup)
    elif args.no_progress:  # no bar, but a line per stage and at least every 30 s
        with Heartbeat(err, "remat report") as beat:
            report = run_report(config, steps=args.steps, warmup=args.warmup,
                                progress=lambda e: beat.update(
                                    f"{measure_stage(e)} ({e.index + 1} of {e.total})"
                                    if e.stage != "done" else "done"))
    else:
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn())
        with Progress(*columns, console=err, transient=True) as bar:
            task = bar.add_task("measuring", total=None)

            def on_event(e: MeasureEvent) -> None:
                bar.update(task, total=e.total, completed=e.index, description=measure_stage(e))

            report = run_report(config, steps=args.steps, warmup=args.warmup, progress=on_event)
    print_report(report, out)
    if budget is None and report.device_memory:  # compiled for a target: its device memory
        budget = report.device_memory
    elif budget is not None and report.device_memory and budget > report.device_memory:
        out.print(f"--budget {args.budget} is more than the device memory of "
                  f"{(report.accelerator or {}).get('description') or report.accelerator}: "
                  f"{fmt_bytes(report.device_memory)}, which XLA accepts or refuses a program "
                  f"by; fitting against that instead. Fix: a budget of "
                  f"{fmt_bytes(report.device_memory)} or less.", markup=False, highlight=False)
        budget = report.device_memory
    if budget is not None:
        for p in report.plans:
            if p.breakdown is None:
                out.print(f"will {p.name} fit? no breakdown: XLA wrote no buffer assignment",
                          markup=False, highlight=False)
                continue
            lines = p.breakdown.will_it_fit(budget).lines()
            out.print(f"will {p.name} fit? {lines[0]}", markup=False, highlight=False)
            for line in lines[1:]:
                out.print(line, markup=False, highlight=False)
    if json_out is not None:  # the JSON first: a failing plot must not lose the measurements
        with _writing("--json", json_out):
            path = report.save(json_out)
        err.print(f"wrote {path}", highlight=False)
    if html_out is not None:
        from ..report._html import write_html

        with _writing("--html", html_out):
            written = write_html(report, html_out, by=args.timeline_by)
        err.print(f"wrote {written}", highlight=False)
    if plot_out is not None:
        with _writing("--plot", plot_out):
            timeline = plot_timeline(report, timeline_path(plot_out), by=args.timeline_by)
            paths = (*plot_report(report, plot_out), timeline)
        for path in paths:
            err.print(f"wrote {path}", highlight=False)
    if stored is not None:
        from ..report._recheck import check_report

        check = check_report(stored, report, source=args.check)
        for line in check.lines():
            out.print(line, markup=False, highlight=False)
        if not check.holds:
            return 1
    if args.strict and report.problems:
        err.print(f"{len(report.problems)} verification problem(s); failing (--strict).",
                  highlight=False)
        return 1
    return 0


def load_stored(path: str) -> Report:
    """The report ``--check`` compares against, read before anything is measured."""
    try:
        return Report.load(path)
    except RematError as e:  # a report file that is not one, named by its field
        raise ConfigError(f"--check {path!r}: {e}") from None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ConfigError(f"--check {path!r}: no report could be read from it ({type(e).__name__}: "
                          f"{short(str(e))}). Fix: give a file written by remat report --json."
                          ) from None


def register(subparsers: Any) -> None:
    """Adds ``remat report`` to the ``remat`` command line."""
    p = subparsers.add_parser(
        "report", help="measure what each plan of a model costs (memory, FLOPs, time)",
        description="Compile a model's training step under each plan of CONFIG and report the "
                    "residuals kept on device and host, compiled memory and FLOPs, whether "
                    "offloads reach host in the program lowered for cuda, compile and step times.",
    )
    p.add_argument("config", help="report config (YAML): target, model, batch, plans; or a "
                                  "shipped example: example:nnx_gpt, example:eqx_gpt")
    p.add_argument("--plans", nargs="+", metavar="NAME", help="measure only these plans")
    p.add_argument("--json", metavar="OUT", help="write the report as JSON")
    p.add_argument("--plot", metavar="OUT.png",
                   help="write the trade-off figure (and OUT.layers.png, bytes per module; "
                        "OUT.timeline.png, live bytes over each plan's step by kind)")
    p.add_argument("--html", metavar="OUT.html",
                   help="write the interactive timeline (one file, opens from disk): live bytes "
                        "over each plan's step by kind, hover for the bytes, drag to zoom, the "
                        "peak's contents listed")
    p.add_argument("--timeline-by", choices=("kind", "module"), default="kind",
                   help="stack the timelines (--plot, --html) by kind (default), or with the "
                        "activations by module at layer depth (blocks.0)")
    p.add_argument("--steps", type=_non_negative, metavar="N",
                   help="timed steps per plan (0: compile only)")
    p.add_argument("--warmup", type=_non_negative, metavar="N", help="untimed steps per plan first")
    p.add_argument("--size", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                   help="override model sizes or the batch, e.g. --size n_layers=2 batch=2")
    p.add_argument("--baseline", metavar="NAME", help="plan that ratios are taken against")
    p.add_argument("--accelerator", metavar="NAME",
                   help="compile for this accelerator instead of this machine: h100x8, h200, b200, "
                        "a100-40g, a100-80g, v5p:2x2x2, v5e:2x2, a GPU target-config FILE.txtpb "
                        f"({doc_url('targets')}); nothing runs, no device is needed")
    p.add_argument("--mesh", metavar="AXIS=N,...",
                   help="lay the step out on the accelerator's devices: data=N, fsdp=N or both "
                        "(default: data parallel over all of them)")
    p.add_argument("--budget", metavar="SIZE",
                   help="device memory to fit (e.g. 16GiB; default with --accelerator: its device "
                        "memory): per plan, its peak in parameters, optimizer state, gradients, "
                        "residuals, temporaries against it, the three largest contributors and "
                        "the change that frees the most")
    p.add_argument("--check", metavar="STORED.json",
                   help="compare with a report written before (--json), on another machine or "
                        "compiler: says which compiler made each (jax, jaxlib, libtpu or the CUDA "
                        "plugin) and, per plan, whether its peak, temp and host temp still hold "
                        "(within 1%%); exit status 1 when one does not")
    p.add_argument("--strict", action="store_true",
                   help="exit with status 1 when a plan fails verification")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar: a line on stderr per stage of each plan, and every 30 s "
                        "while one runs")
    p.set_defaults(func=_run)
