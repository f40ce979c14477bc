"""posbench train: one model with one scheme or layout, on the task's settings overridden by flags."""

import dataclasses
import os
from pathlib import Path
from typing import Annotated, Optional, Sequence

import pandas as pd
import typer

from posbench import config, layout
from posbench.commands import frame, plain
from posbench.commands.options import Device, Param, Resume, RunsDir, Task, load_plugins, params, settings, takes
from posbench.data import DataConfig
from posbench.errors import PosbenchError
from posbench.model import ModelConfig

# its line in posbench/docs/commands.md, and the pages that explain it
SUMMARY = "train one model with one scheme or layout"
PAGES = ('model.md', 'data.md')


@takes(DataConfig, ModelConfig, config.TrainConfig)
def train(
    scheme: Annotated[str, typer.Option(help="scheme, preset or layout spec (see `posbench schemes`)")],
    *,
    task: Task = None,
    seed: Annotated[Optional[int], typer.Option(help="default: the task's first seed")] = None,
    param: Param = None,
    device: Device = "auto",
    runs_dir: RunsDir = Path("runs"),
    resume: Resume = False,
    overwrite: Annotated[bool, typer.Option(help="train a finished run again from scratch (else it is kept)")] = False,
    plugins: Sequence[str] = (),
    progress: bool = False,
    **given,
) -> pd.DataFrame:
    """Train one model with one scheme or layout (the task's settings, overridden by flags). A
    finished run is kept unless --overwrite."""
    from posbench import training
    from posbench.runs import RunSpec

    if resume and overwrite:
        raise PosbenchError("--resume continues a run and --overwrite trains it again from scratch: give one")
    load_plugins(plugins)
    scheme = layout.check(scheme)
    t = config.load_task(task)
    data = settings(t.data, given)
    t = dataclasses.replace(
        t, data=data, model=settings(t.model, given),
        # a probe's examples train with the task's settings for that probe, as `posbench run` does
        train=settings(t.train_for(data.spec), given))
    if seed is not None:
        config.check_seed(seed)
    spec = RunSpec(scheme=scheme, params={**t.params.get(scheme, {}), **params(param)},
                   seed=t.seeds[0] if seed is None else seed, data=t.data, model=t.model, train=t.train, task=t.name)
    result = training.train(spec, Path(runs_dir), device=device, resume=resume, progress=progress, overwrite=overwrite)
    return frame([{**result.row, "run_dir": str(result.run_dir), "skipped": result.skipped}])


def show(result: pd.DataFrame) -> int:
    row = result.attrs["rows"][0]
    run_id, train_len = row["run_id"], row["train_len"]
    if os.environ.get("RANK", "0") != "0":
        return 0  # under torchrun, rank 0 reports
    if row["skipped"]:
        plain(f"{run_id}: already trained (finished in runs.csv), kept as it is in {row['run_dir']}; "
              "--overwrite trains it again from scratch")
        return 0
    if row["status"] != "ok":
        plain(f"{run_id}: stopped early; continue with --resume")
        return 0
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
    plain(f"{run_id}: {steps_run} steps{stopped}, train loss {row['final_train_loss']:.4f}, "
          f"validation loss {row['final_val_loss']:.4f} ({scored}), "
          f"{row['tokens_per_second']:,.0f} tokens/s{computed}, {row['train_seconds']:.1f} s -> {row['run_dir']}")
    return 0
