"""Effective length (after RULER's, scaled to tiny models): per run and protocol, the longest
evaluated length up to which the model still does what it does in-distribution.

- Perplexity (extrapolation.csv; one protocol per mode and stride, `sliding/half` for the default
  stride of half of each window, per eval-time variant): the
  reference is the perplexity at the training length (or, if that was not evaluated, at the
  longest evaluated length below it). Walking up the evaluated lengths from the reference, a length
  passes when its row is ok and its perplexity is at most (1 + tolerance) x the reference; the
  effective length is the last length before the first one that fails ("stays": contiguous from
  the training length up, so a later recovery does not count).
- Accuracy (probes.csv; one protocol per probe): the same walk from the first evaluated length at
  or above the training length, a length passing when its per-answer accuracy, pooled over the
  probe's variants such as key depths (right answers / answers), is at least the criterion
  chance + threshold x (1 - chance): the threshold is read as the share of the way from the probe's
  chance level to perfect, so a binary answer (parity) does not pass by guessing; RULER's tasks
  (`ruler:TASK`, a pretrained model's) pass at RULER's own threshold, 85.6%. A run that did not
  learn the probe in length (probes.csv status `not learned`) has no effective length: its row
  says `not learned`. A pretrained model is not gated so (it was not trained on the probe): a
  model that already fails at its own context reads `no reference`, as RULER's "below the shortest
  length".

Two bases, named in every row (`basis`) and table: `absolute`, a criterion fixed in advance, as
RULER's effective length (the longest length scoring above 85.6, Llama-2-7B's score at 4k): the
probes' criterion above; and `relative`, a criterion drawn from the run's own score at the
training length, as NoLiMa's (85% of each model's own short-context score), which suits schemes and
models of different strength: perplexity's tolerance above, and for probes a second row per probe,
protocol `PROBE/relative`, a length passing when its accuracy is at least `share` (0.85) x the
run's own accuracy at the training length; no score there (a policy a pretrained model was read
under only past its context), or one no better than the probe's chance, leaves nothing to keep
(`no reference`). Perplexity has no absolute
basis: RULER's threshold is an accuracy, and no perplexity means the same across corpora and
tokenizers.

`status` says how to read a row: `ok`, the walk stopped inside the evaluated range; `censored`,
every length passed, so the effective length is at least the longest evaluated one (written
">=" in tables); `no reference`, nothing at or below the training length (perplexity) or the first
length already fails (accuracy), and the effective length is empty.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

from posbench import results

TOLERANCE = 0.10  # perplexity within 10% of its in-distribution value (the task's default too)
THRESHOLD = 0.5  # accuracy at least half-way from chance to 100%
SHARE = 0.85  # relative basis: accuracy at least 85% of the run's own at the training length (NoLiMa)
RULER_THRESHOLD = 0.856  # RULER's effective-length score: Llama-2-7B's average at 4k
LEARNED = 0.9  # probes: accuracy at the training length below this is `not learned`
RUN_COLUMNS = ("run_id", "task", "scheme", "params", "seed", "train_len", "parent_run", "extend_method",
               "extend_len", "extend_steps")


def _walk(points: list[tuple[int, bool]]) -> tuple[int | None, str]:
    """(effective length, status) over (length, passes) sorted by length, from the first."""
    last = None
    for length, ok in points:
        if not ok:
            return last, "ok" if last is not None else "no reference"
        last = length
    return last, "censored" if last is not None else "no reference"


def _number(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _row(first: dict, metric: str, protocol: str, reference: float, criterion: float,
         lengths: list[int], effective: int | None, status: str, basis: str = "relative") -> dict:
    train_len = int(first["train_len"])
    return {**{k: first.get(k, "") for k in RUN_COLUMNS}, "metric": metric, "protocol": protocol, "basis": basis,
            "scaling": first.get("scaling", "none"), "extension": first.get("extension", "none"),
            "position_draws": first.get("position_draws", ""), "position_sampling": first.get("position_sampling", ""),
            "reference": reference, "criterion": criterion, "max_len": max(lengths),
            "effective_len": effective, "ratio": effective / train_len if effective else None,
            "status": status, **{k: first.get(k, "") for k in results.PROVENANCE}}


def _protocols(rows: list[dict]) -> dict[str, list[dict]]:
    """Rows of one run, mode and variant by protocol: `nonoverlap`, `sliding/S` for a fixed
    stride, `sliding/half` for the default stride of half the window (one stride per length)."""
    mode = rows[0]["mode"]
    if mode != "sliding":
        return {mode: rows}
    strides = {int(r["stride"]) for r in rows}
    if len(strides) > 1 and all(int(r["stride"]) == max(1, int(r["eval_len"]) // 2) for r in rows):
        return {"sliding/half": rows}
    return {f"sliding/{s}": [r for r in rows if int(r["stride"]) == s] for s in sorted(strides)}


def perplexity_rows(rows: list[dict], tolerance: float = TOLERANCE) -> list[dict]:
    """effective_length rows of extrapolation.csv rows, one per run, protocol and variant."""
    groups = defaultdict(list)
    for r in rows:
        groups[(r["run_id"], r["mode"], r["scaling"], r["extension"])].append(r)
    out = []
    for _, run_rows in sorted(groups.items()):
        for protocol, g in _protocols(run_rows).items():
            out.append(_perplexity_row(sorted(g, key=lambda r: int(r["eval_len"])), protocol, tolerance))
    return out


def _perplexity_row(g: list[dict], protocol: str, tolerance: float) -> dict:
    train_len = int(g[0]["train_len"])
    lengths = [int(r["eval_len"]) for r in g]
    below = [r for r in g if int(r["eval_len"]) <= train_len]
    ref = _number(below[-1]["ppl"]) if below and below[-1]["status"] == "ok" else math.nan
    if math.isnan(ref):
        return _row(g[0], "ppl", protocol, math.nan, tolerance, lengths, None, "no reference")
    walk = [(int(r["eval_len"]), r["status"] == "ok" and _number(r["ppl"]) <= (1 + tolerance) * ref)
            for r in g[len(below) - 1:]]
    effective, status = _walk(walk)
    return _row(below[-1], "ppl", protocol, ref, tolerance, lengths, effective, status)


def _accuracy_groups(rows: list[dict]) -> list[tuple[str, dict, list[int], list[tuple[int, float]], bool]]:
    """Per run, probe and eval-time variant (scaling, extension): the probe, its first row, the
    evaluated lengths, the pooled accuracy at each length from the training length up (right
    answers and answers pooled over the probe's variants, e.g. key depths), and whether it was
    learned in length."""
    groups = defaultdict(lambda: defaultdict(list))
    for r in rows:
        key = (r["run_id"], r["probe"], r["scaling"], r["extension"])
        groups[key][int(r["eval_len"])].append(r)
    out = []
    for (_, probe, *_), by_len in sorted(groups.items()):
        first = next(iter(by_len.values()))[0]
        lengths = sorted(by_len)
        accuracy = [(n, _pooled(by_len[n])) for n in lengths if n >= int(first["train_len"])]
        learned = not any(r["status"] == "not learned" for rs in by_len.values() for r in rs)
        out.append((probe, first, lengths, accuracy, learned))
    return out


def accuracy_rows(rows: list[dict], threshold: float = THRESHOLD) -> list[dict]:
    """effective_length rows of probes.csv rows on the absolute basis: one per run, probe and
    eval-time variant, a length passing at `threshold` of the way from chance to 1."""
    out = []
    for probe, first, lengths, accuracy, learned in _accuracy_groups(rows):
        criterion = absolute_criterion(probe, threshold, _number(first.get("chance")))
        out.append(_accuracy_row(probe, first, lengths, accuracy, learned, criterion, "absolute"))
    return out


def relative_rows(rows: list[dict], share: float = SHARE) -> list[dict]:
    """effective_length rows of probes.csv rows on the relative basis (NoLiMa's): protocol
    `PROBE/relative`, a length passing at `share` x the run's own accuracy at the training length."""
    out = []
    for probe, first, lengths, accuracy, learned in _accuracy_groups(rows):
        criterion = share * accuracy[0][1] if accuracy else math.nan
        chance = _number(first.get("chance"))
        at_home = bool(accuracy) and accuracy[0][0] == int(first["train_len"])
        if learned and (not at_home or accuracy[0][1] <= (0.0 if math.isnan(chance) else chance)):
            # no score at the training length, or nothing above guessing there to keep
            reference = accuracy[0][1] if accuracy else math.nan
            out.append(_row(first, "accuracy", f"{probe}/relative", reference, criterion, lengths, None,
                            "no reference", "relative"))
            continue
        out.append(_accuracy_row(f"{probe}/relative", first, lengths, accuracy, learned, criterion, "relative"))
    return out


def _accuracy_row(protocol: str, first: dict, lengths: list[int], accuracy: list[tuple[int, float]],
                  learned: bool, criterion: float, basis: str) -> dict:
    reference = accuracy[0][1] if accuracy else math.nan
    if not learned:
        return _row(first, "accuracy", protocol, reference, criterion, lengths, None, "not learned", basis)
    effective, status = _walk([(n, acc >= criterion) for n, acc in accuracy])
    return _row(first, "accuracy", protocol, reference, criterion, lengths, effective, status, basis)


def absolute_criterion(probe: str, threshold: float, chance: float) -> float:
    """The absolute basis's accuracy for `probe`: RULER's fixed 85.6% for its tasks, else
    `threshold` of the way from chance to 1."""
    return RULER_THRESHOLD if probe.startswith("ruler:") else criterion_for(threshold, chance)


def criterion_for(threshold: float, chance: float) -> float:
    """The accuracy a length must reach: `threshold` of the way from chance to 1 (chance 0 when a
    row declares none)."""
    chance = 0.0 if math.isnan(chance) else chance
    return chance + threshold * (1 - chance)


def _pooled(rows: list[dict]) -> float:
    """Per-answer accuracy of rows pooled (right answers / answers); NaN when a row is unsupported."""
    if any(r["status"] not in ("ok", "not learned") for r in rows):
        return math.nan
    total = sum(_number(r["answers"]) for r in rows)
    return sum(_number(r["hits"]) for r in rows) / total if total else math.nan


def write(directory: Path | str, tolerance: float = TOLERANCE, threshold: float = THRESHOLD,
          share: float = SHARE) -> list[dict]:
    """effective_length.csv from extrapolation.csv and probes.csv in `directory`."""
    rows = perplexity_rows(results.read_rows(results.table_path(directory, "extrapolation")), tolerance)
    probes = results.read_probes(directory)
    rows += accuracy_rows(probes, threshold) + relative_rows(probes, share)
    if rows:
        results.merge_rows(directory, "effective_length", rows)
    return rows
