"""The probe suite's tables (results/probes and the folders like it): steps to the early stop, accuracy
per ratio, over seeds, seed-paired differences, learning curves and sweeps."""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

import pandas as pd

from posbench import results, stats
from posbench.errors import PosbenchError
from posbench.reporting import label, labels, markdown_table, pooled_accuracy
from posbench.runs import data_spec
from posbench.tables.common import int_list, ranks, rows_of, word_list

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


def steps_table(out: Path) -> str:
    """probe x scheme: the step each run stopped at, or its final held-out accuracy in parentheses
    when it spent every step; then the runs' summed training time."""
    from posbench.probes import PROBES

    runs = pd.DataFrame(rows_of(out, "runs", PROBES_BY))
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
    df = pd.DataFrame(rows_of(out, "probes", PROBES_BY))
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
                per_seed = pooled_accuracy(at, "seed")
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
            at_one = pooled_accuracy(first, "seed")["accuracy"].to_dict()
            for ratio in ratios:
                per_seed = pooled_accuracy(rows[rows["ratio"] == ratio], "seed")
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
                acc[name] = pooled_accuracy(at, "seed")["accuracy"].to_dict()
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
                             "means": [pooled_accuracy(sub[sub["ratio"] == r], "seed")["accuracy"].mean() for r in ratios],
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
    ratios = int_list(ratios, "ratios")
    if sweep:
        if task is None:
            raise PosbenchError("--sweep reads the learning rates of a task: give --task too")
        return sweep_table(sweep_records(dirs, task, ratios), ratios)
    if pairs is not None:
        return pairs_table(dirs, word_list(pairs, "pairs"), ratios, task)
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
            chosen = word_list(schemes, "schemes")
            have = {r["scheme"] for r in records}
            rank = ranks(chosen, have, lambda missing: PosbenchError(
                f"no probe rows of {', '.join(missing)} (have: {', '.join(_scheme_order(have))})"))
            probe_rank = {p: i for i, p in enumerate(dict.fromkeys(r["probe"] for r in records))}
            records = sorted((r for r in records if r["scheme"] in rank),
                             key=lambda r: (probe_rank[r["probe"]], rank[r["scheme"]]))
            return compact_table(records, chosen) if compact else seeds_table(records, ratios)
        return compact_table(records) if compact else seeds_table(records, ratios)
    if len(dirs) > 1:
        raise PosbenchError("several directories are read together only with seeds or pairs")
    if curves is not None:
        return curves_table(dirs[0], word_list(curves, "curves"), int(every))
    return steps_table(dirs[0]) + "\n\n" + accuracy_table(dirs[0], ratios)
