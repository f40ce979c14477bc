"""The 2025-26 schemes of the catalogue: pope, dape, fope, resonance, rope-pp, accum-rope (cable sits with fox in
test_schemes_gates.py). Each is checked against its reference's formula, with numbers computed
from it, and trained and extrapolated to 16x from the command line."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from conftest import tiny_model
from posbench import attention, results
from posbench.cli import main
from posbench.errors import PosbenchError
from posbench.schemes import SCHEMES, Dims
from posbench.policies import RopeScaling
from posbench.policies.frequencies import rope_frequencies


def make(name, d_head=8, heads=2, layers=2, train_len=16, **params):
    torch.manual_seed(0)
    return SCHEMES[name](Dims(d_head * heads, heads, layers, 50, train_len, train_len, params=params))


def qk_logits(scheme, q, k, pos, layer=0):
    """The scaled q'.k' of a qk scheme, (B, H, T, T)."""
    q2, k2 = scheme.rotate(q, k, pos, scheme.prepare(pos), layer)
    return q2 @ k2.transpose(-1, -2) * scheme.qk_scale


# --- pope --------------------------------------------------------------------------------------

def test_pope_logit_is_the_papers_polar_form():
    """q'.k'/sqrt(D) = sum_c softplus(q_c) softplus(k_c) cos((s - t) theta_c + delta_c) / sqrt(D),
    theta_c = base^(-c/D), delta clamped to [-2 pi, 0] (x-transformers PolarEmbedding)."""
    scheme = make("pope", d_head=4, heads=2, layers=2)
    with torch.no_grad():
        scheme.phase.uniform_(-7.0, 1.0)  # some outside [-2 pi, 0]: clamped
    theta = 10000.0 ** -(torch.arange(4, dtype=torch.float64) / 4)
    assert theta.tolist() == pytest.approx([1.0, 0.1, 0.01, 0.001])
    pos = torch.tensor([0, 3, 4, 9, 30])
    q, k = torch.randn(2, 1, 2, 5, 4, dtype=torch.float64).unbind(0)
    with torch.no_grad():
        got = qk_logits(scheme, q.float(), k.float(), pos, layer=1)
    delta = scheme.phase[1].detach().double().clamp(-2 * math.pi, 0)  # (H, D)
    for h in range(2):
        for t in range(5):
            for s in range(5):
                phase = (pos[s] - pos[t]) * theta + delta[h]
                want = (F.softplus(q[0, h, t]) * F.softplus(k[0, h, s]) * phase.cos()).sum() / 2
                assert float(got[0, h, t, s]) == pytest.approx(float(want), abs=1e-5)
    # one number by hand: D = 2, q = (0, 1) at t = 3, k = (1, -1) at s = 1, delta = (-0.5, -1):
    # (softplus(0) softplus(1) cos(-2 - 0.5) + softplus(1) softplus(-1) cos(-0.02 - 1)) / sqrt(2)
    small = make("pope", d_head=2, heads=1, layers=1)
    with torch.no_grad():
        small.phase.copy_(torch.tensor([[[-0.5, -1.0]]]))
    q = torch.tensor([[0.0, 1.0], [0.0, 0.0]]).view(1, 1, 2, 2)
    k = torch.tensor([[0.0, 0.0], [1.0, -1.0]]).view(1, 1, 2, 2)
    with torch.no_grad():
        logit = qk_logits(small, q, k, torch.tensor([3, 1]))[0, 0, 0, 1]
    assert float(logit) == pytest.approx(-0.36342320, abs=1e-6)


def test_pope_doubles_q_and_k_and_keeps_v():
    model = tiny_model("pope")
    scheme = model.layout.schemes[0]
    q, k = torch.randn(2, 1, 4, 5, 8).unbind(0)
    q2, k2 = scheme.rotate(q, k, torch.arange(5), scheme.prepare(torch.arange(5)), 0)
    assert q2.shape == k2.shape == (1, 4, 5, 16)
    assert scheme.qk_scale == 1 / math.sqrt(8)  # the head dim before doubling
    assert model(torch.randint(0, 50, (2, 16))).shape == (2, 16, 50)  # v, and the output, keep D


def test_pope_shift_leaves_logits_and_zero_offset_keeps_the_diagonal_nonnegative():
    scheme = make("pope", layers=2)
    with torch.no_grad():
        scheme.phase.uniform_(-2 * math.pi, 0)
    q, k = torch.randn(2, 3, 2, 7, 8).unbind(0)
    pos = torch.tensor([0, 1, 2, 5, 8, 13, 21])
    for layer in (0, 1):
        a, b = qk_logits(scheme, q, k, pos, layer), qk_logits(scheme, q, k, pos + 1000, layer)
        assert torch.allclose(a, b, atol=1e-5)
    assert not torch.allclose(qk_logits(scheme, q, k, pos, 0), qk_logits(scheme, q, k, pos, 1))
    # delta = 0: at t = s every term is softplus * softplus * cos 0 >= 0, whatever q and k
    fresh = make("pope")
    diagonal = qk_logits(fresh, q, k, pos).diagonal(dim1=-2, dim2=-1)
    assert (diagonal >= 0).all()
    rope = make("rope")
    assert (qk_logits(rope, q, k, pos).diagonal(dim1=-2, dim2=-1) < 0).any()  # not so for RoPE


def test_pope_offsets_are_learned_per_layer():
    model = tiny_model("pope", n_layers=2).train()
    x = torch.randint(0, 50, (2, 16))
    with torch.no_grad():
        model.layout.schemes[0].phase.fill_(-1.0)  # inside the clamp, so gradients pass
    model.token_losses(x, x).mean().backward()
    grad = model.layout.schemes[0].phase.grad
    assert grad.shape == (2, 4, 8) and (grad.flatten(1).abs().sum(1) > 0).all()


def test_pope_phase_offset_takes_no_weight_decay_and_its_revision_names_the_run(tmp_path):
    """delta (L, H, D) is 2-D yet a bias: out of AdamW's decay, while the model's matrices decay;
    the change is pope's revision 2, in its run_id, and a run of revision 1 is refused."""
    import json

    from conftest import TINY_MODEL, TINY_TRAIN
    from posbench.config import TrainConfig
    from posbench.runs import RunSpec, load_spec
    from posbench.training import make_optimizer

    model = tiny_model("pope")
    opt = make_optimizer(model, TrainConfig(weight_decay=0.1))
    decay = {id(p) for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    phase = model.layout.schemes[0].phase
    assert phase.dim() == 3 and id(phase) not in decay and id(model.head.weight) in decay
    with torch.no_grad():
        phase.fill_(-1.0)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()  # zero gradients: only decay could move it
    assert torch.equal(phase, torch.full_like(phase, -1.0))

    spec = RunSpec("pope", model=TINY_MODEL, train=TINY_TRAIN)
    assert spec.identity()["revisions"] == {"pope": 2}
    assert "revisions" not in RunSpec("rope", model=TINY_MODEL, train=TINY_TRAIN).identity()
    raw = {**spec.to_json(), "vocab_size": 50}
    assert raw["revisions"] == {"pope": 2}
    del raw["revisions"]  # as a run of revision 1 recorded it
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(PosbenchError, match="revision"):
        load_spec(tmp_path)


# --- dape --------------------------------------------------------------------------------------

def reference_kerple_c(x, p, a, mlp):
    """The reference's ParallelKerpleLog_C.forward: x (B, H, T, T) scores, p, a (H,); diff is
    tril(i - j), the bias -p log(1 + a diff), then x + bias + mlp2(cat(x, bias) across heads)."""
    t = x.shape[-1]
    diff = torch.tril(torch.arange(t).view(t, 1).repeat(1, t) + torch.arange(0, -t, -1)).to(x.dtype)
    bias = -p[:, None, None] * torch.log(1 + a[:, None, None] * diff)
    z = torch.cat((x, torch.tile(bias, (x.shape[0], 1, 1, 1))), dim=1).permute(0, 2, 3, 1)
    return x + bias + mlp(z).permute(0, 3, 1, 2)


def test_dape_logits_equal_the_reference_module():
    scheme = make("dape", layers=2)
    q, k = torch.randn(2, 3, 2, 9, 8).unbind(0)
    pos = torch.arange(9)
    with torch.no_grad():
        got = scheme.logits(q, k, pos, None, 1)
        r1, r2 = scheme.bases[1].coefficients()
        want = reference_kerple_c(q @ k.transpose(-1, -2) / math.sqrt(8), r1, r2, scheme.mlps[1])
    causal = torch.ones(9, 9, dtype=torch.bool).tril()
    assert torch.allclose(got[..., causal], want[..., causal], atol=1e-5)
    mlp = scheme.mlps[0]
    assert [type(m).__name__ for m in mlp] == ["Linear", "LeakyReLU", "Linear"]
    assert (mlp[0].in_features, mlp[0].out_features, mlp[2].out_features) == (4, 32, 2)
    assert mlp[1].negative_slope == 0.01
    assert scheme.mlps[0][0].weight.data_ptr() != scheme.mlps[1][0].weight.data_ptr()


def test_dape_with_the_last_layer_zeroed_is_its_base_scheme():
    """f's last Linear at zero leaves X + B: the alibi model exactly, and per layer kerple's
    logits."""
    dape, alibi = tiny_model("dape", base="alibi"), tiny_model("alibi")
    with torch.no_grad():
        for mlp in dape.layout.schemes[0].mlps:
            mlp[2].weight.zero_()
            mlp[2].bias.zero_()
    missing, _ = alibi.load_state_dict(dape.state_dict(), strict=False)
    assert not missing
    x = torch.randint(0, 50, (2, 16))
    with torch.no_grad():
        assert torch.allclose(dape(x), alibi(x), atol=1e-5)
    scheme = make("dape")
    with torch.no_grad():
        scheme.mlps[1][2].weight.zero_()
        scheme.mlps[1][2].bias.zero_()
        q, k = torch.randn(2, 1, 2, 6, 8).unbind(0)
        pos = torch.arange(6)
        got = scheme.logits(q, k, pos, None, 1)
        want = q @ k.transpose(-1, -2) * scheme.qk_scale + scheme.bases[1].bias(pos)
    assert torch.equal(got, want)


def test_dape_entry_reads_only_its_own_scores():
    """f is pointwise in (i, j): changing X(i, j') for j' != j leaves the logit at (i, j)."""
    scheme = make("dape")
    scores = torch.randn(2, 2, 10, 10)
    bias = scheme.bases[0].bias(torch.arange(10))
    changed = scores.clone()
    changed[:, :, 6, 7:] += 5.0  # the future of query 6, and another query's row
    changed[:, :, 2] -= 3.0
    with torch.no_grad():
        a, b = scheme.adapt(scores, bias, 0), scheme.adapt(changed, bias, 0)
    assert torch.equal(a[:, :, 6, :7], b[:, :, 6, :7])
    assert not torch.equal(a[:, :, 6, 7:], b[:, :, 6, 7:])


def test_dape_blocks_of_rows_change_nothing(monkeypatch):
    from posbench.schemes import adaptive

    scheme = make("dape")
    scores, bias = torch.randn(3, 2, 12, 12), scheme.bases[0].bias(torch.arange(12))
    with torch.no_grad():
        whole = scheme.adapt(scores, bias, 0)
        monkeypatch.setattr(adaptive, "ROW_BUDGET", 3 * 12 * 32 * 5)  # blocks of 5 rows
        assert torch.allclose(scheme.adapt(scores, bias, 0), whole, atol=1e-6)


def test_dape_bases():
    fire = make("dape", base="fire", train_len=64)
    base = fire.bases[0]
    assert base.L0 == 8.0 and base.activation is F.leaky_relu  # FIRE_C: init_L halved, LeakyReLU
    pos = torch.arange(20)
    h = torch.arange(2)[:, None, None]
    with torch.no_grad():  # the elementwise form (score_mod) and the matmul agree
        assert torch.allclose(base.bias_fn(h, pos[None, :, None], pos[None, None, :]), base.bias(pos), atol=1e-5)
    assert SCHEMES["fire"].activation is F.relu
    with pytest.raises(PosbenchError, match="kerple"):
        make("dape", base="kerpel")


# --- fope --------------------------------------------------------------------------------------

@pytest.mark.parametrize("train_len, kept, series", [(512, 16, 16), (1024, 18, 16), (64, 9, 9)])
def test_fope_drops_the_frequencies_that_do_not_turn_once(train_len, kept, series):
    """D = 64: omega_k = 1e4^(-2k/64) < 2 pi / L dropped; d_out = min(M, D/4)."""
    scheme = make("fope", d_head=64, heads=2, layers=2, train_len=train_len)
    assert scheme.cos_coef.shape == scheme.sin_coef.shape == (2, 2, kept, series)
    assert "cos_coef" in scheme.state_dict() and not list(scheme.parameters())  # fixed, saved


def test_fope_coefficients_follow_the_reference_init():
    """xavier_normal (gain sigma) over each layer's (H, M, d_out), plus 1 at [m ceil(M/d_out), m]."""
    flat = make("fope", d_head=64, heads=2, layers=1, train_len=1024, sigma=0.0)
    eye = torch.zeros(18, 16)
    for m in range(9):  # step ceil(18/16) = 2: rows 0, 2, .., 16; rows 18.. do not exist
        eye[2 * m, m] = 1.0
    assert torch.equal(flat.cos_coef[0, 1], eye) and torch.equal(flat.sin_coef[0, 0], eye)
    torch.manual_seed(0)
    noisy = SCHEMES["fope"](Dims(64 * 8, 8, 2, 50, 512, 512, params={"sigma": 0.3}))
    spread = (noisy.cos_coef - torch.eye(16)).std().item()
    assert spread == pytest.approx(0.3 * math.sqrt(2 / (16 * 16 + 8 * 16)), rel=0.1)
    assert not torch.equal(noisy.cos_coef[0], noisy.cos_coef[1])  # each layer its own


def test_fope_series_equal_a_loop_over_the_formula():
    """C_m(n) = sum_k A^c[k, m] cos(omega_k n), S_m(n) likewise with sin; padded channels 1."""
    scheme = make("fope", d_head=32, heads=2, layers=2, train_len=64)
    omega = 10000.0 ** -(torch.arange(0, 32, 2, dtype=torch.float64) / 32)
    omega = omega[omega >= 2 * math.pi / 64]
    assert len(omega) == 5
    pos = torch.tensor([0, 7, 64, 300])
    c, s = scheme.series(scheme.prepare(pos), 1)  # (H, T, 16)
    a_c, a_s = scheme.cos_coef[1].double(), scheme.sin_coef[1].double()
    for h in range(2):
        for i, n in enumerate(pos.tolist()):
            for m in range(16):
                want_c = sum(a_c[h, k, m] * math.cos(omega[k] * n) for k in range(5)) if m < 5 else 1.0
                want_s = sum(a_s[h, k, m] * math.sin(omega[k] * n) for k in range(5)) if m < 5 else 1.0
                assert float(c[h, i, m]) == pytest.approx(float(want_c), abs=1e-5)
                assert float(s[h, i, m]) == pytest.approx(float(want_s), abs=1e-5)


def test_fope_without_floor_and_noise_is_rope():
    fope, rope = make("fope", floor=False, sigma=0.0), make("rope")
    q, k = torch.randn(2, 2, 2, 9, 8).unbind(0)
    pos = torch.arange(9) * 5
    for a, b in zip(fope.rotate(q, k, pos, fope.prepare(pos), 1), rope.rotate(q, k, pos, rope.prepare(pos), 1)):
        assert torch.allclose(a, b, atol=1e-6)


def test_fope_padded_channels_carry_no_position():
    """The same q at every position: the padded channels of q' are (q_m - q_{m+D/2},
    q_{m+D/2} + q_m) everywhere; the kept ones change with the position."""
    scheme = make("fope", d_head=32, heads=2, layers=2, train_len=64)  # M = d_out = 5 of 16
    q = torch.randn(1, 2, 1, 32).expand(1, 2, 12, 32)
    pos = torch.arange(12) * 9
    q2, _ = scheme.rotate(q, q, pos, scheme.prepare(pos), 0)
    half = q[..., :16], q[..., 16:]
    padded = torch.cat([half[0] - half[1], half[1] + half[0]], -1)
    pad = [m for m in range(32) if m % 16 >= 5]
    assert torch.allclose(q2[..., pad], padded[..., pad], atol=1e-6)
    assert not torch.allclose(q2[:, :, :1, :5].expand(1, 2, 12, 5), q2[..., :5], atol=1e-3)


# --- resonance ---------------------------------------------------------------------------------

def test_resonance_wavelengths_are_the_papers_integers():
    scheme = make("resonance", d_head=64, heads=1, layers=1, train_len=512)
    inv, _ = scheme.frequencies(512)
    assert (2 * math.pi / inv)[:8].round().tolist() == [6, 8, 11, 15, 20, 26, 35, 47]
    assert float(inv[0]) == pytest.approx(math.pi / 3)  # not 1, as RoPE's first pair


def test_resonance_pairs_repeat_exactly_past_the_training_length():
    """R(n) = R(n mod lambda~_t) for the pairs with lambda~_t <= L, bit for bit."""
    scheme = make("resonance", d_head=64, heads=1, layers=1, train_len=64)
    inv, _ = scheme.frequencies(64)
    wavelengths = (2 * math.pi / inv).round().long()
    pos = torch.arange(64, 1000)
    cos, sin = scheme.angles(pos)
    for t in (wavelengths <= 64).nonzero().flatten().tolist():
        back = pos % wavelengths[t]
        c0, s0 = scheme.angles(back)
        assert torch.equal(cos[:, t], c0[:, t]) and torch.equal(sin[:, t], s0[:, t])


def test_resonance_yarn_rounds_after_yarn():
    """`--rope-scaling yarn` on resonance: YaRN's frequencies, then rounded; YaRN's attention
    factor kept (sheryc/resonance_rope LlamaYaRNScaledResonanceRotaryEmbedding)."""
    scheme = make("resonance", d_head=64, heads=1, layers=1, train_len=64)
    yarn = RopeScaling("yarn")
    scheme.set_scaling(yarn)
    got, mscale = scheme.frequencies(512)
    ref, ref_mscale = rope_frequencies(64, 10000.0, 64, yarn, 512)
    assert torch.equal(got, 2 * math.pi / (2 * math.pi / ref).round())
    assert mscale == ref_mscale == pytest.approx(0.1 * math.log(8) + 1)
    assert not torch.equal(got, scheme.frequencies(64)[0])


# --- rope-pp -----------------------------------------------------------------------------------

def complex_pairs(x):
    """(..., D) -> (..., D/2) complex: pair t as x_t + i x_{t + D/2} (half-split)."""
    x1, x2 = x.double().chunk(2, dim=-1)
    return torch.complex(x1, x2)


def complex_rope_product(qc, kc, pos, sign=1, base=10000.0):
    """z[t, s] = sum_p qc_p(t) conj(kc_p(s)) e^{sign i theta_p (pos_t - pos_s)} per head: qc, kc
    (B, H, T, D/2) complex -> (B, H, T, T) complex128, computed with torch's complex numbers alone."""
    d = 2 * qc.shape[-1]
    theta = base ** -(torch.arange(0, d, 2, dtype=torch.float64) / d)  # (D/2,)
    phase = sign * (pos[:, None, None] - pos[None, :, None]).double() * theta  # (T, T, D/2)
    return (qc[..., :, None, :] * kc[..., None, :, :].conj() * torch.polar(torch.ones_like(phase), phase)).sum(-1)


def test_rope_pp_imaginary_heads_are_the_imaginary_part_of_ropes_complex_product():
    """Head 2j is RoPE on head 2j's q and k: Re z. Head 2j + 1 reads the same q and k and gives
    Im z = -Im[sum conj(q~) k~ e^{-i theta (m - n)}] (the paper's form, its q~ the conjugate), which
    is also RoPE's logit with q turned by -pi/2 in each pair (q~ times -i); heads 1 and 3's own q, k
    are never read."""
    scheme, rope = make("rope-pp", d_head=8, heads=4), make("rope", d_head=8, heads=4)
    pos = torch.tensor([0, 3, 4, 9, 30])
    q, k = torch.randn(2, 1, 4, 5, 8).unbind(0)
    with torch.no_grad():
        got = qk_logits(scheme, q, k, pos).double()
    qc, kc = complex_pairs(q[:, 0::2]), complex_pairs(k[:, 0::2])  # the real heads' q and k
    z = complex_rope_product(qc, kc, pos) / math.sqrt(8)
    assert torch.allclose(got[:, 0::2], z.real, atol=1e-5)
    assert torch.allclose(got[:, 1::2], z.imag, atol=1e-5)
    paper = -complex_rope_product(qc.conj(), kc.conj(), pos, sign=-1).imag / math.sqrt(8)
    assert torch.allclose(got[:, 1::2], paper, atol=1e-5)
    assert not torch.allclose(got[:, 0::2], got[:, 1::2], atol=1e-2)
    # -pi/2 per pair: q~ * (-i), back to half-split reals, through plain RoPE
    turned = complex_pairs(q) * -1j
    turned = torch.cat([turned.real, turned.imag], dim=-1).float()
    with torch.no_grad():
        via_rope = qk_logits(rope, turned, k, pos)
    assert torch.allclose(got[:, 1::2], via_rope[:, 0::2].double(), atol=1e-5)
    other_q, other_k = q.clone(), k.clone()
    other_q[:, 1::2], other_k[:, 1::2] = 5.0, -3.0
    with torch.no_grad():
        assert torch.equal(qk_logits(scheme, other_q, other_k, pos).double(), got)


def test_rope_pp_logits_depend_on_the_distance_alone():
    scheme = make("rope-pp", d_head=8, heads=4)
    q, k = torch.randn(2, 1, 4, 6, 8).unbind(0)
    pos = torch.tensor([0, 1, 2, 5, 6, 11])
    with torch.no_grad():
        a = qk_logits(scheme, q, k, pos)
        b = qk_logits(scheme, q, k, pos + 1000)
        c = qk_logits(scheme, q, k, pos * 2)  # distances doubled: other logits
    assert torch.allclose(a, b, atol=1e-5), (a - b).abs().max()
    assert not torch.allclose(a, c, atol=1e-3)


def reference_rope_pp_eh(q, k, pos, base=10000.0):
    """Re-derived from OpenMOSS/rope_pp, rope_pp/modeling_llama_rope_pp.py: LlamaRotaryEmbedding
    (cos, sin of cat(freqs, freqs)), LlamaAttention.apply_rotary_pos_emb with imag_mode 'imag1'
    (q_rope = q cos + rotate_half(q) sin, q_imag = q sin - rotate_half(q) cos, stacked per query
    head as [real, imag]) and repeat_kv over the doubled key groups, then q.k * head_dim^-0.5.
    q, k (B, H/2, T, D) -> (B, H, T, T)."""
    b, h, t, d = q.shape
    inv_freq = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    freqs = pos.double()[:, None] * inv_freq
    emb = torch.cat([freqs, freqs], dim=-1)
    cos, sin = emb.cos(), emb.sin()

    def rotate_half(x):
        return torch.cat([-x[..., d // 2:], x[..., : d // 2]], dim=-1)

    q, k = q.double(), k.double()
    q_rope = q * cos + rotate_half(q) * sin
    q_imag = q * sin - rotate_half(q) * cos
    k_rope = k * cos + rotate_half(k) * sin
    q_all = torch.stack([q_rope, q_imag], dim=2).reshape(b, 2 * h, t, d)
    k_all = k_rope[:, :, None].expand(b, h, 2, t, d).reshape(b, 2 * h, t, d)
    return q_all @ k_all.transpose(-1, -2) * d**-0.5


def test_rope_pp_equals_the_reference_computation():
    scheme = make("rope-pp", d_head=8, heads=4, base=500.0)
    pos = torch.tensor([2, 3, 7, 8, 40])
    q, k = torch.randn(2, 1, 4, 5, 8).unbind(0)
    with torch.no_grad():
        got = qk_logits(scheme, q, k, pos).double()
    want = reference_rope_pp_eh(q[:, 0::2], k[:, 0::2], pos, base=500.0)
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
    # by hand, D = 2 (theta = 1), query at 3, key at 1: q = (1, 0), k = (1, 0) gives cos 2 / sqrt 2
    # and sin 2 / sqrt 2; q = (0, 1) gives -sin 2 / sqrt 2 (real) and cos 2 / sqrt 2 (imaginary)
    small = make("rope-pp", d_head=2, heads=2, layers=1)
    k = torch.tensor([[0.0, 0.0], [1.0, 0.0]]).view(1, 1, 2, 2).expand(1, 2, 2, 2)
    pos = torch.tensor([3, 1])
    for q0, real, imag in (((1.0, 0.0), -0.29426025, 0.64297038), ((0.0, 1.0), -0.64297038, -0.29426025)):
        q = torch.tensor([q0, (0.0, 0.0)]).view(1, 1, 2, 2).expand(1, 2, 2, 2)
        with torch.no_grad():
            logits = qk_logits(small, q, k, pos)[0, :, 0, 1]
        assert logits.tolist() == pytest.approx([real, imag], abs=1e-6)
        assert reference_rope_pp_eh(q[:, :1], k[:, :1], pos)[0, :, 0, 1].tolist() == pytest.approx([real, imag])


def test_rope_pp_two_map_policies_read_the_paired_heads():
    """Under rerope with a window past the window's length every logit is the near map's, plain
    RoPE: the logits hook pairs the heads as the qk hook does."""
    from posbench.policies import RopeScaling

    scheme = make("rope-pp", d_head=8, heads=4)
    pos = torch.arange(6) + 4
    q, k = torch.randn(2, 1, 4, 6, 8).unbind(0)
    with torch.no_grad():
        want = qk_logits(scheme, q, k, pos)
        scheme.set_scaling(RopeScaling("rerope", window=64))
        assert scheme.hooks == ("logits",)
        got = scheme.logits(q, k, pos, None, 0)
    assert torch.allclose(got, want, atol=1e-5)


def test_rope_pp_equal_heads_refuses_odd_heads_in_one_line(capsys):
    """(variant=ec, which takes any head count, is tested in test_schemes_2026.py.)"""
    with pytest.raises(PosbenchError, match="n_heads must be even, got 3"):
        make("rope-pp", heads=3)
    make("rope-pp", heads=3, variant="ec")
    assert main(["check", "rope-pp", "--skip", "cost"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "pass translation" in "\n".join(out) and not [line for line in out if line.startswith("fail")]
    assert out[-1] == "rope-pp: 11 of 11 properties without a fail"


def test_rope_pp_trains_and_extrapolates_to_16x_with_yarn_from_the_command_line(corpus_dir, tmp_path):
    common = ["--data", f"files:{corpus_dir}", "--runs-dir", str(tmp_path), "--train-len", "16",
              "--steps", "3", "--batch-size", "4", "--d-model", "32", "--layers", "1", "--heads", "2",
              "--tokenizer", "bytes", "--device", "cpu"]
    assert main(["train", "--scheme", "rope-pp", *common]) == 0
    assert main(["extrapolate", "--runs-dir", str(tmp_path), "--lengths", "16,256", "--tokens", "256",
                 "--device", "cpu", "--rope-scaling", "none,yarn"]) == 0
    rows = results.read_rows(tmp_path / "extrapolation.csv")
    assert {(r["scheme"], int(r["eval_len"]), r["scaling"]) for r in rows} == {
        ("rope-pp", n, s) for n in (16, 256) for s in ("none", "yarn")}
    assert all(r["status"] == "ok" and math.isfinite(float(r["ppl"])) for r in rows)
    assert [r["backend"] for r in results.read_rows(tmp_path / "runs.csv")] == ["sdpa-causal"]


# --- accum-rope --------------------------------------------------------------------------------

def accum_angles(scheme, x, layer):
    """Phi (B, H, T, D/2) float64 by a loop over the paper's sums: delta_t = softplus(w_h . x_t + b_h),
    Phi_t = theta_p sum_{s <= t} delta_s."""
    w, b = scheme.step_weight[layer].detach().double(), scheme.step_bias[layer].detach().double()
    theta = scheme.p["base"] ** -(torch.arange(0, scheme.head_dim, 2, dtype=torch.float64) / scheme.head_dim)
    batch, t, _ = x.shape
    phi = torch.zeros(batch, scheme.n_heads, t, scheme.head_dim // 2, dtype=torch.float64)
    for i in range(t):
        for s in range(i + 1):
            phi[:, :, i] += F.softplus(x[:, s].double() @ w.T + b)[..., None] * theta
    return phi


def test_accum_rope_logit_turns_by_the_steps_between_key_and_query():
    """q_i'.k_j' = sum_p Re[q~_p conj(k~_p) e^{i (Phi_i - Phi_j)_p}], and Phi_i - Phi_j sums the steps of
    tokens j+1..i only: changing token j's input leaves the angle between j and i unchanged."""
    scheme = make("accum-rope", d_head=4, heads=2, layers=2)
    with torch.no_grad():
        scheme.step_weight.normal_(0, 0.5)
        scheme.step_bias.normal_(0, 0.5)
    x = torch.randn(1, 5, 8)
    q, k = torch.randn(2, 1, 2, 5, 4).unbind(0)
    with torch.no_grad():
        q2, k2 = scheme.rotate(q, k, None, None, 1, scheme.content(x, 1))
    phi = accum_angles(scheme, x, 1)  # (1, H, T, 2)
    qc = torch.complex(q[..., :2].double(), q[..., 2:].double())
    kc = torch.complex(k[..., :2].double(), k[..., 2:].double())
    between = phi[..., :, None, :] - phi[..., None, :, :]  # (1, H, T, T, 2): Phi_i - Phi_j
    turn = torch.polar(torch.ones_like(between), between)
    want = (qc[..., :, None, :] * kc[..., None, :, :].conj() * turn).real.sum(-1)
    assert torch.allclose(q2 @ k2.mT, want.float(), atol=1e-5)
    moved = x.clone()
    moved[:, 1] += 1.0
    gap = phi[:, :, 4] - phi[:, :, 1]
    moved_phi = accum_angles(scheme, moved, 1)
    assert torch.allclose(moved_phi[:, :, 4] - moved_phi[:, :, 1], gap)
    assert not torch.allclose(moved_phi[:, :, 4] - moved_phi[:, :, 0], phi[:, :, 4] - phi[:, :, 0])


def test_accum_rope_numbers_by_hand():
    """D = 2, one head, w = (1, 0), b = 0: x_0 = (0, 0) steps softplus(0) = ln 2, x_1 = (ln 3, 0) steps
    ln 4. The logit of q_1 = (1, 0) on k_0 = (1, 0) is cos(ln 4) / sqrt(2); with the values rotated,
    the output of query 1 attending to key 0 alone reads v_0 = (1, 0) turned by -ln 4."""
    scheme = make("accum-rope", d_head=2, heads=1, layers=1)
    with torch.no_grad():
        scheme.step_weight.copy_(torch.tensor([[[1.0, 0.0]]]))
        scheme.step_bias.zero_()
    x = torch.tensor([[[0.0, 0.0], [math.log(3), 0.0]]])
    unit = torch.tensor([1.0, 0.0]).expand(1, 1, 2, 2)
    with torch.no_grad():
        z = scheme.content(x, 0)
        q2, k2 = scheme.rotate(unit, unit, None, None, 0, z)
        logit = (q2 @ k2.mT)[0, 0, 1, 0] * scheme.qk_scale
        attn = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
        out = scheme.turn_output(attn @ scheme.turn_values(unit, None, None, 0, z), None, None, 0, z)
    assert float(logit) == pytest.approx(math.cos(math.log(4)) / math.sqrt(2), abs=1e-6)
    assert out[0, 0, 1].tolist() == pytest.approx([math.cos(math.log(4)), -math.sin(math.log(4))], abs=1e-6)
    assert out[0, 0, 0].tolist() == pytest.approx([1.0, 0.0], abs=1e-6)


@pytest.mark.parametrize("values", [False, True])
def test_accum_rope_with_unit_steps_is_rope_unless_it_turns_the_values(values):
    """w = 0, b = softplus^-1(1): every step 1, Phi_t = (t + 1) theta: rope's logits; the value rotation
    then changes the outputs (the value of key j read turned by -(i - j) theta)."""
    rope = tiny_model("rope")
    model = tiny_model("accum-rope", values=values)
    missing, unexpected = model.load_state_dict(rope.state_dict(), strict=False)
    assert not unexpected and all(k.startswith("layout.") for k in missing)
    with torch.no_grad():
        model.layout.schemes[0].step_weight.zero_()
        x = torch.randint(0, 50, (2, 12))
        same = torch.allclose(model(x), rope(x), atol=1e-5)
    assert same != values
    assert ("vo" in model.layout.schemes[0].hooks) == values


# --- all of them from the command line ---------------------------------------------------------

NEW = ("pope", "dape", "cable", "fope", "resonance", "accum-rope")


@pytest.mark.slow
def test_train_and_extrapolate_to_16x_from_the_command_line(corpus_dir, tmp_path):
    common = ["--data", f"files:{corpus_dir}", "--runs-dir", str(tmp_path), "--train-len", "16",
              "--steps", "3", "--batch-size", "4", "--d-model", "32", "--layers", "1", "--heads", "2",
              "--tokenizer", "bytes", "--device", "cpu"]
    for name in NEW:
        assert main(["train", "--scheme", name, *common]) == 0
    assert main(["extrapolate", "--runs-dir", str(tmp_path), "--lengths", "16,256", "--tokens", "256",
                 "--device", "cpu", "--rope-scaling", "none,yarn"]) == 0
    rows = results.read_rows(tmp_path / "extrapolation.csv")
    assert {(r["scheme"], int(r["eval_len"]), r["scaling"]) for r in rows} == {
        (s, n, "none") for s in NEW for n in (16, 256)} | {("resonance", n, "yarn") for n in (16, 256)}
    assert all(r["status"] == "ok" and math.isfinite(float(r["ppl"])) for r in rows)
    backends = {r["scheme"]: r["backend"] for r in results.read_rows(tmp_path / "runs.csv")}
    assert backends == {"pope": "sdpa-causal", "dape": "explicit", "cable": "sdpa-bias",
                        "fope": "sdpa-causal", "resonance": "sdpa-causal", "accum-rope": "sdpa-causal"}
    assert attention.choose_backend(copy.deepcopy(make("cable", d_head=16)), "cuda") == "flex"
