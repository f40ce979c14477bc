"""Tables and plots from result files: the rich table of `extrapolate`, PNG plots, report.md."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
from rich.table import Table


def label(row) -> str:
    """scheme, plus the eval-time variant when there is one: rope+yarn, learned+hierarchical."""
    out = row["scheme"]
    if str(row.get("scaling", "none")) not in ("none", "", "nan"):
        out += f"+{row['scaling']}"
    if str(row.get("extension", "none")) not in ("none", "", "nan"):
        out += f"+{row['extension']}"
    if str(row.get("randomized", "False")) == "True":
        out += "+randomized"
    return out


def extrapolation_frame(rows) -> pd.DataFrame:
    df = pd.DataFrame(rows) if not isinstance(rows, pd.DataFrame) else rows.copy()
    df["label"] = df.apply(label, axis=1)
    df["ppl"] = pd.to_numeric(df.get("ppl"), errors="coerce")
    df["eval_len"] = df["eval_len"].astype(int)
    return df


def ppl_table(rows, title: str = "perplexity (lower is better)") -> Table:
    """Schemes x lengths; mean over seeds (+- std when several); best per column in bold green."""
    df = extrapolation_frame(rows)
    lengths = sorted(df["eval_len"].unique())
    stats = df.groupby(["label", "eval_len"])["ppl"].agg(["mean", "std", "count"])
    status = df.groupby(["label", "eval_len"])["status"].first()
    best = stats["mean"].groupby(level="eval_len").min()
    train_lens = sorted(df["train_len"].astype(int).unique())
    table = Table(title=f"{title}; trained at {', '.join(map(str, train_lens))}")
    table.add_column("scheme")
    for n in lengths:
        table.add_column(str(n), justify="right")
    for name in sorted(df["label"].unique(), key=lambda s: (s.split("+")[0], s)):
        cells = []
        for n in lengths:
            if (name, n) not in stats.index:
                cells.append("")
                continue
            m, sd, c = stats.loc[(name, n)]
            if math.isnan(m):
                cells.append(str(status.loc[(name, n)]))
                continue
            text = f"{m:.2f}" + (f" ±{sd:.2f}" if c > 1 and not math.isnan(sd) else "")
            cells.append(f"[bold green]{text}*[/]" if m == best.loc[n] else text)
        table.add_row(name, *cells)
    return table


def plot_extrapolation(rows, path: Path) -> Path:
    """Perplexity vs evaluation length (log-x), one line per scheme variant, training length marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    df = extrapolation_frame(rows).dropna(subset=["ppl"])
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for name, g in sorted(df.groupby("label")):
        g = g.groupby("eval_len")["ppl"].mean()
        ax.plot(g.index, g.values, marker="o", label=name)
    for n in sorted(df["train_len"].astype(int).unique()):
        ax.axvline(n, color="grey", linestyle="--", linewidth=1)
        ax.text(n, ax.get_ylim()[1], f" train {n}", va="top", fontsize=8, color="grey")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("evaluation length (tokens)")
    ax.set_ylabel("perplexity")
    ax.set_title("Length extrapolation")
    ax.legend(fontsize=8, ncol=2)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_positions(rows, path: Path, eval_len: int | None = None) -> Path:
    """Mean loss by position inside the window at one evaluation length (the longest by default)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    df = pd.DataFrame(rows) if not isinstance(rows, pd.DataFrame) else rows.copy()
    df["label"] = df.apply(label, axis=1)
    for col in ("eval_len", "position_start", "position_end"):
        df[col] = df[col].astype(int)
    df["loss"] = pd.to_numeric(df["loss"])
    n = eval_len or int(df["eval_len"].max())
    df = df[df["eval_len"] == n]
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for name, g in sorted(df.groupby("label")):
        g = g.groupby(["position_start", "position_end"])["loss"].mean().reset_index()
        mid = (g["position_start"] + g["position_end"]) / 2
        ax.plot(mid, g["loss"], marker=".", label=name)
    ax.set_xlabel(f"position inside the window (window {n})")
    ax.set_ylabel("mean loss (nats)")
    ax.set_title("Loss by position")
    ax.legend(fontsize=8, ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
