"""What the evaluation commands read, whatever the model: perplexity (`extrapolate`) and probes
(`probe`) of trained runs or of a pretrained model, each model through posbench.sweep. A `Models`
names the models: a runs folder (its finished runs, or those of some schemes) or a pretrained
model (`--model hf:|gguf:`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from posbench import results
from posbench.config import EvalConfig, ProbesConfig
from posbench.errors import PosbenchError, on_interrupt
from posbench.policies import from_eval, refuse_stale, specs
from posbench.progress import Bar
from posbench.runs import load_spec


@dataclass(frozen=True)
class Models:
    """The models a reading reads: `model` (a pretrained model's spec) or the finished runs of
    `runs_dir` (those of `schemes`, or `runs`); `task` and `corpus` the task's name and text corpus
    (a pretrained model's perplexity), `base` the folder a task's relative paths start from;
    `device` and `dtype` (a pretrained model's precision) where and how they compute."""

    runs_dir: Path = Path("runs")
    schemes: list[str] | None = None
    runs: list[Path] | None = None
    model: str | None = None
    task: str = "default"
    corpus: str = ""
    base: Path | None = None
    device: str = "auto"
    dtype: str = "float32"

    @property
    def pretrained(self) -> bool:
        return bool(self.model)

    def check(self, attention: bool = False) -> None:
        if self.pretrained and attention:
            raise PosbenchError("--attention measures posbench's own models; a pretrained model has no such path")


def extrapolate(models: Models, cfg: EvalConfig, out: Path, progress: bool = False,
                attention: bool = False) -> list[dict]:
    """Perplexity rows of every model at every length (merged into out/*.csv as each cell is done;
    with `attention`, a trained run's attention.csv too)."""
    models.check(attention)
    if models.pretrained:
        from posbench import pretrained
        from posbench.device import resolve_device

        results.check_folder(out)  # before the model loads
        return pretrained.extrapolate(models.model, cfg, models.corpus, out, models.task, progress, models.base,
                                      resolve_device(models.device), models.dtype)
    return extrapolate_runs(models, cfg, out, progress, attention)


def extrapolate_runs(models: Models, cfg: EvalConfig, out: Path, progress: bool = False,
                     attention: bool = False) -> list[dict]:
    """Evaluate every finished run on text (or those of `schemes`, or `runs`)."""
    from posbench import evaluate
    from posbench.readers import find_runs

    runs = find_runs(models.runs_dir, models.schemes) if models.runs is None else models.runs
    found = len(runs)
    runs = [r for r in runs if not evaluate.on_probe(r)]  # scored by `posbench probe`, not by perplexity
    if not runs:
        named = f" of schemes {', '.join(models.schemes)}" if models.schemes else ""
        probes = f" ({found} trained on probes: score them with `posbench probe`)" if found else ""
        raise PosbenchError(f"no trained runs{named} on text in {models.runs_dir}{probes}; run `posbench train` first")
    for run_dir in runs:  # every run's plug-ins and config before any run is evaluated or a row rewritten
        load_spec(run_dir)
    tables = ("windows", "extrapolation", "positions") + (("attention",) if attention else ())
    for table in tables:  # a damaged table fails before any is written
        results.read_rows(results.table_path(out, table))
    refuse_stale(results.read_rows(results.table_path(out, "extrapolation")),
                 [from_eval(k, cfg) for k in specs(cfg)], str(results.table_path(out, "extrapolation")))
    cache: dict = {}
    all_rows = []
    with Bar(progress, "run", lines=False) as bar:
        bar.start("extrapolate", len(runs))
        for run_dir in runs:
            measured = [] if attention else None
            rows, _, _ = evaluate.evaluate_run(run_dir, cfg, models.device, cache, attention=measured, out=out)
            if measured:
                results.merge_rows(out, "attention", measured)
            all_rows += rows
            bar.step(run_dir.name)
    return all_rows


def probe(models: Models, names: tuple[str, ...], cfg: ProbesConfig, eval_cfg: EvalConfig, lengths: tuple[int, ...],
          out: Path, progress: bool = False, resume: bool = False) -> list[dict]:
    """probes.csv rows of the probes `names` on every model: a pretrained model reads the text
    probes at `lengths`, trained runs the symbolic probe each was trained on (`cfg.lengths`, or
    1x to 8x its training length)."""
    from posbench.probes.text import find

    found = [find(name, models.pretrained) for name in names]
    if models.pretrained:
        from posbench import pretrained
        from posbench.device import resolve_device

        results.check_folder(out)  # before the model loads: a refusal is the command's one line
        rows = []
        for probe_class in found:
            rows += pretrained.read_probe(probe_class, models.model, cfg, eval_cfg, lengths, out, models.task,
                                          progress, models.base, resume, resolve_device(models.device), models.dtype)
        return rows
    if resume and cfg.seed != ProbesConfig().seed:
        raise PosbenchError(f"--resume keeps a trained run's cells read with the prompts of seed "
                            f"{ProbesConfig().seed} (probes.csv names a trained run's seed, not its "
                            f"prompts'): drop --seed {cfg.seed} or --resume")
    return probe_runs(models, cfg, eval_cfg, tuple(p.name for p in found), out, progress, resume)


def probe_runs(models: Models, cfg: ProbesConfig, eval_cfg: EvalConfig, probes: tuple[str, ...], out: Path,
               progress: bool = False, resume: bool = False) -> list[dict]:
    """Scores of every finished run trained on one of `probes` (names), merged into out/probes.csv
    and out/prompts.csv cell by cell (`resume`: the cells and prompts out holds already are kept)."""
    from posbench import probing
    from posbench.readers import find_runs

    runs = []
    for run_dir in find_runs(models.runs_dir, models.schemes):
        spec, _ = load_spec(run_dir)
        probe = probing.probe_of(spec)
        if probe is not None and probe.name in probes:
            runs.append(run_dir)
    if not runs:
        raise PosbenchError(f"no trained runs of probes {', '.join(probes)} in {models.runs_dir}; train on the "
                            f"probe's data first (`posbench train --data {probes[0]}` or a task's [probes])")
    for run_dir in runs:  # before any run is scored, so that nothing is written
        probing.check_lengths(probing.probe_of(load_spec(run_dir)[0]), cfg.lengths)
    refuse_stale(results.read_probes(out), [from_eval(k, eval_cfg) for k in specs(eval_cfg)],
                 str(results.table_path(out, "probes")))
    all_rows = []
    with Bar(progress, "run", lines=False) as bar:
        bar.start("probes", len(runs))
        for k, run_dir in enumerate(runs):
            with on_interrupt(probing.scoring_kept(run_dir, k, out)):
                all_rows += probing.evaluate_run(run_dir, cfg, eval_cfg, models.device, resume=out if resume else None,
                                                 out=out)
            bar.step(run_dir.name)
    return all_rows
