"""Biases adapted to the attention scores (posbench/docs/schemes.md, dape): DAPE passes each (query, key) entry's
scores and base biases, across heads, through a small MLP of the layer."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from posbench.schemes.base import Scheme, one_of, size
from posbench.schemes.bias import ALiBi, Fire, Kerple
from posbench.schemes.registry import register

LEAKY_SLOPE = 0.01  # nn.LeakyReLU's default, which the reference's MLPs use
# Hidden units of DAPE's MLP held at once: blocks of query rows keep an evaluation at 16x the
# training length from holding (B, T, T, width) floats at once.
ROW_BUDGET = 2**24


class LeakyFire(Fire):
    """FIRE with LeakyReLU hidden units, as the DAPE reference's `FIRE_C` (its plain `FIRE`, and
    posbench's `fire`, use ReLU)."""

    activation = staticmethod(F.leaky_relu)


BASES = {"kerple": Kerple, "alibi": ALiBi, "fire": LeakyFire}


@register
class Dape(Scheme):
    """DAPE v1 (Zheng et al., NeurIPS 2024, "DAPE: Data-Adaptive Positional Encoding for Length
    Extrapolation"): a base bias adapted to the scores. Per layer, X = QK^T / sqrt(D) (B, H, T, T),
    unmasked, and B_h(i, j) the base bias (H, T, T); at each (i, j) the 2H channels
    Z = [X_1..X_H, B_1..B_H] go through f = Linear(2H -> width) -> LeakyReLU(0.01) ->
    Linear(width -> H), biases on, PyTorch's default init, one f per layer:

        logits = X + B + f(Z),  then the causal mask and softmax.

    f acts on each (i, j) alone, so the future entries it reads never reach a past one's logit.
    As the reference (chuanyang-Zheng/DAPE `megatron/model/positional_embeddings.py`
    `ParallelKerpleLog_C`, `AliBi_C`, `FIRE_C`, built in each attention layer of
    `megatron/model/transformer.py`; configs `configs/125M/512/125M_*_c.yml`, mlp_width 32), every
    layer has its own base too. `base`: `kerple` (default; posbench's log kernel, whose r1, r2 are
    kept positive by softplus where the reference clamps them at 0.01 in place), `alibi`, or `fire`
    (FIRE with LeakyReLU hidden units, as `FIRE_C`, its L starting at train_len / 8: `FIRE_C` halves
    its init_L, noise_seq_length 128 at training length 512).

    Translation-invariant with the kerple or alibi base (`relative` describes the default); not
    with fire, whose normalizer reads the query position. Path: explicit on every device (the
    logits hook): the (B, H, T, T) scores and the MLP's (B, T, T, width) hidden units are
    materialized, which is what `posbench speed` shows it costs."""

    name = "dape"
    formula = ("logits = X + B + f([X; B]), X = QK^T / sqrt(D), B the base bias, f an MLP across the 2H "
               "channels of each (i, j)")
    family = "adaptive"
    hooks = ("logits",)
    relative = True
    reference = "Zheng et al., NeurIPS 2024, arXiv:2405.14722 (chuanyang-Zheng/DAPE)"
    notes = ("logits X + B + f([X; B]): an MLP across heads per (i, j) and layer, base bias B "
             "kerple (default), alibi or fire, one per layer; explicit path")
    defaults = {"base": "kerple", "width": 32}
    ranges = {"base": one_of(*BASES), "width": size}

    def __init__(self, dims):
        super().__init__(dims)
        base = self.p["base"]
        base_dims = dataclasses.replace(dims, params={"L": dims.train_len / 8} if base == "fire" else {})
        h, width = dims.n_heads, self.p["width"]
        self.bases = nn.ModuleList(BASES[base](base_dims) for _ in range(dims.n_layers))
        self.mlps = nn.ModuleList(
            nn.Sequential(nn.Linear(2 * h, width), nn.LeakyReLU(LEAKY_SLOPE), nn.Linear(width, h))
            for _ in range(dims.n_layers))

    def logits(self, q, k, pos, ctx, layer):
        scores = (q @ k.transpose(-1, -2)) * self.qk_scale  # X: (B, H, T, T)
        bias = self.bases[layer].bias(pos)  # B: (H, T, T)
        return scores + bias + self.adapt(scores, bias, layer)

    def adapt(self, scores: torch.Tensor, bias: torch.Tensor, layer: int) -> torch.Tensor:
        """f(Z) (B, H, T, T), Z = [X; B] per entry, over blocks of query rows."""
        mlp = self.mlps[layer]
        b, _, t, _ = scores.shape
        rows = max(1, ROW_BUDGET // (b * t * self.p["width"]))
        blocks = []
        for start in range(0, t, rows):
            x = scores[:, :, start:start + rows]  # (B, H, r, T)
            z = torch.cat([x, bias[:, start:start + rows].to(x.dtype).expand_as(x)], dim=1)  # (B, 2H, r, T)
            blocks.append(mlp(z.permute(0, 2, 3, 1)).permute(0, 3, 1, 2))  # (B, H, r, T)
        return torch.cat(blocks, dim=2)
