"""Absolute schemes: a vector per position, combined with the token embeddings once, before the
first block (SCHEMES.md 1-6, seed 000 "绝对位置编码")."""

from __future__ import annotations

import torch
from torch import nn

from posbench.schemes.base import Scheme
from posbench.schemes.registry import register
from posbench.schemes.tables import GrowingTable, sinusoid


def hierarchical_table(p: torch.Tensor, alpha: float) -> torch.Tensor:
    """(n, d) trained table -> (n^2, d) (Su 2020): row (i-1)n + j - 1 is a u_i + (1 - a) u_j with
    u_i = (p_i - a p_1) / (1 - a), 1-based; rows 0..n-1 equal p exactly."""
    n = p.shape[0]
    u = (p - alpha * p[:1]) / (1 - alpha)  # (n, d)
    return (alpha * u[:, None, :] + (1 - alpha) * u[None, :, :]).reshape(n * n, -1)


@register
class NoPE(Scheme):
    """No positional information at all; a causal decoder still infers order from its mask
    (Haviv et al. 2022; Kazemnejad et al. 2023). The baseline of every comparison."""

    name = "none"
    family = "none"
    relative = True
    takes_positions = False
    reference = "Kazemnejad et al. 2023, arXiv:2305.19466"


@register
class Learned(Scheme):
    """A trainable table P (max_len, d): h_k = x_k + P_k (Gehring et al. 2017; BERT; GPT-2).

    No row exists past max_len. At evaluation the `hierarchical` extension (Su 2020,
    kexue.fm/archives/7947) builds, from the trained p_1..p_n (1-based),
    u_i = (p_i - a p_1) / (1 - a) and q_{(i-1)n+j} = a u_i + (1 - a) u_j, reaching n^2 positions
    and reproducing p_k exactly for k <= n.
    """

    name = "learned"
    family = "absolute"
    hooks = ("input",)
    reference = "Gehring et al. 2017, arXiv:1705.03122"
    extrapolates = "extension"
    notes = "beyond max_len: unsupported, or --learned-extension hierarchical"
    extensions = ("hierarchical",)
    defaults = {"max_len": 0, "alpha": 0.4}  # max_len 0: the largest training position

    def __init__(self, dims):
        super().__init__(dims)
        self.n = self.p["max_len"] or dims.max_position
        self.table = nn.Parameter(torch.randn(self.n, dims.d_model) * 0.5)

    def position_limit(self):
        return self.n**2 if self.extension == "hierarchical" else self.n

    def embed(self, x, idx, pos):
        table = self.table
        if self.extension == "hierarchical":
            table = hierarchical_table(table, self.p["alpha"])
        return x + table[pos]


@register
class Sinusoidal(Scheme):
    """Fixed sinusoids added to the embeddings (Vaswani et al. 2017):
    p_{k,2i} = sin(k / 10000^(2i/d)), p_{k,2i+1} = cos(k / 10000^(2i/d))."""

    name = "sinusoidal"
    family = "absolute"
    hooks = ("input",)
    reference = "Vaswani et al. 2017, arXiv:1706.03762"
    extrapolates = "no"
    notes = "defined at every position; known to fail past the training length"
    defaults = {"base": 10000.0}

    def __init__(self, dims):
        super().__init__(dims)
        self.table = GrowingTable(lambda n, dev: sinusoid(n, dims.d_model, self.p["base"], dev))

    def embed(self, x, idx, pos):
        return x + self.table(pos).to(x.dtype)
