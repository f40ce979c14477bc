"""The extension methods' tables (results/extend): perplexity by method and budget, paired ratios,
passkey accuracy."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from posbench import results, stats
from posbench.errors import PosbenchError
from posbench.reporting import label, labels, markdown_table
from posbench.tables.common import int_list, rows_of, word_list

EXTEND_PAIRS = ("yarn:pi,ntk:pi,pose+yarn:plain,pose+yarn:yarn,longrope:yarn,plain:parent,drope:yarn,"
                "drope:pose+yarn,drope:parent")


def _ppl_cell(values) -> str:
    m = stats.mean_interval(values)
    return f"{m.mean:.2f} [{m.lo:.2f}, {m.hi:.2f}]" if m.n > 1 else f"{m.mean:.2f}"


def extend_perplexity(out: Path, lengths: tuple[int, ...]) -> str:
    """Per run (parents, children, eval-time policies): seeds, the tokens and median seconds of
    fine-tuning, perplexity at each length (mean [95% t-interval over seeds])."""
    ext = pd.DataFrame(results.read_rows(results.table_path(out, "extrapolation")))
    ext = ext[ext["status"] == "ok"]
    ext["label"] = labels(ext)
    ext["ppl"] = pd.to_numeric(ext["ppl"])
    runs = pd.DataFrame(rows_of(out, "runs", "`posbench run extend`"))
    children = runs[runs["parent_run"] != ""]
    cost = {}
    for _, r in children.iterrows():
        cost.setdefault(label({**r, "scaling": "none"}), []).append((int(r["tokens"]), float(r["train_seconds"])))
    body = []
    for name, group in sorted(ext.groupby("label"), key=lambda g: (g[0].split(">")[0], g[0])):
        spent = cost.get(name, [])
        tokens = f"{spent[0][0]:,}" if spent else ""
        seconds = f"{sorted(s for _, s in spent)[len(spent) // 2]:.0f}" if spent else ""
        ppl = [_ppl_cell(group[group["eval_len"].astype(int) == n]["ppl"]) for n in lengths]
        body.append([name, str(group["seed"].nunique()), tokens, seconds, *ppl])
    return markdown_table(["run", "seeds", "tokens", "fine-tuning s", *(str(n) for n in lengths)], body)


def extend_paired(out: Path, lengths: tuple[int, ...], pairs: list[tuple[str, str]]) -> str:
    """Per pair of methods A:B and each child of method A: the perplexity ratio A/B over the same
    windows and seeds (windows.csv), B the child of the same parent and budget by method B, or the
    parent itself (B `parent`)."""
    from posbench.pairing import paired

    ext = results.read_rows(results.table_path(out, "extrapolation"))
    children = {label({**r, "scaling": "none"}) for r in ext if r["extend_method"]}
    # a child's counterparts are named by its parent's scheme (a drope child of rope is `none>drope`)
    runs = {r["run_id"]: r for r in results.read_rows(results.table_path(out, "runs"))}
    parent_scheme = {label({**r, "scaling": "none"}): runs[runs[r["run_id"]]["parent_run"]]["scheme"]
                     for r in ext if r["extend_method"] and runs.get(runs.get(r["run_id"], {}).get("parent_run"))}
    body = []
    for a_method, b_method in pairs:
        for child in sorted(children):
            scheme, rest = child.split(">")
            method, budget = rest.split("@")
            if method != a_method:
                continue
            parent = parent_scheme.get(child, scheme)
            b = parent if b_method == "parent" else f"{parent}>{b_method}@{budget}"
            try:
                rows = {r["eval_len"]: r for r in paired(out, child, b, lengths)}
            except PosbenchError:
                continue
            ratios = [f"{r['ratio']:.3f} [{r['ratio_lo']:.3f}, {r['ratio_hi']:.3f}]" if (r := rows.get(n)) else ""
                      for n in lengths]
            seeds = max((r["seeds"] for r in rows.values()), default=0)
            body.append([f"{child} vs {b}", str(seeds), *ratios])
    return markdown_table(["A vs B", "seeds", *(f"A/B at {n}" for n in lengths)], body)


def extend_passkey(out: Path) -> str | None:
    """Per run, passkey accuracy at each length, depths pooled (Wilson interval); None without probes.csv."""
    path = results.table_path(out, "probes")
    if not path.exists():
        return None
    df = pd.DataFrame(results.read_rows(path))
    df = df[df["status"].isin(["ok", "not learned"])]
    df["label"] = labels(df)
    lengths = sorted(df["eval_len"].astype(int).unique())
    body = []
    for name, group in sorted(df.groupby("label")):
        cells = []
        for n in lengths:
            at = group[group["eval_len"].astype(int) == n]
            hits, answers = int(at["hits"].astype(int).sum()), int(at["answers"].astype(int).sum())
            lo, hi = stats.wilson(hits, answers)
            cells.append(f"{hits / answers:.0%} ({lo:.0%}-{hi:.0%})" if answers else "")
        status = " (not learned)" if (group["status"] == "not learned").any() else ""
        body.append([f"{name}{status}", *cells])
    return markdown_table(["run", *(str(n) for n in lengths)], body)


def extend(directory: Path, *, lengths="64,256,1024", pairs=EXTEND_PAIRS) -> str:
    """Perplexity by method and budget and the paired ratios (where extrapolation.csv is), then
    passkey accuracy by length (where probes.csv is). pairs: A:B methods compared at each budget."""
    lengths = int_list(lengths, "lengths")
    pairs = [tuple(p.split(":", 1)) for p in word_list(pairs, "pairs")]
    bad = [":".join(p) for p in pairs if len(p) != 2 or not all(p)]
    if bad:
        raise PosbenchError(f"bad pairs {', '.join(bad)}: expected A:B, e.g. yarn:pi (B `parent`: the parent)")
    parts = []
    if results.table_path(directory, "extrapolation").exists():
        parts += [extend_perplexity(directory, lengths), extend_paired(directory, lengths, pairs)]
    passkey_part = extend_passkey(directory)
    if passkey_part is not None:
        parts.append(passkey_part)
    if not parts:
        raise PosbenchError(f"no extrapolation.csv or probes.csv in {directory}: "
                            "`posbench run extend` or `posbench run extend-passkey` writes them")
    return "\n\n".join(parts)
