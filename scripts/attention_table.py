#!/usr/bin/env python
"""The tables of results/attention/README.md, from a results directory with attention.csv and
extrapolation.csv (`posbench extrapolate --attention`): per scheme variant and evaluation length,
perplexity beside each attention measure, the mean over layers and heads (or, with --by-layer, one
measure per layer); several seeds: the mean over seeds. Rows `uniform` give the reference of
causal attention spread evenly over every key, at the same lengths and training length.

    python scripts/attention_table.py DIR [--by-layer entropy_norm]

Prints markdown.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

import torch

from posbench import results
from posbench.attention import Span
from posbench.attention_measures import MEASURES, Recorder
from posbench.errors import PosbenchError
from posbench.reporting import label, markdown_table


def frame(directory: Path) -> pd.DataFrame:
    rows = results.read_rows(results.table_path(directory, "attention"))
    if not rows:
        raise PosbenchError(f"no attention.csv in {directory}: run `posbench extrapolate --attention` first")
    df = pd.DataFrame(rows)
    df["label"] = df.apply(label, axis=1)
    for c in (*MEASURES, "eval_len", "layer"):
        df[c] = pd.to_numeric(df[c], errors="coerce")
    return df


def uniform(length: int, train_len: int) -> dict[str, float]:
    """The measures of causal attention spread evenly over every key (one head, one window)."""
    causal = torch.ones(length, length).tril()
    recorder = Recorder([Span()], train_len)
    recorder(0, (causal / causal.sum(-1, keepdim=True))[None, None])
    return recorder.rows()[0]


def ppl(directory: Path) -> pd.Series:
    df = pd.DataFrame(results.read_rows(results.table_path(directory, "extrapolation")))
    df = df[df["status"] == "ok"]
    df["label"] = df.apply(label, axis=1)
    df["ppl"] = pd.to_numeric(df["ppl"])
    df["eval_len"] = pd.to_numeric(df["eval_len"])
    return df.groupby(["label", "eval_len"])["ppl"].mean()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--by-layer", choices=MEASURES, help="one measure per layer instead")
    args = parser.parse_args(argv)
    try:
        df = frame(args.directory)
        if args.by_layer:
            table = df.groupby(["label", "eval_len", "layer"])[args.by_layer].mean().unstack("layer")
            headers = ["scheme", "length", *(f"layer {int(c)}" for c in table.columns)]
            body = [[name, str(int(n)), *(f"{v:.3f}" for v in values)] for (name, n), values in table.iterrows()]
        else:
            table = df.groupby(["label", "eval_len"])[list(MEASURES)].mean()
            train_len = int(pd.to_numeric(df["train_len"]).iloc[0])
            for n in sorted(df["eval_len"].unique()):
                table.loc[("uniform", n), :] = [uniform(int(n), train_len)[m] for m in MEASURES]
            perplexity = ppl(args.directory)
            headers = ["scheme", "length", "ppl", *MEASURES]
            body = [[name, str(int(n)), f"{perplexity.get((name, n), float('nan')):.1f}".replace("nan", ""),
                     *("" if pd.isna(v) else f"{v:.3f}" for v in values)] for (name, n), values in table.iterrows()]
    except PosbenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(markdown_table(headers, body))
    return 0


if __name__ == "__main__":
    sys.exit(main())
