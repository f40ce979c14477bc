"""Reference tests of xpos (qk hook) and conv (mixer hook)."""

import math

import pytest
import torch

from posbench.errors import PosbenchError
from posbench.schemes import SCHEMES, Dims
from posbench.schemes.rotary_variants import xpos_zeta

H, DH = 2, 8


def make(name, **params):
    torch.manual_seed(0)
    dims = Dims(d_model=H * DH, n_heads=H, n_layers=1, vocab_size=11, train_len=16,
                max_position=16, params=params)
    return SCHEMES[name](dims)


def xpos_logits(scheme, q, k, pos):
    q2, k2 = scheme.rotate(q, k, pos, scheme.prepare(pos), 0)
    return q2 @ k2.transpose(-1, -2)  # (B, H, T, T), unscaled


# --- xpos --------------------------------------------------------------------------------------

def test_xpos_zeta_matches_the_reference_formula():
    # torchscale: (arange(0, D, 2) + 0.4 D) / (1.4 D)
    expected = torch.tensor([0.4, 0.65, 0.9, 1.15], dtype=torch.float64) / 1.4
    assert torch.allclose(xpos_zeta(8), expected)


def test_xpos_logit_is_the_rope_logit_times_the_per_pair_decay():
    """Pair t: Re(q_t conj(k_t) e^{i(m-n) theta_t}) * zeta_t^((m-n)/gamma), in complex float64."""
    gamma = 16.0  # strong decay, so a wrong power would show
    scheme = make("xpos", gamma=gamma)
    pos = torch.tensor([3, 4, 9, 20, 21, 40, 57])
    q, k = torch.randn(1, H, len(pos), DH), torch.randn(1, H, len(pos), DH)
    got = xpos_logits(scheme, q, k, pos)

    half = DH // 2
    theta = 10000.0 ** (-torch.arange(half, dtype=torch.float64) * 2 / DH)
    zeta = (torch.arange(half, dtype=torch.float64) * 2 / DH + 0.4) / 1.4
    qc = torch.complex(q[..., :half].double(), q[..., half:].double())  # (1, H, T, D/2)
    kc = torch.complex(k[..., :half].double(), k[..., half:].double())
    rel = (pos[:, None] - pos[None, :]).double()[..., None]  # (T, T, 1)
    pair = qc[..., :, None, :] * kc[..., None, :, :].conj() * torch.exp(1j * rel * theta)
    expected = (pair.real * zeta ** (rel / gamma)).sum(-1)  # (1, H, T, T)
    assert torch.allclose(got.double(), expected, rtol=1e-4, atol=1e-5)


def test_xpos_is_relative_and_finite_far_from_zero():
    scheme = make("xpos")
    pos = torch.arange(24)
    q, k = torch.randn(2, H, 24, DH), torch.randn(2, H, 24, DH)
    near = xpos_logits(scheme, q, k, pos)
    # uncentred, zeta_0^(-100000/512) = 0.2857^-195 would overflow float32
    far = xpos_logits(scheme, q, k, pos + 100_000)
    assert torch.isfinite(far).all()
    assert torch.allclose(near, far, atol=1e-3, rtol=1e-4)
    assert torch.allclose(near, xpos_logits(scheme, q, k, pos + 37), atol=1e-4, rtol=1e-4)


def test_xpos_decays_with_distance():
    """With q = k and no rotation to speak of (one slow pair), the logit falls with m - n."""
    scheme = make("xpos", gamma=8.0)
    v = torch.zeros(1, H, 1, DH)
    v[..., DH // 2 - 1] = 1.0  # the slowest pair: theta ~ 10000^(-3/4), zeta = 1.15/1.4
    pos = torch.arange(12)
    s = xpos_logits(scheme, v.expand(1, H, 12, DH), v.expand(1, H, 12, DH), pos)[0, 0, -1]
    zeta = 1.15 / 1.4
    expected = torch.tensor([zeta ** ((11 - n) / 8.0) * math.cos((11 - n) * 10000 ** -0.75)
                             for n in range(12)])
    assert torch.allclose(s, expected.float(), atol=1e-5)
    assert (s[1:] > s[:-1]).all()


# --- conv --------------------------------------------------------------------------------------

@pytest.mark.parametrize("kernel", [1, 3, 5])
def test_conv_is_a_causal_depthwise_convolution_with_zero_left_padding(kernel):
    scheme = make("conv", kernel=kernel)
    x = torch.randn(2, 9, H * DH)
    out = scheme.mix(x)
    w = scheme.conv.weight.detach()[:, 0]  # (d, K)
    expected = x.clone()
    for t in range(9):
        for s in range(kernel):
            src = t - kernel + 1 + s
            if src >= 0:
                expected[:, t] += w[:, s] * x[:, src]
    assert torch.allclose(out, expected, atol=1e-5)


def test_conv_position_comes_from_the_padding_only():
    """A constant sequence comes out constant except in the first K - 1 tokens, which see zeros."""
    scheme = make("conv", kernel=4)
    x = torch.randn(1, 1, H * DH).expand(1, 10, H * DH)
    out = scheme.mix(x)[0]
    assert torch.allclose(out[3:], out[3:4].expand(7, -1), atol=1e-6)
    for t in range(3):
        assert not torch.allclose(out[t], out[3], atol=1e-4)


def test_conv_rejects_an_empty_kernel():
    with pytest.raises(PosbenchError, match="kernel"):
        make("conv", kernel=0)
