"""The markdown tables of README.md and results/*/README.md, made from a results folder's CSVs:
`table(name, directory, **options)`, what `posbench table NAME DIR` prints. Every table is written
by reporting.markdown_table; intervals are stats.py's (the t-interval over seeds, the Wilson interval
of pooled answers). The tables and their options: posbench/docs/results.md.

    headline    the README's headline: a few schemes' perplexity at 1x, 4x, 16x with their
                interval over seeds, and their effective length (DIR: the results root, with
                catalogue/ and layouts/); figure=PATH also writes its plot
    probes      the probe suite: steps to the early stop and accuracy per ratio (one folder), or
                over seeds (seeds, compact), seed-paired differences (pairs), learning curves (curves)
    extend      extension methods: perplexity by method and budget, paired ratios, passkey accuracy
    pretrained  a pretrained model under the scaling policies: perplexity, inside and past its
                context, effective length, passkey
    attention   attention measures by length beside perplexity, or one measure per layer
    speed       attention cost per scheme and length (speed.csv), one table per pass and shape
    scaling     extrapolation by model size and training tokens: ratios, slopes, seed-paired verdicts
                (posbench.scaling); figure=PATH also writes its plot
"""

from __future__ import annotations

import inspect
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

import pandas as pd

from posbench import results, stats
from posbench.config import parse_list
from posbench.errors import PosbenchError, did_you_mean
from posbench.reporting import effective_text, label, labels, markdown_table
from posbench.runs import data_spec
from posbench.scaling import scaling as scaling_table

PathLike = str | Path


# ---- options ------------------------------------------------------------------------------------

def _ints(value, what: str) -> tuple[int, ...]:
    found = parse_list(value, int, what)
    if min(found) < 1:
        raise PosbenchError(f"bad {what} {value!r}: expected positive integers")
    return found


def _words(value, what: str) -> list[str]:
    return list(parse_list(value, str, what))


def _rows(directory: Path, table: str, made_by: str) -> list[dict]:
    rows = results.read_rows(results.table_path(directory, table))
    if not rows:
        raise PosbenchError(f"no {table}.csv rows in {directory}: {made_by} writes them")
    return rows


# ---- headline -----------------------------------------------------------------------------------

# (results folder, labels as the tables print them), in the order of the table
HEADLINE_ROWS = [
    ("catalogue", ["none", "rope", "rope+yarn", "alibi", "kerple", "xl", "fox", "stickbreaking"]),
    ("layouts", ["rnope-swa", "swan"]),
]
# the 2026 frontier: rows of the table, left out of the figure (they lie on rope's curve or above)
HEADLINE_FRONTIER = [
    ("catalogue", ["grape", "selective-rope"]),
    ("layouts", ["rope+sink", "rope+gate"]),
]
HEADLINE_LENGTHS = (64, 256, 1024)


def headline_rows(directory: Path, table: str, groups=HEADLINE_ROWS) -> list[dict]:
    """The rows of `table` whose label is one of the headline's, each from its own folder."""
    out = []
    for folder, names in groups:
        rows = _rows(directory / folder, table, f"`posbench run {folder} --seeds 0,1,2 --no-speed`")
        out += [r for r in rows if label(r) in names]
    return out


def headline(directory: Path, *, figure: PathLike | None = None) -> str:
    """Perplexity at 1x, 4x and 16x (mean [95% t-interval over seeds]) and the effective length of
    the headline schemes, read from DIR/catalogue and DIR/layouts; `figure`: where to write the
    plot of the headline schemes but the frontier's (README.md shows results/headline.png)."""
    from posbench import reporting

    groups = HEADLINE_ROWS + HEADLINE_FRONTIER
    df = reporting.extrapolation_frame(headline_rows(directory, "extrapolation", groups))
    effective = reporting.effective_cells(headline_rows(directory, "effective_length", groups))
    body = []
    for _, names in groups:
        for name in names:
            mine = df[df["label"] == name]
            cells = []
            for n in HEADLINE_LENGTHS:
                iv = stats.mean_interval(mine[mine["eval_len"] == n]["ppl"])
                cells.append(f"{iv.mean:.1f} [{iv.lo:.1f}, {iv.hi:.1f}]")
            body.append([f"`{name}`", str(mine["seed"].nunique()), *cells, effective.get((name, "nonoverlap"), "-")])
    if figure is not None:
        reporting.plot_extrapolation(headline_rows(directory, "extrapolation"), Path(figure))
    first = HEADLINE_LENGTHS[0]
    headers = ["scheme", "seeds", *(f"{n} ({n // first}x)" for n in HEADLINE_LENGTHS), "effective length"]
    return markdown_table(headers, body)


# ---- probes -------------------------------------------------------------------------------------

PROBE_ORDER = ["mqar", "passkey", "multikey", "multivalue", "multiquery", "vartrack", "copy", "reverse", "sort",
               "parity", "addition"]  # the order of results/probes/README.md; probes not named here follow
PROBE_COLUMNS = ["none", "rope", "rope+randomized", "alibi", "t5", "kerple", "fire", "fox", "rnope-swa"]
PROBES_BY = "`posbench probe` (or `posbench run` of a probe task)"


def _probes_in(names) -> list[str]:
    present = set(names)
    return [p for p in PROBE_ORDER if p in present] + sorted(present - set(PROBE_ORDER))


def _scheme_order(labels) -> list[str]:
    """Scheme variants in PROBE_COLUMNS' order of their scheme, the others after, each by name."""
    order = {c: i for i, c in enumerate(PROBE_COLUMNS)}
    return sorted(set(labels), key=lambda s: (order.get(s.split("+")[0], 99), s))


def run_probes(out: Path) -> dict[str, str]:
    """run_id -> the probe its run trained on: from its config, or from its rows of probes.csv
    where the folder holds no run directories (a committed results folder)."""
    found = {r["run_id"]: r["probe"] for r in results.read_rows(results.table_path(out, "probes"))}
    for config in out.glob("*/config.json"):
        found[config.parent.name] = data_spec(config.parent).split(":")[0]
    return found


# the columns a scored probe frame keeps: filtering a frame of every probes.csv column cost
# seconds a table
SCORED = ("run_id", "probe", "label", "ratio", "seed", "status", "hits", "answers")


def seed_accuracy(rows: pd.DataFrame) -> pd.DataFrame:
    """Per seed, the pooled hits and answers of `rows` (variants summed) and their ratio."""
    per_seed = rows.groupby("seed")[["hits", "answers"]].sum()
    return per_seed.assign(accuracy=per_seed["hits"] / per_seed["answers"])


def steps_table(out: Path) -> str:
    """probe x scheme: the step each run stopped at, or its final held-out accuracy in parentheses
    when it spent every step; then the runs' summed training time."""
    from posbench.probes import PROBES

    runs = pd.DataFrame(_rows(out, "runs", PROBES_BY))
    runs = runs[runs["status"] == "ok"].copy()
    runs["probe"] = runs["run_id"].map(run_probes(out))
    runs = runs[runs["probe"].isin(PROBES)]
    if runs.empty:
        raise PosbenchError(f"no probe runs in {out} (each run's config.json names its probe)")
    runs["label"] = labels(runs)
    columns = PROBE_COLUMNS + sorted(set(runs["label"]) - set(PROBE_COLUMNS))
    body = []
    for probe in _probes_in(runs["probe"]):
        cells = []
        for column in columns:
            rows = runs[(runs["probe"] == probe) & (runs["label"] == column)]
            words = []
            for r in rows.sort_values("seed").itertuples():
                if r.stopped_at and int(r.stopped_at) < int(r.steps):
                    words.append(f"{int(r.stopped_at):,}")
                else:
                    words.append(f"({float(r.final_val_accuracy):.0%})")
            cells.append(" / ".join(words))
        body.append([probe, *cells])
    seconds = pd.to_numeric(runs["train_seconds"]).sum()
    return (markdown_table(["probe", *columns], body)
            + f"\n\n{len(runs)} runs, {seconds / 3600:.1f} hours of training (one core each)")


def accuracy_table(out: Path, ratios: tuple[int, ...]) -> str:
    """Per probe and scheme variant, per-answer accuracy at each ratio, variants pooled: the Wilson
    interval of one seed's answers, or the mean over several seeds."""
    df = pd.DataFrame(_rows(out, "probes", PROBES_BY))
    df = df[df["status"].isin(["ok", "not learned"])].copy()
    df["label"] = labels(df)
    df = df[list(SCORED)]
    for c in ("ratio", "hits", "answers"):
        df[c] = pd.to_numeric(df[c])
    body = []
    for probe in _probes_in(df["probe"]):
        sub = df[df["probe"] == probe]
        for name in _scheme_order(sub["label"]):
            rows = sub[sub["label"] == name]
            seeds = sorted(set(rows["seed"]))
            learned = not (rows[rows["ratio"] == 1]["status"] == "not learned").any()
            cells = []
            for ratio in ratios:
                at = rows[rows["ratio"] == ratio]
                if at.empty:
                    cells.append("")
                    continue
                per_seed = seed_accuracy(at)
                mean = per_seed["accuracy"].mean()
                if len(per_seed) == 1:
                    lo, hi = stats.wilson(int(per_seed["hits"].iloc[0]), int(per_seed["answers"].iloc[0]))
                    cells.append(f"{100 * mean:.0f} [{100 * lo:.0f}, {100 * hi:.0f}]")
                else:
                    cells.append(f"{100 * mean:.0f} (n={len(per_seed)})")
            suffix = "" if learned else " (not learned)"
            seed_note = f", {len(seeds)} seeds" if len(seeds) > 1 else ""
            body.append([probe, f"{name}{suffix}{seed_note}", *cells])
    return markdown_table(["probe", "scheme", *(f"{r}x" for r in ratios)], body)


def scored_frame(dirs: list[Path], task: str | None) -> pd.DataFrame:
    """The scored probe rows of several folders read as one (a run in several: the first's rows),
    those of `task`'s grid alone when given."""
    from posbench.probes import PROBES

    wanted = None
    if task is not None:
        from posbench import config, grid

        wanted = {spec.run_id for spec in grid.grid(config.load_task(task))}
    scored: dict[str, list[dict]] = {}
    for out in dirs:
        here: dict[str, list[dict]] = {}
        for r in results.read_rows(results.table_path(out, "probes")):
            if r["status"] in ("ok", "not learned") and r["probe"] in PROBES and (wanted is None or r["run_id"] in wanted):
                here.setdefault(r["run_id"], []).append(r)
        for run_id, rows in here.items():
            scored.setdefault(run_id, rows)
    if not scored:
        raise PosbenchError(f"no scored probe rows in {', '.join(map(str, dirs))}")
    df = pd.DataFrame([r for rows in scored.values() for r in rows])
    df["label"] = labels(df)
    df = df[list(SCORED)]
    for c in ("ratio", "hits", "answers", "seed"):
        df[c] = pd.to_numeric(df[c])
    return df


def steps_cell(steps: list[tuple[int, bool]]) -> str:
    """Median and range of (step, spent every step) pairs; + marks a value from a run that did not stop."""
    if not steps:
        return ""
    steps = sorted(steps)

    def word(s: tuple[int, bool]) -> str:
        return f"{s[0]:,}" + ("+" if s[1] else "")

    low, high = steps[(len(steps) - 1) // 2], steps[len(steps) // 2]
    # of an even count, the mean of the middle two: a lower bound (+) when the upper one did not stop
    median = f"{(low[0] + high[0]) / 2:,.0f}" + ("+" if high[1] else "")
    if len(steps) == 1:
        return median
    return f"{median} ({word(steps[0])}-{word(steps[-1])})"


def _seed_cell(per_seed: pd.DataFrame) -> tuple[float | None, str, float | None]:
    """The mean over seeds of per-seed accuracy, its cell and the width of its interval over seeds:
    the 95% t-interval (clipped to 0..100; its width None with one seed), or the Wilson interval
    of one seed's answers."""
    if per_seed.empty:
        return None, "", None
    if len(per_seed) == 1:
        hits, answers = int(per_seed["hits"].iloc[0]), int(per_seed["answers"].iloc[0])
        lo, hi = stats.wilson(hits, answers)
        return hits / answers, f"{100 * hits / answers:.0f} ({100 * lo:.0f}-{100 * hi:.0f})", None
    ci = stats.mean_interval(per_seed["accuracy"])
    lo, hi = max(ci.lo, 0), min(ci.hi, 1)
    return ci.mean, f"{100 * ci.mean:.0f} [{100 * lo:.0f}, {100 * hi:.0f}]", hi - lo


def seeds_records(dirs: list[Path], ratios: tuple[int, ...], task: str | None = None) -> list[dict]:
    """One record per probe and scheme variant: seeds scored, seeds learned (the probe's gate: at
    least the learned threshold on its prompts at the training length), runs stopped early (the
    training's gate: held-out accuracy reached stop_accuracy before the last step), steps to the stop,
    and per ratio the mean over seeds (`means`) with its formatted cell (`cells`), the median and
    quartiles (`medians`: the typical seed) and, past 1x, the seeds holding the probe (`holding`:
    those keeping at least half their accuracy at the training length, with a Wilson interval)."""
    df = scored_frame(dirs, task)
    runs: dict[str, dict] = {}
    for out in dirs:
        for r in results.read_rows(results.table_path(out, "runs")):
            if r["status"] == "ok":
                runs.setdefault(r["run_id"], r)
    out = []
    for probe in _probes_in(df["probe"]):
        sub = df[df["probe"] == probe]
        for name in _scheme_order(sub["label"]):
            rows = sub[sub["label"] == name]
            first = rows[rows["ratio"] == 1]
            steps, missed = [], set(first.loc[first["status"] == "not learned", "run_id"])
            stopped_missed = 0  # runs that met the early stop yet not the probe's gate
            for run_id in sorted(set(rows["run_id"])):
                r = runs.get(run_id)
                if r is not None:
                    stopped = r["stopped_at"] and int(r["stopped_at"]) < int(r["steps"])
                    steps.append((int(r["stopped_at"]) if stopped else int(r["steps"]), not stopped))
                    stopped_missed += bool(stopped) and run_id in missed
            record = {"probe": probe, "scheme": name, "seeds": rows["seed"].nunique(),
                      "learned": first[first["status"] != "not learned"]["seed"].nunique(),
                      "scored": first["seed"].nunique(), "steps": steps_cell(steps),
                      "stopped": (f"{sum(not spent for _, spent in steps)} of {len(steps)}"
                                  + (f", {stopped_missed} not learned" if stopped_missed else "")) if steps else "",
                      "means": [], "cells": [],
                      "medians": [], "holding": [], "widths": [], "spreads": []}
            at_one = seed_accuracy(first)["accuracy"].to_dict()
            for ratio in ratios:
                per_seed = seed_accuracy(rows[rows["ratio"] == ratio])
                mean, cell, width = _seed_cell(per_seed)
                record["means"].append(mean)
                record["cells"].append(cell)
                record["widths"].append(width)
                record["spreads"].append((mean, stats.std(list(per_seed["accuracy"])), len(per_seed))
                                         if width is not None else None)
                record["medians"].append(quartiles_cell(per_seed["accuracy"]) if len(per_seed) > 1 else "")
                record["holding"].append(holding_cell(at_one, per_seed["accuracy"].to_dict()) if ratio > 1 else "")
            out.append(record)
    return out


def quartiles_cell(accuracy) -> str:
    """`median (first quartile-third quartile)` of the seeds' accuracies, in points."""
    q1, median, q3 = stats.quartiles(accuracy)
    return f"{100 * median:.0f} ({100 * q1:.0f}-{100 * q3:.0f})"


def holding_cell(at_one: dict, at_ratio: dict) -> str:
    """`k of n (lo-hi%)`: the seeds keeping at least half their accuracy at the training length,
    with the Wilson 95% interval of that share."""
    held, n = stats.holding(at_one, at_ratio)
    if not n:
        return ""
    lo, hi = stats.wilson(held, n)
    return f"{held} of {n} ({100 * lo:.0f}-{100 * hi:.0f}%)"


def seeds_table(records: list[dict], ratios: tuple[int, ...]) -> str:
    longer = [k for k, r in enumerate(ratios) if r > 1]
    head = (["probe", "scheme", "seeds", "learned", "stopped early", "steps to stop"]
            + [f"{r}x mean [95%]" for r in ratios]
            + [f"{r}x median (IQR)" for r in ratios] + [f"{ratios[k]}x holding" for k in longer])
    body = [[r["probe"], r["scheme"], str(r["seeds"]), f"{r['learned']} of {r['scored']}", r["stopped"], r["steps"],
             *r["cells"],
             *r["medians"], *(r["holding"][k] for k in longer)] for r in records]
    return markdown_table(head, body) + width_line(records, ratios)


WIDTH_TARGET = 0.15  # the median interval width a table over seeds is read as settled at


def width_line(records: list[dict], ratios: tuple[int, ...]) -> str:
    """How settled the table is: per ratio, the median width of the cells' 95% intervals over
    seeds, in points (as shown: clipped to 0..100; cells of two seeds or more), and where it is
    wider than WIDTH_TARGET, the seeds that would narrow it to that, each cell's mean and spread
    held (records with `spreads`)."""
    said, needs = [], []
    for k, ratio in enumerate(ratios):
        widths = [r["widths"][k] for r in records if r["widths"][k] is not None]
        if not widths:
            continue
        median = round(100 * statistics.median(widths))  # as printed
        said.append(f"{ratio}x {median} ({len(widths)} cells)")
        spreads = [r["spreads"][k] for r in records if r.get("spreads") and r["spreads"][k] is not None]
        if median > round(100 * WIDTH_TARGET) and spreads:
            n = stats.seeds_for_width(spreads, WIDTH_TARGET)
            needs.append(f"{ratio}x {n if n else 'more than 50'}")
    if not said:
        return ""
    line = "\n\nMedian width of the 95% intervals over seeds, in points: " + ", ".join(said) + "."
    if needs:
        line += (f" Seeds for a median width of {100 * WIDTH_TARGET:.0f} points, each cell's mean and spread"
                 " held (the interval narrows as t/sqrt(n)): " + ", ".join(needs) + ".")
    return line


def compact_table(records: list[dict], schemes: list[str] | None = None) -> str:
    """probe x scheme: the means at the ratios, and the learned count where not every seed learned.
    Columns: `schemes` in their order, or PROBE_COLUMNS' schemes then every scheme of another
    family (a variant of a column's scheme, e.g. rope+yarn, is read in the full table)."""
    cells: dict[str, dict[str, str]] = {}
    for r in records:
        cell = " / ".join("" if m is None else f"{100 * m:.0f}" for m in r["means"])
        learned = "" if r["learned"] == r["scored"] else f" ({r['learned']} of {r['scored']} learned)"
        cells.setdefault(r["probe"], {})[r["scheme"]] = cell + learned
    present = [r["scheme"] for r in records]
    columns = schemes if schemes is not None else (
        [c for c in PROBE_COLUMNS if c in present]
        + [c for c in _scheme_order(present) if c.split("+")[0] not in PROBE_COLUMNS])
    body = [[probe, *(row.get(c, "") for c in columns)] for probe, row in cells.items()]
    return markdown_table(["probe", *columns], body)


def _pair(text: str) -> tuple[str, str, str]:
    parts = text.split(":")
    if len(parts) != 3 or not all(parts):
        raise PosbenchError(f"bad pair {text!r}: expected A:B:PROBE, e.g. none:rope:passkey")
    return parts[0], parts[1], parts[2]


def pairs_table(dirs: list[Path], pairs: list[str], ratios: tuple[int, ...], task: str | None = None) -> str:
    """Per pair A:B:PROBE and ratio, each seed's accuracy difference A - B in points (variants
    pooled), read by pairing.seed_pairs_table: the mean with its 95% t-interval over seeds, the
    exact paired permutation p and its Benjamini-Hochberg q over the table's rows, the seeds of
    one machine kind (runs.csv `machine`) and a verdict."""
    from posbench.pairing import SeedPair, seed_pairs_table

    parsed = [_pair(p) for p in pairs]
    df = scored_frame(dirs, task)
    kind = run_kinds(dirs)
    rows = []
    for a, b, probe in parsed:
        for name in (a, b):
            if not ((df["label"] == name) & (df["probe"] == probe)).any():
                raise PosbenchError(f"no scored rows of {name} on {probe}")
        for ratio in ratios:
            acc, kinds = {}, {}
            for name in (a, b):
                at = df[(df["label"] == name) & (df["probe"] == probe) & (df["ratio"] == ratio)]
                acc[name] = seed_accuracy(at)["accuracy"].to_dict()
                kinds[name] = {s: {kind.get(r) for r in g["run_id"]} for s, g in at.groupby("seed")}
            seeds = sorted(set(acc[a]) & set(acc[b]))
            if seeds:
                rows.append(SeedPair([a, b, probe, f"{ratio:g}x"], {k: 100 * (acc[a][k] - acc[b][k]) for k in seeds},
                                     {k: len(kinds[a][k]) == 1 and kinds[a][k] == kinds[b][k] != {None}
                                      for k in seeds}))
    return seed_pairs_table(rows)


def run_kinds(dirs: list[Path]) -> dict[str, str]:
    """run_id -> the machine kind it trained on (runs.csv `machine`; a run in several folders: the
    first's); runs without a recorded kind are left out."""
    kinds: dict[str, str] = {}
    for out in dirs:
        for r in results.read_rows(results.table_path(out, "runs")):
            if r["status"] == "ok" and r.get("machine"):
                kinds.setdefault(r["run_id"], r["machine"])
    return kinds


def curves_table(out: Path, probes: list[str], every: int) -> str:
    """Held-out per-answer accuracy at the training length (log.csv's val_accuracy) every `every`
    steps, per run on `probes`."""
    if every < 1:
        raise PosbenchError(f"bad every {every}: expected a number of steps, at least 1")
    runs = {r["run_id"]: r for r in results.read_rows(results.table_path(out, "runs"))}
    curves = {}
    for run_id, probe in sorted(run_probes(out).items()):
        config, log = out / run_id / "config.json", out / run_id / "log.csv"
        if probe not in probes or run_id not in runs or not config.exists() or not log.exists():
            continue
        spec = data_spec(config.parent)
        log = pd.read_csv(log).dropna(subset=["val_accuracy"])
        curves[(spec, label(runs[run_id]), run_id)] = dict(zip(log["step"], log["val_accuracy"]))
    if not curves:
        raise PosbenchError(f"no runs of {', '.join(probes)} with a log in {out}")
    last = max(max(c) for c in curves.values())
    steps = list(range(every, last + 1, every))
    body = [[spec, name, *(f"{100 * curve[s]:.0f}" if s in curve else "" for s in steps)]
            for (spec, name, _), curve in sorted(curves.items())]
    return markdown_table(["data", "scheme", *(f"{s:,}" for s in steps)], body)


def sweep_records(dirs: list[Path], task_name: str, ratios: tuple[int, ...]) -> list[dict]:
    """One record per cell and learning rate of `task_name`'s sweep ([probes] lrs): seeds trained
    (`seeds`; a run that failed, its loss NaN at a high rate, counts with held-out accuracy 0),
    seeds learned, the mean held-out accuracy at the training length (runs.csv's
    final_val_accuracy, the validation examples the early stop reads), the mean over seeds at
    each ratio, and whether the rate is the cell's choice: the highest held-out accuracy at the
    training length over the task's seeds, a tie going to the cell's own [train] rate, then to the
    lower rate. A cell chooses only once every rate has every seed (`complete`); the lengths that
    are read never enter the choice."""
    from posbench import config, grid
    from posbench.probes.base import probe_name

    task = config.load_task(task_name)
    if not task.probes.lrs:
        raise PosbenchError(f"task {task.name} sweeps no learning rates ([probes] lrs)")
    specs = {spec.run_id: spec for spec in grid.grid(task)}
    df = scored_frame(dirs, task_name)
    df["lr"] = df["run_id"].map(lambda i: specs[i].train.lr)
    held_out: dict[str, float] = {}
    failed: dict[tuple[str, str], dict[float, set[int]]] = defaultdict(lambda: defaultdict(set))
    for out in dirs:
        for r in results.read_rows(results.table_path(out, "runs")):
            spec = specs.get(r["run_id"])
            if spec is None or r["run_id"] in held_out:
                continue
            if r["status"] == "ok" and r["final_val_accuracy"] not in ("", None):
                held_out[r["run_id"]] = float(r["final_val_accuracy"])
            elif r["status"] == "failed":
                held_out[r["run_id"]] = 0.0
                failed[(probe_name(spec.data.spec), label(r))][spec.train.lr].add(spec.seed)
    wanted = set(task.seeds)
    records = []
    for probe in _probes_in(df["probe"]):
        own = task.train_for(probe).lr
        for name in _scheme_order(df[df["probe"] == probe]["label"]):
            cell = df[(df["probe"] == probe) & (df["label"] == name)]
            rows, complete = [], True
            for lr in sorted(task.probes.lrs):
                sub = cell[cell["lr"] == lr]
                first = sub[sub["ratio"] == 1]
                lost = failed[(probe, name)][lr]
                seeds = set(sub["seed"]) | lost
                ids = {i for i in sub["run_id"] if i in held_out}
                accuracy = [held_out[i] for i in sorted(ids)] + [0.0] * len(lost)
                complete &= wanted <= seeds
                rows.append({"probe": probe, "scheme": name, "lr": lr, "seeds": len(seeds), "failed": len(lost),
                             "learned": first[first["status"] != "not learned"]["seed"].nunique(),
                             "held_out": sum(accuracy) / len(accuracy) if accuracy else None,
                             "means": [seed_accuracy(sub[sub["ratio"] == r])["accuracy"].mean() for r in ratios],
                             "chosen": False})
            if complete:
                best = max(rows, key=lambda r: (round(r["held_out"], 6), r["lr"] == own, -r["lr"]))
                best["chosen"] = True
            records += [{**r, "complete": complete} for r in rows]
    return records


def sweep_table(records: list[dict], ratios: tuple[int, ...]) -> str:
    head = ["probe", "scheme", "lr", "seeds", "learned", "held-out at 1x", *(f"{r}x mean" for r in ratios), "chosen"]

    def pct(v) -> str:
        return "" if v is None or v != v else f"{100 * v:.0f}"

    def learned(r) -> str:
        return f"{r['learned']} of {r['seeds']}" + (f" ({r['failed']} failed)" if r["failed"] else "")

    def choice(r) -> str:
        return "chosen" if r["chosen"] else "" if r["complete"] else "waits for seeds"

    body = [[r["probe"], r["scheme"], f"{r['lr']:g}", str(r["seeds"]), learned(r), pct(r["held_out"]),
             *map(pct, r["means"]), choice(r)] for r in records]
    return markdown_table(head, body)


def probes(dirs: list[Path], *, seeds: bool = False, compact: bool = False, task: str | None = None,
           ratios="1,2,4,8", pairs=None, curves=None, every: int = 1000, sweep: bool = False, schemes=None) -> str:
    """One folder: steps to the early stop, then accuracy per ratio. seeds: the table over seeds of
    one or more folders read as one; compact: probe x scheme, the means alone; pairs (A:B:PROBE,...):
    seed-paired differences; curves (PROBE,...): learning curves every `every` steps; task: the
    runs of that task's grid alone (seeds, pairs); sweep: the learning-rate sweep of `task`
    (one or more folders), each rate's row and the rate each cell chooses; schemes (seeds): these
    scheme labels alone, in this order."""
    ratios = _ints(ratios, "ratios")
    if sweep:
        if task is None:
            raise PosbenchError("--sweep reads the learning rates of a task: give --task too")
        return sweep_table(sweep_records(dirs, task, ratios), ratios)
    if pairs is not None:
        return pairs_table(dirs, _words(pairs, "pairs"), ratios, task)
    if compact and not seeds:
        raise PosbenchError("compact is a form of the table over seeds: give seeds too")
    if schemes is not None and not seeds:
        raise PosbenchError("schemes chooses the columns of the table over seeds: give seeds too")
    if task is not None and not seeds:
        raise PosbenchError("task picks the runs of the table over seeds, of pairs or of a sweep: give one of "
                            "them too")
    if seeds:
        records = seeds_records(dirs, ratios, task)
        if schemes is not None:
            chosen = _words(schemes, "schemes")
            have = {r["scheme"] for r in records}
            rank = _ranks(chosen, have, lambda missing: PosbenchError(
                f"no probe rows of {', '.join(missing)} (have: {', '.join(_scheme_order(have))})"))
            probe_rank = {p: i for i, p in enumerate(dict.fromkeys(r["probe"] for r in records))}
            records = sorted((r for r in records if r["scheme"] in rank),
                             key=lambda r: (probe_rank[r["probe"]], rank[r["scheme"]]))
            return compact_table(records, chosen) if compact else seeds_table(records, ratios)
        return compact_table(records) if compact else seeds_table(records, ratios)
    if len(dirs) > 1:
        raise PosbenchError("several directories are read together only with seeds or pairs")
    if curves is not None:
        return curves_table(dirs[0], _words(curves, "curves"), int(every))
    return steps_table(dirs[0]) + "\n\n" + accuracy_table(dirs[0], ratios)


# ---- extend -------------------------------------------------------------------------------------

EXTEND_PAIRS = ("yarn:pi,ntk:pi,pose+yarn:plain,pose+yarn:yarn,longrope:yarn,plain:parent,drope:yarn,"
                "drope:pose+yarn,drope:parent")


def _ppl_cell(values) -> str:
    m = stats.mean_interval(values)
    return f"{m.mean:.2f} [{m.lo:.2f}, {m.hi:.2f}]" if m.n > 1 else f"{m.mean:.2f}"


def extend_perplexity(out: Path, lengths: tuple[int, ...]) -> str:
    """Per run (parents, children, eval-time policies): seeds, the tokens and median seconds of
    fine-tuning, perplexity at each length (mean [95% t-interval over seeds])."""
    ext = pd.DataFrame(results.read_rows(results.table_path(out, "extrapolation")))
    ext = ext[ext["status"] == "ok"]
    ext["label"] = labels(ext)
    ext["ppl"] = pd.to_numeric(ext["ppl"])
    runs = pd.DataFrame(_rows(out, "runs", "`posbench run extend`"))
    children = runs[runs["parent_run"] != ""]
    cost = {}
    for _, r in children.iterrows():
        cost.setdefault(label({**r, "scaling": "none"}), []).append((int(r["tokens"]), float(r["train_seconds"])))
    body = []
    for name, group in sorted(ext.groupby("label"), key=lambda g: (g[0].split(">")[0], g[0])):
        spent = cost.get(name, [])
        tokens = f"{spent[0][0]:,}" if spent else ""
        seconds = f"{sorted(s for _, s in spent)[len(spent) // 2]:.0f}" if spent else ""
        ppl = [_ppl_cell(group[group["eval_len"].astype(int) == n]["ppl"]) for n in lengths]
        body.append([name, str(group["seed"].nunique()), tokens, seconds, *ppl])
    return markdown_table(["run", "seeds", "tokens", "fine-tuning s", *(str(n) for n in lengths)], body)


def extend_paired(out: Path, lengths: tuple[int, ...], pairs: list[tuple[str, str]]) -> str:
    """Per pair of methods A:B and each child of method A: the perplexity ratio A/B over the same
    windows and seeds (windows.csv), B the child of the same parent and budget by method B, or the
    parent itself (B `parent`)."""
    from posbench.pairing import paired

    ext = results.read_rows(results.table_path(out, "extrapolation"))
    children = {label({**r, "scaling": "none"}) for r in ext if r["extend_method"]}
    # a child's counterparts are named by its parent's scheme (a drope child of rope is `none>drope`)
    runs = {r["run_id"]: r for r in results.read_rows(results.table_path(out, "runs"))}
    parent_scheme = {label({**r, "scaling": "none"}): runs[runs[r["run_id"]]["parent_run"]]["scheme"]
                     for r in ext if r["extend_method"] and runs.get(runs.get(r["run_id"], {}).get("parent_run"))}
    body = []
    for a_method, b_method in pairs:
        for child in sorted(children):
            scheme, rest = child.split(">")
            method, budget = rest.split("@")
            if method != a_method:
                continue
            parent = parent_scheme.get(child, scheme)
            b = parent if b_method == "parent" else f"{parent}>{b_method}@{budget}"
            try:
                rows = {r["eval_len"]: r for r in paired(out, child, b, lengths)}
            except PosbenchError:
                continue
            ratios = [f"{r['ratio']:.3f} [{r['ratio_lo']:.3f}, {r['ratio_hi']:.3f}]" if (r := rows.get(n)) else ""
                      for n in lengths]
            seeds = max((r["seeds"] for r in rows.values()), default=0)
            body.append([f"{child} vs {b}", str(seeds), *ratios])
    return markdown_table(["A vs B", "seeds", *(f"A/B at {n}" for n in lengths)], body)


def extend_passkey(out: Path) -> str | None:
    """Per run, passkey accuracy at each length, depths pooled (Wilson interval); None without probes.csv."""
    path = results.table_path(out, "probes")
    if not path.exists():
        return None
    df = pd.DataFrame(results.read_rows(path))
    df = df[df["status"].isin(["ok", "not learned"])]
    df["label"] = labels(df)
    lengths = sorted(df["eval_len"].astype(int).unique())
    body = []
    for name, group in sorted(df.groupby("label")):
        cells = []
        for n in lengths:
            at = group[group["eval_len"].astype(int) == n]
            hits, answers = int(at["hits"].astype(int).sum()), int(at["answers"].astype(int).sum())
            lo, hi = stats.wilson(hits, answers)
            cells.append(f"{hits / answers:.0%} ({lo:.0%}-{hi:.0%})" if answers else "")
        status = " (not learned)" if (group["status"] == "not learned").any() else ""
        body.append([f"{name}{status}", *cells])
    return markdown_table(["run", *(str(n) for n in lengths)], body)


def extend(directory: Path, *, lengths="64,256,1024", pairs=EXTEND_PAIRS) -> str:
    """Perplexity by method and budget and the paired ratios (where extrapolation.csv is), then
    passkey accuracy by length (where probes.csv is). pairs: A:B methods compared at each budget."""
    lengths = _ints(lengths, "lengths")
    pairs = [tuple(p.split(":", 1)) for p in _words(pairs, "pairs")]
    bad = [":".join(p) for p in pairs if len(p) != 2 or not all(p)]
    if bad:
        raise PosbenchError(f"bad pairs {', '.join(bad)}: expected A:B, e.g. yarn:pi (B `parent`: the parent)")
    parts = []
    if results.table_path(directory, "extrapolation").exists():
        parts += [extend_perplexity(directory, lengths), extend_paired(directory, lengths, pairs)]
    passkey_part = extend_passkey(directory)
    if passkey_part is not None:
        parts.append(passkey_part)
    if not parts:
        raise PosbenchError(f"no extrapolation.csv or probes.csv in {directory}: "
                            "`posbench run extend` or `posbench run extend-passkey` writes them")
    return "\n\n".join(parts)


# ---- pretrained ---------------------------------------------------------------------------------

POLICY_ORDER = ("none", "pi", "ntk", "dynamic-ntk", "yarn", "llama3", "longrope", "freq-band", "self-extend", "rerope",
                "dpe", "dope")


def _policy(scaling: str) -> tuple:
    kind = scaling.split("(")[0].split(":")[0]
    return (POLICY_ORDER.index(kind) if kind in POLICY_ORDER else len(POLICY_ORDER), scaling)


def _model_rows(rows: list[dict], model: str | None) -> list[dict]:
    """The rows of the pretrained model named `model` (a row's `scheme`; None: every model's)."""
    return [r for r in rows if results.of_model(r) and (model is None or r["scheme"] == model)]


def pretrained_perplexity(directory: Path, model: str | None = None) -> str:
    """Policy x length: perplexity with its 95% interval over windows where there are two or more,
    the windows scored, `*` where the policy leaves the model as it is (a shared row)."""
    rows = [r for r in _model_rows(_rows(directory, "extrapolation", "`posbench extrapolate --model`"), model)
            if r["status"] == "ok"]
    lengths = sorted({int(r["eval_len"]) for r in rows})
    cells = {(r["scaling"], int(r["eval_len"])): r for r in rows}
    body = []
    for scaling in sorted({r["scaling"] for r in rows}, key=_policy):
        line = [scaling]
        for n in lengths:
            r = cells.get((scaling, n))
            if r is None:
                line.append("")
                continue
            shared = " *" if r["reason"].startswith(results.SHARED) else ""  # not DPE's note of its scales
            windows = int(r["tokens"]) // n
            # rows written before the lower end stopped at perplexity 1 (a loss of 0) read so here too
            ci = (f" [{max(float(r['ppl_lo']), 1.0):.2f}, {float(r['ppl_hi']):.2f}]"
                  if r["ppl_lo"] not in ("", "nan") else "")
            line.append(f"{float(r['ppl']):.2f}{ci} ({windows} w){shared}")
        body.append(line)
    return markdown_table(["policy", *(f"{n} ({int(n) // 1024}k)" for n in lengths)], body)


def inside_and_past(directory: Path, model: str | None = None) -> str:
    """Per policy and length past train_len: perplexity over the position buckets below and past the
    first bucket edge at or past train_len."""
    extrapolation = _model_rows(_rows(directory, "extrapolation", "`posbench extrapolate --model`"), model)
    train_len = {int(r["train_len"]) for r in extrapolation}.pop()
    groups = defaultdict(list)
    for p in _model_rows(_rows(directory, "positions", "`posbench extrapolate --model`"), model):
        if int(p["eval_len"]) > train_len:
            groups[(p["scaling"], int(p["eval_len"]))].append(p)
    body = []
    for (scaling, n), buckets in sorted(groups.items(), key=lambda kv: (kv[0][1], _policy(kv[0][0]))):
        # split at the first bucket edge at or past train_len (the buckets are log-spaced: the bounds are shown)
        cut = min(int(b["position_start"]) for b in buckets if int(b["position_start"]) >= train_len)
        line = [scaling, str(n)]
        inside = [b for b in buckets if int(b["position_end"]) < cut]
        for chosen in (inside, [b for b in buckets if int(b["position_start"]) >= cut]):
            tokens = sum(int(b["tokens"]) for b in chosen)
            loss = sum(float(b["loss"]) * int(b["tokens"]) for b in chosen) / tokens
            line += [f"{min(int(b['position_start']) for b in chosen)}-{max(int(b['position_end']) for b in chosen)}",
                     f"{math.exp(loss):.2f}"]
        body.append(line)
    return markdown_table(["policy", "length", "positions", "ppl", "positions", "ppl"], body)


def pretrained_effective(directory: Path, model: str | None = None) -> str:
    rows = _model_rows(_rows(directory, "effective_length", "`posbench extrapolate --model`"), model)
    body = []
    for r in sorted((r for r in rows if r["metric"] == "ppl"), key=lambda r: _policy(r["scaling"])):
        mark = ">= " if r["status"] == "censored" else ""
        body.append([r["scaling"], f"{float(r['reference']):.2f}", f"{mark}{r['effective_len']}", r["status"]])
    return markdown_table(["policy", "reference ppl (8k)", "effective length", "status"], body)


def pretrained_probe_effective(directory: Path, model: str | None = None) -> str | None:
    """Per probe (passkey, RULER's tasks) and policy: the score at the model's context (references
    or digits found, pooled; `-` where the policy was read only past it) and the effective length
    on both bases with the accuracy each asks for (`-`: no reference, e.g. below it at the model's
    context); None without probe rows in effective_length.csv."""
    rows = [r for r in _model_rows(results.read_rows(results.table_path(directory, "effective_length")), model)
            if r["metric"] == "accuracy"]
    if not rows:
        return None
    home = defaultdict(lambda: [0, 0])
    for r in _model_rows(results.read_probes(directory), model):
        if r["eval_len"] == r["train_len"]:
            home[(r["probe"], r["scaling"])][0] += int(r["hits"])
            home[(r["probe"], r["scaling"])][1] += int(r["answers"])
    cells: dict[tuple[str, str], dict[str, dict]] = defaultdict(dict)
    for r in rows:
        probe, _, relative = r["protocol"].partition("/")
        cells[(probe, r["scaling"])]["relative" if relative else "absolute"] = r

    def length(r: dict | None) -> str:
        if r is None or r["status"] == "no reference":
            return "-"
        return f"{effective_text(r)} at {float(r['criterion']):.1%}"

    body = []
    for (probe, scaling), by in sorted(cells.items(), key=lambda kv: (kv[0][0], _policy(kv[0][1]))):
        hits, answers = home.get((probe, scaling), (0, 0))
        body.append([probe, scaling, f"{hits / answers:.0%}" if answers else "-", length(by.get("absolute")),
                     length(by.get("relative"))])
    context = sorted({r["train_len"] for r in rows})
    head = ["probe", "policy", f"score at {'/'.join(context)}", "effective length, absolute", "relative (85% of own)"]
    return markdown_table(head, body)


def pretrained_passkey(directory: Path, model: str | None = None) -> str | None:
    """Policy and length: digits right, per-digit accuracy (Wilson), keys right, and by depth; None
    without passkey rows."""
    rows = [r for r in _model_rows(results.read_probes(directory), model) if r["probe"] == "passkey"]
    if not rows:
        return None
    cells = defaultdict(lambda: [0, 0, 0, 0])
    for r in rows:
        c = cells[(r["scaling"], int(r["eval_len"]))]
        c[0] += int(r["hits"])
        c[1] += int(r["answers"])
        c[2] += int(r["exact"])
        c[3] += int(r["trials"])
    body = []
    for (scaling, n), (hits, answers, exact, trials) in sorted(cells.items(), key=lambda kv: (kv[0][1], _policy(kv[0][0]))):
        lo, hi = stats.wilson(hits, answers)
        depths = sorted((r for r in rows if r["scaling"] == scaling and int(r["eval_len"]) == n),
                        key=lambda r: float(r["variant"].split("=")[-1]) if "=" in r["variant"] else r["variant"])
        by_depth = " ".join(f"{r['hits']}/{r['answers']}" for r in depths)
        body.append([scaling, str(n), f"{hits}/{answers}", f"{hits / answers:.0%} [{lo:.0%}, {hi:.0%}]",
                     f"{exact}/{trials}", by_depth])
    head = ["policy", "length", "digits right", "per-digit accuracy [Wilson 95%]", "keys right (exact)",
            "by depth 0, .25, .5, .75, 1"]
    return markdown_table(head, body)


def pretrained_ruler(directory: Path, model: str | None = None) -> str | None:
    """Per RULER task, policy and length: string_match_all (references found, Wilson 95%), prompts
    wholly right, and the chance of a guess; None without ruler: rows."""
    rows = [r for r in _model_rows(results.read_probes(directory), model) if r["probe"].startswith("ruler:")]
    if not rows:
        return None
    body = []
    for r in sorted(rows, key=lambda r: (r["probe"], int(r["eval_len"]), _policy(r["scaling"]))):
        body.append([r["probe"].removeprefix("ruler:"), r["scaling"], r["eval_len"], f"{r['hits']}/{r['answers']}",
                     f"{float(r['accuracy']):.0%} [{float(r['acc_lo']):.0%}, {float(r['acc_hi']):.0%}]",
                     f"{r['exact']}/{r['trials']}", f"{float(r['chance']):.0%}"])
    head = ["task", "policy", "length", "references found", "string_match_all [Wilson 95%]", "prompts all right",
            "chance"]
    return markdown_table(head, body)


def pretrained_key_tokens(directory: Path, model: str | None = None) -> str | None:
    """Per policy and length with key tokens counted (LongPPL's, posbench/docs/evaluation.md): the
    perplexity, the key tokens and their share of the targets past the context, and the perplexity
    on them; None where no row counted any (its windows reach no further than the context, or the
    rows predate the count)."""
    rows = [r for r in _model_rows(results.read_rows(results.table_path(directory, "extrapolation")), model)
            if r.get("key_share") not in (None, "")]
    if not rows:
        return None
    body = []
    for r in sorted(rows, key=lambda r: (int(r["eval_len"]), _policy(r["scaling"]))):
        key_ppl = f"{float(r['key_ppl']):.2f}" if r.get("key_ppl") not in (None, "") else "-"
        body.append([r["scaling"], r["eval_len"], f"{float(r['ppl']):.2f}", r["key_tokens"],
                     f"{float(r['key_share']):.2%}", key_ppl])
    return markdown_table(["policy", "length", "ppl", "key tokens", "share of the targets past the context",
                           "key-token ppl"], body)


def pretrained(directory: Path) -> str:
    """Sections under `###` titles: where extrapolation.csv has a model's rows, perplexity by
    policy and length, inside and past the context, perplexity's effective length and the key
    tokens where they were counted; where
    probes.csv has them, passkey, RULER's tasks and the probes' effective length on both bases.
    A folder with more than one model (another file, or the same in bfloat16: a row's `scheme`)
    has each model's sections in turn, the model's name after each title."""
    windows = {r["scheme"] for r in _model_rows(results.read_rows(results.table_path(directory, "extrapolation")), None)}
    prompts = {r["scheme"] for r in _model_rows(results.read_probes(directory), None)}
    if not (windows or prompts):
        raise PosbenchError(f"no rows of a pretrained model in {directory}: `posbench extrapolate --model` "
                            "and `posbench probe --model` write them")
    models = sorted(windows | prompts)
    parts = []
    for model in models:
        sections = ((("Perplexity by policy and length", pretrained_perplexity(directory, model)),
                     ("Inside and past the context, within each window", inside_and_past(directory, model)),
                     ("Effective length", pretrained_effective(directory, model)),
                     ("Key tokens past the context", pretrained_key_tokens(directory, model))) if model in windows else ()) + (
                    (("Passkey", pretrained_passkey(directory, model)),
                     ("RULER's synthetic tasks", pretrained_ruler(directory, model)),
                     ("Effective length of the probes", pretrained_probe_effective(directory, model)))
                    if model in prompts else ())
        named = f": {model}" if len(models) > 1 else ""
        parts += [f"### {title}{named}\n\n{text}" for title, text in sections if text is not None]
    return "\n\n".join(parts)


# ---- attention ----------------------------------------------------------------------------------

def attention_frame(directory: Path) -> pd.DataFrame:
    from posbench.attention_measures import MEASURES

    df = pd.DataFrame(_rows(directory, "attention", "`posbench extrapolate --attention`"))
    df["label"] = labels(df)
    for c in (*MEASURES, "eval_len", "layer"):
        df[c] = pd.to_numeric(df[c], errors="coerce")
    return df


def uniform_attention(length: int, train_len: int) -> dict[str, float]:
    """The measures of causal attention spread evenly over every key (one head, one window)."""
    import torch

    from posbench.attention import Span
    from posbench.attention_measures import Recorder

    causal = torch.ones(length, length).tril()
    recorder = Recorder([Span()], train_len)
    recorder(0, (causal / causal.sum(-1, keepdim=True))[None, None])
    return recorder.rows()[0]


def mean_ppl(directory: Path) -> pd.Series:
    df = pd.DataFrame(results.read_rows(results.table_path(directory, "extrapolation")))
    if df.empty:
        return pd.Series(dtype=float)
    df = df[df["status"] == "ok"]
    df["label"] = labels(df)
    df["ppl"] = pd.to_numeric(df["ppl"])
    df["eval_len"] = pd.to_numeric(df["eval_len"])
    return df.groupby(["label", "eval_len"])["ppl"].mean()


def _ranks(chosen: list[str], have: set[str], error) -> dict[str, int]:
    """Each chosen label's place in the order given; `error(missing)` raised when a chosen label is
    not among those the rows `have`."""
    missing = [s for s in chosen if s not in have]
    if missing:
        raise error(missing)
    return {s: i for i, s in enumerate(chosen)}


def _choose(table: pd.DataFrame, schemes: list[str] | None, lengths: tuple[int, ...] | None) -> pd.DataFrame:
    """Rows of (label, eval_len) in `schemes`' order (each label named there, the others left out)
    and at `lengths`; None: every one, as the table has them."""
    if lengths is not None:
        table = table[table.index.get_level_values("eval_len").isin(lengths)]
    if schemes is not None:
        have = set(table.index.get_level_values("label"))
        rank = _ranks(schemes, have, lambda missing: did_you_mean(missing[0], have, "scheme in the attention table"))
        keep = [k for k in table.index if k[0] in rank]
        table = table.loc[sorted(keep, key=lambda k: (rank[k[0]], k[1]))]
    return table


def attention(directory: Path, *, by_layer: str | None = None, schemes=None, lengths=None) -> str:
    """Per scheme variant and length, perplexity beside each attention measure (mean over layers,
    heads and seeds) and `uniform` rows, the measures of attention spread evenly; by_layer=MEASURE:
    that measure per layer instead. schemes: the rows' labels in their order (the others left
    out; `uniform` too where not named); lengths: those lengths alone."""
    from posbench.attention_measures import MEASURES

    if by_layer is not None and by_layer not in MEASURES:
        raise did_you_mean(str(by_layer), MEASURES, "attention measure")
    schemes = _words(schemes, "schemes") if schemes is not None else None
    lengths = _ints(lengths, "lengths") if lengths is not None else None
    df = attention_frame(directory)
    if by_layer:
        table = df.groupby(["label", "eval_len", "layer"])[by_layer].mean().unstack("layer")
        headers = ["scheme", "length", *(f"layer {int(c)}" for c in table.columns)]
        table = _choose(table, schemes, lengths)
        body = [[name, str(int(n)), *(f"{v:.3f}" for v in values)] for (name, n), values in table.iterrows()]
        return markdown_table(headers, body)
    table = df.groupby(["label", "eval_len"])[list(MEASURES)].mean()
    train_len = int(pd.to_numeric(df["train_len"]).iloc[0])
    for n in sorted(df["eval_len"].unique()):
        uniform = uniform_attention(int(n), train_len)
        table.loc[("uniform", n), :] = [uniform[m] for m in MEASURES]
    table = _choose(table, schemes, lengths)
    perplexity = mean_ppl(directory)
    body = [[name, str(int(n)), f"{perplexity.get((name, n), float('nan')):.1f}".replace("nan", ""),
             *("" if pd.isna(v) else f"{v:.3f}" for v in values)] for (name, n), values in table.iterrows()]
    return markdown_table(["scheme", "length", "ppl", *MEASURES], body)


# ---- speed --------------------------------------------------------------------------------------

def speed(directory: Path) -> str:
    """speed.csv as report.md shows it: per pass, device, dtype and shape, scheme x length, the
    median time and its ratio to `none`."""
    from posbench import reporting

    rows = _rows(directory, "speed", "`posbench speed --out DIR`")
    return reporting.speed_markdown(pd.DataFrame(rows))


# ---- the one entry point ------------------------------------------------------------------------

TABLES = {"headline": headline, "probes": probes, "extend": extend, "pretrained": pretrained,
          "attention": attention, "speed": speed, "scaling": scaling_table}
SEVERAL_FOLDERS = {"probes"}  # tables that read several folders as one (probes with seeds or pairs)


def options(name: str) -> dict[str, object]:
    """The keyword options of table `name` and their defaults."""
    if name not in TABLES:
        raise did_you_mean(name, TABLES, "table")
    params = inspect.signature(TABLES[name]).parameters.values()
    return {p.name: p.default for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}


def _folders(directory: PathLike | Sequence[PathLike]) -> list[Path]:
    dirs = [Path(directory)] if isinstance(directory, (str, Path)) else [Path(d) for d in directory]
    if not dirs:
        raise PosbenchError("no results folder given")
    for d in dirs:
        if not d.is_dir():
            raise PosbenchError(f"{d}: no such results folder")
    return dirs


def table(name: str, directory: PathLike | Iterable[PathLike], **opts) -> str:
    """The markdown of table `name` (headline, probes, extend, pretrained, attention, speed) from
    the results folder `directory` (the probes table: one or more folders), without a final
    newline. Options are the table's keywords (`options(name)`); a list option takes a list or
    its comma-separated text ("2,4,8"). Bad input raises PosbenchError, one line."""
    known = options(name)
    for key in opts:
        if key not in known:
            if not known:
                raise PosbenchError(f"the {name} table takes no options (got {key!r})")
            raise did_you_mean(key, known, f"option of the {name} table")
    dirs = _folders(directory)
    if name in SEVERAL_FOLDERS:
        return TABLES[name](dirs, **opts)
    if len(dirs) > 1:
        raise PosbenchError(f"the {name} table reads one results folder (got {len(dirs)})")
    return TABLES[name](dirs[0], **opts)
