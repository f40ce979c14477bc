"""The worked plug-in, scripts/plugins/liere.py: a real scheme written only through the public
interface, checked against its reference's computation."""

import math
from pathlib import Path

import pytest
import torch

from posbench import plugins
from posbench.conformance import check
from posbench.schemes import SCHEMES, Dims

PLUGIN = Path(__file__).parents[1] / "scripts" / "plugins" / "liere.py"


@pytest.fixture(scope="module")
def liere():
    plugins.load(str(PLUGIN))
    yield SCHEMES["liere"]
    SCHEMES.pop("liere")
    plugins._loaded.pop(str(PLUGIN.resolve()), None)


def dims(**params):
    return Dims(d_model=32, n_heads=2, n_layers=2, vocab_size=50, train_len=16, max_position=16, params=params)


def reference_rotations(raw, positions):
    """StanfordMIMI/LieRE's LierePositionEncoder (learned phases, 1-D input), re-derived: bases =
    (triu(raw) - 0.5) - its transpose, generator = position * bases, then matrix_exp."""
    upper = torch.triu(raw, diagonal=1) - 0.5
    bases = upper - upper.transpose(-1, -2)
    generator_pos = positions.reshape(-1, *[1] * bases.dim()) * bases
    return torch.matrix_exp(generator_pos.double())


def test_liere_matches_the_reference_computation(liere):
    scheme = liere(dims(block=4))
    torch.manual_seed(0)
    q, k = torch.randn(2, 2, 16, 16), torch.randn(2, 2, 16, 16)
    qr, kr = scheme.rotate(q, k, torch.arange(16), None, 0)
    # The reference at the training size: positions torch.linspace(0, 1, 16), one generator per head.
    rot = reference_rotations(scheme.generators[0].detach(), torch.linspace(0, 1, 16))  # (T, H, blocks, 4, 4)
    blocks = q.double().reshape(2, 2, 16, 4, 4, 1)
    expected = (rot.permute(1, 0, 2, 3, 4) @ blocks).reshape(2, 2, 16, 16)
    assert torch.allclose(qr.double(), expected, atol=1e-5)
    # Relative: the logit depends on the distance alone.
    logits = qr @ kr.transpose(-1, -2)
    shifted = scheme.rotate(q, k, torch.arange(16) + 7, None, 0)
    assert torch.allclose(shifted[0] @ shifted[1].transpose(-1, -2), logits, atol=1e-4)


def test_liere_with_blocks_of_two_is_rope_with_learned_frequencies(liere):
    scheme = liere(dims(block=2, per_head=False))
    a = torch.triu(scheme.generators[0, 0].detach(), diagonal=1)[:, 0, 1]  # (D/2,) one angle rate per pair
    x = torch.randn(1, 1, 16, 16)
    out, _ = scheme.rotate(x, x, torch.arange(16), None, 0)
    theta = torch.arange(16)[:, None] / 15 * a  # (T, D/2)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    # exp(t [[0, a], [-a, 0]]) = [[cos at, sin at], [-sin at, cos at]]
    expected = torch.stack([x1 * theta.cos() + x2 * theta.sin(), -x1 * theta.sin() + x2 * theta.cos()], -1)
    assert torch.allclose(out, expected.flatten(-2), atol=1e-5)
    assert (a >= 0).all() and (a < 2 * math.pi).all()  # the reference's draw


def test_liere_passes_check_and_refuses_a_bad_block(liere):
    findings = {f.prop: f.status for f in check("liere", skip=("cost",))}
    assert "fail" not in findings.values(), findings
    assert findings["translation"] == "pass" and findings["compiled graph"] == "pass"
    from posbench.errors import PosbenchError
    with pytest.raises(PosbenchError, match="divide the head dim"):
        liere(dims(block=5))
