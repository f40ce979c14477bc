"""The built-in eval-time RoPE policies, each one registered class on posbench.policies.Policy's
hooks. s = L_eval / L_train (at least 1) unless a factor is given; theta_t = base^(-2t/r) over the
r rotated dims; L = L_train. A new policy is one more class here (or in a plug-in).

Imports no torch (the command line names the policies and their settings without it): the hooks
import their formulas (posbench.policies.frequencies, two_maps, rotation) when they first run.
"""

from __future__ import annotations

import math

from posbench.errors import PosbenchError
from posbench.policies.dpe import detect_dpe_scales, dpe_default
from posbench.policies.registry import Policy, register
from posbench.ranges import Range, at_least, between, non_negative, positive

WINDOW = "neighbour window W: relative positions below it keep plain RoPE (0: "  # completed by each policy


@register
class Unscaled(Policy):
    name = "none"
    reference = "Su et al. 2021, arXiv:2104.09864"
    formula = "RoPE as trained: pair t turned by m theta_t at every length"
    length_free = True
    hf_types = ("default",)


class Interpolation(Policy):
    """A policy that takes the factor s (--scaling-factor) and leaves windows with s <= 1 as trained."""

    interpolates = True


@register
class PI(Interpolation):
    name = "pi"
    reference = "Chen et al. 2023, arXiv:2306.15595"
    formula = "position interpolation: theta_t / s"
    hf_types = ("linear",)

    def frequencies(self, inv_freq, length, train_len):
        return inv_freq / self.scale(length, train_len)


@register
class NTK(Interpolation):
    name = "ntk"
    reference = "bloc97 2023, NTK-aware scaled RoPE (r/LocalLLaMA)"
    formula = "NTK-aware: base times s^(r/(r-2))"

    def rope_base(self, base, dim, length, train_len):
        from posbench.policies.frequencies import ntk_base

        return ntk_base(base, self.scale(length, train_len), dim)


@register
class DynamicNTK(Interpolation):
    name = "dynamic-ntk"
    reference = "emozilla 2023; transformers' `dynamic`"
    formula = "NTK-aware with the base grown by the window's own length: base (f L_eval / L - (f - 1))^(r/(r-2))"
    hf_types = ("dynamic",)

    @property
    def fixed(self) -> bool:
        return False  # the base grows with the window's length even where a factor is given

    def table_key(self, length, train_len):
        return self.scale(length, train_len), max(length, train_len)

    def rope_base(self, base, dim, length, train_len):
        # transformers' `dynamic`: f is the factor (1 when none is given), the base grows with the
        # length itself, from 1x at L_train
        from posbench.policies.frequencies import ntk_base

        f = self.factor if self.factor > 0 else 1.0
        return ntk_base(base, f * max(length, train_len) / train_len - (f - 1), dim)


@register
class YaRN(Interpolation):
    name = "yarn"
    reference = "Peng et al. 2023, arXiv:2309.00071"
    formula = ("by parts: pairs with fewer than alpha rotations over L divided by s, more than beta kept, a linear "
               "ramp between; logits times (0.1 ln s + 1)^2")
    defaults = {"alpha": 1.0, "beta": 32.0}
    ranges = {"alpha": positive, "beta": positive}
    help = {"alpha": "YaRN alpha (beta_slow)", "beta": "YaRN beta (beta_fast)"}
    flags = {"alpha": "yarn_alpha", "beta": "yarn_beta"}
    label_all = True
    hf_types, hf_fields = ("yarn",), {"beta_slow": "alpha", "beta_fast": "beta"}

    def __init__(self, factor=0.0, **settings):
        super().__init__(factor, **settings)
        if self.alpha >= self.beta:
            raise PosbenchError(f"yarn_alpha ({self.alpha}) must be below yarn_beta ({self.beta})")

    def frequencies(self, inv_freq, length, train_len, *, base):
        from posbench.policies.frequencies import yarn_ramp

        ramp = yarn_ramp(2 * len(inv_freq), base, train_len, self.alpha, self.beta)
        return inv_freq / self.scale(length, train_len) * ramp + inv_freq * (1 - ramp)

    def temperature(self, length, train_len):
        return 0.1 * math.log(self.scale(length, train_len)) + 1.0


@register
class Llama3(Interpolation):
    name = "llama3"
    reference = "Llama 3.1 (Dubey et al. 2024, arXiv:2407.21783)"
    formula = "by wavelength: above L / low divided by s, below L / high kept, a smooth blend between"
    defaults = {"low": 1.0, "high": 4.0}
    ranges = {"low": positive, "high": positive}
    help = {"low": "Llama 3 low_freq_factor: wavelengths above train_len / low are interpolated fully",
            "high": "Llama 3 high_freq_factor: wavelengths below train_len / high are kept"}
    flags = {"low": "llama3_low", "high": "llama3_high"}
    label_all = True
    hf_types, hf_fields = ("llama3",), {"low_freq_factor": "low", "high_freq_factor": "high"}

    def __init__(self, factor=0.0, **settings):
        super().__init__(factor, **settings)
        if not self.low < self.high:
            raise PosbenchError(f"llama3_low and llama3_high must satisfy 0 < low < high, got {self.low} and "
                                f"{self.high}")

    def frequencies(self, inv_freq, length, train_len):
        from posbench.policies.frequencies import llama3_ramp

        ramp = llama3_ramp(inv_freq, train_len, self.low, self.high)
        return inv_freq / self.scale(length, train_len) * ramp + inv_freq * (1 - ramp)


@register
class LongRoPE(Interpolation):
    """transformers' `_compute_longrope_parameters`: 1 / (lambda_t base^(2t/d)), cos and sin times
    sqrt(1 + ln s / ln L); the factors apply at every position (no n^ of the paper) and at every
    length: long factors only, no short_factor up to L (posbench.extension)."""

    name = "longrope"
    reference = "Ding et al. 2024, arXiv:2402.13753"
    formula = ("theta_t / lambda_t per pair, cos and sin times sqrt(1 + ln s / ln L); lambda searched by "
               "`posbench extend` or given (longrope_factors)")
    defaults = {"factors": ()}
    ranges = {"factors": positive}
    help = {"factors": "LongRoPE factors, one per rotated pair: longrope in rope_scaling"}
    flags = {"factors": "longrope_factors"}
    hf_types, hf_fields = ("longrope",), {"long_factor": "factors"}

    def shown(self, key):
        return False  # the factors are the run's (extend's search) or the task's, not the label's

    def check(self, pairs, train_len):
        if len(self.factors) != pairs:
            raise PosbenchError(f"longrope needs {pairs} factors (one per rotated pair), got {len(self.factors)}")

    def frequencies(self, inv_freq, length, train_len):
        return inv_freq / inv_freq.new_tensor(self.factors)

    def temperature(self, length, train_len):
        return math.sqrt(1 + math.log(self.scale(length, train_len)) / math.log(train_len))


@register
class FreqBand(Policy):
    name = "freq-band"
    reference = "Oka et al., ICLR 2026, \"Frequency Bands in RoPE\" (posbench's stated rule)"
    formula = "pairs whose wavelength 2 pi / theta_t exceeds cutoff x L unrotated (NoPE), the others as trained"
    defaults = {"cutoff": 1.0}
    ranges = {"cutoff": positive}
    help = {"cutoff": "freq-band: pairs whose wavelength exceeds cutoff x train_len are left unrotated"}
    flags = {"cutoff": "freq_band_cutoff"}
    length_free = True

    def frequencies(self, inv_freq, length, train_len):
        from posbench.policies.frequencies import freq_band

        return freq_band(inv_freq, train_len, self.cutoff)


class TwoMaps(Policy):
    """Plain RoPE where i - j < W, another position map beyond, one softmax over the merged logits."""

    length_free = True


@register
class SelfExtend(TwoMaps):
    name = "self-extend"
    reference = "Jin et al. 2024, arXiv:2401.01325 (LongLM)"
    formula = ("plain RoPE where i - j < W; beyond, queries at floor(i/G) + W - W/G and keys at floor(j/G); "
               "one softmax over the merged logits")
    defaults = {"group": 8, "window": 0}
    ranges = {"group": at_least(1), "window": non_negative}
    help = {"group": "Self-Extend group G",
            "window": "Self-Extend neighbour window W, a multiple of G (0: train_len/4 rounded to a multiple of G)"}
    flags = {"group": "self_extend_group", "window": "self_extend_window"}

    def neighbour_window(self, train_len):
        """W unless given: train_len // 4 rounded to the nearest multiple of G (at least G), since
        W / G positions must be whole: L = 100, G = 8 gives 24, L = 512 gives 128."""
        return self.window or self.group * max(1, (train_len // 4 + self.group // 2) // self.group)

    def check(self, pairs, train_len):
        window = self.neighbour_window(train_len)
        if window % self.group:
            raise PosbenchError(f"self-extend: the window {window} must be divisible by the group {self.group} "
                                "(else positions are fractional)")

    def far_queries(self, q, qpos, inv, window):
        from posbench.policies.two_maps import self_extend_positions, turn_at

        return turn_at(q, self_extend_positions(qpos, self.group, window)[0], inv)

    def far_keys(self, k, kpos, inv):
        from posbench.policies.two_maps import self_extend_positions, turn_at

        return turn_at(k, self_extend_positions(kpos, self.group, 0)[1], inv)


@register
class ReRoPE(TwoMaps):
    name = "rerope"
    reference = "Su 2023 (bojone/rerope)"
    formula = "relative positions min(i - j, w); leaky: w + (i - j - w)/k beyond w"
    defaults = {"window": 0, "leak": 0.0}
    ranges = {"window": non_negative, "leak": Range("0 (ReRoPE) or >= 1 (leaky ReRoPE)", lambda v: v == 0 or v >= 1)}
    help = {"window": "ReRoPE window w (0: train_len/4)", "leak": "ReRoPE leak k (0: clip at w; >= 1: leaky ReRoPE)"}
    flags = {"window": "rerope_window", "leak": "rerope_leak"}

    def neighbour_window(self, train_len):
        return self.window or max(1, train_len // 4)

    def far_queries(self, q, qpos, inv, window):
        """ReRoPE's w, or leaky ReRoPE's i + w(k - 1) at frequencies / k: q.k reads w or w + (i - j - w) / k."""
        from posbench.policies.two_maps import turn_at

        if self.leak:
            return turn_at(q, qpos + window * (self.leak - 1), inv / self.leak)
        return turn_at(q, qpos * 0 + window, inv)

    def far_keys(self, k, kpos, inv):
        """Leaky ReRoPE's j at frequencies / k; ReRoPE leaves the keys unrotated."""
        from posbench.policies.two_maps import turn_at

        return turn_at(k, kpos, inv / self.leak) if self.leak else k


@register
class DPE(TwoMaps):
    name = "dpe"
    reference = "Lu et al. 2025, arXiv:2504.18857 (LuLuLuyi/DPE)"
    formula = ("Self-Extend's two maps with a scale s_g per group g of rotary pairs, each group's scale detected as "
               "the one of least loss at the evaluation length")
    defaults = {"groups": 8, "window": 0, "scales": ()}
    ranges = {"groups": at_least(1), "window": non_negative, "scales": at_least(1)}
    help = {"groups": "DPE groups of rotary pairs, one scale each",
            "window": "DPE neighbour window W (0: train_len/8)",
            "scales": "DPE scale per group (empty: detected at every length on validation windows)"}
    flags = {"groups": "dpe_groups", "window": "dpe_window", "scales": "dpe_scales"}
    internal = {"detected": False}  # `scales` were detected at the evaluation length (the label leaves them out)

    def shown(self, key):
        return bool(self.p[key]) and (key != "scales" or self.given_scales)

    @property
    def given_scales(self) -> bool:
        """Scales set by the user (--dpe-scales), not detected: only those name the label."""
        return bool(self.scales) and not self.detected

    def neighbour_window(self, train_len):
        """W unless given: train_len // 8, the reference's 1024 for 8K-token models, at least 1."""
        return self.window or max(1, train_len // 8)

    def check(self, pairs, train_len):
        if len(self.scales) > pairs:
            raise PosbenchError(f"dpe: {len(self.scales)} scales for {pairs} rotary pairs; give at most one per pair")

    def ready(self, pairs, length, train_len):
        """The scales detected or given, else (nothing detected: a picture, a probe of a trained
        run) every group at `dpe_default`."""
        self.check(pairs, train_len)
        return self if self.scales else self.replace(scales=(dpe_default(length, train_len),) * min(self.groups, pairs))

    def detect(self, loss, pairs, length, train_len):
        return detect_dpe_scales(loss, self, pairs, length, train_len)

    def far_queries(self, q, qpos, inv, window):
        from posbench.policies.two_maps import dpe_pair_scales, dpe_positions, turn_at

        return turn_at(q, dpe_positions(qpos, dpe_pair_scales(self.scales, len(inv)), window)[0], inv)

    def far_keys(self, k, kpos, inv):
        from posbench.policies.two_maps import dpe_pair_scales, dpe_positions, turn_at

        return turn_at(k, dpe_positions(kpos, dpe_pair_scales(self.scales, len(inv)), 0)[1], inv)


@register
class DoPE(Policy):
    name = "dope"
    reference = "Xiong et al. 2025, arXiv:2511.09146 (posbench's stated defaults)"
    formula = ("per layer, the heads of least truncated matrix entropy of their keys after RoPE take isotropic "
               "Gaussian q and k (their attention map a Gaussian's), the others unchanged")
    defaults = {"heads": 0.125, "rank": 32}
    ranges = {"heads": between(0, 1), "rank": at_least(1)}
    help = {"heads": "DoPE share of each layer's heads flagged noisy (at least one)",
            "rank": "DoPE truncation r of the matrix entropy"}
    flags = {"heads": "dope_heads", "rank": "dope_rank"}
    length_free = True

    def heads(self, q, k, layer):
        from posbench.schemes.dope import dope_qk

        q, k, _ = dope_qk(q, k, self.p["heads"], self.rank, layer)
        return q, k
