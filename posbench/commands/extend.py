"""posbench extend: every finished parent fine-tuned into children at a longer length."""

from pathlib import Path
from typing import Annotated, Sequence

import pandas as pd
import typer
from rich.table import Table

from posbench import config, results
from posbench.commands import console, say
from posbench.commands import frame as to_frame
from posbench.commands.options import Device, Resume, RunsDir, Schemes, Task, load_plugins, names, scheme_names, \
    settings, takes
from posbench.errors import did_you_mean
from posbench.extension import METHODS

# its line in posbench/docs/commands.md, and the pages that explain it
SUMMARY = "fine-tune trained runs to a longer length with an extension method"
PAGES = ('extension.md',)


@takes(config.ExtendConfig, config.TrainConfig, only=(
    "target_len", "steps", "lr", "warmup", "schedule", "yarn_alpha", "yarn_beta", "population", "iterations",
    "mutation", "drope_lr", "tracker"))
def extend(
    method: Annotated[str, typer.Option(
        help="comma-separated: plain, pi, ntk, yarn, longrope, pose+plain, pose+pi, pose+ntk, pose+yarn, drope. "
             "longrope is long-factors-only: its searched factors apply at every length (transformers switches "
             "to short_factor up to the parent's length; posbench searches no short factors)")],
    *,
    runs_dir: RunsDir = Path("runs"),
    schemes: Schemes = None,
    task: Task = None,
    device: Device = "auto",
    resume: Resume = False,
    plugins: Sequence[str] = (),
    progress: bool = False,
    log=None,
    **given,
) -> pd.DataFrame:
    """Fine-tune every finished parent with each method into a child run that extends it to the
    target length, every method on the same tokens (the children go beside the parents); evaluate
    children with `extrapolate`.

    Rows: the children's runs.csv rows; `attrs["failed"]` names those whose fine-tuning failed."""
    from posbench import extending as extending
    from posbench import trackers

    load_plugins(plugins)
    t = config.load_task(task)
    cfg = settings(t.extend, {k: v for k, v in given.items() if k != "tracker"})
    methods = names(method)
    for name in methods:  # an unknown method: one line before any work
        if name not in METHODS:
            raise did_you_mean(name, METHODS, "extension method")
    tracker = given.get("tracker")
    if tracker is not None:
        settings(t.train, {"tracker": tracker})  # an unknown tracker: one line
        trackers.require(tracker)
    children, failed = extending.extend(Path(runs_dir), cfg, lambda scheme: methods, scheme_names(schemes), device,
                                        resume, progress=progress, log=log or (lambda m: None), tracker=tracker)
    recorded = {r["run_id"]: r for r in results.read_rows(results.table_path(runs_dir, "runs"))}
    rows = [{"run_id": s.run_id, "parent": s.extension.parent, "method": s.extension.method,
             **{k: v for k, v in recorded.get(s.run_id, {}).items() if k not in ("run_id", "method")}}
            for s in children]
    return to_frame(rows, failed=failed, target_len=cfg.target_len, runs=results.table_path(runs_dir, "runs"))


def show(result: pd.DataFrame) -> int:
    table = Table(title=f"children at {result.attrs['target_len']} tokens")
    columns = {"run": "run_id", "parent": "parent", "method": "method", "steps": "steps", "tokens": "tokens",
               "seconds": "train_seconds", "val loss": "final_val_loss", "status": "status"}
    for col in columns:
        table.add_column(col)
    for r in result.attrs["rows"]:
        table.add_row(*(str(r.get(key, "") if r.get(key) is not None else "") for key in columns.values()))
    console.print(table)
    failed = result.attrs["failed"]
    if failed:
        say(f"fine-tuning failed for {', '.join(failed)} (recorded as failed in {result.attrs['runs']}); the other "
            "children completed")
        return 1
    return 0
