"""posbench check: the conformance report of a scheme, a plug-in's included."""

import dataclasses
from typing import Annotated, Optional, Sequence

import pandas as pd
import typer
from rich.markup import escape

from posbench.commands import console
from posbench.commands import frame as to_frame
from posbench.commands.options import Param, load_plugins, names, params

# its line in posbench/docs/commands.md, and the pages that explain it
SUMMARY = "the conformance report of a scheme (yours included)"
PAGES = ('plugins.md',)


def check(
    scheme: Annotated[str, typer.Argument(help="a scheme, preset or layout spec (a plug-in's with --plugin)")],
    *,
    param: Param = None,
    skip: Annotated[Optional[str], typer.Option(help="properties to leave out, comma-separated (e.g. cost)")] = None,
    plugins: Sequence[str] = (),
) -> pd.DataFrame:
    """Conformance report of a scheme: causality on every path, claimed translation invariance,
    behaviour past the training length, paths agreeing, batch independence, determinism,
    save/load, gradients, bfloat16, one compiled graph, FlexAttention's backward as CUDA compiles
    it, cost. Exit 1 on any fail."""
    from posbench.conformance import check as conformance

    load_plugins(plugins)
    findings = conformance(scheme, params(param), skip=names(skip) or ())
    return to_frame([dataclasses.asdict(f) for f in findings], scheme=scheme)


def show(result: pd.DataFrame) -> int:
    findings = result.attrs["rows"]
    styles = {"pass": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}
    for f in findings:
        console.print(f"[{styles[f['status']]}]{f['status']:4}[/] {f['prop']:21} {escape(f['detail'])}",
                      soft_wrap=True)
    failed = [f["prop"] for f in findings if f["status"] == "fail"]
    console.print(f"{result.attrs['scheme']}: {len(findings) - len(failed)} of {len(findings)} properties without "
                  f"a fail" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0
