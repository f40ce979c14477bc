#!/usr/bin/env python
"""The tables of results/pretrained/README.md, from a results directory of `posbench extrapolate
--model` and `posbench probe --model` (posbench/docs/pretrained.md): perplexity by policy and
length (95% interval over windows where a length has two or more); inside and past the model's
context within each window (the position buckets of positions.csv that straddle train_len); the
effective length; passkey per-digit accuracy and exact match by policy and length (depths pooled,
Wilson intervals).

    python scripts/pretrained_table.py DIR

Prints markdown.
"""

from __future__ import annotations

import math
import sys
from collections import defaultdict
from pathlib import Path

from posbench import results, stats

ORDER = ("none", "pi", "ntk", "dynamic-ntk", "yarn", "llama3", "longrope", "self-extend", "rerope")


def order(scaling: str) -> tuple:
    kind = scaling.split("(")[0].split(":")[0]
    return (ORDER.index(kind) if kind in ORDER else len(ORDER), scaling)


def perplexity(directory: Path) -> list[str]:
    rows = [r for r in results.read_rows(results.table_path(directory, "extrapolation")) if r["status"] == "ok"]
    lengths = sorted({int(r["eval_len"]) for r in rows})
    cells = {(r["scaling"], int(r["eval_len"])): r for r in rows}
    out = ["| policy | " + " | ".join(f"{n} ({int(n) // 1024}k)" for n in lengths) + " |",
           "|---" * (len(lengths) + 1) + "|"]
    for scaling in sorted({r["scaling"] for r in rows}, key=order):
        line = [scaling]
        for n in lengths:
            r = cells.get((scaling, n))
            if r is None:
                line.append("")
                continue
            shared = " *" if r["reason"] else ""
            windows = int(r["tokens"]) // n
            ci = f" [{float(r['ppl_lo']):.2f}, {float(r['ppl_hi']):.2f}]" if r["ppl_lo"] not in ("", "nan") else ""
            line.append(f"{float(r['ppl']):.2f}{ci} ({windows} w){shared}")
        out.append("| " + " | ".join(line) + " |")
    return out


def inside_and_past(directory: Path) -> list[str]:
    """Per policy and length past train_len: perplexity over the position buckets below and past the
    first bucket edge at or past train_len."""
    extrapolation = results.read_rows(results.table_path(directory, "extrapolation"))
    train_len = {int(r["train_len"]) for r in extrapolation}.pop()
    groups = defaultdict(list)
    for p in results.read_rows(results.table_path(directory, "positions")):
        if int(p["eval_len"]) > train_len:
            groups[(p["scaling"], int(p["eval_len"]))].append(p)
    out = ["| policy | length | positions | ppl | positions | ppl |", "|---|---|---|---|---|---|"]
    for (scaling, n), buckets in sorted(groups.items(), key=lambda kv: (kv[0][1], order(kv[0][0]))):
        # split at the first bucket edge at or past train_len (the buckets are log-spaced: the bounds are shown)
        cut = min(int(b["position_start"]) for b in buckets if int(b["position_start"]) >= train_len)
        sides = []
        for keep in (lambda b: int(b["position_end"]) < cut, lambda b: int(b["position_start"]) >= cut):
            chosen = [b for b in buckets if keep(b)]
            tokens = sum(int(b["tokens"]) for b in chosen)
            loss = sum(float(b["loss"]) * int(b["tokens"]) for b in chosen) / tokens
            sides.append(f"{min(int(b['position_start']) for b in chosen)}-{max(int(b['position_end']) for b in chosen)} | "
                         f"{math.exp(loss):.2f}")
        out.append(f"| {scaling} | {n} | {sides[0]} | {sides[1]} |")
    return out


def effective(directory: Path) -> list[str]:
    rows = results.read_rows(results.table_path(directory, "effective_length"))
    out = ["| policy | reference ppl (8k) | effective length | status |", "|---|---|---|---|"]
    for r in sorted((r for r in rows if r["metric"] == "ppl"), key=lambda r: order(r["scaling"])):
        mark = ">= " if r["status"] == "censored" else ""
        out.append(f"| {r['scaling']} | {float(r['reference']):.2f} | {mark}{r['effective_len']} | {r['status']} |")
    return out


def passkey(directory: Path) -> list[str]:
    rows = [r for r in results.read_probes(directory) if r["probe"] == "passkey"]
    cells = defaultdict(lambda: [0, 0, 0, 0])
    for r in rows:
        c = cells[(r["scaling"], int(r["eval_len"]))]
        c[0] += int(r["hits"])
        c[1] += int(r["answers"])
        c[2] += int(r["exact"])
        c[3] += int(r["trials"])
    out = ["| policy | length | digits right | per-digit accuracy [Wilson 95%] | keys right (exact) | by depth 0, .25, .5, .75, 1 |",
           "|---|---|---|---|---|---|"]
    for (scaling, n), (hits, answers, exact, trials) in sorted(cells.items(), key=lambda kv: (kv[0][1], order(kv[0][0]))):
        lo, hi = stats.wilson(hits, answers)
        depths = sorted((r for r in rows if r["scaling"] == scaling and int(r["eval_len"]) == n),
                        key=lambda r: float(r["variant"].split("=")[-1]) if "=" in r["variant"] else r["variant"])
        by_depth = " ".join(f"{r['hits']}/{r['answers']}" for r in depths)
        out.append(f"| {scaling} | {n} | {hits}/{answers} | {hits / answers:.0%} [{lo:.0%}, {hi:.0%}] | "
                   f"{exact}/{trials} | {by_depth} |")
    return out


def main(argv: list[str]) -> int:
    directory = Path(argv[0]) if argv else Path("results/pretrained")
    for title, lines in (("Perplexity by policy and length", perplexity(directory)),
                         ("Inside and past the context, within each window", inside_and_past(directory)),
                         ("Effective length", effective(directory)),
                         ("Passkey", passkey(directory))):
        print(f"### {title}\n")
        print("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
