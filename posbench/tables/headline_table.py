"""The README's headline table: a few schemes' perplexity at 1x, 4x and 16x with their interval over
seeds, and their effective length, from the results root's catalogue/ and layouts/."""

from __future__ import annotations

from pathlib import Path

from posbench import stats
from posbench.reporting import label, markdown_table
from posbench.tables.common import PathLike, rows_of

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
        rows = rows_of(directory / folder, table, f"`posbench run {folder} --seeds 0,1,2 --no-speed`")
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
