"""`posbench compare BASELINE CURRENT`: the CI gate. Rows are matched by the extrapolation key;
a row that went missing or stopped being ok is a regression (exit 1), and so is a perplexity
worse than the baseline:

- where the baseline has several seeds of a cell (same task, scheme, parameters, lengths,
  protocol and variant), beyond the baseline's own spread: the current mean over its m seeds is
  worse when it lies above mean + t(0.975, n - 1) * s * sqrt(1/n + 1/m), the 95% bound for the
  difference of two means given the baseline's n seeds with standard deviation s;
- with one seed, beyond the relative tolerance rtol.

Improvements beyond the same bound and a different corpus or task version are warnings."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from rich.table import Table

from posbench import results, stats
from posbench.errors import PosbenchError


@dataclass
class Comparison:
    rows: list[dict] = field(default_factory=list)  # one per baseline row: key, base, cur, verdict
    regressions: int = 0
    warnings: list[str] = field(default_factory=list)


def _table_file(path: Path) -> Path:
    path = Path(path)
    if path.is_dir():
        path = results.table_path(path, "extrapolation")
    if not path.exists():
        raise PosbenchError(f"no extrapolation results at {path}")
    return path


def _provenance(path: Path) -> dict:
    return results.read_provenance(path if path.is_dir() else path.parent)


# Columns compare reads besides the key.
COLUMNS = ("scheme", "seed", "ppl", "status", "corpus")


def _keyed_rows(path: Path) -> dict[tuple[str, ...], dict[str, str]]:
    key = results.TABLES["extrapolation"]["key"]
    rows = results.read_rows(_table_file(path), "extrapolation", required=COLUMNS)
    return {tuple(r[k] for k in key): r for r in rows}


def _ppl(row: dict[str, str], path: Path, finite: bool) -> float:
    """The perplexity of an ok row: a number > 0, finite in a baseline (a current nan or inf is a
    regression, not an error)."""
    try:
        value = float(row["ppl"])
    except ValueError:
        value = None
    if value is None or value <= 0 or (finite and not math.isfinite(value)):
        raise PosbenchError(f"{_table_file(path)}: run {row['run_id']} at length {row['eval_len']} has "
                            f"perplexity {row['ppl']!r}; an ok row needs a {'finite ' if finite else ''}number > 0")
    return value


def compare(baseline: Path | str, current: Path | str, rtol: float = 0.05) -> Comparison:
    if not (math.isfinite(rtol) and rtol >= 0):
        raise PosbenchError(f"rtol must be a finite number >= 0, got {rtol}")
    baseline, current = Path(baseline), Path(current)
    base, cur = _keyed_rows(baseline), _keyed_rows(current)
    if not base:
        raise PosbenchError(f"the baseline {_table_file(baseline)} holds no rows: nothing to guard")
    out = Comparison()
    corpora = ({r["corpus"] for r in base.values()}, {r["corpus"] for r in cur.values()})
    if corpora[0] != corpora[1]:
        out.warnings.append(f"corpus fingerprint differs: baseline {sorted(corpora[0])}, current {sorted(corpora[1])}")
    provenance = (_provenance(baseline), _provenance(current))
    versions = tuple(p.get("task_version") for p in provenance)
    if None not in versions and versions[0] != versions[1]:
        out.warnings.append(f"task version differs: baseline {versions[0]}, current {versions[1]}")
    kinds = tuple(p.get("machine") for p in provenance)
    if None not in kinds and kinds[0] != kinds[1]:
        out.warnings.append(f"machine kind differs: baseline {kinds[0]}, current {kinds[1]}; runs of different "
                            "kinds agree in distribution, not bitwise, so the tolerance is the gate")
    cells = defaultdict(list)  # seed-free cell -> (entry, baseline row, current row), both ok
    seeds = defaultdict(list)  # seed-free cell -> every ok baseline perplexity
    for b in base.values():
        if b["status"] == "ok":
            seeds[_cell(b)].append(_ppl(b, baseline, finite=True))
    for k, b in sorted(base.items()):
        c = cur.get(k)
        entry = {"scheme": b["scheme"], "eval_len": b["eval_len"], "mode": b["mode"],
                 "variant": "+".join(v for v in (b["scaling"], b["extension"]) if v != "none") or "-",
                 "seed": b["seed"], "baseline": b.get("ppl", ""), "current": c.get("ppl", "") if c else ""}
        if c is None:
            entry["verdict"] = "missing"
        elif b["status"] != c["status"]:
            entry["verdict"] = f"status {b['status']} -> {c['status']}"
        elif b["status"] != "ok":
            entry["verdict"] = "same"
        else:
            _ppl(c, current, finite=False)
            cells[_cell(b)].append((entry, b, c))
            continue
        if entry["verdict"] != "same" and not (entry["verdict"].startswith("status") and c and c["status"] == "ok"):
            out.regressions += 1
        out.rows.append(entry)
    for cell, members in cells.items():
        for entry in _over_seeds(members, seeds[cell]) or [_by_rtol(e, b, c, rtol) for e, b, c in members]:
            out.regressions += entry["verdict"] == "worse"
            out.rows.append(entry)
    out.rows.sort(key=lambda e: (e["scheme"], e["variant"], _numeric_order(e["eval_len"]), e["mode"], e["seed"]))
    better = sum(e["verdict"] == "better" for e in out.rows)
    if better:
        out.warnings.append(f"{better} rows improved beyond the tolerance: baseline stale? refresh it")
    extra = len(set(cur) - set(base))
    if extra:
        out.warnings.append(f"{extra} current rows have no baseline row")
    return out


def _numeric_order(text: str) -> tuple:
    """Sort key: integers by value, before any other text (a damaged table must not crash sorting)."""
    return (0, int(text), "") if text.isdigit() else (1, 0, text)


CELL = ("task", "scheme", "params", "train_len", "eval_len", "mode", "stride", "scaling", "extension")


def _cell(row: dict) -> tuple[str, ...]:
    """What a row measures, up to its seed: rows of one cell differ only in seed and run_id."""
    return tuple(row.get(col, "") for col in CELL)


def _by_rtol(entry: dict, b: dict, c: dict, rtol: float) -> dict:
    bp, cp = float(b["ppl"]), float(c["ppl"])
    change = (cp - bp) / bp
    verdict = "worse" if not math.isfinite(cp) or change > rtol else "better" if change < -rtol else "same"
    return {**entry, "change": change, "verdict": verdict}


def _over_seeds(members: list, baseline: list[float]) -> list[dict]:
    """One entry for a cell whose baseline has several seeds: the current mean against the
    baseline mean's interval, widened for the current number of seeds (empty with one seed)."""
    if len(baseline) < 2:
        return []
    current = [float(c["ppl"]) for _, _, c in members]
    mean, sd = sum(baseline) / len(baseline), stats.std(baseline)
    half = stats.t_quantile(stats.LEVEL, len(baseline) - 1) * sd * math.sqrt(1 / len(baseline) + 1 / len(current))
    now = sum(current) / len(current)
    verdict = "worse" if not math.isfinite(now) or now > mean + half else "better" if now < mean - half else "same"
    entry = members[0][0]
    return [{**entry, "seed": ",".join(sorted((b["seed"] for _, b, _ in members), key=_numeric_order)),
             "baseline": f"{mean:.3f} ± {half:.3f}", "current": f"{now:.3f}", "change": (now - mean) / mean,
             "verdict": verdict}]


def diff_table(cmp: Comparison, only_changes: bool = False) -> Table:
    table = Table(title="baseline vs current perplexity (lower is better)",
                  caption="several baseline seeds: mean ± the 95% bound of the change of the mean; one seed: rtol")
    for col in ("scheme", "variant", "seed", "eval_len", "mode", "baseline", "current", "change", "verdict"):
        table.add_column(col, justify="right" if col in ("baseline", "current", "change", "eval_len") else "left")
    style = {"worse": "bold red", "missing": "bold red", "better": "yellow"}
    for e in cmp.rows:
        if only_changes and e["verdict"] == "same":
            continue
        change = f"{e['change']:+.2%}" if "change" in e else ""
        verdict = e["verdict"]
        s = style.get(verdict, "bold red" if verdict.startswith("status") else "")
        table.add_row(e["scheme"], e["variant"], e["seed"], e["eval_len"], e["mode"],
                      _short(e["baseline"]), _short(e["current"]), change,
                      f"[{s}]{verdict}[/]" if s else verdict)
    return table


def _short(value: str) -> str:
    try:
        return f"{float(value):.3f}"
    except ValueError:
        return value
