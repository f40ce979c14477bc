"""DoPE, the `dope` eval-time policy (Xiong et al. 2025, "DoPE: Denoising Rotary Position
Embedding", arXiv:2511.09146): heads whose keys after RoPE are near rank one (low truncated matrix
entropy) are taken for noisy, and their attention map is reparameterized by an isotropic Gaussian.
Training-free and without parameters of its own; posbench's settings (the dope policy's `heads`, `rank`)
are stated where the paper's text was not reachable, in posbench/docs/extension.md.

Truncated matrix entropy of a head's keys K (T x D), as UNComp (Xiong et al. 2024, by DoPE's first
author) defines it: the eigenvalues p_1 >= p_2 >= ... of the trace-normalized Gram matrix
K K^T / tr(K K^T) (the squared singular values of K over their sum), H_r = -sum_{i <= r} p_i ln p_i
over the r largest (0 ln 0 = 0); H_r = 0 for a rank-one K, ln r for r equal eigenvalues and rank r.

Per layer the heads with the least H_r (averaged over the batch), a share `heads` of them (at least
one), are flagged; their q and k are replaced by isotropic Gaussian noise
with the standard deviation of the q and k they replace (DoPE-by-Gaussian), drawn from a generator
seeded by the layer, so that a window scores alike every time. The other heads are untouched.
"""

from __future__ import annotations

import math

import torch

DOPE_SEED = 20251112  # the noise of layer l is drawn from a generator seeded DOPE_SEED + l


def truncated_entropy(k: torch.Tensor, rank: int) -> torch.Tensor:
    """k (..., T, D) -> (...,) H_r of each matrix, in float64 (module docstring)."""
    lam = torch.linalg.svdvals(k.double()) ** 2  # descending
    p = lam / lam.sum(-1, keepdim=True).clamp_min(torch.finfo(torch.float64).tiny)
    return -torch.special.xlogy(p[..., :rank], p[..., :rank]).sum(-1)


def flagged_count(share: float, heads: int) -> int:
    """The heads flagged per layer: floor(share * H), at least one (none at share 0)."""
    return 0 if share <= 0 else max(1, math.floor(share * heads + 1e-9))


def noisy_heads(k: torch.Tensor, share: float, rank: int) -> torch.Tensor:
    """k (B, H, T, D) -> (H,) bool, True for the `flagged_count` heads of least mean H_r (ties: the
    lower index)."""
    entropy = truncated_entropy(k, rank).mean(0)  # (H,)
    order = torch.sort(entropy, stable=True).indices
    flagged = torch.zeros(k.shape[1], dtype=torch.bool, device=k.device)
    flagged[order[: flagged_count(share, k.shape[1])]] = True
    return flagged


def gaussian_like(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Isotropic Gaussian noise of x's shape, each head (dim 1) with the standard deviation of x's."""
    noise = torch.randn(x.shape, generator=generator, dtype=torch.float32).to(device=x.device, dtype=x.dtype)
    return noise * x.std(dim=(0, 2, 3), keepdim=True)


def dope_qk(q: torch.Tensor, k: torch.Tensor, share: float, rank: int, layer: int
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k (B, H, T, D) after RoPE -> DoPE's q, k and the flagged heads (H,): the flagged heads' q
    and k Gaussian noise (`gaussian_like`, seeded by the layer), the others' as given."""
    flagged = noisy_heads(k, share, rank)
    if not flagged.any():
        return q, k, flagged
    generator = torch.Generator().manual_seed(DOPE_SEED + layer)
    m = flagged[None, :, None, None]
    return torch.where(m, gaussian_like(q, generator), q), torch.where(m, gaussian_like(k, generator), k), flagged
