"""The rotary frequencies under an eval-time policy (`rope_frequencies`, computed over the rotated
dims as transformers does) and the formulas of the built-ins that rescale them (YaRN's and Llama
3's ramps, NTK's base, freq-band's cut).
"""

from __future__ import annotations

import inspect
import math

import torch

from posbench.policies.registry import PolicyFailure, where


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


def rope_frequencies(dim: int, base: float, train_len: int, policy, length: int) -> tuple[torch.Tensor, float]:
    """Inverse frequencies (dim/2,) float64 and the factor applied to both cos and sin under
    `policy` (posbench.policies.Policy) for windows of `length` tokens: base^(-2t/dim) from the base
    its `rope_base` gives, then its `frequencies` and `temperature`. A policy that interpolates
    leaves a window with s <= 1 as trained. Non-finite frequencies are a PolicyFailure naming the
    policy's hook (a `failed` row at that length)."""
    exponent = torch.arange(0, dim, 2, dtype=torch.float64) / dim
    if policy.interpolates and policy.scale(length, train_len) <= 1:
        return base**-exponent, 1.0
    given = {"base": base} if "base" in inspect.signature(policy.frequencies).parameters else {}
    inv = policy.frequencies(policy.rope_base(base, dim, length, train_len) ** -exponent, length, train_len, **given)
    mscale = policy.temperature(length, train_len)
    inv = torch.as_tensor(inv, dtype=torch.float64)
    if inv.shape != exponent.shape:
        raise PolicyFailure(f"{where(type(policy))}policy {policy.name}'s frequencies gave shape {tuple(inv.shape)} "
                            f"for {len(exponent)} rotary pairs")
    if not bool(torch.isfinite(inv).all()) or not math.isfinite(mscale):
        raise PolicyFailure(f"{where(type(policy))}policy {policy.name}'s frequencies are not finite at length "
                            f"{length}")
    return inv, float(mscale)


def freq_band(inv: torch.Tensor, train_len: int, cutoff: float) -> torch.Tensor:
    """freq-band (Oka et al., ICLR 2026, "Frequency Bands in RoPE: Base Frequency and Context Length
    Shape the Interpolation-Extrapolation Trade-off"): the pairs below the high-norm frequency band,
    whose location the paper ties to the base and the training length, are replaced by NoPE at
    inference. The paper's exact band rule was not reachable, so posbench's rule is stated here:
    a pair whose wavelength 2 pi / theta_t exceeds cutoff * L_train (cutoff 1: it never completes
    a turn within the training window) gets theta_t = 0, angle 0 at every position, so its q.k is
    content alone; the other pairs keep theta_t, their q.k unchanged."""
    return torch.where(2 * math.pi / inv > cutoff * train_len, torch.zeros_like(inv), inv)
