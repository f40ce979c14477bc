"""Bias schemes: a content-independent term b_h(i, j) added to the attention logits
(SCHEMES.md 9, 14, 16-18). Each defines ``bias_fn(h, qpos, kpos)`` elementwise, so the same code
builds the (H, T, T) float mask and FlexAttention's score_mod."""

from __future__ import annotations

import math

import torch
from torch import nn

from posbench.schemes.base import Scheme
from posbench.schemes.registry import register


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """Press et al.: for H a power of two, the geometric sequence starting at and with ratio
    2^(-8/H); otherwise the slopes of the nearest lower power of two, then every other slope of
    the set for twice that power, until H are taken."""

    def power_of_two(n: int) -> list[float]:
        start = 2 ** (-8 / n)
        return [start ** (i + 1) for i in range(n)]

    if math.log2(n_heads).is_integer():
        return torch.tensor(power_of_two(n_heads))
    lower = 2 ** math.floor(math.log2(n_heads))
    extra = power_of_two(2 * lower)[0::2][: n_heads - lower]
    return torch.tensor(power_of_two(lower) + extra)


@register
class ALiBi(Scheme):
    """Attention with linear biases (Press et al., ICLR 2022): s_ij - m_h (i - j), fixed slopes
    m_h (`alibi_slopes`), not scaled by 1/sqrt(D). No position is added to the embeddings."""

    name = "alibi"
    family = "bias"
    relative = True
    hooks = ("bias",)
    reference = "Press et al. 2022, arXiv:2108.12409"

    def __init__(self, dims):
        super().__init__(dims)
        self.register_buffer("slopes", alibi_slopes(dims.n_heads), persistent=False)

    def bias_fn(self, h, qpos, kpos):
        return -self.slopes[h] * (qpos - kpos)


def t5_bucket(
    rel: torch.Tensor, bidirectional: bool, num_buckets: int, max_distance: int
) -> torch.Tensor:
    """T5's relative_position_bucket, rel = key position - query position: exact buckets below
    max_exact, log-spaced up to max_distance, then clipped (Raffel et al. 2020, mesh-tensorflow)."""
    n = -rel
    ret = torch.zeros_like(n)
    if bidirectional:
        num_buckets //= 2
        ret = ret + (n < 0).long() * num_buckets
        n = n.abs()
    else:
        n = n.clamp(min=0)
    max_exact = num_buckets // 2
    large = max_exact + (
        torch.log(n.float().clamp(min=1) / max_exact)
        / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    ).long()
    large = large.clamp(max=num_buckets - 1)
    return ret + torch.where(n < max_exact, n, large)


@register
class T5Bias(Scheme):
    """T5 relative bias (Raffel et al. 2020): s_ij + beta_h[bucket(i - j)], a learned scalar per
    head and bucket, shared by all layers, not scaled by 1/sqrt(D). One-directional buckets."""

    name = "t5"
    family = "bias"
    relative = True
    hooks = ("bias",)
    reference = "Raffel et al. 2020, arXiv:1910.10683"
    notes = "one-directional buckets (causal), shared by layers"
    defaults = {"num_buckets": 32, "max_distance": 128}

    def __init__(self, dims):
        super().__init__(dims)
        self.table = nn.Parameter(torch.zeros(self.p["num_buckets"], dims.n_heads))

    def bias_fn(self, h, qpos, kpos):
        bucket = t5_bucket(kpos - qpos, False, self.p["num_buckets"], self.p["max_distance"])
        return self.table[bucket, h]
