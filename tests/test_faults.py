"""Faults during training and writing: Ctrl-C anywhere, a kill between two writes, two processes on
one run, temp files left by a kill. After each, the resumed result equals the uninterrupted one
bit for bit."""

import dataclasses
import os
import signal
import stat
import threading

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from conftest import TINY_MODEL, TINY_TRAIN
from posbench import batches, results
from posbench.errors import PosbenchError
from posbench.runs import CHECKPOINT, FINAL, RunSpec
from posbench.training import train


def tiny_spec(tiny_data, **train_changes) -> RunSpec:
    t = dataclasses.replace(TINY_TRAIN, **train_changes)
    return RunSpec(scheme="rope", data=tiny_data, model=TINY_MODEL, train=t, task="test")


def outcome(runs_dir, spec):
    """What a run leaves: final weights, log rows (timings aside), runs.csv losses."""
    log = [{k: v for k, v in r.items() if k != "seconds"}
           for r in results.read_rows(runs_dir / spec.run_id / "log.csv")]
    row = results.read_rows(runs_dir / "runs.csv")[0]
    return (load_file(str(runs_dir / spec.run_id / FINAL)), log,
            (row["status"], row["final_train_loss"], row["final_val_loss"]))


def assert_same(a, b):
    weights_a, log_a, row_a = a
    weights_b, log_b, row_b = b
    assert weights_a.keys() == weights_b.keys()
    assert all(torch.equal(weights_a[k], weights_b[k]) for k in weights_a)
    assert log_a == log_b and [int(r["step"]) for r in log_a] == list(range(1, 7))
    assert row_a == row_b and row_a[0] == "ok"


@pytest.fixture(scope="module")
def uninterrupted(tiny_data, tmp_path_factory):
    runs = tmp_path_factory.mktemp("whole")
    train(tiny_spec(tiny_data), runs, device="cpu", progress=False)
    return outcome(runs, tiny_spec(tiny_data))


@pytest.fixture(autouse=True)
def ctrl_c_reaches_python():
    """Python's own Ctrl-C handler for every test here, whatever the shell that started pytest
    chose (a non-interactive shell's `cmd &` ignores SIGINT, and training leaves an ignored
    SIGINT ignored)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_an_ignored_ctrl_c_stays_ignored(tiny_data, tmp_path, monkeypatch):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    spec = tiny_spec(tiny_data)
    monkeypatch.setattr(*after(batches.LMWindows, "sample", 2))  # ignored: training runs to its end
    train(spec, tmp_path, device="cpu", progress=False)
    assert (tmp_path / spec.run_id / FINAL).exists()
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def ctrl_c(times: int = 1):
    for _ in range(times):
        signal.raise_signal(signal.SIGINT)


def after(owner, name: str, call: int, times: int = 1):
    """Patch owner.name to press Ctrl-C `times` right after its `call`-th call returns."""
    real = getattr(owner, name)
    calls = []

    def pressing(*args, **kwargs):
        value = real(*args, **kwargs)
        calls.append(1)
        if len(calls) == call:
            ctrl_c(times)
        return value

    return owner, name, pressing


# Step 4 of 6 (checkpoints every 2): after its batch is drawn, in backward, after the optimizer
# update, inside the validation pass of step 3; and a second Ctrl-C after the update, which stops
# at once and falls back to the checkpoint of step 2.
POINTS = {
    "sample_batch": lambda: after(batches.LMWindows, "sample", 4),
    "backward": lambda: after(torch.Tensor, "backward", 4),
    "optimizer_step": lambda: after(torch.optim.AdamW, "step", 4),
    "validation": lambda: after(batches.LMWindows, "validate", 1),
    "twice_after_update": lambda: after(torch.optim.AdamW, "step", 4, times=2),
}


@pytest.mark.parametrize("point", POINTS)
def test_ctrl_c_anywhere_then_resume_equals_uninterrupted(tiny_data, tmp_path, monkeypatch, uninterrupted, point):
    spec = tiny_spec(tiny_data)
    with monkeypatch.context() as patch:
        patch.setattr(*POINTS[point]())
        with pytest.raises(PosbenchError, match="resume"):
            train(spec, tmp_path, device="cpu", progress=False)
    assert not (tmp_path / "runs.csv").exists()
    train(spec, tmp_path, device="cpu", progress=False, resume=True)
    assert_same(outcome(tmp_path, spec), uninterrupted)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1])
def test_scheduler_signals_stop_at_a_step_end_like_ctrl_c(tiny_data, tmp_path, monkeypatch, uninterrupted, signum):
    """A scheduler's preemption (SIGTERM) and time-limit warning (SIGUSR1, posbench.cluster)."""
    real = torch.optim.AdamW.step
    calls = []

    def signalling(self, *args, **kwargs):
        value = real(self, *args, **kwargs)
        calls.append(1)
        if len(calls) == 4:
            signal.raise_signal(signum)
        return value

    spec = tiny_spec(tiny_data)
    with monkeypatch.context() as patch:
        patch.setattr(torch.optim.AdamW, "step", signalling)
        with pytest.raises(PosbenchError, match="checkpointed at step 4"):
            train(spec, tmp_path, device="cpu", progress=False)
    assert signal.getsignal(signum) is signal.SIG_DFL
    train(spec, tmp_path, device="cpu", progress=False, resume=True)
    assert_same(outcome(tmp_path, spec), uninterrupted)


def test_ctrl_c_is_deferred_only_while_training(tiny_data, tmp_path):
    train(tiny_spec(tiny_data), tmp_path, device="cpu", progress=False)
    with pytest.raises(KeyboardInterrupt):
        ctrl_c()


def test_kill_between_checkpoint_and_log_then_resume_equals_uninterrupted(tiny_data, tmp_path, monkeypatch,
                                                                          uninterrupted):
    class Killed(BaseException):
        pass

    real = results.write_atomic
    log_writes = []

    def killed_at_second_log(path, text):
        if path.name == "log.csv":
            log_writes.append(path)
            if len(log_writes) == 2:  # the checkpoint of step 4 is in place, its log is not
                raise Killed
        real(path, text)

    spec = tiny_spec(tiny_data)
    with monkeypatch.context() as patch:
        patch.setattr(results, "write_atomic", killed_at_second_log)
        with pytest.raises(Killed):
            train(spec, tmp_path, device="cpu", progress=False)
    assert len(results.read_rows(tmp_path / spec.run_id / "log.csv")) == 2
    train(spec, tmp_path, device="cpu", progress=False, resume=True)
    assert_same(outcome(tmp_path, spec), uninterrupted)


def test_second_trainer_of_a_run_is_told_and_first_finishes(tiny_data, tmp_path, monkeypatch, uninterrupted):
    spec = tiny_spec(tiny_data)
    first_started, second_done = threading.Event(), threading.Event()
    real = batches.LMWindows.sample

    def waiting(*args):
        if threading.current_thread().name == "first" and not first_started.is_set():
            first_started.set()
            second_done.wait(timeout=60)
        return real(*args)

    monkeypatch.setattr(batches.LMWindows, "sample", waiting)
    errors = []

    def first():
        try:
            train(spec, tmp_path, device="cpu", progress=False)
        except BaseException as e:  # reported by the assertion below
            errors.append(e)

    worker = threading.Thread(target=first, name="first")
    worker.start()
    assert first_started.wait(timeout=60)
    try:
        with pytest.raises(PosbenchError, match=rf"run {spec.run_id} is in use by another process \(pid {os.getpid()}\)"):
            train(spec, tmp_path, device="cpu", progress=False, resume=True)
    finally:
        second_done.set()
        worker.join()
    assert not errors
    assert_same(outcome(tmp_path, spec), uninterrupted)
    assert train(spec, tmp_path, device="cpu", progress=False, resume=True).skipped


def test_temp_files_of_a_killed_writer_are_removed_by_the_next(tiny_data, tmp_path):
    spec = tiny_spec(tiny_data, steps=2)
    run_dir = tmp_path / spec.run_id
    run_dir.mkdir()
    stale = [run_dir / f".{CHECKPOINT}.tmp-99999-0badcafe", run_dir / ".log.csv.tmp-99999-0badcafe",
             tmp_path / ".runs.csv.tmp-99999-0badcafe"]
    for path in stale:
        path.write_text("half written")
    train(spec, tmp_path, device="cpu", progress=False)
    assert not any(path.exists() for path in stale)
    left = sorted(p.name for p in tmp_path.rglob("*") if results.TEMP_MARK in p.name)
    assert left == []


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600)])
def test_result_files_follow_the_umask(tiny_data, tmp_path, umask, mode):
    previous = os.umask(umask)
    try:
        spec = tiny_spec(tiny_data, steps=2)
        train(spec, tmp_path, device="cpu", progress=False)
    finally:
        os.umask(previous)
    written = [tmp_path / "runs.csv", *(tmp_path / spec.run_id / name
                                        for name in ("config.json", "log.csv", CHECKPOINT, FINAL))]
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in written} == {p.name: mode for p in written}


def test_damaged_checkpoint_log_is_one_clear_error(tiny_data, tmp_path):
    spec = tiny_spec(tiny_data)
    train(spec, tmp_path, device="cpu", progress=False, stop_after=4)
    path = tmp_path / spec.run_id / CHECKPOINT
    tensors = load_file(str(path))
    tensors["log"] = tensors["log"][:3]
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
    save_file(tensors, str(path), metadata=meta)
    with pytest.raises(PosbenchError, match="corrupt checkpoint .*does not hold steps 1..4"):
        train(spec, tmp_path, device="cpu", progress=False, resume=True)
