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

from pathlib import Path

import torch

from posbench import results, stats
from posbench.batches import answer_verdicts
from posbench.config import EvalConfig, ProbesConfig
from posbench.data import probe_corpus
from posbench.errors import PosbenchError, on_interrupt
from posbench.extension import columns as extension_columns
from posbench.evaluate import ATTN_BYTES, failure, find_runs, trained_dpe, variants_for
from posbench.policies import from_eval, refuse_stale, specs
from posbench.positions import evaluation_columns, evaluation_positions
from posbench.probes import PROBES, Example, Probe, parse_probe, probe_name
from posbench.schemes import PositionLimitError
from posbench.device import autocast, resolve_device
from posbench.runs import RunSpec, load_spec, load_trained

RATIOS = (1, 2, 4, 8)  # prompt lengths, in training lengths, when the config names none
MAX_BATCH = 64
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


@torch.inference_mode()
def verdicts(model, prompts: list[Example], device, dtype: str = "float32",
             positions: torch.Tensor | None = None) -> list[list[bool]]:
    """Per prompt (all of one length), whether each of its answers is the model's greedy answer;
    `positions` (L,) the prompts' positions (None: 0..L-1)."""
    length = len(prompts[0].tokens)
    per = max(1, min(MAX_BATCH, ATTN_BYTES // (4 * model.cfg.n_heads * length * length)))
    positions = positions.to(device) if positions is not None else None
    out = []
    for i in range(0, len(prompts), per):
        chunk = prompts[i: i + per]
        tokens = torch.tensor([p.tokens for p in chunk], device=device)  # (B, L)
        with autocast(device, dtype):
            guess = model(tokens, positions).argmax(-1)  # (B, L): guess[:, p] predicts tokens[:, p + 1]
        hit = (guess[:, :-1] == tokens[:, 1:]).cpu()  # (B, L - 1): hit[:, p - 1] judges token p
        out += answer_verdicts(hit, chunk)
    return out


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


def evaluate_run(run_dir: Path, cfg: ProbesConfig, eval_cfg: EvalConfig, device: str = "auto",
                 task: str | None = None, resume: Path | None = None) -> list[dict]:
    """probes.csv rows of one finished run: every eval-time variant x length x probe variant.
    `resume` (a folder): a length whose rows its probes.csv holds already for this run, probe,
    prompts and policy (the same plug-in file, position draws and trials) is kept, not read again."""
    dev = resolve_device(device)
    spec, model, _ = load_trained(run_dir, dev)
    probe = probe_of(spec)
    if probe is None:
        raise PosbenchError(f"run {spec.run_id} was trained on {spec.data.spec!r}, not on a probe's examples")
    lengths = lengths_for(cfg, spec.original_len)
    variants = probe.variants()
    # Every prompt first: a length too short for the prompt fails before any model runs.
    cells = {(n, v): probe.prompts(n, v, cfg.trials, cfg.seed) for n in lengths for v in variants}
    base = {
        "run_id": spec.run_id, "task": task or spec.task, "probe": probe.name, "spec": spec.data.spec,
        "scheme": spec.scheme, "params": model.layout.describe(), "seed": spec.seed,
        "train_len": spec.original_len, "chance": probe.chance, **extension_columns(spec.extension),
        **evaluation_columns(spec.train, eval_cfg.position_draws),
        **results.provenance(dev.type, spec.train.dtype, probe_corpus(spec.data)[1]),
    }
    draws = max(1, base["position_draws"])
    kept = kept_rows(resume, base) if resume is not None else {}
    rows = []
    for variant in variants_for(spec, eval_cfg, model.layout):
        model.layout.set_scaling(variant.scaling)
        model.layout.set_extension(variant.extension)
        group = []
        for length in lengths:
            common = {**base, "eval_len": length, "ratio": length / spec.original_len,
                      "scaling": variant.scaling_label, "extension": variant.extension, **variant.scaling.provenance(),
                      "backend": model.layout.backends(dev, model.backend)}
            labels = [probe.variant_label(v) for v in variants]
            old = [kept.get((variant.scaling_label, variant.extension, length, lab, cfg.trials)) for lab in labels]
            if all(old) and all(same_reading(r, common) for r in old):  # --resume: this length is read already
                group += old
                continue
            prompts = [p for v in variants for p in cells[(length, v)]]
            judged: list[list[bool]] = []
            note = ""
            try:  # every variant of a length in one batch, once per position draw
                if variant.scaling.detects:  # DPE's scales at this length, on the first prompt's tokens
                    note = trained_dpe(model, dev, spec.train.dtype, variant.scaling, length - 1,
                                       torch.tensor([prompts[0].tokens]), "the first prompt")
                for draw in range(draws):
                    pos = evaluation_positions(spec.train, length, draw)
                    judged.append(verdicts(model, prompts, dev, spec.train.dtype, pos))
            except PositionLimitError as e:
                group += [{**common, "variant": lab, "trials": cfg.trials, "status": "unsupported",
                           "reason": str(e)} for lab in labels]
                continue
            except Exception as e:  # the scheme fails at this length: this length's rows say so, the others go on
                reason = failure(e, length)
                if reason is None:
                    raise
                group += [{**common, "variant": lab, "trials": cfg.trials, "status": "failed", "reason": reason}
                          for lab in labels]
                continue
            for k, lab in enumerate(labels):
                cell = counts([v for d in judged for v in d[k * cfg.trials: (k + 1) * cfg.trials]])
                group.append({**common, "variant": lab, **cell, "trials": cfg.trials,
                              **verdict_columns(cell), "status": "ok", "reason": note})
        rows += gate(group, eval_cfg.learned_threshold)
    return rows


def scoring_kept(run_dir: Path, scored: int, out: Path) -> str:
    """What a Ctrl-C while scoring the probes of `run_dir` keeps: the rows of the runs before it."""
    return (f"while scoring the probes of {run_dir.name}; {results.table_path(out, 'probes')} keeps the rows "
            f"of the {scored} run(s) scored before it, trained models are kept")


def evaluate(runs_dir: Path | str, cfg: ProbesConfig, eval_cfg: EvalConfig, probes: tuple[str, ...],
             schemes: tuple[str, ...] | None = None, out: Path | str | None = None, device: str = "auto",
             progress: bool = False, resume: bool = False) -> list[dict]:
    """Scores of every finished run trained on one of `probes` (names), merged into out/probes.csv
    (`resume`: the cells out/probes.csv holds already are kept, evaluate_run)."""
    runs = []
    for run_dir in find_runs(runs_dir, schemes):
        spec, _ = load_spec(run_dir)
        probe = probe_of(spec)
        if probe is not None and probe.name in probes:
            runs.append(run_dir)
    if not runs:
        raise PosbenchError(f"no trained runs of probes {', '.join(probes)} in {runs_dir}; train on the "
                            f"probe's data first (`posbench train --data {probes[0]}` or a task's [probes])")
    for run_dir in runs:  # before any run is scored, so that nothing is written
        check_lengths(probe_of(load_spec(run_dir)[0]), cfg.lengths)
    out = Path(out or runs_dir)
    refuse_stale(results.read_probes(out), [from_eval(k, eval_cfg) for k in specs(eval_cfg)],
                 str(results.table_path(out, "probes")))
    all_rows = []
    from rich.progress import Progress

    with Progress(disable=not progress, transient=True) as bar:
        job = bar.add_task("probes", total=len(runs))
        for k, run_dir in enumerate(runs):
            bar.update(job, description=f"probe {run_dir.name}")
            with on_interrupt(scoring_kept(run_dir, k, out)):
                rows = evaluate_run(run_dir, cfg, eval_cfg, device, resume=out if resume else None)
            results.merge_rows(out, "probes", rows)
            all_rows += rows
            bar.advance(job)
    return all_rows
