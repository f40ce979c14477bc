"""Rotary schemes: q and k rotated by position in every attention layer (posbench/docs/schemes.md:
rope, p-rope, resonance, rope-pp, pope, fope, xpos, grape, selective-rope, accum-rope, repo).

Layout: half-split (GPT-NeoX): pair t is (x_t, x_{t + r/2}), t < r/2, over the r rotated dims. It
equals the interleaved layout of the RoFormer paper up to a fixed permutation of head dimensions,
which q.k ignores.
"""

from __future__ import annotations

import math

import torch

from posbench.errors import PosbenchError
from posbench import policies
from posbench.policies.frequencies import rope_frequencies
from posbench.policies.rotation import rotate_half
from posbench.policies.two_maps import two_map_scores
from posbench.schemes.base import Scheme, between, frequency_base, one_of
from posbench.schemes.registry import register
from posbench.schemes.tables import GrowingTable, position_count


def angle_table(inv: torch.Tensor, mscale: float = 1.0, period: torch.Tensor | None = None) -> GrowingTable:
    """Rows (2, len(inv)) per position k: cos and sin of k * inv, times mscale, computed in
    float64. With an integer `period` per pair, of (k mod period) * inv: the pair then repeats
    exactly, bit for bit, every `period` positions."""

    def rows(k):  # k (n, 1) float64, on the device the rows are wanted on
        angle = (k if period is None else k.remainder(period.to(k.device))) * inv.to(k.device)
        return (torch.stack([angle.cos(), angle.sin()], dim=1) * mscale).float()

    def build(n, device):
        return rows(torch.arange(n, dtype=torch.float64)[:, None]).to(device)

    return GrowingTable(build, lambda pos: rows(pos.double()[:, None]))


def share(fraction: float, n: int, name: str) -> int:
    """floor(p * n) for a fraction p in [0, 1], as GPT-NeoX (`int(head_size * rotary_pct)`) and
    the p-RoPE paper (`int(rope_percentage * head_dim // 2)`) round."""
    if not 0 <= fraction <= 1:
        raise PosbenchError(f"{name}: fraction must be in [0, 1], got {fraction}")
    return math.floor(fraction * n + 1e-9)  # 1e-9: p * n of a decimal p such as 0.29 * 100 lands just below


@register
class RoPE(Scheme):
    """Rotary position embedding (Su et al. 2021, RoFormer): pair t of q at position m rotated by
    m * theta_t, theta_t = base^(-2t/r); k likewise at n; so q.k depends on m - n only.
    `fraction` p (GPT-NeoX `rotary_pct`, GPT-J `rotary_dim`): only the first r = floor(p * D) dims
    of each head rotate, with the spectrum of an r-dim head; the other D - r pass through.
    Eval-time policies (`--rope-scaling`, posbench.policies): pi, ntk, dynamic-ntk, yarn, llama3,
    freq-band and a plug-in's frequencies (see `rope_frequencies`), computed over the r rotated
    dims as transformers does; self-extend, rerope and dpe merge two logit maps, dope replaces its
    noisy heads' q and k (`logits`, the explicit path). A child fine-tuned with a rescaling
    (pi, ntk, yarn, longrope: posbench.extending) keeps it as its `trained` scaling. q, k (B, H, T, D)."""

    name = "rope"
    float_positions = True
    formula = ("pair t of q at m turned by m theta_t, of k at n by n theta_t, theta_t = base^(-2t/r), r = "
               "floor(fraction D) dims rotated; q.k depends on m - n only")
    family = "rotary"
    relative = True
    hooks = ("qk",)
    reference = "Su et al. 2021, arXiv:2104.09864; fraction: GPT-NeoX rotary_pct (Black et al. 2022, arXiv:2204.06745)"
    extrapolates = "yes"
    notes = ("half-split (NeoX) pairs; fraction p rotates the first floor(p*D) dims at base^(-2t/r); "
             "eval-time policies of `posbench schemes --policies`; extend's longrope is long-factors-only "
             "(its searched factors at every length, no short_factor up to L as transformers)")
    defaults = {"base": 10000.0, "fraction": 1.0}
    ranges = {"base": frequency_base, "fraction": between(0, 1)}
    added_params = ("fraction",)

    def __init__(self, dims):
        super().__init__(dims)
        self.rotary_dim = self._rotary_dim()
        self.scaling = policies.make()
        self.trained = policies.make()  # the rescaling a fine-tuned child trained with (posbench.extending)
        self._tables: dict[tuple, GrowingTable] = {}

    def _rotary_dim(self) -> int:
        """r = floor(p * D), even, since dims rotate in pairs."""
        r = share(self.p["fraction"], self.head_dim, self.name)
        if r % 2 and r == self.head_dim:
            raise PosbenchError(f"{self.name} needs an even head dimension, got {self.head_dim}")
        if r % 2:
            raise PosbenchError(f"{self.name}: fraction={self.p['fraction']:g} rotates r = floor(p * {self.head_dim}) "
                                f"= {r} dims of the head; r must be even")
        return r

    def set_scaling(self, scaling: policies.Policy) -> None:
        """An eval-time policy; "none" is the one the model trained with (a child's rescaling)."""
        try:
            scaling.check(self.rotary_dim // 2, self.dims.train_len)
        except PosbenchError as e:
            raise PosbenchError(f"{self.name}: {e}") from None
        self.scaling = self.trained if scaling.name == "none" else scaling
        # The two-map policies read q and k unrotated and build the logits themselves; a policy
        # that masks heads (dope) forms them from q and k turned and its heads replaced.
        self.hooks = ("logits",) if self.scaling.explicit else type(self).hooks

    def set_trained_scaling(self, scaling: policies.Policy) -> None:
        """The rescaling this model was fine-tuned with: applied in training and at evaluation."""
        self.trained = scaling
        self.set_scaling(scaling)

    def frequencies(self, length: int) -> tuple[torch.Tensor, float]:
        """Inverse frequencies (r/2,) float64 at this window length, and YaRN's attention factor."""
        return rope_frequencies(self.rotary_dim, self.p["base"], self.dims.train_len, self.scaling, length)

    def build_table(self, length: int) -> GrowingTable:
        """cos and sin of the frequencies at this window length, per position."""
        return angle_table(*self.frequencies(length))

    def angles(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin (T, r/2) at `pos`, YaRN's attention factor folded in."""
        # Under compile the reserved bound stands for the length where the frequencies ignore it.
        length = position_count(pos, self.position_bound if self.scaling.fixed else None)
        train_len = self.dims.train_len
        # The frequencies depend on the length through what the policy's table_key says (s; dynamic
        # NTK's length itself; a plug-in's the length).
        key = (self.scaling, self.scaling.table_key(length, train_len))
        if key not in self._tables:
            self._tables[key] = self.build_table(length)
        cos_sin = self._tables[key](pos, self.position_bound)  # (T, 2, r/2)
        return cos_sin[:, 0], cos_sin[:, 1]

    def prepare(self, pos):
        return self.angles(pos)

    def rotate(self, q, k, pos, ctx, layer):
        cos, sin = ctx
        return self.turn(q, cos, sin), self.turn(k, cos, sin)

    def turn(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x (B, H, T, D) with its first r dims rotated by cos, sin (T, r/2)."""
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        r = self.rotary_dim
        if r == x.shape[-1]:
            return rotate_half(x, cos, sin)
        return torch.cat([rotate_half(x[..., :r], cos, sin), x[..., r:]], dim=-1)

    def logits(self, q, k, pos, ctx, layer):
        """Self-Extend, ReRoPE or DPE (posbench/docs/extension.md): q, k (B, H, T, D) unrotated ->
        scores (B, H, T, T), the neighbour map (plain RoPE) where i - j < W, the other map beyond;
        DoPE: q.k of q and k turned by `ctx`, the noisy heads' replaced (posbench.schemes.dope)."""
        if self.scaling.masks_heads:
            q, k = self.scaling.heads(self.turn(q, *ctx), self.turn(k, *ctx), layer)
            return q @ k.transpose(-1, -2) * self.qk_scale
        length = position_count(pos, self.position_bound if self.scaling.fixed else None)
        s = self.scaling.ready(self.rotary_dim // 2, length, self.dims.train_len)
        inv, _ = self.frequencies(length)
        window = s.neighbour_window(self.dims.train_len)
        return two_map_scores(q, k, pos, pos, inv, s, window) * self.qk_scale


@register
class PRoPE(RoPE):
    """p-RoPE (Barbero et al., ICLR 2025, "Round and Round We Go! What makes Rotary Positional
    Encodings useful?"; Gemma's `rope_proportion`, transformers' `proportional` RoPE): the whole
    head keeps RoPE's spectrum theta_t = base^(-2t/D), but only the floor(p * D/2) highest
    frequencies (t < floor(p * D/2)) rotate; the lowest (1 - p) are set to 0, so those pairs carry
    content alone. Unlike `rope` with `fraction` p, the kept frequencies are those of the full
    head: at p = 0.5, D = 8 p-rope keeps 1 and base^(-1/4), rope fraction=0.5 keeps 1 and
    base^(-1/2). Eval-time scaling acts on the full spectrum, then the dropped pairs are zeroed."""

    name = "p-rope"
    formula = ("rope over the whole head, theta_t = base^(-2t/D) kept for t < floor(p D/2), the lower "
               "frequencies set to 0")
    reference = "Barbero et al., ICLR 2025, arXiv:2410.06205"
    notes = ("half-split (NeoX) pairs over the whole head; the lowest (1-p) of the frequencies "
             "base^(-2t/D) set to 0; eval-time scaling as rope")
    defaults = {"base": 10000.0, "fraction": 0.25}
    added_params = ()

    def __init__(self, dims):
        super().__init__(dims)
        self.kept_pairs = share(self.p["fraction"], self.head_dim // 2, self.name)  # floor(p * D/2)

    def _rotary_dim(self) -> int:
        if self.head_dim % 2:
            raise PosbenchError(f"{self.name} needs an even head dimension, got {self.head_dim}")
        return self.head_dim

    def frequencies(self, length):
        inv, mscale = super().frequencies(length)
        inv[self.kept_pairs:] = 0.0
        return inv, mscale


def integer_wavelengths(inv: torch.Tensor) -> torch.Tensor:
    """Resonance RoPE's rounding (Wang et al. 2024, Algorithm 1): each wavelength 2 pi / theta
    to its nearest integer lambda~, returned as lambda~ (float64)."""
    return (2 * math.pi / inv).round()


@register
class Resonance(RoPE):
    """Resonance RoPE (Wang et al., ACL Findings 2024, "Resonance RoPE: Improving Context Length
    Generalization of Large Language Models"): RoPE with every wavelength rounded to an integer,
    lambda~_t = round(2 pi / theta_t), theta~_t = 2 pi / lambda~_t (`integer_wavelengths`). A pair
    with lambda~_t <= L_train repeats exactly every lambda~_t tokens, so positions past L_train
    reuse the angles it was trained on; as the reference repeats a pair's first period, angles are
    computed as (n mod lambda~_t) theta~_t, exactly periodic. D = 64, base 1e4: lambda~ = 6, 8, 11,
    15, 20, 26, 35, 47, ... (theta~_0 = pi/3, not 1).

    Eval-time scaling as `rope`, and the rounding comes after it: under `--rope-scaling yarn`
    this is the paper's Resonance-YaRN (sheryc/resonance_rope `LlamaYaRNScaledResonanceRotary
    Embedding`: YaRN's frequencies, then `resonance_register`, YaRN's attention factor kept).
    Half-split pairs and `fraction` as `rope`. Path: sdpa-causal (flash on CUDA)."""

    name = "resonance"
    formula = "rope with integer wavelengths: theta_t replaced by 2 pi / round(2 pi / theta_t)"
    reference = "Wang et al. 2024, arXiv:2403.00071 (sheryc/resonance_rope)"
    notes = ("rope with integer wavelengths round(2 pi/theta); eval-time scaling as rope, rounded "
             "after it (yarn: Resonance-YaRN)")
    added_params = ()

    def frequencies(self, length):
        inv, mscale = super().frequencies(length)
        return 2 * math.pi / integer_wavelengths(inv), mscale

    def build_table(self, length):
        inv, mscale = self.frequencies(length)
        return angle_table(inv, mscale, period=integer_wavelengths(inv))


def quarter_turn(x: torch.Tensor) -> torch.Tensor:
    """x (..., D) with every half-split pair (x_t, x_{t + D/2}) turned by -pi/2: (x_{t + D/2}, -x_t),
    `rotate_half` at cos = 0, sin = -1."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x2, -x1], dim=-1)


@register
class RopePP(RoPE):
    """RoPE++ ("Beyond Real: Imaginary Extension of Rotary Position Embeddings for Long-Context
    LLMs", arXiv 2512.07525; OpenMOSS/rope_pp, mirrored as alphaXiv/rope_pp). With each pair as a
    complex number q~_t = q_t + i q_{t + D/2} (half-split, as here) and RoPE turning q at m by
    e^{i m theta_t}, RoPE's logit is the real part of z = sum_t q~_t conj(k~_t) e^{i theta_t (m - n)};
    RoPE++ adds heads whose logit is its imaginary part,

        Im z = sum_t (q_t k_t + q'_t k'_t) sin(theta_t (m - n)) - (q_t k'_t - q'_t k_t) cos(theta_t (m - n))

    (q'_t = q_{t + D/2}), RoPE's logit with q turned by -pi/2 in every pair before RoPE
    (`quarter_turn`; the reference's `q * sin - rotate_half(q) * cos` in `apply_rotary_pos_emb`).
    The paper writes it -Im[sum q~ k~* e^{-i theta (m - n)}], its complex numbers the conjugates of
    these. An imaginary head reads the query and key of its real head: with its own projections it
    would be a RoPE head, the quarter turn absorbed into W_q.

    variant `eh` (equal heads, the reference's `imag1`): heads 2j and 2j + 1 form a pair, 2j real,
    2j + 1 imaginary, both on head 2j's query and key (the reference stacks [real, imag] per query
    head over H/2 query and key heads), so the head count stays H and half the heads are
    imaginary; the rows of W_q and W_k of the odd heads are unused. The hooks see q and k only, so
    each head keeps its own value projection, where the reference's pair reads one value head.
    variant `ec` (equal cache, `imag2`) gives every one of the H query heads a real and an
    imaginary head over the same key and value head: 2H attention heads, 2j real and 2j + 1
    imaginary on head j's query and key, both reading head j's value (the reference's repeat_kv
    over the doubled key groups), their outputs side by side (B, T, 2d) into an output projection
    2d -> d (its o_proj of num_attention_heads * 2 * head_dim inputs). The heads hook asks the
    model for that (`attention_heads` 2): the cache stays H keys and values, the attention and the
    output projection double. Every head's own query is read; n_heads may be odd.

    Eval-time scaling as `rope` (the reference fine-tunes RoPE++ with PI and YaRN): the quarter
    turn commutes with every rotation of the pair, so the policies act on the turned query
    unchanged, the two-map ones (self-extend, rerope) included. Scale 1/sqrt(D) as the reference.
    Path: sdpa-causal (flash on CUDA)."""

    name = "rope-pp"
    formula = ("rope, and in every head pair (2j, 2j+1) head 2j+1 reads head 2j's q and k with q turned by -pi/2 "
               "per pair: s_mn = Im[sum_t q~_t conj(k~_t) e^{i theta_t (m - n)}] / sqrt(D), theta_t = base^(-2t/D)")
    reference = ("RoPE++, \"Beyond Real: Imaginary Extension of Rotary Position Embeddings for Long-Context LLMs\", "
                 "arXiv:2512.07525 (OpenMOSS/rope_pp)")
    notes = ("half-split pairs; variant eh: odd heads imaginary on the even head's q and k, own v "
             "(the reference shares v too); ec: a real and an imaginary head per query head over its k and v, "
             "2H heads, output 2d -> d (heads hook); eval-time scaling as rope")
    defaults = {"base": 10000.0, "variant": "eh"}
    ranges = {"base": frequency_base, "variant": one_of("eh", "ec")}
    added_params = ()

    def __init__(self, dims):
        super().__init__(dims)
        self.equal_cache = self.p["variant"] == "ec"
        if self.equal_cache:
            self.hooks = (*type(self).hooks, "heads")
        elif self.n_heads % 2:
            raise PosbenchError(f"rope-pp variant=eh pairs each real head with an imaginary one: n_heads must be "
                                f"even, got {self.n_heads} (variant=ec takes any)")

    def set_scaling(self, scaling: policies.Policy) -> None:
        super().set_scaling(scaling)
        if self.equal_cache:  # the two-map policies' logits hook reads the 2H paired heads too
            self.hooks = (*self.hooks, "heads")

    def attention_heads(self) -> int:
        return 2

    def _rotary_dim(self) -> int:
        if self.head_dim % 2:
            raise PosbenchError(f"{self.name} needs an even head dimension, got {self.head_dim}")
        return self.head_dim

    def pair(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q, k (B, H, T, D) -> the heads RoPE turns: head 2j + 1 takes head 2j's key and its query
        turned by -pi/2 in every pair; eh keeps H heads (those of the even heads' q and k), ec makes
        2H (a pair of every head's)."""
        real_q, real_k = (q, k) if self.equal_cache else (q[:, 0::2], k[:, 0::2])  # (B, H or H/2, T, D)
        q = torch.stack([real_q, quarter_turn(real_q)], dim=2).flatten(1, 2)
        k = torch.stack([real_k, real_k], dim=2).flatten(1, 2)
        return q, k

    def rotate(self, q, k, pos, ctx, layer):
        return super().rotate(*self.pair(q, k), pos, ctx, layer)

    def logits(self, q, k, pos, ctx, layer):
        return super().logits(*self.pair(q, k), pos, ctx, layer)
