"""posbench compare: perplexities against a baseline, the regression gate."""

from pathlib import Path
from typing import Annotated

import typer

from posbench.commands import console, say

# its line in posbench/docs/commands.md, and the pages that explain it
SUMMARY = "the regression gate against a committed baseline"
PAGES = ('baselines.md',)


def compare(
    baseline: Annotated[Path, typer.Argument(help="baseline results directory (or extrapolation.csv)")],
    current: Annotated[Path, typer.Argument(help="current results directory (or extrapolation.csv)")],
    *,
    rtol: Annotated[float, typer.Option(help="relative perplexity tolerance")] = 0.05,
    all_rows: Annotated[bool, typer.Option("--all", help="show unchanged rows too")] = False,
):
    """Compare perplexities with a baseline; exit 1 on a regression or a missing row.

    Returns the comparison (posbench.comparison.Comparison: rows with a verdict, regressions, warnings) with the
    options that print it."""
    from posbench.comparison import compare as run_compare

    return {"comparison": run_compare(baseline, current, rtol), "rtol": rtol, "all": all_rows}


def show(result: dict) -> int:
    from posbench.comparison import diff_table

    cmp, rtol = result["comparison"], result["rtol"]
    if result["all"] or any(e["verdict"] != "same" for e in cmp.rows):  # no empty table when all agree
        console.print(diff_table(cmp, only_changes=not result["all"]))
    for warning in cmp.warnings:
        say(warning, "warning")
    same = sum(e["verdict"] == "same" for e in cmp.rows)
    console.print(f"{len(cmp.rows)} comparisons: {same} within tolerance (the seeds' interval, or rtol {rtol} "
                  f"with one seed), {cmp.regressions} regressions")
    return 1 if cmp.regressions else 0
