"""What the two GPT examples share and what does not depend on Flax or Equinox.

The text and its byte tokenizer, deterministic batches, orbax checkpoints with a manifest next to
each, the progress bar and the run log, the plan's report, and the training run itself (:func:`train`, steps 2 to 8 of each ``train.py``). The
model code, the optimiser step and everything framework-specific live in each example's
``model.py``, which :func:`train` takes as a :class:`GPTModule`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import time
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import jax
import numpy as np
import remat_common
from examples import scale
from examples.config import ConfigValueError as ConfigValueError
from examples.config import TrainConfig as TrainConfig
from examples.config import cli as cli
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

EXAMPLES = Path(__file__).resolve().parent
CORPUS = EXAMPLES / "data" / "corpus.txt"
#: The tokenizer: one token per byte of UTF-8 text.
VOCAB = 256


# -- the text ------------------------------------------------------------------------------------
def load_text(path: str | Path = CORPUS) -> str:
    """The training text (by default the few KB shipped in ``examples/data/corpus.txt``)."""
    return Path(path).read_text(encoding="utf-8")


def encode(text: str) -> np.ndarray:
    """Text → int32 token ids, one per UTF-8 byte (a vocabulary of 256).

    >>> encode("ok").tolist()
    [111, 107]
    """
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)


def decode(tokens: Sequence[int] | np.ndarray) -> str:
    """Token ids → text; bytes that do not form valid UTF-8 become U+FFFD.

    >>> decode(encode("remat"))
    'remat'
    """
    return bytes(int(t) for t in np.asarray(tokens).reshape(-1)).decode("utf-8", errors="replace")


@dataclasses.dataclass(frozen=True)
class TextBatches:
    """Random windows of ``seq_len + 1`` tokens; batch ``step`` depends only on ``(seed, step)``.

    A resumed run therefore sees exactly the batches an uninterrupted run would have seen.

    >>> batches = TextBatches(encode("abcdefgh" * 4), batch=2, seq_len=4, seed=0)
    >>> batches(3).shape, bool((batches(3) == batches(3)).all())
    ((2, 5), True)
    """

    tokens: np.ndarray
    batch: int
    seq_len: int
    seed: int = 0

    def __post_init__(self) -> None:
        if len(self.tokens) < self.seq_len + 2:
            raise ValueError(
                f"TextBatches: the text has {len(self.tokens)} tokens, fewer than seq_len + 2 = "
                f"{self.seq_len + 2}. Fix: use a shorter seq_len or a longer text."
            )

    def __call__(self, step: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, step])
        starts = rng.integers(0, len(self.tokens) - self.seq_len - 1, size=self.batch)
        return np.stack([self.tokens[s:s + self.seq_len + 1] for s in starts])


def split_text(tokens: np.ndarray, val_fraction: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
    """The first ``1 - val_fraction`` of the tokens for training, the rest for validation."""
    cut = int(len(tokens) * (1.0 - val_fraction))
    return tokens[:cut], tokens[cut:]


# -- checkpoints (examples/checkpoints.py) ------------------------------------------------------
from examples.checkpoints import flatten_state as flatten_state
from examples.checkpoints import unflatten_state as unflatten_state
from examples.checkpoints import run_manifest as run_manifest
from examples.checkpoints import manifest_fingerprint as manifest_fingerprint
from examples.checkpoints import MSG_NO_OVERWRITE as MSG_NO_OVERWRITE
from examples.checkpoints import MSG_CANNOT_RESTORE as MSG_CANNOT_RESTORE
from examples.checkpoints import CheckpointRestoreError as CheckpointRestoreError
from examples.checkpoints import MSG_CANNOT_SAVE as MSG_CANNOT_SAVE
from examples.checkpoints import CheckpointWriteError as CheckpointWriteError
from examples.checkpoints import write_failure as write_failure
from examples.checkpoints import Checkpoints as Checkpoints
from examples.checkpoints import stop_on_signals as stop_on_signals


# -- plans ---------------------------------------------------------------------------------------
def load_plan(plan: str | Path | remat_common.Plan | None, here: Path) -> remat_common.Plan | None:
    """``None``/``"none"`` → no plan; a name of a file in ``here/plans`` (``"recompute"``); a path
    (relative to the working directory, then to ``here``); or a :class:`remat_common.Plan`."""
    if plan is None or isinstance(plan, remat_common.Plan):
        return plan
    text = str(plan)
    if text.lower() in ("none", "null", ""):
        return None
    candidates = [Path(text), here / text, here / "plans" / f"{text}.yaml"]
    for c in candidates:
        if c.is_file():
            return remat_common.Plan.load(c)
    available = sorted(p.stem for p in (here / "plans").glob("*.yaml"))
    raise PlanNotFoundError(
        f"plan {text!r}: no such file (looked for {[str(c) for c in candidates]}). Allowed: a YAML/TOML "
        f"path, 'none', or one of {available}."
    )


class PlanNotFoundError(FileNotFoundError):
    """``--plan`` names no plan file and no plan of the example."""


#: The errors whose message says what to change: :func:`cli` prints them without a traceback.
USER_ERRORS: Final = (CheckpointRestoreError, CheckpointWriteError, FileExistsError, scale.ScaleError, ConfigValueError,
                      PlanNotFoundError, remat_common.RematError)


def plan_name(plan: remat_common.Plan | None) -> str:
    """A short name for reports: the plan file's stem, ``plan`` for an in-memory plan, ``none``."""
    if plan is None:
        return "none"
    return Path(plan.source).stem if plan.source else "plan"


# -- the plan's report --------------------------------------------------------------------------
def plan_report(
    build: Callable[[remat_common.Plan | None], remat_common.measurement.MeasureTarget],
    plan: remat_common.Plan | None,
    *,
    console: Console,
    name: str = "plan",
    steps: int = 3,
) -> dict[str, Any]:
    """Prints what ``plan`` costs next to the model as written, and returns it as JSON for the log.

    The table is :func:`remat_common.measurement.measure`'s report: activation residuals kept on device and on
    host, compiled memory and FLOPs, the FLOP and step-time ratios against the un-annotated step,
    whether offloads survive lowering for a GPU, and the verifier's verdict. A strict plan that the
    training step does not follow is an error here, before any training.

    Args:
      build: ``build(plan) -> MeasureTarget`` (the example's ``measure_target`` with its sizes).
      plan: the plan, or ``None`` for the model as written.
      name: the plan's name in the table.
      steps: timed steps per plan (after one warm-up step).
    """
    plans: dict[str, Any] = {"none": None} if plan is None else {"none": None, name: plan}
    report = remat_common.measurement.measure(build, plans, steps=steps, warmup=1)
    console.print(remat_common.measurement.report_table(report))
    for problem in report.problems:
        console.print(f"[red]problem[/red]: {escape(problem)}")
    if plan is not None and plan.strict and report.problems:
        raise remat_common.VerificationError(
            "the training step does not keep what the plan says:\n- " + "\n- ".join(report.problems))
    return dict(report.to_json())


def _on_mesh(build: Callable[..., remat_common.measurement.MeasureTarget], plan: Any, *,
             gpt: GPTModule, mesh: jax.sharding.Mesh) -> remat_common.measurement.MeasureTarget:
    """``build(plan)``'s target with its parameters, state and tokens placed on ``mesh`` as
    training places them, so that the report compiles (and times) the sharded step."""
    target = build(plan)
    rules = scale.logical_rules(mesh)
    tokens_sharding = scale.batch_sharding(mesh)

    def put(args: tuple[Any, ...]) -> tuple[Any, ...]:
        tree, tokens = args
        return (scale.place(tree, gpt.shardings(None, tree, mesh, rules)),
                scale.global_batch(np.asarray(tokens), tokens_sharding))

    return dataclasses.replace(target, loss_args=put(target.loss_args),
                               step_args=put(target.step_args))


# -- progress and the run log --------------------------------------------------------------------
class RunLog:
    """The run's record: one JSON line per event in ``path`` (``start``, ``report``, ``resume``,
    ``compile``, ``step``, ``checkpoint`` (once committed to disk), ``interrupted``, ``end``), also
    kept in ``records``."""

    def __init__(self, path: str | Path | None) -> None:
        self.path = Path(path) if path is not None else None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self.records: list[dict[str, Any]] = []

    def event(self, event: str, **fields: Any) -> dict[str, Any]:
        record = {"event": event, "time": round(time.time(), 3), **fields}
        self.records.append(record)
        if self.path is not None:
            with self.path.open("a") as f:
                f.write(json.dumps(record, default=_json_default) + "\n")
        return record


def _json_default(x: Any) -> Any:
    if isinstance(x, np.generic | np.ndarray | jax.Array):
        return np.asarray(x).tolist()
    if isinstance(x, Path):
        return str(x)
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return dataclasses.asdict(x)
    if isinstance(x, types.MappingProxyType):
        return dict(x)
    return str(x)


def make_console(*, quiet: bool = False) -> Console:
    """A rich console; when the output is not a terminal (a pipe, a log file) it is 160 columns wide
    so that the report table is not squeezed to 80."""
    console = Console(quiet=quiet, highlight=False)
    if not console.is_terminal:
        console = Console(quiet=quiet, highlight=False, width=160)
    return console


def progress_bar(console: Console) -> Progress:
    """A rich progress bar with the step, the last loss and the step time."""
    return Progress(
        TextColumn("[bold]train[/bold]"), BarColumn(), MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[ms]} ms/step"),
        TimeElapsedColumn(), TimeRemainingColumn(), console=console,
    )


def _rate(rate: tuple[float, float | None] | None) -> str:
    if rate is None:
        return ""
    return f"  {rate[0]:,.0f} tokens/s" + ("" if rate[1] is None else f"  MFU {100 * rate[1]:.1f} %")


def median(xs: Sequence[float]) -> float:
    """The median (NaN for no values)."""
    return float(np.median(np.asarray(xs))) if xs else math.nan


def count(tree: Any) -> int:
    """The number of array elements in a pytree (parameters, say)."""
    return sum(int(np.size(x)) for x in jax.tree.leaves(tree))


def generate(next_token: Callable[..., Any], state: Any, *, prompt: str, chars: int, seq_len: int,
             temperature: float = 0.8, seed: int = 0) -> str:
    """Samples ``chars`` bytes after ``prompt``, one at a time, through a fixed ``seq_len`` window.

    ``next_token(state, window, position, key, temperature)`` is the example's jitted sampler.
    """
    out = [int(t) for t in encode(prompt)[-seq_len:]]
    key = jax.random.key(seed)
    for _ in range(chars):
        ctx = out[-seq_len:]
        window = np.zeros(seq_len, np.int32)
        window[:len(ctx)] = ctx
        key, sub = jax.random.split(key)
        out.append(int(next_token(state, window, np.int32(len(ctx) - 1), sub, np.float32(temperature))))
    return decode(out)


# -- the training loop ---------------------------------------------------------------------------
class GPTModule(typing.Protocol):
    """What :func:`train` needs from an example's ``model.py`` (the framework-specific part).

    ``static`` is what ``build`` returns besides the array state (the NNX graph definition, the
    Equinox static part); ``state`` is the one pytree the jitted step takes and returns (model and
    optimiser). ``checkpoint_view``/``from_checkpoint_view`` map the state to what checkpoints hold
    and back (identities for NNX; for Equinox, the model without the plan's wrappers).
    """

    def optimizer(self, *, learning_rate: float, warmup_steps: int, decay_steps: int,
                  weight_decay: float, clip_norm: float) -> Any: ...

    def build(self, plan: remat_common.Plan | None, *, seed: int, tx: Any,
              **model: Any) -> tuple[Any, Any, remat_common.CompiledPlan | None]: ...

    def train_step_fn(self, static: Any, tx: Any) -> Callable[[Any, Any], tuple[Any, Any]]: ...

    def eval_loss_fn(self, static: Any) -> Callable[[Any, Any], Any]: ...

    def next_token_fn(self, static: Any) -> Callable[..., Any]: ...

    def shardings(self, static: Any, state: Any,
                  mesh: jax.sharding.Mesh | jax.sharding.AbstractMesh,
                  rules: tuple[tuple[str, Any], ...]) -> Any: ...

    def checkpoint_view(self, state: Any) -> Any: ...

    def state_roles(self, state: Any) -> tuple[str, ...]: ...

    def from_checkpoint_view(self, like: Any, saved: Any) -> Any: ...

    def measure_target(self, plan: remat_common.Plan | None, *, batch: int, seed: int = 0,
                       **model: Any) -> remat_common.measurement.MeasureTarget: ...


@dataclasses.dataclass(frozen=True)
class TrainResult:
    """What :func:`train` (an example's ``main``) did.

    Attributes:
      start_step: the step the run resumed from (0 for a fresh run).
      step: the last step trained.
      losses: ``{step: training loss}`` for the steps this call trained.
      step_times: ``{step: seconds}`` for the same steps (compilation excluded).
      compile_s: seconds to compile the training step.
      checkpoints: the steps that have a checkpoint in ``workdir`` at the end.
      report: the plan's report as JSON (``None`` when ``report=False``).
      eval_loss: the validation loss at the end (``None`` when ``eval_batches=0``).
      sample: generated text (empty when ``sample_chars=0``).
      workdir: where the checkpoints and ``log.jsonl`` are.
    """

    start_step: int
    step: int
    losses: dict[int, float]
    step_times: dict[int, float]
    compile_s: float
    checkpoints: tuple[int, ...]
    report: dict[str, Any] | None
    eval_loss: float | None
    sample: str
    workdir: Path


def resume_from(ckpt: Checkpoints, gpt: GPTModule, state: Any, *, resume: bool,
                manifest: Mapping[str, Any], console: Console, log: RunLog) -> tuple[int, Any]:
    """Step 6 of :func:`train`: ``(step, state)`` from the latest checkpoint, or ``(0, state)``.

    Checkpoints hold ``gpt.checkpoint_view(state)`` (for Equinox the plain model's state), so a run
    may resume under another plan or none; that is noted, not refused.
    """
    if ckpt.latest_step is None:
        return 0, state
    if not resume:
        raise FileExistsError(MSG_NO_OVERWRITE.format(path=ckpt.directory, step=ckpt.latest_step))
    try:
        restored, saved = ckpt.restore(gpt.checkpoint_view(state))
        state = gpt.from_checkpoint_view(state, restored)
    except Exception as e:
        ckpt.close()
        if isinstance(e, CheckpointRestoreError):
            raise
        raise ckpt.cannot_restore(ckpt.latest_step, e) from e
    start = int(ckpt.latest_step)
    if manifest_fingerprint(saved) != manifest_fingerprint(manifest):
        console.print(f"note: checkpoint {start} was written under another plan "
                      f"({manifest_fingerprint(saved)}); the state is the same either way.")
    console.print(f"resumed from step {start} ({ckpt.directory / str(start)})")
    log.event("resume", step=start)
    return start, state


def evaluate_and_sample(gpt: GPTModule, static: Any, state: Any, val_tokens: np.ndarray,
                        config: TrainConfig, console: Console,
                        layout: scale.Layout = scale.Layout()) -> tuple[float | None, str]:
    """Step 8 of :func:`train`: the validation loss and a sample of generated text (each skipped
    when ``config`` asks for none)."""
    eval_loss = None
    if config.eval_batches:
        val = TextBatches(val_tokens, batch=config.batch, seq_len=config.seq_len, seed=config.seed + 1)
        eval_fn = layout.jit_eval(gpt.eval_loss_fn(static))
        eval_loss = float(np.mean([eval_fn(state, layout.batch(val(i)))
                                   for i in range(config.eval_batches)]))
        console.print(f"validation loss {eval_loss:.4f}")
    sample = ""
    if config.sample_chars:
        sample = generate(layout.jit_sample(gpt.next_token_fn(static)), state, prompt="A plan ",
                          chars=config.sample_chars, seq_len=config.seq_len,
                          temperature=config.temperature, seed=config.seed)
        console.print("[bold]sample[/bold]: " + escape(sample))
    return eval_loss, sample


def train(gpt: GPTModule, config: TrainConfig, *, name: str, framework: str, here: Path) -> TrainResult:
    """Steps 2 to 8 of an example's ``train.py``: the training run, whatever the framework.

    Args:
      gpt: the example's ``model`` module (see :class:`GPTModule`).
      config: the hyperparameters (see :class:`TrainConfig`).
      name: the example's name on the console (``nnx_gpt``).
      framework: the framework, as the log's ``start`` record names it (``flax.nnx``).
      here: the example's directory (where ``plans/`` is).
    """
    hyperparameters = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    # Processes and devices: join a multi-process run when asked (before any device is used), and
    # the mesh to shard over (none: one device). Process 0 prints and writes the log; every
    # process trains and writes its shards of each checkpoint.
    scale.init_distributed(config.coordinator, config.num_processes, config.process_id)
    mesh = scale.make_mesh(config.mesh)
    primary = jax.process_index() == 0
    console = make_console(quiet=config.quiet or not primary)
    work = Path(config.workdir).expanduser().resolve()
    blocker = next((p for p in (work, *work.parents) if p.exists() and not p.is_dir()), None)
    if blocker is not None:  # was 'File exists' from mkdir, at the first write
        raise ConfigValueError(
            f"--workdir {work}: {'it' if blocker == work else blocker} is a file, not a directory; "
            "the run writes its log and checkpoints into the workdir. Fix: give a directory path "
            "(created when missing), e.g. --workdir "
            f"{blocker.parent / (blocker.name + '_run')}{work.as_posix()[len(blocker.as_posix()):]}.")
    log = RunLog(work / "log.jsonl" if primary else None)
    model_kwargs = dict(vocab=VOCAB, d_model=config.d_model, n_layers=config.n_layers,
                        n_heads=config.n_heads, seq_len=config.seq_len, d_ff=config.d_ff)

    # 2. Data: bytes of the shipped text, a training and a validation split, batches by step.
    train_tokens, val_tokens = split_text(encode(load_text()))
    batches = TextBatches(train_tokens, batch=config.batch, seq_len=config.seq_len, seed=config.seed)

    # 3. Optimiser: AdamW with warm-up and cosine decay.
    tx = gpt.optimizer(learning_rate=config.learning_rate, warmup_steps=config.warmup_steps,
                       decay_steps=config.decay_steps, weight_decay=config.weight_decay,
                       clip_norm=config.clip_norm)

    # 4. Model and plan: the example builds the model as written, annotates it from the plan file
    #    and splits model and optimiser into something static and the state the jitted step takes.
    remat_plan = load_plan(config.plan, here)
    #    On a mesh, the state is placed by the example's shardings (the plan does not change them).
    static, state, compiled_plan = gpt.build(remat_plan, seed=config.seed, tx=tx, **model_kwargs)
    layout = scale.Layout()
    if mesh is not None:
        layout = scale.Layout(mesh, gpt.shardings(static, state, mesh, scale.logical_rules(mesh)))
        scale.check_divisible("the token batch", (config.batch, config.seq_len + 1),
                              scale.batch_sharding(mesh), what="batch")
    #    Between steps the state lives where the plan's `state:` says (host: pinned_host memory,
    #    brought to the device inside each step), laid out the same way.
    placement = remat_plan.state if remat_plan is not None else remat_common.StatePlacement()
    layout = scale.host_layout(layout, state, placement, gpt.state_roles(state))
    state = layout.put(state)
    manifest = run_manifest(compiled_plan)
    log.event("start", framework=framework, hyperparameters=hyperparameters, manifest=manifest,
              mesh=None if mesh is None else dict(mesh.shape), processes=jax.process_count())
    console.print(f"[bold]{name}[/bold]: {config.n_layers} blocks, d_model {config.d_model}, "
                  f"{count(state[0]):,} parameters, "
                  f"plan {remat_plan.source if remat_plan else 'none'}"
                  + (f" (fingerprint {remat_plan.fingerprint()})" if remat_plan else "")
                  + ("" if mesh is None else f", mesh {dict(mesh.shape)} over {jax.process_count()} "
                     f"process(es)")
                  + ("" if placement.is_default else f"; between steps {placement.describe()}"))

    # 5. The plan's report: what the training step keeps, checked against the plan.
    report_json = None
    if config.report:
        build_target = functools.partial(gpt.measure_target, batch=config.batch, seed=config.seed, **model_kwargs)
        if mesh is not None:  # the sharded step; compiled memory is per device
            build_target = functools.partial(_on_mesh, build_target, gpt=gpt, mesh=mesh)
        report_json = plan_report(build_target, remat_plan, console=console, name=plan_name(remat_plan))
        if not placement.is_default and mesh is not None:  # on a mesh, not yet counted apart
            console.print(f"note: on a mesh the report compiles the step with the whole state on "
                          f"device; this run keeps it elsewhere between steps "
                          f"({placement.describe()}).")
        log.event("report", report=report_json)

    # 6. Checkpoints: resume from the latest one in workdir. They hold gpt.checkpoint_view(state)
    #    (for Equinox the plain model's state), so a run may resume under another plan or none.
    ckpt = Checkpoints(work / "checkpoints", every=config.checkpoint_every,
                       keep=config.keep_checkpoints)
    start, state = resume_from(ckpt, gpt, state, resume=config.resume, manifest=manifest,
                               console=console, log=log)

    # 7. Train: compile once, then step with a progress bar; log loss and step time. A checkpoint
    #    is logged once orbax has committed it; on Ctrl-C or SIGTERM the save in flight is awaited.
    def log_committed(steps_done: list[int]) -> None:
        for s in steps_done:
            log.event("checkpoint", step=s, path=str(ckpt.directory / str(s)))

    # Tokens per second and MFU beside the step times: model FLOPs from the architecture
    # (remat_common.measurement.ModelFlops), the peak from the accelerator table (none on a CPU).
    sizes = {**model_kwargs, "batch": config.batch}
    peak = remat_common.measurement.device_peak(jax.devices()[0].device_kind, jax.device_count())
    step_fn = layout.jit_step(gpt.train_step_fn(static, tx))
    t0 = time.perf_counter()
    step_compiled = step_fn.lower(state, layout.batch(batches(start + 1))).compile()
    compile_s = time.perf_counter() - t0
    log.event("compile", seconds=compile_s)
    losses: dict[int, float] = {}
    times: dict[int, float] = {}
    try:
        with stop_on_signals(), progress_bar(console) as bar:
            task = bar.add_task("train", total=config.steps, completed=start, loss="-", ms="-")
            for step in range(start + 1, config.steps + 1):
                tokens = layout.batch(batches(step))
                t = time.perf_counter()
                state, loss = step_compiled(state, tokens)
                losses[step] = float(loss)  # waits for the step to finish
                times[step] = time.perf_counter() - t
                log.event("step", step=step, loss=losses[step], step_time_s=times[step])
                bar.update(task, advance=1, loss=f"{losses[step]:.4f}", ms=f"{1e3 * times[step]:.1f}")
                if step % config.log_every == 0 or step == config.steps:
                    recent = median(list(times.values())[-config.log_every:])
                    rate = remat_common.measurement.throughput(sizes, recent, peak)
                    bar.console.print(f"step {step:5d}  loss {losses[step]:.4f}  "
                                      f"{1e3 * recent:.1f} ms/step" + _rate(rate))
                    if rate is not None:
                        log.event("throughput", step=step, tokens_per_s=rate[0], mfu=rate[1])
                ckpt.save(step, gpt.checkpoint_view(state), manifest=manifest,
                          force=step == config.steps)
                log_committed(ckpt.committed())
    except (KeyboardInterrupt, SystemExit):
        if ckpt.in_flight:
            console.print(f"stopping: waiting for the checkpoint of step {ckpt.in_flight[-1]} "
                          "to be written ...")
        log_committed(ckpt.close())
        log.event("interrupted", step=max(losses, default=start))
        raise
    log_committed(ckpt.committed(wait=True))
    checkpoints = ckpt.steps
    ckpt.close()
    if times:
        console.print(f"compile {compile_s:.2f} s, "
                      f"median step {1e3 * median(list(times.values())):.1f} ms")

    # 8. Evaluate and sample.
    eval_loss, sample = evaluate_and_sample(gpt, static, state, val_tokens, config, console, layout)
    result = TrainResult(start, max(start, config.steps), losses, times, compile_s, checkpoints,
                         report_json, eval_loss, sample, work)
    log.event("end", step=result.step, eval_loss=eval_loss, sample=sample, checkpoints=list(checkpoints))
    return result
