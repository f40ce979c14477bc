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
    assert set(seen_positions) == draws_of(RANDOMIZED_RUN, 32, 3)  # never 0..L-1
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
