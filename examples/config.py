"""The hyperparameters of the GPT examples (:class:`TrainConfig`) and the command line built from
them (:func:`cli`), without JAX: ``train.py --help`` and a rejected flag answer before JAX, Flax or
Equinox are imported; ``main`` imports them once the command line is parsed.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import math
import re
import sys
import tempfile
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    import remat_common


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """The hyperparameters of a training run: what an example's ``main`` takes and what its command
    line offers (``--d-model 64``, ``--no-report``, ``--plan none``), one flag per field, in this
    order (the log's ``start`` record keeps it). Each example's ``CONFIG`` sets its own working
    directory; ``main(steps=20)`` or ``dataclasses.replace(CONFIG, steps=20)`` changes a field.

    Attributes:
      steps: train until this global step (a resumed run continues up to it).
      batch: sequences per step.
      seq_len: tokens (bytes) per sequence.
      d_model: model width.
      n_layers: transformer blocks.
      n_heads: attention heads.
      d_ff: hidden width of the gated MLP (default 4 * d_model).
      learning_rate: peak AdamW learning rate.
      warmup_steps: linear warm-up steps.
      decay_steps: steps of the cosine decay (to a tenth of the peak); independent of ``steps`` so
        that a run stopped early and resumed follows the same schedule.
      weight_decay: AdamW weight decay (matrices only).
      clip_norm: global gradient-norm clipping.
      plan: the remat plan: a YAML/TOML path (relative paths are also looked up next to train.py),
        a name from plans/ (default, save, recompute, offload, names), or none for the model as written.
      workdir: checkpoints and log.jsonl go here.
      checkpoint_every: write an orbax checkpoint every this many steps (and at the last step).
      keep_checkpoints: how many checkpoints to keep.
      resume: continue from the latest checkpoint in workdir, if any.
      report: print (and log) the plan's report before training.
      log_every: print a log line every this many steps.
      eval_batches: validation batches at the end (0: skip).
      sample_chars: characters of text to generate at the end (0: skip).
      temperature: sampling temperature.
      seed: initialisation, data order and sampling seed.
      quiet: no console output (the log file is still written).
      mesh: shard the training over a device mesh, AXIS=SIZE pairs from data, fsdp, tensor
        (data=2,fsdp=2,tensor=2; the product is the device count of all processes) (default
        none: one device). See docs/scale.md.
      coordinator: HOST:PORT of process 0 in a multi-process run (every process gives the same),
        or auto on a cluster that jax.distributed.initialize() detects (SLURM, Open MPI,
        Kubernetes, Cloud TPU) (default none: one process).
      num_processes: the number of processes of a multi-process run (with --coordinator HOST:PORT)
        (default none: what --coordinator auto detects).
      process_id: this process's index, 0 to num_processes - 1 (with --coordinator HOST:PORT)
        (default none: what --coordinator auto detects).
    """

    steps: int = 300
    batch: int = 8
    seq_len: int = 128
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    d_ff: int | None = None
    learning_rate: float = 3e-3
    warmup_steps: int = 20
    decay_steps: int = 300
    weight_decay: float = 0.1
    clip_norm: float = 1.0
    plan: str | Path | remat_common.Plan | None = "plans/default.yaml"
    workdir: str = str(Path(tempfile.gettempdir()) / "remat_examples" / "run")
    checkpoint_every: int = 50
    keep_checkpoints: int = 3
    resume: bool = True
    report: bool = True
    log_every: int = 10
    eval_batches: int = 4
    sample_chars: int = 200
    temperature: float = 0.8
    seed: int = 0
    quiet: bool = False
    mesh: str | None = None
    coordinator: str | None = None
    num_processes: int | None = None
    process_id: int | None = None

    def __post_init__(self) -> None:
        for name, least in _LEAST.items():  # --steps -5 trained nothing, --batch 0 failed in numpy
            v = getattr(self, name)
            if v is None and name in ("d_ff", "num_processes", "process_id"):
                continue
            number = isinstance(v, int | float) and not isinstance(v, bool)
            if not number or (name not in _FLOATS and not isinstance(v, int)) or not (
                    math.isfinite(v) and (v > least if name in _POSITIVE else v >= least)):
                kind = "a number" if name in _FLOATS else "an integer"
                bound = f"> {least}" if name in _POSITIVE else f">= {least}"
                raise ConfigValueError(f"{name} must be {kind} {bound}, got {v!r}. Fix: "
                                       f"--{name.replace('_', '-')} with such a value.")


#: The least value of each numeric hyperparameter (``_POSITIVE``: strictly above it).
_LEAST: Final = {"steps": 0, "batch": 1, "seq_len": 1, "d_model": 1, "n_layers": 1, "n_heads": 1,
                 "d_ff": 1, "learning_rate": 0, "warmup_steps": 0, "decay_steps": 1,
                 "weight_decay": 0, "clip_norm": 0, "checkpoint_every": 0, "keep_checkpoints": 1,
                 "log_every": 1, "eval_batches": 0, "sample_chars": 0, "temperature": 0,
                 "num_processes": 1, "process_id": 0}
_FLOATS: Final = frozenset({"learning_rate", "weight_decay", "clip_norm", "temperature"})
_POSITIVE: Final = frozenset({"learning_rate", "clip_norm", "temperature"})


class ConfigValueError(ValueError):
    """A hyperparameter outside its range (refused before anything runs)."""


# -- the command line from main's signature or a config's fields -------------------------------
_BUILTINS: Final[dict[str, type]] = {"int": int, "float": float, "str": str}
_ARG_DOC = re.compile(r"^  (\w+):\s*(.*)$")


def _arg_help(fun: Callable[..., Any] | type, section: str = "Args:") -> dict[str, str]:
    """``{name: text}`` from the ``Args:`` (or another) section of ``fun``'s docstring."""
    out: dict[str, str] = {}
    in_args, current = False, None
    for line in (inspect.getdoc(fun) or "").splitlines():
        if line.strip() == section:
            in_args = True
        elif in_args and line and not line.startswith(" "):
            break
        elif in_args and (m := _ARG_DOC.match(line)):
            current = m.group(1)
            out[current] = m.group(2)
        elif in_args and current and line.strip():
            out[current] += " " + line.strip()
    return out


def _parser_type(hint: Any) -> Callable[[str], Any]:
    """The argument converter for a parameter annotation such as ``int`` or ``str | None``, or
    its text (``"int | None"``): ``none`` on the command line gives ``None`` for optional
    parameters; a type other than int, float and str is read as str.

    >>> _parser_type("int | None")("none"), _parser_type(float)("0.5")
    (None, 0.5)
    """
    if isinstance(hint, str):
        names = [t.strip() for t in hint.split("|")]
        optional = "None" in names
        kind = _BUILTINS.get(next((t for t in names if t != "None"), "str"), str)
    else:
        args = typing.get_args(hint)
        optional = type(None) in args
        base = [a for a in args if a is not type(None)] if args else [hint]
        kind = base[0] if base else str
        if kind not in (int, float, str):
            kind = str

    def convert(text: str) -> Any:
        if optional and text.lower() in ("none", "null"):
            return None
        return kind(text)

    convert.__name__ = kind.__name__
    return convert


def cli(main: Callable[..., Any], argv: Sequence[str] | None = None, *,
        config: TrainConfig | None = None) -> Any:
    """Runs ``main`` from the command line: one ``--name VALUE`` flag per field of ``config`` (an
    example's ``CONFIG``; ``main(config, **flags)``), or, without ``config``, per keyword parameter
    of ``main`` (``main(**flags)``); ``--flag``/``--no-flag`` for booleans. The help of each flag is
    the field's (or parameter's) line of the docstring."""
    helps = {**_arg_help(TrainConfig, "Attributes:"), **_arg_help(main)}
    summary = (inspect.getdoc(main) or "").split("\n\n")[0]
    parser = argparse.ArgumentParser(description=summary, formatter_class=_DefaultsFormatter)
    for name, default, hint in _flags(main, config):
        flag = "--" + name.replace("_", "-")
        if hint is bool or isinstance(default, bool):
            parser.add_argument(flag, dest=name, default=default, action=argparse.BooleanOptionalAction,
                                help=helps.get(name, ""))
        else:
            parser.add_argument(flag, dest=name, default=default, type=_parser_type(hint),
                                help=helps.get(name, ""), metavar=name.upper())
    flags = vars(parser.parse_args(argv))
    try:
        return main(**flags) if config is None else main(config, **flags)
    except Exception as e:
        if isinstance(e, _user_errors()):  # the message says what to do
            raise SystemExit(f"error: {e}") from None
        raise


def _user_errors() -> tuple[type[BaseException], ...]:
    """The errors whose message tells the user what to change: a bad hyperparameter, and, once
    the training code is imported, a bad plan, mesh or checkpoint."""
    errors: tuple[type[BaseException], ...] = (ConfigValueError, FileExistsError)
    training = sys.modules.get("examples.training")
    return errors + (training.USER_ERRORS if training is not None else ())


class _DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Each flag's default after its help, unless the help already says it in words (``d_ff``:
    "(default 4 * d_model)", where the value is None): one default per flag, the docstring's."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        return text if "(default " in text else super()._get_help_string(action)


def _flags(main: Callable[..., Any], config: TrainConfig | None) -> list[tuple[str, Any, Any]]:
    """``(name, default, type hint)`` of every flag: ``config``'s fields, else ``main``'s keywords."""
    if config is not None:  # the fields' annotations as written: evaluating them would import JAX
        return [(f.name, getattr(config, f.name), f.type) for f in dataclasses.fields(config)]
    hints = typing.get_type_hints(main)
    return [(name, p.default, hints.get(name, type(p.default)))
            for name, p in inspect.signature(main).parameters.items()
            if p.default is not inspect.Parameter.empty]
