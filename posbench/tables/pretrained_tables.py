"""A pretrained model's tables (results/pretrained): perplexity under each policy, inside and past its
context, effective length, passkey, RULER and key tokens."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

from posbench import results, stats
from posbench.errors import PosbenchError
from posbench.reporting import effective_text, markdown_table
from posbench.tables.common import rows_of

POLICY_ORDER = ("none", "pi", "ntk", "dynamic-ntk", "yarn", "llama3", "longrope", "freq-band", "self-extend", "rerope",
                "dpe", "dope")


def _policy(scaling: str) -> tuple:
    kind = scaling.split("(")[0].split(":")[0]
    return (POLICY_ORDER.index(kind) if kind in POLICY_ORDER else len(POLICY_ORDER), scaling)


def _model_rows(rows: list[dict], model: str | None) -> list[dict]:
    """The rows of the pretrained model named `model` (a row's `scheme`; None: every model's)."""
    return [r for r in rows if results.of_model(r) and (model is None or r["scheme"] == model)]


def pretrained_perplexity(directory: Path, model: str | None = None) -> str:
    """Policy x length: perplexity with its 95% interval over windows where there are two or more,
    the windows scored, `*` where the policy leaves the model as it is (a shared row)."""
    rows = [r for r in _model_rows(rows_of(directory, "extrapolation", "`posbench extrapolate --model`"), model)
            if r["status"] == "ok"]
    lengths = sorted({int(r["eval_len"]) for r in rows})
    cells = {(r["scaling"], int(r["eval_len"])): r for r in rows}
    body = []
    for scaling in sorted({r["scaling"] for r in rows}, key=_policy):
        line = [scaling]
        for n in lengths:
            r = cells.get((scaling, n))
            if r is None:
                line.append("")
                continue
            shared = " *" if r["reason"].startswith(results.SHARED) else ""  # not DPE's note of its scales
            windows = int(r["tokens"]) // n
            # rows written before the lower end stopped at perplexity 1 (a loss of 0) read so here too
            ci = (f" [{max(float(r['ppl_lo']), 1.0):.2f}, {float(r['ppl_hi']):.2f}]"
                  if r["ppl_lo"] not in ("", "nan") else "")
            line.append(f"{float(r['ppl']):.2f}{ci} ({windows} w){shared}")
        body.append(line)
    return markdown_table(["policy", *(f"{n} ({int(n) // 1024}k)" for n in lengths)], body)


def inside_and_past(directory: Path, model: str | None = None) -> str:
    """Per policy and length past train_len: perplexity over the position buckets below and past the
    first bucket edge at or past train_len."""
    extrapolation = _model_rows(rows_of(directory, "extrapolation", "`posbench extrapolate --model`"), model)
    train_len = {int(r["train_len"]) for r in extrapolation}.pop()
    groups = defaultdict(list)
    for p in _model_rows(rows_of(directory, "positions", "`posbench extrapolate --model`"), model):
        if int(p["eval_len"]) > train_len:
            groups[(p["scaling"], int(p["eval_len"]))].append(p)
    body = []
    for (scaling, n), buckets in sorted(groups.items(), key=lambda kv: (kv[0][1], _policy(kv[0][0]))):
        # split at the first bucket edge at or past train_len (the buckets are log-spaced: the bounds are shown)
        cut = min(int(b["position_start"]) for b in buckets if int(b["position_start"]) >= train_len)
        line = [scaling, str(n)]
        inside = [b for b in buckets if int(b["position_end"]) < cut]
        for chosen in (inside, [b for b in buckets if int(b["position_start"]) >= cut]):
            tokens = sum(int(b["tokens"]) for b in chosen)
            loss = sum(float(b["loss"]) * int(b["tokens"]) for b in chosen) / tokens
            line += [f"{min(int(b['position_start']) for b in chosen)}-{max(int(b['position_end']) for b in chosen)}",
                     f"{math.exp(loss):.2f}"]
        body.append(line)
    return markdown_table(["policy", "length", "positions", "ppl", "positions", "ppl"], body)


def pretrained_effective(directory: Path, model: str | None = None) -> str:
    rows = _model_rows(rows_of(directory, "effective_length", "`posbench extrapolate --model`"), model)
    body = []
    for r in sorted((r for r in rows if r["metric"] == "ppl"), key=lambda r: _policy(r["scaling"])):
        mark = ">= " if r["status"] == "censored" else ""
        body.append([r["scaling"], f"{float(r['reference']):.2f}", f"{mark}{r['effective_len']}", r["status"]])
    return markdown_table(["policy", "reference ppl (8k)", "effective length", "status"], body)


def pretrained_probe_effective(directory: Path, model: str | None = None) -> str | None:
    """Per probe (passkey, RULER's tasks) and policy: the score at the model's context (references
    or digits found, pooled; `-` where the policy was read only past it) and the effective length
    on both bases with the accuracy each asks for (`-`: no reference, e.g. below it at the model's
    context); None without probe rows in effective_length.csv."""
    rows = [r for r in _model_rows(results.read_rows(results.table_path(directory, "effective_length")), model)
            if r["metric"] == "accuracy"]
    if not rows:
        return None
    home = defaultdict(lambda: [0, 0])
    for r in _model_rows(results.read_probes(directory), model):
        if r["eval_len"] == r["train_len"]:
            home[(r["probe"], r["scaling"])][0] += int(r["hits"])
            home[(r["probe"], r["scaling"])][1] += int(r["answers"])
    cells: dict[tuple[str, str], dict[str, dict]] = defaultdict(dict)
    for r in rows:
        probe, _, relative = r["protocol"].partition("/")
        cells[(probe, r["scaling"])]["relative" if relative else "absolute"] = r

    def length(r: dict | None) -> str:
        if r is None or r["status"] == "no reference":
            return "-"
        return f"{effective_text(r)} at {float(r['criterion']):.1%}"

    body = []
    for (probe, scaling), by in sorted(cells.items(), key=lambda kv: (kv[0][0], _policy(kv[0][1]))):
        hits, answers = home.get((probe, scaling), (0, 0))
        body.append([probe, scaling, f"{hits / answers:.0%}" if answers else "-", length(by.get("absolute")),
                     length(by.get("relative"))])
    context = sorted({r["train_len"] for r in rows})
    head = ["probe", "policy", f"score at {'/'.join(context)}", "effective length, absolute", "relative (85% of own)"]
    return markdown_table(head, body)


def pretrained_passkey(directory: Path, model: str | None = None) -> str | None:
    """Policy and length: digits right, per-digit accuracy (Wilson), keys right, and by depth; None
    without passkey rows."""
    rows = [r for r in _model_rows(results.read_probes(directory), model) if r["probe"] == "passkey"]
    if not rows:
        return None
    cells = defaultdict(lambda: [0, 0, 0, 0])
    for r in rows:
        c = cells[(r["scaling"], int(r["eval_len"]))]
        c[0] += int(r["hits"])
        c[1] += int(r["answers"])
        c[2] += int(r["exact"])
        c[3] += int(r["trials"])
    body = []
    for (scaling, n), (hits, answers, exact, trials) in sorted(cells.items(), key=lambda kv: (kv[0][1], _policy(kv[0][0]))):
        lo, hi = stats.wilson(hits, answers)
        depths = sorted((r for r in rows if r["scaling"] == scaling and int(r["eval_len"]) == n),
                        key=lambda r: float(r["variant"].split("=")[-1]) if "=" in r["variant"] else r["variant"])
        by_depth = " ".join(f"{r['hits']}/{r['answers']}" for r in depths)
        body.append([scaling, str(n), f"{hits}/{answers}", f"{hits / answers:.0%} [{lo:.0%}, {hi:.0%}]",
                     f"{exact}/{trials}", by_depth])
    head = ["policy", "length", "digits right", "per-digit accuracy [Wilson 95%]", "keys right (exact)",
            "by depth 0, .25, .5, .75, 1"]
    return markdown_table(head, body)


def pretrained_ruler(directory: Path, model: str | None = None) -> str | None:
    """Per RULER task, policy and length: string_match_all (references found, Wilson 95%), prompts
    wholly right, and the chance of a guess; None without ruler: rows."""
    rows = [r for r in _model_rows(results.read_probes(directory), model) if r["probe"].startswith("ruler:")]
    if not rows:
        return None
    body = []
    for r in sorted(rows, key=lambda r: (r["probe"], int(r["eval_len"]), _policy(r["scaling"]))):
        body.append([r["probe"].removeprefix("ruler:"), r["scaling"], r["eval_len"], f"{r['hits']}/{r['answers']}",
                     f"{float(r['accuracy']):.0%} [{float(r['acc_lo']):.0%}, {float(r['acc_hi']):.0%}]",
                     f"{r['exact']}/{r['trials']}", f"{float(r['chance']):.0%}"])
    head = ["task", "policy", "length", "references found", "string_match_all [Wilson 95%]", "prompts all right",
            "chance"]
    return markdown_table(head, body)


def pretrained_key_tokens(directory: Path, model: str | None = None) -> str | None:
    """Per policy and length with key tokens counted (LongPPL's, posbench/docs/evaluation.md): the
    perplexity, the key tokens and their share of the targets past the context, and the perplexity
    on them; None where no row counted any (its windows reach no further than the context, or the
    rows predate the count)."""
    rows = [r for r in _model_rows(results.read_rows(results.table_path(directory, "extrapolation")), model)
            if r.get("key_share") not in (None, "")]
    if not rows:
        return None
    body = []
    for r in sorted(rows, key=lambda r: (int(r["eval_len"]), _policy(r["scaling"]))):
        key_ppl = f"{float(r['key_ppl']):.2f}" if r.get("key_ppl") not in (None, "") else "-"
        body.append([r["scaling"], r["eval_len"], f"{float(r['ppl']):.2f}", r["key_tokens"],
                     f"{float(r['key_share']):.2%}", key_ppl])
    return markdown_table(["policy", "length", "ppl", "key tokens", "share of the targets past the context",
                           "key-token ppl"], body)


def pretrained(directory: Path) -> str:
    """Sections under `###` titles: where extrapolation.csv has a model's rows, perplexity by
    policy and length, inside and past the context, perplexity's effective length and the key
    tokens where they were counted; where
    probes.csv has them, passkey, RULER's tasks and the probes' effective length on both bases.
    A folder with more than one model (another file, or the same in bfloat16: a row's `scheme`)
    has each model's sections in turn, the model's name after each title."""
    windows = {r["scheme"] for r in _model_rows(results.read_rows(results.table_path(directory, "extrapolation")), None)}
    prompts = {r["scheme"] for r in _model_rows(results.read_probes(directory), None)}
    if not (windows or prompts):
        raise PosbenchError(f"no rows of a pretrained model in {directory}: `posbench extrapolate --model` "
                            "and `posbench probe --model` write them")
    models = sorted(windows | prompts)
    parts = []
    for model in models:
        sections = ((("Perplexity by policy and length", pretrained_perplexity(directory, model)),
                     ("Inside and past the context, within each window", inside_and_past(directory, model)),
                     ("Effective length", pretrained_effective(directory, model)),
                     ("Key tokens past the context", pretrained_key_tokens(directory, model))) if model in windows else ()) + (
                    (("Passkey", pretrained_passkey(directory, model)),
                     ("RULER's synthetic tasks", pretrained_ruler(directory, model)),
                     ("Effective length of the probes", pretrained_probe_effective(directory, model)))
                    if model in prompts else ())
        named = f": {model}" if len(models) > 1 else ""
        parts += [f"### {title}{named}\n\n{text}" for title, text in sections if text is not None]
    return "\n\n".join(parts)
