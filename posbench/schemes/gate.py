"""Per-token gates (SCHEMES.md 25): a scheme that reads each layer's input and adds a
content-dependent decay to the logits, with no position signal of its own."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from posbench.schemes.base import Dims, Scheme
from posbench.schemes.registry import register

GATE_INIT_STD = 0.02  # the reference's initializer_range; its gate bias starts at 0 (f = 1/2)


@register
class Forgetting(Scheme):
    """The Forgetting Transformer (FoX; Lin et al. 2025): NoPE plus a forget gate per layer and
    head, f_t = sigmoid(w_h . x_t + b_h) with x_t the layer's input to attention (after its norm),
    and logits s_ij + c_i - c_j with c = cumsum(log f) over the window: key j is discounted by
    the product of the gates of the tokens after it, up to the query. The gate reads content
    only, so shifting every position changes nothing.

    One instance serves every layer that uses it, so it holds the gates of all layers, (L, H, d)
    and (L, H), and a layer reads its own row."""

    name = "fox"
    family = "gate"
    hooks = ("gate",)
    relative = True
    takes_positions = False
    reference = "Lin et al., ICLR 2025, arXiv:2503.02130 (zhixuan-lin/forgetting-transformer)"
    notes = ("NoPE plus a forget gate f = sigmoid(w.x + b) per layer and head: logits + "
             "c_i - c_j, c = cumsum(log f); flex score_mod on CUDA, a (B, H, T, T) mask elsewhere")

    def __init__(self, dims: Dims):
        super().__init__(dims)
        self.gate_weight = nn.Parameter(
            torch.randn(dims.n_layers, dims.n_heads, dims.d_model) * GATE_INIT_STD)
        self.gate_bias = nn.Parameter(torch.zeros(dims.n_layers, dims.n_heads))

    def gate(self, x: torch.Tensor, layer: int) -> torch.Tensor:
        # The projection in the compute dtype, as the reference's nn.Linear; log f and its sum in
        # float32, since c grows linearly with the length and its differences must stay exact.
        logit = F.linear(x, self.gate_weight[layer].to(x.dtype), self.gate_bias[layer].to(x.dtype))
        return F.logsigmoid(logit.float()).transpose(1, 2).cumsum(-1)  # (B, H, T)
