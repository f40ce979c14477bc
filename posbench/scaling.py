"""`posbench table scaling DIR`: does extrapolation hold as the model grows? Read from a folder of
runs that differ in model size and tokens trained (tasks/scaling.toml's axes):

- per scheme and size (at the token budget the most sizes share), and per scheme and budget (at the
  size the most budgets share): perplexity at the training length and the ratios ppl(4x)/ppl(1x) and
  ppl(16x)/ppl(1x), mean over seeds [95% t-interval];
- per scheme, the slope of the log ratio against log non-embedding parameters, and against log
  tokens, over every run (ordinary least squares, 95% t-interval of the slope);
- seed-paired differences of log perplexity between each scheme and a reference (rope) at every
  size and budget, with a Benjamini-Hochberg adjustment over the table's whole family of
  comparisons: "holds" and "reversed" are verdicts that survive it.

A run counts only if it learned: its final held-out loss below the unigram loss of its corpus.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

from posbench import results, stats
from posbench.errors import PosbenchError

RATIOS = (4, 16)
REFERENCE = "rope"
MADE_BY = "`posbench run tasks/scaling.toml --no-speed --out DIR`"


def runs_by_id(directory: Path) -> dict[str, dict]:
    """runs.csv's ok rows that carry a size (non_embedding_params) and learned, by run_id."""
    path = results.table_path(directory, "runs")
    rows = results.read_rows(path)
    if not rows:
        raise PosbenchError(f"no runs in {path}: make them with {MADE_BY}")
    out = {}
    for r in rows:
        if r.get("status") != "ok" or not r.get("non_embedding_params"):
            continue
        r["learned"] = float(r["final_val_loss"]) < float(r["unigram_val_loss"])
        out[r["run_id"]] = r
    if not out:
        raise PosbenchError(f"{path}: no finished run records its size (non_embedding_params): the scaling "
                            f"table reads runs made by {MADE_BY}")
    return out


def cells(directory: Path) -> list[dict]:
    """One record per learned run and eval-time variant: its label, seed, size, tokens and its
    loss at 1x and at each ratio of RATIOS (None where that length was not read or failed)."""
    from posbench.reporting import label

    runs = runs_by_id(directory)
    losses: dict = defaultdict(dict)
    for r in results.read_rows(results.table_path(directory, "extrapolation")):
        run = runs.get(r["run_id"])
        if run is None or r["mode"] != "nonoverlap" or r.get("status", "ok") != "ok" or r.get("extension", "none") != "none":
            continue
        ratio = int(r["eval_len"]) / int(r["train_len"])
        loss = float(r["loss"])
        if math.isfinite(loss):
            losses[(r["run_id"], label(r))][ratio] = loss
    out = []
    for (run_id, name), by_ratio in losses.items():
        run = runs[run_id]
        if 1 not in by_ratio or not run["learned"]:
            continue
        out.append({"label": name, "seed": int(run["seed"]), "params": int(run["non_embedding_params"]),
                    "tokens": int(run["tokens"]), "size": (int(run["d_model"]), int(run["n_layers"])),
                    "loss": by_ratio[1], **{f"x{k}": by_ratio.get(k) for k in RATIOS}})
    if not out:
        raise PosbenchError(f"{directory}: no learned run has a perplexity at its training length")
    return out


def _iv(values, fmt="{:.2f}") -> str:
    iv = stats.mean_interval(values)
    if iv.n == 0:
        return "-"
    if not iv.has_interval:
        return fmt.format(iv.mean)
    return f"{fmt.format(iv.mean)} [{fmt.format(iv.lo)}, {fmt.format(iv.hi)}]"


def _order(labels) -> list[str]:
    first = [REFERENCE, f"{REFERENCE}+yarn"]
    return [x for x in first if x in labels] + sorted(set(labels) - set(first))


def series(records: list[dict]) -> tuple[list[dict], list[dict]]:
    """The records of the size series (at the token budget that the most sizes share) and of the
    budget series (at the size that the most budgets share), ties to the level with more runs."""
    def widest(key, other):
        levels: dict = defaultdict(set)
        runs: dict = defaultdict(int)
        for r in records:
            levels[r[key]].add(r[other])
            runs[r[key]] += 1
        return max(levels, key=lambda v: (len(levels[v]), runs[v], v))

    budget, size = widest("tokens", "size"), widest("size", "tokens")
    return [r for r in records if r["tokens"] == budget], [r for r in records if r["size"] == size]


def _fmt_params(n: int) -> str:
    return f"{n / 1e6:.3g}M" if n >= 1e6 else f"{n / 1e3:.3g}k"


def level_table(records: list[dict], key: str, title: str) -> str:
    from posbench.reporting import markdown_table

    body = []
    for name in _order({r["label"] for r in records}):
        mine = [r for r in records if r["label"] == name]
        for level in sorted({r[key] for r in mine}):
            at = [r for r in mine if r[key] == level]
            shown = _fmt_params(level) if key == "params" else f"{level / 1e6:.2f}M"
            ratios = [_iv([math.exp(r[f"x{k}"] - r["loss"]) for r in at if r[f"x{k}"] is not None]) for k in RATIOS]
            body.append([f"`{name}`", shown, str(len(at)), _iv([math.exp(r["loss"]) for r in at], "{:.1f}"), *ratios])
    headers = ["scheme", title, "seeds", "ppl at 1x", *(f"ppl({k}x)/ppl(1x)" for k in RATIOS)]
    return markdown_table(headers, body)


def slope(xs: list[float], ys: list[float]) -> stats.Interval:
    """The least-squares slope of ys on xs with its 95% t-interval (n - 2 degrees of freedom)."""
    n = len(xs)
    if n < 3 or len(set(xs)) < 2:
        return stats.Interval(math.nan, math.nan, math.nan, n, math.nan)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    resid = sum((y - my - b * (x - mx)) ** 2 for x, y in zip(xs, ys))
    se = math.sqrt(resid / (n - 2) / sxx)
    half = stats.t_quantile(stats.LEVEL, n - 2) * se
    return stats.Interval(b, b - half, b + half, n, se)


def slope_table(by_size: list[dict], by_budget: list[dict]) -> str:
    """Per scheme: how log(ppl(kx)/ppl(1x)) moves per unit of log parameters and of log tokens."""
    from posbench.reporting import markdown_table

    body = []
    for name in _order({r["label"] for r in by_size + by_budget}):
        cells_ = []
        for records, key in ((by_size, "params"), (by_budget, "tokens")):
            for k in RATIOS:
                pts = [(math.log(r[key]), r[f"x{k}"] - r["loss"]) for r in records
                       if r["label"] == name and r[f"x{k}"] is not None]
                iv = slope([x for x, _ in pts], [y for _, y in pts])
                cells_.append("-" if math.isnan(iv.mean) else f"{iv.mean:+.3f} [{iv.lo:+.3f}, {iv.hi:+.3f}]")
        body.append([f"`{name}`", *cells_])
    headers = ["scheme", *(f"{k}x vs log N" for k in RATIOS), *(f"{k}x vs log D" for k in RATIOS)]
    return markdown_table(headers, body)


def t_test_p(values: list[float]) -> float:
    """Two-sided p of a one-sample t-test of mean zero (NaN below two values or with no spread)."""
    iv = stats.mean_interval(values)
    if iv.n < 2 or not iv.se > 0:
        return math.nan
    return 1 - stats.t_central(abs(iv.mean) / iv.se, iv.n - 1)


def pair_records(by_size: list[dict], by_budget: list[dict]) -> list[dict]:
    """Every scheme against the reference at each size and budget and ratio: the seed-paired
    difference of log perplexity (A - reference) over the seeds both learned."""
    out = []
    for records, key in ((by_size, "size"), (by_budget, "tokens")):  # a size is (d_model, layers): N varies by scheme
        index = {(r["label"], r[key], r["seed"]): r for r in records}
        labels = _order({r["label"] for r in records})
        for level in sorted({r[key] for r in records}):
            for name in labels:
                if name == REFERENCE:
                    continue
                for k in (1, *RATIOS):
                    col = "loss" if k == 1 else f"x{k}"
                    diffs = []
                    for (lab, lev, seed), a in index.items():
                        b = index.get((REFERENCE, lev, seed))
                        if lab == name and lev == level and b is not None and a[col] is not None and b[col] is not None:
                            diffs.append(a[col] - b[col])
                    if diffs:
                        first = next(r for r in records if r[key] == level)
                        out.append({"series": key, "level": level, "label": name, "ratio": k, "diffs": diffs,
                                    "p": t_test_p(diffs), "cell": (name, first["size"], first["tokens"], k)})
    # the point both series share is one comparison of the family, not two
    cells = list(dict.fromkeys(r["cell"] for r in out))
    p_of = {r["cell"]: r["p"] for r in out}
    q_of = dict(zip(cells, stats.benjamini_hochberg([p_of[c] for c in cells])))
    for record in out:
        record["q"] = q_of[record["cell"]]
    return out


def verdict(record: dict, alpha: float = stats.FDR) -> str:
    iv = stats.mean_interval(record["diffs"])
    if iv.n < 2:
        return "too few seeds"
    if math.isnan(record["q"]):
        return "no spread"
    if record["q"] < alpha:
        return "lower" if iv.mean < 0 else "higher"
    return "not separated"


def pairs_table(pairs: list[dict]) -> str:
    from posbench.reporting import markdown_table

    body = []
    for r in pairs:
        iv = stats.mean_interval(r["diffs"])
        level = (f"{r['level'][0]} x {r['level'][1]}" if r["series"] == "size"
                 else f"{r['level'] / 1e6:.2f}M tokens")
        ratio = (f"{math.exp(iv.mean):.3f} [{math.exp(iv.lo):.3f}, {math.exp(iv.hi):.3f}]" if iv.has_interval
                 else f"{math.exp(iv.mean):.3f}")
        q = "-" if math.isnan(r["q"]) else f"{r['q']:.2g}"
        body.append([f"`{r['label']}`", level, f"{r['ratio']}x", str(iv.n), ratio, q, verdict(r)])
    return markdown_table(["scheme", "d_model x layers or budget", "length", "seed pairs", f"ppl ratio to {REFERENCE}", "q (BH)",
                           "verdict"], body)


def ordering_table(pairs: list[dict]) -> str:
    """Per scheme and ratio: in how many of the sizes and budgets measured the scheme is lower (or
    higher) than the reference, as verdicts of pairs_table."""
    from posbench.reporting import markdown_table

    groups: dict = defaultdict(list)
    for r in pairs:
        groups[(r["label"], r["ratio"], r["series"])].append(verdict(r))
    body = []
    for (name, k, key), verdicts in sorted(groups.items(), key=lambda g: (_order([g[0][0]]), g[0][1], g[0][2])):
        n = len(verdicts)
        lower, higher = verdicts.count("lower"), verdicts.count("higher")
        if lower == n:
            summary = f"lower than {REFERENCE} at every one"
        elif higher == n:
            summary = f"higher than {REFERENCE} at every one"
        else:
            summary = f"{lower} lower, {higher} higher, {n - lower - higher} not separated"
        body.append([f"`{name}`", f"{k}x", "sizes" if key == "size" else "budgets", str(n), summary])
    return markdown_table(["scheme", "length", "over", "levels", "ordering against " + REFERENCE], body)


def plot(by_size: list[dict], by_budget: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    k = RATIOS[-1]
    for ax, records, key, xlabel in ((axes[0], by_size, "params", "non-embedding parameters"),
                                     (axes[1], by_budget, "tokens", "training tokens")):
        for name in _order({r["label"] for r in records}):
            xs, means, los, his = [], [], [], []
            for level in sorted({r[key] for r in records if r["label"] == name}):
                values = [math.exp(r[f"x{k}"] - r["loss"]) for r in records
                          if r["label"] == name and r[key] == level and r[f"x{k}"] is not None]
                iv = stats.mean_interval(values)
                if iv.n:
                    xs.append(level)
                    means.append(iv.mean)
                    los.append(iv.mean - iv.lo if iv.has_interval else 0)
                    his.append(iv.hi - iv.mean if iv.has_interval else 0)
            ax.errorbar(xs, means, yerr=[los, his], marker="o", capsize=3, label=name)
        ax.set_xscale("log")
        ax.set_xlabel(xlabel)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.grid(alpha=0.3, which="both")
    axes[0].set_ylabel(f"ppl({k}x) / ppl(1x), 95% interval over seeds")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def scaling(directory: Path, *, figure: str | Path | None = None) -> str:
    """The scaling tables of a results folder (see the module's docstring); `figure`: where to
    write the plot of ppl(16x)/ppl(1x) against parameters and tokens."""
    records = cells(Path(directory))
    by_size, by_budget = series(records)
    pairs = pair_records(by_size, by_budget)
    budget, size = by_size[0]["tokens"], by_budget[0]["size"]
    if figure is not None:
        plot(by_size, by_budget, Path(figure))
    parts = [f"**By size** (non-embedding parameters N, at {budget / 1e6:.2f}M training tokens):", "",
             level_table(by_size, "params", "N"), "",
             f"**By training tokens** D (at d_model {size[0]}, {size[1]} layers):", "",
             level_table(by_budget, "tokens", "D"), "",
             "**Slopes** of log(ppl(kx)/ppl(1x)) against log N and log D (least squares over every learned run, "
             "95% interval; negative: the ratio falls as the model or its budget grows):", "",
             slope_table(by_size, by_budget), "",
             f"**Seed-paired** against {REFERENCE}: perplexity ratio exp(mean over seeds of the log difference), "
             f"95% t-interval; q (BH): Benjamini-Hochberg over the {len({r['cell'] for r in pairs})} comparisons of this "
             "table (the point both series share counted once); "
             "lower or higher: q < 0.05:", "",
             pairs_table(pairs), "",
             "**Orderings** (verdicts of the table above):", "",
             ordering_table(pairs)]
    return "\n".join(parts)
