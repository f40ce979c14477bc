"""posbench/docs/gpu.md's table of attention cost on a GPU, written from results/speed/speed.csv
(the rows `scripts/gpu_session.sh speed` measured), so the page says no more than the CSV holds;
tests/test_speed.py fails when the page and the CSV disagree.

    python -m posbench.gpu_table    # rewrites that part of posbench/docs/gpu.md

Each device, dtype and size gets one table: per scheme its attention path, whether it was compiled,
and per length the median ms with the ratio to `none`, forward and forward+backward; then the
targets below, met or missed at each length. CPU rows are left out: results/speed holds GPU
measurements.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from posbench import results
from posbench.commands.reference import section, splice

BEGIN = "<!-- generated from results/speed/speed.csv by python -m posbench.gpu_table: do not edit by hand -->"
END = "<!-- end of the generated GPU table -->"
PAGE = Path(__file__).resolve().parent / "docs" / "gpu.md"
CSV = Path(__file__).resolve().parent.parent / "results" / "speed" / "speed.csv"
GROUP = ("device_name", "dtype", "batch", "heads", "head_dim")
# (scheme, pass, most a ratio to `none` may be): what a scheme costs when its kernel does the work
TARGETS = [("rope", "fwd", 1.2), ("stickbreaking", "fwd+bwd", 3.0),
           *((name, "fwd+bwd", 2.0) for name in ("alibi", "t5", "kerple", "fire", "fox"))]


def markdown(rows: list[dict[str, Any]] | None = None) -> str:
    """The generated part of the page from `rows` (default: results/speed/speed.csv's)."""
    if rows is None:
        rows = results.read_rows(CSV) if CSV.exists() else []
    rows = [r for r in rows if r.get("device") == "cuda"]
    lines = [BEGIN, ""]
    if not rows:
        lines += ["No GPU measurement is committed yet: results/speed/ holds no speed.csv with CUDA rows.",
                  "`bash scripts/gpu_session.sh speed OUT` measures one on a GPU; once its speed.csv is",
                  "in results/speed/, `python -m posbench.gpu_table` writes its table here."]
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(tuple(str(r[k]) for k in GROUP), []).append(r)
    for key, group in groups.items():
        lines += _group(dict(zip(GROUP, key)), group)
    return "\n".join([*lines, "", END]) + "\n"


def _group(what: dict[str, str], rows: list[dict[str, Any]]) -> list[str]:
    lengths = sorted({int(r["seq_len"]) for r in rows})
    passes = [p for p in ("fwd", "fwd+bwd") if any(r["pass"] == p for r in rows)]
    made = sorted({f"torch {r['torch']}, posbench {r['posbench']} at {r['git_sha']}" for r in rows})
    lines = [f"{what['device_name']}, {what['dtype']}, batch {what['batch']}, {what['heads']} heads of "
             f"{what['head_dim']} ({'; '.join(made)}). Median ms per layer (ratio to `none` in the same run):",
             "", "| scheme | path | compile | " + " | ".join(f"{p} {n}" for n in lengths for p in passes) + " |",
             "|---|---|---|" + "---|" * (len(lengths) * len(passes))]
    cells: dict[tuple, dict[str, Any]] = {}
    order: list[tuple[str, str, str]] = []
    for r in rows:
        scheme = (r["scheme"], r["backend"], r.get("compile", ""))
        if scheme not in order:
            order.append(scheme)
        cells[(*scheme, int(r["seq_len"]), r["pass"])] = r
    for scheme in order:
        lines.append(f"| {scheme[0]} | {scheme[1]} | {scheme[2]} | "
                     + " | ".join(_cell(cells.get((*scheme, n, p))) for n in lengths for p in passes) + " |")
    verdicts = [_verdict(name, pass_, most, lengths, rows) for name, pass_, most in TARGETS]
    verdicts = [v for v in verdicts if v]
    if verdicts:
        lines += ["", "Targets (ratio to `none`):", "", *verdicts]
    return [*lines, ""]


def _cell(row: dict[str, Any] | None) -> str:
    if row is None:
        return ""
    if row["status"] != "ok":
        return str(row["status"])
    ratio = row.get("ratio_vs_none")
    ms = f"{float(row['median_ms']):.3g}"
    return f"{ms} ({float(ratio):.2f}x)" if ratio not in (None, "") else ms


def _verdict(name: str, pass_: str, most: float, lengths: list[int], rows: list[dict[str, Any]]) -> str:
    said = []
    for n in lengths:
        for r in rows:
            if r["scheme"] == name and r["pass"] == pass_ and int(r["seq_len"]) == n:
                ratio = r.get("ratio_vs_none")
                if r["status"] != "ok" or ratio in (None, ""):
                    said.append(f"{n}: {r['status']}")
                else:
                    met = "met" if float(ratio) <= most else "missed"
                    said.append(f"{n}: {float(ratio):.2f}x, {met}")
    if not said:
        return ""
    return f"- {name} {pass_} within {most:g}x: " + "; ".join(said)


def current() -> str:
    """The generated part of the committed page, markers included."""
    return section(PAGE, BEGIN, END)


def write() -> None:
    splice(PAGE, BEGIN, END, markdown())


if __name__ == "__main__":
    write()
