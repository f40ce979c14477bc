"""Schemes and variants added in 2026: repo (RePo, context re-positioning) and rope-pp's equal-cache
variant. Each is checked against numbers computed independently from its reference code's
equations on a tiny fixed set of weights, and for its defining property."""

import math

import pytest
import torch
import torch.nn.functional as F

from posbench.cli import main
from posbench.schemes import SCHEMES, Dims


def make(name, d_model=16, heads=2, layers=2, train_len=16, **params):
    torch.manual_seed(0)
    return SCHEMES[name](Dims(d_model, heads, layers, 50, train_len, train_len, params=params))


def hf_rotate_half(x):
    """transformers' rotate_half: (-x2, x1) over the two halves."""
    d = x.shape[-1]
    return torch.cat([-x[..., d // 2:], x[..., : d // 2]], dim=-1)


# --- repo --------------------------------------------------------------------------------------

def reference_repo_logits(h, q, k, gate_map, content_map, final_map, base=10000.0):
    """Re-derived from SakanaAI/repo, OLMo/olmo/model.py (and its transformers port,
    models/olmo2/modeling_olmo2.py): `dynamic_position_encoding_swigluex_multihead`
    pred = final_map(silu(gate_map(h)) * content_map(h)).transpose(-1, -2), shape (B, H, N);
    `RotaryEmbedding.from_positions`: inv_freq = 1 / base^(arange(0, D, 2) / D), freqs = pred x
    inv_freq, emb = cat(freqs, freqs), cos and sin of emb; `apply_rotary_pos_emb`: t cos +
    rotate_half(t) sin, per head; then q.k / sqrt(D). Everything in float64 here.
    h (B, N, d); q, k (B, H, N, D); gate_map, content_map (d_p, d); final_map (H, d_p)."""
    h, q, k = h.double(), q.double(), k.double()
    pred = (F.silu(h @ gate_map.double().T) * (h @ content_map.double().T)) @ final_map.double().T
    pred = pred.transpose(-1, -2)  # (B, H, N)
    d = q.shape[-1]
    inv_freq = 1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    freqs = pred[..., None] * inv_freq  # (B, H, N, D/2)
    emb = torch.cat([freqs, freqs], dim=-1)
    cos, sin = emb.cos(), emb.sin()
    q_rot = q * cos + hf_rotate_half(q) * sin
    k_rot = k * cos + hf_rotate_half(k) * sin
    return pred, q_rot @ k_rot.transpose(-1, -2) / math.sqrt(d)


def repo_logits(scheme, x, q, k, pos, layer):
    """The scheme's scaled q'.k' in `layer`, through its hooks as the model calls them."""
    content = scheme.content(x, layer)
    args = (q, k, pos, scheme.prepare(pos), layer)
    q2, k2 = scheme.rotate(*args) if content is None else scheme.rotate(*args, content)
    return q2 @ k2.transpose(-1, -2) * scheme.qk_scale


def test_repo_positions_and_logits_equal_the_reference_computation():
    """A RePo layer (the last of 4: floor(5/16 * 4) = 1 integer layer) with fixed weights: the
    positions and the rotated q.k are the reference code's."""
    scheme = make("repo", d_model=16, heads=2, layers=4, base=100.0)
    assert scheme.start == 1 and scheme.gate_map.shape == (3, 2, 16) and scheme.final_map.shape == (3, 2, 2)
    g = torch.Generator().manual_seed(3)
    gate, content, final = (torch.randn(*s, generator=g) * 0.7 for s in ((2, 16), (2, 16), (2, 2)))
    with torch.no_grad():
        scheme.gate_map[2].copy_(gate)
        scheme.content_map[2].copy_(content)
        scheme.final_map[2].copy_(final)
    x = torch.randn(2, 5, 16, generator=g)
    q, k = torch.randn(2, 2, 2, 5, 8, generator=g).unbind(0)
    pos = torch.arange(5)
    want_z, want = reference_repo_logits(x, q, k, gate, content, final, base=100.0)
    with torch.no_grad():
        z = scheme.positions(x, 3)
        got = repo_logits(scheme, x, q, k, pos, 3)
    assert z.shape == (2, 2, 5)
    assert torch.allclose(z.double(), want_z, atol=1e-5), (z.double() - want_z).abs().max()
    assert torch.allclose(got.double(), want, atol=1e-4), (got.double() - want).abs().max()
    # real, unsorted positions: not integers, not increasing along the window
    assert (z - z.round()).abs().max() > 0.05 and not (z.diff(dim=-1) > 0).all()


def test_repo_numbers_by_hand():
    """d = D = 2, one head (theta = 1), d_p = max(1, d / 8) = 1: gate reads x_0, content x_1, final
    2. Token a = (1, 3): z = 2 SiLU(1) 3 = 6 sigmoid(1) = 4.38635; token b = (0, 5): z = 0. Query
    a, key b, q = (1, 0), k = (1, 0): cos(4.38635 - 0) / sqrt(2)."""
    scheme = make("repo", d_model=2, heads=1, layers=1, rope_share=0.0)
    with torch.no_grad():
        scheme.gate_map.zero_()
        scheme.content_map.zero_()
        scheme.gate_map[0, 0, 0] = 1.0
        scheme.content_map[0, 0, 1] = 1.0
        scheme.final_map.fill_(2.0)
    x = torch.zeros(1, 2, 2)
    x[0, 0] = torch.tensor([1.0, 3.0])
    x[0, 1, 1] = 5.0
    z = scheme.positions(x, 0)
    assert z[0, 0].tolist() == pytest.approx([6 / (1 + math.exp(-1)), 0.0], abs=1e-6)
    q = torch.tensor([1.0, 0.0]).expand(1, 1, 2, 2)
    with torch.no_grad():
        logit = repo_logits(scheme, x, q, q.clone(), torch.arange(2), 0)[0, 0, 0, 1]
    assert float(logit) == pytest.approx(math.cos(6 / (1 + math.exp(-1))) / math.sqrt(2), abs=1e-6)


def test_repo_with_integer_positions_is_rope_and_zeroed_is_nope():
    """The rotation reads the module's positions as rope reads integer ones: fed z_t = pos_t it is
    `rope`'s rotation; a zeroed module puts every token at 0 (q.k unturned, NoPE); the first floor(p L)
    layers are `rope` itself at the window's positions."""
    scheme, rope = make("repo", d_model=16, heads=2, layers=4), make("rope", d_model=16, heads=2, layers=4)
    pos = torch.tensor([0, 3, 4, 9, 30])
    q, k = torch.randn(2, 2, 2, 5, 8).unbind(0)
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        want = rope.rotate(q, k, pos, rope.prepare(pos), 0)
        at_pos = scheme.rotate(q, k, pos, None, 2, scheme.turns(pos.float().expand(2, 2, 5)))
        for a, b in zip(at_pos, want):
            assert torch.allclose(a, b, atol=1e-4), (a - b).abs().max()
        integer_layer = scheme.rotate(q, k, pos, scheme.prepare(pos), 0)  # layer 0 < start = 1
        assert scheme.content(x, 0) is None
        for a, b in zip(integer_layer, want):
            assert torch.equal(a, b)
        scheme.final_map.zero_()
        assert torch.equal(scheme.positions(x, 2), torch.zeros(2, 2, 5))
        nope = repo_logits(scheme, x, q, k, pos, 2)
    assert torch.allclose(nope, q @ k.transpose(-1, -2) / math.sqrt(8), atol=1e-6)


def test_repo_positions_depend_on_content_not_on_the_index():
    """Changing one token moves its position (and no other's: the module reads each token alone);
    shifting the window's positions moves nothing; the logits of a RePo layer follow."""
    scheme = make("repo", d_model=16, heads=2, layers=2, rope_share=0.0)
    x = torch.randn(1, 6, 16)
    q, k = torch.randn(2, 1, 2, 6, 8).unbind(0)
    pos = torch.arange(6)
    with torch.no_grad():
        z = scheme.positions(x, 1)
        moved = x.clone()
        moved[0, 2] = torch.randn(16)
        z2 = scheme.positions(moved, 1)
        changed = (z2 - z).abs().amax(dim=1)[0]  # per token
        assert changed[2] > 0 and torch.equal(changed[[0, 1, 3, 4, 5]], torch.zeros(5))
        assert torch.equal(repo_logits(scheme, x, q, k, pos, 1), repo_logits(scheme, x, q, k, pos + 100, 1))
        assert not torch.allclose(repo_logits(scheme, x, q, k, pos, 1), repo_logits(scheme, moved, q, k, pos, 1))


def test_repo_passes_check_and_trains_from_the_command_line(corpus_dir, tmp_path, capsys):
    assert main(["check", "repo", "--skip", "cost"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "repo: 11 of 11 properties without a fail"
    common = ["--data", f"files:{corpus_dir}", "--runs-dir", str(tmp_path), "--train-len", "16",
              "--steps", "3", "--batch-size", "4", "--d-model", "32", "--layers", "4", "--heads", "2",
              "--tokenizer", "bytes", "--device", "cpu"]
    assert main(["train", "--scheme", "repo", *common]) == 0
