"""Rotary schemes beyond RoPE's own family (posbench/docs/schemes.md: pope, fope, xpos, grape,
selective-rope, accum-rope, repo): phases, Fourier series, decay, learned or content-driven angles
on RoPE's planes. Half-split pairs as in posbench.schemes.rotary.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from posbench.errors import PosbenchError
from posbench import policies
from posbench.policies.frequencies import rope_frequencies
from posbench.policies.rotation import rotate_half
from posbench.schemes.base import Scheme, at_least, between, frequency_base, positive, size
from posbench.schemes.registry import register
from posbench.schemes.rotary import angle_table, share


@register
class PoPE(Scheme):
    """PoPE, polar coordinate position embedding (Gopalakrishnan, Csordas, Schmidhuber, Mozer
    2025, "Decoupling the 'What' and 'Where' With Polar Coordinate Positional Embeddings"): the
    content sets the magnitudes, the position the phases. Each of the D elements of a head has
    its own frequency theta_c = base^(-c/D), c = 0..D-1 (the paper's theta^((c-1)/d) lost the
    minus sign; both reference codes use base^(-c/D)). For a query at t and a key at s:

        q' = [softplus(q) cos(t theta), softplus(q) sin(t theta)]                 (B, H, T, 2D)
        k' = [softplus(k) cos(s theta + delta), softplus(k) sin(s theta + delta)]

    so q'.k' / sqrt(D) = sum_c softplus(q_c) softplus(k_c) cos((s - t) theta_c + delta_c) /
    sqrt(D), with D the head dim before doubling (x-transformers `apply_polar_pos_emb` and
    PoPE-pytorch scale so; the paper is silent); v keeps D. delta (L, H, D): a learned phase
    offset of the keys per layer and head, clamped to [-2 pi, 0] in every forward, 0 at init
    (the paper: zero init extrapolates, U(-2 pi, 0) is slightly better in distribution); one per
    layer, as the paper plots (Figs. 7-8), where x-transformers shares one across layers. As the
    references, magnitudes and phases in float32, then cast back.

    delta takes no weight decay, though (L, H, D): it is a bias of the phase (the paper's
    "learnable bias", x-transformers' `bias`), and posbench keeps biases out of decay, as it does
    the gate biases. The authors' training code is not public; PoPE-pytorch's enwik8 trainer decays
    every parameter alike (AdamW's default 0.01 on norms and biases too), which says nothing about
    delta in particular. Decay would pull delta toward 0, one end of its clamp, a preference the
    paper does not describe. Revision 2 (delta undecayed) enters the run_id.

    Path: sdpa-causal. On CUDA, SDPA takes its memory-efficient kernel: flash needs q, k and v of
    one head dim, and here q, k are 2D wide."""

    name = "pope"
    float_positions = True
    formula = ("s_ij = sum_c softplus(q_c) softplus(k_c) cos((j - i) theta_c + delta_c) / sqrt(D), theta_c ="
               " base^(-c/D), delta learned in [-2 pi, 0]")
    family = "rotary"
    relative = True
    hooks = ("qk",)
    reference = "Gopalakrishnan et al. 2025, arXiv:2509.10534 (lucidrains/x-transformers PolarEmbedding)"
    notes = ("softplus magnitudes, phases at base^(-c/D) per element plus a learned key offset "
             "per layer and head in [-2 pi, 0], a bias: no weight decay; q, k 2D wide, v D")
    defaults = {"base": 10000.0}
    ranges = {"base": frequency_base}
    no_weight_decay = ("phase",)
    revision = 2  # 2: the phase offset out of weight decay

    def __init__(self, dims):
        super().__init__(dims)
        d = self.head_dim
        self.table = angle_table(self.p["base"] ** -(torch.arange(d, dtype=torch.float64) / d))
        self.phase = nn.Parameter(torch.zeros(dims.n_layers, dims.n_heads, d))

    def prepare(self, pos):
        cos_sin = self.table(pos, self.position_bound)  # (T, 2, D)
        return cos_sin[:, 0], cos_sin[:, 1]

    def rotate(self, q, k, pos, ctx, layer):
        cos, sin = ctx  # (T, D): the phases t theta
        delta = self.phase[layer].clamp(-2 * math.pi, 0)[:, None]  # (H, 1, D)
        # cos and sin of s theta + delta by the angle-sum identities, so the float64-built table
        # keeps large s theta exact and delta still gets its gradient
        k_cos = cos * delta.cos() - sin * delta.sin()  # (H, T, D)
        k_sin = sin * delta.cos() + cos * delta.sin()
        mq, mk = F.softplus(q.float()), F.softplus(k.float())  # (B, H, T, D)
        q2 = torch.cat([mq * cos, mq * sin], dim=-1)  # (B, H, T, 2D)
        k2 = torch.cat([mk * k_cos, mk * k_sin], dim=-1)
        return q2.to(q.dtype), k2.to(k.dtype)


MAX_SIGMA = 10  # FoPE's coefficient gain; the reference's lie in 0.3-0.6, and far past 10 the logits overflow


def fourier_coefficients(shape: tuple[int, int, int, int], gain: float) -> torch.Tensor:
    """(L, H, M, d_out) FoPE coefficients: per layer xavier_normal over (H, M, d_out), as the
    reference initializes each layer's tensor (fan_in M d_out, fan_out H d_out), plus the
    step identity E[m ceil(M / d_out), m] = 1."""
    coef = torch.zeros(shape)
    m, series = shape[2:]
    if coef.numel() == 0:
        return coef
    for layer in coef:
        nn.init.xavier_normal_(layer, gain=gain)
    step = math.ceil(m / series)
    cols = torch.arange(series)
    rows = cols * step
    keep = rows < m
    coef[:, :, rows[keep], cols[keep]] += 1.0
    return coef


@register
class FoPE(Scheme):
    """FoPE, Fourier position embedding (Hua et al., ICML 2025, "Fourier Position Embedding:
    Enhancing Attention's Periodic Extension for Length Generalization"): each RoPE pair carries
    a Fourier series over the head's frequencies instead of one frequency, and the frequencies
    too slow to turn once in a training window are dropped.

    omega_k = base^(-2k/D); those below 2 pi / L (L = train_len) are set to 0 and dropped, M kept,
    and d_out = min(M, D/4) series. Per layer and head fixed coefficients A^c, A^s (M, d_out):
    C_m(n) = sum_k A^c[k, m] cos(omega_k n), S_m(n) = sum_k A^s[k, m] sin(omega_k n), m < d_out;
    channels d_out..D/2-1 get C = S = 1 (the reference pads both with 1: position-free, not the
    identity). q' = q [C, C] + rotate_half(q) [S, S] (half-split: pair m of q becomes
    (q_m C_m - q_{m+D/2} S_m, q_{m+D/2} C_m + q_m S_m)); k likewise. D = 64, L = 512: M = 16 of 32,
    d_out = 16; L = 1024: M = 18, d_out = 16.

    As `FourierEmbedding` in TsinghuaC3I/Fourier-Position-Embedding (`olmo/model.py`, configs
    `c4/length-512/ce-fourier`): `fourier_learnable = False`, so the coefficients are buffers,
    random and saved with the model, never trained; each layer's (H, M, d_out) is
    xavier_normal with gain `sigma`, plus E (I when M = d_out, else 1 at [m ceil(M/d_out), m]
    while that row is < M). sigma is 0.3 / 0.4 / 0.6 for 60M / 180M / 1.2B there; posbench takes
    0.3, the smallest. `floor=false`: no frequency dropped, M = d_out = D/2 (the reference
    without its floor clamp and `fourier_ignore_zero`); with sigma = 0 that is `rope` exactly.

    Not translation-invariant: A^c != A^s, so q'.k' reads n and m, not n - m only. Path:
    sdpa-causal (flash on CUDA)."""

    name = "fope"
    float_positions = True
    formula = ("pair m of q at n becomes (q_m C_m(n) - q_{m+D/2} S_m(n), q_{m+D/2} C_m(n) + q_m S_m(n)), C_m"
               " = sum_k A^c_km cos(omega_k n), S_m = sum_k A^s_km sin(omega_k n), A fixed random, omega_k <"
               " 2 pi / L dropped")
    family = "rotary"
    hooks = ("qk",)
    reference = "Hua et al., ICML 2025, arXiv:2412.17739 (TsinghuaC3I/Fourier-Position-Embedding)"
    notes = ("RoPE pairs as Fourier series with fixed random coefficients per layer and head; "
             "frequencies below 2 pi/train_len dropped, min(M, D/4) series, the rest padded with 1")
    defaults = {"base": 10000.0, "sigma": 0.3, "floor": True}
    ranges = {"base": frequency_base, "sigma": between(0, MAX_SIGMA)}

    def __init__(self, dims):
        super().__init__(dims)
        d = self.head_dim
        if d % 2:
            raise PosbenchError(f"{self.name} needs an even head dimension, got {d}")
        inv = self.p["base"] ** -(torch.arange(0, d, 2, dtype=torch.float64) / d)
        if self.p["floor"]:
            inv = inv[inv >= 2 * math.pi / dims.train_len]
            series = min(len(inv), d // 4)
        else:
            series = d // 2
        self.table = angle_table(inv)
        shape = (dims.n_layers, dims.n_heads, len(inv), series)
        self.register_buffer("cos_coef", fourier_coefficients(shape, self.p["sigma"]))
        self.register_buffer("sin_coef", fourier_coefficients(shape, self.p["sigma"]))

    def prepare(self, pos):
        cos_sin = self.table(pos, self.position_bound)  # (T, 2, M)
        return cos_sin[:, 0], cos_sin[:, 1]

    def series(self, ctx, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """C and S (H, T, D/2) of one layer, padded with 1 past d_out."""
        cos, sin = ctx
        c = torch.einsum("tk,hkm->htm", cos, self.cos_coef[layer])  # (H, T, d_out)
        s = torch.einsum("tk,hkm->htm", sin, self.sin_coef[layer])
        pad = self.head_dim // 2 - c.shape[-1]
        return F.pad(c, (0, pad), value=1.0), F.pad(s, (0, pad), value=1.0)

    def rotate(self, q, k, pos, ctx, layer):
        c, s = (t.to(q.dtype) for t in self.series(ctx, layer))
        return rotate_half(q, c, s), rotate_half(k, c, s)


def xpos_zeta(dim: int) -> torch.Tensor:
    """(dim/2,) float64 per-pair decay base zeta_t = (2t/dim + 0.4) / 1.4 (Sun et al. 2022)."""
    return (torch.arange(0, dim, 2, dtype=torch.float64) / dim + 0.4) / 1.4


@register
class XPos(Scheme):
    """xPos (Sun et al. 2022, "A Length-Extrapolatable Transformer"): RoPE times a per-pair
    exponential decay. Pair t of q at position m is rotated by m * theta_t and scaled by
    zeta_t^((m - c)/gamma), pair t of k at n rotated by n * theta_t and scaled by
    zeta_t^(-(n - c)/gamma), so pair t of the logit carries zeta_t^((m - n)/gamma) < 1: distant
    keys are damped. c, the integer midpoint of the window's positions, keeps both powers finite
    and cancels in every logit. q, k (B, H, T, D); half-split pairs as in `RoPE`.
    """

    name = "xpos"
    float_positions = True
    formula = ("rope with pair t of q at m scaled by zeta_t^(m/gamma) and of k at n by zeta_t^(-n/gamma), so"
               " the logit carries zeta_t^((m - n)/gamma), zeta_t = (2t/D + 0.4) / 1.4")
    family = "rotary"
    relative = True
    hooks = ("qk",)
    reference = "Sun et al. 2022, arXiv:2212.10554"
    extrapolates = "yes"
    notes = "half-split (NeoX) pairs; decay zeta^((m-n)/gamma), centred on the window midpoint"
    defaults = {"base": 10000.0, "gamma": 512.0}
    ranges = {"base": frequency_base, "gamma": at_least(1)}

    def __init__(self, dims):
        super().__init__(dims)
        if self.head_dim % 2:
            raise PosbenchError(f"{self.name} needs an even head dimension, got {self.head_dim}")
        inv, _ = rope_frequencies(self.head_dim, self.p["base"], dims.train_len, policies.make(), 0)
        self.table = angle_table(inv)

    def prepare(self, pos):
        cos_sin = self.table(pos, self.position_bound)  # (T, 2, D/2)
        centre = (pos.min() + pos.max()) // 2
        zeta = xpos_zeta(self.head_dim).to(pos.device)
        scale = zeta ** ((pos - centre).double()[:, None] / self.p["gamma"])  # (T, D/2)
        return cos_sin[:, 0], cos_sin[:, 1], scale.float()

    def rotate(self, q, k, pos, ctx, layer):
        cos, sin, scale = (t.to(q.dtype) for t in ctx)
        # rotate_half is linear in (cos, sin): scaling both scales the rotated pair
        return rotate_half(q, cos * scale, sin * scale), rotate_half(k, cos / scale, sin / scale)


@register
class GRAPE(Scheme):
    """Multiplicative GRAPE (Zhang et al., ICLR 2026, "Group Representational Position Encoding"):
    position n acts on q and k by G(n) = exp(n omega L) in SO(D), L = a b^T - b a^T a rank-2
    skew generator, exp(theta L) = I + sin(theta) L + (1 - cos(theta)) L^2 for orthonormal a, b
    (the Rodrigues form). With D/2 commuting generators on the canonical planes, here
    (a_t, b_t) = (e_{t+D/2}, e_t) (half-split pairs), G(n) = prod_t exp(n omega_t L_t) turns
    pair t by n omega_t, and q_m^T G(m)^T G(n) k_n = q_m^T G(n - m) k_n: the relative law.

    As the reference's `MSGRAPECommuting` (model-architectures/GRAPE
    `model/llama-mha-grape-m-nonctx.py`): omega_t learned, kept positive as exp(w_t / c), w_t
    starting at c log(base^(-2t/D)), RoPE's spectrum; c = `lr_scale` (its grape_log_freq_scale,
    16) slows the frequencies' learning by c; one spectrum shared by the heads (`per_head=true`:
    one per head, (H, D/2)); angles n omega_t in float32. The reference's planes are (e_t,
    e_{t+D/2}), which turns each pair the other way: the same model up to the sign of the second
    half of q and k. With `learn=false` the frequencies stay RoPE's and grape is `rope`.

    Not here: the paper's learned (non-canonical) planes and non-commuting mixtures, which its
    code does not implement, and its contextual variant (grape-m-ctx). The reference model also
    applies a learnable RMSNorm to q and k (use_qk_rmsnorm) and decays the frequencies (weight
    decay 0.01 on every tensor but the norms'); the model here is the one every scheme shares, and
    the frequencies take no weight decay. q, k (B, H, T, D). Path: sdpa-causal (flash on CUDA)."""

    name = "grape"
    formula = ("q, k at n multiplied by G(n) = exp(n sum_t omega_t L_t), L_t rank-2 skew generators on the "
               "rotary planes: pair t turned by n omega_t, omega_t = exp(w_t / c) learned")
    family = "rotary"
    relative = True
    hooks = ("qk",)
    reference = "Zhang et al., ICLR 2026, arXiv:2512.07805 (model-architectures/GRAPE)"
    notes = ("G(n) = exp(n omega L), rank-2 skew generators on RoPE's planes: pairs turned by "
             "n omega_t, omega_t = exp(w_t / c) learned from RoPE's spectrum")
    defaults = {"base": 10000.0, "learn": True, "per_head": False, "lr_scale": 16.0}
    ranges = {"base": frequency_base, "lr_scale": positive}
    no_weight_decay = ("log_freq",)

    def __init__(self, dims):
        super().__init__(dims)
        if self.head_dim % 2:
            raise PosbenchError(f"{self.name} needs an even head dimension, got {self.head_dim}")
        inv = self.p["base"] ** -(torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim)
        init = inv.log() * self.p["lr_scale"]  # (D/2,)
        if self.p["per_head"]:
            init = init.repeat(dims.n_heads, 1)  # (H, D/2)
        if self.p["learn"]:
            self.log_freq = nn.Parameter(init)
        else:
            self.register_buffer("log_freq", init)

    def prepare(self, pos):
        freq = torch.exp(self.log_freq.float() / self.p["lr_scale"])  # (D/2,) or (H, D/2)
        angle = pos.float()[:, None] * freq[..., None, :]  # (T, D/2) or (H, T, D/2)
        return angle.cos(), angle.sin()

    def rotate(self, q, k, pos, ctx, layer):
        cos, sin = (t.to(q.dtype) for t in ctx)
        return rotate_half(q, cos, sin), rotate_half(k, cos, sin)


@register
class SelectiveRoPE(Scheme):
    """Selective RoPE (Movahedi, Carstensen et al., ICLR 2026, "Selective Rotary Position
    Embedding"; timurcarstensen/selective-rope): rotation angles that depend on the input. Per
    layer, from its input x_t (after the norm), split into H chunks each scaled to unit length:

        phi_t   = conv_K(U V x^_t)           (B, T, H, P), P = D/2; V (r, d), U (H P, r): a
                                             low-rank map, conv_K a causal depthwise convolution
                                             of K taps over time
        Phi_t   = sum_{s <= t} phi_s          (a cumulative phase per head and pair)
        angle   = theta_p Phi_t,  theta_p = base^(-2p/D)

    and pair p of q_t and of k_t is turned by angle_{t,p} (half-split, as `rope`). The angles
    read the content only, never a position index; a token adds phi_t to every later angle, so
    q_i.k_j turns by theta (Phi_i - Phi_j), the phases of the tokens between them. With `bias`,
    phi_t + exp(beta) (beta (H, P), 0 at init): with the maps at zero every phi is 1, Phi_t = t + 1,
    and the scheme is `rope` with this base.

    As the reference's `SelectiveRoPE` (src/selective_rope/modules/rotary.py) with its language-
    modelling settings (configs/language_modeling/model/position_embedding/selective_rope.yaml):
    low-rank phi (phi_proj_rank 32), the short convolution (4 taps, no bias, no activation), the
    fixed RoPE-type temperature with theta 500000 and temp_max 1, no bias, no phase gate; the
    reference's torch path (not its Triton kernel), angles and rotations in float32; weights
    N(0, 0.02) as its initializer_range (Linear and Conv1d alike). Not here: the phase gate and
    the "rfa" temperature, off in those settings.

    Parameters per layer, stacked (L, ...), shared by the layers that use the scheme. Path:
    sdpa-causal (the content hook feeds the rotation, not the logits)."""

    name = "selective-rope"
    formula = ("rope with angle theta_p Phi_t in place of t theta_p, Phi_t = sum_{s<=t} phi_s, phi = causal "
               "conv of a low-rank map of the layer's input")
    family = "rotary"
    relative = True
    takes_positions = False
    hooks = ("content", "qk")
    reference = ("Movahedi, Carstensen et al., ICLR 2026, openreview.net/forum?id=AQo1SEElNb "
                 "(timurcarstensen/selective-rope)")
    notes = ("angles theta_p sum_{s<=t} phi_s, phi = causal conv of a low-rank map of the layer's "
             "input: input-dependent rotations; theta base 5e5")
    defaults = {"base": 500000.0, "rank": 32, "conv": 4, "bias": False}
    ranges = {"base": frequency_base, "rank": size, "conv": size}
    no_weight_decay = ("phi_bias",)

    def __init__(self, dims):
        super().__init__(dims)
        if self.head_dim % 2:
            raise PosbenchError(f"{self.name} needs an even head dimension, got {self.head_dim}")
        layers, heads, d = dims.n_layers, dims.n_heads, dims.d_model
        pairs = self.head_dim // 2
        self.down = nn.Parameter(torch.randn(layers, self.p["rank"], d) * 0.02)
        self.up = nn.Parameter(torch.randn(layers, heads * pairs, self.p["rank"]) * 0.02)
        self.conv_weight = nn.Parameter(torch.randn(layers, heads * pairs, self.p["conv"]) * 0.02)
        if self.p["bias"]:
            self.phi_bias = nn.Parameter(torch.zeros(layers, heads, pairs))
        theta = self.p["base"] ** -(torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim)
        self.register_buffer("theta", theta, persistent=False)  # (P,)

    def undecayed(self):
        return [self.phi_bias] if self.p["bias"] else []

    def content(self, x, layer):
        """x (B, T, d) -> cos, sin (B, H, T, P) of this layer's angles, float32."""
        b, t, d = x.shape
        chunks = x.float().view(b, t, self.n_heads, -1)
        unit = chunks * torch.rsqrt(chunks.pow(2).sum(-1, keepdim=True) + 1e-6)  # fla's l2_norm
        phi = unit.view(b, t, d) @ self.down[layer].T @ self.up[layer].T  # (B, T, H P)
        taps = self.p["conv"]
        phi = F.conv1d(phi.transpose(1, 2), self.conv_weight[layer][:, None, :], padding=taps - 1,
                       groups=phi.shape[-1])[..., :t]  # (B, H P, T): causal, tap K-1 on token t
        phi = phi.view(b, self.n_heads, -1, t)  # (B, H, P, T)
        if self.p["bias"]:
            phi = phi + self.phi_bias[layer].exp()[..., None]
        angle = (phi.cumsum(-1) * self.theta[:, None]).transpose(-1, -2)  # (B, H, T, P)
        return angle.cos(), angle.sin()

    def rotate(self, q, k, pos, ctx, layer, content):
        cos, sin = content
        return rotate_half(q.float(), cos, sin).to(q.dtype), rotate_half(k.float(), cos, sin).to(k.dtype)


STEP_INIT = math.log(math.e - 1)  # softplus(b) = 1: every step one position, RoPE's angles


@register
class AccumRoPE(Scheme):
    """Accumulated-angle RoPE (arXiv 2606.24975): RoPE whose angles are running sums of angles
    each token contributes, a simpler relative of PaTH (`path`), where a token contributes a
    rotation of RoPE's planes instead of a Householder step. Per layer and head, token t adds

        delta_{t,h} = softplus(w_h . x_t + b_h)       x_t the layer's input (after the norm)
        Phi_{t,h,p} = theta_p sum_{s <= t} delta_{s,h},   theta_p = base^(-2p/D)

    and pair p of q_t and k_t turns by Phi_{t,h,p} (half-split, as `rope`), so q_i.k_j turns by
    theta_p sum_{j < s <= i} delta_s: the steps of the tokens after the key up to the query. With
    `values` (the paper rotates the values too), v_j turns by Phi_j and the head's output o_i back
    by -Phi_i: o_i = sum_j a_ij R(Phi_j - Phi_i) v_j, each value read through the angle between
    it and the query, as the logit is. With w = 0 and b = softplus^-1(1) every step is 1,
    Phi_t = (t + 1) theta_p, and the logits are `rope`'s. The step's parametrization (a scalar per
    head and token, softplus of a linear map of the layer input) is posbench's: the paper's full
    text was not available here and it publishes no code, so the tests check the formula above by
    hand-computed numbers, not numbers of a reference.

    No position index is read: outputs are unchanged under any shift of positions, and past the
    training length the angles keep growing by the tokens' own steps. Steps, cumulative sums and
    rotations in float32; w (L, H, d) N(0, 0.02), b (L, H) at softplus^-1(1), one per layer and
    head, undecayed. The value rotation is linear in v and in the head's output, so every
    attention path serves (sdpa-causal, flash on CUDA). q, k, v (B, H, T, D)."""

    name = "accum-rope"
    formula = ("pair p of q_t, k_t turned by Phi_t = theta_p sum_{s<=t} delta_s, delta_s = softplus(w_h . x_s + b_h); "
               "values: v_j turned by Phi_j, the output o_i back by -Phi_i")
    family = "rotary"
    relative = True
    takes_positions = False
    hooks = ("content", "qk", "vo")
    reference = "Accumulated-angle RoPE, arXiv:2606.24975"
    notes = ("RoPE angles as running sums of per-token steps softplus(w.x + b) per layer and head (1 at "
             "init: rope); values=true also turns v by its angle and the output back by the query's; "
             "the step's form is posbench's (no public code)")
    defaults = {"base": 10000.0, "values": True}
    ranges = {"base": frequency_base}
    no_weight_decay = ("step_bias",)

    def __init__(self, dims):
        super().__init__(dims)
        if self.head_dim % 2:
            raise PosbenchError(f"{self.name} needs an even head dimension, got {self.head_dim}")
        self.step_weight = nn.Parameter(torch.randn(dims.n_layers, dims.n_heads, dims.d_model) * 0.02)
        self.step_bias = nn.Parameter(torch.full((dims.n_layers, dims.n_heads), STEP_INIT))
        theta = self.p["base"] ** -(torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim)
        self.register_buffer("theta", theta, persistent=False)  # (D/2,)
        if not self.p["values"]:
            self.hooks = ("content", "qk")

    def content(self, x, layer):
        """x (B, T, d) -> cos, sin (B, H, T, D/2) of this layer's accumulated angles, float32."""
        step = F.softplus(x.float() @ self.step_weight[layer].T + self.step_bias[layer])  # (B, T, H)
        total = step.cumsum(1).transpose(1, 2)  # (B, H, T)
        angle = total[..., None] * self.theta  # (B, H, T, D/2)
        return angle.cos(), angle.sin()

    def rotate(self, q, k, pos, ctx, layer, content):
        cos, sin = content
        return rotate_half(q.float(), cos, sin).to(q.dtype), rotate_half(k.float(), cos, sin).to(k.dtype)

    def turn_values(self, v, pos, ctx, layer, content):
        cos, sin = content
        return rotate_half(v.float(), cos, sin).to(v.dtype)

    def turn_output(self, y, pos, ctx, layer, content):
        cos, sin = content
        return rotate_half(y.float(), cos, -sin).to(y.dtype)


REPO_WIDTH = 8  # d_p = d / 8: the reference's mid_size (hidden_size // 8)
REPO_INIT_STD = 0.02  # the reference's init_std, truncated at 3 std (init_cutoff_factor 3)


@register
class RePo(Scheme):
    """RePo, context re-positioning (Li, Zhao, Sproat, ICML 2026, "RePo: Language Models with
    Context Re-Positioning"; SakanaAI/repo): a small learned module gives every token a real
    position from its hidden state, per head, and RoPE turns q and k by those positions. In a
    layer that uses it, with h_t the layer's attention input:

        r_t   = SiLU(W_g h_t) * (W_c h_t)          W_g, W_c (d_p, d), d_p = d / 8 (a SwiGLU)
        z_t,h = w_h . r_t                          W_z (H, d_p): one position per head and token
        pair p of q_t and of k_t (head h) turned by z_t,h theta_p,  theta_p = base^(-2p/D)

    so q_i.k_j turns by theta_p (z_i - z_j): the distance between the two tokens' assigned
    positions. The positions are the module's raw outputs: no cumulative sum, no sorting, no
    integer index added; they may be negative, repeat, or run backwards. A module of all zeros
    puts every token at 0 (NoPE); one that gave z_t = t would be `rope`.

    As the reference's `swigluex_multihead` mode (OLMo/olmo/model.py, `OLMoSequentialBlock.
    dynamic_position_encoding_swigluex_multihead`; its configs/official-0425/OLMo2-1B-stage2-seed42-
    SEXMH-L5.yaml): gate_map, content_map d -> d/8 and final_map d/8 -> H, no biases, weights
    truncated N(0, 0.02) (cut at 3 std) and decayed like every other matrix; one module per layer;
    angles z theta in float32 (its `from_positions`), q and k turned in float32. Its first layers
    keep integer positions (dynamic_pe_start_layer 5 of OLMo-2 1B's 16): here the first
    floor(p L) layers, p = `rope_share` (5/16 by default; 1 of a 4-layer model), are plain `rope`
    at the window's positions, the others RePo. The module reads what the layer's attention reads:
    the residual stream itself in OLMo-2 (norm after), the layer's input after the norm here
    (pre-norm). Not here: the reference's optional mixing with integer positions during training
    (dynamic_pe_pdrop, 0 in its configs) and the paper's continual pre-training from a RoPE
    checkpoint (the module is trained from scratch with the model).

    Path: sdpa-causal (flash on CUDA): the positions feed the rotation, not the logits. Parameters
    per RePo layer, stacked (L - floor(p L), ...), shared by the layers that use the scheme."""

    name = "repo"
    float_positions = True
    formula = ("rope with head h's pair p of q_t, k_t turned by z_{t,h} theta_p, z_{t,h} = w_h . (SiLU(W_g h_t) * "
               "W_c h_t) a learned real position from the layer input; first floor(p L) layers plain rope")
    family = "rotary"
    relative = True
    hooks = ("content", "qk")
    reference = ("Li, Zhao, Sproat, ICML 2026, \"RePo: Language Models with Context Re-Positioning\", "
                 "arXiv:2512.14391 (SakanaAI/repo)")
    notes = ("per-head real positions z = w_h . SwiGLU_{d/8}(h_t) from each layer's input, read by RoPE; "
             "raw values (no cumsum or sort); the first floor(rope_share L) layers plain rope (5/16 as the reference)")
    defaults = {"base": 10000.0, "rope_share": 0.3125}
    ranges = {"base": frequency_base, "rope_share": between(0, 1)}

    def __init__(self, dims):
        super().__init__(dims)
        if self.head_dim % 2:
            raise PosbenchError(f"{self.name} needs an even head dimension, got {self.head_dim}")
        self.start = share(self.p["rope_share"], dims.n_layers, self.name)  # layers below keep integer positions
        layers, d = dims.n_layers - self.start, dims.d_model
        width = max(1, d // REPO_WIDTH)

        def weights(*shape):
            w = torch.empty(layers, *shape)
            return nn.Parameter(nn.init.trunc_normal_(w, std=REPO_INIT_STD, a=-3 * REPO_INIT_STD, b=3 * REPO_INIT_STD))

        self.gate_map = weights(width, d)
        self.content_map = weights(width, d)
        self.final_map = weights(dims.n_heads, width)
        inv, _ = rope_frequencies(self.head_dim, self.p["base"], dims.train_len, policies.make(), 0)
        self.table = angle_table(inv)  # the integer layers, as rope's
        self.register_buffer("inv_freq", inv.float(), persistent=False)  # (D/2,)

    def prepare(self, pos):
        cos_sin = self.table(pos, self.position_bound)  # (T, 2, D/2)
        return cos_sin[:, 0], cos_sin[:, 1]

    def positions(self, x: torch.Tensor, layer: int) -> torch.Tensor:
        """x (B, T, d), the layer's input -> z (B, H, T) float32, each token's position per head."""
        i = layer - self.start
        x = x.float()
        r = F.silu(x @ self.gate_map[i].T) * (x @ self.content_map[i].T)  # (B, T, d_p)
        return (r @ self.final_map[i].T).transpose(1, 2)  # (B, H, T)

    def turns(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Positions z (B, H, T) -> cos, sin (B, H, T, D/2) of z theta_p, float32."""
        angle = z[..., None] * self.inv_freq
        return angle.cos(), angle.sin()

    def content(self, x, layer):
        """The turns of this layer's positions; None in an integer layer (rope's table)."""
        if layer < self.start:
            return None
        return self.turns(self.positions(x, layer))

    def rotate(self, q, k, pos, ctx, layer, content=None):
        if content is None:  # an integer layer: rope at the window's positions
            cos, sin = (t.to(q.dtype) for t in ctx)
            return rotate_half(q, cos, sin), rotate_half(k, cos, sin)
        cos, sin = content
        return rotate_half(q.float(), cos, sin).to(q.dtype), rotate_half(k.float(), cos, sin).to(k.dtype)
