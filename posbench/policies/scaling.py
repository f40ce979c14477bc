"""The eval-time RoPE policies (`--rope-scaling`): their names, what `posbench schemes --policies`
lists of each, and `RopeScaling`, one policy with its settings. Imports no torch, so the command
line can name the policies without loading it; the formulas are in posbench.policies.frequencies
(the rotary frequencies), posbench.policies.two_maps (Self-Extend, ReRoPE, DPE's merged logit maps)
and posbench.policies.dpe (DPE's scales).
"""

from __future__ import annotations

from dataclasses import dataclass

from posbench.errors import did_you_mean

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
