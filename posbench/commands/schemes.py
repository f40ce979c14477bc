"""posbench schemes: the catalogue of every positional scheme."""

import csv
import json
import sys
from enum import Enum
from typing import Annotated

import pandas as pd
import typer
from rich.table import Table

from posbench.commands import console
from posbench.commands import frame as to_frame

# its line in posbench/docs/commands.md, and the pages that explain it
SUMMARY = "the catalogue: every scheme and layout preset, its formula, hooks, parameters, paper"
PAGES = ('schemes.md',)


class Format(str, Enum):
    table = "table"
    csv = "csv"
    json = "json"
    markdown = "markdown"


def schemes(
    *,
    format: Annotated[Format, typer.Option(
        "--format", help="table, csv, json or markdown (the catalogue page, posbench/docs/schemes.md)")] = Format.table,
    policies: Annotated[bool, typer.Option(
        "--policies", help="the eval-time RoPE policies (--rope-scaling) instead: formula, reference, settings")] = False,
) -> pd.DataFrame:
    """List every positional scheme: family, hooks, learned parameters, extrapolation, paper, formula
    (--policies: every eval-time RoPE policy of --rope-scaling, with its formula and reference)."""
    from posbench.catalogue import catalogue, policy_rows

    return to_frame(policy_rows() if policies else catalogue(), format=Format(format))


def show(result: pd.DataFrame) -> int:
    from posbench.catalogue import markdown, policy_markdown

    rows, fmt = result.attrs["rows"], result.attrs["format"]
    if fmt == Format.markdown:
        sys.stdout.write(markdown(rows) if "family" in rows[0] else policy_markdown(rows))
    elif fmt == Format.json:
        print(json.dumps(rows, indent=1))
    elif fmt == Format.csv:
        writer = csv.DictWriter(sys.stdout, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    else:
        table = Table(title="posbench schemes" if "family" in rows[0] else "RoPE policies", show_lines=False)
        for col in rows[0]:
            table.add_column(col, overflow="fold")
        for row in rows:
            table.add_row(*(str(v) for v in row.values()))
        console.print(table)
    return 0
