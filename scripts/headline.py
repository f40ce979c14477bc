#!/usr/bin/env python3
"""The headline of README.md from the committed results: a table of a few schemes (perplexity at
the training length, 4x and 16x with its 95% interval over seeds, and the effective length) and
its figure, results/headline.png. Nothing is typed in: every number is read from the CSVs of
results/catalogue and results/layouts, which `posbench run catalogue --seeds 0,1,2 --no-speed` and
`posbench run layouts --seeds 0,1,2 --no-speed` write.

    python scripts/headline.py            # prints the table, writes results/headline.png
"""

from __future__ import annotations

import sys
from pathlib import Path

from posbench import reporting, results, stats

RESULTS = Path(__file__).resolve().parents[1] / "results"
# (results folder, labels as the tables print them), in the order of the table
ROWS = [
    ("catalogue", ["none", "rope", "rope+yarn", "alibi", "kerple", "xl", "fox", "stickbreaking"]),
    ("layouts", ["rnope-swa", "swan"]),
]
# the 2026 frontier: rows of the table, left out of the figure (they lie on rope's curve or above)
FRONTIER = [
    ("catalogue", ["grape", "selective-rope"]),
    ("layouts", ["rope+sink", "rope+gate"]),
]
LENGTHS = (64, 256, 1024)


def rows(table: str, groups=ROWS) -> list[dict]:
    """The rows of `table` whose label is one of the headline's, each from its own folder."""
    out = []
    for folder, labels in groups:
        out += [r for r in results.read_rows(results.table_path(RESULTS / folder, table))
                if reporting.label(r) in labels]
    return out


def table() -> str:
    groups = ROWS + FRONTIER
    df = reporting.extrapolation_frame(rows("extrapolation", groups))
    effective = reporting.effective_cells(rows("effective_length", groups))
    body = []
    for _, labels in groups:
        for name in labels:
            mine = df[df["label"] == name]
            cells = []
            for n in LENGTHS:
                iv = stats.mean_interval(mine[mine["eval_len"] == n]["ppl"])
                cells.append(f"{iv.mean:.1f} [{iv.lo:.1f}, {iv.hi:.1f}]")
            body.append([f"`{name}`", str(mine["seed"].nunique()), *cells, effective[(name, "nonoverlap")]])
    headers = ["scheme", "seeds", *(f"{n} ({n // LENGTHS[0]}x)" for n in LENGTHS), "effective length"]
    return reporting.markdown_table(headers, body)


def main() -> int:
    print(table())
    path = reporting.plot_extrapolation(rows("extrapolation"), RESULTS / "headline.png")
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
