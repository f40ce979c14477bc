"""The rotary frequencies under each eval-time policy that rescales them (pi, ntk, dynamic-ntk, yarn,
llama3, longrope, freq-band): `rope_frequencies`, computed over the rotated dims as transformers does.
"""

from __future__ import annotations

import math

import torch

from posbench.policies.scaling import RopeScaling


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


def llama3_ramp(inv: torch.Tensor, train_len: int, low: float, high: float) -> torch.Tensor:
    """Interpolation weight per pair (0 keeps, 1 interpolates), transformers'
    `_compute_llama3_parameters`: with wavelength lambda = 2 pi / theta and
    a = (L_train / lambda - low) / (high - low), pairs with lambda < L_train / high (a > 1) are
    kept, those with lambda > L_train / low (a < 0) divided by s, and between the frequency is
    (1 - a) theta / s + a theta: so the weight is 1 - a, clamped to [0, 1]."""
    a = (train_len * inv / (2 * math.pi) - low) / (high - low)
    return 1 - a.clamp(0, 1)


def ntk_base(base: float, ratio: float, dim: int) -> float:
    """base * ratio^(dim/(dim-2)). With dim = 2 the one pair has frequency 1 at any base."""
    return base * ratio ** (dim / (dim - 2)) if dim > 2 else base


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
    if kind == "ntk":
        return ntk_base(base, s, dim) ** -exponent, 1.0
    if kind == "dynamic-ntk":
        # transformers' `dynamic`: s is the factor f (1 when none is given) and the base grows with
        # the length itself, from 1x at L_train: base * (f L / L_train - (f - 1))^(dim/(dim-2)).
        f = scaling.factor if scaling.factor > 0 else 1.0
        ratio = f * max(length, train_len) / train_len - (f - 1)
        return ntk_base(base, ratio, dim) ** -exponent, 1.0
    if kind == "longrope":
        # transformers' `_compute_longrope_parameters`: 1 / (lambda_t base^(2t/d)), cos and sin times
        # sqrt(1 + ln s / ln L); the factors apply at every position (no n^ of the paper) and at
        # every length: long factors only, no short_factor up to L (posbench.extension)
        return inv / torch.tensor(scaling.factors, dtype=torch.float64), math.sqrt(1 + math.log(s) / math.log(train_len))
    if scaling.kind == "freq-band":
        return freq_band(inv, train_len, scaling.cutoff), 1.0
    if kind in ("yarn", "llama3"):  # by parts: each pair between kept and divided by s
        if kind == "yarn":
            ramp, mscale = yarn_ramp(dim, base, train_len, scaling.alpha, scaling.beta), 0.1 * math.log(s) + 1.0
        else:
            ramp, mscale = llama3_ramp(inv, train_len, scaling.low, scaling.high), 1.0
        return inv / s * ramp + inv * (1 - ramp), mscale
    return inv, 1.0


def freq_band(inv: torch.Tensor, train_len: int, cutoff: float) -> torch.Tensor:
    """freq-band (Oka et al., ICLR 2026, "Frequency Bands in RoPE: Base Frequency and Context Length
    Shape the Interpolation-Extrapolation Trade-off"): the pairs below the high-norm frequency band,
    whose location the paper ties to the base and the training length, are replaced by NoPE at
    inference. The paper's exact band rule was not reachable, so posbench's rule is stated here:
    a pair whose wavelength 2 pi / theta_t exceeds cutoff * L_train (cutoff 1: it never completes
    a turn within the training window) gets theta_t = 0, angle 0 at every position, so its q.k is
    content alone; the other pairs keep theta_t, their q.k unchanged."""
    return torch.where(2 * math.pi / inv > cutoff * train_len, torch.zeros_like(inv), inv)
