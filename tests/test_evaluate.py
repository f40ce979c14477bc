"""The evaluation protocols on predictors whose loss is known, the equal token budget, and
`unsupported` rows."""

import dataclasses
import math
import shutil

import pytest
import torch

from conftest import TINY_MODEL, TINY_TRAIN, tiny_model
from posbench import results
from posbench.cli import main
from posbench.config import EvalConfig
from posbench.evaluate import evaluate_run, score, windows
from posbench.readers import TrainedScorer
from posbench.readings import Models, extrapolate_runs
from posbench.runs import RunSpec
from posbench.training import train


class ContextPredictor:
    """Loss at window position p is 1 / (p + 1): more context, lower loss."""

    class cfg:
        n_heads = 1

    def __init__(self):
        self.seen = []

    def token_losses(self, idx, targets, pos=None):
        self.seen.append(idx.shape)
        p = torch.arange(idx.shape[1], dtype=torch.float)
        return (1.0 / (p + 1)).expand(idx.shape[0], -1)


STREAM = torch.arange(5000) % 97


def on_cpu(model, cfg: EvalConfig) -> TrainedScorer:
    return TrainedScorer(model, torch.device("cpu"), "float32", cfg.batch_tokens)


def mean_loss(total, count):
    return float(total.sum() / count.sum())


def test_nonoverlap_scores_every_token_with_known_loss():
    cfg = EvalConfig(tokens=512, batch_tokens=128)
    for length in (16, 64, 128):
        total, count, *_ = score(on_cpu(ContextPredictor(), cfg), STREAM, length, cfg, (16, 64, 128))
        harmonic = sum(1 / (p + 1) for p in range(length)) / length
        assert mean_loss(total, count) == pytest.approx(harmonic)
        assert count.sum() == 512 and (count == 512 / length).all()


def test_sliding_scores_only_last_stride_tokens():
    cfg = EvalConfig(mode="sliding", stride=16, tokens=256)
    total, count, *_ = score(on_cpu(ContextPredictor(), cfg), STREAM, 64, cfg, (64, 128))
    assert (count[:48] == 0).all() and (count[48:] == 256 / 16).all()
    expect = sum(1 / (p + 1) for p in range(48, 64)) / 16
    assert mean_loss(total, count) == pytest.approx(expect)


def test_same_targets_at_every_length():
    cfg = EvalConfig(tokens=512)
    lengths = (16, 32, 64, 128)

    def targets(length, cfg):
        starts, first = windows(STREAM, length, cfg, lengths)
        return sorted((s + 1 + p) for s in starts.tolist() for p in range(first, length))

    same = [targets(n, cfg) for n in lengths]
    assert all(t == same[0] for t in same) and len(same[0]) == 512
    sliding = dataclasses.replace(cfg, mode="sliding", stride=8)
    same = [targets(n, sliding) for n in lengths]
    assert all(t == same[0] for t in same) and len(same[0]) == 512
    assert min(same[0]) == max(lengths)  # every scored token has full context at every length
    # A length that does not divide the budget scores fewer tokens, and says so.
    starts, _ = windows(STREAM, 100, cfg, lengths)
    assert len(starts) * 100 == 500


def test_uniform_model_has_vocabulary_perplexity():
    model = tiny_model("rope")
    with torch.no_grad():
        model.head.weight.zero_()
    cfg = EvalConfig(tokens=256)
    total, count, *_ = score(on_cpu(model, cfg), STREAM % 50, 64, cfg, (64,))
    assert math.exp(mean_loss(total, count)) == pytest.approx(50, rel=1e-5)


def test_batches_bound_attention_memory():
    model = ContextPredictor()
    cfg = EvalConfig(tokens=2048, batch_tokens=1 << 20)
    score(on_cpu(model, cfg), STREAM, 1024, cfg, (1024,))
    assert all(b * 1024 * 1024 * 4 <= 512 * 2**20 for b, _ in model.seen)


def test_short_test_split_is_one_clear_error():
    from posbench.errors import PosbenchError

    with pytest.raises(PosbenchError, match="shorter than one window"):
        windows(torch.arange(50), 64, EvalConfig(), (64,))


@pytest.fixture(scope="module")
def trained(tiny_data, tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    for scheme in ("learned", "rope", "alibi"):
        train(RunSpec(scheme, data=tiny_data, model=TINY_MODEL, train=TINY_TRAIN), runs,
              device="cpu", progress=False)
    return runs


def test_unsupported_rows_and_hierarchical_extension(trained):
    cfg = EvalConfig(lengths=(16, 32), tokens=64, learned_extension=("none", "hierarchical"))
    (run,) = [p for p in trained.iterdir() if p.name.startswith("learned-")]
    rows, positions, _ = evaluate_run(run, cfg, "cpu")
    by = {(r["eval_len"], r["extension"]): r for r in rows}
    assert by[(16, "none")]["status"] == "ok"
    assert by[(32, "none")]["status"] == "unsupported" and "beyond its table of 16" in by[(32, "none")]["reason"]
    assert by[(32, "hierarchical")]["status"] == "ok"
    # The extension reproduces the trained table on its first rows: identical loss in-length.
    assert by[(16, "hierarchical")]["loss"] == pytest.approx(by[(16, "none")]["loss"], abs=1e-6)
    assert {p["eval_len"] for p in positions} == {16, 32}


def test_rope_scaling_rows(trained):
    cfg = EvalConfig(lengths=(16, 64), tokens=64, rope_scaling=("none", "pi", "yarn"))
    (run,) = [p for p in trained.iterdir() if p.name.startswith("rope-")]
    rows, *_ = evaluate_run(run, cfg, "cpu")
    by = {(r["eval_len"], r["scaling"]): r["loss"] for r in rows}
    assert by[(16, "pi")] == by[(16, "none")] == by[(16, "yarn")]  # s = 1 in length
    assert by[(64, "pi")] != by[(64, "none")] != by[(64, "yarn")]


def test_dynamic_ntk_with_a_factor_and_llama3_rows(trained):
    """With a fixed factor, dynamic-ntk is plain RoPE up to the training length (16) and scaled
    beyond, unlike ntk; llama3 records non-default bounds in its scaling label."""
    cfg = EvalConfig(lengths=(16, 64), tokens=64, rope_scaling=("none", "ntk", "dynamic-ntk", "llama3"),
                     rope_scaling_factor=4.0, llama3_high=2.0)
    (run,) = [p for p in trained.iterdir() if p.name.startswith("rope-")]
    rows, *_ = evaluate_run(run, cfg, "cpu")
    loss = {(r["eval_len"], r["scaling"]): r["loss"] for r in rows}
    assert {s for _, s in loss} == {"none", "ntk:4", "dynamic-ntk:4", "llama3:4(low=1,high=2)"}
    assert loss[(16, "dynamic-ntk:4")] == loss[(16, "none")] != loss[(16, "ntk:4")]
    assert loss[(64, "dynamic-ntk:4")] not in (loss[(64, "none")], loss[(64, "ntk:4")])
    assert loss[(64, "llama3:4(low=1,high=2)")] != loss[(64, "none")]


@pytest.mark.slow
def test_llama3_bounds_from_the_command_line(trained, tmp_path, capsys):
    args = ["extrapolate", "--runs-dir", str(trained), "--lengths", "32", "--tokens", "64", "--scheme", "rope",
            "--rope-scaling", "llama3", "--llama3-low", "1", "--llama3-high", "2", "--device", "cpu",
            "--out", str(tmp_path)]
    assert main(args) == 0
    assert {r["scaling"] for r in results.read_rows(tmp_path / "extrapolation.csv")} == {"llama3(low=1,high=2)"}
    capsys.readouterr()
    assert main([*args, "--llama3-high", "0.5"]) == 2
    assert "0 < low < high" in capsys.readouterr().err


def test_repeated_extrapolate_never_duplicates(trained, tmp_path):
    cfg = EvalConfig(lengths=(16, 32), tokens=64)
    extrapolate_runs(Models(trained, device="cpu"), cfg, tmp_path)
    first = results.read_rows(tmp_path / "extrapolation.csv")
    extrapolate_runs(Models(trained, device="cpu"), cfg, tmp_path)
    second = results.read_rows(tmp_path / "extrapolation.csv")
    assert len(first) == len(second) == 3 * 2
    assert [r["loss"] for r in first] == [r["loss"] for r in second]  # deterministic


@pytest.mark.slow
def test_extrapolate_cli(trained, tmp_path, capsys):
    out = tmp_path / "out"
    args = ["extrapolate", "--runs-dir", str(trained), "--lengths", "16,32", "--mode", "sliding",
            "--stride", "8", "--device", "cpu", "--out", str(out), "--scheme", "rope,alibi"]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "perplexity, sliding" in text and "rope" in text and "learned" not in text
    rows = results.read_rows(out / "extrapolation.csv")
    assert {r["scheme"] for r in rows} == {"rope", "alibi"} and {r["stride"] for r in rows} == {"8"}
    assert (out / "extrapolation.png").stat().st_size > 1000 and (out / "positions.png").exists()
    assert main(["extrapolate", "--runs-dir", str(tmp_path / "none")]) == 2
    assert main(["extrapolate", "--runs-dir", str(trained), "--lengths", "16,x"]) == 2


def test_window_losses_uncertainty_and_paired_cli(trained, tmp_path, capsys):
    from posbench import stats

    out = tmp_path / "out"
    args = ["extrapolate", "--runs-dir", str(trained), "--lengths", "16,32", "--mode", "sliding", "--stride", "8",
            "--tokens", "96", "--device", "cpu", "--out", str(out), "--scheme", "rope,alibi", "--tolerance", "0.5"]
    assert main(args) == 0
    assert "effective length" in capsys.readouterr().out
    win = results.read_rows(out / "windows.csv")
    for row in results.read_rows(out / "extrapolation.csv"):
        mine = [w for w in win if (w["run_id"], w["eval_len"]) == (row["run_id"], row["eval_len"])]
        losses = [float(w["loss"]) for w in mine]
        assert len(losses) == 96 // 8
        assert sum(losses) / len(losses) == pytest.approx(float(row["loss"]), rel=1e-5)
        # Sliding windows of 32 by 8 share context four at a time: blocks of 4 windows.
        se, _ = stats.batch_se(losses, int(row["eval_len"]) // 8)
        assert float(row["loss_se"]) == pytest.approx(se, rel=1e-3) and se > 0  # CSV keeps 6 digits
        assert float(row["ppl_lo"]) < float(row["ppl"]) < float(row["ppl_hi"])
    starts = {s: [w["start"] for w in win if w["scheme"] == s and w["eval_len"] == "32"] for s in ("rope", "alibi")}
    assert starts["rope"] == starts["alibi"]  # every scheme scores the same windows
    assert {r["protocol"] for r in results.read_rows(out / "effective_length.csv")} == {"sliding/8"}
    assert main(["paired", "rope", "alibi", "--runs-dir", str(out), "--lengths", "32"]) == 0
    text = capsys.readouterr().out
    assert "rope vs alibi" in text and "sliding/8" in text


@pytest.mark.slow
def test_a_rope_scaling_that_skips_schemes_says_so_in_one_line(trained, tiny_data, tmp_path, capsys):
    """pope and fope take no eval-time RoPE scaling: their rows are `none` only, and one line says
    which schemes took it and which did not."""
    runs = tmp_path / "runs"
    shutil.copytree(trained, runs)
    for scheme in ("pope", "fope"):
        train(RunSpec(scheme, data=tiny_data, model=TINY_MODEL, train=dataclasses.replace(TINY_TRAIN, steps=2)),
              runs, device="cpu", progress=False)
    capsys.readouterr()
    args = ["extrapolate", "--runs-dir", str(runs), "--lengths", "16,32", "--tokens", "64", "--device", "cpu"]
    assert main([*args, "--scheme", "pope,fope,rope", "--rope-scaling", "none,yarn"]) == 0
    rows = results.read_rows(runs / "extrapolation.csv")
    assert {(r["scheme"], r["scaling"]) for r in rows} == {("pope", "none"), ("fope", "none"), ("rope", "none"),
                                                           ("rope", "yarn")}
    assert capsys.readouterr().err.strip().splitlines() == [
        "note: --rope-scaling yarn applies to p-rope, resonance, rope, rope-pp and the layouts with them; fope, pope "
        "take none: their rows are `none` only"]
    assert main([*args, "--scheme", "rope", "--rope-scaling", "none,yarn"]) == 0  # nothing skipped: nothing said
    assert main([*args, "--scheme", "pope"]) == 0  # nothing asked: nothing said
    assert capsys.readouterr().err.strip() == ""
