"""LieRE as a posbench plug-in: `posbench train --plugin scripts/plugins/liere.py --scheme liere`.

LieRE (Ostmeier, Axelrod, Moseley, Chaudhari, Langlotz; ICML 2025, arXiv:2406.10322; code
StanfordMIMI/LieRE, models/rope_vit.py, LierePositionEncoder and FlexibleAttention) generalizes
RoPE's fixed 2x2 rotations to learned rotations of blocks of `block` dimensions:

    A = U - U^T              U strictly upper triangular, learned, (block, block) per block
    R(p) = exp(t(p) A)       t(p) = p / (L - 1): the reference spreads the training grid over
                             [0, 1] and goes on linearly past it (torch.linspace(0, s, n))
    q_p -> R(p) q_p,  k_p -> R(p) k_p,  block by block

so that q_m . k_n = q^T exp((t(n) - t(m)) A) k depends on the distance alone (A commutes with
itself): the scheme is relative. With block = 2 it is RoPE with one learned frequency per pair.
Initialization as the reference: U's entries uniform in [0, 2 pi) (RoPE-Mixed's draw); the
reference subtracts 0.5 from triu(U) before forming U - U^T, which cancels in the difference.
Options as the reference's: one generator per head (`per_head`, its rotary_embedding_per_head)
and per layer (`per_layer`, its rotary_embedding_per_layer); `block` is its generator_dim (the
paper's LieRE_8 and LieRE_64 on head_dim 64). The reference's CLS token (identity rotation) has no
counterpart in a causal language model.

Written only through posbench's public plug-in interface; tests/test_worked_plugin.py checks it
against the reference's computation re-derived on fixed generators, and against RoPE's closed
form at block = 2.
"""

import math

import torch
from torch import nn

from posbench.errors import PosbenchError
from posbench.schemes import Scheme, at_least, register


@register
class LieRE(Scheme):
    """LieRE: q and k turned by exp(p/(L-1) (U - U^T)), learned U, in blocks (Ostmeier et al. 2025)."""

    name = "liere"
    family = "rotary"
    hooks = ("qk",)
    relative = True
    reference = "Ostmeier et al., ICML 2025, arXiv:2406.10322 (StanfordMIMI/LieRE)"
    notes = "plug-in: learned skew-symmetric generators per block of `block` dims; block=2 is RoPE with learned frequencies"
    defaults = {"block": 8, "per_head": True, "per_layer": False}
    ranges = {"block": at_least(2)}

    def __init__(self, dims):
        super().__init__(dims)
        g = self.p["block"]
        if self.head_dim % g:
            raise PosbenchError(f"liere: block={g} must divide the head dim {self.head_dim}")
        layers = dims.n_layers if self.p["per_layer"] else 1
        heads = dims.n_heads if self.p["per_head"] else 1
        # (layers, heads, blocks, g, g): only the strict upper triangle is read
        self.generators = nn.Parameter(torch.rand(layers, heads, self.head_dim // g, g, g) * 2 * math.pi)
        self.span = max(1, dims.train_len - 1)  # t(p) = p / (L - 1)

    def rotations(self, pos: torch.Tensor, layer: int) -> torch.Tensor:
        """R(p) for every position: (heads or 1, T, blocks, g, g), float32."""
        upper = torch.triu(self.generators[layer if self.p["per_layer"] else 0].float(), diagonal=1)
        skew = upper - upper.transpose(-1, -2)  # (h, blocks, g, g)
        t = pos.float() / self.span  # (T,)
        return torch.linalg.matrix_exp(t[None, :, None, None, None] * skew[:, None])  # (h, T, blocks, g, g)

    def rotate(self, q, k, pos, ctx, layer):
        r = self.rotations(pos, layer)
        g = self.p["block"]

        def turn(x):  # (B, H, T, D) -> (B, H, T, D)
            b, h, t, d = x.shape
            blocks = x.float().reshape(b, h, t, d // g, g, 1)
            return (r @ blocks).reshape(b, h, t, d).to(x.dtype)

        return turn(q), turn(k)
