"""Grids on a cluster: `run --shard auto`, `posbench submit` (scripts, refusals), a real signal to a
real training process, and, marked `slurm`, a tiny grid through a real Slurm (scripts/local_slurm.sh;
.ci/run starts one): merged shards equal the one-process grid row for row, a failing shard is
named, and shards stopped as by a time limit or a preemption are requeued and resume bit-exactly."""

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import TINY_TASK
from posbench import results
from posbench.cli import main
from posbench.errors import PosbenchError
from posbench.grid import ARRAY_VARIABLES, parse_shard
from posbench.runs import FINAL

pytestmark = pytest.mark.slow  # end to end: the fast tier (-m 'not slow') leaves it out

ROOT = Path(__file__).parents[1]

TASK = """
version = 1
name = "tiny"
schemes = ["none", "rope"]
seeds = [0]
""" + TINY_TASK.replace("d_model = 32", "d_model = 16").replace("steps = 4", "steps = 12\ncheckpoint_interval = 2") + """
[speed]
lengths = [32]
heads = 2
head_dim = 8
repeats = 2
"""

# Columns that hold timings and dates: everything else must match bit for bit.
TIMINGS = {"created", "train_seconds", "tokens_per_second", "model_flops_per_second", "mfu", "seconds"}
TABLES = ("runs", "extrapolation", "windows", "positions", "effective_length")


@pytest.fixture(scope="module")
def task_file(corpus_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("task") / "tiny.toml"
    path.write_text(TASK.format(corpus=corpus_dir))
    return path


@pytest.fixture(scope="module")
def one_process(task_file, tmp_path_factory):
    """The grid run in one process, as `posbench run` runs it."""
    out = tmp_path_factory.mktemp("one") / "out"
    assert main(["run", str(task_file), "--out", str(out), "--device", "cpu", "--no-speed"]) == 0
    return out


@pytest.fixture
def same_threads(monkeypatch):
    """Processes started by a test (shards, their resumptions) use this process's number of
    threads: a reduction over another number of threads may round differently."""
    monkeypatch.setenv("OMP_NUM_THREADS", str(torch.get_num_threads()))


def outcome(directory: Path) -> dict:
    """Every row of the result tables and every run's final weights and training log (in the
    folder or, merged shards, in their folders), timings aside."""
    tables = {
        table: sorted(tuple(sorted((k, v) for k, v in r.items() if k not in TIMINGS))
                      for r in results.read_rows(results.table_path(directory, table)))
        for table in TABLES
    }
    for run in sorted(p.parent for p in directory.rglob(FINAL)):
        tables[run.name] = ({k: v.tolist() for k, v in load_file(str(run / FINAL)).items()},
                            [{k: v for k, v in r.items() if k not in TIMINGS}
                             for r in results.read_rows(run / "log.csv")])
    return tables


def assert_same(merged: Path, one: Path):
    a, b = outcome(merged), outcome(one)
    assert a.keys() == b.keys() and len(a) == len(TABLES) + 2  # the tables and 2 runs
    for name in a:
        assert a[name] == b[name], name
    assert len(a["runs"]) == 2 and len(a["extrapolation"]) == 4


# --- --shard auto ----------------------------------------------------------------------------------

def array(index, low, step, count) -> dict[str, str]:
    return dict(zip(ARRAY_VARIABLES, map(str, (index, low, step, count))))


@pytest.mark.parametrize("env, shard", [
    (array(1, 1, 1, 4), (1, 4)), (array(4, 1, 1, 4), (4, 4)),  # --array=1-4
    (array(0, 0, 1, 3), (1, 3)), (array(2, 0, 1, 3), (3, 3)),  # --array=0-2
    (array(7, 3, 2, 3), (3, 3)),                               # --array=3-7:2
])
def test_shard_auto_from_the_array_variables(env, shard):
    assert parse_shard("auto", env) == shard


@pytest.mark.parametrize("env, message", [
    ({}, "not one .*SLURM_ARRAY_TASK_ID is not set"),
    (array(5, 1, 1, 4), "array task 5 is not one of the 4 tasks from 1 in steps of 1"),
    (array(4, 3, 2, 3), "array task 4 is not one of the 3 tasks from 3 in steps of 2"),
    (array("x", 1, 1, 4), "must be integers"),
])
def test_shard_auto_outside_an_array_is_refused(env, message):
    with pytest.raises(PosbenchError, match=message):
        parse_shard("auto", env)


def test_run_shard_auto_outside_an_array_is_one_line(task_file, tmp_path, monkeypatch, capsys):
    for name in ARRAY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert main(["run", str(task_file), "--shard", "auto", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "--shard auto" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


# --- posbench submit without a cluster -------------------------------------------------------------

def test_submit_dry_run_prints_an_array_and_a_merge_job(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["submit", "quick", "--shards", "2", "--dry-run", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    array, merge = out / "slurm" / "shards.sbatch", out / "slurm" / "merge.sbatch"
    assert f"# {array}\n{array.read_text()}" in text and f"# {merge}\n{merge.read_text()}" in text
    for line in ("#SBATCH --array=1-2", f"#SBATCH --output={out}/slurm/logs/shard-%a.log", "#SBATCH --requeue",
                 "#SBATCH --signal=B:USR1@120", "#SBATCH --open-mode=append",
                 f"{sys.executable} -m posbench run {out}/slurm/quick.toml --shard $SLURM_ARRAY_TASK_ID/2 "
                 f"--resume --out {out}/shards/$SLURM_ARRAY_TASK_ID &"):
        assert line in array.read_text().splitlines()
    assert "#SBATCH --kill-on-invalid-dep=yes" in merge.read_text()
    assert (f"{sys.executable} -m posbench report {out} --merge {out}/shards/1 --merge {out}/shards/2 "
            "--tolerance 0.1 --threshold 0.5") in merge.read_text()
    assert f"sbatch --parsable --dependency=afterok:ARRAY_JOB_ID {merge}" in text
    assert (out / "slurm" / "quick.toml").read_text() == (ROOT / "tasks" / "quick.toml").read_text()
    for script in (array, merge):
        assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    assert not (out / "shards").exists()


def test_submit_resources_become_directives(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["submit", "quick", "--shards", "3", "--dry-run", "--out", str(out), "--gpus-per-shard", "4",
                 "--cpus-per-shard", "16", "--time", "4:00:00", "--partition", "gpu",
                 "--sbatch-arg", "--account=lab", "--sbatch-arg=--qos=long"]) == 0
    array = (out / "slurm" / "shards.sbatch").read_text().splitlines()
    merge = (out / "slurm" / "merge.sbatch").read_text().splitlines()
    asked = ["#SBATCH --time=4:00:00", "#SBATCH --partition=gpu", "#SBATCH --account=lab", "#SBATCH --qos=long"]
    assert set(asked + ["#SBATCH --cpus-per-task=16", "#SBATCH --gres=gpu:4"]) <= set(array)
    assert set(asked) <= set(merge) and not any("gres" in line or "cpus" in line for line in merge)
    assert any(line.startswith(f"{sys.executable} -m torch.distributed.run --standalone --nproc_per_node=4 "
                               "-m posbench run") for line in array)


@pytest.mark.parametrize("args, message", [
    (["--shards", "0"], "--shards must be between 1 and the grid's 6 runs, got 0"),
    (["--shards", "7"], "--shards must be between 1 and the grid's 6 runs, got 7"),
    (["--shards", "2", "--gpus-per-shard", "-1"], "--gpus-per-shard must be >= 0"),
    (["--shards", "2", "--sbatch-arg", "account=lab"], "bad --sbatch-arg 'account=lab'"),
    (["--shards", "2", "--time", "4 h"], "bad --time '4 h'"),
    (["--shards", "2", "--time", "abc"], "bad --time 'abc': Slurm takes minutes, MM:SS, HH:MM:SS, D-HH"),
    (["--shards", "2", "--time=-5"], "bad --time '-5'"),
    (["--shards", "2", "--time", "1:2:3:4"], "bad --time '1:2:3:4'"),
    (["--shards", "2", "--sbatch-arg=-A lab"], "bad --sbatch-arg '-A lab': one long sbatch option"),
    (["--shards", "2", "--sbatch-arg=--comment=a;b"], "bad --sbatch-arg '--comment=a;b'"),
    (["--shards", "2", "--sbatch-arg=--comment=$(id)"], "bad --sbatch-arg '--comment=$(id)'"),
    (["--shards", "2", "--sbatch-arg=--qos=long\n#SBATCH --x"], "bad --sbatch-arg"),
    (["--shards", "2"], "sbatch is not on PATH"),
])
def test_submit_refusals_are_one_line_and_submit_nothing(tmp_path, monkeypatch, capsys, args, message):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no sbatch: nothing can be submitted
    assert main(["submit", "quick", "--out", str(tmp_path / "out"), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("time_limit", ["90", "30:00", "4:00:00", "2-00", "2-04:30", "2-04:30:00", "UNLIMITED"])
def test_submit_takes_every_slurm_time_format(time_limit, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["submit", "quick", "--shards", "2", "--dry-run", "--out", str(out), "--time", time_limit]) == 0
    assert f"#SBATCH --time={time_limit}" in (out / "slurm" / "shards.sbatch").read_text().splitlines()


def fake_sbatch(tmp_path: Path, monkeypatch, *answers: str) -> Path:
    """An sbatch on PATH that prints answers[k] at its k-th call and logs its arguments."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "sbatch-calls"
    bin_dir.mkdir()
    script = bin_dir / "sbatch"
    cases = "\n".join(f"  {k}) echo {shlex.quote(answer)} ;;" for k, answer in enumerate(answers, 1))
    script.write_text(f"""#!/bin/bash
echo "$*" >> {calls}
case $(wc -l < {calls}) in
{cases}
esac
""")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return calls


def test_submit_parses_the_job_id_and_makes_the_merge_wait_for_it(tmp_path, monkeypatch, capsys):
    calls = fake_sbatch(tmp_path, monkeypatch, "4242;cluster1", "4243")
    assert main(["submit", "quick", "--shards", "2", "--out", str(tmp_path / "out")]) == 0
    array, merge = calls.read_text().splitlines()
    assert array.startswith("--parsable ") and merge.startswith("--parsable --dependency=afterok:4242 ")
    assert "merge: job 4243" in capsys.readouterr().out


@pytest.mark.parametrize("answer", ["Submitted batch job 4242", "site policy: jobs over 2 days are held", "4242 x"])
def test_submit_without_a_job_id_is_one_line_and_submits_no_merge(answer, tmp_path, monkeypatch, capsys):
    calls = fake_sbatch(tmp_path, monkeypatch, answer, "4243")
    assert main(["submit", "quick", "--shards", "2", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [f"error: sbatch answered {answer!r} for the shards, not a job id (sbatch "
                                        "--parsable prints ID or ID;CLUSTER): nothing further submitted; see "
                                        "squeue --me for what it queued"]
    assert len(calls.read_text().splitlines()) == 1  # the array only: no merge job


def test_submit_an_invalid_task_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text('version = 1\nschemes = ["rpoe"]\n')
    for task in ("quikc", str(bad)):
        assert main(["submit", task, "--shards", "2", "--out", str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err
        assert "did you mean" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


# --- a real signal to a real training process --------------------------------------------------------

# Every training step of a process running this takes at least {seconds} s more (a bigger model's
# pace), so that a signal reliably lands mid-training; the numbers are those of the plain command.
SLOW_STEPS = """
import time
import torch
plain_step = torch.optim.AdamW.step
def slow_step(self, *args, **kwargs):
    time.sleep({seconds})
    return plain_step(self, *args, **kwargs)
torch.optim.AdamW.step = slow_step
"""


def posbench_child(step_seconds: float, *args: str) -> subprocess.Popen:
    """`posbench ARGS` in a child process with slow training steps."""
    code = SLOW_STEPS.format(seconds=step_seconds) + "import sys\nfrom posbench import cli\nsys.exit(cli.main(sys.argv[1:]))\n"
    return subprocess.Popen([sys.executable, "-c", code, *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def wait_for(condition, what: str, timeout: float = 120.0):
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_sigterm_checkpoints_and_the_resumed_grid_equals_one_process(task_file, one_process, tmp_path,
                                                                    same_threads):
    """As a preempted shard: SIGTERM mid-training, then `--resume` (SIGUSR1 alike: test_faults.py)."""
    out = tmp_path / "out"
    run = ["run", str(task_file), "--out", str(out), "--device", "cpu", "--no-speed"]
    child = posbench_child(0.05, *run)
    wait_for(lambda: any(out.glob("*/checkpoint.safetensors")), "the first checkpoint")
    child.send_signal(signal.SIGTERM)
    _, err = child.communicate(timeout=120)
    assert child.returncode == 130, err
    assert "SIGTERM: finishing this step" in err and "interrupted: " in err and "checkpointed at step" in err
    assert not any(out.glob(f"*/{FINAL}"))
    resumed = posbench_child(0, *run, "--resume")
    assert resumed.wait(timeout=300) == 0, resumed.stderr.read()
    assert_same(out, one_process)


# --- through a real Slurm ----------------------------------------------------------------------------

def slurm_missing() -> str | None:
    if shutil.which("sbatch") is None:
        return "sbatch is not on PATH (scripts/local_slurm.sh start DIR starts a local Slurm)"
    if subprocess.run(["scontrol", "ping"], capture_output=True, timeout=60).returncode:
        return "no Slurm controller answers `scontrol ping` (is SLURM_CONF set?)"
    return None


@pytest.fixture
def slurm(same_threads):
    """A Slurm to submit to; POSBENCH_REQUIRE_SLURM=1 (CI) makes its absence a failure."""
    reason = slurm_missing()
    if reason and os.environ.get("POSBENCH_REQUIRE_SLURM") == "1":
        pytest.fail(f"POSBENCH_REQUIRE_SLURM=1 but {reason}")
    if reason:
        pytest.skip(reason)


def submit(task_file: Path, out: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "posbench", "submit", str(task_file), "--shards", "2",
                           "--out", str(out), *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.mark.slurm
def test_two_shards_through_slurm_equal_the_one_process_grid(slurm, task_file, one_process, tmp_path):
    out = tmp_path / "out"
    done = submit(task_file, out, "--wait")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "shards: job" in done.stdout and f"report: {out / 'report.md'}" in done.stdout
    assert_same(out, one_process)
    assert "## Extrapolation" in (out / "report.md").read_text()
    assert [(out / "slurm" / "logs" / f"{name}.exit").read_text() for name in ("shard-1", "shard-2", "merge")] == ["0\n"] * 3


@pytest.mark.slurm
def test_a_failing_shard_is_named_and_nothing_is_merged(slurm, task_file, tmp_path):
    out = tmp_path / "out"
    (out / "shards").mkdir(parents=True)
    (out / "shards" / "2").write_text("a file where shard 2 writes its folder")
    done = submit(task_file, out, "--wait")
    assert done.returncode == 1, done.stdout + done.stderr
    log = out / "slurm" / "logs" / "shard-2.log"
    assert f"error: shard 2: exit status 2; log {log}" in done.stderr and "shard 1" not in done.stderr
    assert "is not a directory" in log.read_text()
    assert not (out / "report.md").exists()  # the merge job was cancelled


def release(job: str):
    """Start a requeued job now: Slurm holds it back for about 2 min (BeginTime) first."""
    def held() -> bool:
        state = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T %r"], capture_output=True, text=True)
        return state.stdout.split() == ["PENDING", "BeginTime"]

    wait_for(held, f"job {job} requeued")
    subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=True, capture_output=True)


@pytest.mark.slurm
def test_shards_stopped_by_time_limit_and_preemption_are_requeued_and_resume(slurm, task_file, one_process,
                                                                             tmp_path, monkeypatch):
    # Training steps take 0.1 s more in the shards (SLOW_STEPS as sitecustomize), so that both
    # signals land mid-training.
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SLOW_STEPS.format(seconds=0.1))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(hook), os.environ.get("PYTHONPATH", "")]))
    out = tmp_path / "out"
    waiting = subprocess.Popen([sys.executable, "-m", "posbench", "submit", str(task_file), "--shards", "2",
                                "--out", str(out), "--wait"], cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    job = waiting.stdout.readline().split()[2]  # "shards: job ID (array 1-2), ..."
    for shard in ("1", "2"):
        wait_for(lambda: any((out / "shards" / shard).glob("*/checkpoint.safetensors")), f"shard {shard} training")
    # Shard 1 as near its time limit: USR1 to the batch shell, which requeues the task itself.
    subprocess.run(["scancel", "--batch", "--signal=USR1", f"{job}_1"], check=True)
    # Shard 2 as preempted: Slurm sends SIGTERM to the job's processes and requeues it.
    subprocess.run(["scontrol", "requeue", f"{job}_2"], check=True, capture_output=True)
    for shard in ("1", "2"):
        release(f"{job}_{shard}")
    stdout, stderr = waiting.communicate(timeout=600)
    assert waiting.returncode == 0, stdout + stderr
    logs = {shard: (out / "slurm" / "logs" / f"shard-{shard}.log").read_text() for shard in ("1", "2")}
    assert "time limit near: requeued" in logs["1"] and "SIGTERM: finishing this step" in logs["1"]
    assert "DUE TO JOB REQUEUE" in logs["2"] and "SIGTERM: finishing this step" in logs["2"]
    assert all("checkpointed at step" in log and ", restart 1" in log for log in logs.values())
    assert_same(out, one_process)


def test_wait_drains_a_task_requeued_after_sbatch_returned(monkeypatch):
    """sbatch --wait may return while a requeued task is pending again: Submission waits until
    squeue no longer lists the job (then an invalid id), polling."""
    from posbench import cluster

    answers = iter([(0, "12_1\n"), (0, "12_1\n"), (0, ""), (1, ""), (1, "")])
    calls = []

    def fake_run(cmd, **kw):
        calls.append(cmd)
        rc, out = next(answers)
        return subprocess.CompletedProcess(cmd, rc, out, "")

    monkeypatch.setattr(cluster.subprocess, "run", fake_run)
    monkeypatch.setattr(cluster.time, "sleep", lambda s: None)
    assert cluster.Submission._drain("12") is True and len(calls) == 3
    assert cluster.Submission._drain("13") is False and calls[-1][:4] == ["squeue", "-h", "-j", "13"]
