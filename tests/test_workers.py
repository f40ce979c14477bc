"""`posbench run --workers N|auto`: worker processes on one machine (posbench.workers)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import TINY_TASK
from posbench import config, results, workers
from posbench.cli import main
from posbench.data import load_tokens
from posbench.errors import PosbenchError
from posbench.grid import grid, run_task

REPO = Path(__file__).resolve().parents[1]

# Four text runs and four runs on the copy probe's examples, which train longer: those go first.
TASK = """
version = 1
name = "tinyworkers"
schemes = ["none", "rope"]
seeds = [0, 1]
""" + TINY_TASK + """[probes]
names = ["copy"]
lengths = [32, 64]
trials = 2
[probes.train.copy]
train_len = 32
steps = 6
"""


@pytest.fixture(scope="module")
def task_file(corpus_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("task") / "tinyworkers.toml"
    path.write_text(TASK.format(corpus=corpus_dir))
    load_tokens(config.load_task(str(path)).data)  # the token cache, filled once for every process
    return path


def table(directory, name, columns):
    key = results.TABLES[name]["key"]
    return {tuple(r[k] for k in key): tuple(r[c] for c in columns)
            for r in results.read_rows(results.table_path(directory, name))}


RUN_COLUMNS = ("status", "steps", "tokens", "n_params", "final_train_loss", "final_val_loss", "final_val_accuracy",
               "machine")


# --- the plan: how many workers, with how many threads ----------------------------------------

def test_plan_shares_the_cores():
    auto = workers.plan("auto", "cpu", cores=2)
    assert (auto.workers, auto.threads, auto.gpus) == (2, 1, (None, None))
    assert auto.line == "workers: 2 (auto: 2 cores, 1 torch thread each)"
    three = workers.plan(3, "cpu", cores=16)
    assert (three.workers, three.threads) == (3, 5) and "5 torch threads each" in three.line
    assert workers.plan("4", "cpu", cores=2).threads == 1  # more workers than cores: one thread each


def test_plan_on_cuda_from_free_memory(monkeypatch):
    monkeypatch.setattr(workers, "gpu_free_memory", lambda: [80 * 10**9, 20 * 10**9])
    auto = workers.plan("auto", "cuda", cores=16)
    # 8 GB a worker: 10 on the first GPU, 2 on the second, spread over both from the start
    assert auto.workers == 12 and auto.gpus.count(0) == 10 and auto.gpus.count(1) == 2
    assert auto.gpus[:4] == (0, 1, 0, 1) and auto.threads == 1
    assert "80 GB, 20 GB free on 2 GPUs" in auto.line
    assert workers.plan("auto", "cuda", cores=4).workers == 4  # a core for each worker at least
    assert workers.plan(3, "cuda", cores=12).gpus == (0, 1, 0)
    monkeypatch.setattr(workers, "gpu_free_memory", lambda: [5 * 10**9])
    with pytest.raises(PosbenchError, match="no GPU has the 8 GB free"):
        workers.plan("auto", "cuda", cores=4)
    monkeypatch.setattr(workers, "gpu_free_memory", lambda: [])
    with pytest.raises(PosbenchError, match="no GPU is visible"):
        workers.plan(2, "cuda", cores=4)


@pytest.mark.parametrize("value", [0, -1, "0", "x", 1.5, True, "", "2 "])
def test_bad_workers(value):
    if value == "2 ":
        assert config.check_workers(value) == 2
        return
    with pytest.raises(PosbenchError, match="workers must be a number of processes from 1 up"):
        config.check_workers(value)


def test_workers_task_key(task_file, tmp_path, capsys):
    good = tmp_path / "auto.toml"
    good.write_text('workers = "auto"\n' + task_file.read_text())
    assert config.load_task(str(good)).workers == "auto"
    bad = tmp_path / "bad.toml"
    bad.write_text("workers = 0\n" + task_file.read_text())
    with pytest.raises(PosbenchError, match=r"bad.toml: workers must be"):
        config.load_task(str(bad))
    assert main(["run", str(task_file), "--workers", "two", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: workers must be") and not (tmp_path / "o").exists()


def test_longest_expected_first(task_file):
    specs = grid(config.load_task(str(task_file)))
    queue = workers.order(specs)
    copy = [s.run_id for s in specs if s.data.spec == "copy"]
    assert [s.run_id for s in queue[:4]] == sorted(copy)  # 6 steps of 4 x 32 tokens before 4 of 4 x 16
    assert workers.expected_cost(queue[0]) == 6 * 4 * 32 and workers.expected_cost(queue[-1]) == 4 * 4 * 16


def finished_rows(directory, seconds):
    """ok rows in directory/runs.csv for the given runs, each with its training seconds."""
    results.merge_rows(directory, "runs", [{"run_id": s.run_id, "task": "tinyworkers", "scheme": s.scheme,
                                            "seed": s.seed, "status": "ok", "train_seconds": t}
                                           for s, t in seconds])


def test_measured_seconds_order_the_other_seeds(task_file, tmp_path):
    """Where a folder has finished runs, a run is expected to take what its cell took under the
    other seeds: here the copy probe stopped early, so the text runs now go first, the slower
    scheme's before the other's, and each cell's seeds together."""
    specs = grid(config.load_task(str(task_file)))
    cells = {}  # (scheme, copy probe or text): its runs, one a seed
    for s in specs:
        cells.setdefault((s.scheme, s.data.spec == "copy"), []).append(s)
    took = {("none", False): 500.0, ("rope", False): 300.0, ("none", True): 2.0, ("rope", True): 1.0}
    finished_rows(tmp_path, [(min(runs, key=lambda x: x.seed), took[c]) for c, runs in cells.items()])
    queue = [s.run_id for s in workers.order(specs, tmp_path)]
    assert queue == [r.run_id for c in sorted(took, key=took.get, reverse=True)
                     for r in sorted(cells[c], key=lambda x: x.run_id)]
    seed_one = next(s for s in cells[("rope", True)] if s.seed == 1)
    assert workers.expected(specs, tmp_path)[seed_one.run_id] == 1.0  # unfinished: seed 0's seconds


def test_unmeasured_runs_are_expected_at_the_measured_rate(task_file, tmp_path):
    """A run whose cell has not finished anywhere is expected to take its tokens at the median
    seconds per token of those that did."""
    specs = grid(config.load_task(str(task_file)))
    text = {s.scheme: s for s in specs if s.data.spec != "copy" and s.seed == 0}
    finished_rows(tmp_path, [(text["none"], 500.0), (text["rope"], 300.0)])
    cost = workers.expected(specs, tmp_path)
    copy = next(s for s in specs if s.data.spec == "copy")
    assert cost[copy.run_id] == pytest.approx(6 * 4 * 32 * (400.0 / (4 * 4 * 16)))  # the median rate of 500 and 300
    assert workers.order(specs, tmp_path)[0].data.spec == "copy"


# --- end to end -------------------------------------------------------------------------------

@pytest.mark.slow
def test_workers_write_the_rows_of_two_shards(task_file, tmp_path, one_thread):
    task = config.load_task(str(task_file))
    done = workers.run_task(task, tmp_path / "w", device="cpu", speed=False, workers=2, log=lambda m: None)
    assert done["trained"] == 8 and done["evaluated"] == 4 and done["probes"] == 4 and done["failed"] == []
    run_task(task, tmp_path / "s1", (1, 2), device="cpu", speed=False)
    run_task(task, tmp_path / "s2", (2, 2), device="cpu", speed=False)
    assert main(["report", str(tmp_path / "s1"), "--merge", str(tmp_path / "s2")]) == 0
    assert main(["report", str(tmp_path / "w")]) == 0
    runs = table(tmp_path / "w", "runs", RUN_COLUMNS)
    assert len(runs) == 8 and runs == table(tmp_path / "s1", "runs", RUN_COLUMNS)
    assert {r[-1].split("-")[0][-2:] for r in runs.values()} == {"x1"}  # one thread each, in the kind
    for name, columns in (("extrapolation", ("loss", "ppl")), ("positions", ("loss",)),
                          ("probes", ("hits", "accuracy", "exact")), ("effective_length", ("effective_len",))):
        rows = table(tmp_path / "w", name, columns)
        assert rows and rows == table(tmp_path / "s1", name, columns), name
    assert len(results.read_rows(tmp_path / "w" / "probes.csv")) == len(table(tmp_path / "w", "probes", ()))


def kill_the_victim(job, run_id):
    """A worker's runner that dies by SIGKILL on the run named in $VICTIM (set by the test)."""
    if run_id == os.environ["VICTIM"]:
        os.kill(os.getpid(), signal.SIGKILL)
    return _real_run_one(job, run_id)


_real_run_one = workers.run_one


@pytest.mark.slow
def test_a_killed_worker_fails_its_run_only(task_file, tmp_path, monkeypatch, capsys):
    task = config.load_task(str(task_file))
    victim = sorted(s.run_id for s in grid(task) if s.data.spec != "copy")[0]
    monkeypatch.setenv("VICTIM", victim)
    monkeypatch.setattr(workers, "run_one", kill_the_victim)
    out = tmp_path / "out"
    args = ["run", str(task_file), "--out", str(out), "--device", "cpu", "--no-speed", "--workers", "2"]
    assert main(args) == 1
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and f"error: training failed for {victim} " in captured.err
    assert f"{victim} failed: worker " in captured.out and "died (SIGKILL)" in captured.out
    rows = {r["run_id"]: r for r in results.read_rows(out / "runs.csv")}
    assert len(rows) == 8 and rows[victim]["status"] == "failed"
    assert rows[victim]["message"] == "its worker process died (SIGKILL)"
    assert all(r["status"] == "ok" for k, r in rows.items() if k != victim)
    evaluated = {r["run_id"] for r in results.read_rows(out / "extrapolation.csv")}
    assert len(evaluated) == 3 and victim not in evaluated
    assert (out / "report.md").exists()
    monkeypatch.setenv("VICTIM", "")
    assert main(args) == 0  # the failed run again, the others kept
    assert "trained 1, skipped 7" in capsys.readouterr().out
    assert {r["status"] for r in results.read_rows(out / "runs.csv")} == {"ok"}


@pytest.mark.slow
def test_ctrl_c_stops_every_worker_and_resume_completes(task_file, tmp_path):
    long = tmp_path / "long.toml"
    long.write_text(task_file.read_text().replace("steps = 4\n", "steps = 400\ncheckpoint_interval = 50\n", 1))
    out = tmp_path / "out"
    args = [sys.executable, "-m", "posbench", "run", str(long), "--out", str(out), "--device", "cpu",
            "--no-speed", "--workers", "2", "--resume"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    # a process group of its own, as a terminal's foreground job: Ctrl-C signals the group, and
    # reaches it whatever the shell that started pytest chose (a non-interactive `cmd &` ignores it)
    with open(tmp_path / "stdout", "w") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        began = time.monotonic()
        while not list(out.glob("*/checkpoint.safetensors")) and time.monotonic() - began < 300:
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)
        err = proc.communicate(timeout=120)[1]
    text = (tmp_path / "stdout").read_text()
    assert {"worker 1: train", "worker 2: train"} <= {line[:15] for line in text.splitlines()}
    assert proc.returncode == 130, err
    assert err.count("\n") == 1 and err.startswith("interrupted: 2 workers stopped;") and "--resume" in err
    ok = [r for r in results.read_rows(out / "runs.csv") if r["status"] == "ok"]
    assert not [r for r in ok if r["steps"] == "400"]  # the long runs were stopped, checkpointed
    kept = list(out.glob("*/checkpoint.safetensors"))
    assert kept and not [p for p in kept if (p.parent / "model.safetensors").exists()]
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=400)
    assert done.returncode == 0, done.stderr
    rows = results.read_rows(out / "runs.csv")
    assert len(rows) == 8 and {r["status"] for r in rows} == {"ok"}
    assert len({r["run_id"] for r in results.read_rows(out / "extrapolation.csv")}) == 4
    assert len({r["run_id"] for r in results.read_rows(out / "probes.csv")}) == 4
    assert (out / "report.md").exists()
    resumed = kept[0].parent.name
    log = results.read_rows(out / resumed / "log.csv")
    assert [int(r["step"]) for r in log] == list(range(1, 401))  # every step logged once
