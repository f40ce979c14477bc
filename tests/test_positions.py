"""Randomized positions (Ruoss et al.) at test time: the evaluation draws, and their use by
perplexity and probe evaluation of a randomized run."""

import dataclasses

import pytest
import torch

from conftest import TINY_MODEL, TINY_TRAIN
from posbench import probing, stats
from posbench.config import EvalConfig, ProbesConfig, TrainConfig
from posbench.data import DataConfig
from posbench.evaluate import evaluate_run
from posbench.model import Transformer
from posbench.positions import evaluation_positions
from posbench.schemes import PositionLimitError
from posbench.runs import RunSpec
from posbench.training import train

RANDOMIZED = TrainConfig(train_len=16, randomize_positions=True, randomize_max=64)
RANDOMIZED_RUN = dataclasses.replace(TINY_TRAIN, randomize_positions=True, randomize_max=256)


def test_evaluation_draws_are_sorted_distinct_and_in_range():
    for length in (2, 16, 63):
        draws = [evaluation_positions(RANDOMIZED, length, d) for d in range(4)]
        for pos in draws:
            assert pos.shape == (length,) and pos.dtype == torch.long
            assert bool((pos[1:] > pos[:-1]).all())  # sorted and distinct
            assert 0 <= int(pos[0]) and int(pos[-1]) < 64
        assert len({tuple(p.tolist()) for p in draws}) == 4  # a new draw each time
    # the whole range when the window is as long as L_max
    assert torch.equal(evaluation_positions(RANDOMIZED, 64, 0), torch.arange(64))


def test_every_scheme_and_run_of_one_l_max_gets_the_same_draws():
    """Draws depend on L_max, the length and the draw index only: not on the scheme, the seed,
    the training length or steps."""
    a = RunSpec("rope", train=RANDOMIZED)
    b = RunSpec("alibi", seed=3, train=dataclasses.replace(RANDOMIZED, train_len=32, steps=9))
    for draw in range(3):
        assert torch.equal(evaluation_positions(a.train, 48, draw), evaluation_positions(b.train, 48, draw))
    other = dataclasses.replace(RANDOMIZED, randomize_max=128)
    assert not torch.equal(evaluation_positions(other, 48, 0), evaluation_positions(RANDOMIZED, 48, 0))


def test_plain_runs_read_consecutive_positions_and_long_windows_are_refused():
    assert evaluation_positions(TrainConfig(), 4096, 0) is None
    with pytest.raises(PositionLimitError, match="eval length 65 exceeds randomize_max 64"):
        evaluation_positions(RANDOMIZED, 65, 0)


@pytest.fixture(scope="module")
def randomized_run(tiny_data, tmp_path_factory):
    """A learned table over L_max = 256, trained at 16 on randomized positions."""
    spec = RunSpec("learned", data=tiny_data, model=TINY_MODEL, train=RANDOMIZED_RUN)
    return train(spec, tmp_path_factory.mktemp("runs"), device="cpu", progress=False).run_dir


@pytest.fixture
def seen_positions(monkeypatch):
    """The positions of every forward of the model."""
    seen = []
    forward = Transformer.forward

    def recording(self, idx, pos=None, targets=None):
        seen.append(None if pos is None else tuple(pos.tolist()))
        return forward(self, idx, pos, targets)

    monkeypatch.setattr(Transformer, "forward", recording)
    return seen


def draws_of(t, length, n):
    return {tuple(evaluation_positions(t, length, d).tolist()) for d in range(n)}


def test_randomized_run_is_evaluated_on_the_draws(randomized_run, seen_positions):
    cfg = EvalConfig(lengths=(32, 512), tokens=64, position_draws=3)
    rows, positions, per_window = evaluate_run(randomized_run, cfg, "cpu")
    by = {r["eval_len"]: r for r in rows}
    # never 0..L-1: the draws at 32, and the key-token reading's short windows at the training length's
    assert set(seen_positions) == draws_of(RANDOMIZED_RUN, 32, 3) | draws_of(RANDOMIZED_RUN, RANDOMIZED_RUN.train_len, 3)
    assert by[32]["status"] == "ok" and by[32]["position_draws"] == 3 and by[32]["tokens"] == 64
    assert by[512]["status"] == "unsupported" and "exceeds randomize_max 256" in by[512]["reason"]
    # positions.csv buckets are window indices, their counts those of one pass
    assert sum(p["tokens"] for p in positions) == 64 and max(p["position_end"] for p in positions) == 31
    # each window's loss is its mean over the draws, so the windows average to the row's loss
    assert sum(w["loss"] for w in per_window) / len(per_window) == pytest.approx(by[32]["loss"])


def test_randomized_run_probes_read_the_draws(tmp_path, seen_positions):
    data = DataConfig(spec="passkey")
    spec = RunSpec("learned", data=data, model=TINY_MODEL, train=dataclasses.replace(RANDOMIZED_RUN, train_len=32))
    run_dir = train(spec, tmp_path, device="cpu", progress=False).run_dir
    seen_positions.clear()
    cfg = ProbesConfig(lengths=(128, 512), trials=2)  # and the training length, 32
    rows = probing.evaluate_run(run_dir, cfg, EvalConfig(position_draws=2), "cpu")
    assert set(seen_positions) == draws_of(RANDOMIZED_RUN, 128, 2) | draws_of(RANDOMIZED_RUN, 32, 2)
    ok = [r for r in rows if r["eval_len"] == 128]
    assert len(ok) == 5 and all(r["status"] in ("ok", "not learned") and r["position_draws"] == 2 for r in ok)  # 5 depths
    assert all(r["answers"] == 2 * 2 and r["accuracy"] == r["hits"] / (2 * 2) for r in ok)  # one answer a prompt
    assert all((r["acc_lo"], r["acc_hi"]) == stats.wilson(r["hits"], 2 * 2) for r in ok)
    refused = [r for r in rows if r["eval_len"] == 512]
    assert refused and all(r["status"] == "unsupported" and "exceeds randomize_max" in r["reason"] for r in refused)


def test_tables_tell_randomized_runs_apart():
    """A randomized run and a plain run of one scheme are two rows of a table, not one mean."""
    from posbench.reporting import label

    assert label({"scheme": "rope", "position_draws": "4"}) == "rope+randomized"
    assert label({"scheme": "rope", "position_draws": 0}) == label({"scheme": "rope"}) == "rope"


def test_position_draws_flag(randomized_run, tmp_path):
    from posbench import results
    from posbench.cli import main

    runs = str(randomized_run.parent)
    common = ["--runs-dir", runs, "--lengths", "32", "--tokens", "64", "--device", "cpu", "--out", str(tmp_path)]
    assert main(["extrapolate", *common, "--position-draws", "2"]) == 0
    assert [r["position_draws"] for r in results.read_rows(tmp_path / "extrapolation.csv")] == ["2"]
    assert main(["extrapolate", *common, "--position-draws", "0"]) == 2


# --- real positions (RFS) ------------------------------------------------------------------------

FLOATS = dataclasses.replace(RANDOMIZED, randomize_positions=False, position_sampling="float")


def test_float_draws_are_sorted_reals_in_range_and_integer_draws_keep_their_seeds():
    integer = evaluation_positions(RANDOMIZED, 48, 0)
    for length in (2, 48, 64):
        pos = evaluation_positions(FLOATS, length, 0)
        assert pos.dtype == torch.float32 and pos.shape == (length,)
        assert bool((pos[1:] >= pos[:-1]).all()) and 0 <= float(pos[0]) and float(pos[-1]) < 64
        assert not torch.equal(pos, pos.round())  # reals, not integers
    assert torch.equal(evaluation_positions(RANDOMIZED, 48, 0), integer)  # the integer draw is the one it was
    gen = torch.Generator().manual_seed(0)
    from posbench.positions import training_positions, training_bound

    train_pos = training_positions(FLOATS, gen)
    assert train_pos.dtype == torch.float32 and train_pos.shape == (16,) and float(train_pos.max()) < 64
    assert training_bound(FLOATS) == 64


def test_float_sampling_names_its_runs_and_leaves_every_other_run_id():
    plain = RunSpec("rope", train=TINY_TRAIN)
    assert "position_sampling" not in plain.identity()["train"]
    assert RunSpec("rope", train=dataclasses.replace(TINY_TRAIN, position_sampling="integer")).run_id == plain.run_id
    rfs = RunSpec("rope", train=dataclasses.replace(TINY_TRAIN, position_sampling="float"))
    assert rfs.run_id != plain.run_id and rfs.identity()["train"]["randomize_max"] == 2048
    ints = RunSpec("rope", train=dataclasses.replace(TINY_TRAIN, randomize_positions=True))
    assert rfs.run_id != ints.run_id


@pytest.mark.parametrize("name", ["rope", "alibi", "xpos"])
def test_relative_schemes_at_real_positions_read_the_differences(name):
    """A relative scheme's outputs at real positions move by nothing under a shift by a real 0.37,
    and at reals they differ from those at the integers nearest them (by ~1e-5 at init, where the
    attention branch is small: float noise here is ~1e-8)."""
    from conftest import tiny_model

    model = tiny_model(name)
    x = torch.randint(0, 50, (2, 12))
    pos = torch.sort(torch.rand(12, generator=torch.Generator().manual_seed(2)) * 40).values
    with torch.no_grad():
        a, b = model(x, pos), model(x, pos + 0.37)
        c = model(x, pos.round().long())
    assert torch.allclose(a, b, atol=1e-7)
    assert not torch.allclose(a, c, atol=1e-6)


def test_sinusoidal_rows_at_integer_valued_reals_are_its_table_rows():
    from conftest import tiny_model

    scheme = tiny_model("sinusoidal").layout.schemes[0]
    pos = torch.tensor([0, 3, 17, 40])
    assert torch.allclose(scheme.table(pos.float()), scheme.table(pos), atol=1e-6)
    half = scheme.table(torch.tensor([2.5]))[0]
    k = torch.arange(0, 32, 2, dtype=torch.float64) / 32
    assert half[0::2].tolist() == pytest.approx(torch.sin(2.5 / 10000.0 ** k).tolist(), abs=1e-6)


@pytest.mark.parametrize("name", ["learned", "t5", "none", "rope@w4/t5"])
def test_schemes_of_integer_tables_refuse_real_positions_by_name(name, corpus_dir, tmp_path, capsys):
    from posbench.cli import main

    rc = main(["train", "--scheme", name, "--position-sampling", "float", "--data", f"files:{corpus_dir}",
               "--runs-dir", str(tmp_path), "--train-len", "16", "--steps", "1", "--tokenizer", "bytes",
               "--device", "cpu"])
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert rc != 0 and "Traceback" not in err and "--position-sampling float" in last
    refused = "t5" if name == "rope@w4/t5" else name
    assert f"float: {refused} of " in last


@pytest.mark.slow
def test_an_rfs_run_trains_and_is_evaluated_on_real_draws(corpus_dir, tmp_path):
    from posbench import results
    from posbench.cli import main
    from posbench.reporting import label

    assert main(["train", "--scheme", "rope", "--position-sampling", "float", "--data", f"files:{corpus_dir}",
                 "--runs-dir", str(tmp_path), "--train-len", "16", "--steps", "3", "--batch-size", "4",
                 "--d-model", "32", "--layers", "1", "--heads", "2", "--tokenizer", "bytes", "--device", "cpu"]) == 0
    assert main(["extrapolate", "--runs-dir", str(tmp_path), "--lengths", "16,64", "--tokens", "64",
                 "--device", "cpu", "--position-draws", "2"]) == 0
    rows = results.read_rows(tmp_path / "extrapolation.csv")
    assert {r["position_sampling"] for r in rows} == {"float"} and all(r["status"] == "ok" for r in rows)
    assert {label(r) for r in rows} == {"rope+rfs"}
    assert [r["randomized"] for r in results.read_rows(tmp_path / "runs.csv")] == ["float"]
    # windows.csv tells the RFS run from one on random integers, so `paired` can compare the two
    assert main(["train", "--scheme", "rope", "--randomize-positions", "--data", f"files:{corpus_dir}",
                 "--runs-dir", str(tmp_path), "--train-len", "16", "--steps", "3", "--batch-size", "4",
                 "--d-model", "32", "--layers", "1", "--heads", "2", "--tokenizer", "bytes", "--device", "cpu"]) == 0
    assert main(["extrapolate", "--runs-dir", str(tmp_path), "--lengths", "16,64", "--tokens", "64",
                 "--device", "cpu", "--position-draws", "2"]) == 0
    windows = results.read_rows(tmp_path / "windows.csv")
    assert {label(r) for r in windows} == {"rope+rfs", "rope+randomized"}
    assert main(["paired", "rope+rfs", "rope+randomized", "--runs-dir", str(tmp_path)]) == 0
