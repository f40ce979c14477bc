"""Per-token gates (posbench/docs/schemes.md: fox, cable): schemes that read each layer's input and add a
content-dependent decay to the logits, with no position signal of their own."""

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
    and (L, H), and a layer reads its own row. The gate bias takes no weight decay, though
    stacked 2-D: the reference keeps every bias out (`bias_weight_decay=False`, and
    `_no_weight_decay` on its fixed-gate bias)."""

    name = "fox"
    formula = "s_ij = q_i.k_j / sqrt(D) + c_i - c_j, c_t = sum_{r<=t} log sigmoid(w_h.x_r + b_h)"
    family = "gate"
    hooks = ("gate",)
    relative = True
    takes_positions = False
    reference = "Lin et al., ICLR 2025, arXiv:2503.02130 (zhixuan-lin/forgetting-transformer)"
    notes = ("NoPE plus a forget gate f = sigmoid(w.x + b) per layer and head: logits + "
             "c_i - c_j, c = cumsum(log f); flex score_mod on CUDA, a (B, H, T, T) mask elsewhere")
    no_weight_decay = ("gate_bias",)

    def __init__(self, dims: Dims):
        super().__init__(dims)
        self.gate_weight = nn.Parameter(
            torch.randn(dims.n_layers, dims.n_heads, dims.d_model) * GATE_INIT_STD)
        self.gate_bias = nn.Parameter(torch.zeros(dims.n_layers, dims.n_heads))

    def gate(self, x: torch.Tensor, layer: int) -> torch.Tensor:
        # The projection in the compute dtype, as the reference's nn.Linear; log f and its sum in
        # float32, since c grows linearly with the length and its differences must stay exact.
        logit = F.linear(x, self.gate_weight[layer].to(x.dtype), self.gate_bias[layer].to(x.dtype))
        return self.log_decay(logit.float()).transpose(1, 2).cumsum(-1)  # (B, H, T)

    def log_decay(self, logit: torch.Tensor) -> torch.Tensor:
        """Each token's log decay (<= 0) from its gate logit w.x + b: log f = log sigmoid."""
        return F.logsigmoid(logit)


@register
class Cable(Forgetting):
    """CABLE (Veisi et al. 2025, "Context-aware Biases for Length Extrapolation"): per layer and
    head a token-specific bias z_t = w_h . x_t + b_h from the layer's normed input, summed into
    S_t = sum_{r <= t} -softplus(z_r), and logits s_ij + S_i - S_j = s_ij - sum_{r = j+1..i}
    softplus(z_r) <= 0: each token between key and query adds its own penalty. Since
    -softplus(z) = log sigmoid(-z), CABLE with (w, b) is FoX with (-w, -b) exactly; at init
    (w ~ N(0, 0.02), b = 0, as the reference's Linear) about -ln 2 per token of distance.

    The reference (axiomlab/Cable `src/Cable.py`) divides q and k each by sqrt(C / n_embd) = 1,
    so its logits carry no 1/sqrt(d_h); posbench keeps 1/sqrt(d_h), as every other scheme, and
    like the reference's optimizer (2-D tensors only) the per-head bias takes no weight decay.
    The parameter-free CABLE_NW variant of the paper is not here. Path: a flex score_mod reading
    S on CUDA, a (B, H, T, T) float mask elsewhere, as `fox`."""

    name = "cable"
    formula = "s_ij = q_i.k_j / sqrt(D) - sum_{r=j+1..i} softplus(w_h.x_r + b_h)"
    reference = "Veisi et al. 2025, arXiv:2503.08067 (axiomlab/Cable)"
    notes = ("NoPE plus per layer and head a token bias z = w.x + b: logits + S_i - S_j, "
             "S = cumsum(-softplus(z)); fox with (-w, -b); flex score_mod on CUDA, a (B, H, T, T) "
             "mask elsewhere")

    def log_decay(self, logit: torch.Tensor) -> torch.Tensor:
        return -F.softplus(logit)
