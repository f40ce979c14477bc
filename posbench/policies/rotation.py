"""Turning q and k: `rotate_half` (half-split, GPT-NeoX pairs) at tabled angles, `turn_at` at any
positions, in float64 as the tables are.
"""

from __future__ import annotations

import torch


def rotate_half(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (..., T, D) rotated pairwise; cos, sin (T, D/2)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def turn_at(x: torch.Tensor, pos: torch.Tensor, inv: torch.Tensor) -> torch.Tensor:
    """x (..., T, D) with its first 2 len(inv) dims rotated at (possibly non-integer) positions
    pos (T,), or (T, r/2) one per pair, by inverse frequencies inv, the angles in float64 as the tables'."""
    p = pos.double()
    angle = (p[:, None] if p.dim() == 1 else p) * inv.to(pos.device)  # (T, r/2)
    cos, sin = angle.cos().float().to(x.dtype), angle.sin().float().to(x.dtype)
    r = 2 * inv.shape[0]
    if r == x.shape[-1]:
        return rotate_half(x, cos, sin)
    return torch.cat([rotate_half(x[..., :r], cos, sin), x[..., r:]], dim=-1)
