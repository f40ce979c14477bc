"""Content-dependent relative schemes: the logits hook adds terms that read q or k against
relative-position embeddings (posbench/docs/schemes.md: shaw, xl, deberta, cope).

Memory: no scheme here gathers an (T, T, D) tensor of embeddings. Each multiplies q (or k) by the
table once, giving (B, H, T, R) scores against the R distances the window needs, then gathers
those scalars by the (T, T) distance index: O(T^2) scalars per head, as for the content term.
Distances come from the explicit positions, pos_i - pos_j, never from indices, so the gather
(not Transformer-XL's relative-shift trick, which assumes consecutive positions) serves shifted
and randomized (sorted, gapped) windows alike.

A causal decoder reads only j <= i, so only the rows for distances 0..pos[-1] - pos[0] (clipped
where the scheme clips) are multiplied; the explicit path masks j > i after these hooks, and the
index reads distance 0 there. Positions must therefore be non-decreasing, as every window is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from posbench.errors import PosbenchError
from posbench.schemes.base import MAX_SIZE, Scheme, between, one_of
from posbench.schemes.registry import register
from posbench.schemes.tables import GrowingTable, sinusoid


@dataclass(frozen=True)
class Distances:
    """The causal distances of one window, shared by all layers."""

    index: torch.Tensor  # (T, T) long: min(pos_i - pos_j, clip) for j <= i, 0 for j > i
    rows: int  # distances 0..rows-1 occur in the window (after clipping)


def causal_distances(pos: torch.Tensor, clip: int | None = None, bound: int | None = None) -> Distances:
    """pos (T,) non-decreasing positions -> their (T, T) distance index, clipped at `clip`. Under
    compile with a reserved `bound` (tables.position_count) the rows cover distances up to
    bound - 1, and the training batches' positions, non-decreasing by construction, go unchecked."""
    index = (pos[:, None] - pos[None, :]).clamp(min=0)  # (T, T)
    if bound is not None and torch.compiler.is_compiling():
        span = bound - 1
    else:
        if pos.shape[0] > 1 and bool((pos[1:] < pos[:-1]).any()):
            raise PosbenchError("relative schemes need non-decreasing positions within a window")
        span = int(pos[-1] - pos[0])
    if clip is not None:
        index = index.clamp(max=clip)
        span = min(span, clip)
    return Distances(index, span + 1)


def gather_distances(scores: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """scores (B, H, T, R) against R distances, index (T, T) into R -> (B, H, T, T)."""
    return scores.gather(-1, index.expand(*scores.shape[:-2], *index.shape))


def scatter_distances(attn: torch.Tensor, index: torch.Tensor, rows: int) -> torch.Tensor:
    """The transpose of `gather_distances`: attn (B, H, T, T) summed into (B, H, T, rows)
    buckets by distance."""
    buckets = attn.new_zeros(*attn.shape[:-1], rows)
    return buckets.scatter_add(-1, index.expand_as(attn), attn)


@register
class Shaw(Scheme):
    """Relative position representations (Shaw, Uszkoreit, Vaswani, NAACL 2018; NEZHA):
    c(i, j) = clip(i - j, -K, K), learned tables R^K, R^V (2K+1, D) shared by heads,

        s_ij = q_i.(k_j + R^K_{c(i,j)}) / sqrt(D),    o_i = sum_j a_ij (v_j + R^V_{c(i,j)}).

    Row c + K of a table holds distance c. logits: q (B, H, T, D) @ R^K.T -> (B, H, T, K+1)
    gathered by distance. values: a (B, H, T, T) scattered into (B, H, T, K+1) distance buckets,
    then @ R^V -> (B, H, T, D). Each layer has its own tables, as in tensor2tensor, where they
    live in each attention layer's scope.
    """

    name = "shaw"
    formula = "s_ij = q_i.(k_j + R^K_c) / sqrt(D), o_i = sum_j a_ij (v_j + R^V_c), c = clip(i - j, -K, K)"
    family = "relative"
    hooks = ("logits", "values")
    relative = True
    reference = "Shaw et al. 2018, arXiv:1803.02155"
    notes = "R^K, R^V per layer, shared by heads; distances clipped at k"
    defaults = {"k": 16}
    ranges = {"k": between(0, MAX_SIZE)}

    def __init__(self, dims):
        super().__init__(dims)
        k, d = self.p["k"], self.head_dim
        # Rows of about unit norm, the size of k and v rows at initialization.
        self.rk = nn.ParameterList(
            nn.Parameter(torch.randn(2 * k + 1, d) / math.sqrt(d)) for _ in range(dims.n_layers)
        )
        self.rv = nn.ParameterList(
            nn.Parameter(torch.randn(2 * k + 1, d) / math.sqrt(d)) for _ in range(dims.n_layers)
        )

    def prepare(self, pos):
        return causal_distances(pos, self.p["k"], self.position_bound)

    def _rows(self, table: torch.Tensor, dist: Distances) -> torch.Tensor:
        """(rows, D): the table's rows for distances 0..rows-1."""
        k = self.p["k"]
        return table[k : k + dist.rows]

    def logits(self, q, k, pos, ctx: Distances, layer):
        content = q @ k.transpose(-1, -2)  # (B, H, T, T)
        rel = q @ self._rows(self.rk[layer], ctx).T  # (B, H, T, rows)
        return (content + gather_distances(rel, ctx.index)) * self.qk_scale

    def values(self, attn, pos, ctx: Distances, layer):
        buckets = scatter_distances(attn, ctx.index, ctx.rows)  # (B, H, T, rows)
        return buckets @ self._rows(self.rv[layer], ctx)  # (B, H, T, D)


@register
class TransformerXL(Scheme):
    """Transformer-XL relative attention (Dai et al., ACL 2019; XLNet):

        s_ij = (q_i.k_j + q_i.W_R R_{i-j} + u.k_j + v.W_R R_{i-j}) / sqrt(D)
             = ((q_i + u).k_j + (q_i + v).W_R R_{i-j}) / sqrt(D),

    R (distances, d) sinusoidal and unclipped (`tables.sinusoid`, interleaved sin/cos: a fixed
    permutation of the paper's [sin, cos] halves, which the learned W_R absorbs), W_R (d -> H*D)
    learned per layer, u and v (H, D) learned per head. W_R R is (rows, H, D); (q + v) @ it gives
    (B, H, T, rows), gathered by distance; rows = pos[-1] - pos[0] + 1, which randomized
    positions stretch towards randomize_max. The 1/sqrt(D) on every term follows the reference
    code. No value term.
    """

    name = "xl"
    formula = "s_ij = ((q_i + u).k_j + (q_i + v).W_R R_{i-j}) / sqrt(D), R sinusoidal; W_R, u, v learned"
    family = "relative"
    hooks = ("logits",)
    relative = True
    reference = "Dai et al. 2019, arXiv:1901.02860"
    notes = "W_R per layer; u, v per layer (untie_r, as the released models) or shared"
    defaults = {"untie_r": True}

    def __init__(self, dims):
        super().__init__(dims)
        d, h, hd = dims.d_model, dims.n_heads, self.head_dim
        self.w_r = nn.ModuleList(nn.Linear(d, h * hd, bias=False) for _ in range(dims.n_layers))
        for lin in self.w_r:
            nn.init.normal_(lin.weight, std=0.02)
        n_uv = dims.n_layers if self.p["untie_r"] else 1
        self.u = nn.Parameter(torch.randn(n_uv, h, hd) * 0.02)
        self.v = nn.Parameter(torch.randn(n_uv, h, hd) * 0.02)
        self.sinusoids = GrowingTable(lambda n, device: sinusoid(n, d, 10000.0, device))

    def prepare(self, pos):
        dist = causal_distances(pos, bound=self.position_bound)
        r = self.sinusoids(torch.arange(dist.rows, device=pos.device), self.position_bound)  # (rows, d)
        return dist, r

    def logits(self, q, k, pos, ctx, layer):
        dist, r = ctx
        uv = layer if self.p["untie_r"] else 0
        u = self.u[uv][None, :, None, :]  # (1, H, 1, D)
        v = self.v[uv][None, :, None, :]
        r_k = self.w_r[layer](r).view(dist.rows, self.n_heads, self.head_dim).transpose(0, 1)
        # r_k: (H, rows, D)
        content = (q + u) @ k.transpose(-1, -2)  # (B, H, T, T)
        position = (q + v) @ r_k.transpose(-1, -2)  # (B, H, T, rows)
        return (content + gather_distances(position, dist.index)) * self.qk_scale


DEBERTA_P2C = ("paper", "code")  # the position-to-content index: d(j, i) or d(i, j)


@register
class DeBERTa(Scheme):
    """Disentangled attention (He et al., ICLR 2021): content-to-content, content-to-position
    and position-to-content, no position-to-position:

        s_ij = (q_i.k_j + q_i.K^r_{d(i,j)} + k_j.Q^r_{d(j,i)}) / sqrt(3 D),
        d(i, j) = clip(i - j, -K, K) + K in [0, 2K],  K^r = P W_{k,r},  Q^r = P W_{q,r}.

    The position-to-content index is a parameter. `p2c=paper` (default) reads Q^r_{d(j,i)}, as
    the paper's equation (4) and its Algorithm 1; `p2c=code` reads Q^r_{d(i,j)}, the same row
    as content-to-position, as the authors' released code and transformers' DebertaV2 compute
    it (their gather of the transposed product undoes the sign flip; microsoft/DeBERTa#162).

    P (2K+1, d) is one table shared by all layers (as DeBERTa's encoder shares rel_embeddings);
    W_{k,r}, W_{q,r} (d -> H*D) are per layer. A causal decoder reads d(i,j) = K + c and
    d(j,i) = K - c for the distance c = min(i - j, K): q @ K^r.T and k @ Q^r.T give
    (B, H, T, rows) each, gathered by distance (the second transposed, its rows are keys).
    k = 0 takes K from the training length, as DeBERTa's max_relative_positions = -1 takes the
    maximum sequence length.
    """

    name = "deberta"
    formula = ("s_ij = (q_i.k_j + q_i.K^r_{d(i,j)} + k_j.Q^r_{d(j,i)}) / sqrt(3D), d(i, j) = clip(i - j, -K,"
               " K) + K")
    family = "relative"
    hooks = ("logits",)
    relative = True
    reference = "He et al. 2021, arXiv:2006.03654"
    notes = (
        "P shared by layers, W_{q,r}, W_{k,r} per layer; k=0 means the training length; "
        "p2c=paper (default: Q^r_{d(j,i)}, eq. 4) or code (Q^r_{d(i,j)}, as the released code "
        "and transformers)"
    )
    defaults = {"k": 0, "p2c": "paper"}
    ranges = {"k": between(0, MAX_SIZE), "p2c": one_of(*DEBERTA_P2C)}  # k 0: train_len
    added_params = ("p2c",)

    def __init__(self, dims):
        super().__init__(dims)
        self.p["k"] = self.p["k"] or dims.train_len
        k, d, hd = self.p["k"], dims.d_model, self.head_dim
        # Unit scale, the scale of the LayerNorm'd hidden states P stands beside in
        # (x_i + p_i) W; DeBERTa v2 layer-normalizes P to the same end.
        self.rel = nn.Parameter(torch.randn(2 * k + 1, d))
        self.w_kr = nn.ModuleList(
            nn.Linear(d, dims.n_heads * hd, bias=False) for _ in range(dims.n_layers)
        )
        self.w_qr = nn.ModuleList(
            nn.Linear(d, dims.n_heads * hd, bias=False) for _ in range(dims.n_layers)
        )
        for lin in [*self.w_kr, *self.w_qr]:
            nn.init.normal_(lin.weight, std=0.02)

    @property
    def qk_scale(self) -> float:
        return 1.0 / math.sqrt(3 * self.head_dim)

    def prepare(self, pos):
        return causal_distances(pos, self.p["k"], self.position_bound)

    def _project(self, rows: torch.Tensor, lin: nn.Linear) -> torch.Tensor:
        """(rows, d) -> (H, rows, D)."""
        return lin(rows).view(rows.shape[0], self.n_heads, self.head_dim).transpose(0, 1)

    def logits(self, q, k, pos, ctx: Distances, layer):
        big_k, n = self.p["k"], ctx.rows
        ahead = self.rel[big_k : big_k + n]  # row c: d = K + c
        behind = self.rel[big_k - n + 1 : big_k + 1].flip(0)  # row c: d = K - c
        k_r = self._project(ahead, self.w_kr[layer])
        q_r = self._project(behind if self.p["p2c"] == "paper" else ahead, self.w_qr[layer])
        c2p = gather_distances(q @ k_r.transpose(-1, -2), ctx.index)  # (B, H, T, T)
        p2c = gather_distances(k @ q_r.transpose(-1, -2), ctx.index.T).transpose(-1, -2)
        c2c = q @ k.transpose(-1, -2)  # (B, H, T, T)
        return (c2c + c2p + p2c) * self.qk_scale


@register
class CoPE(Scheme):
    """Contextual position encoding (Golovneva et al. 2024): positions count gated tokens.

        g_ij = sigmoid(q_i.k_j / sqrt(D)),  p_ij = sum_{t=j..i} g_it (clamped at npos - 1),
        s_ij = (q_i.k_j + q_i.e[p_ij]) / sqrt(D),

    e[p] linearly interpolated between e[floor p] and e[ceil p]. As in the reference code
    (facebookresearch/RAM, projects/cope): q @ e gives (B, H, T, npos) logits for integer
    positions, gathered at floor and ceil of p (B, H, T, T) and interpolated; the gate reads the
    scaled logit, and the sum is divided by sqrt(D). e (D, npos) per layer, shared by heads,
    zero at the start. Ignores the integer positions: p comes from content.
    npos = 0 takes train_len + 1 positions, the reference's default (block size + 1).
    """

    name = "cope"
    formula = ("g_ij = sigmoid(q_i.k_j / sqrt(D)), p_ij = sum_{t=j..i} g_it, s_ij = (q_i.k_j + q_i.e[p_ij]) "
               "/ sqrt(D), e interpolated between integer rows")
    family = "relative"
    hooks = ("logits",)
    relative = True
    takes_positions = False
    reference = "Golovneva et al. 2024, arXiv:2405.18719"
    notes = "e per layer, shared by heads; positions clamped at npos - 1"
    defaults = {"npos": 0}
    ranges = {"npos": between(0, MAX_SIZE)}  # npos 0: train_len + 1

    def __init__(self, dims):
        super().__init__(dims)
        self.p["npos"] = self.p["npos"] or dims.train_len + 1
        self.emb = nn.ParameterList(
            nn.Parameter(torch.zeros(self.head_dim, self.p["npos"])) for _ in range(dims.n_layers)
        )

    def prepare(self, pos):
        t = pos.shape[0]
        return torch.ones(t, t, dtype=torch.bool, device=pos.device).tril()  # (T, T) j <= i

    def logits(self, q, k, pos, ctx, layer):
        t = q.shape[-2]
        content = q @ k.transpose(-1, -2)  # (B, H, T, T)
        gates = torch.sigmoid(content * self.qk_scale) * ctx  # zero where j > i
        p = gates.flip(-1).cumsum(-1).flip(-1)  # (B, H, T, T), p_ij <= i - j + 1
        p = p.clamp(max=self.p["npos"] - 1)
        floor = p.detach().floor()
        w = p - floor  # differentiable in p, as in the reference
        # positions above t never occur (p_ij <= t), so their columns are not computed
        at_int = q @ self.emb[layer][:, : t + 1]  # (B, H, T, min(npos, T+1))
        lo = at_int.gather(-1, floor.long())
        hi = at_int.gather(-1, p.detach().ceil().long())
        return (content + lo * (1 - w) + hi * w) * self.qk_scale
