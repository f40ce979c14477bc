"""The attention measures on weights whose answer is known, and attention.csv end to end:
recorded on every path, keyed and merged like the other tables."""

import math

import pytest
import torch

from conftest import TINY_MODEL, TINY_TRAIN, tiny_model
from posbench import attention, results
from posbench.attention import Span
from posbench.attention_measures import Recorder, query_measures
from posbench.cli import main
from posbench.config import EvalConfig
from posbench.readings import Models, extrapolate_runs
from posbench.runs import RunSpec
from posbench.training import train

T = 12


def uniform(t: int = T) -> torch.Tensor:
    """(1, 1, T, T): query i spreads its weight evenly over keys 0..i."""
    causal = torch.ones(t, t).tril()
    return (causal / causal.sum(-1, keepdim=True))[None, None]


def one_hot(offset: int, t: int = T) -> torch.Tensor:
    """(1, 1, T, T): query i puts all its weight on key i - offset (key 0 while i < offset)."""
    i = torch.arange(t)
    attn = torch.zeros(t, t)
    attn[i, (i - offset).clamp(min=0)] = 1
    return attn[None, None]


def test_uniform_attention_over_n_keys_has_entropy_log_n():
    m = query_measures(uniform(), train_len=4)
    n = torch.arange(1, T + 1).float()
    assert torch.allclose(m["entropy"][0, 0], n.log(), atol=1e-5)
    assert torch.allclose(m["entropy_norm"][0, 0, 1:], torch.ones(T - 1), atol=1e-5)
    assert math.isnan(m["entropy_norm"][0, 0, 0])  # one key: no spread to normalize
    assert torch.allclose(m["distance"][0, 0], (n - 1) / 2, atol=1e-5)  # mean of 0..i
    assert torch.allclose(m["sink_mass"][0, 0], 1 / n)
    # keys at distance >= 4: i - 3 of them among i + 1, from query 4 on
    far = m["far_mass"][0, 0]
    assert far[:4].isnan().all() and torch.allclose(far[4:], (n[4:] - 4) / n[4:], atol=1e-6)


@pytest.mark.parametrize("offset", [0, 1, 5])
def test_one_hot_head_has_entropy_zero_and_distance_its_offset(offset):
    m = query_measures(one_hot(offset), train_len=T)
    assert (m["entropy"] == 0).all()
    assert (m["entropy_norm"][0, 0, 1:] == 0).all()
    assert (m["distance"][0, 0, offset:] == offset).all()


def test_a_head_on_token_zero_has_sink_mass_one_and_recorder_means():
    attn = one_hot(T)  # every query on key 0
    m = query_measures(attn, train_len=4)
    assert (m["sink_mass"] == 1).all()
    assert (m["far_mass"][0, 0, 4:] == 1).all()
    # The recorder's row: head 0 on token 0, head 1 uniform; two windows, one layer.
    rec = Recorder([Span()], train_len=4)
    both = torch.cat([attn, uniform()], dim=1).expand(2, 2, T, T)
    rec(0, both)
    sink, spread = rec.rows()
    assert sink["sink_mass"] == 1 and sink["far_mass"] == 1 and sink["entropy"] == 0
    assert sink["windows"] == 2 and (sink["layer"], sink["head"]) == (0, 0)
    assert spread["entropy_norm"] == pytest.approx(1)  # queries 1..T-1, each uniform
    n = torch.arange(2, T + 1).double()
    assert spread["entropy"] == pytest.approx(float(n.log().mean()))


def test_weights_under_a_window_count_only_the_keys_they_see():
    span = Span("window", 4)
    mask = span.mask(T, "cpu").float()
    attn = (mask / mask.sum(-1, keepdim=True))[None, None]
    m = query_measures(attn, train_len=8, keys=span.visible(T, "cpu"))
    assert torch.allclose(m["entropy_norm"][0, 0, 1:], torch.ones(T - 1), atol=1e-5)
    assert (m["far_mass"][0, 0, 8:] == 0).all()  # a window of 4 never reaches distance 8


def test_observer_sees_the_weights_of_every_layer_on_the_explicit_path():
    model = tiny_model("alibi")
    model.backend = "explicit"
    seen = []
    with torch.no_grad(), attention.observe(lambda layer, a: seen.append((layer, a.shape, float(a.sum(-1).mean())))):
        model(torch.zeros(2, 10, dtype=torch.long))
    assert [(layer, shape) for layer, shape, _ in seen] == [(0, (2, 4, 10, 10)), (1, (2, 4, 10, 10))]
    assert all(total == pytest.approx(1) for *_, total in seen)
    assert attention._observer is None  # restored


@pytest.fixture(scope="module")
def runs(tiny_data, tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    for scheme in ("rope", "shaw"):  # rope: sdpa-causal, a second pass; shaw: explicit, recorded inline
        train(RunSpec(scheme, data=tiny_data, model=TINY_MODEL, train=TINY_TRAIN), runs,
              device="cpu", progress=False)
    return runs


@pytest.mark.slow
def test_attention_rows_keyed_and_merged_without_duplicates(runs, tmp_path):
    cfg = EvalConfig(lengths=(16, 32), tokens=64)
    rows = extrapolate_runs(Models(runs, device="cpu"), cfg, tmp_path, attention=True)
    first = results.read_rows(tmp_path / "attention.csv")
    # 2 runs x 2 lengths x 2 layers x 4 heads
    assert len(first) == 2 * 2 * 2 * 4
    key = results.TABLES["attention"]["key"]
    assert len({tuple(r[k] for k in key) for r in first}) == len(first)
    for r in first:
        assert 0 <= float(r["entropy_norm"]) <= 1 + 1e-6 and 0 <= float(r["sink_mass"]) <= 1
        assert (r["far_mass"] == "") == (r["eval_len"] == "16")  # no key past L inside L
    extrapolate_runs(Models(runs, device="cpu"), cfg, tmp_path, attention=True)
    second = results.read_rows(tmp_path / "attention.csv")
    assert len(second) == len(first)
    assert [r["entropy"] for r in second] == [r["entropy"] for r in first]  # deterministic
    # perplexity is still scored on the run's own path
    assert {r["backend"] for r in rows} == {"sdpa-causal", "explicit"}


@pytest.mark.slow
def test_extrapolate_attention_cli(runs, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["extrapolate", "--runs-dir", str(runs), "--lengths", "16,64", "--tokens", "64", "--device", "cpu",
                 "--scheme", "rope", "--attention", "--out", str(out)]) == 0
    assert "attention.csv" in capsys.readouterr().out
    rows = results.read_rows(out / "attention.csv")
    assert {r["eval_len"] for r in rows} == {"16", "64"} and {r["scheme"] for r in rows} == {"rope"}
    assert (out / "attention.png").stat().st_size > 1000 and (out / "attention_layers.png").exists()
    # shaw, recorded inline as it is scored: the short windows of key tokens are not measured with the length's
    inline = {}
    for flag in ("--key-tokens", "--no-key-tokens"):
        assert main(["extrapolate", "--runs-dir", str(runs), "--lengths", "64", "--tokens", "64", "--device", "cpu",
                     "--scheme", "shaw", "--attention", flag, "--out", str(tmp_path / flag)]) == 0
        inline[flag] = [r["entropy"] for r in results.read_rows(tmp_path / flag / "attention.csv")]
    assert inline["--key-tokens"] == inline["--no-key-tokens"]
    assert main(["extrapolate", "--runs-dir", str(runs), "--lengths", "16,64", "--tokens", "64", "--device", "cpu",
                 "--scheme", "rope", "--out", str(out)]) == 0
    assert len(results.read_rows(out / "attention.csv")) == len(rows)  # without --attention: untouched


@pytest.mark.slow
def test_report_merges_attention_tables_of_shards_without_duplicates(runs, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    extrapolate_runs(Models(runs, ["rope"], device="cpu"), EvalConfig(lengths=(16,), tokens=64), a, attention=True)
    extrapolate_runs(Models(runs, ["rope"], device="cpu"), EvalConfig(lengths=(32,), tokens=64), b, attention=True)
    for _ in range(2):  # merging the same shard again replaces its rows
        assert main(["report", str(a), "--merge", str(b)]) == 0
        rows = results.read_rows(a / "attention.csv")
        assert len(rows) == 2 * 2 * 4 and {r["eval_len"] for r in rows} == {"16", "32"}
