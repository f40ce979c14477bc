"""posbench run: a whole grid (train, evaluate, probe, time, report)."""

import dataclasses
import time
from pathlib import Path
from typing import Annotated, Optional, Sequence

import pandas as pd
import typer

from posbench import config, results
from posbench.commands import console, failed, plain, say
from posbench.commands.options import Device, Out, Resume, Schemes, load_plugins, names, settings, takes
from posbench.errors import PosbenchError

# its line in posbench/docs/commands.md, and the pages that explain it
SUMMARY = "a whole task: train, evaluate, probe, time, report"
PAGES = ('cluster.md',)


@takes(config.TrainConfig, only=("compile", "tracker"))
def run(
    task: Annotated[str, typer.Argument(help="task name in tasks/ or a TOML path")],
    *,
    shard: Annotated[Optional[str], typer.Option(
        help="I/N: run a deterministic 1/N slice of the grid; auto: this Slurm array task's")] = None,
    resume: Resume = False,
    out: Out = None,
    device: Device = "auto",
    speed: Annotated[bool, typer.Option("--speed/--no-speed", help="time the attention kernels too")] = True,
    seeds: Annotated[Optional[str], typer.Option(help="seeds instead of the task's, e.g. 0,1,2 or 0-3 (same run_ids)")] = None,
    schemes: Schemes = None,
    data: Annotated[Optional[str], typer.Option(
        help="the corpus instead of the task's: pystdlib | files:PATH_OR_GLOB | hf:NAME[:CONFIG] (its runs have "
             "their own run_ids)")] = None,
    workers: Annotated[Optional[str], typer.Option(
        help="N | auto: the runs on N processes of this machine, each with its share of the cores or GPU memory "
             "(default: the task's, 1)")] = None,
    ensemble: Annotated[Optional[str], typer.Option(
        help="auto | off | N: the runs that differ only in seed trained as stacked models of at most N "
             "members, one process each (auto: every seed of a configuration on CUDA, off elsewhere; "
             "default: the task's, auto)")] = None,
    plugins: Sequence[str] = (),
    progress: bool = False,
    log=None,
    **given,
) -> dict[str, pd.DataFrame]:
    """Run a whole grid: train every scheme x seed, extrapolate, time kernels, write the report
    (--out, default runs/TASK). Exit 1 when a run failed (NaN loss, a kernel the device refused):
    the others are trained, evaluated and reported. --schemes takes the tables' labels: in a probe
    task, SCHEME+randomized is SCHEME's runs on randomized positions alone.

    Returns every table of the output folder by name; `attrs` of the runs table: what was done
    (`done`, with the failed runs' ids in `done["failed"]`), the folder (`out`) and the wall time
    (`seconds`)."""
    from posbench import grid, reporting, trackers
    from posbench import workers as pool

    began = time.perf_counter()
    load_plugins(plugins)
    t = config.load_task(task)
    if t.pretrained:
        raise PosbenchError(f"task {t.name} evaluates the pretrained model {t.pretrained} and trains nothing: "
                            f"posbench extrapolate --task {task}; posbench probe --task {task} --probe passkey")
    t = dataclasses.replace(t, train=settings(t.train, given))
    trackers.require(t.train.tracker)
    if seeds is not None or ensemble is not None:
        t = config.replace(t, seeds=None if seeds is None else config.parse_seeds(seeds),
                           ensemble=None if ensemble is None else config.check_ensemble(ensemble))
    if schemes is not None:
        t = config.only_schemes(t, names(schemes))
    if data is not None:
        t = dataclasses.replace(t, data=config.replace(t.data, spec=data))
    part = grid.parse_shard(shard)
    out_dir = Path(out or Path("runs") / t.name)
    done = pool.run_task(t, out_dir, part, resume, device, progress=progress, speed=speed,
                         log=log or (lambda m: None), workers=workers)
    reporting.write_report(out_dir, t.eval.effective_tolerance, t.eval.effective_threshold, t.eval.effective_share)
    tables = {name: pd.DataFrame(results.read_rows(results.table_path(out_dir, name)))
              for name in results.TABLES if results.table_path(out_dir, name).exists()}
    tables.setdefault("runs", pd.DataFrame())
    tables["runs"].attrs.update(done=done, out=out_dir, task=t, shard=part, seconds=time.perf_counter() - began)
    return tables


def show(tables: dict[str, pd.DataFrame]) -> int:
    from posbench import effective, reporting

    info = tables["runs"].attrs
    done, out_dir, t, part = info["done"], info["out"], info["task"], info["shard"]
    console.print(
        f"{t.name} shard {part[0]}/{part[1]}: trained {done['trained']}, skipped {done['skipped_train']} "
        f"finished; evaluated {done['evaluated']}, skipped {done['skipped_eval']}; probed {done['probes']}, "
        f"skipped {done['skipped_probes']}; speed rows {done['speed']}")
    warn_mixed_machines(out_dir)
    rows = [r for r in results.read_rows(results.table_path(out_dir, "extrapolation")) if r["mode"] == t.eval.mode]
    if rows:
        eff = reporting.effective_by_label(effective.perplexity_rows(rows, t.eval.effective_tolerance))
        console.print(reporting.ppl_table(rows, f"perplexity, {t.name}, {t.eval.mode}", eff))
    plain(f"report: {out_dir / 'report.md'}")
    minutes, rest = divmod(round(info["seconds"]), 60)
    plain(f"wall time {minutes} min {rest} s")
    if done["failed"]:
        say(f"training failed for {', '.join(done['failed'])} (recorded as failed in "
            f"{results.table_path(out_dir, 'runs')}); the other runs completed")
        return 1
    return failed(done["failed_rows"])


def warn_mixed_machines(directory: Path) -> None:
    """One line when the folder's runs were trained on machines of different kinds."""
    from posbench import machine

    line = machine.mixture(results.read_rows(results.table_path(directory, "runs")), str(directory))
    if line:
        say(line, "warning")
