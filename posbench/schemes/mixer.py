"""Mixer schemes: a layer that mixes neighbouring tokens and adds no position vector
(posbench/docs/schemes.md, conv)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import nn

from posbench.schemes.base import Scheme, size
from posbench.schemes.registry import register


@register
class CausalConv(Scheme):
    """Position from zero padding (Islam et al., ICLR 2020: a CNN's sense of absolute position
    leaks from its zero padding). A causal depth-wise 1-D convolution over the embeddings,
    kernel K, K - 1 zeros padded on the left:
    h_t = x_t + sum_{s<K} w_s (*) x_{t-K+1+s}, x_{<0} = 0, w (d, K) one filter per channel.
    The residual form is that of the positional encoding generator of CPVT (Chu et al. 2021), so
    token identity passes unchanged. Runs once, after the embeddings; x (B, T, d). Position
    reaches the model only through the first K - 1 tokens of a window, which see the padding.
    """

    name = "conv"
    formula = "h_t = x_t + sum_{s<K} w_s * x_{t-K+1+s}, zero left padding, once after the embeddings"
    family = "mixer"
    hooks = ("mixer",)
    relative = True  # it never reads positions
    takes_positions = False
    reference = "Islam et al. 2020, arXiv:2001.08248"
    notes = "x + causal depth-wise conv, zero left padding; runs once after the embeddings"
    defaults = {"kernel": 3}
    ranges = {"kernel": size}

    def __init__(self, dims):
        super().__init__(dims)
        d = dims.d_model
        self.conv = nn.Conv1d(d, d, self.p["kernel"], groups=d, bias=False)

    def mix(self, x):
        y = F.pad(x.transpose(1, 2), (self.p["kernel"] - 1, 0))  # (B, d, K - 1 + T)
        return x + self.conv(y).transpose(1, 2)
