"""posbench train: one model with one scheme or layout, on the task's settings overridden by flags."""

import dataclasses
import os
from pathlib import Path
from typing import Annotated, Optional, Sequence

import pandas as pd
import typer

from posbench import config
from posbench.commands import frame, plain, say
from posbench.commands.options import Device, Param, Resume, RunsDir, Task, load_plugins, params, settings, takes
from posbench.data import DataConfig
from posbench.errors import PosbenchError, RunFailed

# its line in posbench/docs/commands.md, and the pages that explain it
SUMMARY = "train one model with one scheme or layout"
PAGES = ('model.md', 'data.md')


@takes(DataConfig, config.ModelConfig, config.TrainConfig)
def train(
    scheme: Annotated[str, typer.Option(help="scheme, preset or layout spec (see `posbench schemes`)")],
    *,
    task: Task = None,
    seed: Annotated[Optional[int], typer.Option(help="default: the task's first seed")] = None,
    seeds: Annotated[Optional[str], typer.Option(
        help="several seeds instead of --seed, e.g. 0-3 or 0,1,2: one run each (the run_ids of their solo runs)")] = None,
    ensemble: Annotated[Optional[str], typer.Option(
        help="auto | off | N: --seeds trained as stacked models of at most N members in one process "
             "(auto: all of them on CUDA, off elsewhere; default: the task's, auto)")] = None,
    param: Param = None,
    device: Device = "auto",
    runs_dir: RunsDir = Path("runs"),
    resume: Resume = False,
    overwrite: Annotated[bool, typer.Option(help="train a finished run again from scratch (else it is kept)")] = False,
    plugins: Sequence[str] = (),
    progress: bool = False,
    **given,
) -> pd.DataFrame:
    """Train one model with one scheme or layout (the task's settings, overridden by flags), or one
    per seed of --seeds (stacked as ensembles where --ensemble says). A finished run is kept unless
    --overwrite. Exit 1 when a run of several failed (NaN loss): the others are trained."""
    from posbench import layout, training
    from posbench.runs import RunSpec

    if resume and overwrite:
        raise PosbenchError("--resume continues a run and --overwrite trains it again from scratch: give one")
    load_plugins(plugins)
    t = config.load_task(task)  # first: its plug-ins may register the scheme
    scheme = layout.check(scheme)
    data = settings(t.data, given)
    t = dataclasses.replace(
        t, data=data, model=settings(t.model, given),
        # a probe's examples train with the task's settings for that probe, as `posbench run` does
        train=settings(t.train_for(data.spec), given))
    if seed is not None and seeds is not None:
        raise PosbenchError("--seed names one seed and --seeds several: give one")
    if seed is not None:
        config.check_seed(seed)
    chosen = config.parse_seeds(seeds) if seeds is not None else (t.seeds[0] if seed is None else seed,)
    setting = config.check_ensemble(t.ensemble if ensemble is None else ensemble)
    spec = RunSpec(scheme=scheme, params={**t.params.get(scheme, {}), **params(param)},
                   seed=chosen[0], data=t.data, model=t.model, train=t.train, task=t.name)
    if len(chosen) == 1:
        result = training.train(spec, Path(runs_dir), device=device, resume=resume, progress=progress,
                                overwrite=overwrite)
        return frame([{**result.row, "run_dir": str(result.run_dir), "skipped": result.skipped}])
    from posbench import ensemble as stacking
    from posbench.device import resolve_device

    most = stacking.size(setting, resolve_device(device).type, len(chosen))
    rows = []
    for group in stacking.groups(stacking.with_seeds(spec, chosen), most):
        outcomes = training.train_ensemble(group, Path(runs_dir), device=device, resume=resume, progress=progress,
                                           overwrite=overwrite)
        for member, outcome in zip(group, outcomes):
            if isinstance(outcome, RunFailed):
                rows.append({"run_id": member.run_id, "train_len": member.original_len, "status": "failed",
                             "message": str(outcome), "run_dir": str(Path(runs_dir) / member.run_id),
                             "skipped": False})
            else:
                rows.append({**outcome.row, "run_dir": str(outcome.run_dir), "skipped": outcome.skipped})
    return frame(rows)


def show(result: pd.DataFrame) -> int:
    if os.environ.get("RANK", "0") != "0":
        return 0  # under torchrun, rank 0 reports
    failed = [row for row in result.attrs["rows"] if row["status"] == "failed"]
    for row in result.attrs["rows"]:
        if row["status"] == "failed":
            say(row["message"])
        else:
            show_row(row)
    return 1 if failed else 0


def show_row(row: dict) -> None:
    run_id, train_len = row["run_id"], row["train_len"]
    if row["skipped"]:
        plain(f"{run_id}: already trained (finished in runs.csv), kept as it is in {row['run_dir']}; "
              "--overwrite trains it again from scratch")
        return
    if row["status"] != "ok":
        plain(f"{run_id}: stopped early; continue with --resume")
        return
    if row.get("final_val_accuracy") is not None:  # a probe: loss on answers, their accuracy in length
        scored = f"validation accuracy {row['final_val_accuracy']:.1%} at {train_len} tokens"
    else:
        scored = f"unigram model: {row['unigram_val_loss']:.4f}"
    steps_run = row["stopped_at"] or row["steps"]
    stopped = f" (stopped early at step {steps_run} of {row['steps']})" if row["stopped_at"] else ""
    computed = ""
    if isinstance(row.get("padding_tokens"), int) and row["padding_tokens"]:  # a probe: answers scored, padding computed
        computed = (f" computed on ({row['padding_tokens'] / row['tokens']:.0%} of them padding, "
                    f"{row['scored_tokens'] / row['tokens']:.0%} answers)")
    stacked = f" (one of an ensemble of {row['ensemble']})" if row.get("ensemble") else ""
    plain(f"{run_id}: {steps_run} steps{stopped}, train loss {row['final_train_loss']:.4f}, "
          f"validation loss {row['final_val_loss']:.4f} ({scored}), "
          f"{row['tokens_per_second']:,.0f} tokens/s{computed}, {row['train_seconds']:.1f} s{stacked} -> {row['run_dir']}")
