"""Rotary schemes: q and k rotated by position in every attention layer (SCHEMES.md 13, 15).

Layout: half-split (GPT-NeoX): pair t is (x_t, x_{t + D/2}), t < D/2. It equals the interleaved
layout of the RoFormer paper up to a fixed permutation of head dimensions, which q.k ignores.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from posbench.errors import PosbenchError
from posbench.schemes.base import Scheme
from posbench.schemes.registry import register
from posbench.schemes.tables import GrowingTable

SCALINGS = ("none", "pi", "ntk", "dynamic-ntk", "yarn")


@dataclass(frozen=True)
class RopeScaling:
    """An eval-time context extension. factor 0 means s = L_eval / L_train (at least 1)."""

    kind: str = "none"
    factor: float = 0.0
    alpha: float = 1.0  # YaRN beta_slow: pairs with fewer rotations than this are interpolated
    beta: float = 32.0  # YaRN beta_fast: pairs with more rotations than this are kept

    def __post_init__(self):
        if self.kind not in SCALINGS:
            from posbench.errors import did_you_mean

            raise did_you_mean(self.kind, SCALINGS, "rope scaling")

    def scale(self, length: int, train_len: int) -> float:
        if self.kind == "none":
            return 1.0
        return self.factor if self.factor > 0 else max(1.0, length / train_len)

    @property
    def label(self) -> str:
        if self.kind == "none":
            return "none"
        return self.kind if self.factor <= 0 else f"{self.kind}:{self.factor:g}"


def yarn_ramp(dim: int, base: float, train_len: int, alpha: float, beta: float) -> torch.Tensor:
    """(dim/2,) interpolation weight per pair: 0 keeps the pair, 1 interpolates it fully.
    Follows transformers' `_compute_yarn_parameters` (find_correction_dim, linear ramp)."""

    def correction_dim(rotations: float) -> float:
        return dim * math.log(train_len / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(correction_dim(beta)), 0)
    high = min(math.ceil(correction_dim(alpha)), dim - 1)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    t = torch.arange(dim // 2, dtype=torch.float64)
    return ((t - low) / (high - low)).clamp(0, 1)


def rope_frequencies(
    dim: int, base: float, train_len: int, scaling: RopeScaling, length: int
) -> tuple[torch.Tensor, float]:
    """Inverse frequencies (dim/2,) float64 and the factor applied to both cos and sin."""
    s = scaling.scale(length, train_len)
    exponent = torch.arange(0, dim, 2, dtype=torch.float64) / dim
    inv = base**-exponent
    kind = scaling.kind if s > 1 else "none"
    if kind == "pi":
        return inv / s, 1.0
    if kind in ("ntk", "dynamic-ntk"):
        return (base * s ** (dim / (dim - 2))) ** -exponent, 1.0
    if kind == "yarn":
        ramp = yarn_ramp(dim, base, train_len, scaling.alpha, scaling.beta)
        return inv / s * ramp + inv * (1 - ramp), 0.1 * math.log(s) + 1.0
    return inv, 1.0


def angle_table(inv: torch.Tensor, mscale: float = 1.0) -> GrowingTable:
    """Rows (2, D/2) per position k: cos and sin of k * inv, times mscale, computed in float64."""

    def build(n, device):
        angle = torch.arange(n, dtype=torch.float64)[:, None] * inv
        return (torch.stack([angle.cos(), angle.sin()], dim=1) * mscale).float().to(device)

    return GrowingTable(build)


def rotate_half(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (..., T, D) rotated pairwise; cos, sin (T, D/2)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


@register
class RoPE(Scheme):
    """Rotary position embedding (Su et al. 2021, RoFormer): pair t of q at position m rotated by
    m * theta_t, theta_t = base^(-2t/D); k likewise at n; so q.k depends on m - n only.
    Eval-time scaling (`--rope-scaling`): pi, ntk, dynamic-ntk, yarn (see `rope_frequencies`)."""

    name = "rope"
    family = "rotary"
    relative = True
    hooks = ("qk",)
    reference = "Su et al. 2021, arXiv:2104.09864"
    extrapolates = "yes"
    notes = "half-split (NeoX) pairs; eval-time scaling pi, ntk, dynamic-ntk, yarn"
    defaults = {"base": 10000.0}

    def __init__(self, dims):
        super().__init__(dims)
        if self.head_dim % 2:
            raise PosbenchError(f"{self.name} needs an even head dimension, got {self.head_dim}")
        self.scaling = RopeScaling()
        self._tables: dict[tuple, GrowingTable] = {}

    def set_scaling(self, scaling: RopeScaling) -> None:
        self.scaling = scaling

    def angles(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin (T, D/2) at `pos`, YaRN's attention factor folded in."""
        length = int(pos.max()) + 1
        s = self.scaling.scale(length, self.dims.train_len)
        key = (self.scaling, s)
        if key not in self._tables:
            inv, mscale = rope_frequencies(
                self.head_dim, self.p["base"], self.dims.train_len, self.scaling, length
            )
            self._tables[key] = angle_table(inv, mscale)
        cos_sin = self._tables[key](pos)  # (T, 2, D/2)
        return cos_sin[:, 0], cos_sin[:, 1]

    def prepare(self, pos):
        return self.angles(pos)

    def rotate(self, q, k, pos, ctx):
        cos, sin = ctx
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        return rotate_half(q, cos, sin), rotate_half(k, cos, sin)


def xpos_zeta(dim: int) -> torch.Tensor:
    """(dim/2,) float64 per-pair decay base zeta_t = (2t/dim + 0.4) / 1.4 (Sun et al. 2022)."""
    return (torch.arange(0, dim, 2, dtype=torch.float64) / dim + 0.4) / 1.4


@register
class XPos(Scheme):
    """xPos (Sun et al. 2022, "A Length-Extrapolatable Transformer"): RoPE times a per-pair
    exponential decay. Pair t of q at position m is rotated by m * theta_t and scaled by
    zeta_t^((m - c)/gamma), pair t of k at n rotated by n * theta_t and scaled by
    zeta_t^(-(n - c)/gamma), so pair t of the logit carries zeta_t^((m - n)/gamma) < 1: distant
    keys are damped. c, the integer midpoint of the window's positions, keeps both powers finite
    and cancels in every logit. q, k (B, H, T, D); half-split pairs as in `RoPE`.
    """

    name = "xpos"
    family = "rotary"
    relative = True
    hooks = ("qk",)
    reference = "Sun et al. 2022, arXiv:2212.10554"
    extrapolates = "yes"
    notes = "half-split (NeoX) pairs; decay zeta^((m-n)/gamma), centred on the window midpoint"
    defaults = {"base": 10000.0, "gamma": 512.0}

    def __init__(self, dims):
        super().__init__(dims)
        if self.head_dim % 2:
            raise PosbenchError(f"{self.name} needs an even head dimension, got {self.head_dim}")
        inv, _ = rope_frequencies(self.head_dim, self.p["base"], dims.train_len, RopeScaling(), 0)
        self.table = angle_table(inv)

    def prepare(self, pos):
        cos_sin = self.table(pos)  # (T, 2, D/2)
        centre = (pos.min() + pos.max()) // 2
        zeta = xpos_zeta(self.head_dim).to(pos.device)
        scale = zeta ** ((pos - centre).double()[:, None] / self.p["gamma"])  # (T, D/2)
        return cos_sin[:, 0], cos_sin[:, 1], scale.float()

    def rotate(self, q, k, pos, ctx):
        cos, sin, scale = (t.to(q.dtype) for t in ctx)
        # rotate_half is linear in (cos, sin): scaling both scales the rotated pair
        return rotate_half(q, cos * scale, sin * scale), rotate_half(k, cos / scale, sin / scale)
