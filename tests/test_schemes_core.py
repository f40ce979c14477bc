"""Defining properties and reference numbers of none, learned, sinusoidal, rope, alibi, t5."""

import math

import pytest
import torch

from conftest import tiny_model
from posbench.schemes.absolute import hierarchical_table
from posbench.schemes.bias import alibi_slopes, t5_bucket
from posbench.policies import RopeScaling
from posbench.policies.frequencies import rope_frequencies, yarn_ramp
from posbench.policies.rotation import rotate_half
from posbench.schemes.tables import sinusoid


def test_alibi_slopes_match_paper():
    assert alibi_slopes(8).tolist() == [2.0 ** -(i + 1) for i in range(8)]
    assert alibi_slopes(6).tolist() == [0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125]
    assert alibi_slopes(4).tolist() == [0.25, 0.0625, 0.015625, 0.00390625]


def test_alibi_bias_is_minus_slope_times_distance():
    scheme = tiny_model("alibi").layout.schemes[0]
    bias = scheme.bias(torch.arange(6))
    i, j = 5, 2
    assert bias[0, i, j].item() == pytest.approx(-0.25 * 3)
    assert bias[3, i, j].item() == pytest.approx(-(2.0 ** -8) * 3)


def test_t5_buckets_seed_vector():
    """Seed 000's vector: bidirectional, 32 buckets, max distance 128."""
    expect = {**{d: d for d in range(8)}, **{d: 8 for d in range(8, 12)},
              **{d: 9 for d in range(12, 16)}, **{d: 10 for d in range(16, 23)},
              **{d: 11 for d in range(23, 31)}}
    for dist, bucket in expect.items():
        # Keys before the query (rel < 0) fall in the lower half of the bidirectional buckets.
        assert t5_bucket(torch.tensor(-dist), True, 32, 128).item() == bucket, dist
        assert t5_bucket(torch.tensor(dist), True, 32, 128).item() == bucket + 16 * (dist > 0), dist


def test_t5_one_directional_buckets_and_clip():
    n = torch.arange(0, 2000)
    b = t5_bucket(-n, False, 32, 128)
    assert b[:16].tolist() == list(range(16))
    assert b.max().item() == 31 and (b[n >= 128] == 31).all()
    assert (b.diff() >= 0).all()  # monotone in distance
    assert t5_bucket(torch.tensor(5), False, 32, 128).item() == 0  # future keys: bucket 0 (masked)


def test_t5_bias_reads_learned_table():
    scheme = tiny_model("t5").layout.schemes[0]
    with torch.no_grad():
        scheme.table.copy_(torch.arange(32 * 4, dtype=torch.float).view(32, 4))
    bias = scheme.bias(torch.arange(10))
    assert bias[2, 9, 3].item() == scheme.table[6, 2].item()


def test_sinusoid_offset_is_a_fixed_rotation():
    """p_{k+t} = M_t p_k with M_t block-diagonal 2x2 rotations independent of k (seed 003)."""
    dim, t = 16, 7
    table = sinusoid(100, dim, 10000.0).double()
    inv = 10000.0 ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    m = torch.zeros(dim, dim, dtype=torch.float64)
    for i, w in enumerate(inv):
        c, s = math.cos(t * w), math.sin(t * w)
        # (sin, cos)(a + b) from (sin, cos)(a): [[c, s], [-s, c]]
        m[2 * i: 2 * i + 2, 2 * i: 2 * i + 2] = torch.tensor([[c, s], [-s, c]], dtype=torch.float64)
    for k in (0, 13, 50):
        assert torch.allclose(m @ table[k], table[k + t], atol=1e-5)
    assert table[3, 0].item() == pytest.approx(math.sin(3)) and table[3, 1].item() == pytest.approx(math.cos(3))


def test_rope_logit_depends_only_on_offset():
    torch.manual_seed(0)
    scheme = tiny_model("rope").layout.schemes[0]  # head dim 8
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)

    def logit(m, n):
        cos_m, sin_m = scheme.angles(torch.tensor([m]))
        cos_n, sin_n = scheme.angles(torch.tensor([n]))
        return (rotate_half(q, cos_m, sin_m) * rotate_half(k, cos_n, sin_n)).sum().item()

    assert logit(10, 3) == pytest.approx(logit(110, 103), abs=1e-4)
    assert logit(10, 3) != pytest.approx(logit(10, 4), abs=1e-4)


def test_rope_rotation_angle():
    """Pair t at position m rotated by m * base^(-2t/D): check against a hand rotation."""
    scheme = tiny_model("rope").layout.schemes[0]  # head dim 8
    x = torch.zeros(1, 1, 1, 8)
    x[..., 1] = 1.0  # pair t = 1 is (x_1, x_5)
    cos, sin = scheme.angles(torch.tensor([3]))
    y = rotate_half(x, cos, sin)
    angle = 3 * 10000 ** (-2 / 8)
    assert y[..., 1].item() == pytest.approx(math.cos(angle), abs=1e-6)
    assert y[..., 5].item() == pytest.approx(math.sin(angle), abs=1e-6)


def test_learned_hierarchical_reproduces_trained_rows():
    torch.manual_seed(0)
    p = torch.randn(8, 4, dtype=torch.float64)
    q = hierarchical_table(p, 0.4)
    assert q.shape == (64, 4)
    assert torch.allclose(q[:8], p)
    # q_{(i-1)n+j} = a u_i + (1-a) u_j, 1-based: i = 3, j = 5 is 0-based row 2*8 + 4
    u = (p - 0.4 * p[0]) / 0.6
    assert torch.allclose(q[2 * 8 + 4], 0.4 * u[2] + 0.6 * u[4])


def test_learned_limit_and_extension():
    model = tiny_model("learned", train_len=8)
    x = torch.randint(0, 50, (1, 20))
    with pytest.raises(Exception, match="beyond its table of 8"):
        model(x)
    model.layout.schemes[0].set_extension("hierarchical")
    assert model.layout.schemes[0].position_limit() == 64
    assert torch.isfinite(model(x)).all()


# --- RoPE eval-time scaling: each formula on hand-computed values (D = 8, base 10000, L = 64) ---

D, BASE, L = 8, 10000.0, 64
INV = [BASE ** (-2 * t / D) for t in range(D // 2)]


def test_pi_divides_frequencies():
    inv, m = rope_frequencies(D, BASE, L, RopeScaling("pi"), 256)
    assert inv.tolist() == pytest.approx([w / 4 for w in INV]) and m == 1.0


def test_ntk_raises_base():
    inv, _ = rope_frequencies(D, BASE, L, RopeScaling("ntk"), 256)
    new_base = BASE * 4 ** (8 / 6)
    assert inv.tolist() == pytest.approx([new_base ** (-2 * t / D) for t in range(4)])
    assert inv[0].item() == 1.0  # the highest frequency is never changed by NTK


def test_dynamic_ntk_uses_current_length_and_given_factor():
    short, _ = rope_frequencies(D, BASE, L, RopeScaling("dynamic-ntk"), 32)
    assert short.tolist() == pytest.approx(INV)  # below the training length: unchanged
    at_128, _ = rope_frequencies(D, BASE, L, RopeScaling("dynamic-ntk"), 128)
    assert at_128[1].item() == pytest.approx((BASE * 2 ** (8 / 6)) ** (-2 / 8))
    fixed, _ = rope_frequencies(D, BASE, L, RopeScaling("ntk", factor=8.0), 128)
    assert fixed[1].item() == pytest.approx((BASE * 8 ** (8 / 6)) ** (-2 / 8))


def test_dynamic_ntk_with_a_factor_grows_the_base_from_the_training_length():
    """transformers' `_compute_dynamic_ntk_parameters`: base * (f L / L0 - (f - 1))^(D/(D-2)),
    L = max(L_eval, L0); f = 4, D = 32, L0 = 64 (pair 1 has frequency base'^(-2/32))."""
    expect = {32: 1e4, 64: 1e4, 128: 5.5663e4, 256: 1.5424e5, 512: 3.6299e5}
    for length, new_base in expect.items():
        inv, m = rope_frequencies(32, BASE, 64, RopeScaling("dynamic-ntk", factor=4.0), length)
        assert inv[1].item() ** (-32 / 2) == pytest.approx(new_base, rel=1e-4), length
        assert m == 1.0
    static, _ = rope_frequencies(32, BASE, 64, RopeScaling("ntk", factor=4.0), 64)
    assert static[1].item() ** (-32 / 2) == pytest.approx(BASE * 4 ** (32 / 30))  # ntk stays static


def test_dynamic_ntk_tables_follow_the_length_with_a_fixed_factor():
    """The scheme's cached cos/sin tables must not reuse one length's base at another."""
    scheme = tiny_model("rope", train_len=16).layout.schemes[0]  # head dim 8
    scheme.set_scaling(RopeScaling("dynamic-ntk", factor=4.0))
    for length in (16, 64, 16):
        cos, _ = scheme.angles(torch.arange(length))
        new_base = BASE * (4 * max(length, 16) / 16 - 3) ** (8 / 6)
        assert cos[-1, 1].item() == pytest.approx(math.cos((length - 1) * new_base ** (-2 / 8)), abs=1e-6)


def test_llama3_keeps_blends_and_divides_by_wavelength():
    """transformers' `_compute_llama3_parameters` by hand, D = 8, L_train = 128, s = 4, low 1,
    high 4: wavelengths 2 pi / theta = 6.28 (< 128/4: kept), 62.8 (between: blended), 628 and
    6283 (> 128/1: divided by s)."""
    inv, m = rope_frequencies(D, BASE, 128, RopeScaling("llama3"), 512)
    a = (128 * 0.1 / (2 * math.pi) - 1) / (4 - 1)  # 0.345727
    assert inv.tolist() == pytest.approx([1.0, (1 - a) * 0.1 / 4 + a * 0.1, 0.01 / 4, 0.001 / 4])
    assert inv[1].item() == pytest.approx(0.0509295, rel=1e-5) and m == 1.0
    # low = 3 puts pair 1 (wavelength 62.8 > 128/3) among the divided ones
    inv, _ = rope_frequencies(D, BASE, 128, RopeScaling("llama3", low=3.0, high=4.0), 512)
    assert inv.tolist() == pytest.approx([1.0, 0.1 / 4, 0.01 / 4, 0.001 / 4])
    assert RopeScaling("llama3", low=3.0, high=4.0).label == "llama3(low=3,high=4)"
    assert RopeScaling("llama3", factor=8.0).label == "llama3:8"


def test_yarn_ramp_and_attention_factor():
    # find_correction_dim(r) = D ln(L / (2 pi r)) / (2 ln base)
    def fcd(r):
        return D * math.log(L / (2 * math.pi * r)) / (2 * math.log(BASE))

    low, high = max(math.floor(fcd(32)), 0), min(math.ceil(fcd(1)), D - 1)
    assert (low, high) == (0, 2)
    ramp = yarn_ramp(D, BASE, L, 1.0, 32.0)
    assert ramp.tolist() == pytest.approx([0.0, 0.5, 1.0, 1.0])
    inv, mscale = rope_frequencies(D, BASE, L, RopeScaling("yarn"), 256)
    expect = [w / 4 * r + w * (1 - r) for w, r in zip(INV, [0.0, 0.5, 1.0, 1.0])]
    assert inv.tolist() == pytest.approx(expect)
    assert mscale == pytest.approx(0.1 * math.log(4) + 1)


def test_yarn_scales_logits_by_mscale_squared():
    model = tiny_model("rope", train_len=16)
    scheme = model.layout.schemes[0]
    pos = torch.arange(64)
    scheme.set_scaling(RopeScaling("yarn"))
    cos, sin = scheme.angles(pos)
    m = 0.1 * math.log(4) + 1
    assert torch.allclose(cos**2 + sin**2, torch.full_like(cos, m * m), atol=1e-5)


def test_no_scaling_within_training_length():
    inv, m = rope_frequencies(D, BASE, L, RopeScaling("yarn"), 64)
    assert inv.tolist() == pytest.approx(INV) and m == 1.0


def test_unknown_scaling_suggests():
    with pytest.raises(Exception, match="did you mean 'yarn'"):
        RopeScaling("yarm")
