"""Scoring trained runs on synthetic probes (posbench.probes): probes.csv rows.

A run is scored on the probe whose examples it was trained on (its data spec), at every length
(1x, 2x, 4x and 8x its training length unless the task names lengths; the training length always)
and variant (passkey: the key depth). A trial is a prompt of exactly L tokens, answers included,
made by the generator that made the training examples. The model reads it in one forward (teacher
forcing); an answer is right when every one of its tokens is the model's argmax given the tokens
before it, which for a causal model is whether greedy decoding, given the tokens between answers,
spells it. Two verdicts per cell, each with its Wilson interval over its own count:
`accuracy` = right answers / answers (each queried value or output digit its own verdict, as
Zoology's per-query accuracy and RULER's string_match_all), and `exact_match` = prompts with every
answer right / prompts. `chance` is the probe's declared chance level per answer.

A length at which the scheme's code fails (an index past an undeclared table, a plug-in's
exception) gives rows with status `failed` and the error's first line; the other lengths and runs
are scored.

Learned in length, or not: a run (per eval-time variant) whose accuracy at its training length,
pooled over the probe's variants, is below `learned_threshold` did not learn the probe; every row of
it says `not learned` in `status` and keeps its numbers, and no extrapolation reading is drawn from
it (effective length, report).

Prompts come from a generator seeded by the probe, the seed, the length and the variant, so every
scheme answers the same prompts. A randomized run reads every prompt once per position draw
(`posbench.positions.evaluation_positions`, as perplexity does); counts then pool the draws.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from posbench import results, stats
from posbench.config import EvalConfig, ProbesConfig
from posbench.data import probe_corpus
from posbench.errors import PosbenchError
from posbench.readers import TrainedReader, variants_for
from posbench.sweep import sweep
from posbench.probes import PROBES, Probe, parse_probe, probe_name
from posbench.runs import RunSpec

RATIOS = (1, 2, 4, 8)  # prompt lengths, in training lengths, when the config names none
NOT_LEARNED = "not learned"
GATED = ": no extrapolation reading"  # the end of the reason that gate() gives


def lengths_for(cfg: ProbesConfig, train_len: int) -> tuple[int, ...]:
    """The prompt lengths of a run: the configured ones (or 1x..8x), and the training length."""
    return tuple(sorted({train_len, *(cfg.lengths or (r * train_len for r in RATIOS))}))


def check_lengths(probe: Probe, lengths: tuple[int, ...] | None) -> None:
    """One line naming the shortest prompt of `probe` when a length asked for is shorter."""
    shortest = probe.min_length()
    short = [n for n in lengths or () if n < shortest]
    if short:
        raise PosbenchError(f"--lengths {','.join(map(str, short))} is too short for {probe.name}, whose shortest "
                            f"prompt takes {shortest} tokens: give lengths of at least {shortest}")


def probe_of(spec: RunSpec) -> Probe | None:
    """The probe whose examples the run was trained on, or None (a text corpus)."""
    return parse_probe(spec.data.spec) if probe_name(spec.data.spec) in PROBES else None


def counts(per_prompt: list[list[bool]]) -> dict[str, int]:
    """The answers, right answers, prompts and wholly right prompts of a cell's verdicts."""
    return {"answers": sum(len(v) for v in per_prompt), "hits": sum(sum(v) for v in per_prompt),
            "trials": len(per_prompt), "exact": sum(all(v) for v in per_prompt)}


def verdict_columns(c: dict[str, int]) -> dict[str, float]:
    """accuracy and exact_match of a cell's counts, each with its Wilson 95% interval."""
    acc = stats.accuracy_columns(c["hits"], c["answers"])
    em_lo, em_hi = stats.wilson(c["exact"], c["trials"])
    return {"accuracy": c["hits"] / c["answers"], **acc,
            "exact_match": c["exact"] / c["trials"], "em_lo": em_lo, "em_hi": em_hi}


def gate(rows: list[dict], threshold: float) -> list[dict]:
    """`not learned` on every row of an eval-time variant whose pooled in-length accuracy (at
    train_len) is below `threshold` (its in-length rows may say so already: gating twice, or rows
    kept from an earlier call beside new ones, gives the same verdict)."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["scaling"], r["extension"]), []).append(r)
    for group in groups.values():
        home = [r for r in group if r["eval_len"] == r["train_len"] and r["status"] in ("ok", NOT_LEARNED)]
        answers = sum(r["answers"] for r in home)
        if home and sum(r["hits"] for r in home) / answers < threshold:
            for r in group:
                if r["status"] == "ok":  # a reason the row had already (DPE's scales, a shared forward) stays first
                    said = f"accuracy at the training length below {threshold:g}{GATED}"
                    r["status"], r["reason"] = NOT_LEARNED, "; ".join(filter(None, (r.get("reason", ""), said)))
    return rows


def same_prompts(row: dict, base_row: dict) -> bool:
    """Whether a kept row is of this model, probe, prompt spec and seed (so of the same prompts)."""
    return all(row[k] == str(base_row[k]) for k in ("run_id", "probe", "spec", "seed"))


def kept_rows(out: Path, base_row: dict) -> dict[tuple, dict]:
    """out/probes.csv's rows of this model, probe, prompt spec and seed, by (policy, extension,
    length, variant, prompts): the cells `--resume` does not read again. Counts come back as
    numbers; a row gated `not learned` comes back `ok`, its gate's reason dropped (the gate is
    drawn again over the kept and the new rows); a failed or unsupported cell is not kept."""
    kept = {}
    for r in results.read_rows(results.table_path(out, "probes")):
        if same_prompts(r, base_row) and r["status"] in ("ok", NOT_LEARNED):
            row = {**r, **{k: int(r[k]) for k in ("eval_len", "train_len", "answers", "hits", "trials", "exact")}}
            if r["status"] == NOT_LEARNED:
                reasons = [x for x in r["reason"].split("; ") if not x.endswith(GATED)]
                row.update(status="ok", reason="; ".join(reasons))
            kept[(r["scaling"], r["extension"], row["eval_len"], r["variant"], row["trials"])] = row
    return kept


def same_reading(kept: dict, row: dict) -> bool:
    """Whether a kept row was read as `row` would be: the same policy file and position draws."""
    return all(str(kept[k]) == str(row[k]) for k in (results.POLICY_SHA, "position_draws"))


def row_keys(spec: RunSpec, cfg: ProbesConfig, eval_cfg: EvalConfig, layout) -> set[tuple[str, ...]]:
    """The probes.csv keys that scoring this run writes."""
    probe = probe_of(spec)
    return {
        (spec.run_id, probe.name, str(n), probe.variant_label(v), s.scaling_label, s.extension)
        for s in variants_for(spec, eval_cfg, layout)
        for n in lengths_for(cfg, spec.original_len) for v in probe.variants()
    }


def prompt_sha(prompt) -> str:
    """A fingerprint of one prompt as judged (its tokens and answers; a text prompt's text and references)."""
    return hashlib.sha256(repr(getattr(prompt, "identity", prompt)).encode()).hexdigest()[:16]


def kept_prompts(out: Path, base_row: dict) -> dict[tuple, dict]:
    """out/prompts.csv's rows of this model, probe, prompt spec and seed, by (policy, extension,
    length, variant, prompt index): the prompts `--resume` does not judge again (if the prompt is
    the same)."""
    return {(r["scaling"], r.get("extension") or "none", int(r["eval_len"]), r["variant"], int(r["prompt"])): r
            for r in results.read_rows(results.table_path(out, "prompts")) if same_prompts(r, base_row)}


@dataclass
class Verdicts:
    """Prompt verdicts, a measure of posbench.sweep: for each cell, the prompts of every variant of
    the probe at that length (`prompts`: (length, variant) -> prompts, the same for every policy)
    answered by the model, teacher-forced for a trained run and greedily for a pretrained model
    (the reader's `answers`), once per position draw. The cell's counts go to probes.csv, and with
    `prompt_rows` each prompt's verdicts to prompts.csv (a randomized run's: each draw's in turn;
    off for a trained run unless [probes] prompts: a grid of sixteen seeds reads some 700,000
    prompts). `columns`: what the
    rows say beyond the model (task, probe, spec, chance, corpus); `cell_columns(cell)` a cell's
    own (a RULER task's chance); `threshold`: a trained run's gate (None: no gate). `out` with
    `resume`: a cell, and within a cell a prompt, that out holds already for this model, probe,
    prompts and policy is kept, not read again."""

    prompts: dict[tuple, list]
    label: Callable[[object], str]
    columns: dict
    out: Path | None = None
    resume: bool = False
    threshold: float | None = None
    prompt_rows: bool = True  # each prompt's verdicts to prompts.csv (and kept from it by --resume)
    cell_columns: Callable[[tuple], dict] = lambda cell: {}  # noqa: E731
    on_length: Callable[[str, int], None] | None = None
    on_prompt: Callable[[str], None] | None = None
    tables = ("prompts", "probes")

    def __post_init__(self):
        self.gates = self.threshold is not None
        self.cells = list(dict.fromkeys(self.prompts))
        self.kept_cells: dict | None = None
        self.done: dict = {}

    def at(self, length: int) -> list[tuple]:
        return [cell for cell in self.cells if cell[0] == length]

    def kept(self, common: dict):
        if not (self.resume and self.out is not None):
            return None
        if self.kept_cells is None:  # what out holds of this model, probe, prompt spec and seed
            self.kept_cells = kept_rows(self.out, common)
            self.done = kept_prompts(self.out, common) if self.prompt_rows else {}
        cells = self.at(common["eval_len"])
        old = [self.kept_cells.get((common["scaling"], common["extension"], common["eval_len"], self.label(c[1]),
                                    len(self.prompts[c]))) for c in cells]
        if all(old) and all(same_reading(r, common) for r in old):
            return {"probes": old}
        return None

    def detection(self, length: int) -> tuple[torch.Tensor, int, str]:
        tokens = self.prompts[self.at(length)[0]][0].tokens
        return torch.tensor([tokens]), len(tokens) - 1, "the first prompt"

    def kept_prompt(self, common: dict, cell: tuple, index: int, draws: int) -> list[list[bool]] | None:
        """A prompt's verdicts per draw as out/prompts.csv holds them (`--resume`), or None."""
        old = self.done.get((common["scaling"], common["extension"], common["eval_len"], self.label(cell[1]), index))
        if old is None or old["prompt_sha"] != prompt_sha(self.prompts[cell][index]):
            return None
        said, each = [v == "y" for v in old["verdicts"]], len(old["verdicts"]) // draws
        return [said[d * each: (d + 1) * each] for d in range(draws)]

    def read(self, reader, length: int, common: dict) -> dict[tuple, list[list[list[bool]]]]:
        """Per cell of this length, per prompt, its verdicts per draw."""
        cells = self.at(length)
        where = {k: v for k, v in common.items() if k in results.TABLES["prompts"]["columns"]}
        said = {cell: [self.kept_prompt(common, cell, i, reader.draws) for i in range(len(self.prompts[cell]))]
                for cell in cells}
        todo = [(cell, i) for cell in cells for i, old in enumerate(said[cell]) if old is None]
        if self.on_length is not None:
            self.on_length(f"{common.get('probe', '')} {common['scaling']} {length}", sum(map(len, said.values())))
        for cell in cells:
            for old in said[cell]:
                if old is not None:
                    self.said(cell, [v for d in old for v in d], ", kept")
        for cell, i in todo:
            said[cell][i] = []
        written, last = [], time.perf_counter()
        try:
            for draw in range(reader.draws):
                began = time.perf_counter()
                answered = reader.answers([self.prompts[c][i] for c, i in todo], length, draw)
                for (cell, i), verdicts in zip(todo, answered):
                    said[cell][i].append(list(verdicts))
                    if draw < reader.draws - 1:
                        continue
                    flat = [v for d in said[cell][i] for v in d]
                    if self.prompt_rows and self.out is not None:
                        written.append({**where, "variant": self.label(cell[1]), "prompt": i,
                                        "prompt_sha": prompt_sha(self.prompts[cell][i]), "answers": len(flat),
                                        "hits": sum(flat), "verdicts": "".join("y" if v else "n" for v in flat),
                                        "seconds": round(time.perf_counter() - began, 1), "created": results.stamp()})
                    began = time.perf_counter()
                    self.said(cell, flat)
                    if written and time.perf_counter() - last > 2:  # a long cell keeps what it judged
                        results.merge_rows(self.out, "prompts", written)
                        written, last = [], time.perf_counter()
        finally:  # what was judged is kept, even when the cell fails or is interrupted
            if written:
                results.merge_rows(self.out, "prompts", written)
        return said

    def said(self, cell: tuple, verdicts: list[bool], how: str = "") -> None:
        if self.on_prompt is not None:
            self.on_prompt(f"{self.label(cell[1])} {sum(verdicts)}/{len(verdicts)} right{how}".strip())

    def rows(self, common: dict, result: dict[tuple, list[list[list[bool]]]], reason: str) -> dict[str, list[dict]]:
        rows = []
        for cell in self.at(common["eval_len"]):
            c = counts([d for prompt in result[cell] for d in prompt])  # each prompt's draws, each its own trial
            rows.append({**common, "variant": self.label(cell[1]), **c, **verdict_columns(c),
                         "trials": len(self.prompts[cell]), "status": "ok", "reason": reason, **self.cell_columns(cell)})
        return {"probes": rows}

    def unread(self, common: dict, status: str, reason: str) -> dict[str, list[dict]]:
        return {"probes": [{**common, "variant": self.label(cell[1]), "trials": len(self.prompts[cell]),
                            "status": status, "reason": reason, **self.cell_columns(cell)}
                           for cell in self.at(common["eval_len"])]}

    def finish(self, rows: list[dict]) -> list[dict]:
        return gate(rows, self.threshold) if self.gates else rows


def evaluate_run(run_dir: Path, cfg: ProbesConfig, eval_cfg: EvalConfig, device: str = "auto",
                 task: str | None = None, resume: Path | None = None, out: Path | None = None) -> list[dict]:
    """probes.csv rows of one finished run: every eval-time variant x length x probe variant
    (merged into out/probes.csv and its prompts' verdicts into out/prompts.csv cell by cell, given
    `out`). `resume` (a folder): a length whose rows its probes.csv holds already for this run,
    probe, prompts and policy (the same plug-in file, position draws and trials) is kept, not read again."""
    reader = TrainedReader(run_dir, eval_cfg, device, task)
    spec = reader.spec
    probe = probe_of(spec)
    if probe is None:
        raise PosbenchError(f"run {spec.run_id} was trained on {spec.data.spec!r}, not on a probe's examples")
    lengths = lengths_for(cfg, spec.original_len)
    # Every prompt first: a length too short for the prompt fails before any model runs.
    prompts = {(n, v): probe.prompts(n, v, cfg.trials, cfg.seed) for n in lengths for v in probe.variants()}
    columns = {"probe": probe.name, "spec": spec.data.spec, "chance": probe.chance,
               "corpus": probe_corpus(spec.data)[1]}
    measure = Verdicts(prompts, probe.variant_label, columns, resume or out, resume is not None,
                       eval_cfg.learned_threshold, cfg.prompts)
    return sweep(reader, measure, lengths, out)["probes"]


def scoring_kept(run_dir: Path, scored: int, out: Path) -> str:
    """What a Ctrl-C while scoring the probes of `run_dir` keeps: the rows of the runs before it."""
    return (f"while scoring the probes of {run_dir.name}; {results.table_path(out, 'probes')} keeps the rows "
            f"of the {scored} run(s) scored before it, trained models are kept")
