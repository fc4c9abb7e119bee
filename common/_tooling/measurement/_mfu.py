"""Model FLOPs per token from a transformer's architecture, and MFU.

MFU is the model's FLOPs per second over the device's peak: what users compare across plans and
frameworks. The model's FLOPs come from its shape, never from the compiler's count, which includes
what a plan recomputes (a plan that recomputes more does no more useful work).

The formula (PaLM, Chowdhery et al. 2022, appendix B; MaxText counts the same way): a training
step costs, per token, ``6 N + 12 L H Q T`` FLOPs, where ``N`` is the number of parameters that take
part in matrix products (the attention's query, key, value and output projections, the MLP's
matrices, the output head; not the embedding table, which is a lookup, unless the head shares it),
``L`` the layers, ``H`` the query heads, ``Q`` the head width and ``T`` the sequence length. The
second term is the attention's two products (scores and values), forward (2 each) and backward
(4 each), over the whole ``T x T`` square: the causal mask's zeros are counted, as PaLM does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class ModelFlops:
    """A decoder-only transformer's training FLOPs per token (see the module docstring).

    Attributes:
      matmul_params: ``N``, the parameters in matrix products.
      attention_flops: ``12 L H Q T``, the attention's products per token.

    >>> f = ModelFlops.from_sizes(dict(d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8,
    ...                                d_ff=14336, vocab=128256, seq_len=8192))
    >>> round(f.matmul_params / 1e9, 3), round(f.per_token / 1e9, 1)  # Llama 3.1 8B at 8k
    (7.505, 57.9)
    """

    matmul_params: int
    attention_flops: int

    @property
    def per_token(self) -> int:
        return 6 * self.matmul_params + self.attention_flops

    @classmethod
    def from_sizes(cls, sizes: Mapping[str, Any]) -> ModelFlops:
        """From the sizes the report configs use: ``d_model``, ``n_layers``, ``n_heads``,
        ``seq_len``, ``vocab``; optional ``n_kv_heads`` (default ``n_heads``), ``head_dim``
        (default ``d_model // n_heads``), ``d_ff`` (default ``4 * d_model``; the MLP is gated,
        three matrices, as in Llama, Qwen and the example GPTs) and ``tied`` (the head is the
        embedding table: counted once, as the head)."""
        missing = [k for k in ("d_model", "n_layers", "n_heads", "seq_len", "vocab") if k not in sizes]
        if missing:
            raise ValueError(
                f"model FLOPs need the model's {', '.join(missing)} (have {sorted(sizes)}). Fix: "
                "give them in the report config's model: mapping (or --size).")
        d, layers, heads = int(sizes["d_model"]), int(sizes["n_layers"]), int(sizes["n_heads"])
        kv = int(sizes.get("n_kv_heads") or heads)
        q = int(sizes.get("head_dim") or d // heads)
        ff = int(sizes.get("d_ff") or 4 * d)
        per_layer = d * heads * q + 2 * d * kv * q + heads * q * d + 3 * d * ff
        params = layers * per_layer + d * int(sizes["vocab"])
        return cls(params, 12 * layers * heads * q * int(sizes["seq_len"]))


def mfu(flops_per_token: float, tokens_per_s: float, peak_flops_per_s: float) -> float:
    """Model FLOPs utilisation: ``flops_per_token * tokens_per_s / peak_flops_per_s``.

    >>> round(mfu(57.9e9, 2000.0, 197e12), 3)  # Llama 3.1 8B at 2,000 tokens/s on a v5e
    0.588
    """
    return flops_per_token * tokens_per_s / peak_flops_per_s


def device_peak(device_kind: str, count: int = 1) -> float | None:
    """Peak dense bf16 FLOP/s of ``count`` devices of ``device_kind`` (``TPU v5 lite``: 197e12),
    from the accelerator table; ``None`` for a CPU or a device the table does not know."""
    from ..accelerators._accelerators import accelerator_for, parse_accelerator

    name = accelerator_for(device_kind, 1)
    peak = None if name is None else parse_accelerator(name).flops_per_s
    return None if peak is None else peak * count


def throughput(sizes: Mapping[str, Any] | None, step_s: float | None,
               peak_flops_per_s: float | None) -> tuple[float, float | None] | None:
    """``(tokens per second, MFU)`` of a step of ``sizes`` (a report's model sizes with its batch)
    that took ``step_s``; MFU is ``None`` where no peak is known, the whole is ``None`` where the
    sizes do not say the model's shape or nothing was timed.

    >>> throughput(dict(d_model=64, n_layers=2, n_heads=4, seq_len=128, vocab=256, batch=8),
    ...            0.5, None)
    (2048.0, None)
    """
    if not sizes or not step_s or "batch" not in sizes:
        return None
    try:
        per_token = ModelFlops.from_sizes(sizes).per_token
    except ValueError:
        return None
    tokens_per_s = int(sizes["batch"]) * int(sizes["seq_len"]) / step_s
    return tokens_per_s, None if not peak_flops_per_s else mfu(per_token, tokens_per_s,
                                                               peak_flops_per_s)
