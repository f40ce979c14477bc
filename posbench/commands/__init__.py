"""The commands, one module each, named as the command. In each, a function of the command's name
takes a task and its overrides and returns what it computed (DataFrames, paths, exit codes), and
`show` prints that result on the command line. posbench.cli builds the command line from them;
`posbench.<command>(...)` is the Python API (posbench.api)."""

import importlib
import sys
from types import ModuleType
from typing import Any

import pandas as pd
from rich.console import Console

NAMES = ("schemes", "check", "train", "extrapolate", "inspect", "extend", "speed", "run", "submit", "compare",
         "paired", "report", "tasks", "probe", "table")

console = Console(width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, emoji=False)  # a message's text as written: no :name: emoji codes


def module(name: str) -> ModuleType:
    return importlib.import_module(f"posbench.commands.{name}")


def frame(rows: list[dict[str, Any]], **attrs: Any) -> pd.DataFrame:
    """The rows as a DataFrame; `attrs["rows"]` keeps them as written (None, not NaN, for an empty
    cell), which is what the command line prints from."""
    out = pd.DataFrame(rows)
    out.attrs.update(rows=rows, **attrs)
    return out


def say(line: str, kind: str = "error") -> None:
    """One whole line on stderr: `error: ...`, `warning: ...` or `note: ...`."""
    err.print(f"{kind}: {line}", markup=False, highlight=False, soft_wrap=True)


def failed(line: str | None) -> int:
    """Exit 1 with one line on stderr when some rows failed (the others were written); 0 otherwise."""
    if line:
        say(line)
    return 1 if line else 0


def plain(line: str) -> None:
    """One whole line on stdout, as written."""
    console.print(line, soft_wrap=True, highlight=False, markup=False)
