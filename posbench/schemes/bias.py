"""Bias schemes: a content-independent term b_h(i, j) added to the attention logits
(posbench/docs/schemes.md: t5, tupe, alibi, kerple, fire, sandwich). Each defines ``bias_fn(h, qpos, kpos)`` elementwise, so the same code
builds the (H, T, T) float mask and FlexAttention's score_mod."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from posbench.errors import PosbenchError
from posbench.schemes.absolute import Learned, hierarchical_table
from posbench.schemes.base import MAX_SIZE, Range, Scheme, between, frequency_base, non_negative, one_of, positive, size
from posbench.schemes.registry import register
from posbench.schemes.tables import position_count


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """Press et al.: for H a power of two, the geometric sequence starting at and with ratio
    2^(-8/H); otherwise the slopes of the nearest lower power of two, then every other slope of
    the set for twice that power, until H are taken."""

    def power_of_two(n: int) -> list[float]:
        start = 2 ** (-8 / n)
        return [start ** (i + 1) for i in range(n)]

    if math.log2(n_heads).is_integer():
        return torch.tensor(power_of_two(n_heads))
    lower = 2 ** math.floor(math.log2(n_heads))
    extra = power_of_two(2 * lower)[0::2][: n_heads - lower]
    return torch.tensor(power_of_two(lower) + extra)


@register
class ALiBi(Scheme):
    """Attention with linear biases (Press et al., ICLR 2022): s_ij - m_h (i - j), fixed slopes
    m_h (`alibi_slopes`), not scaled by 1/sqrt(D). No position is added to the embeddings."""

    name = "alibi"
    float_positions = True
    formula = "s_ij = q_i.k_j / sqrt(D) - m_h (i - j), m_h fixed geometric slopes (1/2 ... 1/256 for 8 heads)"
    family = "bias"
    relative = True
    hooks = ("bias",)
    reference = "Press et al. 2022, arXiv:2108.12409"

    def __init__(self, dims):
        super().__init__(dims)
        self.register_buffer("slopes", alibi_slopes(dims.n_heads), persistent=False)

    def bias_fn(self, h, qpos, kpos):
        return -self.slopes[h] * (qpos - kpos)


def t5_bucket(
    rel: torch.Tensor, bidirectional: bool, num_buckets: int, max_distance: int
) -> torch.Tensor:
    """T5's relative_position_bucket, rel = key position - query position: exact buckets below
    max_exact, log-spaced up to max_distance, then clipped (Raffel et al. 2020, mesh-tensorflow)."""
    n = -rel
    ret = torch.zeros_like(n)
    if bidirectional:
        num_buckets //= 2
        ret = ret + (n < 0).long() * num_buckets
        n = n.abs()
    else:
        n = n.clamp(min=0)
    max_exact = num_buckets // 2
    large = max_exact + (
        torch.log(n.float().clamp(min=1) / max_exact)
        / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    ).long()
    large = large.clamp(max=num_buckets - 1)
    return ret + torch.where(n < max_exact, n, large)


@register
class T5Bias(Scheme):
    """T5 relative bias (Raffel et al. 2020): s_ij + beta_h[bucket(i - j)], a learned scalar per
    head and bucket, shared by all layers, not scaled by 1/sqrt(D). One-directional buckets."""

    name = "t5"
    formula = ("s_ij = q_i.k_j / sqrt(D) + beta_h[bucket(i - j)]: exact buckets for short distances, "
               "log-spaced up to max_distance, one learned scalar per head and bucket")
    family = "bias"
    relative = True
    hooks = ("bias",)
    reference = "Raffel et al. 2020, arXiv:1910.10683"
    notes = "one-directional buckets (causal), shared by layers"
    defaults = {"num_buckets": 32, "max_distance": 128}
    ranges = {"num_buckets": between(2, MAX_SIZE), "max_distance": size}

    def __init__(self, dims):
        super().__init__(dims)
        self.table = nn.Parameter(torch.zeros(self.p["num_buckets"], dims.n_heads))

    def bias_fn(self, h, qpos, kpos):
        bucket = t5_bucket(kpos - qpos, False, self.p["num_buckets"], self.p["max_distance"])
        return self.table[bucket, h]

    def distance_bias(self, dist):
        bucket = t5_bucket(-dist, False, self.p["num_buckets"], self.p["max_distance"])
        return self.table.t()[:, bucket]  # (H, R)


def inverse_softplus(y: torch.Tensor) -> torch.Tensor:
    """x with softplus(x) = y, y > 0."""
    return y + torch.log(-torch.expm1(-y))


KERPLE_VARIANTS = ("log", "power")
# Sandwich's d': the model width, the head dimension, or an even number of dims
SINUSOID_WIDTH = Range("model, head or an even positive integer",
                       lambda v: v in ("model", "head") or (v.isdigit() and 0 < int(v) <= MAX_SIZE and int(v) % 2 == 0))


@register
class Kerple(Scheme):
    """KERPLE (Chi et al., NeurIPS 2022): a conditionally positive definite kernel of |i - j| as
    the bias, parameters learned per head and kept positive:
    - log (default):  b_h(i, j) = -r1_h log(1 + r2_h |i - j|)
    - power:          b_h(i, j) = -r1_h |i - j|^r2_h, 0 < r2_h <= 2
    Not scaled by 1/sqrt(D), shared by layers. Positivity by reparametrization:
    r = softplus(raw), and r2 = 2 sigmoid(raw) for the power exponent. Initial values as in the
    authors' code: log r1 ~ U(0, 2), r2 ~ U(0, 1); power r1 ~ U(0, 1), r2 ~ U(0, 2); each at
    least 0.01.
    """

    name = "kerple"
    formula = ("s_ij = q_i.k_j / sqrt(D) - r1_h log(1 + r2_h (i - j)) (log), or - r1_h (i - j)^r2_h (power);"
               " r1, r2 > 0 learned per head")
    family = "bias"
    relative = True
    hooks = ("bias",)
    reference = "Chi et al. 2022, arXiv:2205.09921"
    notes = "variant=log (default) or power; r1, r2 per head, shared by layers"
    defaults = {"variant": "log"}
    ranges = {"variant": one_of(*KERPLE_VARIANTS)}

    def __init__(self, dims):
        super().__init__(dims)
        self.variant = self.p["variant"]
        h = dims.n_heads
        if self.variant == "log":
            r1, r2 = torch.rand(h) * 2, torch.rand(h)
            raw2 = inverse_softplus(r2.clamp(min=0.01))
        else:
            r1, r2 = torch.rand(h), torch.rand(h) * 2
            raw2 = torch.logit(r2.clamp(0.01, 1.98) / 2)
        self.raw1 = nn.Parameter(inverse_softplus(r1.clamp(min=0.01)))
        self.raw2 = nn.Parameter(raw2)

    def coefficients(self) -> tuple[torch.Tensor, torch.Tensor]:
        """r1, r2, each (H,)."""
        r1 = F.softplus(self.raw1)
        if self.variant == "log":
            return r1, F.softplus(self.raw2)
        return r1, 2 * torch.sigmoid(self.raw2)

    def bias_fn(self, h, qpos, kpos):
        return self.flex_bias_fn()(h, qpos, kpos)

    def flex_bias_fn(self):
        r1, r2 = self.coefficients()  # outside the score_mod: each then indexed once

        def fn(h, qpos, kpos):
            d = (qpos - kpos).abs()
            if self.variant == "log":
                return -r1[h] * torch.log1p(r2[h] * d)
            # d^r2 at d = 0 is 0, but its gradient in r2 (0^r2 log 0) is not: keep d = 0 out of pow
            return -r1[h] * torch.where(d > 0, d.clamp(min=1) ** r2[h], 0.0)

        return fn


@register
class Fire(Scheme):
    """FIRE (Li et al., ICLR 2024): b_h(i, j) = f_theta(psi(i - j) / psi(max(L, i)))_h,
    psi(x) = log(c x + 1), f_theta: 1 -> width (ReLU) -> H an MLP, c and L learned; i the query
    position. Every key maps into [0, 1] (progressive interpolation), so longer windows reuse the
    trained input range; not translation-invariant, since the normalizer reads i.

    As in the authors' code: c enters as |c| (init 0.1), L as |s| * L0 with s learned (init 1)
    so its step size is O(1), psi takes |i - j| (masked pairs stay finite), and 1e-6 is added to
    the normalizer. L0 is train_len / 4 unless given (the paper's 512 at training length 2048).
    `bias_fn` writes the MLP as elementwise operations over its hidden units, as FlexAttention's
    score_mod needs; `bias` materializes (H, T, T) with the same MLP as a matmul.
    """

    name = "fire"
    formula = ("s_ij = q_i.k_j / sqrt(D) + f(psi(i - j) / psi(max(L, i)))_h, psi(x) = log(c x + 1), f an MLP"
               " to H outputs; c, L learned")
    family = "bias"
    hooks = ("bias",)
    reference = "Li et al. 2024, arXiv:2310.04418"
    notes = "MLP width 32; c, L learned (L starts at train_len/4 unless L > 0); shared by layers"
    defaults = {"width": 32, "c": 0.1, "L": 0.0}
    ranges = {"width": size, "c": positive, "L": non_negative}  # L 0: train_len / 4
    activation = staticmethod(F.relu)  # the MLP's hidden units

    def __init__(self, dims):
        super().__init__(dims)
        width = self.p["width"]
        self.L0 = self.p["L"] or dims.train_len / 4
        # shape (1,), not 0-dim: FlexAttention cannot capture a learnable 0-dim tensor
        self.c = nn.Parameter(torch.tensor([self.p["c"]]))
        self.L_scale = nn.Parameter(torch.tensor([1.0]))
        first, second = nn.Linear(1, width), nn.Linear(width, dims.n_heads)  # their default init
        self.w1 = nn.Parameter(first.weight.detach()[:, 0].clone())  # (width,)
        self.b1 = nn.Parameter(first.bias.detach().clone())  # (width,)
        self.w2 = nn.Parameter(second.weight.detach().clone())  # (H, width)
        self.b2 = nn.Parameter(second.bias.detach().clone())  # (H,)

    def normalized(self, qpos, kpos) -> torch.Tensor:
        """psi(|i - j|) / psi(max(L, i)), in [0, 1] for j <= i."""
        c = self.c[0].abs()
        threshold = self.L_scale[0].abs() * self.L0
        rel = torch.log(c * (qpos - kpos).abs() + 1)
        norm = torch.log(c * torch.maximum(qpos.float(), threshold) + 1) + 1e-6
        return rel / norm

    def bias_fn(self, h, qpos, kpos):
        return self.flex_bias_fn()(h, qpos, kpos)

    def flex_bias_fn(self):
        # one tensor per hidden unit and weight, each indexed once in the score_mod; copies, not
        # views: FlexAttention's compiled backward drops the gradient of a captured view
        units = [(self.w1[u: u + 1].clone(), self.b1[u: u + 1].clone(), self.w2[:, u].clone())
                 for u in range(self.p["width"])]

        def fn(h, qpos, kpos):
            x = self.normalized(qpos, kpos)
            out = self.b2[h]
            for w1, b1, w2 in units:
                out = out + w2[h] * self.activation(w1[0] * x + b1[0])
            return out

        return fn

    def bias(self, pos, ctx=None):
        """(H, T, T): the same MLP as a matmul, over blocks of query rows to bound memory."""
        t = pos.shape[0]
        rows = max(1, 2**22 // (t * self.p["width"]))
        blocks = []
        for qpos in pos.split(rows):
            x = self.normalized(qpos[:, None], pos[None, :])  # (r, T)
            hidden = self.activation(F.linear(x[..., None], self.w1[:, None], self.b1))  # (r, T, width)
            blocks.append(F.linear(hidden, self.w2, self.b2))  # (r, T, H)
        return torch.cat(blocks).permute(2, 0, 1)


@register
class Sandwich(Scheme):
    """Sandwich (Chi et al., ACL 2023): the inner product of two sinusoidal embeddings of width
    d', minus its value at distance 0, scaled per head; parameter-free:
    b_h(i, j) = (sum_{t < d'/2} cos((i - j) / 10000^(2t/d')) - d'/2) / (8h / H), h = 1..H.
    `dim` chooses d': `model` (default) the model width, as the paper's formula reads; `head`
    the head dimension, as NeMo's implementation (its hidden size is the attention head size),
    a bias H times gentler at small distances; or an even integer. Each term is summed as
    cos(x) - 1 = -2 sin^2(x/2), which avoids the cancellation of subtracting d'/2 in float32.
    `bias_fn` (elementwise, for score_mod) loops over the d'/2 frequencies; `bias` evaluates the
    same sum once per distinct |i - j| and gathers it into (H, T, T).
    """

    name = "sandwich"
    formula = "s_ij = q_i.k_j / sqrt(D) + (sum_{t<d'/2} cos((i - j) / 10000^(2t/d')) - d'/2) / (8h/H)"
    family = "bias"
    relative = True
    hooks = ("bias",)
    reference = "Chi et al. 2023, arXiv:2212.10356"
    notes = "parameter-free; d' = dim: model width (default), head (NeMo's choice) or an even integer"
    defaults = {"dim": "model", "base": 10000.0}
    ranges = {"dim": SINUSOID_WIDTH, "base": frequency_base}

    def __init__(self, dims):
        super().__init__(dims)
        dim = self.sinusoid_width(self.p["dim"], dims)
        self.freqs = [self.p["base"] ** (-2 * t / dim) for t in range(dim // 2)]
        # 1 / (8h / H), h = 1..H
        scale = [dims.n_heads / (8 * (h + 1)) for h in range(dims.n_heads)]
        self.register_buffer("scale", torch.tensor(scale), persistent=False)

    def sinusoid_width(self, dim: str, dims) -> int:
        """d' from the `dim` parameter: model, head or an even positive integer (`SINUSOID_WIDTH`)."""
        width = {"model": dims.d_model, "head": dims.head_dim}.get(dim) or int(dim)
        if width % 2:
            raise PosbenchError(f"{self.name}: dim={dim} is {width} dims, an odd number (sinusoids come in pairs)")
        return width

    def bias_fn(self, h, qpos, kpos):
        rel = (qpos - kpos).float()
        acc = torch.zeros_like(rel)
        for w in self.freqs:
            acc = acc - 2 * torch.sin(rel * (w / 2)) ** 2
        return acc * self.scale[h]

    def bias(self, pos, ctx=None):
        dist = (pos[:, None] - pos[None, :]).abs()  # (T, T)
        rows = position_count(dist, self.position_bound)  # every |i - j| is below the bound
        offsets = torch.arange(rows, device=pos.device, dtype=torch.float64)
        freqs = torch.tensor(self.freqs, dtype=torch.float64, device=pos.device)
        row = (-2 * torch.sin(offsets[:, None] * freqs / 2) ** 2).sum(-1)  # (max |i - j| + 1,)
        return (self.scale[:, None] * row.float())[:, dist]  # (H, T, T)


@register
class Tupe(Scheme):
    """TUPE (Ke et al., ICLR 2021): untied positional attention. Per head,
    s_ij = (x_i W_Q).(x_j W_K) / sqrt(2D) + (p_i U_Q).(p_j U_K) / sqrt(2D) + b_h[bucket(j - i)],
    p a learned absolute table (max_len, d) with its own projections U_Q, U_K (d, d), computed
    once per forward and shared by layers, b the T5 bucket bias (`t5_bucket`, one-directional).

    `prepare` projects the positions to pu, pk (H, T, D); `rotate` appends them to q and k
    (q' = [q, pu], k' = [k, pk], (B, H, T, 2D)) and `qk_scale` is 1/sqrt(2D), so q'.k' scaled is
    the first two terms exactly; `bias_fn` is the third. Like `learned`, the table has no row past
    max_len; the `hierarchical` extension (`hierarchical_table`) reaches max_len^2. The paper's
    untied [CLS] terms have no counterpart in a causal decoder.
    """

    name = "tupe"
    formula = ("s_ij = (x_i W_Q).(x_j W_K) / sqrt(2D) + (p_i U_Q).(p_j U_K) / sqrt(2D) + b_h[bucket(i - j)],"
               " p a learned table")
    family = "bias"
    hooks = ("qk", "bias")
    reference = "Ke et al. 2021, arXiv:2006.15595"
    extrapolates = "extension"
    notes = (
        "absolute table as `learned` (beyond max_len: unsupported, or hierarchical); T5 buckets "
        "one-directional; all shared by layers; no [CLS] untying"
    )
    extensions = ("hierarchical",)
    defaults = {"max_len": 0, "alpha": 0.4, "num_buckets": 32, "max_distance": 128}
    ranges = {**Learned.ranges, **T5Bias.ranges}

    def __init__(self, dims):
        super().__init__(dims)
        d = dims.d_model
        self.n = self.p["max_len"] or dims.max_position
        # the scales of the content path: unit-variance rows like the token table, projections
        # initialized like the model's W_Q, W_K
        self.table = nn.Parameter(torch.randn(self.n, d))
        self.u_q = nn.Parameter(torch.randn(d, d) * 0.02)
        self.u_k = nn.Parameter(torch.randn(d, d) * 0.02)
        self.buckets = nn.Parameter(torch.zeros(self.p["num_buckets"], dims.n_heads))

    @property
    def qk_scale(self) -> float:
        return 1.0 / math.sqrt(2 * self.head_dim)

    def position_limit(self):
        return self.n**2 if self.extension == "hierarchical" else self.n

    def prepare(self, pos):
        table = self.table
        if self.extension == "hierarchical":
            table = hierarchical_table(table, self.p["alpha"])
        p = table[pos]  # (T, d)
        t = pos.shape[0]
        pu = (p @ self.u_q).view(t, self.n_heads, self.head_dim).transpose(0, 1)  # (H, T, D)
        pk = (p @ self.u_k).view(t, self.n_heads, self.head_dim).transpose(0, 1)
        return pu, pk

    def rotate(self, q, k, pos, ctx, layer):
        pu, pk = ctx
        b = q.shape[0]
        q = torch.cat([q, pu.to(q.dtype).expand(b, -1, -1, -1)], dim=-1)  # (B, H, T, 2D)
        k = torch.cat([k, pk.to(k.dtype).expand(b, -1, -1, -1)], dim=-1)
        return q, k

    def bias_fn(self, h, qpos, kpos):
        bucket = t5_bucket(kpos - qpos, False, self.p["num_buckets"], self.p["max_distance"])
        return self.buckets[bucket, h]

    def distance_bias(self, dist):
        bucket = t5_bucket(-dist, False, self.p["num_buckets"], self.p["max_distance"])
        return self.buckets.t()[:, bucket]  # (H, R)
