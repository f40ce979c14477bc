"""The content-dependent relative schemes (posbench/schemes/relative.py) against explicit double
loops over (i, j) written from the formulas of their papers, plus their defining properties and a
check that no path materializes a (T, T, D) tensor."""

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from posbench import attention
from posbench.errors import PosbenchError
from posbench.schemes import SCHEMES, Dims

B, H, D = 2, 3, 8
T = 7
GAPPED = torch.tensor([2, 3, 5, 9, 10, 17, 30])  # non-contiguous, distances up to 28
CONTIGUOUS = torch.arange(T) + 4
NAMES = ("shaw", "xl", "deberta", "cope")


def make(name, train_len=16, n_layers=2, **params):
    torch.manual_seed(0)
    dims = Dims(d_model=H * D, n_heads=H, n_layers=n_layers, vocab_size=50, train_len=train_len,
                max_position=train_len, params=params)
    scheme = SCHEMES[name](dims)
    with torch.no_grad():
        for p in scheme.parameters():  # non-trivial values everywhere (CoPE starts at zero)
            p.normal_(0, 0.5)
    return scheme


def qkv(t=T, b=B, h=H, d=D, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, t, d, generator=g).requires_grad_() for _ in range(3)]


def scores_and_output(scheme, q, k, v, pos, layer=1):
    """The scheme's (B, H, T, T) logits and its attention output through the explicit path."""
    ctx = attention.prepare(scheme, pos, "explicit")
    s = scheme.logits(q, k, pos, ctx.shared, layer)
    return s, attention.explicit_attention(q, k, v, scheme, ctx, layer)


def causal_softmax_output(ref_s, values_ij):
    """o_i = sum_{j<=i} a_ij values_ij[i][j] from reference scores (B, H, T, T); values_ij[i][j]
    is a (B, H, D) vector."""
    t = ref_s.shape[-1]
    mask = torch.ones(t, t, dtype=torch.bool).triu(1)
    a = ref_s.masked_fill(mask, float("-inf")).softmax(-1)
    out = torch.zeros(*ref_s.shape[:2], t, values_ij[0][0].shape[-1])
    for i in range(t):
        for j in range(i + 1):
            out[:, :, i] += a[:, :, i, j, None] * values_ij[i][j]
    return out


def assert_close_with_grads(got, want, inputs, **tol):
    """got == want, and so are their gradients with respect to `inputs` (under a random
    cotangent), so the backward of the gather/scatter formulation is checked too."""
    torch.testing.assert_close(got, want, **tol)
    w = torch.randn_like(want)
    for a, b in zip(torch.autograd.grad((got * w).sum(), inputs, retain_graph=True),
                    torch.autograd.grad((want * w).sum(), inputs, retain_graph=True)):
        torch.testing.assert_close(a, b, **tol)


def lower(s):
    """The entries a causal decoder reads (j <= i), flattened."""
    i, j = torch.tril_indices(s.shape[-1], s.shape[-1])
    return s[..., i, j]


def clip(x, k):
    return max(-k, min(k, x))


# ----- Shaw -----------------------------------------------------------------------------------


@pytest.mark.parametrize("pos", [CONTIGUOUS, GAPPED], ids=["contiguous", "gapped"])
@pytest.mark.parametrize("big_k", [3, 16])
def test_shaw_matches_double_loop(pos, big_k):
    scheme = make("shaw", k=big_k)
    q, k, v = qkv()
    layer = 1
    rk, rv = scheme.rk[layer].detach(), scheme.rv[layer].detach()
    ref = torch.zeros(B, H, T, T)
    vals = [[None] * T for _ in range(T)]
    for i in range(T):
        for j in range(i + 1):
            c = clip(int(pos[i] - pos[j]), big_k) + big_k
            ref[:, :, i, j] = (q[:, :, i] * (k[:, :, j] + rk[c])).sum(-1) / math.sqrt(D)
            vals[i][j] = v[:, :, j] + rv[c]
    s, out = scores_and_output(scheme, q, k, v, pos, layer)
    assert_close_with_grads(lower(s), lower(ref), (q, k))
    assert_close_with_grads(out, causal_softmax_output(ref, vals), (q, k, v))


def test_shaw_value_term_carries_position():
    """With R^K zeroed the logits are position-free, yet outputs still see distances through
    R^V: the value term is part of the scheme."""
    scheme = make("shaw", k=4)
    with torch.no_grad():
        for t in scheme.rk:
            t.zero_()
    q, k, v = qkv()
    with torch.no_grad():
        s1, o1 = scores_and_output(scheme, q, k, v, torch.arange(T))
        s2, o2 = scores_and_output(scheme, q, k, v, torch.arange(T) * 2)
    torch.testing.assert_close(lower(s1), lower(s2))
    assert not torch.allclose(o1, o2, atol=1e-4)


# ----- Transformer-XL -------------------------------------------------------------------------


def xl_sinusoid(dist, d):
    """R_dist (d,): interleaved, column 2t = sin(dist / 10000^(2t/d)), 2t+1 = cos."""
    r = torch.zeros(d, dtype=torch.float64)
    for t in range(d // 2):
        angle = dist / 10000 ** (2 * t / d)
        r[2 * t], r[2 * t + 1] = math.sin(angle), math.cos(angle)
    return r.float()


@pytest.mark.parametrize("pos", [CONTIGUOUS, GAPPED], ids=["contiguous", "gapped"])
@pytest.mark.parametrize("untie_r", [True, False])
def test_xl_matches_double_loop(pos, untie_r):
    scheme = make("xl", untie_r=untie_r)
    q, k, v = qkv()
    layer = 1
    w_r = scheme.w_r[layer].weight.detach()  # (H*D, d)
    u = scheme.u[layer if untie_r else 0].detach()  # (H, D)
    vb = scheme.v[layer if untie_r else 0].detach()
    ref = torch.zeros(B, H, T, T)
    for i in range(T):
        for j in range(i + 1):
            wr = (w_r @ xl_sinusoid(int(pos[i] - pos[j]), H * D)).view(H, D)  # W_R R_{i-j}
            ref[:, :, i, j] = (
                (q[:, :, i] * k[:, :, j]).sum(-1)
                + (q[:, :, i] * wr).sum(-1)
                + (u * k[:, :, j]).sum(-1)
                + (vb * wr).sum(-1)
            ) / math.sqrt(D)
    s, _ = scores_and_output(scheme, q, k, v, pos, layer)
    assert_close_with_grads(lower(s), lower(ref), (q, k), atol=1e-4, rtol=1e-4)


def test_xl_is_not_clipped():
    """R is unclipped: distances 40 and 80 give different logits (Shaw's would not)."""
    scheme = make("xl")
    q, k, v = qkv(t=2)
    with torch.no_grad():
        a, _ = scores_and_output(scheme, q, k, v, torch.tensor([0, 40]))
        b, _ = scores_and_output(scheme, q, k, v, torch.tensor([0, 80]))
    assert not torch.allclose(a[..., 1, 0], b[..., 1, 0], atol=1e-4)


# ----- DeBERTa --------------------------------------------------------------------------------


@pytest.mark.parametrize("pos", [CONTIGUOUS, GAPPED], ids=["contiguous", "gapped"])
@pytest.mark.parametrize("big_k", [3, 0])
@pytest.mark.parametrize("p2c", ["paper", "code"])
def test_deberta_matches_double_loop(pos, big_k, p2c):
    """p2c=paper reads Q^r_{d(j,i)} (the paper's equation 4), p2c=code Q^r_{d(i,j)} (the
    released code and transformers)."""
    scheme = make("deberta", k=big_k, p2c=p2c)
    big_k = big_k or 16  # k = 0: the training length
    assert scheme.p["k"] == big_k
    q, k, v = qkv()
    layer = 1
    rel = scheme.rel.detach()  # (2K+1, d)
    w_kr, w_qr = scheme.w_kr[layer].weight.detach(), scheme.w_qr[layer].weight.detach()

    def delta(a, b):  # d(a, b) = clip(a - b, -K, K) shifted into [0, 2K]
        return clip(int(pos[a] - pos[b]), big_k) + big_k

    ref = torch.zeros(B, H, T, T)
    for i in range(T):
        for j in range(i + 1):
            k_r = (w_kr @ rel[delta(i, j)]).view(H, D)  # K^r_{d(i,j)}
            q_r = (w_qr @ rel[delta(j, i) if p2c == "paper" else delta(i, j)]).view(H, D)
            ref[:, :, i, j] = (
                (q[:, :, i] * k[:, :, j]).sum(-1)
                + (q[:, :, i] * k_r).sum(-1)
                + (k[:, :, j] * q_r).sum(-1)
            ) / math.sqrt(3 * D)
    s, _ = scores_and_output(scheme, q, k, v, pos, layer)
    assert_close_with_grads(lower(s), lower(ref), (q, k), atol=1e-4, rtol=1e-4)


def test_deberta_p2c_defaults_to_the_paper_and_refuses_other_names():
    assert make("deberta").describe() == "k=16,p2c=paper"
    with pytest.raises(PosbenchError, match="p2c"):
        make("deberta", p2c="hf")


@pytest.mark.parametrize("name", ["shaw", "deberta"])
def test_distances_beyond_k_share_one_embedding(name):
    """Every distance >= K reads the same row: windows whose gaps all exceed K give identical
    outputs, while the unclipped window (gaps 1) differs, so the check could fail."""
    scheme = make(name, k=3)
    q, k, v = qkv(t=5)
    with torch.no_grad():
        far, o_far = scores_and_output(scheme, q, k, v, torch.arange(5) * 4)
        farther, o_farther = scores_and_output(scheme, q, k, v, torch.arange(5) * 50 + 7)
        near, o_near = scores_and_output(scheme, q, k, v, torch.arange(5))
    torch.testing.assert_close(lower(far), lower(farther))
    torch.testing.assert_close(o_far, o_farther)
    assert not torch.allclose(lower(far), lower(near), atol=1e-4)


# ----- CoPE -----------------------------------------------------------------------------------


@pytest.mark.parametrize("npos", [4, 0])
def test_cope_matches_double_loop(npos):
    """npos = 4 clamps most positions of a 7-token window at 3; npos = 0 (train_len + 1) none."""
    scheme = make("cope", npos=npos)
    npos = npos or 17
    q, k, v = qkv()
    layer = 1
    e = scheme.emb[layer].detach().T  # (npos, D): e[p] is row p
    ref = torch.zeros(B, H, T, T)
    for i in range(T):
        gates = [torch.sigmoid((q[:, :, i] * k[:, :, t]).sum(-1) / math.sqrt(D))
                 for t in range(i + 1)]  # g_it, each (B, H)
        for j in range(i + 1):
            p = torch.stack(gates[j : i + 1]).sum(0).clamp(max=npos - 1)  # (B, H)
            w = (p - p.floor())[..., None]
            # interpolate the embedding vectors, then dot with q (the scheme interpolates logits)
            e_p = e[p.floor().long()] * (1 - w) + e[p.ceil().long()] * w  # (B, H, D)
            content = (q[:, :, i] * k[:, :, j]).sum(-1)
            ref[:, :, i, j] = (content + (q[:, :, i] * e_p).sum(-1)) / math.sqrt(D)
    s, _ = scores_and_output(scheme, q, k, v, GAPPED, layer)
    assert_close_with_grads(lower(s), lower(ref), (q, k), atol=1e-5, rtol=1e-4)


def test_cope_positions_count_gated_tokens():
    """With every gate open (q.k large) p_ij = i - j + 1 exactly, so the position term equals
    q_i.e[i - j + 1]: CoPE counts tokens when every token counts."""
    scheme = make("cope")
    q = torch.ones(1, 1, T, D) * 10  # q.k / sqrt(D) = 100 * sqrt(D): sigmoid is 1.0 in float32
    k = torch.ones(1, 1, T, D) * 10
    with torch.no_grad():
        s = scheme.logits(q, k, GAPPED, scheme.prepare(GAPPED), 0)
        e = scheme.emb[0]
        for i in range(T):
            for j in range(i + 1):
                expected = (q[0, 0, i] @ k[0, 0, j] + q[0, 0, i] @ e[:, i - j + 1]) / math.sqrt(D)
                torch.testing.assert_close(s[0, 0, i, j], expected)


# ----- shared -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_every_parameter_learns(name):
    """Each table, projection and bias receives a gradient through the explicit path."""
    scheme = make(name, n_layers=1)
    q, k, v = qkv()
    ctx = attention.prepare(scheme, GAPPED, "explicit")
    attention.explicit_attention(q, k, v, scheme, ctx, 0).square().sum().backward()
    for pname, p in scheme.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, pname


@pytest.mark.parametrize("name", ["shaw", "xl", "deberta"])
def test_unsorted_positions_are_refused(name):
    scheme = make(name)
    with pytest.raises(PosbenchError, match="non-decreasing"):
        scheme.prepare(torch.tensor([0, 3, 2, 5]))


class LargestAllocation(TorchDispatchMode):
    """Records the largest storage any aten op returns (forward and backward)."""

    def __init__(self):
        super().__init__()
        self.largest, self.op = 0, None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                size = t.untyped_storage().nbytes()
                if size > self.largest:
                    self.largest, self.op = size, func
        return out


def test_allocation_monitor_catches_a_gathered_table():
    """The check below can fail: gathering (T, T, D) embeddings is caught."""
    n, d = 96, 32
    table = torch.randn(2 * n, d)
    index = torch.arange(n)[:, None] - torch.arange(n)[None, :] + n
    with LargestAllocation() as mon:
        table[index].sum()
    assert mon.largest >= n * n * d * 4


@pytest.mark.parametrize("name", NAMES)
def test_no_tensor_of_size_t_t_d(name):
    """Forward and backward of one attention layer at T = 192, D = 32, K and npos at the window
    length: no op allocates as much as a (T, T, D) float tensor, the size a gather of relative
    embeddings would take (most are (B, H, T, T) = T*T*D*4 / 16 bytes here)."""
    n, heads, d = 192, 2, 32
    dims = Dims(d_model=heads * d, n_heads=heads, n_layers=1, vocab_size=50, train_len=n,
                max_position=n, params={"k": n} if name in ("shaw", "deberta") else {})
    scheme = SCHEMES[name](dims)
    q, k, v = qkv(t=n, b=1, h=heads, d=d)
    pos = torch.arange(n)
    with LargestAllocation() as mon:
        ctx = attention.prepare(scheme, pos, "explicit")
        attention.explicit_attention(q, k, v, scheme, ctx, 0).sum().backward()
    assert q.grad is not None
    assert mon.largest < n * n * d * 4 / 4, (mon.largest, mon.op)
