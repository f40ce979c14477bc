"""Attention modifiers that combine with any scheme, span and temperature, written after the
layer as the temperatures are (``rope+sink``, ``none+gate``, ``rope@w+logn+sink+gate``,
``rnope-swa+gate``: a preset followed by modifiers gives every layer of the preset the modifiers).

- ``sink`` (gpt-oss; x-transformers ``attn_head_learned_sink``): one learned logit s_h per layer
  and head, an extra column of every query's softmax whose value is zero:
  a_ij = exp(l_ij) / (exp(s_h) + sum_j' exp(l_ij')). It lets a head attend to nothing. With
  s_h = -inf it is the plain softmax. Initial value `init` (0, as x-transformers).
- ``gate`` (Qiu et al., NeurIPS 2025, "Gated Attention for Large Language Models";
  qiuzh20/gated_attention, G1): y_i <- y_i * sigmoid(x_i W_g) on the attention output of each
  head before the output projection, x_i the layer's input (after its norm); W_g (H, d), one
  scalar per head and token (`elementwise=true`: (H D, d), one per output element). No bias, as
  the reference's q_proj carries it (qkv_bias false); W_g ~ N(0, 0.02) (its initializer_range).

Where the sink goes on each attention path (posbench.attention): the explicit path appends the
column to its scores; FlexAttention returns the log-sum-exp of each row, and
out * sigmoid(lse - s_h) is exactly the output with the column; SDPA takes a float mask with one
more column (the sink) against one zero key and value. So a sink layer keeps FlexAttention on CUDA
but leaves sdpa-causal (flash): elsewhere it is SDPA with a float mask. The gate multiplies the
output of whichever path ran, so it keeps every path.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

GATE_INIT_STD = 0.02

MODIFIERS: dict[str, dict[str, Any]] = {
    "sink": {"init": 0.0},
    "gate": {"elementwise": False},
}


class Sink(nn.Module):
    def __init__(self, n_heads: int, init: float):
        super().__init__()
        # (H,): one-dimensional, so the optimizer does not decay it
        self.logit = nn.Parameter(torch.full((n_heads,), float(init)))


class OutputGate(nn.Module):
    def __init__(self, d_model: int, n_heads: int, elementwise: bool):
        super().__init__()
        self.n_heads = n_heads
        width = d_model if elementwise else n_heads  # H D = d
        self.weight = nn.Parameter(torch.randn(width, d_model) * GATE_INIT_STD)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """x (B, T, d) the layer's input, y (B, H, T, D) the attention output -> y gated."""
        b, t, _ = x.shape
        score = x @ self.weight.to(x.dtype).T  # (B, T, H) or (B, T, H D)
        gate = torch.sigmoid(score).view(b, t, self.n_heads, -1).transpose(1, 2)  # (B, H, T, 1 or D)
        return y * gate
