"""Scoring trained runs on synthetic probes (posbench.probes): probes.csv rows.

A run is scored on the probe whose documents it was trained on (its data spec), at every length
(1x, 2x, 4x and 8x its training length unless the task names lengths) and variant (passkey: the
key depth). A trial is a prompt of exactly L tokens, answer included, built in the run's own
tokenizer. The model reads it in one forward (teacher forcing), and a hit is every answer token
being the model's argmax given the tokens before it: for a causal model that is exactly whether
greedy decoding, which copies the given tokens between answers, spells the whole answer, at one
forward instead of one per answer token. accuracy = hits / trials per (run, length, variant).
Prompts come from a generator seeded by the probe, the seed, the length and the variant, so
every scheme answers the same prompts. A randomized run reads every prompt once per position draw
(`posbench.positions.evaluation_positions`, as perplexity does): hits then count over the
`position_draws` draws and accuracy = hits / (trials x draws).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from posbench import results, stats
from posbench.config import EvalConfig, ProbesConfig
from posbench.data import ByteTokenizer, load_tokenizer, load_tokens
from posbench.errors import PosbenchError, on_interrupt
from posbench.evaluate import ATTN_BYTES, find_runs, variants_for
from posbench.positions import evaluation_draws, evaluation_positions
from posbench.probes import PROBES, Probe, Prompt, PromptMaker, parse_probe, probe_name
from posbench.schemes import PositionLimitError
from posbench.train import RunSpec, autocast, load_trained, resolve_device

RATIOS = (1, 2, 4, 8)  # prompt lengths, in training lengths, when the config names none
MAX_BATCH = 64


def lengths_for(cfg: ProbesConfig, train_len: int) -> tuple[int, ...]:
    return cfg.lengths or tuple(r * train_len for r in RATIOS)


def probe_of(spec: RunSpec) -> Probe | None:
    """The probe whose documents the run was trained on, or None (a text corpus)."""
    return parse_probe(spec.data.spec) if probe_name(spec.data.spec) in PROBES else None


@torch.inference_mode()
def verdicts(model, prompts: list[Prompt], device, dtype: str = "float32",
             positions: torch.Tensor | None = None) -> list[bool]:
    """Whether the model's greedy answer to each prompt (all of one length) is the answer;
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
        for b, p in enumerate(chunk):
            at = torch.tensor(p.answer, device=device)
            out.append(bool((guess[b, at - 1] == tokens[b, at]).all()))
    return out


def run_tokenizer(run_dir: Path, spec: RunSpec):
    """The tokenizer the run was trained with, and its corpus fingerprint."""
    try:
        fingerprint = json.loads((Path(run_dir) / "config.json").read_text()).get("corpus", "")
    except (OSError, ValueError) as e:
        raise PosbenchError(f"unreadable run config in {run_dir}: {e}") from None
    if spec.data.tokenizer == "bytes":
        return ByteTokenizer(), fingerprint
    try:
        return load_tokenizer(spec.data, fingerprint), fingerprint
    except Exception:  # the tokenizer cache is gone (another machine): rebuild it from the corpus
        data = load_tokens(spec.data)
        return load_tokenizer(spec.data, data.fingerprint), data.fingerprint


def row_keys(spec: RunSpec, cfg: ProbesConfig, eval_cfg: EvalConfig, layout) -> set[tuple[str, ...]]:
    """The probes.csv keys that scoring this run writes."""
    probe = probe_of(spec)
    return {
        (spec.run_id, probe.name, str(n), probe.variant_label(v), s.scaling_label, s.extension)
        for s in variants_for(spec, eval_cfg, layout)
        for n in lengths_for(cfg, spec.train.train_len) for v in probe.variants()
    }


def evaluate_run(run_dir: Path, cfg: ProbesConfig, eval_cfg: EvalConfig, device: str = "auto",
                 task: str | None = None) -> list[dict]:
    """probes.csv rows of one finished run: every eval-time variant x length x probe variant."""
    dev = resolve_device(device)
    spec, model, _ = load_trained(run_dir, dev)
    probe = probe_of(spec)
    if probe is None:
        raise PosbenchError(f"run {spec.run_id} was trained on {spec.data.spec!r}, not on a probe's documents")
    tokenizer, fingerprint = run_tokenizer(run_dir, spec)
    maker = PromptMaker(tokenizer)
    lengths = lengths_for(cfg, spec.train.train_len)
    variants = probe.variants()
    # Every prompt first: a length too short for the prompt fails before any model runs.
    cells = {(n, v): probe.prompts(maker, n, v, cfg.trials, cfg.seed) for n in lengths for v in variants}
    base = {
        "run_id": spec.run_id, "task": task or spec.task, "probe": probe.name, "spec": spec.data.spec,
        "scheme": spec.scheme, "params": model.layout.describe(), "seed": spec.seed,
        "train_len": spec.train.train_len, "trials": cfg.trials,
        "position_draws": evaluation_draws(spec.train, eval_cfg.position_draws),
        **results.provenance(dev.type, spec.train.dtype, fingerprint),
    }
    draws = max(1, base["position_draws"])
    rows = []
    for variant in variants_for(spec, eval_cfg, model.layout):
        model.layout.set_scaling(variant.scaling)
        model.layout.set_extension(variant.extension)
        for length in lengths:
            common = {**base, "eval_len": length, "ratio": length / spec.train.train_len,
                      "scaling": variant.scaling_label, "extension": variant.extension,
                      "backend": model.layout.backends(dev, model.backend)}
            labels = [probe.variant_label(v) for v in variants]
            prompts = [p for v in variants for p in cells[(length, v)]]
            hit = [0] * len(prompts)
            try:  # every variant of a length in one batch, once per position draw
                for draw in range(draws):
                    pos = evaluation_positions(spec.train, length, draw)
                    hit = [h + v for h, v in zip(hit, verdicts(model, prompts, dev, spec.train.dtype, pos))]
            except PositionLimitError as e:
                rows += [{**common, "variant": lab, "status": "unsupported", "reason": str(e)} for lab in labels]
                continue
            for k, lab in enumerate(labels):
                hits = sum(hit[k * cfg.trials: (k + 1) * cfg.trials])
                rows.append({**common, "variant": lab, "hits": hits, "accuracy": hits / (cfg.trials * draws),
                             **stats.accuracy_columns(hits, cfg.trials * draws), "status": "ok", "reason": ""})
    return rows


def scoring_kept(run_dir: Path, scored: int, out: Path) -> str:
    """What a Ctrl-C while scoring the probes of `run_dir` keeps: the rows of the runs before it."""
    return (f"while scoring the probes of {run_dir.name}; {results.table_path(out, 'probes')} keeps the rows "
            f"of the {scored} run(s) scored before it, trained models are kept")


def evaluate(runs_dir: Path | str, cfg: ProbesConfig, eval_cfg: EvalConfig, probes: tuple[str, ...],
             schemes: tuple[str, ...] | None = None, out: Path | str | None = None, device: str = "auto",
             progress: bool = False) -> list[dict]:
    """Scores of every finished run trained on one of `probes` (names), merged into out/probes.csv."""
    runs = []
    for run_dir in find_runs(runs_dir, schemes):
        spec, _, _ = load_trained(run_dir)
        probe = probe_of(spec)
        if probe is not None and probe.name in probes:
            runs.append(run_dir)
    if not runs:
        raise PosbenchError(f"no trained runs of probes {', '.join(probes)} in {runs_dir}; train on the "
                            f"probe's data first (`posbench train --data {probes[0]}` or a task's [probes])")
    out = Path(out or runs_dir)
    all_rows = []
    from rich.progress import Progress

    with Progress(disable=not progress, transient=True) as bar:
        job = bar.add_task("probes", total=len(runs))
        for k, run_dir in enumerate(runs):
            bar.update(job, description=f"probe {run_dir.name}")
            with on_interrupt(scoring_kept(run_dir, k, out)):
                rows = evaluate_run(run_dir, cfg, eval_cfg, device)
            results.merge_rows(out, "probes", rows)
            all_rows += rows
            bar.advance(job)
    return all_rows
