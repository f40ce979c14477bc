"""`posbench paired A B`: is scheme variant A better than B at length L?

Every scheme scores the same windows of the same test stream (posbench.evaluate.windows depends
only on the stream, the length and the protocol), and windows.csv keeps each window's mean loss.
So the difference is taken window by window (same start offset) within a seed, and seed by seed
(same seed number: the same training batches and initial draw) across seeds, which removes the
large spread of window difficulty that an unpaired comparison carries (stats.paired_difference):

- two or more common seeds: a t-interval over the per-seed mean differences (training noise
  included: the answer holds for retraining);
- one seed: batch means over the window differences (evaluation noise only: the answer holds for
  these two trained models, not for the schemes in general).

The difference is in loss (nats per token, A - B; negative: A is better) and as a perplexity
ratio exp(A - B).
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

from posbench import results, stats
from posbench.errors import PosbenchError, did_you_mean


def _windows(rows: list[dict], name: str, labels: set[str]) -> dict:
    """(eval_len, mode, stride) -> seed -> {start: loss} of the rows labelled `name`."""
    if name not in labels:
        raise did_you_mean(name, sorted(labels), "scheme variant in windows.csv")
    out: dict = defaultdict(lambda: defaultdict(dict))
    runs: dict = defaultdict(set)
    for r in rows:
        protocol = (int(r["eval_len"]), r["mode"], int(r["stride"]))
        runs[(protocol, r["seed"])].add(r["run_id"])
        out[protocol][int(r["seed"])][int(r["start"])] = (float(r["loss"]), r["corpus"])
    for (protocol, seed), ids in runs.items():
        if len(ids) > 1:
            raise PosbenchError(f"{len(ids)} runs of {name} with seed {seed} at length {protocol[0]} "
                                f"({', '.join(sorted(ids))}): choose one task with --task")
    return out


def paired(directory: Path | str, a: str, b: str, lengths: tuple[int, ...] | None = None,
           mode: str | None = None, task: str | None = None) -> list[dict]:
    """One row per length and protocol that both A and B were evaluated at: the mean loss
    difference A - B with its 95% interval, the perplexity ratio and a verdict."""
    from posbench.evaluate import correlated_windows
    from posbench.report import label

    path = results.table_path(directory, "windows")
    rows = [r for r in results.read_rows(path)
            if (task is None or r["task"] == task) and (mode is None or r["mode"] == mode)]
    if not rows:
        raise PosbenchError(f"no window losses in {path}"
                            + (" for that task or mode" if path.exists() else "; run `posbench extrapolate` first"))
    for r in rows:
        r["label"] = label(r)
    labels = {r["label"] for r in rows}
    wa = _windows([r for r in rows if r["label"] == a], a, labels)
    wb = _windows([r for r in rows if r["label"] == b], b, labels)
    out = []
    for protocol in sorted(set(wa) & set(wb)):
        length, m, stride = protocol
        if lengths and length not in lengths:
            continue
        xs, ys = {}, {}
        for seed in sorted(set(wa[protocol]) & set(wb[protocol])):
            da, db = wa[protocol][seed], wb[protocol][seed]
            if {c for _, c in da.values()} != {c for _, c in db.values()}:
                raise PosbenchError(f"{a} and {b} were evaluated on different corpora (seed {seed}, length {length})")
            common = sorted(set(da) & set(db))
            if common:
                xs[seed], ys[seed] = [da[s][0] for s in common], [db[s][0] for s in common]
        if not xs:
            continue
        iv = stats.paired_difference(xs, ys, correlated_windows(m, length, stride))
        out.append({"eval_len": length, "mode": m, "stride": stride, "seeds": len(xs),
                    "windows": min(len(v) for v in xs.values()), "diff": iv.mean, "lo": iv.lo, "hi": iv.hi,
                    "ratio": math.exp(iv.mean), "ratio_lo": math.exp(iv.lo), "ratio_hi": math.exp(iv.hi),
                    "verdict": verdict(iv, a, b)})
    if not out:
        wanted = f" at {', '.join(map(str, lengths))}" if lengths else ""
        raise PosbenchError(f"{a} and {b} share no evaluated windows{wanted} in {path}")
    return out


def verdict(iv: stats.Interval, a: str, b: str) -> str:
    if not iv.has_interval:
        return "no interval (too few windows)"
    if iv.hi < 0:
        return f"{a} better"
    if iv.lo > 0:
        return f"{b} better"
    return "no clear difference"


def paired_table(rows: list[dict], a: str, b: str):
    from rich.table import Table

    table = Table(title=f"{a} vs {b}: paired over the same windows and seeds",
                  caption="loss difference A - B in nats/token (negative: A better), 95% interval; "
                          "ppl ratio = exp(difference); one seed: evaluation noise only")
    for col in ("length", "mode", "seeds", "windows", "A - B", "95% interval", "ppl ratio A/B", "verdict"):
        table.add_column(col, justify="left" if col in ("mode", "verdict") else "right")
    for r in rows:
        mode = r["mode"] + (f"/{r['stride']}" if r["mode"] == "sliding" else "")
        table.add_row(str(r["eval_len"]), mode, str(r["seeds"]), str(r["windows"]), f"{r['diff']:+.4g}",
                      f"[{r['lo']:+.4g}, {r['hi']:+.4g}]", f"{r['ratio']:.4f} [{r['ratio_lo']:.4f}, {r['ratio_hi']:.4f}]",
                      r["verdict"])
    return table
