"""posbench paired: is A better than B, over the same windows and seeds."""

from pathlib import Path
from typing import Annotated, Optional

import pandas as pd
import typer

from posbench.commands import console
from posbench.commands import frame as to_frame
from posbench.commands.options import RunsDir, ints
from posbench.errors import PosbenchError

# its line in posbench/docs/commands.md, and the pages that explain it
SUMMARY = "is A better than B? window-by-window, seed-by-seed"
PAGES = ('reading.md',)


def paired(
    a: Annotated[str, typer.Argument(help="scheme variant A, as the tables label it (rope, rope+yarn, ...)")],
    b: Annotated[str, typer.Argument(help="scheme variant B")],
    *,
    runs_dir: RunsDir = Path("runs"),
    lengths: Annotated[Optional[str], typer.Option(help="only these evaluation lengths, e.g. 256,512")] = None,
    mode: Annotated[Optional[str], typer.Option(help="nonoverlap | sliding (default: every mode evaluated)")] = None,
    task: Annotated[Optional[str], typer.Option(help="only runs of this task (when a directory holds several)")] = None,
    probe: Annotated[Optional[str], typer.Option(
        help="compare per-answer accuracy on this probe (probes.csv; all: every probe) instead of losses")] = None,
) -> pd.DataFrame:
    """Is A better than B? The loss difference over the same windows and seeds, with its interval;
    with --probe, the accuracy difference on a probe, seed by seed."""
    from posbench import pairing as pairing

    chosen = ints(lengths, "lengths")
    if probe is not None:
        if mode is not None:
            raise PosbenchError("--mode is a protocol of window losses; probes have none: leave it out with --probe")
        rows = pairing.paired_probes(runs_dir, a, b, None if probe == "all" else probe, chosen, task)
    else:
        rows = pairing.paired(runs_dir, a, b, chosen, mode, task)
    return to_frame(rows, a=a, b=b, probe=probe is not None)


def show(result: pd.DataFrame) -> int:
    from posbench import pairing as pairing

    a, b, rows = result.attrs["a"], result.attrs["b"], result.attrs["rows"]
    console.print((pairing.paired_probes_table if result.attrs["probe"] else pairing.paired_table)(rows, a, b))
    return 0
