"""posbench report: report.md and plots from a results folder, merging shards first."""

from pathlib import Path
from typing import Annotated, List, Optional

import typer

from posbench import config, results
from posbench.commands import plain
from posbench.commands.options import Share, Threshold, Tolerance
from posbench.commands.run import warn_mixed_machines
from posbench.errors import PosbenchError

# its line in posbench/docs/commands.md, and the pages that explain it
SUMMARY = "report.md and plots from a results folder, merging shards"
PAGES = ('results.md',)


def report(
    directory: Annotated[Path, typer.Argument(help="results directory")] = Path("runs"),
    *,
    merge: Annotated[Optional[List[Path]], typer.Option(
        help="other results directories (shards) to merge in first")] = None,
    tolerance: Tolerance = config.EvalConfig.effective_tolerance,
    threshold: Threshold = config.EvalConfig.effective_threshold,
    share: Share = config.EvalConfig.effective_share,
) -> Path:
    """Write report.md and PNG plots from a results directory (merging shards first).

    Returns report.md's path."""
    from posbench import reporting as reporting

    config.replace(config.EvalConfig(), effective_tolerance=tolerance, effective_threshold=threshold,
                   effective_share=share)  # range checks
    incoming = {}  # read (and checked) every table before merging any, so a bad one merges nothing
    if merge:
        results.check_provenance(directory)
        for table in results.TABLES:
            results.read_rows(results.table_path(directory, table))
    for other in merge or []:
        if not Path(other).is_dir():
            raise PosbenchError(f"no results directory {str(other)!r}")
        for table in results.TABLES:
            rows = (results.read_probes(other) if table == "probes"
                    else results.read_rows(results.table_path(other, table)))
            if rows:
                incoming.setdefault(Path(other), []).append((table, rows))
    for other, tables in incoming.items():
        for table, rows in tables:
            results.merge_rows(directory, table, rows)
        results.record_merge(directory, other, {table: len(rows) for table, rows in tables})
    warn_mixed_machines(Path(directory))
    return reporting.write_report(directory, tolerance, threshold, share)


def show(path: Path) -> int:
    plain(f"wrote {path}")
    return 0
