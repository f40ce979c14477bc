"""What attention does by length: four measures of each layer's and head's weights, recorded over
the evaluation windows (`posbench extrapolate --attention`) into attention.csv.

For query i of a window, with weights p_ij over its keys j (p_ij = 0 outside the layer's span)
and n_i the number of keys it sees:

- ``entropy``: H_i = -sum_j q_ij log q_ij, q = p / sum_j p_ij (nats); ``entropy_norm``: H_i / log n_i,
  0 for attention on one key, 1 for uniform attention. Entropy growing with n is the argument
  for logn scaling and SSMax (Nakanishi 2025).
- ``distance``: sum_j q_ij (i - j), the mean number of tokens back that the query reads.
- ``sink_mass``: p_i0, the weight on the window's first token (the attention sink, Xiao et al.
  2024).
- ``far_mass``: sum of p_ij over keys with i - j >= L, L the length the run trained at: distances
  the model never saw in training (LM-Infinite, Han et al. 2024).

Entropy and distance read the weights normalized over the keys; the masses read them as the layer
applies them: a learned sink's column or stick-breaking leave a row summing to less than 1, and
the masses say where the weights went, not where they would go had the row summed to 1.

A row of attention.csv is the mean over every window and over the queries that see at least two
keys (i >= 1); far_mass over the queries that see some key at distance >= L (i >= L), so it is
empty at lengths up to L. The weights are read on the explicit path, the only one that forms
them: a run whose layers take another path is scored there for perplexity and run a second time
on the explicit path over the same windows (posbench.evaluate).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from posbench import results

MEASURES = ("entropy", "entropy_norm", "distance", "sink_mass", "far_mass")


def query_measures(attn: torch.Tensor, train_len: int, keys: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """attn (..., T, T) weights of queries over keys, zero where a query does not see a key; keys
    (T,) how many keys each query sees (default i + 1, full causal) -> each measure per query,
    (..., T); entropy_norm is nan for a query with one key, far_mass for a query with no key at
    distance >= train_len. Two (..., T, T) temporaries at most: at 16x the training length the
    weights of a batch are hundreds of megabytes."""
    t = attn.shape[-1]
    p = attn.float()
    i = torch.arange(t, device=p.device)
    keys = (i + 1) if keys is None else keys.to(p.device)
    total = p.sum(-1)  # (..., T)
    z = total.clamp(min=torch.finfo(p.dtype).tiny)
    # of q = p / Z: -sum q log q = log Z - sum p log p / Z; sum q (i - j) = i - sum p j / Z
    entropy = (z.log() - torch.xlogy(p, p).sum(-1) / z).clamp(min=0)
    distance = i - (p @ i.float()) / z
    nan = torch.full_like(entropy, math.nan)
    far = (p * (i[:, None] - i[None, :] >= train_len)).sum(-1)
    return {
        "entropy": entropy,
        "entropy_norm": torch.where(keys > 1, entropy / keys.float().log().clamp(min=1e-12), nan),
        "distance": distance,
        "sink_mass": p[..., 0],
        "far_mass": torch.where(i >= train_len, far, nan),
    }


class Recorder:
    """Sums of each measure per (layer, head) over the queries that count (see the module), fed
    by posbench.attention.observe with every explicit layer's weights."""

    def __init__(self, spans, train_len: int):
        self.spans = spans  # per layer, posbench.attention.Span
        self.train_len = train_len
        self.sums: dict[tuple[int, str], torch.Tensor] = {}  # (layer, measure) -> (H,) float64
        self.counts: dict[tuple[int, str], torch.Tensor] = {}
        self.windows: dict[int, int] = {}

    def __call__(self, layer: int, attn: torch.Tensor) -> None:
        """attn (B, H, T, T)."""
        t = attn.shape[-1]
        keys = self.spans[layer].visible(t, attn.device)
        measured = query_measures(attn.detach(), self.train_len, keys)
        seen = (keys > 1).to(attn.device)
        for name, value in measured.items():
            counted = seen & ~value.isnan().all(0).all(0)  # (T,) nan: a query the measure skips
            value = value[..., counted]  # (B, H, Q)
            key = (layer, name)
            self.sums[key] = self.sums.get(key, 0) + value.double().sum((0, 2)).cpu()
            self.counts[key] = self.counts.get(key, 0) + value.shape[0] * value.shape[2]
        self.windows[layer] = self.windows.get(layer, 0) + attn.shape[0]

    def rows(self) -> list[dict]:
        """One row per (layer, head): the means, None where no query counted."""
        out = []
        for layer in sorted(self.windows):
            heads = self.sums[(layer, "entropy")].shape[0]
            for h in range(heads):
                row = {"layer": layer, "head": h, "windows": self.windows[layer], "far_from": self.train_len}
                for name in MEASURES:
                    n = self.counts[(layer, name)]
                    row[name] = float(self.sums[(layer, name)][h]) / n if n else None
                out.append(row)
        return out


LABELS = {
    "entropy": "entropy (nats)",
    "entropy_norm": "entropy / log(keys)",
    "distance": "mean attention distance (tokens)",
    "sink_mass": "mass on the first token",
    "far_mass": "mass on keys at distance >= L",
}


def plot(rows, path: Path, extrapolation=None) -> Path:
    """Each measure against evaluation length (log-x), the mean over layers and heads, one line
    per scheme variant; with extrapolation rows, perplexity in the last panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    from posbench import reporting

    df = reporting.labelled_frame(rows, "entropy")
    for name in MEASURES:
        df[name] = pd.to_numeric(df[name], errors="coerce")
    means = df.groupby(["label", "eval_len"])[list(MEASURES)].mean().reset_index()
    fig, axes = plt.subplots(2, 3, figsize=(14, 7.5))
    panels = list(zip(axes.flat, MEASURES))
    for ax, name in panels:
        for i, (label, g) in enumerate(sorted(means.groupby("label"))):
            g = g.dropna(subset=[name]).sort_values("eval_len")
            ax.plot(g["eval_len"], g[name], label=label, **reporting.line_style(i))
        ax.set_ylabel(LABELS[name])
    last = axes.flat[len(MEASURES)]
    if extrapolation:
        ppl = reporting.extrapolation_frame(extrapolation).dropna(subset=["ppl"])
        ppl = ppl[ppl["label"].isin(set(means["label"]))]
        for i, (label, g) in enumerate(sorted(ppl.groupby("label"))):
            g = g.groupby("eval_len")["ppl"].mean()
            last.plot(g.index, g.values, label=label, **reporting.line_style(i))
        last.set_yscale("log")
        last.set_ylabel("perplexity")
        panels.append((last, "ppl"))
    else:
        last.axis("off")
    for ax, _ in panels:
        for n in sorted(df["train_len"].astype(int).unique()):
            ax.axvline(n, color="grey", linestyle="--", linewidth=1)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("evaluation length (tokens)")
        ax.grid(alpha=0.3, which="both")
    axes.flat[0].legend(fontsize=7, ncol=2)
    fig.suptitle("Attention by length (mean over layers and heads; dashed: training length)", fontsize=11)
    fig.tight_layout()
    return results.save_figure(fig, path, 110)


def plot_layers(rows, path: Path, measure: str = "entropy_norm") -> Path:
    """One measure against evaluation length, one panel per layer, one line per scheme variant
    (mean over heads)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    from posbench import reporting

    df = reporting.labelled_frame(rows, measure)
    df["layer"] = df["layer"].astype(int)
    layers = sorted(df["layer"].unique())
    fig, axes = plt.subplots(1, len(layers), figsize=(3.6 * len(layers), 3.8), squeeze=False, sharey=True)
    for ax, layer in zip(axes[0], layers):
        g = df[df["layer"] == layer].groupby(["label", "eval_len"])[measure].mean().reset_index()
        for i, (label, lg) in enumerate(sorted(g.groupby("label"))):
            lg = lg.dropna(subset=[measure]).sort_values("eval_len")
            ax.plot(lg["eval_len"], lg[measure], label=label, **reporting.line_style(i))
        for n in sorted(pd.to_numeric(df["train_len"]).astype(int).unique()):
            ax.axvline(n, color="grey", linestyle="--", linewidth=1)
        ax.set_xscale("log", base=2)
        ax.set_title(f"layer {layer}", fontsize=10)
        ax.set_xlabel("evaluation length")
        ax.grid(alpha=0.3, which="both")
    axes[0][0].set_ylabel(LABELS[measure])
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    return results.save_figure(fig, path, 110)
