#!/usr/bin/env python
"""The probe tables of results/probes/README.md, from a results directory of the probes task (runs.csv,
probes.csv and the runs' config.json): the step each run stopped at (its early stop, or its last
step with its final held-out accuracy in parentheses), probe x scheme; and per-answer accuracy at
each ratio of the training length, variants pooled (passkey's depths), with the Wilson interval of
the pooled counts and `not learned` where the gate says so; several seeds: the mean over seeds.
Also the summed training time of the runs (one core each).

    python scripts/probes_table.py DIR [--ratios 1,2,4,8] [--curves PROBE[,PROBE...]] [--every 1000]
    python scripts/probes_table.py DIR [DIR...] --seeds [--compact] [--task TASK] [--ratios 1,2,4,8]
    python scripts/probes_table.py DIR [DIR...] --pairs A:B:PROBE[,A:B:PROBE...] [--task TASK] [--ratios 2,4,8]

--seeds prints the table over seeds instead, from one or more results directories read as one (a run
in several counts once, from the first): per probe and scheme, the seeds scored, how many learned in
length (at least 90% at the training length, the gate of `posbench probe`), steps to the early stop
as median and range (a run that spent every step counts its last step, marked +), per ratio the
mean over seeds of each seed's per-answer accuracy with its 95% t-interval over seeds (clipped to
0..100), or the Wilson interval of the pooled answers where one seed was scored; per ratio the
median and quartiles over seeds (the typical seed); and per ratio above 1 the seeds holding the
probe, those that keep at least half of their accuracy at the training length, `k of n` with the
Wilson 95% interval of that share (how reliably a scheme keeps it). --compact prints
probe x scheme instead, each cell the means at the ratios (`(k of n learned)` where not every seed
learned), the scheme variants named in COLUMNS alone (README's table). --task keeps the
runs of that task's grid alone (e.g. probe-seeds, whose seed-0 runs share results/probes' run_ids).

--pairs compares scheme A with scheme B on PROBE seed by seed (the same seed: the same batches,
initial draw and scored prompts), variants pooled (passkey's depths): per ratio each seed's
per-answer accuracy difference A - B in points, their mean with its 95% t-interval, how many seeds
favour A, and a verdict: `holds` when the interval excludes 0 in A's favour, `every seed, not
the interval` when every seed favours A but the interval reaches 0, `reversed` when the interval
excludes 0 in B's favour, else `does not hold`. (`posbench paired --probe` gives the same per
variant.)

--curves prints instead the learning curves of the runs on those probes: held-out per-answer
accuracy at the training length (log.csv's val_accuracy) every `--every` steps.

Prints markdown.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from posbench import results, stats
from posbench.config import parse_int_list
from posbench.errors import PosbenchError
from posbench.probes import PROBES
from posbench.report import label

ORDER = ["mqar", "passkey", "multikey", "multivalue", "multiquery", "vartrack", "copy", "reverse", "sort",
         "parity", "addition"]  # the order of results/probes/README.md; probes not named here follow
COLUMNS = ["none", "rope", "rope+randomized", "alibi", "t5", "kerple", "fire", "fox", "rnope-swa"]


def run_probes(out: Path) -> dict[str, str]:
    """run_id -> the probe its run trained on (from its config)."""
    found = {}
    for config in out.glob("*/config.json"):
        spec = json.loads(config.read_text())["data"]["spec"]
        found[config.parent.name] = str(spec).split(":")[0]
    return found


def probes_in(names) -> list[str]:
    present = set(names)
    return [p for p in ORDER if p in present] + sorted(present - set(ORDER))


def steps_table(out: Path) -> list[str]:
    runs = pd.DataFrame(results.read_rows(results.table_path(out, "runs")))
    runs = runs[runs["status"] == "ok"].copy()
    probe_of = run_probes(out)
    runs["probe"] = runs["run_id"].map(probe_of)
    runs = runs[runs["probe"].isin(PROBES)]
    runs["label"] = runs.apply(label, axis=1)
    columns = COLUMNS + sorted(set(runs["label"]) - set(COLUMNS))
    lines = ["| probe | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for probe in probes_in(runs["probe"]):
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
        lines.append(f"| {probe} | " + " | ".join(cells) + " |")
    seconds = pd.to_numeric(runs["train_seconds"]).sum()
    lines += ["", f"{len(runs)} runs, {seconds / 3600:.1f} hours of training (one core each)"]
    return lines


def accuracy_table(out: Path, ratios: tuple[int, ...]) -> list[str]:
    df = pd.DataFrame(results.read_rows(results.table_path(out, "probes")))
    df = df[df["status"].isin(["ok", "not learned"])].copy()
    df["label"] = df.apply(label, axis=1)
    for c in ("ratio", "hits", "answers"):
        df[c] = pd.to_numeric(df[c])
    lines = ["| probe | scheme | " + " | ".join(f"{r}x" for r in ratios) + " |", "|---" * (len(ratios) + 2) + "|"]
    order = {c: i for i, c in enumerate(COLUMNS)}
    for probe in probes_in(df["probe"]):
        sub = df[df["probe"] == probe]
        labels = sorted(set(sub["label"]), key=lambda s: (order.get(s.split("+")[0], 99), s))
        for name in labels:
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
            lines.append(f"| {probe} | {name}{suffix}{seed_note} | " + " | ".join(cells) + " |")
    return lines


def seed_accuracy(rows: pd.DataFrame) -> pd.DataFrame:
    """Per seed, the pooled hits and answers of `rows` (variants summed) and their ratio."""
    per_seed = rows.groupby("seed")[["hits", "answers"]].sum()
    return per_seed.assign(accuracy=per_seed["hits"] / per_seed["answers"])


def seeds_rows(dirs: list[Path], ratios: tuple[int, ...], task: str | None = None) -> list[dict]:
    """One record per probe and scheme variant: seeds scored, seeds learned, steps to the stop,
    and per ratio the mean over seeds (`means`) with its formatted cell (`cells`)."""
    df = scored_frame(dirs, task)
    runs: dict[str, dict] = {}
    for out in dirs:
        for r in results.read_rows(results.table_path(out, "runs")):
            if r["status"] == "ok":
                runs.setdefault(r["run_id"], r)
    order = {c: i for i, c in enumerate(COLUMNS)}
    out = []
    for probe in probes_in(df["probe"]):
        sub = df[df["probe"] == probe]
        for name in sorted(set(sub["label"]), key=lambda s: (order.get(s.split("+")[0], 99), s)):
            rows = sub[sub["label"] == name]
            first = rows[rows["ratio"] == 1]
            steps = []
            for run_id in sorted(set(rows["run_id"])):
                r = runs.get(run_id)
                if r is not None:
                    stopped = r["stopped_at"] and int(r["stopped_at"]) < int(r["steps"])
                    steps.append((int(r["stopped_at"]) if stopped else int(r["steps"]), not stopped))
            record = {"probe": probe, "scheme": name, "seeds": rows["seed"].nunique(),
                      "learned": first[first["status"] != "not learned"]["seed"].nunique(),
                      "scored": first["seed"].nunique(), "steps": steps_cell(steps), "means": [], "cells": [],
                      "medians": [], "holding": []}
            at_one = seed_accuracy(first)["accuracy"].to_dict()
            for ratio in ratios:
                per_seed = seed_accuracy(rows[rows["ratio"] == ratio])
                if per_seed.empty:
                    mean, cell = None, ""
                elif len(per_seed) == 1:
                    hits, answers = int(per_seed["hits"].iloc[0]), int(per_seed["answers"].iloc[0])
                    lo, hi = stats.wilson(hits, answers)
                    mean, cell = hits / answers, f"{100 * hits / answers:.0f} ({100 * lo:.0f}-{100 * hi:.0f})"
                else:
                    ci = stats.mean_interval(per_seed["accuracy"])
                    mean, cell = ci.mean, f"{100 * ci.mean:.0f} [{100 * max(ci.lo, 0):.0f}, {100 * min(ci.hi, 1):.0f}]"
                record["means"].append(mean)
                record["cells"].append(cell)
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


def seeds_table(records: list[dict], ratios: tuple[int, ...]) -> list[str]:
    longer = [k for k, r in enumerate(ratios) if r > 1]
    head = (["probe", "scheme", "seeds", "learned", "steps to stop"] + [f"{r}x mean [95%]" for r in ratios]
            + [f"{r}x median (IQR)" for r in ratios] + [f"{ratios[k]}x holding" for k in longer])
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for r in records:
        cells = [r["probe"], r["scheme"], str(r["seeds"]), f"{r['learned']} of {r['scored']}", r["steps"], *r["cells"],
                 *r["medians"], *(r["holding"][k] for k in longer)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def scored_frame(dirs: list[Path], task: str | None) -> pd.DataFrame:
    """The scored probe rows of several folders read as one (a run in several: the first's rows)."""
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
    df["label"] = df.apply(label, axis=1)
    for c in ("ratio", "hits", "answers", "seed"):
        df[c] = pd.to_numeric(df[c])
    return df


def pairs_table(dirs: list[Path], pairs: list[str], ratios: tuple[int, ...], task: str | None = None) -> list[str]:
    df = scored_frame(dirs, task)
    head = ["A", "B", "probe", "ratio", "seeds", "A - B by seed", "mean [95%]", "seeds for A", "verdict"]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for pair in pairs:
        try:
            a, b, probe = pair.split(":")
        except ValueError:
            raise PosbenchError(f"bad pair {pair!r}: expected A:B:PROBE, e.g. none:rope:passkey") from None
        for name in (a, b):
            if not ((df["label"] == name) & (df["probe"] == probe)).any():
                raise PosbenchError(f"no scored rows of {name} on {probe}")
        for ratio in ratios:
            acc = {}
            for name in (a, b):
                at = df[(df["label"] == name) & (df["probe"] == probe) & (df["ratio"] == ratio)]
                acc[name] = seed_accuracy(at)["accuracy"].to_dict()
            seeds = sorted(set(acc[a]) & set(acc[b]))
            if not seeds:
                continue
            diffs = [100 * (acc[a][k] - acc[b][k]) for k in seeds]
            ci = stats.mean_interval(diffs)
            favour = sum(d > 0 for d in diffs)
            if len(seeds) > 1 and ci.lo > 0:
                word = "holds"
            elif len(seeds) > 1 and ci.hi < 0:
                word = "reversed"
            elif favour == len(seeds):
                word = "every seed, not the interval" if len(seeds) > 1 else "one seed"
            else:
                word = "does not hold"
            interval = f"{ci.mean:+.0f} [{ci.lo:+.0f}, {ci.hi:+.0f}]" if len(seeds) > 1 else f"{ci.mean:+.0f}"
            lines.append(f"| {a} | {b} | {probe} | {ratio:g}x | {len(seeds)} | "
                         + " / ".join(f"{d:+.1f}" if abs(d) < 0.5 else f"{d:+.0f}" for d in diffs)
                         + f" | {interval} | {favour} of {len(seeds)} | {word} |")
    return lines


def compact_table(records: list[dict]) -> list[str]:
    """probe x scheme: the means at the ratios, and the learned count where not every seed learned."""
    cells: dict[str, dict[str, str]] = {}
    for r in records:
        cell = " / ".join("" if m is None else f"{100 * m:.0f}" for m in r["means"])
        learned = "" if r["learned"] == r["scored"] else f" ({r['learned']} of {r['scored']} learned)"
        cells.setdefault(r["probe"], {})[r["scheme"]] = cell + learned
    columns = [c for c in COLUMNS if any(c in row for row in cells.values())]
    lines = ["| probe | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for probe, row in cells.items():
        lines.append(f"| {probe} | " + " | ".join(row.get(c, "") for c in columns) + " |")
    return lines


def steps_cell(steps: list[tuple[int, bool]]) -> str:
    """Median and range of (step, spent every step) pairs; + marks a value from a run that did not stop."""
    if not steps:
        return ""
    steps = sorted(steps)
    word = lambda s: f"{s[0]:,}" + ("+" if s[1] else "")  # noqa: E731
    mid = steps[len(steps) // 2] if len(steps) % 2 else None
    median = word(mid) if mid else f"{(steps[len(steps) // 2 - 1][0] + steps[len(steps) // 2][0]) / 2:,.0f}"
    if len(steps) == 1:
        return median
    return f"{median} ({word(steps[0])}-{word(steps[-1])})"


def curves_table(out: Path, probes: list[str], every: int) -> list[str]:
    runs = {r["run_id"]: r for r in results.read_rows(results.table_path(out, "runs"))}
    probe_of = run_probes(out)
    curves = {}
    for run_id, probe in sorted(probe_of.items()):
        spec = json.loads((out / run_id / "config.json").read_text())["data"]["spec"]
        if probe not in probes or run_id not in runs or not (out / run_id / "log.csv").exists():
            continue
        log = pd.read_csv(out / run_id / "log.csv").dropna(subset=["val_accuracy"])
        curves[(spec, label(runs[run_id]), run_id)] = dict(zip(log["step"], log["val_accuracy"]))
    if not curves:
        raise PosbenchError(f"no runs of {', '.join(probes)} with a log in {out}")
    last = max(max(c) for c in curves.values())
    steps = list(range(every, last + 1, every))
    lines = ["| data | scheme | " + " | ".join(f"{s:,}" for s in steps) + " |", "|---" * (len(steps) + 2) + "|"]
    for (spec, name, _), curve in sorted(curves.items()):
        cells = [f"{100 * curve[s]:.0f}" if s in curve else "" for s in steps]
        lines.append(f"| {spec} | {name} | " + " | ".join(cells) + " |")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", type=Path, nargs="+")
    parser.add_argument("--seeds", action="store_true")
    parser.add_argument("--task", default=None)
    parser.add_argument("--pairs", default=None)
    parser.add_argument("--compact", action="store_true")
    parser.add_argument("--ratios", default="1,2,4,8")
    parser.add_argument("--curves", default=None)
    parser.add_argument("--every", type=int, default=1000)
    args = parser.parse_args(argv)
    try:
        if args.pairs:
            lines = pairs_table(args.dir, args.pairs.split(","), parse_int_list(args.ratios), args.task)
        elif args.seeds:
            ratios = parse_int_list(args.ratios)
            records = seeds_rows(args.dir, ratios, args.task)
            lines = compact_table(records) if args.compact else seeds_table(records, ratios)
        elif len(args.dir) > 1:
            raise PosbenchError("several directories are read together only with --seeds")
        elif args.curves:
            lines = curves_table(args.dir[0], args.curves.split(","), args.every)
        else:
            lines = steps_table(args.dir[0]) + [""] + accuracy_table(args.dir[0], parse_int_list(args.ratios))
    except (PosbenchError, OSError, KeyError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
