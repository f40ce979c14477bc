"""Training curves in TensorBoard and W&B (posbench.trackers): what each writes is read back with
the package's own reader (TensorBoard's EventAccumulator; W&B's offline transaction log), a
resumed run continues the same tracker run without repeating a step, and the tracker is not part
of the run_id. Each test skips when its package is not installed (the `tensorboard` and `wandb`
extras)."""

import dataclasses
import struct
from pathlib import Path

import pytest
from conftest import TINY_TRAIN

from posbench import config, results, trackers
from posbench.cli import main
from posbench.errors import PosbenchError
from posbench.runs import RunSpec
from posbench.training import train

TINY = ["--train-len", "16", "--steps", "6", "--batch-size", "4", "--d-model", "32", "--layers", "1",
        "--heads", "2", "--tokenizer", "bytes", "--device", "cpu"]
SCALARS = {"train/loss", "train/lr", "train/tokens_per_second", "val/loss"}


def _spec(tiny_data, tracker: str) -> RunSpec:
    return RunSpec(scheme="rope", data=tiny_data, task="tiny",
                   train=dataclasses.replace(TINY_TRAIN, tracker=tracker))


def test_the_tracker_is_not_part_of_the_run_id(tiny_data):
    assert len({_spec(tiny_data, kind).run_id for kind in ("none", "tensorboard", "wandb")}) == 1


def test_a_tracker_that_is_not_installed_is_one_line(capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(trackers.PACKAGES, "wandb", "posbench_no_such_package")
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--scheme", "rope", "--tracker", "wandb"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install 'posbench[wandb]'" in err[0], err
    assert main(["run", "quick", "--tracker", "wandb"]) == 2
    assert "posbench[wandb]" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
    with pytest.raises(PosbenchError, match="did you mean 'wandb'"):
        config.replace(TINY_TRAIN, tracker="wanb")


def test_flatten_gives_hyperparameters():
    assert trackers.flatten({"seed": 0, "train": {"lr": 0.1, "dtype": "float32"}, "params": {}, "x": [1, 2]}) == {
        "seed": 0, "train.lr": 0.1, "train.dtype": "float32", "params": "{}", "x": "[1, 2]"}


def test_tensorboard_scalars_hparams_and_resume(tiny_data, corpus_dir, tmp_path):
    pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    args = ["train", "--scheme", "rope", "--data", f"files:{corpus_dir}", *TINY, "--runs-dir", tmp_path,
            "--task", _task_file(tmp_path), "--tracker", "tensorboard"]
    assert main([str(a) for a in args]) == 0
    (run_id,) = [r["run_id"] for r in results.read_rows(tmp_path / "runs.csv")]
    folder = tmp_path / "tensorboard" / "tiny" / run_id
    events = EventAccumulator(str(folder))
    events.Reload()
    assert SCALARS <= set(events.Tags()["scalars"])
    assert [e.step for e in events.Scalars("train/loss")] == [1, 2, 3, 4, 5, 6]
    assert [e.step for e in events.Scalars("val/loss")] == [3, 6]
    logged = {int(r["step"]): float(r["loss"]) for r in results.read_rows(tmp_path / run_id / "log.csv")}
    assert {e.step: pytest.approx(e.value) for e in events.Scalars("train/loss")} == logged
    assert all(e.value > 0 for e in events.Scalars("train/tokens_per_second"))
    plugins = events.PluginTagToContent("hparams")
    assert "_hparams_/experiment" in plugins and b"train.lr" in plugins["_hparams_/session_start_info"]


def test_tensorboard_resume_repeats_no_step(tiny_data, tmp_path):
    pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    spec = _spec(tiny_data, "tensorboard")
    checkpoint = tmp_path / spec.run_id / "checkpoint.safetensors"
    train(spec, tmp_path, device="cpu", progress=False, stop_after=2)
    at_step_2 = checkpoint.read_bytes()
    train(spec, tmp_path, device="cpu", progress=False, resume=True, stop_after=2)
    checkpoint.write_bytes(at_step_2)  # as a kill after logging steps 3 and 4 leaves it
    train(spec, tmp_path, device="cpu", progress=False, resume=True)
    events = EventAccumulator(str(tmp_path / "tensorboard" / "tiny" / spec.run_id))
    events.Reload()
    assert [e.step for e in events.Scalars("train/loss")] == [1, 2, 3, 4, 5, 6]
    logged = {int(r["step"]): float(r["loss"]) for r in results.read_rows(tmp_path / spec.run_id / "log.csv")}
    assert {e.step: pytest.approx(e.value) for e in events.Scalars("train/loss")} == logged


def test_wandb_offline_run_resumed(tiny_data, tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="the wandb extra is not installed")
    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_PROJECT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    spec = _spec(tiny_data, "wandb")
    train(spec, tmp_path, device="cpu", progress=False, stop_after=4)
    train(spec, tmp_path, device="cpu", progress=False, resume=True)
    logs = sorted((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(logs) == 2 and all(p.name == f"run-{spec.run_id}.wandb" for p in logs)
    steps, config = {}, {}
    for path in logs:
        for record in _wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                assert (record.run.run_id, record.run.display_name, record.run.run_group) == (
                    spec.run_id, spec.run_id, "tiny")
                config.update({item.key: item.value_json for item in record.run.config.update})
            elif kind == "history":
                items = {item.key or "/".join(item.nested_key): item.value_json for item in record.history.item}
                steps.setdefault(int(items["_step"]), []).append(items)
    assert sorted(steps) == [1, 2, 3, 4, 5, 6] and all(len(v) == 1 for v in steps.values())
    assert SCALARS <= set(steps[6][0]) and "val/loss" in steps[3][0] and "val/loss" not in steps[4][0]
    logged = {int(r["step"]): float(r["loss"]) for r in results.read_rows(tmp_path / spec.run_id / "log.csv")}
    assert {s: pytest.approx(float(v[0]["train/loss"])) for s, v in steps.items()} == logged
    assert config["seed"] == "0" and config["run_id"] == f'"{spec.run_id}"' and '"lr"' in config["train"]


def _task_file(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.toml"
    path.write_text("[train]\nwarmup = 1\neval_interval = 3\neval_windows = 4\n")
    return path


def _wandb_records(path: Path) -> list:
    """The records of a W&B transaction log: a 7-byte header (':W&B', magic, version), then
    LevelDB log records (crc32 4 bytes, length 2, type 1: full, first, middle, last) in blocks of
    32 KiB, each a protobuf Record."""
    from wandb.proto import wandb_internal_pb2

    data, block = path.read_bytes(), 32768
    assert data[:4] == b":W&B"
    out, pending, pos = [], b"", 7
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        length, kind = struct.unpack("<HB", data[pos + 4: pos + 7])
        pending += data[pos + 7: pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            out.append(record)
            pending = b""
    return out
