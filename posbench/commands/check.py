"""posbench check: the conformance report of a scheme, a plug-in's included."""

import dataclasses
from typing import Annotated, Optional, Sequence

import pandas as pd
import typer
from rich.markup import escape

from posbench.commands import console
from posbench.commands import frame as to_frame
from posbench.commands.options import Param, load_plugins, names, params
from posbench.errors import PosbenchError

# its line in posbench/docs/commands.md, and the pages that explain it
SUMMARY = "the conformance report of a scheme or an eval-time policy (yours included)"
PAGES = ('plugins.md',)


def check(
    scheme: Annotated[Optional[str], typer.Argument(help="a scheme, preset or layout spec (a plug-in's with "
                                                         "--plugin); none with --policy")] = None,
    *,
    policy: Annotated[Optional[str], typer.Option(
        help="an eval-time RoPE policy instead (a plug-in's with --plugin), its settings as --param KEY=VALUE: "
             "finite outputs, the model inside its training length, no jump between lengths, settings' ranges, "
             "the trained-run and pretrained adapters agreeing")] = None,
    param: Param = None,
    skip: Annotated[Optional[str], typer.Option(help="properties to leave out, comma-separated (e.g. cost)")] = None,
    plugins: Sequence[str] = (),
) -> pd.DataFrame:
    """Conformance report of a scheme: causality on every path, claimed translation invariance,
    behaviour past the training length, paths agreeing, batch independence, determinism,
    save/load, gradients, bfloat16, one compiled graph, FlexAttention's backward as CUDA compiles
    it, cost; or, with --policy, of an eval-time RoPE policy. Exit 1 on any fail."""
    load_plugins(plugins)
    if policy is not None:
        from posbench.policies.check import check_policy

        if scheme is not None:
            raise PosbenchError(f"check takes a scheme or --policy, not both (got {scheme!r} and --policy {policy})")
        findings = check_policy(policy, params(param))
        return to_frame([dataclasses.asdict(f) for f in findings], scheme=f"policy {policy}")
    if scheme is None:
        raise PosbenchError("check needs a scheme (e.g. rope) or --policy NAME")
    from posbench.conformance import check as conformance

    findings = conformance(scheme, params(param), skip=names(skip) or ())
    return to_frame([dataclasses.asdict(f) for f in findings], scheme=scheme)


def show(result: pd.DataFrame) -> int:
    findings = result.attrs["rows"]
    styles = {"pass": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}
    for f in findings:
        console.print(f"[{styles[f['status']]}]{f['status']:4}[/] {f['prop']:23} {escape(f['detail'])}",
                      soft_wrap=True)
    failed = [f["prop"] for f in findings if f["status"] == "fail"]
    console.print(f"{result.attrs['scheme']}: {len(findings) - len(failed)} of {len(findings)} properties without "
                  f"a fail" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0
