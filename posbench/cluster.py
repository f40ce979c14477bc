"""`posbench submit TASK --shards N`: a grid on a Slurm cluster, as a job array of shards (task I
runs `posbench run TASK --shard I/N --resume` into its own folder) and a merge job that starts
once every shard succeeded (`--dependency=afterok`) and runs `posbench report OUT --merge ...`.

Everything goes under the output folder OUT:

    OUT/slurm/TASK.toml           the task as submitted: every shard, and a rerun, runs this grid
    OUT/slurm/shards.sbatch       the array script; OUT/slurm/merge.sbatch the merge job
    OUT/slurm/logs/shard-I.log    shard I's output (appended across requeues)
    OUT/slurm/logs/shard-I.exit   shard I's exit status, written when it ends
    OUT/slurm/logs/merge.log      the merge job's output (and merge.exit)
    OUT/shards/I/                 shard I's results
    OUT/                          the merged tables and report.md

Preemption and time limits: shards are submitted `--requeue` and `--signal=B:USR1@120`. Slurm
sends SIGTERM to every process of a preempted or cancelled job; the array script's shell gets
SIGUSR1 two minutes before the time limit and passes it on as SIGTERM (which torchrun, too,
forwards to its workers). Training checkpoints at the end of its step and stops
(posbench.training._interrupt_at_step_end); after SIGUSR1 the shell requeues its own array task, which
resumes from the checkpoints. A shard's exit status is written to a file because Slurm keeps a
finished job's record only briefly and without an accounting database not at all.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

from posbench import config, plugins
from posbench.errors import PosbenchError
from posbench.grid import grid

# Seconds between SIGUSR1 and the time limit: time to finish a training step and write a
# checkpoint of a GPU-sized model, well inside the 2 min that clusters commonly allow for this.
SIGNAL_LEAD = 120
# sbatch --time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS, or no limit
SLURM_TIME = re.compile(r"\d+(:\d+){0,2}|\d+-\d+(:\d+){0,2}|UNLIMITED|INFINITE", re.I)
# An --sbatch-arg: a long option written as an #SBATCH line, which sbatch reads without a shell,
# so a quote, space or shell metacharacter would reach Slurm verbatim (or end the line).
SBATCH_OPTION = re.compile(r"--[A-Za-z][A-Za-z0-9-]*(=[^\s;&|<>()`$\\'\"]+)?")
# What sbatch --parsable prints at submission: the job id, or "ID;CLUSTER" on a federation.
PARSABLE = re.compile(r"(\d+)(;[\w.-]+)?")


@dataclass(frozen=True)
class Resources:
    """What each shard asks of Slurm; None leaves the cluster's default."""

    gpus: int = 0
    cpus: int | None = None
    time: str | None = None
    partition: str | None = None
    sbatch_args: tuple[str, ...] = ()

    def __post_init__(self):
        if self.gpus < 0:
            raise PosbenchError(f"--gpus-per-shard must be >= 0, got {self.gpus}")
        if self.cpus is not None and self.cpus < 1:
            raise PosbenchError(f"--cpus-per-shard must be >= 1, got {self.cpus}")
        if self.time is not None and not SLURM_TIME.fullmatch(self.time):
            raise PosbenchError(f"bad --time {self.time!r}: Slurm takes minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or "
                                "D-HH:MM:SS (e.g. 90, 4:00:00, 2-00), or UNLIMITED")
        if self.partition is not None and (not self.partition.strip() or any(c.isspace() for c in self.partition)):
            raise PosbenchError(f"bad --partition {self.partition!r}: one word, e.g. gpu")
        for arg in self.sbatch_args:
            if not SBATCH_OPTION.fullmatch(arg):
                raise PosbenchError(f"bad --sbatch-arg {arg!r}: one long sbatch option, --NAME or --NAME=VALUE "
                                    "(e.g. --account=lab), without spaces, quotes or any of ; & | < > ( ) ` $ \\")

    def directives(self, shard: bool) -> list[str]:
        """#SBATCH lines of a shard, or of the merge job (which needs neither GPUs nor cores)."""
        lines = [f"--cpus-per-task={self.cpus}"] if self.cpus is not None and shard else []
        lines += [f"--gres=gpu:{self.gpus}"] if self.gpus and shard else []
        lines += [f"--time={self.time}"] if self.time is not None else []
        lines += [f"--partition={self.partition}"] if self.partition is not None else []
        return [f"#SBATCH {line}" for line in [*lines, *self.sbatch_args]]


def _q(path: Path | str) -> str:
    return shlex.quote(str(path))


def _pattern(path: Path) -> str:
    """A path as a literal in sbatch's --output, where %a and the like are replaced."""
    return str(path).replace("%", "%%")


@dataclass(frozen=True)
class Plan:
    """One submission: the grid of `task` (read from `source`) cut into `shards`, results under
    `out`, run by `python` (the interpreter of this process, so shards run in the same
    virtualenv) from the folder `workdir` (where relative data paths of the task resolve)."""

    task: config.Task
    source: Path
    shards: int
    out: Path
    workdir: Path
    resources: Resources = Resources()
    python: str = sys.executable

    @property
    def folder(self) -> Path:
        return self.out / "slurm"

    @property
    def task_file(self) -> Path:
        return self.folder / f"{self.source.stem}.toml"

    @property
    def array_script(self) -> Path:
        return self.folder / "shards.sbatch"

    @property
    def merge_script(self) -> Path:
        return self.folder / "merge.sbatch"

    @property
    def logs(self) -> Path:
        return self.folder / "logs"

    def shard_dir(self, i: int | str) -> Path:
        return self.out / "shards" / str(i)

    def log(self, name: str) -> Path:
        """The output of `shard-I` or `merge`."""
        return self.logs / f"{name}.log"

    def exit_file(self, name: str) -> Path:
        return self.logs / f"{name}.exit"

    def posbench(self) -> str:
        """The command that starts posbench in a shard: torchrun with one process per GPU when a
        shard has several (posbench.training trains data-parallel under it)."""
        python = _q(self.python)
        if self.resources.gpus > 1:
            return f"{python} -m torch.distributed.run --standalone --nproc_per_node={self.resources.gpus} -m posbench"
        return f"{python} -m posbench"

    @property
    def job_name(self) -> str:
        return "-".join(["posbench", *self.task.name.split()])

    def array_text(self) -> str:
        i = "$SLURM_ARRAY_TASK_ID"
        return "\n".join([
            "#!/bin/bash",
            f"#SBATCH --job-name={self.job_name}",
            f"#SBATCH --array=1-{self.shards}",
            f"#SBATCH --output={_pattern(self.logs)}/shard-%a.log",
            "#SBATCH --open-mode=append",
            f"#SBATCH --chdir={self.workdir}",
            "#SBATCH --requeue",
            f"#SBATCH --signal=B:USR1@{SIGNAL_LEAD}",
            *self.resources.directives(shard=True),
            f"# posbench task {self.task.name}: shard I of {self.shards} (I = the array task) into "
            f"{self.shard_dir('I')}. One shard again:",
            f"# sbatch --array=I {self.array_script} (the shard is named here, not by --shard auto, so",
            "# that a one-task array still runs shard I of N).",
            f'echo "posbench shard {i}/{self.shards} on $(hostname), $(date), restart ${{SLURM_RESTART_COUNT:-0}}"',
            'caught=""',
            "# Near the time limit only this shell gets USR1: stop training at a step end, then requeue.",
            "# SIGTERM (preemption, scancel) reaches every process of the job by itself.",
            "trap 'caught=USR1; kill -TERM \"$child\" 2>/dev/null' USR1",
            "trap 'caught=TERM' TERM",
            f"{self.posbench()} run {_q(self.task_file)} --shard {i}/{self.shards} --resume "
            f"--out {_q(self.out / 'shards')}/{i} &",
            "child=$!",
            'while ! wait "$child" && kill -0 "$child" 2>/dev/null; do :; done  # a trap ends a wait early',
            'wait "$child"; status=$?',
            'if [ "$caught" = USR1 ] && [ "$status" -ne 0 ]; then',
            '    echo "time limit near: requeued; the shard resumes from its checkpoints"',
            '    scontrol requeue "${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"',
            "    # Slurm ends this run as it requeues it: ending it first may let the task count as done.",
            "    # Its SIGTERM would end the sleep at once, so the shell and the sleep ignore TERM and",
            "    # wait for the SIGKILL that follows (KillWait).",
            "    trap '' TERM",
            "    sleep 300",
            "    exit 1",
            "fi",
            f'echo "$status" > {_q(self.logs)}/shard-{i}.exit',
            'exit "$status"',
            "",
        ])

    def merge_text(self) -> str:
        shards = " ".join(f"--merge {_q(self.shard_dir(i))}" for i in range(1, self.shards + 1))
        e = self.task.eval
        return "\n".join([
            "#!/bin/bash",
            f"#SBATCH --job-name={self.job_name}-merge",
            f"#SBATCH --output={_pattern(self.log('merge'))}",
            f"#SBATCH --chdir={self.workdir}",
            # Cancelled, not left pending for ever, when a shard fails (afterok can never be met).
            "#SBATCH --kill-on-invalid-dep=yes",
            *self.resources.directives(shard=False),
            f"# posbench task {self.task.name}: the {self.shards} shards' tables merged into {self.out}",
            f"{_q(self.python)} -m posbench report {_q(self.out)} {shards} "
            f"--tolerance {e.effective_tolerance} --threshold {e.effective_threshold}",
            "status=$?",
            f'echo "$status" > {_q(self.exit_file("merge"))}',
            'exit "$status"',
            "",
        ])

    def sbatch_array(self, wait: bool = False) -> list[str]:
        return ["sbatch", "--parsable", *(["--wait"] if wait else []), str(self.array_script)]

    def sbatch_merge(self, array_id: str, wait: bool = False) -> list[str]:
        return ["sbatch", "--parsable", *(["--wait"] if wait else []), f"--dependency=afterok:{array_id}",
                str(self.merge_script)]

    def write(self) -> None:
        """The frozen task, both scripts and the log folder. Exit files of an earlier submission
        into the same folder are removed, so that they cannot speak for this one."""
        self.logs.mkdir(parents=True, exist_ok=True)
        if self.source.resolve() != self.task_file.resolve():  # a rerun from the frozen copy
            freeze_task(self.source, self.task_file, plugins.command_line())
        self.array_script.write_text(self.array_text())
        self.merge_script.write_text(self.merge_text())
        for old in self.logs.glob("*.exit"):
            old.unlink()


def freeze_task(source: Path, dest: Path, extra_plugins: list[str]) -> None:
    """Copy task file `source` to `dest` with a frozen copy of each of its plug-in files (and of
    those given with --plugin) in dest's folder plugins/, so that an edit made while the shards
    wait in the queue changes nothing of this submission. Module plug-ins stay as names."""
    text = source.read_text()
    raw = tomllib.loads(text)
    specs = [*(str(plugins.resolve(s, source.parent)) for s in raw.get("plugins", [])), *extra_plugins]
    if not specs:
        shutil.copyfile(source, dest)
        return
    frozen = []
    for spec in dict.fromkeys(specs):
        resolved = plugins.resolve(spec)
        if isinstance(resolved, Path):
            copy = dest.parent / "plugins" / f"{plugins.sha256_of(resolved)[:12]}-{resolved.name}"
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(resolved, copy)
            frozen.append(copy.relative_to(dest.parent).as_posix())
        else:
            frozen.append(resolved)
    # One top-level `plugins = [...]` at the head of the file (before any table), the old one gone.
    body = re.sub(r"^plugins\s*=\s*\[[^\]]*\][ \t]*(#[^\n]*)?$", "", text, count=1, flags=re.M)
    out = f"plugins = {json.dumps(frozen)}\n{body}"
    new = tomllib.loads(out)
    if new.get("plugins") != frozen or {**new, "plugins": None} != {**raw, "plugins": None}:
        raise PosbenchError(f"{source}: cannot freeze its plugins list; write it on one line as "
                            "plugins = [\"a.py\", ...]")
    dest.write_text(out)


def plan(task_name: str, shards: int, out: Path | None, resources: Resources, dry_run: bool) -> Plan:
    """Check everything a submission needs before anything is written: the task validates, the
    grid has at least `shards` runs, and sbatch is on PATH (unless only printing)."""
    task = config.load_task(task_name)
    runs = len(grid(task))
    if not 1 <= shards <= runs:
        raise PosbenchError(f"--shards must be between 1 and the grid's {runs} runs, got {shards}")
    if not dry_run and shutil.which("sbatch") is None:
        raise PosbenchError("sbatch is not on PATH: submit from a Slurm login node (or --dry-run to "
                            "see the scripts)")
    out = (out or Path("runs") / task.name).absolute()
    for path in (out, Path.cwd()):
        if any(c.isspace() for c in str(path)):
            raise PosbenchError(f"{str(path)!r} holds a space, which #SBATCH lines cannot; use another folder")
    return Plan(task, config.find_task(task_name).absolute(), shards, out, Path.cwd(), resources)


class Submission:
    """The array and the merge job of a plan, submitted; with `wait`, each sbatch stays until its
    job ended (see `wait`)."""

    def __init__(self, p: Plan, wait: bool):
        self.plan = p
        self.array = self._submit(p.sbatch_array(wait))
        self.array_id = self._job_id(self.array, "the shards")
        self.merge = self._submit(p.sbatch_merge(self.array_id, wait))
        try:
            self.merge_id = self._job_id(self.merge, "the merge job")
        except PosbenchError as e:
            subprocess.run(["scancel", self.array_id], check=False)
            raise PosbenchError(f"{e}; cancelled the shards (job {self.array_id})") from None

    @staticmethod
    def _submit(command: list[str]) -> subprocess.Popen:
        return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    @staticmethod
    def _job_id(process: subprocess.Popen, what: str) -> str:
        # sbatch --parsable prints "ID" or "ID;CLUSTER" at submission, before any --wait.
        line = process.stdout.readline().strip()
        if not line:
            process.wait()
            lines = process.stderr.read().strip().splitlines() or ["no job id printed"]
            raise PosbenchError(f"sbatch refused {what}: {lines[-1]}")
        parsed = PARSABLE.fullmatch(line)
        if parsed is None:
            if process.poll() is None:
                process.terminate()  # a --wait for a job whose id is unknown: stop waiting
            raise PosbenchError(f"sbatch answered {line!r} for {what}, not a job id (sbatch --parsable prints ID or "
                                "ID;CLUSTER): nothing further submitted; see squeue --me for what it queued")
        return parsed[1]

    def wait(self) -> list[str]:
        """Wait for the array (sbatch --wait exits with its worst task's status), then for the
        merge. The merge's own exit status says nothing when a shard failed: Slurm cancels it and
        its sbatch --wait still exits 0. Returns what failed, one line each."""
        self.array.communicate()
        # a task still queued after sbatch --wait returned was requeued: its status then is its
        # exit file's, and sbatch's code (of the run that requeued) says nothing
        worst = 0 if self._drain(self.array_id) else self.array.returncode
        failed = [f"shard {i}: {self._ended(f'shard-{i}')}; log {self.plan.log(f'shard-{i}')}"
                  for i in range(1, self.plan.shards + 1) if self._status(f"shard-{i}") != "0"]
        if worst and not failed:
            failed.append(f"the array job {self.array_id} exited {worst}; logs in {self.plan.logs}")
        self.merge.communicate()
        self._drain(self.merge_id)
        if not failed and self._status("merge") != "0":
            failed.append(f"merge job: {self._ended('merge')}; log {self.plan.log('merge')}")
        return failed

    @staticmethod
    def _drain(job: str, poll: float = 2.0) -> bool:
        """Wait until no task of `job` is queued or running: sbatch --wait can return while a task
        that requeued itself near its time limit waits to start again (1 in 8 test runs). Whether
        it had to wait."""
        waited = False
        while True:
            queued = subprocess.run(["squeue", "-h", "-j", job, "-o", "%i"], capture_output=True,
                                    text=True, check=False)
            if queued.returncode != 0 or not queued.stdout.strip():
                return waited  # ended (squeue forgets a job MinJobAge after it ends: an invalid id)
            waited = True
            time.sleep(poll)

    def _status(self, name: str) -> str | None:
        path = self.plan.exit_file(name)
        return path.read_text().strip() if path.exists() else None

    def _ended(self, name: str) -> str:
        status = self._status(name)
        return "no exit status (killed, or never ran)" if status is None else f"exit status {status}"
