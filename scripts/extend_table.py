#!/usr/bin/env python
"""The extension tables of results/extend/README.md, from a results directory of `posbench run extend`
(or `extend-passkey`): perplexity by method and budget, mean over seeds with its t-interval, the
tokens and wall seconds of fine-tuning; paired comparisons between children of the same parents
(perplexity ratio over the same windows and seeds); and, where probes.csv holds passkey rows,
retrieval accuracy per length (depths pooled, Wilson interval).

    python scripts/extend_table.py DIR [--lengths 64,256,1024] [--pairs yarn:pi,ntk:pi,...]

Prints markdown.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from posbench import results, stats
from posbench.config import parse_int_list
from posbench.errors import PosbenchError
from posbench.pairing import paired
from posbench.reporting import label

PAIRS = "yarn:pi,ntk:pi,pose+yarn:plain,pose+yarn:yarn,longrope:yarn,plain:parent,drope:yarn,drope:pose+yarn,drope:parent"


def cell(values) -> str:
    m = stats.mean_interval(values)
    return f"{m.mean:.2f} [{m.lo:.2f}, {m.hi:.2f}]" if m.n > 1 else f"{m.mean:.2f}"


def perplexity_table(out: Path, lengths: tuple[int, ...]) -> list[str]:
    ext = pd.DataFrame(results.read_rows(results.table_path(out, "extrapolation")))
    ext = ext[ext["status"] == "ok"]
    ext["label"] = ext.apply(label, axis=1)
    ext["ppl"] = pd.to_numeric(ext["ppl"])
    runs = pd.DataFrame(results.read_rows(results.table_path(out, "runs")))
    children = runs[runs["parent_run"] != ""]
    cost = {}
    for _, r in children.iterrows():
        cost.setdefault(label({**r, "scaling": "none"}), []).append((int(r["tokens"]), float(r["train_seconds"])))
    lines = ["| run | seeds | tokens | fine-tuning s | " + " | ".join(str(n) for n in lengths) + " |",
             "|---|---|---|---|" + "---|" * len(lengths)]
    for name, group in sorted(ext.groupby("label"), key=lambda g: (g[0].split(">")[0], g[0])):
        spent = cost.get(name, [])
        tokens = f"{spent[0][0]:,}" if spent else ""
        seconds = f"{sorted(s for _, s in spent)[len(spent) // 2]:.0f}" if spent else ""
        ppl = [cell(group[group["eval_len"].astype(int) == n]["ppl"]) for n in lengths]
        lines.append(f"| {name} | {group['seed'].nunique()} | {tokens} | {seconds} | " + " | ".join(ppl) + " |")
    return lines


def paired_table(out: Path, lengths: tuple[int, ...], pairs: list[tuple[str, str]]) -> list[str]:
    ext = results.read_rows(results.table_path(out, "extrapolation"))
    children = {label({**r, "scaling": "none"}) for r in ext if r["extend_method"]}
    # a child's counterparts are named by its parent's scheme (a drope child of rope is `none>drope`)
    runs = {r["run_id"]: r for r in results.read_rows(results.table_path(out, "runs"))}
    parent_scheme = {label({**r, "scaling": "none"}): runs[runs[r["run_id"]]["parent_run"]]["scheme"]
                     for r in ext if r["extend_method"] and runs.get(runs.get(r["run_id"], {}).get("parent_run"))}
    lines = ["| A vs B | seeds | " + " | ".join(f"A/B at {n}" for n in lengths) + " |",
             "|---|---|" + "---|" * len(lengths)]
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
            lines.append(f"| {child} vs {b} | {seeds} | " + " | ".join(ratios) + " |")
    return lines


def passkey_table(out: Path) -> list[str]:
    path = results.table_path(out, "probes")
    if not path.exists():
        return []
    df = pd.DataFrame(results.read_rows(path))
    df = df[df["status"].isin(["ok", "not learned"])]
    df["label"] = df.apply(label, axis=1)
    lengths = sorted(df["eval_len"].astype(int).unique())
    lines = ["| run | " + " | ".join(str(n) for n in lengths) + " |", "|---|" + "---|" * len(lengths)]
    for name, group in sorted(df.groupby("label")):
        cells = []
        for n in lengths:
            at = group[group["eval_len"].astype(int) == n]
            hits, answers = int(at["hits"].astype(int).sum()), int(at["answers"].astype(int).sum())
            lo, hi = stats.wilson(hits, answers)
            cells.append(f"{hits / answers:.0%} ({lo:.0%}-{hi:.0%})" if answers else "")
        status = " (not learned)" if (group["status"] == "not learned").any() else ""
        lines.append(f"| {name}{status} | " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--lengths", default="64,256,1024")
    ap.add_argument("--pairs", default=PAIRS, help="A:B methods compared at each budget (B `parent`: the parent)")
    args = ap.parse_args(argv)
    try:
        lengths = parse_int_list(args.lengths, "lengths")
        pairs = [tuple(p.split(":", 1)) for p in args.pairs.split(",") if p]
        if results.table_path(args.out, "extrapolation").exists():
            print("\n".join(perplexity_table(args.out, lengths)), end="\n\n")
            print("\n".join(paired_table(args.out, lengths, pairs)), end="\n\n")
        print("\n".join(passkey_table(args.out)))
    except (PosbenchError, OSError, KeyError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
