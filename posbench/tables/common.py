"""What every table reads: its options (lists of numbers or words, an order of labels) and its rows of a
results folder."""

from __future__ import annotations

from pathlib import Path

from posbench import results
from posbench.config import parse_list
from posbench.errors import PosbenchError

PathLike = str | Path


def int_list(value, what: str) -> tuple[int, ...]:
    found = parse_list(value, int, what)
    if min(found) < 1:
        raise PosbenchError(f"bad {what} {value!r}: expected positive integers")
    return found


def word_list(value, what: str) -> list[str]:
    return list(parse_list(value, str, what))


def rows_of(directory: Path, table: str, made_by: str) -> list[dict]:
    rows = results.read_rows(results.table_path(directory, table))
    if not rows:
        raise PosbenchError(f"no {table}.csv rows in {directory}: {made_by} writes them")
    return rows


def ranks(chosen: list[str], have: set[str], error) -> dict[str, int]:
    """Each chosen label's place in the order given; `error(missing)` raised when a chosen label is
    not among those the rows `have`."""
    missing = [s for s in chosen if s not in have]
    if missing:
        raise error(missing)
    return {s: i for i, s in enumerate(chosen)}
