"""Ensembles (posbench.ensemble): runs that differ only in seed train as one stacked model, each
member a run of its own: its solo run's initial weights, batches, run_id, row, log, checkpoints,
early stop and failure."""

import dataclasses
import os
import signal

import pytest
import torch
from safetensors.torch import load_file

from conftest import TINY_MODEL, TINY_TASK, TINY_TRAIN, tiny_model
from posbench import batches, config, ensemble, results, training, workers
from posbench.cli import main
from posbench.errors import Interrupted, PosbenchError, RunFailed
from posbench.grid import grid
from posbench.runs import RunSpec, read_log

# a kernel without a batching rule (SDPA on CPU) runs per member: right, only slower
pytestmark = pytest.mark.filterwarnings("ignore:There is a performance drop")

VOLATILE = ("train_seconds", "tokens_per_second", "model_flops_per_second", "created")  # clocks


def specs_for(tiny_data, scheme="rope", seeds=(0, 1), **train_changes) -> list[RunSpec]:
    t = dataclasses.replace(TINY_TRAIN, **train_changes)
    return [RunSpec(scheme=scheme, seed=s, data=tiny_data, model=TINY_MODEL, train=t, task="test") for s in seeds]


def weights(directory, run_id, name="model.safetensors"):
    return load_file(directory / run_id / name)


def largest_difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


# --- one stacked step equals each member's own ------------------------------------------------

@pytest.mark.parametrize("kernels", ["cpu", "cuda"])
@pytest.mark.parametrize("scheme", ["none", "rope", "alibi", "fope"])
def test_a_member_computes_what_its_model_computes_alone(scheme, kernels):
    """`kernels`: the attention kernels a stacked forward takes on that device (on CUDA, SDPA's
    math backend), here on CPU tensors: both batch over the members."""
    models = [tiny_model(scheme, seed=s).train() for s in range(3)]
    # fope's Fourier coefficients are buffers drawn from the seed: stacked, not the first member's
    assert bool(ensemble.differing_buffers(models)) == (scheme == "fope")
    gen = torch.Generator().manual_seed(0)
    drawn = [batches.Batch(x, torch.randint(0, 50, (4, 16), generator=gen), None, None)
             for x in torch.randint(0, 50, (3, 4, 16), generator=gen)]
    with ensemble.stacked_kernels(kernels):
        stacked = ensemble._stacked_losses(models[0], models, drawn)
    stacked.sum().backward()
    grads = [{k: p.grad.clone() for k, p in m.named_parameters()} for m in models]
    for model, batch, loss, grad in zip(models, drawn, stacked, grads):
        model.zero_grad(set_to_none=True)
        alone = batches.masked_mean(model(batch.tokens, None, targets=batch.targets), None)
        alone.backward()
        assert abs(float(alone.detach()) - float(loss.detach())) < 1e-5
        assert max(float((p.grad - grad[k]).abs().max()) for k, p in model.named_parameters()) < 1e-5


def test_masks_and_positions_of_each_member_are_its_own():
    """Probe batches: each member its own answer mask; positions shared when equal, stacked when
    not (randomized positions: a table grown to the largest member's serves each)."""
    models = [tiny_model("rope", seed=s, train_len=64).train() for s in range(2)]
    gen = torch.Generator().manual_seed(1)
    drawn = []
    for _ in models:
        x, y = torch.randint(0, 50, (2, 4, 16), generator=gen)
        mask = (torch.rand(4, 16, generator=gen) > 0.5).float()
        drawn.append(batches.Batch(x, y, mask * 4 / mask.sum(), torch.arange(16) * 3))
    for positions in (None, torch.sort(torch.randperm(64, generator=gen)[:16]).values):
        if positions is not None:
            drawn[1].positions = positions
        stacked = ensemble._stacked_losses(models[0], models, drawn)
        for model, batch, loss in zip(models, drawn, stacked):
            alone = batches.masked_mean(model(batch.tokens, batch.positions, targets=batch.targets), batch.mask)
            assert abs(float(alone.detach()) - float(loss.detach())) < 1e-5
    # shaw branches on its positions' values: vmap refuses it (the ensemble then falls back)
    shaw = [tiny_model("shaw", seed=s, train_len=64).train() for s in range(2)]
    with pytest.raises(RuntimeError, match="data-dependent control flow"):
        ensemble._stacked_losses(shaw[0], shaw, drawn)


def test_groups_and_sizes(tiny_data):
    a = specs_for(tiny_data, seeds=(3, 0, 1, 2, 4))
    b = specs_for(tiny_data, scheme="alibi", seeds=(0, 1))
    found = ensemble.groups(a + b, 2)
    assert [[s.seed for s in g] for g in found] == [[0, 1], [2, 3], [4], [0, 1]]
    assert [g[0].scheme for g in found] == ["rope"] * 3 + ["alibi"]
    assert ensemble.groups(a + b, 1) == [[s] for s in a + b]  # alone, in the order given
    assert ensemble.size("auto", "cuda", 4) == 4 and ensemble.size("auto", "cpu", 4) == 1
    assert ensemble.size("off", "cuda", 4) == 1 and ensemble.size("3", "cpu", 4) == 3
    with pytest.raises(PosbenchError, match="ensemble must be"):
        ensemble.size("many", "cpu", 4)
    assert config.parse_seeds("0-3,7") == (0, 1, 2, 3, 7)
    with pytest.raises(PosbenchError, match="seeds repeat"):
        config.parse_seeds("0-2,1")
    with pytest.raises(PosbenchError, match="differ in seed and in nothing else"):
        training.train_ensemble([a[0], b[0]], "unused", device="cpu")


# --- training ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def solo(tiny_data, tmp_path_factory):
    """The solo runs of seeds 0 and 1 (rope), trained once for the tests below."""
    out = tmp_path_factory.mktemp("solo")
    for spec in specs_for(tiny_data):
        training.train(spec, out, device="cpu", progress=False)
    return out


def test_train_seeds_as_an_ensemble_from_the_command_line(tiny_data, tmp_path, capsys):
    args = ["train", "--scheme", "rope", "--data", tiny_data.spec, "--tokenizer", "bytes", "--train-len", "16",
            "--steps", "5", "--batch-size", "4", "--d-model", "32", "--layers", "1", "--heads", "2",
            "--device", "cpu"]
    assert main([*args, "--runs-dir", str(tmp_path / "ens"), "--seeds", "0-1", "--ensemble", "2"]) == 0
    assert capsys.readouterr().out.count("one of an ensemble of 2") == 2
    for seed in (0, 1):
        assert main([*args, "--runs-dir", str(tmp_path / "solo"), "--seed", str(seed)]) == 0
    rows = {r["run_id"]: r for r in results.read_rows(tmp_path / "ens" / "runs.csv")}
    solo = {r["run_id"]: r for r in results.read_rows(tmp_path / "solo" / "runs.csv")}
    assert rows.keys() == solo.keys() and len(rows) == 2  # the run_ids of the solo runs
    for run_id, row in rows.items():
        assert row["status"] == "ok" and row["ensemble"] == "2" and row["compile"] == "off"
        assert solo[run_id]["ensemble"] == "" and row["seed"] == solo[run_id]["seed"]
        for name in ("config.json", "log.csv", "checkpoint.safetensors", "model.safetensors"):
            assert (tmp_path / "ens" / run_id / name).exists(), name
        assert [e["step"] for e in read_log(tmp_path / "ens" / run_id)] == list(range(1, 6))
        assert largest_difference(weights(tmp_path / "ens", run_id), weights(tmp_path / "solo", run_id)) < 1e-5
    assert main([*args, "--runs-dir", str(tmp_path / "ens"), "--seeds", "0,1", "--ensemble", "2"]) == 0
    assert capsys.readouterr().out.count("already trained") == 2  # finished: both kept
    assert main([*args, "--runs-dir", str(tmp_path / "ens"), "--seeds", "0-1", "--seed", "0"]) == 2


def test_members_end_where_their_solo_runs_end(tiny_data, solo, tmp_path):
    specs = specs_for(tiny_data)
    outcomes = training.train_ensemble(specs, tmp_path, device="cpu", progress=False)
    for spec, outcome in zip(specs, outcomes):
        assert outcome.row["ensemble"] == 2 and not outcome.skipped
        assert largest_difference(weights(tmp_path, spec.run_id), weights(solo, spec.run_id)) < 1e-5
        stacked, alone = read_log(tmp_path / spec.run_id), read_log(solo / spec.run_id)
        assert [e["step"] for e in stacked] == [e["step"] for e in alone]
        assert all(abs(a["loss"] - b["loss"]) < 1e-5 for a, b in zip(stacked, alone))
    rows = results.read_rows(tmp_path / "runs.csv")
    assert len(rows) == 2 and {r["ensemble"] for r in rows} == {"2"}
    solo_rows = results.read_rows(solo / "runs.csv")
    assert {r["ensemble"] for r in solo_rows} == {""}  # a solo run's cell stays empty


def test_randomized_positions_stack_each_member_its_own(tiny_data, tmp_path):
    specs = specs_for(tiny_data, steps=4, randomize_positions=True, randomize_max=64)
    outcomes = training.train_ensemble(specs, tmp_path / "ens", device="cpu", progress=False)
    for spec, outcome in zip(specs, outcomes):
        assert outcome.row["ensemble"] == 2
        training.train(spec, tmp_path / "solo", device="cpu", progress=False)
        assert largest_difference(weights(tmp_path / "ens", spec.run_id), weights(tmp_path / "solo", spec.run_id)) < 1e-5


def test_interrupted_ensemble_resumes_to_the_uninterrupted_weights(tiny_data, tmp_path):
    specs = specs_for(tiny_data)
    whole = training.train_ensemble(specs, tmp_path / "whole", device="cpu", progress=False)
    part = training.train_ensemble(specs, tmp_path / "split", device="cpu", progress=False, stop_after=3)
    assert [o.row["status"] for o in part] == ["partial", "partial"]
    resumed = training.train_ensemble(specs, tmp_path / "split", device="cpu", progress=False, resume=True)
    for spec, a, b in zip(specs, whole, resumed):  # bit for bit
        files = [(tmp_path / d / spec.run_id / "model.safetensors").read_bytes() for d in ("whole", "split")]
        assert files[0] == files[1]
        assert {k: v for k, v in a.row.items() if k not in VOLATILE} == {k: v for k, v in b.row.items() if k not in VOLATILE}
        assert [e["step"] for e in read_log(tmp_path / "split" / spec.run_id)] == list(range(1, 7))


def test_ctrl_c_checkpoints_every_member_and_resume_completes(tiny_data, tmp_path, monkeypatch):
    specs = specs_for(tiny_data)
    training.train_ensemble(specs, tmp_path / "whole", device="cpu", progress=False)
    original = training._record

    def record(run, drawn, value):  # Ctrl-C during step 3
        entry = original(run, drawn, value)
        if run.step == 3 and run.spec.seed == 0:
            os.kill(os.getpid(), signal.SIGINT)
        return entry

    monkeypatch.setattr(training, "_record", record)
    # Python's own Ctrl-C handler, whatever the shell that started pytest chose (a non-interactive
    # shell's `cmd &` ignores SIGINT, and training leaves an ignored SIGINT ignored)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(Interrupted, match="checkpointed at step 3 of 6, .* checkpointed at step 3 of 6"):
            training.train_ensemble(specs, tmp_path / "split", device="cpu", progress=False)
    finally:
        signal.signal(signal.SIGINT, previous)
    monkeypatch.undo()
    for spec in specs:  # each member checkpointed after the same step
        assert [e["step"] for e in read_log(tmp_path / "split" / spec.run_id)] == [1, 2, 3]
    training.train_ensemble(specs, tmp_path / "split", device="cpu", progress=False, resume=True)
    for spec in specs:
        files = [(tmp_path / d / spec.run_id / "model.safetensors").read_bytes() for d in ("whole", "split")]
        assert files[0] == files[1]


def poison(monkeypatch, seed: int, after: int):
    """The stacked loss of the member of `seed` becomes NaN from its step `after` on."""
    real = ensemble.Stack.forward_backward

    def poisoned(self, runs, drawn):
        values = real(self, runs, drawn)
        return [float("nan") if r.spec.seed == seed and r.step >= after else v for r, v in zip(runs, values)]

    monkeypatch.setattr(ensemble.Stack, "forward_backward", poisoned)


def test_a_member_that_goes_nan_fails_alone(tiny_data, solo, tmp_path, monkeypatch):
    poison(monkeypatch, seed=0, after=2)
    specs = specs_for(tiny_data)
    failed, ok = training.train_ensemble(specs, tmp_path, device="cpu", progress=False)
    assert isinstance(failed, RunFailed) and "loss became nan at step 2" in str(failed)
    assert ok.row["status"] == "ok" and ok.row["ensemble"] == 2
    rows = {r["seed"]: r for r in results.read_rows(tmp_path / "runs.csv")}
    assert rows["0"]["status"] == "failed" and "nan" in rows["0"]["message"]
    assert rows["1"]["status"] == "ok"
    assert [e["step"] for e in read_log(tmp_path / specs[0].run_id)] == [1, 2]  # checkpointed before the NaN
    # after the failure the other trained alone: still its solo run
    assert largest_difference(weights(tmp_path, specs[1].run_id), weights(solo, specs[1].run_id)) < 1e-5
    # the failed one goes on from its checkpoint, alone, with --resume
    monkeypatch.undo()
    (again,) = training.train_ensemble(specs[:1], tmp_path, device="cpu", progress=False, resume=True)
    assert again.row["status"] == "ok" and again.row.get("ensemble") is None


def test_a_member_that_learned_stops_early_and_the_other_goes_on(tiny_data, tmp_path, monkeypatch):
    specs = specs_for(tiny_data, stop_accuracy=0.5)
    real = training.learned

    def learned(entry, t):  # seed 0 reaches its target at its first validation (step 3)
        return entry.get("val_accuracy") == 1.0 or real(entry, t)

    monkeypatch.setattr(training, "learned", learned)
    sources = []
    original = training._record

    def record(run, drawn, value):
        entry = original(run, drawn, value)
        if run.spec.seed == 0 and entry["val_loss"] is not None:
            entry["val_accuracy"] = 1.0
        sources.append((run.spec.seed, run.step))
        return entry

    monkeypatch.setattr(training, "_record", record)
    first, second = training.train_ensemble(specs, tmp_path, device="cpu", progress=False)
    assert first.row["status"] == "ok" and first.row["stopped_at"] == 3
    assert second.row["status"] == "ok" and second.row["stopped_at"] is None
    assert (0, 4) not in sources and (1, 6) in sources
    assert [e["step"] for e in read_log(tmp_path / specs[1].run_id)] == list(range(1, 7))
    assert len(read_log(tmp_path / specs[0].run_id)) == 3


def test_a_scheme_that_does_not_stack_trains_each_member_as_its_solo_run(tiny_data, tmp_path, capsys):
    """fox's gates reach SDPA's float mask, whose gradient the CPU kernel refuses under vmap: the
    members fall back to their solo steps, bit for bit their solo runs."""
    specs = specs_for(tiny_data, scheme="fox", steps=2, eval_interval=2)
    outcomes = training.train_ensemble(specs, tmp_path / "ens", device="cpu", progress=False)
    assert "note: ensemble of 2 runs of fox: its" in capsys.readouterr().err
    for spec, outcome in zip(specs, outcomes):
        alone = training.train(spec, tmp_path / "solo", device="cpu", progress=False)
        assert outcome.row.get("ensemble") is None and outcome.row["weights_sha256"] == alone.row["weights_sha256"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the stacked kernels of a GPU")
@pytest.mark.parametrize("scheme", ["rope", "alibi", "t5"])
def test_an_ensemble_on_cuda_trains_stacked_and_each_member_as_its_solo_run(tiny_data, scheme, tmp_path, capsys):
    """On CUDA the members train stacked, without falling back (an H200 once refused the stacked
    backward of SDPA's memory-efficient kernel), and end where their solo runs, trained eager on
    the same GPU, end: float32 sums in another order, so within 1e-4."""
    specs = specs_for(tiny_data, scheme=scheme, seeds=(0, 1, 2), steps=4, eval_interval=4)
    outcomes = training.train_ensemble(specs, tmp_path / "ens", device="cuda", progress=False)
    assert "note: ensemble" not in capsys.readouterr().err
    for spec, outcome in zip(specs, outcomes):
        assert outcome.row["ensemble"] == 3
        eager = dataclasses.replace(spec, train=dataclasses.replace(spec.train, compile="off"))  # same run_id
        training.train(eager, tmp_path / "solo", device="cuda", progress=False)
        assert largest_difference(weights(tmp_path / "ens", spec.run_id), weights(tmp_path / "solo", spec.run_id)) < 1e-4


# --- a grid -------------------------------------------------------------------------------------

TASK = """
version = 1
name = "tinyensemble"
schemes = ["none", "alibi"]
seeds = [0, 1, 2]
""" + TINY_TASK


@pytest.mark.slow
def test_run_groups_the_seeds_of_each_scheme(corpus_dir, tmp_path, capsys):
    path = tmp_path / "tinyensemble.toml"
    path.write_text(TASK.format(corpus=corpus_dir))
    task = config.load_task(str(path))
    assert task.ensemble == "auto"
    out = tmp_path / "out"
    specs = grid(task)
    by = {(s.scheme, s.seed): s for s in specs}
    # the queue of `--workers`: one job per ensemble, finished runs alone
    assert sorted(len(workers.members(j)) for j in workers.jobs(specs, out, 2)) == [1, 1, 2, 2]
    assert workers.jobs(specs, out, 1) == [s.run_id for s in workers.order(specs)]
    training.train(by["none", 2], out, device="cpu", progress=False)  # trained before: left out of its group
    assert sorted(len(workers.members(j)) for j in workers.jobs(specs, out, 2)) == [1, 1, 2, 2]
    job = workers.Job(dataclasses.replace(task, ensemble=2), str(out), (1, 1), False, "cpu", 1, None, (), 1,
                      workers.run_one)
    done = workers.run_one(job, f"{by['alibi', 0].run_id},{by['alibi', 1].run_id}")  # what a worker does
    assert done["trained"] == 2 and done["evaluated"] == 2
    assert "(an ensemble of 2 seeds)" in capsys.readouterr().out
    assert main(["run", str(path), "--ensemble", "2", "--device", "cpu", "--out", str(out), "--no-speed"]) == 0
    rows = {(r["scheme"], r["seed"]): r for r in results.read_rows(out / "runs.csv")}
    assert len(rows) == 6 and {r["status"] for r in rows.values()} == {"ok"}
    assert {k: r["ensemble"] for k, r in rows.items()} == {
        ("none", "0"): "2", ("none", "1"): "2", ("none", "2"): "",
        ("alibi", "0"): "2", ("alibi", "1"): "2", ("alibi", "2"): ""}
    assert len({r["run_id"] for r in results.read_rows(out / "extrapolation.csv")}) == 6
    assert len(workers.jobs(specs, out, 2)) == 6  # all finished: each alone
    with pytest.raises(PosbenchError, match="ensemble must be"):
        config.build(config.Task, {"ensemble": 0})
