"""Plug-ins of the kinds a new user writes without seeing posbench's tests: a scheme that reads the
future through a weight that starts at zero, one whose scores overflow past the training length,
one that declares a finite table. `check` and `extrapolate` must judge each as it is."""

import textwrap
from pathlib import Path

import pytest

from posbench import plugins
from posbench.conformance import CHECKS, check, cost
from test_plugins import GOOD, TABLE

# RoPE whose angles are scaled by tanh(mean of the whole window @ w): the mean reads later tokens.
PEEK = """
import torch
from torch import nn
from posbench.schemes import Scheme, register


@register
class PeekRope(Scheme):
    name = "peek-rope"
    family = "rotary"
    hooks = ("content", "qk")
    defaults = {"init": "zero"}

    def __init__(self, dims):
        super().__init__(dims)
        w = torch.zeros(dims.d_model) if self.p["init"] == "zero" else 0.02 * torch.randn(dims.d_model)
        self.w = nn.Parameter(w)
        d = self.head_dim
        self.register_buffer("inv", 10000.0 ** (-torch.arange(0, d, 2).float() / d), persistent=False)

    def content(self, x, layer):
        return torch.tanh(x.mean(dim=1) @ self.w)  # (B,)

    def rotate(self, q, k, pos, ctx, layer, z):
        angle = pos.float()[:, None] * self.inv * (1 + z[:, None, None, None])
        cos, sin = angle.cos(), angle.sin()

        def turn(x):
            a, b = x.float().chunk(2, dim=-1)
            return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1).to(x.dtype)

        return turn(q), turn(k)
"""


def load(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    plugins.load_all([str(path)])
    return path


def only(*props: str) -> tuple[str, ...]:
    return tuple(p for p in CHECKS if p not in props)


@pytest.mark.parametrize("init", ["zero", "random"])
def test_causality_is_exact_and_reads_moved_weights(registry, tmp_path, init):
    """The leak moves earlier outputs by about 1e-6 at initialization, under any tolerance (and
    not at all with w = 0): the Jacobian with respect to later embeddings is not exactly zero."""
    load(tmp_path, "peek.py", PEEK)
    [found] = check("peek-rope", {"init": init}, skip=only("causality"))
    assert found.prop == "causality" and found.status == "fail", found
    assert "reads the input at" in found.detail and "not 0" in found.detail, found
    first = "weights as initialized" if init == "random" else "weights redrawn"
    assert f"sdpa-causal, {first}: the output at 1 reads the input at 2" in found.detail, found


@pytest.mark.parametrize("name", ["rope", "none+ssmax", "rnope-swa"])
def test_causality_passes_builtins_on_every_draw_and_path(name):
    [found] = check(name, skip=only("causality"))
    assert found.status == "pass", found
    assert "as initialized, redrawn, redrawn x30" in found.detail and "zero Jacobian" in found.detail
    assert ("flex" in found.detail.split(";")[0]) == (name == "rnope-swa"), found


# test_plugins' table of 64 rows, declaring its end as the plug-ins page asks.
TABLE64 = TABLE.replace('"tablepe"', '"table64"').replace('hooks = ("input",)', 'hooks = ("input",)\n    extrapolates = "no"') + """
    def position_limit(self):
        return 64
"""


def test_check_times_a_declared_table_inside_it(registry, tmp_path, monkeypatch, capsys):
    from posbench.cli import main

    monkeypatch.chdir(tmp_path)
    load(tmp_path, "table64.py", TABLE64)
    assert main(["check", "table64", "--plugin", "table64.py", "--skip", ",".join(only("past training length"))]) == 0
    out = capsys.readouterr().out
    assert out.startswith("pass past training length ") and "refuses past its limit of 64" in out, out
    found = cost("table64", None, repeats=1)
    assert found.status in ("pass", "warn") and found.detail.startswith("16 tokens: "), found
    assert "; 64 tokens: " in found.detail and found.detail.endswith("(inside its table of 64 positions)"), found


@pytest.mark.slow
def test_check_learned_has_no_failed_property(capsys):
    from posbench.cli import main

    assert main(["check", "learned"]) == 0
    out = capsys.readouterr().out
    assert "learned: 12 of 12 properties without a fail" in out and "128 tokens: " in out and "512 tokens: " in out


def test_cost_lengths_inside_a_table():
    from posbench.conformance import cost_lengths

    assert cost_lengths(None) == ((128, 512), "") == cost_lengths(512)
    assert cost_lengths(200) == ((128,), "inside its table of 200 positions")
    assert cost_lengths(64) == ((16, 64), "inside its table of 64 positions")
    assert cost_lengths(31) == ((), "its table holds 31 positions, too few to time")


# A bias that grows with the distance: finite at 32 and 128 tokens, NaN at 1024 (exp overflows
# in float32 past a distance of about 700).
OVERFLOW = GOOD.format(name="overflow").replace("return -self.slope[h] * (qpos - kpos).clamp(min=0)",
                                                "return self.slope[h] * torch.exp((qpos - kpos).float() / 8)")


def test_a_non_finite_loss_is_a_failed_row_with_its_reason(registry, tmp_path, corpus_dir, monkeypatch, capsys):
    from posbench import results
    from posbench.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "overflow.py").write_text(textwrap.dedent(OVERFLOW))
    tiny = ["--train-len", "16", "--steps", "2", "--batch-size", "2", "--d-model", "16", "--layers", "1",
            "--heads", "2", "--tokenizer", "bytes", "--device", "cpu", "--data", f"files:{corpus_dir}"]
    for scheme in ("overflow", "rope"):
        assert main(["train", "--plugin", "overflow.py", "--scheme", scheme, *tiny]) == 0
    capsys.readouterr()
    assert main(["extrapolate", "--plugin", "overflow.py", "--lengths", "32,128,1024", "--tokens", "1024",
                 "--no-key-tokens"]) == 1
    out, err = capsys.readouterr()
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "1 row(s) failed (overflow-" in err and "non-finite loss (nan) at 1024 positions" in err, err
    rows = results.read_rows(tmp_path / "runs" / "extrapolation.csv")
    status = {(r["scheme"], r["eval_len"]): r["status"] for r in rows}
    assert status == {("overflow", "32"): "ok", ("overflow", "128"): "ok", ("overflow", "1024"): "failed",
                      ("rope", "32"): "ok", ("rope", "128"): "ok", ("rope", "1024"): "ok"}, status
    failed = next(r for r in rows if r["status"] == "failed")
    assert failed["reason"].startswith("non-finite loss (nan) at 1024 positions, first at position "), failed
    assert "failed" in out
    for name in ("extrapolation.png", "positions.png", "effective_length.csv", "positions.csv", "windows.csv"):
        assert (tmp_path / "runs" / name).is_file(), name
    assert main(["report", "runs"]) == 0
    assert "| failed |" in (tmp_path / "runs" / "report.md").read_text()
    capsys.readouterr()
    assert main(["paired", "overflow", "rope", "--lengths", "1024"]) == 0
    assert "no verdict: overflow has a non-finite loss here" in capsys.readouterr().out.replace("\n", " ")
