"""Rotary schemes: q and k rotated by position in every attention layer (posbench/docs/schemes.md:
rope, p-rope, resonance, rope-pp, pope, fope, xpos, grape, selective-rope, accum-rope, repo).

Layout: half-split (GPT-NeoX): pair t is (x_t, x_{t + r/2}), t < r/2, over the r rotated dims. It
equals the interleaved layout of the RoFormer paper up to a fixed permutation of head dimensions,
which q.k ignores.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from posbench.errors import PosbenchError, did_you_mean
from posbench.schemes.dope import dope_qk
from posbench.schemes.base import Scheme, at_least, between, frequency_base, one_of, positive, size
from posbench.schemes.registry import register
from posbench.schemes.tables import GrowingTable, position_count

# Eval-time policies, chosen with --rope-scaling. self-extend, rerope and dpe merge two logit maps
# (posbench/docs/extension.md): a RoPE layer under them takes the explicit attention path, as under
# dope, which replaces the q and k of its noisy heads (posbench.schemes.dope). freq-band leaves the
# pairs of long wavelength unrotated (`rope_frequencies`).
TWO_MAPS = ("self-extend", "rerope", "dpe")
LOGIT_POLICIES = (*TWO_MAPS, "dope")
SCALINGS = ("none", "pi", "ntk", "dynamic-ntk", "yarn", "llama3", "freq-band", *TWO_MAPS, "dope")
UNSCALED = ("none", "freq-band", *LOGIT_POLICIES)  # s = 1: no interpolation factor
# longrope needs searched per-pair factors (posbench.extending): a fine-tuning method, not a flag value.
KINDS = (*SCALINGS, "longrope")

# Every policy of KINDS: (formula, reference, settings), what `posbench schemes --policies` lists.
# s = L_eval / L_train (at least 1) unless a factor is given; theta_t = base^(-2t/r) over the r
# rotated dims; L = L_train.
POLICIES = {
    "none": ("RoPE as trained: pair t turned by m theta_t at every length", "Su et al. 2021, arXiv:2104.09864",
             ""),
    "pi": ("position interpolation: theta_t / s", "Chen et al. 2023, arXiv:2306.15595", "--scaling-factor"),
    "ntk": ("NTK-aware: base times s^(r/(r-2))", "bloc97 2023, NTK-aware scaled RoPE (r/LocalLLaMA)",
            "--scaling-factor"),
    "dynamic-ntk": ("NTK-aware with the base grown by the window's own length: base (f L_eval / L - (f - 1))^(r/(r-2))",
                    "emozilla 2023; transformers' `dynamic`", "--scaling-factor"),
    "yarn": ("by parts: pairs with fewer than alpha rotations over L divided by s, more than beta kept, a linear "
             "ramp between; logits times (0.1 ln s + 1)^2", "Peng et al. 2023, arXiv:2309.00071",
             "--yarn-alpha, --yarn-beta, --scaling-factor"),
    "llama3": ("by wavelength: above L / low divided by s, below L / high kept, a smooth blend between",
               "Llama 3.1 (Dubey et al. 2024, arXiv:2407.21783)", "--llama3-low, --llama3-high"),
    "freq-band": ("pairs whose wavelength 2 pi / theta_t exceeds cutoff x L unrotated (NoPE), the others as trained",
                  "Oka et al., ICLR 2026, \"Frequency Bands in RoPE\" (posbench's stated rule)", "--freq-band-cutoff"),
    "self-extend": ("plain RoPE where i - j < W; beyond, queries at floor(i/G) + W - W/G and keys at floor(j/G); "
                    "one softmax over the merged logits", "Jin et al. 2024, arXiv:2401.01325 (LongLM)",
                    "--self-extend-group, --self-extend-window"),
    "rerope": ("relative positions min(i - j, w); leaky: w + (i - j - w)/k beyond w", "Su 2023 (bojone/rerope)",
               "--rerope-window, --rerope-leak"),
    "dpe": ("Self-Extend's two maps with a scale s_g per group g of rotary pairs, each group's scale detected as "
            "the one of least loss at the evaluation length", "Lu et al. 2025, arXiv:2504.18857 (LuLuLuyi/DPE)",
            "--dpe-groups, --dpe-window, --dpe-scales, --dpe-windows"),
    "dope": ("per layer, the heads of least truncated matrix entropy of their keys after RoPE take isotropic "
             "Gaussian q and k (their attention map a Gaussian's), the others unchanged",
             "Xiong et al. 2025, arXiv:2511.09146 (posbench's stated defaults)", "--dope-heads, --dope-rank"),
    "longrope": ("theta_t / lambda_t per pair, cos and sin times sqrt(1 + ln s / ln L); lambda searched by "
                 "`posbench extend` or given (longrope_factors)", "Ding et al. 2024, arXiv:2402.13753",
                 "--longrope-factors; extend's search"),
}
YARN_DEFAULTS = (1.0, 32.0)  # (alpha, beta)
LLAMA3_DEFAULTS = (1.0, 4.0)  # (low, high): low_freq_factor, high_freq_factor of Llama 3.1
DPE_GROUPS = 8  # DPE: the reference's eight equal groups of rotary pairs (config/dpe_config.yaml)
DOPE_DEFAULTS = (0.125, 32)  # DoPE: (share of each layer's heads flagged, truncation rank r)


@dataclass(frozen=True)
class RopeScaling:
    """An eval-time context extension, or the rescaling a child was fine-tuned with. factor 0
    means s = L_eval / L_train (at least 1)."""

    kind: str = "none"
    factor: float = 0.0
    alpha: float = YARN_DEFAULTS[0]  # YaRN beta_slow: pairs with fewer rotations than this are interpolated
    beta: float = YARN_DEFAULTS[1]  # YaRN beta_fast: pairs with more rotations than this are kept
    low: float = LLAMA3_DEFAULTS[0]  # Llama 3: wavelengths above L_train / low are interpolated
    high: float = LLAMA3_DEFAULTS[1]  # Llama 3: wavelengths below L_train / high are kept
    factors: tuple[float, ...] = ()  # LongRoPE: lambda_t per rotated pair, theta_t / lambda_t
    group: int = 8  # Self-Extend: G, positions floor(p / G) beyond the window
    window: int = 0  # Self-Extend W or ReRoPE w: exact RoPE below it; 0: about train_len / 4 (neighbour_window)
    leak: float = 0.0  # ReRoPE: 0 clips at w; k >= 1: leaky, w + (i - j - w) / k
    cutoff: float = 1.0  # freq-band: pairs with wavelength 2 pi / theta_t > cutoff * L_train unrotated
    groups: int = DPE_GROUPS  # DPE: groups of rotary pairs, one scale each
    scales: tuple[float, ...] = ()  # DPE: the scale of each group; () until detected (`detect_dpe_scales`)
    heads: float = DOPE_DEFAULTS[0]  # DoPE: share of each layer's heads flagged noisy (at least one)
    rank: int = DOPE_DEFAULTS[1]  # DoPE: r, the eigenvalues the truncated matrix entropy keeps
    detected: bool = False  # DPE: `scales` were detected at the evaluation length (the label leaves them out)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise did_you_mean(self.kind, SCALINGS, "rope scaling")

    @property
    def fixed(self) -> bool:
        """The frequencies do not depend on the window's length (no dynamic rescaling)."""
        return self.kind in UNSCALED or (self.factor > 0 and self.kind != "dynamic-ntk")

    def scale(self, length: int, train_len: int) -> float:
        if self.kind in UNSCALED:
            return 1.0
        return self.factor if self.factor > 0 else max(1.0, length / train_len)

    @property
    def label(self) -> str:
        """The `scaling` column: the kind, the factor when given, and non-default ramp bounds."""
        if self.kind == "none":
            return "none"
        label = self.kind if self.factor <= 0 else f"{self.kind}:{self.factor:g}"
        if self.kind == "yarn" and (self.alpha, self.beta) != YARN_DEFAULTS:
            label += f"(alpha={self.alpha:g},beta={self.beta:g})"
        if self.kind == "llama3" and (self.low, self.high) != LLAMA3_DEFAULTS:
            label += f"(low={self.low:g},high={self.high:g})"
        if self.kind in ("self-extend", "rerope"):
            given = {"group": self.group if self.kind == "self-extend" and self.group != 8 else 0,
                     "window": self.window, "leak": self.leak}
            label = self.kind + _changed(given)
        if self.kind in ("freq-band", "dpe", "dope"):
            label = self.kind + _changed(self._settings())
        return label

    def _settings(self) -> dict:
        """The non-default settings of freq-band, dpe and dope, as their labels name them."""
        if self.kind == "freq-band":
            return {"cutoff": self.cutoff if self.cutoff != 1.0 else 0}
        if self.kind == "dpe":
            return {"groups": self.groups if self.groups != DPE_GROUPS else 0, "window": self.window,
                    "scales": "-".join(f"{s:g}" for s in self.scales) if self.given_scales else ""}
        return {"heads": self.heads if self.heads != DOPE_DEFAULTS[0] else 0,
                "rank": self.rank if self.rank != DOPE_DEFAULTS[1] else 0}

    @property
    def given_scales(self) -> bool:
        """DPE scales set by the user (--dpe-scales), not detected: only those name the label."""
        return bool(self.scales) and not self.detected

    def neighbour_window(self, train_len: int) -> int:
        """W (Self-Extend) or w (ReRoPE): relative positions below it keep plain RoPE. Unless given,
        train_len // 4, for Self-Extend rounded to the nearest multiple of G (at least G), since
        W / G positions must be whole: L = 100, G = 8 gives 24, L = 512 gives 128. DPE: train_len // 8,
        the reference's 1024 for 8K-token models (config/dpe_config.yaml), at least 1."""
        if self.window:
            return self.window
        if self.kind == "dpe":
            return max(1, train_len // 8)
        quarter = train_len // 4
        if self.kind == "self-extend":
            return self.group * max(1, (quarter + self.group // 2) // self.group)
        return max(1, quarter)


def _changed(given: dict) -> str:
    """"(k=v,...)" of the settings given a non-default (non-zero) value; "" when none is."""
    parts = [f"{k}={v:g}" if isinstance(v, (int, float)) else f"{k}={v}" for k, v in given.items() if v]
    return f"({','.join(parts)})" if parts else ""


def yarn_ramp(dim: int, base: float, train_len: int, alpha: float, beta: float) -> torch.Tensor:
    """(dim/2,) interpolation weight per pair: 0 keeps the pair, 1 interpolates it fully.
    Follows transformers' `_compute_yarn_parameters` (find_correction_dim, linear ramp)."""

    def correction_dim(rotations: float) -> float:
        return dim * math.log(train_len / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(correction_dim(beta)), 0)
    high = min(math.ceil(correction_dim(alpha)), dim - 1)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    t = torch.arange(dim // 2, dtype=torch.float64)
    return ((t - low) / (high - low)).clamp(0, 1)


def llama3_ramp(inv: torch.Tensor, train_len: int, low: float, high: float) -> torch.Tensor:
    """Interpolation weight per pair (0 keeps, 1 interpolates), transformers'
    `_compute_llama3_parameters`: with wavelength lambda = 2 pi / theta and
    a = (L_train / lambda - low) / (high - low), pairs with lambda < L_train / high (a > 1) are
    kept, those with lambda > L_train / low (a < 0) divided by s, and between the frequency is
    (1 - a) theta / s + a theta: so the weight is 1 - a, clamped to [0, 1]."""
    a = (train_len * inv / (2 * math.pi) - low) / (high - low)
    return 1 - a.clamp(0, 1)


def ntk_base(base: float, ratio: float, dim: int) -> float:
    """base * ratio^(dim/(dim-2)). With dim = 2 the one pair has frequency 1 at any base."""
    return base * ratio ** (dim / (dim - 2)) if dim > 2 else base


def rope_frequencies(
    dim: int, base: float, train_len: int, scaling: RopeScaling, length: int
) -> tuple[torch.Tensor, float]:
    """Inverse frequencies (dim/2,) float64 and the factor applied to both cos and sin."""
    s = scaling.scale(length, train_len)
    exponent = torch.arange(0, dim, 2, dtype=torch.float64) / dim
    inv = base**-exponent
    kind = scaling.kind if s > 1 else "none"
    if kind == "pi":
        return inv / s, 1.0
    if kind == "ntk":
        return ntk_base(base, s, dim) ** -exponent, 1.0
    if kind == "dynamic-ntk":
        # transformers' `dynamic`: s is the factor f (1 when none is given) and the base grows with
        # the length itself, from 1x at L_train: base * (f L / L_train - (f - 1))^(dim/(dim-2)).
        f = scaling.factor if scaling.factor > 0 else 1.0
        ratio = f * max(length, train_len) / train_len - (f - 1)
        return ntk_base(base, ratio, dim) ** -exponent, 1.0
    if kind == "longrope":
        # transformers' `_compute_longrope_parameters`: 1 / (lambda_t base^(2t/d)), cos and sin times
        # sqrt(1 + ln s / ln L); the factors apply at every position (no n^ of the paper) and at
        # every length: long factors only, no short_factor up to L (posbench.extension)
        return inv / torch.tensor(scaling.factors, dtype=torch.float64), math.sqrt(1 + math.log(s) / math.log(train_len))
    if scaling.kind == "freq-band":
        return freq_band(inv, train_len, scaling.cutoff), 1.0
    if kind in ("yarn", "llama3"):  # by parts: each pair between kept and divided by s
        if kind == "yarn":
            ramp, mscale = yarn_ramp(dim, base, train_len, scaling.alpha, scaling.beta), 0.1 * math.log(s) + 1.0
        else:
            ramp, mscale = llama3_ramp(inv, train_len, scaling.low, scaling.high), 1.0
        return inv / s * ramp + inv * (1 - ramp), mscale
    return inv, 1.0


def freq_band(inv: torch.Tensor, train_len: int, cutoff: float) -> torch.Tensor:
    """freq-band (Oka et al., ICLR 2026, "Frequency Bands in RoPE: Base Frequency and Context Length
    Shape the Interpolation-Extrapolation Trade-off"): the pairs below the high-norm frequency band,
    whose location the paper ties to the base and the training length, are replaced by NoPE at
    inference. The paper's exact band rule was not reachable, so posbench's rule is stated here:
    a pair whose wavelength 2 pi / theta_t exceeds cutoff * L_train (cutoff 1: it never completes
    a turn within the training window) gets theta_t = 0, angle 0 at every position, so its q.k is
    content alone; the other pairs keep theta_t, their q.k unchanged."""
    return torch.where(2 * math.pi / inv > cutoff * train_len, torch.zeros_like(inv), inv)


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


def rotate_half(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (..., T, D) rotated pairwise; cos, sin (T, D/2)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def self_extend_positions(pos: torch.Tensor, group: int, window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Self-Extend's grouped map (Jin et al. 2024; LongLM `self_extend_forward`): query positions
    floor(i / G) + W - W / G, key positions floor(j / G), so a grouped relative position is
    floor(i / G) - floor(j / G) + W - W / G, which joins the neighbour map's W at i - j = W."""
    return pos // group + window - window // group, pos // group


def dpe_pair_scales(scales: tuple[float, ...], pairs: int) -> torch.Tensor:
    """(pairs,) float64, the scale of each rotary pair: DPE's groups split the pairs evenly in
    frequency order, pair t in group floor(t g / pairs) (the reference's `dimension_groups_range`
    [0, 8, ..., 64] over 64 pairs: pair t in group t // 8)."""
    group = torch.arange(pairs) * len(scales) // pairs
    return torch.tensor(scales, dtype=torch.float64)[group]


def dpe_positions(pos: torch.Tensor, scales: torch.Tensor, window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """DPE's far map per pair (Lu et al. 2025, arXiv:2504.18857; LuLuLuyi/DPE `dpe_flash_forward`):
    with the pair's group scale s, query positions floor(i / s) + W - W / s and key positions
    floor(j / s), (T, pairs) float64; Self-Extend's map with a group size per pair."""
    p, scales = pos.double()[:, None], scales.to(pos.device)
    return torch.floor(p / scales) + window - window / scales, torch.floor(p / scales)


def dpe_default(length: int, train_len: int) -> float:
    """The scale DPE's detection gives the groups not under test, 2 L / L_train (the reference's
    `run_niah_detect.sh`: factor = TEST_MAX_LENGTH / PRETRAIN_LENGTH * 2), at least 1."""
    return max(1.0, 2 * length / train_len)


def dpe_candidates(length: int, window: int) -> list[float]:
    """The scales DPE's detection tries for a group: L / l for l = L, L/2, L/4, ... down to the
    window W (the reference halves from TEST_MAX_LENGTH while the length is >= 1024, its W)."""
    found, s = [1.0], 2.0
    while length / s >= window:
        found.append(s)
        s *= 2
    return found


def detect_dpe_scales(loss, scaling: RopeScaling, pairs: int, length: int, train_len: int) -> RopeScaling:
    """DPE's detection of the most effective scale per group (the reference's step a,
    `run_niah_detect.sh`): group by group, the other groups at `dpe_default`, the group under test
    at each of `dpe_candidates`, keeping the scale with the least loss(scaling) (NIAH accuracy in
    the reference; posbench scores the validation loss, ties to the smaller scale). Returns the
    scaling with the scales found, marked detected."""
    if scaling.given_scales:
        return scaling
    g, default = min(scaling.groups, pairs), dpe_default(length, train_len)
    window = scaling.neighbour_window(train_len)
    scored: dict[tuple[float, ...], float] = {}  # every group at the default is one trial, scored once

    def trial(scales: tuple[float, ...]) -> float:
        if scales not in scored:
            value = loss(dataclasses.replace(scaling, scales=scales, detected=True))
            scored[scales] = value if math.isfinite(value) else math.inf
        return scored[scales]

    found = []
    for group in range(g):
        found.append(min(dpe_candidates(length, window),
                         key=lambda s, group=group: trial(tuple(s if i == group else default for i in range(g)))))
    return dataclasses.replace(scaling, scales=tuple(found), detected=True)


def dpe_ready(scaling: RopeScaling, pairs: int, length: int, train_len: int) -> RopeScaling:
    """The scaling with DPE's scales: those detected or given, else (nothing detected: a picture, a
    probe of a trained run) every group at `dpe_default`. Other policies as they are."""
    if scaling.kind != "dpe":
        return scaling
    if len(scaling.scales) > pairs:
        raise PosbenchError(f"dpe: {len(scaling.scales)} scales for {pairs} rotary pairs; give at most one per pair")
    default = (dpe_default(length, train_len),) * min(scaling.groups, pairs)
    return scaling if scaling.scales else dataclasses.replace(scaling, scales=default)


def two_map_choice(qpos: torch.Tensor, window: int, kpos: torch.Tensor | None = None) -> torch.Tensor:
    """(Tq, Tk) True where query i reads key j through the neighbour map (plain RoPE): i - j < W
    (kpos: the keys' positions, the queries' when None)."""
    kpos = qpos if kpos is None else kpos
    return (qpos[:, None] - kpos[None, :]) < window


def turn_at(x: torch.Tensor, pos: torch.Tensor, inv: torch.Tensor) -> torch.Tensor:
    """x (..., T, D) with its first 2 len(inv) dims rotated at (possibly non-integer) positions
    pos (T,), or (T, r/2) one per pair, by inverse frequencies inv, the angles in float64 as the tables'."""
    p = pos.double()
    angle = (p[:, None] if p.dim() == 1 else p) * inv.to(pos.device)  # (T, r/2)
    cos, sin = angle.cos().float().to(x.dtype), angle.sin().float().to(x.dtype)
    r = 2 * inv.shape[0]
    if r == x.shape[-1]:
        return rotate_half(x, cos, sin)
    return torch.cat([rotate_half(x[..., :r], cos, sin), x[..., r:]], dim=-1)


def far_queries(q: torch.Tensor, qpos: torch.Tensor, inv: torch.Tensor, scaling: RopeScaling,
                window: int) -> torch.Tensor:
    """q (..., Tq, D) at qpos, unrotated, turned for the policy's map beyond the window (with
    `far_keys`): Self-Extend's grouped query positions, ReRoPE's w, or leaky ReRoPE's i + w(k - 1)
    at frequencies / k, so that q.k reads floor(i/G) - floor(j/G) + W - W/G, w, or w + (i - j - w) / k;
    DPE's floor(i/s_t) + W - W/s_t per pair (`dpe_positions`, its scales set: `dpe_ready`)."""
    if scaling.kind == "self-extend":
        return turn_at(q, self_extend_positions(qpos, scaling.group, window)[0], inv)
    if scaling.kind == "dpe":
        return turn_at(q, dpe_positions(qpos, dpe_pair_scales(scaling.scales, len(inv)), window)[0], inv)
    if scaling.leak:
        return turn_at(q, qpos + window * (scaling.leak - 1), inv / scaling.leak)
    return turn_at(q, torch.full_like(qpos, window), inv)


def far_keys(k: torch.Tensor, kpos: torch.Tensor, inv: torch.Tensor, scaling: RopeScaling) -> torch.Tensor:
    """k (..., Tk, D) at kpos, unrotated, turned for the far map: Self-Extend's floor(j/G), leaky
    ReRoPE's j at frequencies / k, DPE's floor(j/s_t); ReRoPE leaves the keys unrotated."""
    if scaling.kind == "self-extend":
        return turn_at(k, self_extend_positions(kpos, scaling.group, 0)[1], inv)
    if scaling.kind == "dpe":
        return turn_at(k, dpe_positions(kpos, dpe_pair_scales(scaling.scales, len(inv)), 0)[1], inv)
    if scaling.leak:
        return turn_at(k, kpos, inv / scaling.leak)
    return k


def two_map_scores(q: torch.Tensor, k: torch.Tensor, qpos: torch.Tensor, kpos: torch.Tensor, inv: torch.Tensor,
                   scaling: RopeScaling, window: int) -> torch.Tensor:
    """Self-Extend, ReRoPE or DPE q.k (unscaled): q (B, H, Tq, D) at qpos, k (B, H, Tk, D) at kpos, both
    unrotated -> (B, H, Tq, Tk), plain RoPE where i - j < W, the policy's map beyond."""
    near = turn_at(q, qpos, inv) @ turn_at(k, kpos, inv).transpose(-1, -2)
    far = far_queries(q, qpos, inv, scaling, window) @ far_keys(k, kpos, inv, scaling).transpose(-1, -2)
    return torch.where(two_map_choice(qpos, window, kpos), near, far)


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
    Eval-time scaling (`--rope-scaling`): pi, ntk, dynamic-ntk, yarn, llama3, freq-band (see
    `rope_frequencies`), computed over the r rotated dims as transformers does; self-extend,
    rerope and dpe merge two logit maps, dope replaces its noisy heads' q and k (`logits`, the
    explicit path). A child fine-tuned with a rescaling
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
             "eval-time scaling " + ", ".join(SCALINGS[1:]) + "; extend's longrope is long-factors-only "
             "(its searched factors at every length, no short_factor up to L as transformers)")
    defaults = {"base": 10000.0, "fraction": 1.0}
    ranges = {"base": frequency_base, "fraction": between(0, 1)}
    added_params = ("fraction",)

    def __init__(self, dims):
        super().__init__(dims)
        self.rotary_dim = self._rotary_dim()
        self.scaling = RopeScaling()
        self.trained = RopeScaling()  # the rescaling a fine-tuned child trained with (posbench.extending)
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

    def set_scaling(self, scaling: RopeScaling) -> None:
        """An eval-time scaling; "none" is the one the model trained with (a child's rescaling)."""
        if scaling.kind == "longrope" and len(scaling.factors) != self.rotary_dim // 2:
            raise PosbenchError(f"{self.name}: longrope needs {self.rotary_dim // 2} factors (one per rotated "
                                f"pair), got {len(scaling.factors)}")
        if scaling.kind == "self-extend" and scaling.neighbour_window(self.dims.train_len) % scaling.group:
            raise PosbenchError(f"self-extend: the window {scaling.neighbour_window(self.dims.train_len)} must be "
                                f"divisible by the group {scaling.group} (else positions are fractional)")
        if scaling.kind == "dpe":
            dpe_ready(scaling, self.rotary_dim // 2, self.dims.train_len, self.dims.train_len)  # too many scales: refused
        self.scaling = self.trained if scaling.kind == "none" else scaling
        # The two-map policies read q and k unrotated and build the logits themselves; dope forms
        # them from q and k turned and its noisy heads replaced.
        self.hooks = ("logits",) if self.scaling.kind in LOGIT_POLICIES else type(self).hooks

    def set_trained_scaling(self, scaling: RopeScaling) -> None:
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
        # The frequencies depend on the length through s, and dynamic NTK also on the length itself.
        grown = max(length, train_len) if self.scaling.kind == "dynamic-ntk" else 0
        key = (self.scaling, self.scaling.scale(length, train_len), grown)
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
        if self.scaling.kind == "dope":
            q, k, _ = dope_qk(self.turn(q, *ctx), self.turn(k, *ctx), self.scaling.heads, self.scaling.rank, layer)
            return q @ k.transpose(-1, -2) * self.qk_scale
        length = position_count(pos, self.position_bound if self.scaling.fixed else None)
        s = dpe_ready(self.scaling, self.rotary_dim // 2, length, self.dims.train_len)
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

    def set_scaling(self, scaling: RopeScaling) -> None:
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
        inv, _ = rope_frequencies(self.head_dim, self.p["base"], dims.train_len, RopeScaling(), 0)
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
        inv, _ = rope_frequencies(self.head_dim, self.p["base"], dims.train_len, RopeScaling(), 0)
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
