"""The readings of a pretrained model: perplexity (`extrapolate`), the natural-language passkey
(`passkey`) and RULER's tasks (`ruler_probe`), every policy x length, rows merged as each cell is done.
"""

from __future__ import annotations

import math
import random
import re
import sys
from pathlib import Path

import torch

from posbench import results, ruler
from posbench.config import EvalConfig, ProbesConfig
from posbench.errors import PosbenchError
from posbench.evaluate import (correlated_windows, detect_dpe, detection_windows, dpe_note, failure, key_tokens,
                               loss_interval, position_rows, record, score, stride_for, window_rows, windows)
from posbench.extension import columns as extension_columns
from posbench.progress import Bar
from posbench.probes import parse_probe
from posbench.probing import counts, verdict_columns
from posbench.policies import Policy, refuse_stale
from posbench.schemes import PositionLimitError
from posbench.pretrained.loading import load
from posbench.pretrained.model import Pretrained, distinct, memory_line, policies, token_stream
from posbench.pretrained.resume import judge_prompt, kept_prompts, kept_rows


FILLER = " " + ruler.NOISE  # the sentences of the passkey tests and of RULER's noise haystack
INSTRUCTION = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
               "I will quiz you about the important information there.")
KEY_SENTENCE = " The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = " What is the pass key? The pass key is"
DIGITS = 5


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def extrapolate(spec: str, cfg: EvalConfig, data: str, out: Path, task: str, progress: bool = False,
                base: Path | None = None, device: torch.device | str = "cpu", dtype: str = "float32") -> list[dict]:
    """Perplexity of a pretrained model at every length under every policy of `cfg`: rows merged into
    out/extrapolation.csv, positions.csv and windows.csv, as posbench.evaluate writes them for runs."""
    m = load(spec, base, device, dtype)
    scalings = policies(m, cfg)
    say(memory_line(m, scalings, max(cfg.lengths)))
    stream, fingerprint = token_stream(m, data)
    base_row = {"run_id": m.run_id, "task": task, "scheme": m.name, "params": str(m.path), "seed": 0,
                "train_len": m.train_len, "mode": cfg.mode, **extension_columns(None), "position_draws": 0,
                **results.provenance(m.device.type, m.dtype, fingerprint)}
    for table in ("windows", "extrapolation", "positions"):
        results.read_rows(results.table_path(out, table))  # a damaged table fails before any is written
    refuse_stale(results.read_rows(results.table_path(out, "extrapolation")), scalings,
                 str(results.table_path(out, "extrapolation")))
    rows = []
    scored: dict[tuple, tuple] = {}  # distinct forwards -> (total, count, starts, window losses, label)
    valid = token_stream(m, data, "valid")[0] if any(s.detects for s in scalings) else None
    with Bar(progress) as bar:
        for scaling in scalings:
            m.set_scaling(scaling)
            for length in cfg.lengths:
                row = {**base_row, "eval_len": length, "ratio": length / m.train_len, "stride": stride_for(cfg, length),
                       "scaling": scaling.label, "extension": "none", "backend": m.backend,
                       **scaling.provenance()}
                key = distinct(m, scaling, length)
                reason = ""
                try:
                    if scaling.detects:  # DPE's scales at this length, on validation windows of the corpus
                        reason = dpe_note(detect_dpe(m, m.set_scaling, scaling, m.rotary.dim // 2, m.train_len, length,
                                                     detection_windows(valid, length, cfg.dpe_windows)))
                    if key in scored:
                        reason = results.shared_note(scored[key][-1])
                    else:
                        bar.start(f"{scaling.label} {length}", len(windows(stream, length, cfg, cfg.lengths)[0]))
                        keys = key_tokens(cfg, m, m.train_len)
                        done = score(m, stream, length, cfg, cfg.lengths,
                                     lambda w: bar.step(f"loss {float(w[-1]):.3f}"), keys)
                        scored[key] = (*done, keys.columns() if keys is not None else {}, scaling.label)
                except Exception as e:  # the policy fails at this length: its row says so, the others are read
                    rows.append({**row, **unread(e, length), "tokens": 0})
                    record(out, rows[-1:], [], [])
                    continue
                total, count, starts, window_loss, key_columns, _ = scored[key]
                loss = float(total.sum() / count.sum())
                rows.append({**row, "tokens": int(count.sum()), "loss": loss, "ppl": math.exp(loss),
                             **loss_interval(loss, window_loss.tolist(), correlated_windows(cfg.mode, length, row["stride"])),
                             **key_columns, "status": "ok" if math.isfinite(loss) else "failed", "reason": reason})
                # each cell as it is done: a long reading stopped midway keeps what it measured
                record(out, rows[-1:], position_rows(row, total, count, cfg.position_buckets),
                       window_rows(row, starts, window_loss))
    return rows


def passkey_prompt(tok, length: int, depth: float, key: str) -> list[int]:
    """The classic passkey prompt (Mohtashami & Jaggi 2023; LongLM's and YaRN's passkey tests) as
    exactly `length` tokens of the model's tokenizer: the instruction, filler sentences, the key
    sentence after a share `depth` of the filler, more filler, the question. Filler comes in whole
    sentences groups; the last one before the question is cut to make up the length."""
    encode = lambda text: tok(text, add_special_tokens=False).input_ids  # noqa: E731
    head, needle, tail, unit = encode(INSTRUCTION), encode(KEY_SENTENCE.format(key=key)), encode(QUESTION), encode(FILLER)
    free = length - len(head) - len(needle) - len(tail)
    if free < 0:
        raise PosbenchError(f"passkey length {length} is too short: the prompt needs at least "
                            f"{length - free} tokens")
    before = round(depth * (free // len(unit))) * len(unit)
    after = free - before
    fill = lambda n: (unit * (n // len(unit) + 1))[:n]  # noqa: E731
    return head + fill(before) + needle + fill(after) + tail


def passkey_verdicts(m: Pretrained, prompt: list[int], key: str) -> list[bool]:
    """Per digit of the key, whether greedy decoding after the prompt spells it there: the digits
    the model writes first (leading spaces skipped), compared place by place."""
    text = m.tokenizer.decode(m.greedy(prompt, DIGITS + 2))
    said = re.match(r"\s*(\d*)", text).group(1)
    return [i < len(said) and said[i] == d for i, d in enumerate(key)]


def model_row(m: Pretrained, cfg: ProbesConfig, task: str, probe: str, spec: str, corpus: str) -> dict:
    """The probes.csv columns that every row of a pretrained model's probe shares."""
    return {"run_id": m.run_id, "task": task, "probe": probe, "spec": spec, "scheme": m.name, "params": str(m.path),
            "seed": cfg.seed, "train_len": m.train_len, **extension_columns(None), "position_draws": 0,
            **results.provenance(m.device.type, m.dtype, f"{m.tokenizer.__class__.__name__}-{m.sha256[:12]}{corpus}")}


def judge_prompts(m: Pretrained, scalings: list[Policy], prompts: dict[tuple, list], verdicts, base_row: dict,
                  out: Path, progress: bool, variant_label=str, cell_columns=None,
                  tokens_of=None, resume: bool = False) -> list[dict]:
    """probes.csv rows of a pretrained model: every policy x (length, variant) of `prompts`, each
    prompt judged by `verdicts` (a list of right or wrong answers). A forward with the frequencies
    of one already read at that length is not run again; a policy's rows are merged into
    out/probes.csv after each length. DPE detects its scales at each length on the tokens
    (`tokens_of` an item) of the length's first prompt. `resume`: a length whose rows out/probes.csv
    holds already (same model, probe, prompts and policy) is kept, not read again. No row is gated
    `not learned`: the model was not trained on the probe (posbench.effective reads a model that
    fails at its own context as `no reference`). Rows of a plug-in policy that another version of its
    file made are refused before any is rewritten or kept."""
    refuse_stale(results.read_probes(out), scalings, str(results.table_path(out, "probes")))
    rows, judged = [], {}
    kept = kept_rows(out, base_row) if resume else {}
    done = kept_prompts(out, base_row) if resume else {}
    prompt_base = {k: v for k, v in base_row.items() if k in results.TABLES["prompts"]["columns"]}
    lengths = list(dict.fromkeys(n for n, _ in prompts))
    with Bar(progress, "prompt") as bar:
        for scaling in scalings:
            m.set_scaling(scaling)
            group = []
            for n in lengths:
                cells = [key for key in prompts if key[0] == n]
                key = distinct(m, scaling, n)
                old = [kept.get((scaling.label, "none", n, variant_label(c[1]), len(prompts[c]))) for c in cells]
                if all(old):  # --resume: a policy that shares these frequencies later reads these counts
                    judged.setdefault(key, ({c: {k: r[k] for k in ("answers", "hits", "trials", "exact")}
                                             for c, r in zip(cells, old)}, scaling.label))
                    group += old
                    continue
                try:
                    detected = dpe_on_prompt(m, scaling, tokens_of(prompts[cells[0]][0])) if scaling.detects else ""
                    if key not in judged:
                        bar.start(f"{base_row['probe']} {scaling.label} {n}", sum(len(prompts[c]) for c in cells))
                        read = {}
                        for cell in cells:
                            where = {**prompt_base, "eval_len": n, "variant": variant_label(cell[1]),
                                     "scaling": scaling.label, "backend": m.backend}
                            said = [judge_prompt(out, where, i, item, verdicts, done, bar)
                                    for i, item in enumerate(prompts[cell])]
                            read[cell] = counts(said)
                        judged[key] = (read, scaling.label)  # whole lengths only: a failed one is not shared
                except Exception as e:  # the policy fails at this length: its rows say so, the others are read
                    group += [{**base_row, "eval_len": n, "ratio": n / m.train_len, "variant": variant_label(cell[1]),
                               "trials": len(prompts[cell]), "scaling": scaling.label, "extension": "none",
                               **scaling.provenance(), "backend": m.backend, **unread(e, n),
                               **(cell_columns(cell) if cell_columns else {})} for cell in cells]
                    results.merge_rows(out, "probes", group)
                    continue
                shared = judged[key][1]
                reason = detected or ("" if shared == scaling.label else results.shared_note(shared))
                for cell in cells:
                    c = judged[key][0][cell]
                    group.append({**base_row, "eval_len": n, "ratio": n / m.train_len, "variant": variant_label(cell[1]),
                                  "trials": len(prompts[cell]), "scaling": scaling.label, "extension": "none", **scaling.provenance(),
                                  "backend": m.backend, **c, **verdict_columns(c), "status": "ok", "reason": reason,
                                  **(cell_columns(cell) if cell_columns else {})})
                results.merge_rows(out, "probes", group)
            rows += group
    return rows


def unread(e: Exception, length: int) -> dict:
    """The status and reason of a cell whose policy raised `e` at `length`: `unsupported` past a
    declared limit, `failed` with the error's first line for an error of the policy's code; an
    error that is not the policy's (bad input, out of memory, Ctrl-C) stops the reading."""
    if isinstance(e, PositionLimitError):
        return {"status": "unsupported", "reason": str(e)}
    reason = failure(e, length)
    if reason is None:
        raise e
    return {"status": "failed", "reason": reason}


def dpe_on_prompt(m: Pretrained, scaling: Policy, tokens: list[int]) -> str:
    """DPE's scales detected on one prompt's tokens (its next-token losses), set on the model; the
    note its rows carry."""
    window = torch.tensor(tokens)[None]
    return dpe_note(detect_dpe(m, m.set_scaling, scaling, m.rotary.dim // 2, m.train_len, len(tokens) - 1, window),
                    "the first prompt")


def passkey(spec: str, cfg: ProbesConfig, eval_cfg: EvalConfig, lengths: tuple[int, ...], out: Path, task: str,
            progress: bool = False, base: Path | None = None, resume: bool = False,
            device: torch.device | str = "cpu", dtype: str = "float32") -> list[dict]:
    """probes.csv rows of the passkey test on a pretrained model: every policy x length x depth,
    `cfg.trials` prompts each, the same prompts for every policy (`resume`: judge_prompts)."""
    m = load(spec, base, device, dtype)
    probe = parse_probe("passkey")
    scalings = policies(m, eval_cfg)
    say(memory_line(m, scalings, max(lengths), decoding=True))
    prompts = {}
    for n in lengths:
        for depth in probe.variants():
            rng = random.Random(f"passkey:{cfg.seed}:{n}:{depth}")
            keys = [str(rng.randrange(10 ** (DIGITS - 1), 10**DIGITS)) for _ in range(cfg.trials)]
            prompts[(n, depth)] = [(passkey_prompt(m.tokenizer, n, depth, k), k) for k in keys]
    base_row = {**model_row(m, cfg, task, "passkey", "passkey:natural-language", ""), "chance": 0.1}
    return judge_prompts(m, scalings, prompts, lambda item: passkey_verdicts(m, *item), base_row, out,
                         progress, probe.variant_label, tokens_of=lambda item: item[0], resume=resume)


def encode(tok, text: str) -> list[int]:
    """The model's tokens of `text`, no special tokens added (as the prompts are counted)."""
    return tok(text, add_special_tokens=False).input_ids


def ruler_verdicts(m: Pretrained, task: ruler.Task, p: ruler.Prompt) -> list[bool]:
    """Per reference, whether the model's greedy output after the prompt (at most the task's
    tokens to generate, to its end token) holds it: RULER's string_match_all."""
    made = m.greedy(encode(m.tokenizer, p.text), task.generate, to_end=True)
    return ruler.references_found(m.tokenizer.decode(made, skip_special_tokens=True), p.answers)


def ruler_probe(name: str, spec: str, cfg: ProbesConfig, eval_cfg: EvalConfig, lengths: tuple[int, ...], out: Path,
                task: str, progress: bool = False, base: Path | None = None, resume: bool = False,
                device: torch.device | str = "cpu", dtype: str = "float32") -> list[dict]:
    """probes.csv rows of RULER's task `name` (ruler:TASK) on a pretrained model: every policy x
    length, `cfg.trials` prompts each (RULER's generator in posbench.ruler, fitted to the model's
    tokenizer), the same prompts for every policy (`resume`: judge_prompts)."""
    t = ruler.task_of(name)
    essay = ruler.load_essay(cfg.ruler_essay)
    m = load(spec, base, device, dtype)
    scalings = policies(m, eval_cfg)
    count = lambda text: len(encode(m.tokenizer, text))  # noqa: E731
    prompts = {(n, None): [ruler.prompt(t, n, f"{name}:{cfg.seed}:{n}:{i}", count, essay) for i in range(cfg.trials)]
               for n in lengths}
    say(memory_line(m, scalings, max(lengths), decoding=True))
    base_row = model_row(m, cfg, task, name, f"{name}:essay={cfg.ruler_essay}", f"+essay-{essay.fingerprint}")
    chance = {cell: sum(map(ruler.chance, ps)) / len(ps) for cell, ps in prompts.items()}
    return judge_prompts(m, scalings, prompts, lambda p: ruler_verdicts(m, t, p), base_row, out, progress,
                         lambda _: "", lambda cell: {"chance": chance[cell]}, lambda p: encode(m.tokenizer, p.text),
                         resume)
