"""`posbench inspect`: the arrays behind each picture against the schemes' closed forms, the
pictures and their page end to end, with and without a trained run."""

import math
import re

import pytest
import torch

from conftest import TINY_MODEL, TINY_TRAIN
from posbench import api, inspection, results
from posbench.cli import main
from posbench.config import load_task
from posbench.policies import from_eval
from posbench.runs import RunSpec, load_trained
from posbench.training import train

L = 16
DIMS = inspection.dims_for(load_task("quick"), L)  # d_model 128, 4 heads of 32


def scheme(name):
    (s,) = inspection.schemes_of(name, DIMS)
    return s


def test_rope_logit_of_q_equal_k_is_the_scaled_maximum_at_distance_zero_and_decays():
    n = 16 * L
    data = inspection.logit_by_distance(scheme("rope"), n)
    same = data["same"]  # (H, n)
    top = 1 / math.sqrt(DIMS.head_dim)  # q.q of a unit vector, times the 1/sqrt(D) of attention
    assert torch.allclose(same[:, 0], torch.full((DIMS.n_heads,), top), atol=1e-6)
    assert (same <= top + 1e-6).all()
    assert same[:, L:].mean() < 0.6 * top and same[:, 1:4].mean() > 0.8 * top  # RoFormer's long-term decay
    assert data["random_mean"].abs().mean() < 0.2 * top  # independent q, k: no preferred sign


def test_rope_pair_angles_turn_at_its_frequencies_and_mark_periods_within_L():
    n = 4 * L
    data = inspection.pair_angles(scheme("rope"), n, L)
    d = DIMS.head_dim
    theta = 10000.0 ** (-torch.arange(0, d, 2).double() / d)  # (D/2,) RoFormer's frequencies
    assert data["pairs"].tolist() == [[t, t + d // 2] for t in range(d // 2)]  # half-split pairs
    expect = theta[:, None] * torch.arange(n).double()
    assert torch.allclose(data["angles"].double(), expect, rtol=1e-4, atol=1e-4)
    assert data["periodic"].tolist() == (2 * math.pi / theta <= L).tolist()


def test_pi_scaling_slows_every_pair_by_the_ratio():
    rope = scheme("rope")
    n = 4 * L
    plain = inspection.pair_angles(rope, n, L)["angles"]
    rope.set_scaling(from_eval("pi", load_task("quick").eval))  # s = n / L at a window of n
    slow = inspection.pair_angles(rope, n, L)["angles"]
    assert torch.allclose(slow * (n / L), plain, rtol=1e-4, atol=1e-4)


def test_alibi_bias_is_minus_slope_times_distance():
    data = inspection.bias_by_distance(scheme("alibi"), 4 * L)
    slopes = torch.tensor([2**-2, 2**-4, 2**-6, 2**-8])  # Press et al., 4 heads: 2^(-8h/H)
    assert torch.allclose(data["bias"], -slopes[:, None] * torch.arange(4 * L).float())
    matrix = inspection.bias_matrix(scheme("alibi"), 8)
    assert matrix[1, 5, 2] == -3 * 2**-4 and math.isinf(matrix[0, 2, 5])


def test_sinusoidal_similarity_is_one_on_the_diagonal_and_symmetric():
    vectors = inspection.position_vectors(scheme("sinusoidal"), 4 * L)
    sim = inspection.cosine_similarity(vectors)
    assert vectors.shape == (4 * L, DIMS.d_model)
    assert torch.allclose(vectors[0, 1::2], torch.ones(DIMS.d_model // 2))  # cos(0) = 1, sin(0) = 0
    assert torch.allclose(sim.diagonal(), torch.ones(4 * L), atol=1e-6) and torch.allclose(sim, sim.T)
    assert (sim < 1 - 1e-3).masked_select(~torch.eye(4 * L, dtype=torch.bool)).all()


def test_learned_table_is_the_table_it_adds():
    learned = scheme("learned")
    assert torch.equal(inspection.position_vectors(learned, L), learned.table.detach())


@pytest.mark.slow
def test_inspect_cli_writes_the_pictures_and_the_page(tmp_path, capsys):
    out = tmp_path / "pics"
    args = ["inspect", "rope,alibi,t5,sinusoidal,fire", "--train-len", "8", "--rope-scaling", "yarn", "--out", str(out)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    expect = ["rope-logits", "rope-angles", "alibi-bias", "t5-bias", "sinusoidal-table", "fire-bias"]
    for name in expect:
        assert (out / f"{name}.png").stat().st_size > 5000 and name in printed
    page = (out / "inspect.md").read_text()
    links = re.findall(r"\]\(([^)]+)\)", page)
    assert sorted(links) == sorted(f"{n}.png" for n in expect)
    assert "L = 8" in page and "to 128 positions" in page


def test_inspect_without_schemes_or_with_a_bad_one_is_one_line(tmp_path, capsys):
    assert main(["inspect", "--out", str(tmp_path / "x")]) == 2
    assert main(["inspect", "rpoe", "--out", str(tmp_path / "x")]) == 2
    assert main(["inspect", "rope", "--lengths", "1", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "name the schemes" in err and "did you mean 'rope'" in err and "Traceback" not in err
    assert not (tmp_path / "x").exists()


@pytest.fixture(scope="module")
def trained(tiny_data, tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    for name in ("t5", "fox"):
        train(RunSpec(name, data=tiny_data, model=TINY_MODEL, train=TINY_TRAIN), runs, device="cpu", progress=False)
    return runs


@pytest.mark.slow
def test_inspect_trained_runs_draws_learned_parameters_and_measures_attention(trained, tmp_path, capsys):
    out = tmp_path / "learned"
    frame = api.inspect(runs_dir=trained, lengths="16,32", device="cpu", out=out)
    t5, fox = (next(p.name for p in trained.iterdir() if p.name.startswith(f"{s}-")) for s in ("t5", "fox"))
    assert (out / f"{t5}-bias.png").exists() and (out / f"{fox}-gates.png").exists()
    assert (out / "attention.png").exists() and (out / "attention_layers.png").exists()
    rows = results.read_rows(out / "attention.csv")
    assert {r["run_id"] for r in rows} == {t5, fox} and {r["eval_len"] for r in rows} == {"16", "32"}
    page = (out / "inspect.md").read_text()
    assert all((out / link).exists() for link in re.findall(r"\]\(([^)]+)\)", page))
    pictures = {(p.scheme, p.kind): p for p in frame.attrs["pictures"]}
    # the trained bias is the run's own learned one, not a fresh initialization
    _, model, _ = load_trained(trained / t5)
    learned = model.layout.schemes[0]
    expect = learned.bias_fn(torch.arange(4)[:, None], torch.tensor(31), torch.tensor(28)).float()[:, 0]
    assert torch.equal(pictures[(t5, "bias")].data["bias"][:, 3], expect)
    # a forget gate only ever discounts: the last query's decay is 1 on itself and falls with distance
    decay = pictures[(fox, "gates")].data["decay"].flip(-1)  # (layers, H, T) by distance
    assert decay.shape == (TINY_MODEL.n_layers, TINY_MODEL.n_heads, 32)  # the text: to the longest length
    assert torch.allclose(decay[..., 0], torch.ones(1)) and (decay.diff(dim=-1) <= 1e-6).all()


@pytest.mark.slow
def test_inspect_one_run_on_the_command_line(trained, tmp_path, capsys):
    t5 = next(p.name for p in trained.iterdir() if p.name.startswith("t5-"))
    out = tmp_path / "one"
    assert main(["inspect", "--run", t5, "--runs-dir", str(trained), "--lengths", "16", "--device", "cpu",
                 "--out", str(out)]) == 0
    assert f"{t5}-bias.png" in capsys.readouterr().out and (out / "inspect.md").exists()
    assert {r["run_id"] for r in results.read_rows(out / "attention.csv")} == {t5}
    assert main(["inspect", "t5", "--run", t5, "--runs-dir", str(trained), "--out", str(tmp_path / "x")]) == 2
    assert main(["inspect", "--run", "t5-0000000000", "--runs-dir", str(trained), "--out", str(tmp_path / "x")]) == 2
    assert "not both" in capsys.readouterr().err and not (tmp_path / "x").exists()
