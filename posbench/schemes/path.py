"""Householder-product attention (posbench/docs/schemes.md, path): PaTH, where the logit of query i and key j is
q_i read through the product of data-dependent Householder-like steps of the tokens between
them, and PaTH with FoX's forget gates. References: Yang et al., "PaTH Attention: Position
Encoding via Accumulating Householder Transformations", NeurIPS 2025, arXiv:2505.16381;
fla-org/flash-linear-attention `fla/layers/path_attn.py` (the layer) and
`fla/ops/path_attn/naive.py` (the chunked oracle `path_logits` follows)."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from posbench.schemes.base import Dims, Scheme
from posbench.schemes.gate import Forgetting
from posbench.schemes.registry import register

INIT_STD = 0.02  # the reference's initializer_range, for every Linear and the conv; biases 0
W_RANK = 32  # the reference's low-rank w projection: d -> 32 -> H * D
CONV_SIZE = 3  # its short causal depthwise convolution on w
NORM_EPS = 1e-6  # its l2norm: w / sqrt(|w|^2 + eps)
CHUNK = 64  # the reference's chunk; the logits do not depend on it, only the cost does


def path_logits(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, beta: torch.Tensor,
                chunk: int = CHUNK) -> torch.Tensor:
    """s_ij = q_i^T (H_i H_{i-1} ... H_{j+1}) k_j for j <= i, H_t = I - beta_t w_t w_t^T: q, k, w
    (B, H, T, D), |w_t| <= 1, beta (B, H, T) -> (B, H, T, T), unscaled; entries j > i are
    meaningless (the caller masks them).

    Chunked as the reference's naive oracle, so that no (T, T, D) tensor exists. In a chunk of C
    tokens with W (C, D) its w's and D_b = diag(beta), the UT transform writes the product
    H_{C-1} ... H_0 = I - W^T T D_b W with T = (I + strict_tril(D_b W W^T))^-1 (a unit lower
    triangular solve). Inside the chunk s = q k^T - tril(q W^T) T strict_tril(D_b W k^T); each
    query is then carried back to its chunk's start, each key forward to its chunk's end, and
    for the chunks between them the query is multiplied by one chunk product (D, D) per step,
    a loop over chunk distances, each step batched over every chunk. Time O(T C D + T^2 D (1 +
    D / C)); memory O(T C + T D^2 / C) beside the (T, T) scores, and under autograd the loop
    keeps T^2 D / 2C floats of carried queries. One chunk (T <= C) skips the loop.
    """
    b, h, t, d = q.shape
    c = min(chunk, t)
    n = -(-t // c)
    if n * c > t:  # zero steps (w = 0, beta = 0) are identities: padding changes no logit
        pad = n * c - t
        q, k, w = (F.pad(a, (0, 0, 0, pad)) for a in (q, k, w))
        beta = F.pad(beta, (0, pad))
    q, k, w = (a.view(b, h, n, c, d) for a in (q, k, w))  # (B, H, n, C, D)
    bw = beta.view(b, h, n, c, 1) * w  # D_b W
    strict = torch.ones(c, c, dtype=torch.bool, device=q.device).tril(-1)
    unit = torch.eye(c, dtype=q.dtype, device=q.device) + (bw @ w.mT) * strict  # T^-1
    bwk = (bw @ k.mT) * strict  # strict_tril(D_b W k^T)
    qw = (q @ w.mT).tril()  # q_i . w_a for a <= i: the steps between a query and its chunk start
    rows = qw if n == 1 else torch.cat([qw, w.mT], dim=-2)  # (.., C [+ D], C)
    # rows @ T: one unit triangular solve from the right serves both terms
    rows = torch.linalg.solve_triangular(unit, rows, upper=False, left=False, unitriangular=True)
    local = q @ k.mT - rows[..., :c, :] @ bwk  # (B, H, n, C, C)
    if n == 1:
        return local[:, :, 0]
    qwt, wt = rows.split([c, d], dim=-2)  # tril(q W^T) T, W^T T
    scores = q.new_zeros(b, h, n, c, n, c)  # (query chunk, query, key chunk, key)
    torch.diagonal(scores, 0, 2, 4).copy_(local.permute(0, 1, 3, 4, 2))
    queries = (q - qwt @ bw)[:, :, 1:]  # chunks 1.., each query through its chunk's steps
    keys = k - (wt @ bwk).mT  # each key through the steps after it in its chunk
    through = wt @ bw  # (B, H, n, D, D): a chunk's product is I - through
    for r in range(1, n):  # queries of chunk m against keys of chunk m - r
        block = queries @ keys[:, :, : n - r].mT  # (B, H, n - r, C, C)
        torch.diagonal(scores, -r, 2, 4).copy_(block.permute(0, 1, 3, 4, 2))
        if r < n - 1:  # through chunk m - r, then the query chunk that has no farther key
            queries = (queries - queries @ through[:, :, : n - r])[:, :, 1:]
    return scores.view(b, h, n * c, n * c)[:, :, :t, :t]


class Transitions(nn.Module):
    """One layer's Householder steps from its input x (B, T, d), as the reference's layer:
    w_t = l2norm(SiLU(conv3(W_b W_a x_t))) per head, W_a d -> 32, W_b 32 -> H D, no biases, conv3
    causal and depthwise without bias; beta_t = 2 sigmoid(u_h . x_t + b_h) in (0, 2), so a step
    may flip the sign of w_t's component (beta > 1). Init N(0, 0.02), biases 0: beta = 1."""

    def __init__(self, dims: Dims):
        super().__init__()
        width = dims.n_heads * dims.head_dim
        self.heads = dims.n_heads
        self.w_down = nn.Linear(dims.d_model, W_RANK, bias=False)
        self.w_up = nn.Linear(W_RANK, width, bias=False)
        self.w_conv = nn.Conv1d(width, width, CONV_SIZE, groups=width, bias=False)
        self.beta = nn.Linear(dims.d_model, dims.n_heads)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=INIT_STD)
            else:
                nn.init.zeros_(p)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, T, d) -> w (B, H, T, D) unit rows, beta (B, H, T), both float32."""
        b, t, _ = x.shape
        z = self.w_up(self.w_down(x)).transpose(1, 2)  # (B, H D, T)
        z = F.silu(self.w_conv(F.pad(z, (CONV_SIZE - 1, 0))))  # causal: token t reads t-2..t
        w = z.float().view(b, self.heads, -1, t).transpose(2, 3)  # (B, H, T, D)
        w = w * torch.rsqrt(w.square().sum(-1, keepdim=True) + NORM_EPS)
        beta = 2 * torch.sigmoid(self.beta(x).float()).transpose(1, 2)  # (B, H, T)
        return w, beta


@register
class Path(Scheme):
    """PaTH (Yang et al., NeurIPS 2025): NoPE content logits read through accumulated
    Householder-like steps of the tokens between query and key,

        s_ij = q_i^T (H_i H_{i-1} ... H_{j+1}) k_j / sqrt(D),  H_t = I - beta_t w_t w_t^T,

    H_i next to the query, the key's own H_j never applied; w_t and beta_t come from each
    layer's input (`Transitions`), so the scheme reads content, not positions: shifting every
    position changes nothing. No RoPE, no qk-norm (the reference's defaults).

    Hooks: `content` returns the layer's (w, beta); `logits` forms the scores with the chunked
    UT form (`path_logits`) in float32 with autocast off (the triangular solve and a long
    product of steps want it, as the reference's naive casts to float). The explicit path on
    every device: softmax over materialized (B, H, T, T) scores."""

    name = "path"
    formula = ("s_ij = q_i^T H_i H_{i-1} ... H_{j+1} k_j / sqrt(D), H_t = I - beta_t w_t w_t^T; w_t (unit) "
               "and beta_t in (0, 2) from the layer's input")
    family = "householder"
    hooks = ("content", "logits")
    relative = True
    takes_positions = False
    reference = ("Yang et al., NeurIPS 2025, arXiv:2505.16381 "
                 "(fla-org/flash-linear-attention, fla/layers/path_attn.py)")
    notes = ("s_ij = q_i^T H_i...H_{j+1} k_j / sqrt(D), H_t = I - beta_t w_t w_t^T, w from a "
             "low-rank projection + causal conv3 + SiLU + l2norm, beta = 2 sigmoid in (0, 2); "
             "chunked UT form (chunk 64), explicit path")

    def __init__(self, dims: Dims):
        super().__init__(dims)
        self.transitions = nn.ModuleList(Transitions(dims) for _ in range(dims.n_layers))

    def content(self, x: torch.Tensor, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.transitions[layer](x)

    def logits(self, q, k, pos, ctx, layer, content):
        w, beta = content
        with torch.autocast(q.device.type, enabled=False):
            return path_logits(q.float() * self.qk_scale, k.float(), w, beta)  # scale: T D, not T^2


@register
class PathFox(Path):
    """PaTH with FoX's forget gates (PaTH-FoX, the paper's strongest variant): `path`'s logits
    plus `fox`'s gate of each layer (f_t = sigmoid(w_h . x_t + b_h) per head, c = cumsum(log f)),

        s_ij = (q_i^T H_i ... H_{j+1} k_j + c_i - c_j) / sqrt(D)     (scaled_gate=true, default)
        s_ij =  q_i^T H_i ... H_{j+1} k_j / sqrt(D) + c_i - c_j      (scaled_gate=false).

    The default divides the gate by sqrt(D) with the content, as the reference's PaTH does
    (naive_path_attn scales A + G_i - G_j; its kernel and decoding likewise): at init, with
    f = 1/2, a key then loses ln 2 / sqrt(D) per token of distance instead of ln 2. posbench's
    `fox`, like the FoX reference, leaves the gate unscaled, and `scaled_gate=false` takes that
    convention (with every beta at 0 it is then exactly `fox`)."""

    name = "path-fox"
    formula = ("s_ij = (q_i^T H_i ... H_{j+1} k_j + c_i - c_j) / sqrt(D), H as path, c as fox "
               "(scaled_gate=false: + c_i - c_j outside the division)")
    family = "householder"
    hooks = ("content", "logits", "gate")
    defaults = {"scaled_gate": True}
    reference = ("Yang et al., NeurIPS 2025, arXiv:2505.16381 (PaTH-FoX; "
                 "fla-org/flash-linear-attention, fla/ops/path_attn/naive.py)")
    notes = ("path plus fox's forget gate per layer and head; the gate c_i - c_j divided by "
             "sqrt(D) as the reference (scaled_gate=true) or not, as fox (false); explicit path")

    def __init__(self, dims: Dims):
        super().__init__(dims)
        self.forget = Forgetting(dataclasses.replace(dims, params={}))

    def gate(self, x: torch.Tensor, layer: int) -> torch.Tensor:
        c = self.forget.gate(x, layer)  # (B, H, T) float32
        return c * self.qk_scale if self.p["scaled_gate"] else c
