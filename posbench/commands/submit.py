"""posbench submit: a grid on a Slurm cluster, a job array of shards and a merge job."""

import shlex
from pathlib import Path
from typing import Annotated, List, Optional

import typer

from posbench.commands import err, plain, say
from posbench.commands.options import Out

# its line in posbench/docs/commands.md, and the pages that explain it
SUMMARY = "a grid as a Slurm job array plus a merge job"
PAGES = ('cluster.md',)


def submit(
    task: Annotated[str, typer.Argument(help="task name in tasks/ or a TOML path")],
    *,
    shards: Annotated[int, typer.Option(help="number of shards: array tasks, one slice of the grid each")],
    out: Out = None,
    gpus_per_shard: Annotated[int, typer.Option(help="GPUs per shard; more than 1: torchrun, one process per GPU")] = 0,
    cpus_per_shard: Annotated[Optional[int], typer.Option(help="CPU cores per shard (default: the cluster's)")] = None,
    time_limit: Annotated[Optional[str], typer.Option(
        "--time", help="time limit per shard in a Slurm format: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS "
                       "(e.g. 4:00:00) or UNLIMITED")] = None,
    partition: Annotated[Optional[str], typer.Option(help="Slurm partition")] = None,
    sbatch_arg: Annotated[Optional[List[str]], typer.Option(
        help="extra sbatch option, e.g. --account=lab (repeatable): --NAME or --NAME=VALUE, no spaces, quotes or "
             "; & | < > ( ) ` $ \\")] = None,
    dry_run: Annotated[bool, typer.Option(help="write and print the scripts; submit nothing")] = False,
    wait: Annotated[bool, typer.Option(help="wait for the shards and the merge; exit 1 naming failed shards")] = False,
    log=None,
) -> dict:
    """Run a grid on a Slurm cluster: a job array of shards (each resumable, requeued on
    preemption) and a merge job that writes the report once all succeeded (--out, default
    runs/TASK).

    Returns the plan, and unless --dry-run the submission and the failed shards; `log` hears where
    the jobs and their logs are as soon as they are submitted, before any wait."""
    from posbench import cluster

    resources = cluster.Resources(gpus=gpus_per_shard, cpus=cpus_per_shard, time=time_limit,
                                  partition=partition, sbatch_args=tuple(sbatch_arg or ()))
    plan = cluster.plan(task, shards, out, resources, dry_run)
    plan.write()
    if dry_run:
        return {"plan": plan, "dry_run": True}
    job = cluster.Submission(plan, wait)
    for line in submitted(plan, job):
        (log or (lambda m: None))(line)
    return {"plan": plan, "job": job, "wait": wait, "failed": job.wait() if wait else []}


def submitted(plan, job) -> list[str]:
    """Where the shards and the merge job are, their logs and results."""
    return [f"shards: job {job.array_id} (array 1-{plan.shards}), logs {plan.logs}/shard-I.log, results "
            f"{plan.out}/shards/I",
            f"merge: job {job.merge_id} after all shards succeed, log {plan.log('merge')}, report "
            f"{Path(plan.out) / 'report.md'}"]


def show(result: dict) -> int:
    plan = result["plan"]
    if result.get("dry_run"):
        for path in (plan.array_script, plan.merge_script):
            print(f"# {path}\n{path.read_text()}")
        print(f"# submitted by: {shlex.join(plan.sbatch_array())}")
        print(f"#          and: {shlex.join(plan.sbatch_merge('ARRAY_JOB_ID'))}")
        return 0
    job = result["job"]
    if not result["wait"]:
        plain(f"watch: squeue -j {job.array_id},{job.merge_id}")
        return 0
    for line in result["failed"]:
        say(line)
    if result["failed"]:
        err.print(f"rerun a shard: sbatch --array=I {plan.array_script}; then merge: sbatch {plan.merge_script}",
                  markup=False, highlight=False, soft_wrap=True)
        return 1
    plain(f"report: {Path(plan.out) / 'report.md'}")
    return 0
