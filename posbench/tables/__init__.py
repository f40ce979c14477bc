"""The markdown tables of README.md and results/*/README.md, made from a results folder's CSVs:
`table(name, directory, **options)`, what `posbench table NAME DIR` prints. Every table is written
by reporting.markdown_table; intervals are stats.py's (the t-interval over seeds, the Wilson interval
of pooled answers). The tables and their options: posbench/docs/results.md.

    headline    the README's headline: a few schemes' perplexity at 1x, 4x, 16x with their
                interval over seeds, and their effective length (DIR: the results root, with
                catalogue/ and layouts/); figure=PATH also writes its plot
    probes      the probe suite: steps to the early stop and accuracy per ratio (one folder), or
                over seeds (seeds, compact), seed-paired differences (pairs), learning curves (curves)
    extend      extension methods: perplexity by method and budget, paired ratios, passkey accuracy
    pretrained  a pretrained model under the scaling policies: perplexity, inside and past its
                context, effective length, passkey
    attention   attention measures by length beside perplexity, or one measure per layer
    speed       attention cost per scheme and length (speed.csv), one table per pass and shape
    scaling     extrapolation by model size and training tokens: ratios, slopes, seed-paired verdicts
                (posbench.scaling); figure=PATH also writes its plot

The tables live by the results they render: headline_table, probe_tables, extend_tables,
pretrained_tables, attention_tables (and posbench.scaling), on the options and rows of common.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Sequence
from pathlib import Path

from posbench.errors import PosbenchError, did_you_mean
from posbench.scaling import scaling as scaling_table
from posbench.tables.attention_tables import attention, speed
from posbench.tables.common import PathLike
from posbench.tables.extend_tables import extend
from posbench.tables.headline_table import headline
from posbench.tables.pretrained_tables import pretrained, pretrained_perplexity, pretrained_ruler
from posbench.tables.probe_tables import holding_cell, probes, steps_cell, sweep_records, sweep_table, width_line

__all__ = ["TABLES", "attention", "extend", "headline", "holding_cell", "options", "pretrained", "pretrained_perplexity",
           "pretrained_ruler", "probes", "speed", "steps_cell", "sweep_records", "sweep_table", "table", "width_line"]


# ---- the one entry point ------------------------------------------------------------------------

TABLES = {"headline": headline, "probes": probes, "extend": extend, "pretrained": pretrained,
          "attention": attention, "speed": speed, "scaling": scaling_table}
SEVERAL_FOLDERS = {"probes"}  # tables that read several folders as one (probes with seeds or pairs)


def options(name: str) -> dict[str, object]:
    """The keyword options of table `name` and their defaults."""
    if name not in TABLES:
        raise did_you_mean(name, TABLES, "table")
    params = inspect.signature(TABLES[name]).parameters.values()
    return {p.name: p.default for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}


def _folders(directory: PathLike | Sequence[PathLike]) -> list[Path]:
    dirs = [Path(directory)] if isinstance(directory, (str, Path)) else [Path(d) for d in directory]
    if not dirs:
        raise PosbenchError("no results folder given")
    for d in dirs:
        if not d.is_dir():
            raise PosbenchError(f"{d}: no such results folder")
    return dirs


def table(name: str, directory: PathLike | Iterable[PathLike], **opts) -> str:
    """The markdown of table `name` (headline, probes, extend, pretrained, attention, speed) from
    the results folder `directory` (the probes table: one or more folders), without a final
    newline. Options are the table's keywords (`options(name)`); a list option takes a list or
    its comma-separated text ("2,4,8"). Bad input raises PosbenchError, one line."""
    known = options(name)
    for key in opts:
        if key not in known:
            if not known:
                raise PosbenchError(f"the {name} table takes no options (got {key!r})")
            raise did_you_mean(key, known, f"option of the {name} table")
    dirs = _folders(directory)
    if name in SEVERAL_FOLDERS:
        return TABLES[name](dirs, **opts)
    if len(dirs) > 1:
        raise PosbenchError(f"the {name} table reads one results folder (got {len(dirs)})")
    return TABLES[name](dirs[0], **opts)
