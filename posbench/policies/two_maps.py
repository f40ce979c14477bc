"""The policies that merge two logit maps (self-extend, rerope, dpe; posbench/docs/extension.md): plain
RoPE where i - j < W, the policy's map beyond. A RoPE layer under them takes the explicit attention path.
"""

from __future__ import annotations

import torch

from posbench.policies.rotation import turn_at
from posbench.policies.scaling import RopeScaling


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


def far_queries(q: torch.Tensor, qpos: torch.Tensor, inv: torch.Tensor, scaling: RopeScaling,
                window: int) -> torch.Tensor:
    """q (..., Tq, D) at qpos, unrotated, turned for the policy's map beyond the window (with
    `far_keys`): Self-Extend's grouped query positions, ReRoPE's w, or leaky ReRoPE's i + w(k - 1)
    at frequencies / k, so that q.k reads floor(i/G) - floor(j/G) + W - W/G, w, or w + (i - j - w) / k;
    DPE's floor(i/s_t) + W - W/s_t per pair (`dpe_positions`, its scales set: `dpe_ready`)."""
    if scaling.kind == "self-extend":
        return turn_at(q, self_extend_positions(qpos, scaling.group, window)[0], inv)
    if scaling.kind == "dpe":
        return turn_at(q, dpe_positions(qpos, dpe_pair_scales(scaling.scales, len(inv)), window)[0], inv)
    if scaling.leak:
        return turn_at(q, qpos + window * (scaling.leak - 1), inv / scaling.leak)
    return turn_at(q, torch.full_like(qpos, window), inv)


def far_keys(k: torch.Tensor, kpos: torch.Tensor, inv: torch.Tensor, scaling: RopeScaling) -> torch.Tensor:
    """k (..., Tk, D) at kpos, unrotated, turned for the far map: Self-Extend's floor(j/G), leaky
    ReRoPE's j at frequencies / k, DPE's floor(j/s_t); ReRoPE leaves the keys unrotated."""
    if scaling.kind == "self-extend":
        return turn_at(k, self_extend_positions(kpos, scaling.group, 0)[1], inv)
    if scaling.kind == "dpe":
        return turn_at(k, dpe_positions(kpos, dpe_pair_scales(scaling.scales, len(inv)), 0)[1], inv)
    if scaling.leak:
        return turn_at(k, kpos, inv / scaling.leak)
    return k


def two_map_scores(q: torch.Tensor, k: torch.Tensor, qpos: torch.Tensor, kpos: torch.Tensor, inv: torch.Tensor,
                   scaling: RopeScaling, window: int) -> torch.Tensor:
    """Self-Extend, ReRoPE or DPE q.k (unscaled): q (B, H, Tq, D) at qpos, k (B, H, Tk, D) at kpos, both
    unrotated -> (B, H, Tq, Tk), plain RoPE where i - j < W, the policy's map beyond."""
    near = turn_at(q, qpos, inv) @ turn_at(k, kpos, inv).transpose(-1, -2)
    far = far_queries(q, qpos, inv, scaling, window) @ far_keys(k, kpos, inv, scaling).transpose(-1, -2)
    return torch.where(two_map_choice(qpos, window, kpos), near, far)
