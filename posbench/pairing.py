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
from dataclasses import dataclass
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
    from posbench.reporting import label

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
        diverged = [name for name, losses in ((a, xs), (b, ys))
                    if not all(math.isfinite(x) for seed in losses.values() for x in seed)]
        out.append({"eval_len": length, "mode": m, "stride": stride, "seeds": len(xs),
                    "windows": min(len(v) for v in xs.values()), "diff": iv.mean, "lo": iv.lo, "hi": iv.hi,
                    "ratio": math.exp(iv.mean), "ratio_lo": math.exp(iv.lo), "ratio_hi": math.exp(iv.hi),
                    "verdict": (f"no verdict: {' and '.join(diverged)} has a non-finite loss here (a failed row)"
                                if diverged else verdict(iv, a, b))})
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


# --- probe accuracy ---------------------------------------------------------------------------

def paired_probes(directory: Path | str, a: str, b: str, probe: str | None = None,
                  lengths: tuple[int, ...] | None = None, task: str | None = None) -> list[dict]:
    """Is A more accurate than B on a probe? One row per probe, length and variant that both were
    scored at (probes.csv): the per-answer accuracy difference A - B, paired seed by seed (the
    same seed number: the same training batches and initial draw, the same scored examples):

    - two or more common seeds: a t-interval over the per-seed differences, which carries the
      training noise (when a model leaves its plateau is chaotic: one seed is one draw);
    - one seed: Newcombe's interval for the difference of two proportions from the Wilson
      intervals of each (evaluation noise only: it holds for these two models, not the schemes).

    Beside the t-interval, two tests over the seeds that assume no normal distribution (a seed
    often keeps a probe or loses it): the exact two-sided sign test (`sign_p`; `for_a`, `for_b`:
    seeds on either side) and, with at most stats.PERMUTATION_MAX seeds, the exact paired
    permutation test (`perm_p`); NaN with one seed. Positive differences favour A."""
    from posbench.probes import PROBES
    from posbench.reporting import label

    if probe is not None and probe not in PROBES:  # a misspelt name: the nearest probe
        raise did_you_mean(probe, [*PROBES, "all"], "probe")
    path = results.table_path(directory, "probes")
    rows = [r for r in results.read_probes(directory)
            if r["status"] == "ok" and r["accuracy"] != "" and (task is None or r["task"] == task)
            and (probe is None or r["probe"] == probe)]
    if not rows:
        raise PosbenchError(f"no scored probe rows in {path}" + (f" for probe {probe!r}" if probe else "")
                            + (" for that task" if task else ""))
    for r in rows:
        r["label"] = label(r)
    labels = {r["label"] for r in rows}
    sa, sb = _probe_cells(rows, a, labels), _probe_cells(rows, b, labels)
    out = []
    for cell in sorted(set(sa) & set(sb), key=lambda c: (c[0], c[1], c[2])):
        name, length, variant = cell
        if lengths and length not in lengths:
            continue
        seeds = sorted(set(sa[cell]) & set(sb[cell]))
        if not seeds:
            continue
        diffs = [sa[cell][s][0] - sb[cell][s][0] for s in seeds]
        if len(seeds) >= 2:
            iv = stats.mean_interval(diffs)
            sign_p, for_a, for_b = stats.sign_test(diffs)
            perm_p = stats.paired_p(diffs)
        else:
            iv = _newcombe(sa[cell][seeds[0]][1:], sb[cell][seeds[0]][1:])
            sign_p, for_a, for_b, perm_p = math.nan, int(diffs[0] > 0), int(diffs[0] < 0), math.nan
        out.append({"probe": name, "eval_len": length, "variant": variant, "seeds": len(seeds),
                    "a": sum(sa[cell][s][0] for s in seeds) / len(seeds),
                    "b": sum(sb[cell][s][0] for s in seeds) / len(seeds),
                    "diff": iv.mean, "lo": iv.lo, "hi": iv.hi, "verdict": verdict(iv, b, a),
                    "for_a": for_a, "for_b": for_b, "sign_p": sign_p, "perm_p": perm_p})
    if not out:
        wanted = f" at {', '.join(map(str, lengths))}" if lengths else ""
        raise PosbenchError(f"{a} and {b} share no scored probe cells with a common seed{wanted} in {path}")
    for r, q in zip(out, stats.benjamini_hochberg([r["perm_p"] for r in out])):
        r["q"] = q
        said = clear_verdict(stats.Interval(r["diff"], r["lo"], r["hi"], r["seeds"], math.nan), r["seeds"], q)
        if said in ("at the edge", "interval only"):  # the interval alone would name a better one
            r["verdict"] = said
    return out


def _probe_cells(rows: list[dict], name: str, labels: set[str]) -> dict:
    """(probe, eval_len, variant) -> seed -> (accuracy, hits, answers) of the rows labelled `name`."""
    if name not in labels:
        raise did_you_mean(name, sorted(labels), "scheme variant in probes.csv")
    out: dict = defaultdict(dict)
    runs: dict = defaultdict(set)
    for r in rows:
        if r["label"] != name:
            continue
        cell, seed = (r["probe"], int(r["eval_len"]), r["variant"]), int(r["seed"])
        runs[(cell, seed)].add(r["run_id"])
        answers = int(r["answers"] or r["trials"])
        hits = int(r["hits"]) if r["hits"] != "" else round(float(r["accuracy"]) * answers)
        out[cell][seed] = (float(r["accuracy"]), hits, answers)
    for (cell, seed), ids in runs.items():
        if len(ids) > 1:
            raise PosbenchError(f"{len(ids)} runs of {name} with seed {seed} on {cell[0]} at length {cell[1]} "
                                f"({', '.join(sorted(ids))}): choose one task with --task")
    return out


def _newcombe(a: tuple[int, int], b: tuple[int, int]) -> stats.Interval:
    """Newcombe's hybrid score interval (Stat. Med. 1998, method 10) for p_a - p_b from (hits, answers)."""
    pa, pb = a[0] / a[1], b[0] / b[1]
    (la, ua), (lb, ub) = stats.wilson(*a), stats.wilson(*b)
    d = pa - pb
    lo = d - math.sqrt((pa - la) ** 2 + (ub - pb) ** 2)
    hi = d + math.sqrt((ua - pa) ** 2 + (pb - lb) ** 2)
    return stats.Interval(d, lo, hi, 1, math.nan)


def paired_probes_table(rows: list[dict], a: str, b: str):
    from rich.table import Table

    table = Table(title=f"{a} vs {b}: per-answer probe accuracy paired over seeds",
                  caption="difference A - B in accuracy points (positive: A better), 95% interval: over seeds "
                          "where 2 or more, else Newcombe's for two proportions (evaluation noise only); "
                          "A > B: seeds favouring A of those that differ; sign p, permutation p: exact "
                          f"two-sided tests over seeds, no normality assumed (permutation: up to "
                          f"{stats.PERMUTATION_MAX} seeds, the t-test's past); q (BH): the permutation p "
                          "adjusted by Benjamini-Hochberg over the rows shown; with two or more seeds a "
                          f"verdict needs q at most {stats.FDR:g} (else at the edge, or interval only where "
                          "too few seeds can reach it)")
    for col in ("probe", "length", "variant", "seeds", "A", "B", "A - B", "95% interval", "verdict", "A > B",
                "sign p", "permutation p", "q (BH)"):
        table.add_column(col, justify="left" if col in ("probe", "variant", "verdict") else "right")
    for r in rows:
        table.add_row(r["probe"], str(r["eval_len"]), r["variant"] or "-", str(r["seeds"]), f"{r['a']:.1%}",
                      f"{r['b']:.1%}", f"{100 * r['diff']:+.1f}", f"[{100 * r['lo']:+.1f}, {100 * r['hi']:+.1f}]",
                      r["verdict"], f"{r['for_a']} of {r['for_a'] + r['for_b']}", _p(r["sign_p"]), _p(r["perm_p"]),
                      _p(r["q"]))
    return table


def _p(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.3g}"


# --- seed-paired probe readings (`posbench table probes --pairs`) ------------------------------

@dataclass
class SeedPair:
    """One row of the seed-paired table: its leading cells (A, B, probe, ratio), each common seed's
    difference A - B in points, and whether that seed's two runs trained on one machine kind."""

    cells: list[str]
    diffs: dict[int, float]
    same_kind: dict[int, bool]


def seed_verdict(diffs: list[float], ci: stats.Interval, q: float) -> str:
    """A seed-paired reading of A - B: holds (reversed) when the 95% interval over seeds lies above
    (below) zero and the comparison survives Benjamini-Hochberg over its family (q at most
    stats.FDR); at the edge when the interval is clear of zero and q is not, interval only when so
    few seeds that no permutation p can reach stats.FDR (its least is 2 / 2^n); else every seed
    (not the interval), one seed, or does not hold."""
    said = clear_verdict(ci, len(diffs), q)
    if said is not None:
        return said
    if diffs and all(d > 0 for d in diffs):
        return "every seed, not the interval" if len(diffs) > 1 else "one seed"
    return "does not hold"


def clear_verdict(ci: stats.Interval, seeds: int, q: float) -> str | None:
    """The reading of an interval over two or more seeds that clears zero (None otherwise): holds
    (reversed) above (below) zero with q at most stats.FDR; else interval only where no permutation
    p of so few seeds reaches stats.FDR (its least is 2 / 2^n), at the edge where one could."""
    if seeds < 2 or not (ci.lo > 0 or ci.hi < 0):
        return None
    if q <= stats.FDR:
        return "holds" if ci.lo > 0 else "reversed"
    return "interval only" if seeds <= stats.PERMUTATION_MAX and 2 / 2 ** seeds > stats.FDR else "at the edge"


def _readings(samples: list[list[float]]) -> list[tuple[stats.Interval, float, float, str]]:
    """Per sample of differences: its interval, p, q over the samples' family and verdict."""
    cis = [stats.mean_interval(d) for d in samples]
    ps = [stats.paired_p(d) for d in samples]
    qs = stats.benjamini_hochberg(ps)
    return [(ci, p, q, seed_verdict(d, ci, q)) for d, ci, p, q in zip(samples, cis, ps, qs)]


def seed_pairs_table(pairs: list[SeedPair]) -> str:
    """The markdown table of seed-paired rows and its key: per row the differences by seed, their
    mean with its 95% t-interval, the paired p, its Benjamini-Hochberg q over the table's family,
    the seeds favouring A, the pairs of one machine kind (and the verdict over those alone where it
    differs) and the verdict."""
    from posbench.reporting import markdown_table

    full = _readings([list(r.diffs.values()) for r in pairs])
    alone = _readings([[d for s, d in r.diffs.items() if r.same_kind[s]] for r in pairs])
    body = []
    for r, (ci, p, q, said), (_, _, _, said_alone) in zip(pairs, full, alone):
        diffs, n = list(r.diffs.values()), len(r.diffs)
        same = sum(r.same_kind.values())
        kinds = f"{same} of {n}" + (f": {said_alone}" if 0 < same < n and said_alone != said else "")
        interval = f"{ci.mean:+.0f} [{ci.lo:+.0f}, {ci.hi:+.0f}]" if n > 1 else f"{ci.mean:+.0f}"
        by_seed = " / ".join(f"{d:+.1f}" if abs(d) < 0.5 else f"{d:+.0f}" for d in diffs)
        body.append([*r.cells, str(n), kinds, by_seed, interval, _p3(p), _p3(q),
                     f"{sum(d > 0 for d in diffs)} of {n}", said])
    head = ["A", "B", "probe", "ratio", "seeds", "same kind", "A - B by seed", "mean [95%]", "permutation p",
            "q (BH)", "seeds for A", "verdict"]
    family = sum(not math.isnan(q) for _, _, q, _ in full)
    past = any(len(r.diffs) > stats.PERMUTATION_MAX for r in pairs)
    few = ("; interval only: the interval clear of zero with too few seeds for any permutation p to reach "
           f"{stats.FDR:g} (its least is 2/2^n: 0.25 with 3 seeds)") if any(v == "interval only" for *_, v in full) else ""
    key = (f"\n\nq (BH): the permutation p{' (past ' + str(stats.PERMUTATION_MAX) + ' seeds the t-test p)' if past else ''}"
           f" adjusted by Benjamini-Hochberg over this table's family of {family} comparisons (its rows of two "
           f"seeds or more); holds (reversed): the 95% interval above (below) zero and q at most "
           f"{stats.FDR:g}; at the edge: the interval clear of zero, q above {stats.FDR:g}{few}. same kind: the seed "
           "pairs whose two runs trained on one machine kind (runs.csv `machine`), and after a colon the "
           "verdict over those pairs alone where it differs (their q over the table's same-kind comparisons).")
    return markdown_table(head, body) + key


def _p3(value: float) -> str:
    return "" if math.isnan(value) else f"{value:.3f}"
