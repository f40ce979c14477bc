"""posbench table: the markdown tables of README.md and results/*/README.md from a results folder."""

from pathlib import Path
from typing import Annotated, List, Optional

import typer

from posbench.commands.options import Schemes, names
from posbench.errors import PosbenchError

# its line in posbench/docs/commands.md, and the pages that explain it
SUMMARY = "the README's and results folders' markdown tables, from their CSVs"
PAGES = ("results.md",)


def table(
    name: Annotated[str, typer.Argument(help="headline, probes, extend, pretrained, attention, speed or scaling")],
    directory: Annotated[List[Path], typer.Argument(help="the results folder (probes: one or more)")],
    *,
    figure: Annotated[Optional[Path], typer.Option(help="headline, scaling: also write its plot there")] = None,
    seeds: Annotated[bool, typer.Option("--seeds", help="probes: the table over seeds")] = False,
    compact: Annotated[bool, typer.Option("--compact", help="probes, with --seeds: probe x scheme, the means "
                                                            "alone")] = False,
    task: Annotated[Optional[str], typer.Option(help="probes: only runs of this task")] = None,
    sweep: Annotated[bool, typer.Option("--sweep", help="probes, with --task: its learning-rate sweep and the "
                                                        "rate each cell chooses")] = False,
    ratios: Annotated[Optional[str], typer.Option(help="probes: length ratios, e.g. 1,2,4,8")] = None,
    pairs: Annotated[Optional[str], typer.Option(help="probes: seed-paired differences A:B:PROBE,...; extend: "
                                                      "paired ratios A:B,...")] = None,
    curves: Annotated[Optional[str], typer.Option(help="probes: learning curves of these probes")] = None,
    every: Annotated[Optional[int], typer.Option(help="probes, with --curves: a point every this many steps")] = None,
    lengths: Annotated[Optional[str], typer.Option(help="extend, attention: the lengths shown")] = None,
    by_layer: Annotated[Optional[str], typer.Option(help="attention: this measure per layer")] = None,
    schemes: Schemes = None,
) -> str:
    """Print a markdown table made from a results folder's CSVs: the tables of README.md and
    results/*/README.md, each from the folder beside it (--schemes: the schemes of the attention
    table or of the probes table over seeds, in that order).

    Returns the markdown, without a final newline. Options a table does not take are refused in
    one line (posbench/docs/results.md lists each table's)."""
    from posbench import tables

    given = {"figure": figure, "seeds": seeds or None, "compact": compact or None, "task": task,
             "sweep": sweep or None, "ratios": ratios,
             "pairs": pairs, "curves": curves, "every": every, "lengths": lengths, "by_layer": by_layer,
             "schemes": ",".join(names(schemes)) if schemes else None}
    if not directory:
        raise PosbenchError("name the results folder: posbench table NAME DIR")
    folders = directory[0] if len(directory) == 1 else directory
    return tables.table(name, folders, **{k: v for k, v in given.items() if v is not None})


def show(text: str) -> int:
    print(text)
    return 0
