"""The readings of a pretrained model through posbench.sweep: perplexity (`extrapolate`) and the
text probes (`read_probe`: the natural-language passkey, RULER's tasks, a plug-in's), every policy x
length, rows merged as each cell is done.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from posbench import results
from posbench.config import EvalConfig, ProbesConfig
from posbench.evaluate import Perplexity
from posbench.policies import refuse_stale
from posbench.probing import Verdicts
from posbench.progress import Bar
from posbench.pretrained.loading import load
from posbench.pretrained.model import memory_line, token_stream
from posbench.sweep import sweep


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def extrapolate(spec: str, cfg: EvalConfig, data: str, out: Path, task: str, progress: bool = False,
                base: Path | None = None, device: torch.device | str = "cpu", dtype: str = "float32") -> list[dict]:
    """Perplexity of a pretrained model at every length under every policy of `cfg`: rows merged into
    out/extrapolation.csv, positions.csv and windows.csv, as for trained runs."""
    m = load(spec, base, device, dtype)
    m.eval_cfg = cfg
    scalings = [v.scaling for v in m.variants()]  # each checked on the model before any is read
    say(memory_line(m, scalings, max(cfg.lengths)))
    stream, fingerprint = token_stream(m, data)
    for table in ("windows", "extrapolation", "positions"):
        results.read_rows(results.table_path(out, table))  # a damaged table fails before any is written
    refuse_stale(results.read_rows(results.table_path(out, "extrapolation")), scalings,
                 str(results.table_path(out, "extrapolation")))
    valid = token_stream(m, data, "valid")[0] if any(s.detects for s in scalings) else None
    with Bar(progress) as bar:
        measure = Perplexity(cfg, stream, {"task": task, "mode": cfg.mode, "corpus": fingerprint}, valid,
                             on_length=bar.start, on_forward=lambda w: bar.step(f"loss {float(w[-1]):.3f}"))
        return sweep(m, measure, cfg.lengths, out)["extrapolation"]


def read_probe(probe_class, spec: str, cfg: ProbesConfig, eval_cfg: EvalConfig, lengths: tuple[int, ...], out: Path,
               task: str, progress: bool = False, base: Path | None = None, resume: bool = False,
               device: torch.device | str = "cpu", dtype: str = "float32") -> list[dict]:
    """probes.csv rows of a text probe (a posbench.probes.TextProbe class) on a pretrained model: every
    policy x length x variant, `cfg.trials` prompts each, the same prompts for every policy, each
    decoded greedily; its prompts' verdicts in prompts.csv (`resume`: the cells and prompts out holds
    already are kept). No row is gated `not learned`: the model was not trained on the probe
    (posbench.effective reads a model that fails at its own context as `no reference`)."""
    probe_class.check(cfg)  # its settings before the model loads
    m = load(spec, base, device, dtype)
    m.eval_cfg = eval_cfg
    probe = probe_class(m.tokenizer, cfg)
    # Every prompt first: a length too short for the probe fails before any policy is read.
    prompts = {(n, v): probe.prompts(n, v, cfg.trials, cfg.seed) for n in lengths for v in probe.variants()}
    say(memory_line(m, [v.scaling for v in m.variants()], max(lengths), decoding=True))
    refuse_stale(results.read_probes(out), [v.scaling for v in m.variants()], str(results.table_path(out, "probes")))
    columns = {"task": task, "probe": probe.name, "spec": probe.spec(), "seed": cfg.seed,
               "corpus": f"{m.tokenizer.__class__.__name__}-{m.sha256[:12]}{probe.corpus()}"}
    with Bar(progress, "prompt") as bar:
        measure = Verdicts(prompts, probe.variant_label, columns, out, resume,
                           cell_columns=lambda cell: {"chance": probe.chance(prompts[cell])},
                           on_length=bar.start, on_prompt=bar.step)
        return sweep(m, measure, lengths, out)["probes"]
