"""A ``remat report`` config file: its keys checked (:class:`ReportConfig`), the model's function
loaded from a file or module (:func:`load_function`), sizes composed from presets and
``--size`` (:func:`compose_sizes`, :func:`parse_size`), output paths checked before anything
is measured (:func:`check_output`)."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.util
import inspect
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from ..._errors import PlanError, RematError, clip, short, sorted_list
from ..measurement._target import MeasureTarget
from ..._plan import MAX_PLAN_BYTES, Plan, read_text_file
from ..._shipped import doc_url, example_config
from ..._yaml import load_yaml


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
        if (self.accelerator is not None and "abstract" not in kwargs
                and "abstract" in _parameters(fn)):
            # compiled for another machine, never run here: the model from shapes only (built
            # whole, an 8-layer 2048-wide LLM and its AdamW state took 22 GiB of host memory)
            kwargs["abstract"] = True
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


def _parameters(fn: Callable[..., Any]) -> Mapping[str, inspect.Parameter]:
    try:
        return inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin or a callable without a signature
        return {}


def _same_kind(value: Any, default: Any) -> bool:
    """Whether ``value`` has the kind of ``default``: bool, int (a float default also takes an
    int), float or str."""
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(default, bool)
    if isinstance(default, float):
        return isinstance(value, int | float)
    return isinstance(value, type(default))


def _load_module(file: Path) -> ModuleType:
    """Imports ``file`` by path; a file inside a package directory can use relative imports.

    A file in a chain of packages (``examples/llms/nnx_llms.py``, each folder with an
    ``__init__.py``) is imported by its dotted name from the folder above the chain, as pytest's
    rootdir import does, so its absolute imports of its own project (``from examples.third_party
    import ...``) resolve wherever ``remat`` runs from; unless a package of that name is already
    imported from elsewhere."""
    root, parts = file.parent, [file.stem]
    while (root / "__init__.py").is_file() and root.parent != root:
        parts.insert(0, root.name)
        root = root.parent
    top = sys.modules.get(parts[0]) if len(parts) > 1 else None
    if len(parts) > 1 and parts[0].isidentifier() and (
            top is None or any(Path(p).resolve() == root / parts[0]
                               for p in getattr(top, "__path__", ()))):
        sys.path[:0] = [str(file.parent), str(root)]  # siblings (``from data import``) resolve too
        try:
            return importlib.import_module(".".join(parts))
        finally:
            sys.path.remove(str(root))
            sys.path.remove(str(file.parent))
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
                 inputs: Iterable[Path] = (), example: str | None = None) -> Path:
    """Creates the parent folders of an output path and checks it can be written, before measuring.

    The check opens the file (and removes it again when it did not exist): permission bits say
    nothing for root, nor for /proc or a read-only file system. ``suffixes``: the ones allowed;
    ``inputs``: files the run reads, which an output must not overwrite; ``example``: the file
    name a fix suggests (default ``report`` with the first suffix allowed, else ``.json``).
    """
    example = example or "report" + (suffixes[0] if suffixes else ".json")
    if not path.strip():  # `--json ""` was taken as not given: nothing written, not a word
        raise ConfigError(f"{option} {path!r}: an empty path names no file. Fix: give a file "
                          f"name, e.g. {option} {example}, or leave {option} out.")
    p = Path(path)
    if p.is_dir():  # the suggestion was report.png for every option (--html, tune --out)
        raise ConfigError(f"{option} {path!r} is a directory. Fix: give a file name, e.g. "
                          f"{str(p / example)!r}.")
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
def writing(option: str, path: Path) -> Iterator[None]:
    """An output written after measuring: a failure (a full disk, ``/dev/full``) names the option,
    the path and the reason, and says the measurements were printed."""
    try:
        yield
    except OSError as e:
        raise ConfigError(f"{option} {str(path)!r} could not be written: {e.strerror or e}. The "
                          "measurements are printed above. Fix: free space, or give another "
                          f"path to {option}.") from None
