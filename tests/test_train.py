import dataclasses

import pytest
import torch

from conftest import TINY_MODEL, TINY_TRAIN
from posbench import results
from posbench.errors import PosbenchError
from posbench.runs import RunSpec, load_trained
from posbench.training import lr_at, train


def spec_for(tiny_data, scheme="rope", **train_changes) -> RunSpec:
    t = dataclasses.replace(TINY_TRAIN, **train_changes)
    return RunSpec(scheme=scheme, data=tiny_data, model=TINY_MODEL, train=t, task="test")


def test_run_id_depends_on_config_not_logistics(tiny_data):
    a = spec_for(tiny_data)
    assert a.run_id == spec_for(tiny_data, checkpoint_interval=99).run_id
    assert a.run_id != spec_for(tiny_data, steps=7).run_id
    assert a.run_id != spec_for(tiny_data, scheme="alibi").run_id
    # An explicit default parameter is the same run as the implicit one.
    assert RunSpec("rope", params={"base": "10000"}, data=tiny_data, model=TINY_MODEL,
                   train=TINY_TRAIN).run_id == RunSpec("rope", data=tiny_data, model=TINY_MODEL,
                                                       train=TINY_TRAIN).run_id


def test_parameters_added_later_keep_the_run_ids_of_the_committed_baseline():
    """`rope` gained `fraction` after results/baseline/ci was trained: at its default the run_id
    is the one recorded there (every scheme of the ci task is checked), and only another value
    makes a new run."""
    from pathlib import Path

    from posbench import config

    task = config.load_task("ci")
    baseline = Path(__file__).parents[1] / "results" / "baseline" / "ci" / "runs.csv"
    rows = results.read_rows(baseline)
    assert {r["scheme"] for r in rows} == set(task.schemes)
    for row in rows:
        spec = RunSpec(row["scheme"], params=task.params.get(row["scheme"], {}), seed=int(row["seed"]),
                       data=task.data, model=task.model, train=task.train)
        assert spec.run_id == row["run_id"], row["scheme"]
    rope = dict(data=task.data, model=task.model, train=task.train)
    assert RunSpec("rope", params={"fraction": "1"}, **rope).run_id == "rope-f95421a2b3"
    assert RunSpec("rope", params={"fraction": 0.25}, **rope).run_id != "rope-f95421a2b3"


def test_train_writes_run_and_row(tiny_data, tmp_path):
    result = train(spec_for(tiny_data), tmp_path, device="cpu", progress=False)
    run_dir = tmp_path / result.run_id
    for name in ("config.json", "model.safetensors", "checkpoint.safetensors", "log.csv"):
        assert (run_dir / name).exists(), name
    rows = results.read_rows(tmp_path / "runs.csv")
    assert len(rows) == 1 and rows[0]["status"] == "ok" and rows[0]["scheme"] == "rope"
    log = results.read_rows(run_dir / "log.csv")
    assert [int(r["step"]) for r in log] == list(range(1, 7))
    assert log[2]["val_loss"] and not log[0]["val_loss"]  # eval_interval 3
    spec, model, vocab = load_trained(run_dir)
    assert spec.run_id == result.run_id and vocab == 257


@pytest.mark.slow
def test_loss_falls_with_training(tiny_data, tmp_path):
    spec = spec_for(tiny_data, steps=150, eval_interval=150, lr=1e-2, warmup=10, batch_size=8)
    result = train(spec, tmp_path, device="cpu", progress=False)
    # Bytes of a small vocabulary of words: far below log(257) = 5.55 and the unigram model.
    assert result.row["final_val_loss"] < result.row["unigram_val_loss"] - 0.3


def test_same_seed_same_numbers(tiny_data, tmp_path):
    a = train(spec_for(tiny_data), tmp_path / "a", device="cpu", progress=False).row
    b = train(spec_for(tiny_data), tmp_path / "b", device="cpu", progress=False).row
    assert a["final_train_loss"] == b["final_train_loss"] and a["final_val_loss"] == b["final_val_loss"]
    # the row names the weights bit for bit: a retrain is compared from runs.csv alone
    assert len(a["weights_sha256"]) == 64 and a["weights_sha256"] == b["weights_sha256"]
    from safetensors.torch import load_file

    from posbench.runs import weights_digest

    run_id = spec_for(tiny_data).run_id
    assert weights_digest(load_file(tmp_path / "a" / run_id / "model.safetensors")) == a["weights_sha256"]
    other = train(spec_for(tiny_data, lr=3e-3), tmp_path / "c", device="cpu", progress=False).row
    assert other["weights_sha256"] != a["weights_sha256"]
    assert results.read_rows(tmp_path / "a" / "runs.csv")[0]["weights_sha256"] == a["weights_sha256"]


def test_resume_continues_to_the_same_result(tiny_data, tmp_path):
    whole = train(spec_for(tiny_data), tmp_path / "whole", device="cpu", progress=False).row
    part = train(spec_for(tiny_data), tmp_path / "split", device="cpu", progress=False, stop_after=4)
    assert part.row["status"] == "partial"
    assert not (tmp_path / "split" / "runs.csv").exists()
    resumed = train(spec_for(tiny_data), tmp_path / "split", device="cpu", progress=False, resume=True).row
    # bit for bit, as posbench/docs/results.md promises: the row, the log and the weights
    volatile = ("train_seconds", "tokens_per_second", "model_flops_per_second", "created")  # clocks
    assert {k: v for k, v in resumed.items() if k not in volatile} == {k: v for k, v in whole.items() if k not in volatile}
    logs = [results.read_rows(tmp_path / d / part.run_id / "log.csv") for d in ("whole", "split")]
    assert [{k: v for k, v in r.items() if k != "seconds"} for r in logs[0]] == \
        [{k: v for k, v in r.items() if k != "seconds"} for r in logs[1]]
    weights = [(tmp_path / d / part.run_id / "model.safetensors").read_bytes() for d in ("whole", "split")]
    assert weights[0] == weights[1]
    log = results.read_rows(tmp_path / "split" / part.run_id / "log.csv")
    assert [int(r["step"]) for r in log] == list(range(1, 7))  # no step lost or repeated
    again = train(spec_for(tiny_data), tmp_path / "split", device="cpu", progress=False, resume=True)
    assert again.skipped


def test_nan_stops_and_is_recorded(tiny_data, tmp_path, monkeypatch):
    from posbench.model import Transformer

    real = Transformer.forward

    def poisoned(self, idx, pos=None, targets=None):
        return real(self, idx, pos, targets) * float("nan")

    monkeypatch.setattr(Transformer, "forward", poisoned)
    with pytest.raises(PosbenchError, match="loss became nan at step 0"):
        train(spec_for(tiny_data), tmp_path, device="cpu", progress=False)
    rows = results.read_rows(tmp_path / "runs.csv")
    assert rows[0]["status"] == "failed" and "nan" in rows[0]["message"]


def test_corrupt_checkpoint_is_one_clear_error(tiny_data, tmp_path):
    spec = spec_for(tiny_data)
    train(spec, tmp_path, device="cpu", progress=False, stop_after=2)
    (tmp_path / spec.run_id / "checkpoint.safetensors").write_bytes(b"\x00garbage" * 10)
    with pytest.raises(PosbenchError, match="corrupt checkpoint"):
        train(spec, tmp_path, device="cpu", progress=False, resume=True)


def test_randomized_positions_train(tiny_data, tmp_path):
    spec = spec_for(tiny_data, scheme="learned", randomize_positions=True, randomize_max=64)
    result = train(spec, tmp_path, device="cpu", progress=False)
    _, model, _ = load_trained(result.run_dir)
    assert model.layout.schemes[0].position_limit() == 64  # the table covers L_max, not train_len
    assert result.row["randomized"] is True


def test_warmup_then_cosine():
    t = TINY_TRAIN
    assert lr_at(0, t) < lr_at(1, t) <= t.lr
    assert lr_at(t.steps, t) == pytest.approx(0.1 * t.lr)


@pytest.mark.slow
def test_ddp_two_processes_match_one(corpus_dir, tmp_path):
    """torchrun with 2 CPU processes (gloo) follows the single-process run of the same global batch."""
    import os
    import socket
    import subprocess
    import sys

    flags = ["train", "--scheme", "alibi", "--data", f"files:{corpus_dir}", "--tokenizer", "bytes",
             "--train-len", "16", "--steps", "5", "--batch-size", "8", "--d-model", "32", "--layers", "1",
             "--heads", "2", "--device", "cpu"]
    single = subprocess.run([sys.executable, "-m", "posbench", *flags, "--runs-dir", str(tmp_path / "one")],
                            capture_output=True, text=True, timeout=300)
    assert single.returncode == 0, single.stderr

    def torchrun(runs_dir):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        return subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
             "--master_port", str(port), "-m", "posbench", *flags, "--runs-dir", str(runs_dir)],
            capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})

    where = tmp_path / "two"
    ddp = torchrun(where)
    if ddp.returncode and "Signal" in ddp.stderr:  # a process killed by a signal, not by posbench: once more, afresh
        where = tmp_path / "again"
        ddp = torchrun(where)
    # the processes' own words (torchrun's summary of them alone says little)
    said = [line for line in ddp.stderr.splitlines() if any(w in line for w in ("Error", "error", "what()", "terminate"))]
    assert ddp.returncode == 0, "\n".join(said[:20]) + "\n" + ddp.stderr[-1500:]
    (one,) = results.read_rows(tmp_path / "one" / "runs.csv")
    (two,) = results.read_rows(where / "runs.csv")  # rank 0 alone wrote
    assert one["run_id"] == two["run_id"]
    assert float(two["final_train_loss"]) == pytest.approx(float(one["final_train_loss"]), rel=1e-4)
    assert float(two["final_val_loss"]) == pytest.approx(float(one["final_val_loss"]), rel=1e-4)


def test_compile_is_logistics_and_recorded(tiny_data, tmp_path):
    """--compile does not change what is trained: the run_id stays, the row says off on CPU."""
    assert spec_for(tiny_data).run_id == spec_for(tiny_data, compile="on").run_id
    row = train(spec_for(tiny_data, steps=2), tmp_path, device="cpu", progress=False).row
    assert row["compile"] == "off"
    assert results.read_rows(tmp_path / "runs.csv")[0]["compile"] == "off"


def test_a_model_that_fails_to_compile_trains_eager(tiny_data, tmp_path, monkeypatch, capsys):
    def broken(*args, **kwargs):
        raise RuntimeError("no compiler here\nsecond line")

    monkeypatch.setattr(torch, "compile", broken)
    row = train(spec_for(tiny_data, steps=2, compile="on"), tmp_path, device="cpu", progress=False).row
    assert row["compile"] == "fallback" and row["status"] == "ok"
    warnings = [line for line in capsys.readouterr().err.splitlines() if "torch.compile" in line]
    assert warnings == ["warning: torch.compile failed (RuntimeError: no compiler here); training eager"]


def test_a_failure_inside_the_first_compiled_step_falls_back(tiny_data, tmp_path, monkeypatch, capsys):
    """torch.compile compiles lazily: its errors surface in the first forward or backward."""
    def lazily_broken(module, **kwargs):
        def call(*args, **kw):
            raise RuntimeError("backend failed")
        return call

    monkeypatch.setattr(torch, "compile", lazily_broken)
    spec = spec_for(tiny_data, steps=3, compile="on")
    row = train(spec, tmp_path, device="cpu", progress=False).row
    eager = train(spec_for(tiny_data, steps=3), tmp_path / "eager", device="cpu", progress=False).row
    assert row["compile"] == "fallback" and row["final_train_loss"] == eager["final_train_loss"]
    assert capsys.readouterr().err.count("torch.compile failed") == 1


def test_compiled_and_eager_training_agree(tiny_data, tmp_path):
    """The compiled model (inductor on CPU: tens of seconds of compilation) follows the eager
    loss curve step by step within float tolerance."""
    tiny = dict(model=dataclasses.replace(TINY_MODEL, d_model=16, n_layers=1, n_heads=2))
    specs = {mode: dataclasses.replace(spec_for(tiny_data, steps=3, compile=mode), **tiny)
             for mode in ("on", "off")}
    curves = {}
    for mode, spec in specs.items():
        result = train(spec, tmp_path / mode, device="cpu", progress=False)
        assert result.row["compile"] == mode
        curves[mode] = [float(r["loss"]) for r in results.read_rows(result.run_dir / "log.csv")]
    assert curves["on"] == pytest.approx(curves["off"], rel=1e-4, abs=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("scheme, backend", [("alibi", "flex"), ("rope", "sdpa-causal")])
def test_cuda_training_compiles_on_the_fast_paths(tiny_data, tmp_path, scheme, backend):
    """On CUDA, auto compiles; bias schemes train through FlexAttention inside the compiled
    model, and the loss curve follows eager's within bfloat16 tolerance."""
    model = dataclasses.replace(TINY_MODEL, d_model=64)  # head_dim 16: FlexAttention's minimum
    curves = {}
    for mode in ("auto", "off"):
        spec = dataclasses.replace(spec_for(tiny_data, scheme=scheme, compile=mode, dtype="bfloat16"),
                                   model=model)
        result = train(spec, tmp_path / mode, device="cuda", progress=False)
        assert result.row["compile"] == ("on" if mode == "auto" else "off")
        assert result.row["backend"] == backend
        curves[mode] = [float(r["loss"]) for r in results.read_rows(result.run_dir / "log.csv")]
    assert curves["auto"] == pytest.approx(curves["off"], rel=2e-2)
