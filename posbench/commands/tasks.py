"""posbench tasks: the task files that ship with posbench and those in ./tasks/, validated."""

from pathlib import Path
from typing import Annotated

import pandas as pd
import typer
from rich.markup import escape
from rich.table import Table

from posbench import config
from posbench.commands import console
from posbench.commands import frame as to_frame
from posbench.errors import PosbenchError

# its line in posbench/docs/commands.md, and the pages that explain it
SUMMARY = "the task files and where each name resolves"
PAGES = ('data.md',)


def tasks(
    *,
    validate: Annotated[bool, typer.Option("--validate", help="load every task strictly; exit 1 on any error")] = False,
) -> pd.DataFrame:
    """List the tasks that ship with posbench and those in ./tasks/ (which win on a name clash),
    and validate them.

    One row per task file, `status` ok or the error."""
    rows = []
    for name, path in sorted(config.task_files().items()):
        row = {"name": name, "version": "", "schemes": "", "seeds": "", "train_len": "", "eval lengths": "",
               "data": "", "file": _shown_path(path), "status": "ok"}
        try:
            t = config.load_task(str(path))
        except PosbenchError as e:
            rows.append({**row, "status": f"{row['file']}: {e}"})
            continue
        rows.append({**row, "version": str(t.version), "schemes": ",".join(t.schemes),
                     "seeds": ",".join(map(str, t.seeds)),
                     "train_len": "-" if t.pretrained else str(t.train.train_len),  # a pretrained model: its own context
                     "eval lengths": ",".join(map(str, t.eval.lengths)), "data": t.data.spec})
    return to_frame(rows, validate=validate)


def show(result: pd.DataFrame) -> int:
    table = Table(title="posbench tasks", caption="./tasks/ wins over a shipped task of the same name")
    rows = result.attrs["rows"]
    for col in ("name", "version", "schemes", "seeds", "train_len", "eval lengths", "data", "file", "status"):
        table.add_column(col, overflow="fold")
    bad = [r["status"] for r in rows if r["status"] != "ok"]
    for r in rows:
        status = "ok" if r["status"] == "ok" else "[red]error (below)[/]"
        table.add_row(*(escape(str(v)) for k, v in r.items() if k != "status"), status)
    console.print(table)
    for line in bad:  # whole lines, whatever the terminal's width
        console.print(f"[red]{escape(line)}[/]", soft_wrap=True)
    return 1 if result.attrs["validate"] and bad else 0


def _shown_path(path: Path) -> str:
    """A task file's path, relative to the current folder when under it."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)
