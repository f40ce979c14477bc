"""The swap of a model's rotary embedding: `Rotary` gives cos and sin by posbench's own formulas
(posbench.policies.frequencies) for the window's length, and `Turned` keeps a layer's turned keys
while a prompt decodes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from posbench.policies import Policy, make
from posbench.policies.frequencies import rope_frequencies


class Rotary(nn.Module):
    """The model's rotary embedding, by posbench's formulas: cos and sin (B, T, D) of positions
    (B, T) at the frequencies `rope_frequencies` gives for the window length `length` (set per
    window, so that a prompt's decoded tokens keep the prompt's frequencies). Under a two-map
    policy it returns the identity rotation (cos 1, sin 0) and keeps the positions and
    frequencies for `two_map_attention`."""

    def __init__(self, dim: int, base: float, train_len: int):
        super().__init__()
        self.dim, self.base, self.train_len = dim, base, train_len
        self.scaling = make()
        self.length = train_len
        self.positions: torch.Tensor | None = None  # (T,) the positions of the latest forward
        self.inv = torch.zeros(0)
        self.turned: dict[int, Turned] | None = None  # each layer's turned keys, while a prompt decodes
        self.capacity = 0  # the tokens a decoding reaches: prompt and decoded ones

    def frequencies(self) -> tuple[torch.Tensor, float]:
        return rope_frequencies(self.dim, self.base, self.train_len, self.scaling, self.length)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor):
        inv, mscale = self.frequencies()
        self.positions, self.inv = position_ids[0], inv
        if self.scaling.merges_maps:
            ones = torch.ones(*position_ids.shape, self.dim, dtype=x.dtype, device=x.device)
            return ones, torch.zeros_like(ones)
        angle = position_ids.double()[..., None] * inv.to(x.device)  # (B, T, D/2), float64 as posbench's tables
        angle = torch.cat([angle, angle], dim=-1)  # half-split: pair t is (t, t + D/2)
        return (angle.cos() * mscale).to(x.dtype), (angle.sin() * mscale).to(x.dtype)


@dataclass
class Turned:
    """One layer's keys turned for each map and its values in float32 (B, Hkv, capacity, D), the first
    `n` filled: kept across the decoded tokens of one prompt (`Pretrained.greedy`), so that each
    token turns its own key only, not every cached one again."""

    scaling: Policy
    inv: torch.Tensor
    near: torch.Tensor
    far: torch.Tensor
    value: torch.Tensor
    n: int

    def holds(self, value: torch.Tensor, scaling: Policy, inv: torch.Tensor) -> bool:
        """Whether these are the first `n` of `value`'s keys (B, Hkv, Tk, D), turned as asked."""
        n = self.n
        return (self.scaling == scaling and torch.equal(self.inv, inv) and 0 < n < value.shape[2] <= self.value.shape[2]
                and torch.equal(self.value[:, :, n - 1], value[:, :, n - 1].float()))
