"""Attention measures by length beside perplexity (results/attention), and attention cost per scheme
and length (results/speed)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from posbench import results
from posbench.errors import did_you_mean
from posbench.reporting import labels, markdown_table
from posbench.tables.common import int_list, ranks, rows_of, word_list

def attention_frame(directory: Path) -> pd.DataFrame:
    from posbench.attention_measures import MEASURES

    df = pd.DataFrame(rows_of(directory, "attention", "`posbench extrapolate --attention`"))
    df["label"] = labels(df)
    for c in (*MEASURES, "eval_len", "layer"):
        df[c] = pd.to_numeric(df[c], errors="coerce")
    return df


def uniform_attention(length: int, train_len: int) -> dict[str, float]:
    """The measures of causal attention spread evenly over every key (one head, one window)."""
    import torch

    from posbench.attention import Span
    from posbench.attention_measures import Recorder

    causal = torch.ones(length, length).tril()
    recorder = Recorder([Span()], train_len)
    recorder(0, (causal / causal.sum(-1, keepdim=True))[None, None])
    return recorder.rows()[0]


def mean_ppl(directory: Path) -> pd.Series:
    df = pd.DataFrame(results.read_rows(results.table_path(directory, "extrapolation")))
    if df.empty:
        return pd.Series(dtype=float)
    df = df[df["status"] == "ok"]
    df["label"] = labels(df)
    df["ppl"] = pd.to_numeric(df["ppl"])
    df["eval_len"] = pd.to_numeric(df["eval_len"])
    return df.groupby(["label", "eval_len"])["ppl"].mean()


def _choose(table: pd.DataFrame, schemes: list[str] | None, lengths: tuple[int, ...] | None) -> pd.DataFrame:
    """Rows of (label, eval_len) in `schemes`' order (each label named there, the others left out)
    and at `lengths`; None: every one, as the table has them."""
    if lengths is not None:
        table = table[table.index.get_level_values("eval_len").isin(lengths)]
    if schemes is not None:
        have = set(table.index.get_level_values("label"))
        rank = ranks(schemes, have, lambda missing: did_you_mean(missing[0], have, "scheme in the attention table"))
        keep = [k for k in table.index if k[0] in rank]
        table = table.loc[sorted(keep, key=lambda k: (rank[k[0]], k[1]))]
    return table


def attention(directory: Path, *, by_layer: str | None = None, schemes=None, lengths=None) -> str:
    """Per scheme variant and length, perplexity beside each attention measure (mean over layers,
    heads and seeds) and `uniform` rows, the measures of attention spread evenly; by_layer=MEASURE:
    that measure per layer instead. schemes: the rows' labels in their order (the others left
    out; `uniform` too where not named); lengths: those lengths alone."""
    from posbench.attention_measures import MEASURES

    if by_layer is not None and by_layer not in MEASURES:
        raise did_you_mean(str(by_layer), MEASURES, "attention measure")
    schemes = word_list(schemes, "schemes") if schemes is not None else None
    lengths = int_list(lengths, "lengths") if lengths is not None else None
    df = attention_frame(directory)
    if by_layer:
        table = df.groupby(["label", "eval_len", "layer"])[by_layer].mean().unstack("layer")
        headers = ["scheme", "length", *(f"layer {int(c)}" for c in table.columns)]
        table = _choose(table, schemes, lengths)
        body = [[name, str(int(n)), *(f"{v:.3f}" for v in values)] for (name, n), values in table.iterrows()]
        return markdown_table(headers, body)
    table = df.groupby(["label", "eval_len"])[list(MEASURES)].mean()
    train_len = int(pd.to_numeric(df["train_len"]).iloc[0])
    for n in sorted(df["eval_len"].unique()):
        uniform = uniform_attention(int(n), train_len)
        table.loc[("uniform", n), :] = [uniform[m] for m in MEASURES]
    table = _choose(table, schemes, lengths)
    perplexity = mean_ppl(directory)
    body = [[name, str(int(n)), f"{perplexity.get((name, n), float('nan')):.1f}".replace("nan", ""),
             *("" if pd.isna(v) else f"{v:.3f}" for v in values)] for (name, n), values in table.iterrows()]
    return markdown_table(["scheme", "length", "ppl", *MEASURES], body)


def speed(directory: Path) -> str:
    """speed.csv as report.md shows it: per pass, device, dtype and shape, scheme x length, the
    median time and its ratio to `none`."""
    from posbench import reporting

    rows = rows_of(directory, "speed", "`posbench speed --out DIR`")
    return reporting.speed_markdown(pd.DataFrame(rows))
