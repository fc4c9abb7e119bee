"""Train a small byte-level GPT in Equinox under a remat plan read from a YAML file.

Goal: train a decoder-only transformer (token embedding, causal self-attention, gated MLP, RMSNorm,
``n_layers`` blocks; ``model.py``) to predict the next byte of the text in
``examples/data/corpus.txt``, while a plan decides what each block keeps for the backward pass.
(1) The hyperparameters are the keyword defaults of :func:`main`. (2) The text is read as bytes and
cut into deterministic batches, so a resumed run sees the batches an uninterrupted one would. (3) The
optimiser is optax AdamW with warm-up and cosine decay. (4) The model is built as written and the
plan (``plans/default.yaml``; alternatives in ``plans/``) is applied from outside with
``equinox_remat_plugin.annotate``, which returns a new model with the same array leaves in the same
order. (5) Before training, the plan's report shows what the training step keeps on device and on
host, what it costs next to the model as written, and checks it against the plan. (6) Orbax writes
a checkpoint of the plain model's state every ``checkpoint_every`` steps, with the run manifest
(software versions, backend, the plan and its fingerprint) beside it, and a new run resumes from
the latest one, under the same plan or another. (7) The loop trains with a progress bar and logs
the loss and the step time. (8) Finally the validation loss and a short sample of generated text
show what was learnt.

Run it (``--help`` lists every hyperparameter)::

    python examples/eqx_gpt/train.py --steps 30 --plan recompute --workdir /tmp/eqx_gpt
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:  # run as a script: make `examples` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import jax
import numpy as np
from rich.markup import escape

from examples import training
from examples.eqx_gpt import model as gpt

HERE = Path(__file__).resolve().parent


@dataclasses.dataclass(frozen=True)
class TrainResult:
    """What :func:`main` did.

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


def main(
    *,
    steps: int = 300,
    batch: int = 8,
    seq_len: int = 128,
    d_model: int = 128,
    n_layers: int = 4,
    n_heads: int = 4,
    d_ff: int | None = None,
    learning_rate: float = 3e-3,
    warmup_steps: int = 20,
    decay_steps: int = 300,
    weight_decay: float = 0.1,
    clip_norm: float = 1.0,
    plan: str | None = "plans/default.yaml",
    workdir: str = str(Path(tempfile.gettempdir()) / "remat_examples" / "eqx_gpt"),
    checkpoint_every: int = 50,
    keep_checkpoints: int = 3,
    resume: bool = True,
    report: bool = True,
    log_every: int = 10,
    eval_batches: int = 4,
    sample_chars: int = 200,
    temperature: float = 0.8,
    seed: int = 0,
    quiet: bool = False,
) -> TrainResult:
    """Trains the Equinox GPT on the shipped text under a remat plan.

    Args:
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
      plan: the remat plan: a YAML/TOML path (relative paths are also looked up next to this file),
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
    """
    console = training.make_console(quiet=quiet)
    work = Path(workdir).expanduser().resolve()
    log = training.RunLog(work / "log.jsonl")

    # 1. Hyperparameters: the keyword defaults above; the model's are collected here.
    model_kwargs = dict(vocab=training.VOCAB, d_model=d_model, n_layers=n_layers, n_heads=n_heads,
                        seq_len=seq_len, d_ff=d_ff)

    # 2. Data: bytes of the shipped text, a training and a validation split, batches by step.
    train_tokens, val_tokens = training.split_text(training.encode(training.load_text()))
    batches = training.TextBatches(train_tokens, batch=batch, seq_len=seq_len, seed=seed)

    # 3. Optimiser: AdamW with warm-up and cosine decay.
    tx = gpt.optimizer(learning_rate=learning_rate, warmup_steps=warmup_steps,
                       decay_steps=decay_steps, weight_decay=weight_decay, clip_norm=clip_norm)

    # 4. Model and plan: build the model as written, annotate it from the plan file (a new model,
    #    same leaves), and partition it into its static part and the arrays the step trains:
    #    state = (params, opt_state).
    remat_plan = training.load_plan(plan, HERE)
    static, state, compiled_plan = gpt.build(remat_plan, seed=seed, tx=tx, **model_kwargs)
    manifest = training.run_manifest(compiled_plan)
    log.event("start", framework="equinox", hyperparameters=training.arguments(main, locals()),
              manifest=manifest)
    console.print(f"[bold]eqx_gpt[/bold]: {n_layers} blocks, d_model {d_model}, "
                  f"{training.count(state[0]):,} parameters, "
                  f"plan {remat_plan.source if remat_plan else 'none'}"
                  + (f" (fingerprint {remat_plan.fingerprint()})" if remat_plan else ""))

    # 5. The plan's report: what the training step keeps, checked against the plan.
    report_json = None
    if report:
        build_target = functools.partial(gpt.measure_target, batch=batch, seed=seed, **model_kwargs)
        report_json = training.plan_report(build_target, remat_plan, console=console,
                                           name=training.plan_name(remat_plan))
        log.event("report", report=report_json)

    # 6. Checkpoints: resume from the latest one in workdir. They hold the plain model's state
    #    (gpt.checkpoint_view), so a run may resume under another plan or none.
    ckpt = training.Checkpoints(work / "checkpoints", every=checkpoint_every, keep=keep_checkpoints)
    start = 0
    if not resume and ckpt.latest_step is not None:
        raise FileExistsError(training.MSG_NO_OVERWRITE.format(path=ckpt.directory, step=ckpt.latest_step))
    if ckpt.latest_step is not None:
        restored, saved = ckpt.restore(gpt.checkpoint_view(state))
        state = gpt.from_checkpoint_view(state, restored)
        start = int(ckpt.latest_step)
        if training.manifest_fingerprint(saved) != training.manifest_fingerprint(manifest):
            console.print(f"note: checkpoint {start} was written under another plan "
                          f"({training.manifest_fingerprint(saved)}); the state is the same either way.")
        console.print(f"resumed from step {start} ({ckpt.directory / str(start)})")
        log.event("resume", step=start)

    # 7. Train: compile once, then step with a progress bar; log loss and step time.
    step_fn = jax.jit(gpt.train_step_fn(static, tx))
    t0 = time.perf_counter()
    step_compiled = step_fn.lower(state, batches(start + 1)).compile()
    compile_s = time.perf_counter() - t0
    log.event("compile", seconds=compile_s)
    losses: dict[int, float] = {}
    times: dict[int, float] = {}
    with training.progress_bar(console) as bar:
        task = bar.add_task("train", total=steps, completed=start, loss="-", ms="-")
        for step in range(start + 1, steps + 1):
            tokens = batches(step)
            t = time.perf_counter()
            state, loss = step_compiled(state, tokens)
            losses[step] = float(loss)  # waits for the step to finish
            times[step] = time.perf_counter() - t
            log.event("step", step=step, loss=losses[step], step_time_s=times[step])
            bar.update(task, advance=1, loss=f"{losses[step]:.4f}", ms=f"{1e3 * times[step]:.1f}")
            if step % log_every == 0 or step == steps:
                bar.console.print(f"step {step:5d}  loss {losses[step]:.4f}  "
                                  f"{1e3 * training.median(list(times.values())[-log_every:]):.1f} ms/step")
            if ckpt.save(step, gpt.checkpoint_view(state), manifest=manifest, force=step == steps):
                log.event("checkpoint", step=step, path=str(ckpt.directory / str(step)))
    checkpoints = ckpt.steps
    ckpt.close()
    if times:
        console.print(f"compile {compile_s:.2f} s, median step "
                      f"{1e3 * training.median(list(times.values())):.1f} ms")

    # 8. Evaluate and sample.
    eval_loss = None
    if eval_batches:
        val = training.TextBatches(val_tokens, batch=batch, seq_len=seq_len, seed=seed + 1)
        eval_fn = jax.jit(gpt.eval_loss_fn(static))
        eval_loss = float(np.mean([eval_fn(state, val(i)) for i in range(eval_batches)]))
        console.print(f"validation loss {eval_loss:.4f}")
    sample = ""
    if sample_chars:
        sample = training.generate(jax.jit(gpt.next_token_fn(static)), state, prompt="A plan ",
                                   chars=sample_chars, seq_len=seq_len, temperature=temperature, seed=seed)
        console.print("[bold]sample[/bold]: " + escape(sample))
    result = TrainResult(start, max(start, steps), losses, times, compile_s, checkpoints, report_json,
                         eval_loss, sample, work)
    log.event("end", step=result.step, eval_loss=eval_loss, sample=sample, checkpoints=list(checkpoints))
    return result


if __name__ == "__main__":
    training.cli(main)
