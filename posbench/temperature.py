"""Length-dependent temperatures (posbench/docs/layouts.md): query i is multiplied by a factor of its
position or of the number of keys it sees, before the attention path, so SDPA and FlexAttention
stay fast. Only the content logits q.k are scaled; an additive bias is not.

- ``logn`` (Qwen; Chiang & Cholak 2022): max(1, log(p_i + 1) / log(L_train)), p_i the query's
  position: exactly 1 inside the training length.
- ``ssmax`` (Nakanishi 2025, arXiv:2501.19399): s_h * log(n_i), n_i the number of keys the query
  sees under its layer's span, s_h learned per layer and head. The paper publishes no code; 0.43,
  the initial value, is the default of the scalable-softmax package (gdevos010/Scalable-Softmax),
  quoted there as the paper's.
- ``llama4`` (HF modeling_llama4.py, attn_temperature_tuning): 1 + beta * log(floor((p_i + 1) /
  floor) + 1); Llama 4 uses beta = 0.1 and floor = 8192, its attention chunk; the default floor
  here is a quarter of the training length, the default chunk, so the factor first grows at the
  same place relative to the chunk.

Positions p_i are the model's position indices (randomized in training when positions are).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from posbench.attention import Span

TEMPERATURES: dict[str, dict[str, Any]] = {
    "none": {},
    "logn": {},
    "ssmax": {"init": 0.43},
    "llama4": {"beta": 0.1, "floor": 0},  # floor 0: a quarter of the training length (the layout
    # resolves it before a Temperature is built)
}

# Each temperature in one line, as the catalogue page shows it (i the query's position, L the
# training length).
FORMULAS: dict[str, str] = {
    "logn": "q_i times max(1, log(i + 1) / log(L))",
    "ssmax": "q_i times s_h log(n_i), n_i the keys query i sees under its span, s_h learned",
    "llama4": "q_i times 1 + beta log(floor((i + 1) / floor) + 1)",
}


class Temperature(nn.Module):
    def __init__(self, kind: str, params: dict[str, Any], n_heads: int, train_len: int):
        super().__init__()
        self.kind = kind
        self.train_len = train_len
        self.p = params
        if kind == "ssmax":
            # (H,): one-dimensional, so the optimizer does not decay it toward 0
            self.s = nn.Parameter(torch.full((n_heads,), float(params["init"])))

    def factor(self, pos: torch.Tensor, span: Span) -> torch.Tensor | None:
        """What q (B, H, T, D) is multiplied by: (T, 1) or (H, T, 1); None for no temperature."""
        if self.kind == "logn":
            scale = torch.log(pos.float() + 1) / math.log(self.train_len)
            return scale.clamp(min=1.0)[:, None]
        if self.kind == "ssmax":
            n = span.visible(pos.shape[0], pos.device).float()
            return self.s[:, None, None] * torch.log(n)[:, None]
        if self.kind == "llama4":
            steps = torch.floor((pos.float() + 1) / self.p["floor"])
            return (1 + self.p["beta"] * torch.log(steps + 1))[:, None]
        return None
