"""Reference tests of the bias schemes kerple, fire, sandwich and tupe."""

import math
import warnings

import pytest
import torch
from torch import nn

from posbench import attention
from posbench.errors import PosbenchError
from posbench.schemes import SCHEMES, Dims, PositionLimitError
from posbench.schemes.base import Scheme
from posbench.schemes.bias import inverse_softplus, t5_bucket
from posbench.schemes.tables import sinusoid

H, D_MODEL = 4, 32


def make(name, train_len=16, max_position=16, **params):
    torch.manual_seed(0)
    dims = Dims(d_model=D_MODEL, n_heads=H, n_layers=1, vocab_size=11, train_len=train_len,
                max_position=max_position, params=params)
    return SCHEMES[name](dims)


def causal(t):
    return torch.ones(t, t, dtype=torch.bool).tril()


# --- kerple ------------------------------------------------------------------------------------

def set_kerple(scheme, r1, r2):
    with torch.no_grad():
        scheme.raw1.copy_(inverse_softplus(torch.tensor(r1)))
        if scheme.variant == "log":
            scheme.raw2.copy_(inverse_softplus(torch.tensor(r2)))
        else:
            scheme.raw2.copy_(torch.logit(torch.tensor(r2) / 2))


@pytest.mark.parametrize("variant, kernel, pinned", [
    ("log", lambda r1, r2, d: -r1 * math.log(1 + r2 * d), -1.3744360978),  # -1.5 ln(2.5)
    ("power", lambda r1, r2, d: -r1 * d**r2, -2.5980762114),  # -1.5 sqrt(3)
])
def test_kerple_equals_its_kernel(variant, kernel, pinned):
    scheme = make("kerple", variant=variant)
    r1, r2 = [1.5, 0.2, 3.0, 0.7], [0.5, 1.0, 0.05, 1.9]
    set_kerple(scheme, r1, r2)
    pos = torch.tensor([0, 1, 4, 9, 30])
    b = scheme.bias(pos)
    for h in range(H):
        for i, pi in enumerate(pos.tolist()):
            for j, pj in enumerate(pos.tolist()):
                assert b[h, i, j].item() == pytest.approx(kernel(r1[h], r2[h], abs(pi - pj)),
                                                          rel=1e-4, abs=1e-5)
    assert b[0, 2, 1].item() == pytest.approx(pinned, rel=1e-5)  # head 0, |i - j| = 3


def test_kerple_coefficients_stay_in_range():
    for variant in ("log", "power"):
        scheme = make("kerple", variant=variant)
        with torch.no_grad():
            scheme.raw1.fill_(-60.0)
            scheme.raw2.fill_(60.0)
        r1, r2 = scheme.coefficients()
        assert (r1 > 0).all() and (r2 > 0).all()
        if variant == "power":
            assert (r2 <= 2).all()
            with torch.no_grad():
                scheme.raw2.fill_(-60.0)
            assert (scheme.coefficients()[1] > 0).all()


def test_kerple_power_gradients_are_finite_at_zero_distance():
    scheme = make("kerple", variant="power")
    scheme.bias(torch.arange(8)).sum().backward()
    assert torch.isfinite(scheme.raw1.grad).all() and torch.isfinite(scheme.raw2.grad).all()
    assert scheme.raw2.grad.abs().sum() > 0


def test_kerple_unknown_variant_suggests_the_nearest():
    with pytest.raises(PosbenchError, match="did you mean 'power'"):
        make("kerple", variant="powr")


# --- fire --------------------------------------------------------------------------------------

def fire_reference(scheme, pos):
    """b_h(i, j) = f(psi(|i-j|) / psi(max(L, i))) with f an nn.Sequential MLP, double loop."""
    width = scheme.w1.shape[0]
    f = nn.Sequential(nn.Linear(1, width), nn.ReLU(), nn.Linear(width, H)).double()
    with torch.no_grad():
        f[0].weight.copy_(scheme.w1[:, None])
        f[0].bias.copy_(scheme.b1)
        f[2].weight.copy_(scheme.w2)
        f[2].bias.copy_(scheme.b2)
    c, L = abs(scheme.c.item()), abs(scheme.L_scale.item()) * scheme.L0
    t = len(pos)
    out = torch.empty(H, t, t, dtype=torch.float64)
    with torch.no_grad():
        for a, i in enumerate(pos):
            for b, j in enumerate(pos):
                x = math.log(c * abs(i - j) + 1) / (math.log(c * max(L, i) + 1) + 1e-6)
                out[:, a, b] = f(torch.tensor([x], dtype=torch.float64))
    return out


def test_fire_equals_the_formula_and_bias_fn():
    scheme = make("fire", train_len=32)
    with torch.no_grad():
        scheme.c.fill_(0.3)
        scheme.L_scale.fill_(1.5)  # L = 12
    pos = [0, 2, 3, 7, 12, 13, 20, 40]
    b = scheme.bias(torch.tensor(pos))
    assert torch.allclose(b.double(), fire_reference(scheme, pos), atol=1e-5)
    elementwise = Scheme.bias(scheme, torch.tensor(pos))  # bias_fn on broadcast indices
    assert torch.allclose(b, elementwise, atol=1e-5)


def test_fire_farthest_key_maps_to_one_past_the_threshold():
    """Progressive interpolation: for i >= L the key at 0 always gets f(1), whatever i."""
    scheme = make("fire", L=8.0)
    b = scheme.bias(torch.arange(64))
    farthest = b[:, 8:, 0]  # (H, 56)
    assert torch.allclose(farthest, farthest[:, :1].expand_as(farthest), atol=1e-5)
    assert not torch.allclose(b[:, 3, 0], b[:, 7, 0], atol=1e-4)  # below L: psi(L) normalizes


def test_fire_is_relative_only_below_the_threshold():
    pos = torch.arange(16)
    below = make("fire", L=1000.0)
    assert torch.allclose(below.bias(pos), below.bias(pos + 5), atol=1e-5)
    above = make("fire", L=4.0)
    assert not torch.allclose(above.bias(pos), above.bias(pos + 5), atol=1e-4)


def test_fire_learns_c_and_L():
    scheme = make("fire", L=4.0)
    scheme.bias(torch.arange(12)).square().sum().backward()
    for p in (scheme.c, scheme.L_scale, scheme.w1, scheme.b1, scheme.w2):
        assert p.grad is not None and p.grad.abs().sum() > 0


# --- sandwich ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("dim", "d"), [("model", D_MODEL), ("head", D_MODEL // H), (12, 12)])
def test_sandwich_is_the_centred_sinusoid_inner_product(dim, d):
    """b_h(i, j) = (p_i . p_j - d'/2) / (8h/H), p the sinusoidal table of width d': the model
    width (the paper), the head dimension (NeMo) or a given width."""
    scheme = make("sandwich", dim=dim)
    pos = torch.tensor([0, 1, 2, 5, 11, 30, 31, 63])
    p = sinusoid(64, d, 10000.0).double()[pos]  # (T, d')
    dot = p @ p.T - d / 2  # (T, T)
    expected = torch.stack([dot / (8 * h / H) for h in range(1, H + 1)])
    assert torch.allclose(scheme.bias(pos).double(), expected, atol=1e-4)
    assert torch.allclose(Scheme.bias(scheme, pos).double(), expected, atol=1e-4)


def test_sandwich_width_defaults_to_the_model_and_refuses_odd_or_unknown_widths():
    assert make("sandwich").describe() == "base=10000.0,dim=model"
    for bad in ("7", "0", "heads", "-4"):
        with pytest.raises(PosbenchError, match="dim of scheme 'sandwich' must be model, head or an even positive "
                                                "integer"):
            make("sandwich", dim=bad)


def test_sandwich_is_parameter_free_zero_on_the_diagonal_and_non_positive():
    scheme = make("sandwich")
    assert not list(scheme.parameters())
    b = scheme.bias(torch.arange(40))
    assert torch.equal(b.diagonal(dim1=1, dim2=2), torch.zeros(H, 40))
    assert (b <= 0).all() and (b[:, 1:, 0] < 0).all()
    # heads differ only by their scale 8h/H
    assert torch.allclose(b[0] * (8 / H), b[H - 1] * 8, atol=1e-5)


# --- tupe --------------------------------------------------------------------------------------

def test_tupe_scores_equal_the_formula_by_double_loop():
    scheme = make("tupe", max_position=40, num_buckets=8, max_distance=16)
    with torch.no_grad():
        scheme.buckets.normal_()
        scheme.u_q.normal_(std=0.2)
        scheme.u_k.normal_(std=0.2)
    dh = D_MODEL // H
    pos = torch.tensor([0, 1, 3, 4, 10, 25, 39])
    t = len(pos)
    q, k = torch.randn(2, H, t, dh), torch.randn(2, H, t, dh)
    ctx = scheme.prepare(pos)
    q2, k2 = scheme.rotate(q, k, pos, ctx, 0)
    scores = q2 @ k2.transpose(-1, -2) * scheme.qk_scale + scheme.bias(pos, ctx)

    p = scheme.table.detach()[pos]  # (T, d)
    pu = (p @ scheme.u_q.detach()).view(t, H, dh)
    pk = (p @ scheme.u_k.detach()).view(t, H, dh)
    for b in range(2):
        for h in range(H):
            for i in range(t):
                for j in range(t):
                    bucket = t5_bucket(pos[j] - pos[i], False, 8, 16)
                    s = (q[b, h, i] @ k[b, h, j] + pu[i, h] @ pk[j, h]) / math.sqrt(2 * dh)
                    s = s + scheme.buckets[bucket, h]
                    assert scores[b, h, i, j].item() == pytest.approx(s.item(), abs=1e-5)


def test_tupe_table_limit_and_hierarchical_extension():
    scheme = make("tupe", max_position=16)
    assert scheme.position_limit() == 16
    with pytest.raises(PositionLimitError, match="beyond"):
        scheme.check_positions(torch.arange(20))
    short = torch.arange(16)
    before = scheme.prepare(short)
    scheme.set_extension("hierarchical")
    assert scheme.position_limit() == 256
    after = scheme.prepare(short)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(before, after))
    far = scheme.prepare(torch.arange(200, 216))
    assert all(torch.isfinite(x).all() for x in far)


# --- all four, inside FlexAttention --------------------------------------------------------------

@pytest.mark.parametrize("name", ["kerple", "fire", "sandwich", "tupe"])
def test_bias_fn_works_as_flex_score_mod(name):
    """bias_fn runs elementwise under FlexAttention's vmap (eager here; compiled on CUDA) and
    matches the explicit path."""
    from torch.nn.attention.flex_attention import flex_attention

    scheme = make(name, max_position=64, **({"width": 8} if name == "fire" else {}))
    pos = torch.arange(0, 48, 3)
    t, dh = len(pos), D_MODEL // H
    q, k, v = torch.randn(3, 2, H, t, dh).unbind(0)
    flex_ctx = attention.prepare(scheme, pos, "flex")
    ref_ctx = attention.prepare(scheme, pos, "explicit")
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        q2, k2 = (q, k) if "qk" not in scheme.hooks else scheme.rotate(q, k, pos, flex_ctx.shared, 0)
        out = flex_attention(q2, k2, v, score_mod=flex_ctx.score_mod,
                             block_mask=flex_ctx.block_mask, scale=scheme.qk_scale)
        ref = attention.explicit_attention(q2, k2, v, scheme, ref_ctx, 0)
    assert torch.allclose(out, ref, atol=1e-5)
