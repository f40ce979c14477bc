"""The policies that merge two logit maps (self-extend, rerope, dpe; posbench/docs/extension.md): plain
RoPE where i - j < W, the policy's map beyond. A RoPE layer under them takes the explicit attention path.
"""

from __future__ import annotations

import torch

from posbench.policies.rotation import turn_at


def self_extend_positions(pos: torch.Tensor, group: int, window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Self-Extend's grouped map (Jin et al. 2024; LongLM `self_extend_forward`): query positions
    floor(i / G) + W - W / G, key positions floor(j / G), so a grouped relative position is
    floor(i / G) - floor(j / G) + W - W / G, which joins the neighbour map's W at i - j = W."""
    return pos // group + window - window // group, pos // group


def dpe_pair_scales(scales: tuple[float, ...], pairs: int) -> torch.Tensor:
    """(pairs,) float64, the scale of each rotary pair: DPE's groups split the pairs evenly in
    frequency order, pair t in group floor(t g / pairs) (the reference's `dimension_groups_range`
    [0, 8, ..., 64] over 64 pairs: pair t in group t // 8)."""
    group = torch.arange(pairs) * len(scales) // pairs
    return torch.tensor(scales, dtype=torch.float64)[group]


def dpe_positions(pos: torch.Tensor, scales: torch.Tensor, window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """DPE's far map per pair (Lu et al. 2025, arXiv:2504.18857; LuLuLuyi/DPE `dpe_flash_forward`):
    with the pair's group scale s, query positions floor(i / s) + W - W / s and key positions
    floor(j / s), (T, pairs) float64; Self-Extend's map with a group size per pair."""
    p, scales = pos.double()[:, None], scales.to(pos.device)
    return torch.floor(p / scales) + window - window / scales, torch.floor(p / scales)


def two_map_choice(qpos: torch.Tensor, window: int, kpos: torch.Tensor | None = None) -> torch.Tensor:
    """(Tq, Tk) True where query i reads key j through the neighbour map (plain RoPE): i - j < W
    (kpos: the keys' positions, the queries' when None)."""
    kpos = qpos if kpos is None else kpos
    return (qpos[:, None] - kpos[None, :]) < window


def two_map_scores(q: torch.Tensor, k: torch.Tensor, qpos: torch.Tensor, kpos: torch.Tensor, inv: torch.Tensor,
                   policy, window: int) -> torch.Tensor:
    """A two-map policy's q.k (unscaled; Self-Extend, ReRoPE, DPE): q (B, H, Tq, D) at qpos, k (B, H,
    Tk, D) at kpos, both unrotated -> (B, H, Tq, Tk), plain RoPE where i - j < W, beyond it q and k as
    the policy's `far_queries` and `far_keys` turn them."""
    near = turn_at(q, qpos, inv) @ turn_at(k, kpos, inv).transpose(-1, -2)
    far = policy.far_queries(q, qpos, inv, window) @ policy.far_keys(k, kpos, inv).transpose(-1, -2)
    return torch.where(two_map_choice(qpos, window, kpos), near, far)
