"""Partial rotary in its two conventions (posbench/docs/choices.md): `rope` with `fraction` p rotates the first
floor(p * D) dims at the spectrum of a smaller head; `p-rope` keeps the full head's spectrum and
zeroes its lowest frequencies. The tiny model has head dim D = 8, base 10000."""

import math
import re

import pytest
import torch

from conftest import tiny_model
from posbench.cli import main
from posbench.errors import PosbenchError
from posbench.policies import RopeScaling

T = 16


def outputs(model, pos):
    x = torch.randint(0, 50, (2, T), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return model(x, pos)


@pytest.mark.parametrize("name", ["rope", "p-rope"])
def test_fraction_one_is_rope(name):
    pos = torch.arange(T) + 3
    assert torch.equal(outputs(tiny_model(name, fraction=1.0), pos), outputs(tiny_model("rope"), pos))


@pytest.mark.parametrize("name", ["rope", "p-rope"])
def test_fraction_zero_leaves_attention_position_free(name):
    """q.k and so every output are the same at any positions, not only under a shift."""
    model = tiny_model(name, fraction=0.0)
    scattered = torch.tensor([0, 5, 9, 40, 41, 77, 100, 101, 230, 231, 300, 512, 700, 701, 900, 1000])
    assert torch.equal(outputs(model, torch.arange(T)), outputs(model, scattered))
    q, k = torch.randn(2, 1, 2, T, 8).unbind(0)
    scheme = model.layout.schemes[0]
    assert all(torch.equal(a, b) for a, b in zip(scheme.rotate(q, k, scattered, scheme.prepare(scattered), 0), (q, k)))


def test_at_half_the_two_conventions_keep_different_frequencies():
    """D = 8, p = 0.5. rope fraction: r = 4 dims, theta_t = 10000^(-2t/4) = 1, 0.01, and dims 4..7
    pass. p-rope: floor(0.5 * 8 / 2) = 2 pairs keep 10000^(-2t/8) = 1, 0.1; the other two are 0."""
    partial = tiny_model("rope", fraction=0.5).layout.schemes[0]
    proportional = tiny_model("p-rope", fraction=0.5).layout.schemes[0]
    assert partial.frequencies(T)[0].tolist() == pytest.approx([1.0, 0.01])
    assert proportional.frequencies(T)[0].tolist() == pytest.approx([1.0, 0.1, 0.0, 0.0])
    # the same unit vector on the second kept pair, rotated at position 5
    m = 5
    x = torch.zeros(1, 1, 1, 8)
    x[..., 1] = 1.0  # pair 1: (x_1, x_3) of the 4 rotated dims; (x_1, x_5) of the whole head
    pos = torch.tensor([m])
    y, _ = partial.rotate(x, x, pos, partial.prepare(pos), 0)
    assert y[0, 0, 0].tolist() == pytest.approx([0, math.cos(m * 0.01), 0, math.sin(m * 0.01), 0, 0, 0, 0], abs=1e-6)
    y, _ = proportional.rotate(x, x, pos, proportional.prepare(pos), 0)
    assert y[0, 0, 0].tolist() == pytest.approx([0, math.cos(m * 0.1), 0, 0, 0, math.sin(m * 0.1), 0, 0], abs=1e-6)
    x = torch.zeros(1, 1, 1, 8)
    x[..., 6] = 1.0  # passes through rope fraction=0.5 (dim 6 >= r), and p-rope's zeroed pair 2
    for scheme in (partial, proportional):
        assert torch.equal(scheme.rotate(x, x, pos, scheme.prepare(pos), 0)[0], x)


def test_scaling_acts_on_the_rotated_dims():
    """ntk over r = 4 rotated dims: base * s^(r/(r-2)) = 10000 * 4^2 at 4x (transformers computes
    the scaled frequencies over int(D * partial_rotary_factor) dims)."""
    scheme = tiny_model("rope", fraction=0.5).layout.schemes[0]
    scheme.set_scaling(RopeScaling("ntk"))
    assert scheme.frequencies(4 * T)[0].tolist() == pytest.approx([1.0, (10000 * 16) ** -0.5])
    scheme = tiny_model("p-rope", fraction=0.5).layout.schemes[0]
    scheme.set_scaling(RopeScaling("pi"))
    assert scheme.frequencies(4 * T)[0].tolist() == pytest.approx([0.25, 0.1 / 4, 0.0, 0.0])


@pytest.mark.parametrize("name, fraction, message", [
    ("rope", 0.125, "fraction=0.125 rotates r = floor(p * 8) = 1 dims of the head; r must be even"),
    ("rope", 1.5, "fraction of scheme 'rope' must be in [0, 1], got 1.5"),
    ("p-rope", -0.5, "fraction of scheme 'p-rope' must be in [0, 1], got -0.5"),
])
def test_fractions_that_give_no_valid_rotation_are_refused(name, fraction, message):
    with pytest.raises(PosbenchError, match=re.escape(message)):
        tiny_model(name, fraction=fraction)


def test_an_odd_rotated_width_is_one_line_from_the_command_line(corpus_dir, tmp_path, capsys):
    args = ["train", "--scheme", "rope", "--param", "fraction=0.125", "--data", f"files:{corpus_dir}",
            "--runs-dir", str(tmp_path), "--train-len", "16", "--steps", "2", "--batch-size", "2",
            "--d-model", "32", "--layers", "1", "--heads", "4", "--tokenizer", "bytes", "--device", "cpu"]
    assert main(args) == 2
    err = capsys.readouterr().err  # above the last line: the data loader's progress, in-process only
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == ("error: rope: fraction=0.125 rotates r = floor(p * 8) = 1 dims "
                                            "of the head; r must be even")


def test_fractions_round_down():
    """p * D rounds down, as GPT-NeoX's int(head_size * rotary_pct) and the p-RoPE paper's
    int(p * D // 2): rope 0.3 * 8 = 2.4 -> 2 dims; p-rope 0.3 * 4 = 1.2 -> 1 pair."""
    assert tiny_model("rope", fraction=0.3).layout.schemes[0].rotary_dim == 2
    assert tiny_model("p-rope", fraction=0.3).layout.schemes[0].kept_pairs == 1


def test_report_keeps_runs_with_other_parameters_apart_from_seeds():
    """rope and rope fraction=0.25 are two rows of the table, not one averaged over "seeds";
    a row from before `fraction` existed (no fraction in params) is plain rope."""
    from posbench.reporting import label, ppl_grid

    rows = [{"scheme": "rope", "params": params, "eval_len": 64, "ppl": ppl, "status": "ok",
             "scaling": "none", "extension": "none"}
            for params, ppl in (("base=10000.0", 10.0), ("base=10000.0,fraction=1.0", 10.0),
                                ("base=10000.0,fraction=0.25", 12.0))]
    assert [label(r) for r in rows] == ["rope", "rope", "rope(fraction=0.25)"]
    _, cells = ppl_grid([rows[0], rows[2]], mark=str)
    assert cells == [["rope (1 seed)", "10.00"], ["rope(fraction=0.25) (1 seed)", "12.00"]]
