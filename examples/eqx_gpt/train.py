"""Train a small byte-level GPT in Equinox under a remat plan read from a YAML file.

Goal: train a decoder-only transformer (token embedding, causal self-attention, gated MLP, RMSNorm,
``n_layers`` blocks; ``model.py``) to predict the next byte of the text in
``examples/data/corpus.txt``, while a plan decides what each block keeps for the backward pass.
(1) The hyperparameters are ``CONFIG``, a :class:`~examples.config.TrainConfig`. (2) The text is read as bytes and
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
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if __name__ == "__main__" and not __package__:  # run as a script: make `examples` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

# Only the hyperparameters and the command line here: `--help` and a bad flag answer before JAX
# is imported; main() imports the training code.
from examples.config import TrainConfig, cli

if TYPE_CHECKING:
    from examples.training import TrainResult

HERE = Path(__file__).resolve().parent

#: 1. The hyperparameters: :class:`examples.config.TrainConfig`'s defaults, and this example's
#: working directory.
CONFIG = TrainConfig(workdir=str(Path(tempfile.gettempdir()) / "remat_examples" / "eqx_gpt"))


def main(config: TrainConfig = CONFIG, /, **overrides: Any) -> TrainResult:
    """Trains the Equinox GPT on the shipped text under a remat plan.

    Args:
      config: the hyperparameters (documented in :class:`examples.config.TrainConfig`, and by
        ``--help``); default :data:`CONFIG`.
      **overrides: fields of ``config`` to change, as keywords: ``main(steps=20, plan="names")``.
    """
    # 1. Hyperparameters: CONFIG with the overrides. Steps 2-8 (data, optimiser, model and plan,
    #    report, checkpoints, training, evaluation and sample) are the shared loop, run on this
    #    example's model.py.
    config = dataclasses.replace(config, **overrides)
    from examples import training
    from examples.eqx_gpt import model as gpt

    return training.train(gpt, config, name="eqx_gpt", framework="equinox", here=HERE)


if __name__ == "__main__":
    cli(main, config=CONFIG)
