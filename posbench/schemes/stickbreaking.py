"""Attention weights other than softmax (posbench/docs/schemes.md, stickbreaking): stick-breaking, where the order of the
keys, nearest first, is the only position signal."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from posbench.schemes.base import Scheme
from posbench.schemes.registry import register


def stick_breaking(z: torch.Tensor) -> torch.Tensor:
    """Stick-breaking weights of the keys strictly before each query: z (..., T, T) float32
    logits, -inf where a key is out of reach, to A_ij = beta_ij * prod_{j<k<i} (1 - beta_ik),
    beta = sigmoid(z). Key i - 1 takes its share of the whole stick, each farther key its share
    of what nearer keys left, so a row sums to at most 1. In log space, with the sum over k
    accumulated from the query's side: no product underflows and nothing cancels."""
    t = z.shape[-1]
    z = z.masked_fill(torch.eye(t, dtype=torch.bool, device=z.device), float("-inf"))
    log_beta = F.logsigmoid(z)  # -inf out of reach
    log_rest = F.logsigmoid(-z)  # log(1 - beta): 0 out of reach, so blocked keys break nothing
    through = log_rest.flip(-1).cumsum(-1).flip(-1)  # sum over k >= j
    after = F.pad(through[..., 1:], (0, 1))  # sum over k > j (keys past the query add 0)
    return (log_beta + after).exp()


@register
class StickBreaking(Scheme):
    """Stick-breaking attention (Tan et al. 2025): no softmax and no position encoding. As in
    the reference (shawntan/stickbreaking-attention, attend_current=False), a query does not
    break the stick at its own token; what the keys before it leave, 1 - sum_j A_ij, goes to its
    own value (the reference adds rem * v_i), here put on the diagonal of the weights. IBM's
    dolomite-engine (lm-engine `SBAttention`) takes another convention: rem times a learned
    per-head vector, then a GroupNorm over the heads."""

    name = "stickbreaking"
    formula = ("A_ij = beta_ij prod_{j<k<i} (1 - beta_ik), beta_ij = sigmoid(q_i.k_j / sqrt(D)); the "
               "remainder 1 - sum_j A_ij goes to v_i (no softmax)")
    family = "weights"
    hooks = ("weights",)
    relative = True
    takes_positions = False
    reference = "Tan et al., ICLR 2025, arXiv:2410.17980 (shawntan/stickbreaking-attention)"
    notes = ("no softmax: key j gets sigmoid(z_ij) of what the keys between it and the query "
             "left; the remainder goes to the query's own value; explicit path")

    def weights(self, scores: torch.Tensor) -> torch.Tensor:
        attn = stick_breaking(scores)
        return attn + torch.diag_embed(1 - attn.sum(-1))
