"""PaTH and PaTH-FoX: the chunked UT form of `path_logits` against the reference's
own formulations (fla `naive_path_attn`'s definition, its O(T^2 D) CPU scan, the materialized
product of Householder matrices, and its decoding's key-cache update), in float64; the limits
beta = 0 (NoPE, and FoX for path-fox); the short convolution's reach; the memory at length."""

import math

import pytest
import torch

from conftest import tiny_model
from posbench.schemes import SCHEMES, Dims
from posbench.schemes.path import path_logits
from posbench.timing import PeakTracker

B, H, T, D = 2, 3, 11, 5
CAUSAL = torch.ones(T, T, dtype=torch.bool).tril()
NEVER = -1e4  # a beta bias that makes beta = 2 sigmoid(.) exactly 0 in float32


def inputs(seed=0, grad=False):
    """q, k, w (unit rows), beta in (0, 2), float64."""
    g = torch.Generator().manual_seed(seed)
    q, k, w = (torch.randn(B, H, T, D, generator=g, dtype=torch.float64) for _ in range(3))
    w = w / w.norm(dim=-1, keepdim=True)
    beta = 2 * torch.rand(B, H, T, generator=g, dtype=torch.float64)
    return [a.requires_grad_(grad) for a in (q, k, w, beta)]


def scan(q, k, w, beta):
    """The CPU oracle: u <- q_i; for j = i..0: s_ij = u.k_j, then u <- u - beta_j (w_j.u) w_j."""
    s = torch.zeros(B, H, T, T, dtype=q.dtype)
    for i in range(T):
        u = q[:, :, i]
        for j in range(i, -1, -1):
            s[:, :, i, j] = (u * k[:, :, j]).sum(-1)
            u = u - beta[:, :, j, None] * (w[:, :, j] * u).sum(-1, keepdim=True) * w[:, :, j]
    return s


def product(q, k, w, beta):
    """The definition, each H_t = I - beta_t w_t w_t^T a (D, D) matrix: q_i^T H_i...H_{j+1} k_j."""
    steps = torch.eye(D, dtype=q.dtype) - beta[..., None, None] * w[..., :, None] * w[..., None, :]
    rows = []
    for i in range(T):
        p, row = torch.eye(D, dtype=q.dtype).expand(B, H, D, D), [None] * T
        for j in range(i, -1, -1):
            row[j] = (q[:, :, i, None, :] @ p @ k[:, :, j, :, None])[..., 0, 0]
            p = p @ steps[:, :, j]
        rows.append(torch.stack([r if r is not None else torch.zeros(B, H, dtype=q.dtype)
                                 for r in row], -1))
    return torch.stack(rows, -2)


def decode(q, k, w, beta):
    """Token by token as the reference decodes: every cached key k <- k - beta_t (k.w_t) w_t,
    then k_t is appended, and query t reads the cache."""
    s = torch.zeros(B, H, T, T, dtype=q.dtype)
    cache = k[:, :, :0]
    for t in range(T):
        wt = w[:, :, t, None, :]
        cache = cache - beta[:, :, t, None, None] * (cache * wt).sum(-1, keepdim=True) * wt
        cache = torch.cat([cache, k[:, :, t, None]], dim=2)
        s[:, :, t, : t + 1] = (cache @ q[:, :, t, :, None])[..., 0]
    return s


@pytest.mark.parametrize("chunk", [1, 4, 11, 64])
def test_chunked_form_equals_scan_product_and_decode(chunk):
    """Chunks of 4 leave a partial last chunk (padding) and take the loop over chunk
    distances; 11 and 64 are one chunk; 1 makes every step its own chunk."""
    q, k, w, beta = inputs()
    got = path_logits(q, k, w, beta, chunk)[..., CAUSAL]
    for oracle in (scan, product, decode):
        want = oracle(q, k, w, beta)[..., CAUSAL]
        assert torch.allclose(got, want, atol=1e-12), (oracle.__name__, (got - want).abs().max())


def test_chunked_gradients_equal_the_products():
    q, k, w, beta = inputs(1, grad=True)
    weight = torch.randn(B, H, T, T, dtype=torch.float64) * CAUSAL
    grads = []
    for form in (lambda *a: path_logits(*a, chunk=4), product):
        grads.append(torch.autograd.grad((form(q, k, w, beta) * weight).sum(), (q, k, w, beta)))
    for name, a, b in zip("q k w beta".split(), *grads):
        assert torch.allclose(a, b, atol=1e-10), (name, (a - b).abs().max())


def test_steps_reach_the_key_side_only_through_the_tokens_between():
    """Changing w and beta of token j's own step leaves s_ij unchanged (the key's H_j is never
    applied), while the query's H_i changes it."""
    q, k, w, beta = inputs(2)
    base = path_logits(q, k, w, beta, 4)
    beta2 = beta.clone()
    beta2[..., 3] = 2 - beta2[..., 3]
    moved = path_logits(q, k, w, beta2, 4)
    assert torch.equal(moved[..., :3, :], base[..., :3, :])  # queries before the step
    assert torch.allclose(moved[..., 3, 3], base[..., 3, 3])  # its own key: q_3 . k_3
    assert not torch.allclose(moved[..., 3, :3], base[..., 3, :3])
    assert not torch.allclose(moved[..., 7, 2], base[..., 7, 2])


def test_beta_zero_is_nope():
    """With every step the identity, path is `none`: the same model outputs."""
    nope = tiny_model("none")
    path = tiny_model("path")
    path.load_state_dict(nope.state_dict(), strict=False)
    with torch.no_grad():
        for t in path.layout.schemes[0].transitions:
            t.beta.bias.fill_(NEVER)
    x = torch.randint(0, 50, (2, 16))
    with torch.no_grad():
        assert torch.allclose(path(x), nope(x), atol=1e-6)


def test_path_fox_with_beta_zero_is_fox_under_either_gate_scale():
    x = torch.randint(0, 50, (2, 16))
    fox = tiny_model("fox")
    with torch.no_grad():
        fox.layout.schemes[0].gate_bias.normal_(2, 1)  # gates away from their init
        want = fox(x)
    for scaled in (False, True):
        model = tiny_model("path-fox", scaled_gate=scaled)
        model.load_state_dict(fox.state_dict(), strict=False)
        scheme = model.layout.schemes[0]
        scheme.forget.load_state_dict(fox.layout.schemes[0].state_dict())
        with torch.no_grad():
            for t in scheme.transitions:
                t.beta.bias.fill_(NEVER)
            got = model(x)
        # unscaled: exactly fox; scaled: the same gates divided by sqrt(D), weaker at init
        assert torch.allclose(got, want, atol=1e-6) != scaled
        h = torch.randn(2, 16, 32)
        ratio = scheme.gate(h, 1) / fox.layout.schemes[0].gate(h, 1)
        assert torch.allclose(ratio, torch.tensor(1 / math.sqrt(8) if scaled else 1.0))


def test_short_convolution_reaches_two_tokens_back():
    """w_t reads x_{t-2..t}: changing x_5 changes w_5, w_6, w_7 and no other; beta_t reads x_t."""
    torch.manual_seed(0)
    transitions = SCHEMES["path"](Dims(32, 4, 1, 50, T, T)).transitions[0]
    with torch.no_grad():
        transitions.beta.weight.normal_()
        x = torch.randn(2, T, 32)
        y = x.clone()
        y[:, 5] += 1
        (wa, ba), (wb, bb) = transitions(x), transitions(y)
    changed = (wa - wb).abs().amax((0, 1, 3)) > 0
    assert changed.nonzero().flatten().tolist() == [5, 6, 7]
    assert ((ba - bb).abs().amax((0, 1)) > 0).nonzero().flatten().tolist() == [5]
    assert torch.all((ba > 0) & (ba < 2))


def test_no_t_by_t_by_d_tensor_at_length():
    """At 512 tokens the logits hold about T^2 floats at their peak, far below (T, T, D)."""
    t, d = 512, 16
    q, k, w = (torch.randn(1, 1, t, d) for _ in range(3))
    beta = torch.rand(1, 1, t)
    with torch.no_grad(), PeakTracker() as tracker:
        path_logits(q, k, w / w.norm(dim=-1, keepdim=True), beta)
    assert tracker.peak < 3 * t * t * 4, tracker.peak  # (T, T, D) would be 16 T^2 floats


def test_path_fox_trains_a_step_with_gradients_everywhere():
    model = tiny_model("path-fox").train()
    x = torch.randint(0, 50, (2, 16))
    model.token_losses(x, x).mean().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
