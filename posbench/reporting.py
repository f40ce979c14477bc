"""Tables and plots from result files: the rich tables of `extrapolate` and `probe`, PNG plots,
report.md. Probe results are rendered from probes.csv alone, whatever the probe."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

import pandas as pd
from rich.table import Table

from posbench import effective, machine, results, stats
from posbench.config import RANDOMIZED
from posbench.errors import PosbenchError


def changed_params(scheme: str, params) -> str:
    """The `params` of a result row (`describe()`: "k=v,...") that differ from the scheme's
    defaults, so that runs of one scheme with other parameters are not averaged as seeds."""
    from posbench.schemes import SCHEMES

    if scheme not in SCHEMES or not isinstance(params, str):
        return ""
    defaults = {k: str(v) for k, v in SCHEMES[scheme].defaults.items()}
    pairs = (item.partition("=") for item in params.split(",") if item)
    return ",".join(f"{k}={v}" for k, _, v in pairs if defaults.get(k) != v)


def label(row) -> str:
    """scheme with the parameters that differ from its defaults, a fine-tuned child's method, target
    length and budget (`>method@L':steps`), plus the eval-time variant when there is one: rope,
    rope(fraction=0.25), rope>yarn@256:50, rope+yarn, learned+hierarchical."""
    out = row["scheme"]
    changed = changed_params(out, row.get("params"))
    if changed:
        out += f"({changed})"
    if str(row.get("extend_method", "")) not in ("", "nan", "None"):
        out += f">{row['extend_method']}@{int(float(row['extend_len']))}:{int(float(row['extend_steps']))}"
    if str(row.get("scaling", "none")) not in ("none", "", "nan"):
        out += f"+{row['scaling']}"
    if str(row.get("extension", "none")) not in ("none", "", "nan"):
        out += f"+{row['extension']}"
    # runs.csv says `randomized` (`float` for RFS); evaluation rows of a randomized run have
    # position draws, and those of an RFS run say `float` in position_sampling
    if "float" in (str(row.get("randomized")), str(row.get("position_sampling"))):
        out += "+rfs"
    elif str(row.get("randomized", "False")) == "True" or pd.to_numeric(row.get("position_draws"), errors="coerce") > 0:
        out += RANDOMIZED
    return out


LABEL_COLUMNS = ("scheme", "params", "extend_method", "extend_len", "extend_steps", "scaling", "extension",
                 "randomized", "position_sampling", "position_draws")  # what `label` reads


def labels(df: pd.DataFrame) -> list[str]:
    """`label` of every row of `df`, worked out once for each distinct set of the columns it reads."""
    columns = [c for c in LABEL_COLUMNS if c in df]
    seen: dict[tuple, str] = {}
    out = []
    for values in zip(*(df[c].tolist() for c in columns)):
        key = tuple(map(str, values))
        if key not in seen:
            seen[key] = label(dict(zip(columns, values)))
        out.append(seen[key])
    return out


def labelled_frame(rows, value: str) -> pd.DataFrame:
    """Rows as a frame with each row's `label`, `value` numeric (missing: NaN) and integer lengths."""
    df = pd.DataFrame(rows) if not isinstance(rows, pd.DataFrame) else rows.copy()
    df["label"] = labels(df)
    df[value] = pd.to_numeric(df.get(value), errors="coerce")
    df["eval_len"] = df["eval_len"].astype(int)
    return df


def extrapolation_frame(rows) -> pd.DataFrame:
    df = labelled_frame(rows, "ppl")
    df["loss_se"] = pd.to_numeric(df["loss_se"], errors="coerce") if "loss_se" in df else math.nan
    return df


def label_grid(df: pd.DataFrame, value: str, fmt) -> tuple[list[int], list[list[str]]]:
    """Scheme variants (rows, by `label`) x evaluation lengths of `df[value]`: each row starts with
    its label and its number of seeds; a cell is fmt(length, rows of that label and length), with
    "(n=K)" when fewer seeds than the row's have it, the status where the value is missing (e.g.
    unsupported), empty where there is no row."""
    lengths = sorted(int(n) for n in df["eval_len"].unique())
    if "seed" not in df:  # rows that do not say: one seed
        df = df.assign(seed=0)
    out = []
    for name in sorted(df["label"].unique(), key=lambda s: (s.split("+")[0], s)):
        rows = df[df["label"] == name]
        seeds = rows["seed"].nunique()
        cells = [f"{name} ({seeds} seed{'s' if seeds > 1 else ''})"]
        for n in lengths:
            g = rows[rows["eval_len"] == n]
            if g.empty:
                cells.append("")
            elif g[value].isna().all():
                cells.append(str(g["status"].iloc[0]))
            else:
                have = g.dropna(subset=[value])["seed"].nunique()
                cells.append(fmt(n, g) + (f" (n={have})" if have < seeds else ""))
        out.append(cells)
    return lengths, out


NOT_LEARNED = "not learned"  # probes.csv status of a run below the learned threshold in length
SEED_NOTE = "several seeds: mean [95% t-interval over seeds]; one seed: {within}"


def ppl_grid(rows, mark) -> tuple[list[int], list[list[str]]]:
    """Schemes x lengths cells: mean perplexity over seeds with its 95% interval when several, the
    value ± its standard error over windows when one, the status where there is no number, and
    `mark(text)` on the best (lowest mean) of each column."""
    df = extrapolation_frame(rows)
    best = df.groupby(["label", "eval_len"])["ppl"].mean().groupby(level="eval_len").min()

    def fmt(n, g):
        iv = stats.mean_interval(g["ppl"])
        if iv.n > 1:
            text = f"{iv.mean:.2f} [{iv.lo:.2f}, {iv.hi:.2f}]"
        else:
            se = iv.mean * float(g["loss_se"].max())  # delta method: d ppl = ppl * d loss
            text = f"{iv.mean:.2f}" + (f" ± {se:.2f}" if math.isfinite(se) else "")
        return mark(text) if iv.mean == best.loc[n] else text

    return label_grid(df, "ppl", fmt)


PPL_NOTE = SEED_NOTE.format(within="± standard error over windows")
BEST_NOTE = "* the lowest (best) mean perplexity at that length, in bold"


SCORED = ("ok", NOT_LEARNED)  # rows with numbers (a not-learned run keeps its numbers)


def pooled_accuracy(rows: pd.DataFrame, by: str = "run_id") -> pd.DataFrame:
    """Per-answer accuracy of probe rows per `by` (a run, or a seed of one label): right answers and
    answers summed over its rows (depths, variants), and their ratio. The one accuracy the probe
    tables (posbench.tables) and the report read."""
    rows = rows.assign(answers=pd.to_numeric(rows["answers"]), hits=pd.to_numeric(rows["hits"]))
    pooled = rows.groupby(by)[["hits", "answers"]].sum()
    return pooled.assign(accuracy=pooled["hits"] / pooled["answers"])


def accuracy_interval(g: pd.DataFrame) -> tuple[float, float, float, int]:
    """Per-answer accuracy of one label and length, right answers and answers pooled over the
    other columns (depth, variant) within each run: (mean, lo, hi, seeds), the 95% t-interval
    over seeds (clipped to [0, 1]) when several, the Wilson interval over its answers when one."""
    per_run = pooled_accuracy(g[g["status"].isin(SCORED)])
    iv = stats.mean_interval(per_run["accuracy"])
    if iv.n > 1:
        return iv.mean, max(iv.lo, 0.0), min(iv.hi, 1.0), iv.n
    lo, hi = stats.wilson(int(per_run["hits"].iloc[0]), int(per_run["answers"].iloc[0]))
    return iv.mean, lo, hi, iv.n


def accuracy_cell(g: pd.DataFrame) -> str:
    """accuracy_interval as text: `mean [lo, hi]` over seeds, `value (lo–hi)` over trials."""
    mean, lo, hi, n = accuracy_interval(g)
    if n > 1:
        return f"{100 * mean:.0f}% [{100 * lo:.0f}, {100 * hi:.0f}]"
    return f"{100 * mean:.0f}% ({100 * lo:.0f}–{100 * hi:.0f})"


def ppl_interval(g: pd.DataFrame) -> tuple[float, float, float]:
    """Perplexity of one label and length: (mean, lo, hi), the 95% t-interval over seeds when
    several, the row's own 95% interval over windows (ppl_lo, ppl_hi) when one (NaN where the
    row has none)."""
    iv = stats.mean_interval(g["ppl"])
    if iv.n > 1:
        return iv.mean, iv.lo, iv.hi
    row = g.dropna(subset=["ppl"]).iloc[0]
    lo, hi = (float(pd.to_numeric(row.get(k, math.nan), errors="coerce")) for k in ("ppl_lo", "ppl_hi"))
    return iv.mean, lo if math.isnan(lo) else max(lo, 1.0), hi  # no perplexity is below 1 (older rows' bounds were)


ACCURACY_NOTE = SEED_NOTE.format(within="(Wilson 95% interval over its answers)")
NOT_LEARNED_LABEL = " - not learned in length"
NOT_LEARNED_NOTE = (f"a row marked `{NOT_LEARNED_LABEL.strip(' -')}` stayed below the learned threshold at its "
                    "training length: its longer cells are numbers, not an extrapolation verdict")


def probe_frame(rows) -> pd.DataFrame:
    """probes.csv rows labelled as other results, a run that did not learn its probe in length
    marked in its label (tables and heatmaps say so on its row)."""
    df = labelled_frame(rows, "accuracy")
    missed = set(df.loc[df["status"] == NOT_LEARNED, "run_id"])
    df["label"] = [lab + NOT_LEARNED_LABEL if run in missed else lab for lab, run in zip(df["label"], df["run_id"])]
    return df


def ppl_table(rows, title: str = "perplexity (lower is better)", effective_lengths: dict | None = None) -> Table:
    """The rich table: best per column in bold green with a star; `effective_lengths` (label ->
    text) adds a column."""
    lengths, cells = ppl_grid(rows, lambda text: f"[bold green]{text}*[/]")
    train_lens = sorted(extrapolation_frame(rows)["train_len"].astype(int).unique())
    table = Table(title=f"{title}; trained at {', '.join(map(str, train_lens))}",
                  caption=f"{PPL_NOTE}\n{BEST_NOTE}")
    table.add_column("scheme")
    for n in lengths:
        table.add_column(str(n), justify="right")
    if effective_lengths is not None:
        table.add_column("effective length", justify="right")
    for row in cells:
        name = row[0].rsplit(" (", 1)[0]
        table.add_row(*row, *([effective_lengths.get(name, "-")] if effective_lengths is not None else []))
    return table


def length_header(df: pd.DataFrame, n: int) -> str:
    """A length, with its ratio to the training length when every row shares one."""
    train = sorted(df["train_len"].astype(int).unique())
    return f"{n} ({n / train[0]:g}x)" if len(train) == 1 else str(n)


def probe_grid(df: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """Headers and rows of one probe: accuracy by scheme variant and length, pooled over the
    probe's variants (e.g. key depths), with its interval over seeds or trials (accuracy_cell)."""
    lengths, body = label_grid(df, "accuracy", lambda n, g: accuracy_cell(g))
    return ["scheme"] + [length_header(df, n) for n in lengths], body


def probe_tables(rows) -> list[Table]:
    """One rich table per probe."""
    df = probe_frame(rows)
    tables = []
    for probe, g in sorted(df.groupby("probe")):
        headers, body = probe_grid(g)
        train = ", ".join(map(str, sorted(g["train_len"].astype(int).unique())))
        table = Table(title=f"{probe}: per-answer accuracy (higher is better); trained at {train}",
                      caption=f"{ACCURACY_NOTE}; {NOT_LEARNED_NOTE}")
        for i, h in enumerate(headers):
            table.add_column(h, justify="right" if i else "left")
        for cells in body:
            table.add_row(*cells)
        tables.append(table)
    return tables


def plot_probe_heatmap(df: pd.DataFrame, path: Path, title: str) -> Path:
    """Accuracy by scheme variant (rows) and prompt length (columns), annotated with the value and
    its 95% interval (accuracy_interval)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    lengths = sorted(df["eval_len"].unique())
    names = sorted(df["label"].unique(), key=lambda s: (s.split("+")[0], s))
    cells = {key: accuracy_interval(g) for key, g in df.groupby(["label", "eval_len"])
             if g["status"].isin(SCORED).any()}
    grid = np.array([[cells[(s, n)][0] if (s, n) in cells else np.nan for n in lengths] for s in names])
    fig, ax = plt.subplots(figsize=(1.2 * len(lengths) + 2.6, 0.55 * len(names) + 1.6))
    cmap = matplotlib.colormaps["RdYlGn"].with_extremes(bad="lightgrey")
    ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=0, vmax=1, aspect="auto")
    for i in range(len(names)):
        for j in range(len(lengths)):
            v = grid[i, j]
            dark = not math.isnan(v) and (v < 0.15 or v > 0.85)  # the ends of the colour map
            colour = "white" if dark else "black"
            if math.isnan(v):
                ax.text(j, i, "n/a", ha="center", va="center", fontsize=9, color=colour)
                continue
            _, lo, hi, _ = cells[(names[i], lengths[j])]
            ax.text(j, i - 0.12, f"{100 * v:.0f}", ha="center", va="center", fontsize=9, color=colour)
            ax.text(j, i + 0.22, f"{100 * lo:.0f}–{100 * hi:.0f}", ha="center", va="center",
                    fontsize=6, color=colour)
    ax.set_xticks(range(len(lengths)), [length_header(df, n) for n in lengths], fontsize=8)
    ax.set_yticks(range(len(names)), names, fontsize=8)
    for i, name in enumerate(names):  # a run that did not learn the probe: its row hatched
        if name.endswith(NOT_LEARNED_LABEL):
            ax.add_patch(matplotlib.patches.Rectangle((-0.5, i - 0.5), len(lengths), 1, fill=False,
                                                      hatch="//", edgecolor="grey", linewidth=0))
    ax.set_xlabel("prompt length (tokens)")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return results.save_figure(fig, path, 110)


def seed_accuracies(g: pd.DataFrame) -> list[float]:
    """Each seed's (run's) per-answer accuracy in one label and length, variants pooled, as
    accuracy_interval pools them."""
    return sorted(pooled_accuracy(g[g["status"].isin(SCORED)])["accuracy"].tolist())


def plot_probe_seeds(df: pd.DataFrame, path: Path, title: str) -> Path:
    """A strip plot per cell: one panel per prompt length, in it per scheme variant every seed's
    accuracy as a point (spread sideways where seeds coincide), the median as a bar and the mean
    as a diamond. What a mean over all-or-nothing seeds hides (95, 90 and 0) shows here."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lengths = sorted(df["eval_len"].unique())
    names = sorted(df["label"].unique(), key=lambda s: (s.split("+")[0], s))
    fig, axes = plt.subplots(1, len(lengths), figsize=(max(3.0, 0.45 * len(names) + 1.2) * len(lengths), 3.6),
                             sharey=True, squeeze=False)
    for ax, n in zip(axes[0], lengths):
        for i, name in enumerate(names):
            g = df[(df["label"] == name) & (df["eval_len"] == n)]
            values = seed_accuracies(g) if g["status"].isin(SCORED).any() else []
            if not values:
                continue
            # seeds at the same value side by side, centred on the scheme's place
            xs, seen = [], {}
            for v in values:
                k = seen.setdefault(round(v, 3), [0])
                xs.append(i + 0.09 * ((k[0] + 1) // 2) * (1 if k[0] % 2 else -1))
                k[0] += 1
            ax.scatter(xs, [100 * v for v in values], s=16, color=f"C{i % 10}", alpha=0.8, zorder=3)
            _, median, _ = stats.quartiles(values)
            ax.hlines(100 * median, i - 0.3, i + 0.3, color="black", linewidth=1.2, zorder=2)
            ax.scatter([i], [100 * sum(values) / len(values)], marker="D", s=18, facecolor="none",
                       edgecolor="black", zorder=4)
        ax.set_xticks(range(len(names)), names, rotation=60, ha="right", fontsize=7)
        ax.set_title(length_header(df, n), fontsize=8)
        ax.set_ylim(-5, 105)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("per-answer accuracy, %")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return results.save_figure(fig, path, 110)


def probes_markdown(rows, directory: Path) -> list[str]:
    """report.md's probe section: per probe a table and a heatmap (probe_<name>.png)."""
    df = probe_frame(rows)
    md = ["## Probes", "", "Per-answer accuracy (higher is better) per prompt length, pooled over the "
          f"probe's variants (e.g. key depths); {ACCURACY_NOTE}; `unsupported`: the scheme has no "
          f"positions that far; {NOT_LEARNED_NOTE}.", ""]
    for probe, g in sorted(df.groupby("probe")):
        specs = ", ".join(f"`{s}`" for s in sorted(g["spec"].unique()))
        stem = "probe_" + probe.replace(":", "-")  # ruler:cwe: no colon in a file name (Windows) or a link (a URL scheme)
        path = plot_probe_heatmap(g, directory / f"{stem}.png", f"{probe} accuracy, % (below: its 95% interval)")
        chance = pd.to_numeric(g.get("chance"), errors="coerce").max()
        level = f" Chance per answer: {100 * chance:.3g}%." if chance == chance else ""
        missed = sorted(g.loc[g["label"].str.endswith(NOT_LEARNED_LABEL), "label"].unique())
        verdict = (" Not learned in length (no extrapolation reading): " + ", ".join(
            m[: -len(NOT_LEARNED_LABEL)] for m in missed) + ".") if missed else ""
        md += [f"### {probe}", "", f"Trained on {specs}.{level}{verdict}", "", markdown_table(*probe_grid(g)), "",
               f"![{path.stem}]({path.name})", ""]
        if g.groupby("label")["seed"].nunique().max() > 1:  # over seeds: every seed a point
            seeds = plot_probe_seeds(g, directory / f"{stem}_seeds.png",
                                     f"{probe}: each seed's accuracy (bar: median; diamond: mean)")
            md += [f"![{seeds.stem}]({seeds.name})", ""]
    return md


def line_style(i: int) -> dict:
    """Distinct colour and marker for the i-th line (more lines than one colour cycle holds)."""
    import matplotlib.pyplot as plt

    colours = plt.get_cmap("tab20").colors
    return {"color": colours[(2 * i) % 20 + (i // 10) % 2], "marker": "os^Dv<>ph*"[i % 10],
            "markersize": 4}


def plot_extrapolation(rows, path: Path) -> Path:
    """Perplexity vs evaluation length (log-x), one line per scheme variant, training length marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    df = extrapolation_frame(rows).dropna(subset=["ppl"])
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for i, (name, g) in enumerate(sorted(df.groupby("label"))):
        lengths = sorted(g["eval_len"].unique())
        mean, lo, hi = zip(*(ppl_interval(g[g["eval_len"] == n]) for n in lengths))
        style = line_style(i)
        ax.plot(lengths, mean, label=name, **style)
        ax.fill_between(lengths, lo, hi, color=style["color"], alpha=0.18, linewidth=0)
    for n in sorted(df["train_len"].astype(int).unique()):
        ax.axvline(n, color="grey", linestyle="--", linewidth=1)
        ax.text(n, ax.get_ylim()[1], f" train {n}", va="top", fontsize=8, color="grey")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("evaluation length (tokens)")
    ax.set_ylabel("perplexity")
    ax.set_title("Length extrapolation (bands: 95% interval over seeds, or over windows for one seed)",
                 fontsize=10)
    ax.legend(fontsize=8, ncol=2)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    return results.save_figure(fig, path, 120)


def plot_positions(rows, path: Path, eval_len: int | None = None) -> Path:
    """Mean loss by position inside the window at one evaluation length (the longest by default)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    df = pd.DataFrame(rows) if not isinstance(rows, pd.DataFrame) else rows.copy()
    df["label"] = labels(df)
    for col in ("eval_len", "position_start", "position_end"):
        df[col] = df[col].astype(int)
    df["loss"] = df["loss"].astype(float)  # "nan" or "inf" where a length's loss diverged (pd.to_numeric refuses them)
    n = eval_len or int(df["eval_len"].max())
    df = df[df["eval_len"] == n]
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for i, (name, g) in enumerate(sorted(df.groupby("label"))):
        g = g.groupby(["position_start", "position_end"])["loss"].mean().reset_index()
        mid = (g["position_start"] + g["position_end"]) / 2 + 1  # 1-based, for the log axis
        ax.plot(mid, g["loss"], label=name, **line_style(i))
    if "train_len" in df:  # rows written before the column existed have it empty
        for t in sorted(pd.to_numeric(df["train_len"], errors="coerce").dropna().astype(int).unique()):
            ax.axvline(t, color="grey", linestyle="--", linewidth=1)
    ax.set_xscale("log", base=2)
    ax.set_xlabel(f"position inside the window, 1-based (window {n}; dashed: training length)")
    ax.set_ylabel("mean loss (nats)")
    ax.set_title("Loss by position")
    ax.legend(fontsize=8, ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return results.save_figure(fig, path, 120)


def markdown_table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def ppl_markdown(df: pd.DataFrame) -> str:
    """The markdown table: best per column in bold."""
    lengths, cells = ppl_grid(df, lambda text: f"**{text}**")
    return markdown_table(["scheme"] + [str(n) for n in lengths], cells)


def speed_markdown(df: pd.DataFrame) -> str:
    df = df[df["status"] == "ok"].copy()
    df["median_ms"] = pd.to_numeric(df["median_ms"])
    df["ratio_vs_none"] = pd.to_numeric(df["ratio_vs_none"])
    df["seq_len"] = df["seq_len"].astype(int)
    parts = []
    # One table per configuration: rows of several shapes or machines must not share a cell.
    shape = [c for c in ("batch", "heads", "head_dim", "device_name") if c in df]
    for (pass_, device, dtype, *config), g in df.groupby(["pass", "device", "dtype", *shape]):
        where = ", ".join(f"{k} {v}" for k, v in zip(shape, config))
        lengths = sorted(g["seq_len"].unique())
        rows = []
        for scheme, s in g.groupby("scheme"):
            by = s.set_index("seq_len")
            rows.append([f"{scheme} ({s['backend'].iloc[0]})"] + [
                f"{by.loc[n, 'median_ms']:.2f} ms ({by.loc[n, 'ratio_vs_none']:.2f}x)" if n in by.index else ""
                for n in lengths])
        parts.append(f"**{pass_}**, {device}, {dtype}, {where} (median; ratio to `none`, lower is better)\n\n"
                     + markdown_table(["scheme"] + [str(n) for n in lengths], rows))
    return "\n\n".join(parts)


def effective_text(row: dict) -> str:
    """One run's effective length for a table: 256 (4x), >=1024 (16x) when censored, - when none."""
    if row["status"] == NOT_LEARNED:
        return NOT_LEARNED
    if row["status"] == "no reference" or row.get("effective_len") in (None, ""):
        return "-"
    n, ratio = int(row["effective_len"]), float(row["ratio"])
    return f"{'≥' if row['status'] == 'censored' else ''}{n} ({ratio:g}x)"


def effective_by_label(rows: list[dict]) -> dict[str, str]:
    """label -> effective lengths, for a table of one protocol per label (the console summary)."""
    out = defaultdict(list)
    for (name, _), value in effective_cells(rows).items():
        out[name].append(value)
    return {name: "; ".join(v) for name, v in out.items()}


def effective_cells(rows: list[dict]) -> dict[tuple[str, str], str]:
    """(label, protocol) -> the effective lengths of its seeds, one value when they agree."""
    by = defaultdict(list)
    for r in sorted(rows, key=lambda r: (r["status"] == "censored", int(r.get("effective_len") or -1))):
        by[(label(r), r["protocol"])].append(effective_text(r))
    return {k: ", ".join(dict.fromkeys(v)) for k, v in by.items()}


def effective_markdown(rows: list[dict]) -> str:
    """One table per task: scheme variants x protocols, the effective length of each run."""
    parts = []
    for task in sorted({r["task"] for r in rows}):
        mine = [r for r in rows if r["task"] == task]
        texts = effective_cells(mine)
        protocols = sorted({p for _, p in texts}, key=lambda p: (p not in ("nonoverlap",), p))
        labels = sorted({name for name, _ in texts}, key=lambda s: (s.split("+")[0], s))
        body = [[name] + [texts.get((name, p), "") for p in protocols] for name in labels]
        parts.append(f"### {task}\n\n" + markdown_table(["scheme"] + protocols, body))
    return "\n\n".join(parts)


def write_report(directory: Path | str, tolerance: float | None = None, threshold: float | None = None,
                 share: float | None = None) -> Path:
    """report.md and PNG plots from the CSVs in `directory`, and effective_length.csv (perplexity
    within `tolerance` of in-distribution, accuracy at least `threshold`)."""
    directory = Path(directory)
    results.check_folder(directory)  # every table before anything is written: a damaged one changes nothing
    read = lambda t: pd.DataFrame(results.read_rows(results.table_path(directory, t)))  # noqa: E731
    runs, ext, pos, speed = read("runs"), read("extrapolation"), read("positions"), read("speed")
    probes = results.read_probes(directory)
    if ext.empty and runs.empty and speed.empty and not probes:
        raise PosbenchError(
            f"no results in {directory} (expected runs.csv, extrapolation.csv, probes.csv or speed.csv)"
        )
    md = ["# posbench report", ""]
    if not runs.empty:
        ok = runs[runs["status"] == "ok"]
        # the probe a run was trained on, where probes.csv says (runs.csv does not)
        data = {r["run_id"]: r.get("spec", "") for r in probes}
        ok = ok.assign(label=[label(r) for r in ok.to_dict("records")],
                       data=[data.get(r, "") for r in ok["run_id"]]).sort_values(["data", "label", "seed"])
        md += ["## Runs", "", markdown_table(
            ["run", "scheme", "probe", "seed", "train_len", "steps", "params", "val loss", "unigram",
             "tokens/s", "backend"],
            [[r.run_id, r.label, r.data, r.seed, r.train_len, r.steps, r.n_params, _num(r.final_val_loss),
              _num(r.unigram_val_loss), _num(r.tokens_per_second, 0), r.backend] for r in ok.itertuples()]), ""]
        mixed = machine.mixture(runs.to_dict("records"), "This folder")
        if mixed:
            md += [f"Note: {mixed}.", ""]
        failed = runs[runs["status"] != "ok"]
        for r in failed.itertuples():
            md.append(f"- {r.run_id}: {r.status} {r.message}")
    if not ext.empty:
        md += ["## Extrapolation", "", "Perplexity on the test split (lower is better; best mean per "
               f"column in bold; {PPL_NOTE}).", ""]
        for (mode, stride), g in ext.groupby(["mode", "stride"]):
            title = f"{mode}" + (f", stride {stride}" if mode == "sliding" else "")
            md += [f"### {title}", "", ppl_markdown(g), ""]
        nonoverlap = ext[ext["mode"] == ext["mode"].iloc[0]]
        plot_extrapolation(nonoverlap, directory / "extrapolation.png")
        md += ["![extrapolation](extrapolation.png)", ""]
    if not pos.empty:
        plot_positions(pos, directory / "positions.png")
        md += ["## Loss by position", "", "![positions](positions.png)", ""]
    if probes:
        md += probes_markdown(probes, directory)
    tolerance = effective.TOLERANCE if tolerance is None else tolerance
    threshold = effective.THRESHOLD if threshold is None else threshold
    share = effective.SHARE if share is None else share
    eff = effective.write(directory, tolerance, threshold, share)
    if eff:
        md += ["## Effective length", "", f"Per run, the longest evaluated length from the training length "
               f"up at which perplexity stays within {tolerance:.0%} of its value at the training length "
               f"(relative basis), or probe accuracy at least {threshold:.0%} of the way from chance to 100% "
               f"(a probe's column: absolute basis, as RULER's fixed score) or at least {share:.0%} of the run's "
               "own accuracy at the training length (PROBE/relative: relative basis, as NoLiMa's) (≥: held to "
               "the longest length evaluated; -: no in-distribution value or already below; `not learned`: "
               "below the learned threshold at the training length; one value per seed when they differ).",
               "", effective_markdown(eff), ""]
    if not speed.empty:
        md += ["## Attention cost", "", speed_markdown(speed), ""]
    path = directory / "report.md"
    results.write_atomic(path, "\n".join(md) + "\n")
    return path


def _num(value, digits: int = 4) -> str:
    try:
        return f"{float(value):,.{digits}f}"
    except (TypeError, ValueError):
        return str(value)
