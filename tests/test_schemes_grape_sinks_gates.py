"""GRAPE and Selective RoPE against their reference code's math, re-derived here in the
references' own layout ((B, T, H, D), their rotation conventions); learned sinks and output gates
(posbench.modifiers) on every attention path; their layouts, bad parameters and training."""

import math

import pytest
import torch
import torch.nn.functional as F

from conftest import TINY_MODEL, TINY_TRAIN, tiny_model
from posbench import attention, layout
from posbench.errors import PosbenchError
from posbench.schemes import SCHEMES, Dims
from posbench.runs import RunSpec
from posbench.training import train

B, H, T, D = 2, 4, 12, 16


def qkv(seed=0, t=T, d=D):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, t, d, generator=g) for _ in range(3))


def same_weights(model, like):
    """`model` with every weight of `like` it shares (the scheme's own parameters kept)."""
    missing, unexpected = model.load_state_dict(like.state_dict(), strict=False)
    assert not unexpected and all(k.startswith("layout.") for k in missing)
    return model


# --- GRAPE -------------------------------------------------------------------------------------


def grape_reference(x, log_freq, scale, t):
    """model-architectures/GRAPE `MSGRAPECommuting.forward` + `apply_rotary_emb`, x (B, T, H, D):
    freq = exp(log_freq / scale) (H, D/2) after expanding a shared spectrum, angle = t freq,
    y1 = x1 cos + x2 sin, y2 = -x1 sin + x2 cos."""
    freq = torch.exp(log_freq / scale)
    if freq.dim() == 1:
        freq = freq.unsqueeze(0).expand(x.shape[2], -1)
    angles = torch.arange(t, dtype=torch.float32)[:, None, None] * freq[None]  # (T, H, D/2)
    cos, sin = angles.cos()[None], angles.sin()[None]
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat([x1 * cos + x2 * sin, -x1 * sin + x2 * cos], dim=-1)


def flip(x):
    """The second half of each head negated: turns the reference's planes (e_t, e_{t+D/2}) into
    posbench's (e_{t+D/2}, e_t)."""
    return torch.cat([x[..., : x.shape[-1] // 2], -x[..., x.shape[-1] // 2:]], dim=-1)


@pytest.mark.parametrize("per_head", [False, True])
def test_grape_matches_the_reference_rotation(per_head):
    """Trained-looking (perturbed) frequencies, shared or per head: posbench's rotation is the
    reference's with the other orientation of each plane, so the logits are equal."""
    scheme = SCHEMES["grape"](Dims(H * D, H, 1, 50, T, T, params={"per_head": per_head}))
    with torch.no_grad():
        scheme.log_freq += torch.randn(scheme.log_freq.shape, generator=torch.Generator().manual_seed(3))
    q, k, _ = qkv()
    pos = torch.arange(T)
    got_q, got_k = scheme.rotate(q, k, pos, scheme.prepare(pos), 0)
    ref_q, ref_k = (grape_reference(flip(x).transpose(1, 2), scheme.log_freq.detach(), 16.0, T).transpose(1, 2)
                    for x in (q, k))
    assert torch.allclose(flip(got_q), ref_q, atol=1e-5) and torch.allclose(flip(got_k), ref_k, atol=1e-5)
    assert torch.allclose(got_q @ got_k.transpose(-1, -2), ref_q @ ref_k.transpose(-1, -2), atol=1e-4)
    assert scheme.log_freq.shape == ((H, D // 2) if per_head else (D // 2,))


def test_grape_starts_at_ropes_spectrum_and_frozen_is_rope():
    """exp(w / c) at init is base^(-2t/D); with learn=false the model is rope's, output for output."""
    scheme = SCHEMES["grape"](Dims(H * D, H, 1, 50, T, T))
    want = 10000.0 ** -(torch.arange(0, D, 2) / D)
    assert torch.allclose(torch.exp(scheme.log_freq / 16.0), want.float(), rtol=1e-6)
    rope = tiny_model("rope")
    grape = same_weights(tiny_model("grape:learn=false"), rope)
    x = torch.randint(0, 50, (2, T))
    with torch.no_grad():
        assert torch.allclose(grape(x), rope(x), atol=1e-6)
    assert not list(grape.layout.parameters())  # frozen: a buffer, no learned parameter


def test_grape_learns_its_frequencies():
    model = tiny_model("grape").train()
    x = torch.randint(0, 50, (2, T))
    model(x, None, x).mean().backward()
    grad = model.layout.schemes[0].log_freq.grad
    assert grad is not None and grad.abs().sum() > 0


# --- Selective RoPE -----------------------------------------------------------------------------


def selective_reference(q, k, hidden, down, up, conv, temperature, bias=None):
    """timurcarstensen/selective-rope `SelectiveRoPE.forward` (its torch path), re-derived: q, k
    (B, T, H, D), hidden (B, T, d). l2_norm per head chunk, low-rank phi_proj, ShortConvolution
    (depthwise causal Conv1d, no bias, no activation), + exp(phi_bias), cumsum over time, angle =
    temperature * phi_tilde, rotation of cat([q, k], dim=2) in float32."""
    b, t, d = hidden.shape
    heads, pe = q.shape[2], q.shape[3] // 2
    hs = hidden.view(b, t, heads, -1)
    hs = hs * torch.rsqrt(hs.pow(2).sum(-1, keepdim=True) + 1e-6)
    phi = (hs.reshape(b, t, d) @ down.T @ up.T).transpose(1, 2)  # "b t (h d) -> b (h d) t"
    conv1d = torch.nn.Conv1d(heads * pe, heads * pe, conv.shape[-1], groups=heads * pe,
                             padding=conv.shape[-1] - 1, bias=False)
    conv1d.weight.data = conv[:, None, :].clone()
    phi = conv1d(phi)[..., :t].transpose(1, 2).reshape(b, t, heads, pe)  # "b t (h d) -> b t h d"
    if bias is not None:
        phi = phi + torch.exp(bias)[None, None]
    phi_tilde = torch.cumsum(phi, dim=1)
    qk = torch.cat([q, k], dim=2).float()
    qk_0, qk_1 = qk[..., :pe], qk[..., pe:]
    angle = temperature * torch.cat([phi_tilde, phi_tilde], dim=2)
    cos, sin = torch.cos(angle), torch.sin(angle)
    rotated = torch.cat([qk_0 * cos - qk_1 * sin, qk_0 * sin + qk_1 * cos], dim=-1)
    return torch.split(rotated, heads, dim=2)


@pytest.mark.parametrize("bias", [False, True])
def test_selective_rope_matches_the_reference(bias):
    """Weights large enough that the angles turn far (the reference's N(0, 0.02) would barely
    move them), two layers' stacks: layer 1 reads its own."""
    params = {"bias": bias, "rank": 8}
    scheme = SCHEMES["selective-rope"](Dims(H * D, H, 2, 50, T, T, params=params))
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in scheme.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.5 if p.dim() > 2 else 0.3))
    x = torch.randn(B, T, H * D, generator=g)
    q, k, _ = qkv(1)
    got_q, got_k = scheme.rotate(q, k, torch.arange(T), None, 1, scheme.content(x, 1))
    theta = 500000.0 ** -(torch.arange(0, D, 2, dtype=torch.float32) / D)
    ref_q, ref_k = selective_reference(q.transpose(1, 2), k.transpose(1, 2), x, scheme.down[1].detach(),
                                       scheme.up[1].detach(), scheme.conv_weight[1].detach(), theta,
                                       scheme.phi_bias[1].detach() if bias else None)
    assert torch.allclose(got_q, ref_q.transpose(1, 2), atol=1e-4)
    assert torch.allclose(got_k, ref_k.transpose(1, 2), atol=1e-4)


def test_selective_rope_angles_follow_the_input_causally():
    """Changing token 5 changes the angles of tokens 5.. and none before; the position indices
    are never read."""
    scheme = SCHEMES["selective-rope"](Dims(H * D, H, 1, 50, T, T))
    with torch.no_grad():
        scheme.up.mul_(50)
    x = torch.randn(1, T, H * D, generator=torch.Generator().manual_seed(0))
    y = x.clone()
    y[:, 5] += 1.0
    (cx, _), (cy, _) = scheme.content(x, 0), scheme.content(y, 0)
    assert torch.equal(cx[:, :, :5], cy[:, :, :5])
    assert (cx[:, :, 5:] - cy[:, :, 5:]).abs().amax(dim=(0, 1, 3)).min() > 0


def test_selective_rope_without_input_dependence_is_rope():
    """Maps at zero and bias on: phi = exp(0) = 1 for every token, angles theta (t + 1): rope with
    base 5e5, shifted by one position, which RoPE's logits do not see."""
    rope = tiny_model("rope:base=500000")
    model = same_weights(tiny_model("selective-rope:bias=true"), rope)
    with torch.no_grad():
        for name in ("down", "up", "conv_weight"):
            getattr(model.layout.schemes[0], name).zero_()
    x = torch.randint(0, 50, (2, T))
    with torch.no_grad():
        assert torch.allclose(model(x), rope(x), atol=1e-5)
        model.layout.schemes[0].up.fill_(0.3)
        model.layout.schemes[0].down.fill_(0.3)
        model.layout.schemes[0].conv_weight.fill_(0.3)
        assert not torch.allclose(model(x), rope(x), atol=1e-6)  # the test could fail


# --- sinks and gates ----------------------------------------------------------------------------


def sink_reference(q, k, v, sink, bias=None):
    """Per row by hand: a_ij = exp(l_ij) / (exp(s_h) + sum_j' exp(l_ij')), j <= i."""
    out = torch.zeros_like(v, dtype=torch.float64)
    for h in range(q.shape[1]):
        for i in range(q.shape[2]):
            logits = (q[:, h, i, None] * k[:, h, : i + 1]).sum(-1).double() / math.sqrt(q.shape[-1])
            if bias is not None:
                logits = logits + bias[h, i, : i + 1].double()
            weights = logits.exp() / (logits.exp().sum(-1, keepdim=True) + math.exp(float(sink[h])))
            out[:, h, i] = (weights[..., None] * v[:, h, : i + 1].double()).sum(1)
    return out.float()


def flex_out(scheme, q, k, v, pos, sink):
    from torch.nn.attention.flex_attention import flex_attention

    ctx = attention.prepare(scheme, pos, "flex")
    return attention.with_sink(*attention.flex_with_lse(flex_attention, q, k, v, ctx.score_mod,
                                                        ctx.block_mask, scheme.qk_scale), sink)


@pytest.mark.filterwarnings("ignore::UserWarning")  # eager FlexAttention on CPU is unfused
@pytest.mark.parametrize("name", ["rope", "alibi"])
def test_sink_on_every_path_is_the_extra_softmax_column(name):
    """Explicit, SDPA (a bool or a float mask) and FlexAttention's log-sum-exp route give the
    hand-computed softmax with the sink column; a sink of -inf gives the plain attention."""
    scheme = SCHEMES[name](Dims(H * D, H, 1, 50, T, T))
    q, k, v = qkv(2)
    pos = torch.arange(T)
    sink = torch.tensor([-1.0, 0.0, 0.5, 2.0])
    bias = scheme.bias(pos) if name == "alibi" else None
    want = sink_reference(q, k, v, sink, bias)
    # sdpa-causal, when forced on a sink, takes the span's mask (a bias never takes that path)
    backends = ("explicit", "sdpa-bias") if name == "alibi" else ("explicit", "sdpa-mask", "sdpa-causal")
    paths = {be: attention.attend(q, k, v, scheme, attention.prepare(scheme, pos, be), 0, sink=sink)
             for be in backends}
    if attention.flex_available():
        paths["flex"] = flex_out(scheme, q, k, v, pos, sink)
    for be, out in paths.items():
        assert torch.allclose(out, want, atol=1e-5), (be, (out - want).abs().max())
    plain = attention.attend(q, k, v, scheme, attention.prepare(scheme, pos, "explicit"), 0)
    off = torch.full((H,), float("-inf"))
    for be in backends:
        out = attention.attend(q, k, v, scheme, attention.prepare(scheme, pos, be), 0, sink=off)
        assert torch.allclose(out, plain, atol=1e-6), be
    if attention.flex_available():
        assert torch.allclose(flex_out(scheme, q, k, v, pos, off), plain, atol=1e-5)


@pytest.mark.parametrize("base", ["rope", "fox", "alibi@w5", "stickbreaking", "path"])
@pytest.mark.parametrize("backend", [None, "explicit"])
def test_a_sink_of_minus_infinity_is_the_plain_model(base, backend):
    """On the model, with every path a layer may take (chosen, or the explicit one); the sink
    logits get gradients."""
    if base == "stickbreaking":
        with pytest.raises(PosbenchError, match="takes no sink"):
            layout.parse("stickbreaking+sink")
        return
    plain = tiny_model(base)
    model = same_weights(tiny_model(base + "+sink"), plain)
    model.backend = plain.backend = backend
    x = torch.randint(0, 50, (2, T))
    with torch.no_grad():
        differs = not torch.allclose(model(x), plain(x), atol=1e-4)
        for sink in model.layout.sinks.values():
            sink.logit.fill_(float("-inf"))
        assert torch.allclose(model(x), plain(x), atol=1e-5)
    assert differs  # a sink at its initial 0 changes the outputs
    with torch.no_grad():
        for sink in model.layout.sinks.values():
            sink.logit.fill_(0.0)
    model.train()(x, None, x).mean().backward()
    assert all(s.logit.grad.abs().sum() > 0 for s in model.layout.sinks.values())


@pytest.mark.parametrize("elementwise", [False, True])
def test_output_gate_matches_the_reference_and_a_gate_of_ones_is_the_plain_model(elementwise, monkeypatch):
    """qiuzh20/gated_attention: attn_output (B, T, H, D) * sigmoid(gate_score), gate_score the
    extra q_proj columns reshaped (B, T, H, 1) headwise or (B, T, H, D) elementwise. Ones for
    the gate give the plain model on each path."""
    from posbench.modifiers import OutputGate

    gate = OutputGate(H * D, H, elementwise)
    x = torch.randn(B, T, H * D)
    y = torch.randn(B, H, T, D)
    score = F.linear(x, gate.weight).reshape(B, T, H, -1)
    want = (y.transpose(1, 2) * torch.sigmoid(score)).transpose(1, 2)
    assert torch.allclose(gate(x, y), want, atol=1e-6)

    for base in ("rope", "alibi", "fox@w5"):
        plain = tiny_model(base)
        spec = base + "+gate" + (":elementwise=true" if elementwise else "")
        model = same_weights(tiny_model(spec), plain)
        ids = torch.randint(0, 50, (2, T))
        with torch.no_grad():
            assert not torch.allclose(model(ids), plain(ids), atol=1e-4)
            for module in model.layout.gates.values():
                monkeypatch.setattr(module, "forward", lambda x, y: y * torch.ones_like(y))
            for backend in (None, "explicit"):
                model.backend = plain.backend = backend
                assert torch.allclose(model(ids), plain(ids), atol=1e-6), (base, backend)


def test_modifiers_in_layouts():
    assert layout.parse("rope+sink").name == "rope+sink"
    assert str(layout.parse("rope@w4+gate+logn+sink/none")) == "rope@w4+logn+sink+gate/none"
    swa = layout.parse("rnope-swa+gate")
    assert swa.name == "rnope-swa+gate" and all(lay.modifier("gate") is not None for lay in swa.pattern)
    assert [lay.scheme for lay in swa.pattern] == ["rope", "rope", "rope", "none"]
    assert layout.parse("none+gate").plain() is None and layout.recorded("rope+sink") == "rope+sink"
    model = tiny_model("rnope-swa+sink:init=-2")
    assert len(model.layout.sinks) == 4 and model.layout.sinks["3"].logit.tolist() == [-2.0] * 4
    assert model.layout.backends("cpu") == "sdpa-mask"  # the full NoPE layer leaves sdpa-causal


@pytest.mark.parametrize("spec, message", [
    ("rope+sink:init=high", "parameter init='high' of modifier 'sink'"),
    ("rope+sink:scale=1", "modifier 'sink' in layout 'rope+sink:scale=1' has no parameter 'scale'"),
    ("rope+gate:elementwise=maybe", "must be true or false"),
    ("rope+sink+sink", "takes the sink modifier once"),
    ("rope+snk", "unknown temperature or modifier 'snk'"),
    ("rnope-swa+logn", "a temperature follows a layer, not a preset"),
    ("rope+sink:init=nan", "must be a finite number"),
    ("grape:lr_scale=0", "parameter lr_scale of scheme 'grape' must be > 0, got 0.0"),
    ("grape:base=1", "parameter base of scheme 'grape' must be > 1, got 1.0"),
    ("selective-rope:rank=0", "parameter rank of scheme 'selective-rope' must be in [1, 65536], got 0"),
    ("selective-rope:conv=0", "parameter conv of scheme 'selective-rope' must be in [1, 65536], got 0"),
])
def test_bad_modifiers_and_parameters_are_one_line(spec, message, tiny_data, tmp_path, capsys):
    from posbench.cli import main

    args = ["train", "--scheme", spec, "--data", tiny_data.spec, "--tokenizer", "bytes", "--steps", "1",
            "--runs-dir", str(tmp_path)]
    assert main(args) == 2
    err = capsys.readouterr().err  # a scheme's values are checked where it is built, after the data
    # has loaded (and shown its progress): the error is the last line
    last = err.strip().splitlines()[-1]
    assert message in last and last.startswith("error:") and "Traceback" not in err, err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("name", ["grape", "selective-rope", "rope+sink", "none+gate"])
def test_new_schemes_and_modifiers_train(name, tiny_data, tmp_path):
    """Thirty steps at lr 1e-2: the training loss falls well below its start."""
    from dataclasses import replace

    from posbench import results

    t = replace(TINY_TRAIN, steps=30, lr=1e-2, warmup=3, eval_interval=30, checkpoint_interval=30)
    result = train(RunSpec(name, data=tiny_data, model=TINY_MODEL, train=t, task="test"), tmp_path,
                   device="cpu", progress=False)
    log = results.read_rows(tmp_path / result.run_id / "log.csv")
    first, last = float(log[0]["loss"]), float(log[-1]["loss"])
    assert result.row["status"] == "ok" and last < first - 1.5, (first, last)
