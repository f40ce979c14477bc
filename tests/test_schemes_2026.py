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


@pytest.mark.slow
def test_repo_passes_check_and_trains_from_the_command_line(corpus_dir, tmp_path, capsys):
    assert main(["check", "repo", "--skip", "cost"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "repo: 11 of 11 properties without a fail"
    common = ["--data", f"files:{corpus_dir}", "--runs-dir", str(tmp_path), "--train-len", "16",
              "--steps", "3", "--batch-size", "4", "--d-model", "32", "--layers", "4", "--heads", "2",
              "--tokenizer", "bytes", "--device", "cpu"]
    assert main(["train", "--scheme", "repo", *common]) == 0


# --- rope-pp, variant ec -----------------------------------------------------------------------

def reference_rope_pp_ec_layer(x, wq, wk, wv, wo, pos, heads, base=10000.0):
    """Re-derived from OpenMOSS/rope_pp, rope_pp/modeling_llama_rope_pp.py, LlamaAttention with
    imag_mode 'imag2' (train-*-rope_pp_ec.sh) and as many key and value heads as query heads (as
    here): q_proj, k_proj, v_proj of H heads; cos and sin of cat(freqs, freqs); q_rope = q cos +
    rotate_half(q) sin, q_imag = q sin - rotate_half(q) cos, stacked per query head to 2H heads
    [real, imag]; k_rope likewise; num_key_value_groups doubled, so repeat_kv repeats each key and
    value head twice in a row; causal softmax(q k^T head_dim^-0.5) v; the 2H outputs side by side
    (B, T, 2 H D) into o_proj (2 H D -> d). x (B, T, d) -> (B, T, d), float64."""
    b, t, _ = x.shape
    x = x.double()

    def split(w):
        return (x @ w.double().T).view(b, t, heads, -1).transpose(1, 2)  # (B, H, T, D)

    q, k, v = split(wq), split(wk), split(wv)
    d = q.shape[-1]
    inv_freq = 1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    emb = torch.cat([pos.double()[:, None] * inv_freq] * 2, dim=-1)
    cos, sin = emb.cos(), emb.sin()
    q_rope = q * cos + hf_rotate_half(q) * sin
    q_imag = q * sin - hf_rotate_half(q) * cos
    k_rope = k * cos + hf_rotate_half(k) * sin
    q_all = torch.stack([q_rope, q_imag], dim=2).reshape(b, 2 * heads, t, d)

    def repeat_kv(h):
        return h[:, :, None].expand(b, heads, 2, t, d).reshape(b, 2 * heads, t, d)

    scores = q_all @ repeat_kv(k_rope).transpose(-1, -2) * d**-0.5
    scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    out = scores.softmax(-1) @ repeat_kv(v)  # (B, 2H, T, D)
    return out.transpose(1, 2).reshape(b, t, 2 * heads * d) @ wo.double().T


def ec_model(heads=4, d_model=32, **kw):
    torch.manual_seed(0)
    from posbench import layout
    from posbench.model import ModelConfig, Transformer
    dims = Dims(d_model=d_model, n_heads=heads, n_layers=1, vocab_size=50, train_len=16, max_position=16,
                params={"variant": "ec", **kw})
    return Transformer(ModelConfig(50, d_model, 1, heads), layout.build("rope-pp", dims)).eval()


@pytest.mark.parametrize("backend", [None, "explicit"])
@pytest.mark.parametrize("heads", [4, 3])
def test_rope_pp_equal_cache_layer_equals_the_reference_computation(backend, heads):
    model = ec_model(heads=heads, d_model=8 * heads, base=500.0)
    model.backend = backend
    attn = model.blocks[0].attn
    d = 8 * heads
    assert attn.qkv.weight.shape == (3 * d, d) and attn.proj.weight.shape == (d, 2 * d)  # the cache stays H
    assert model.layout.heads(0) == 2 and model.layout.schemes[0].hooks == ("qk", "heads")
    x = torch.randn(2, 6, d)
    pos = torch.arange(6) + 3
    with torch.no_grad():
        got = attn(x, model.layout.plan(pos, backend)[0])
    wq, wk, wv = attn.qkv.weight.detach().chunk(3, dim=0)
    want = reference_rope_pp_ec_layer(x, wq, wk, wv, attn.proj.weight.detach(), pos, heads, base=500.0)
    assert torch.allclose(got.double(), want, atol=1e-5), (got.double() - want).abs().max()


def test_rope_pp_equal_cache_heads_are_the_real_and_imaginary_parts_of_every_head():
    """Heads 2j and 2j + 1 are Re z and Im z of head j's q and k (every head's, not only the even
    ones' as in eh); by hand, D = 2, q = k = (1, 0), query at 3, key at 1: cos 2 / sqrt 2 and
    sin 2 / sqrt 2."""
    scheme = make("rope-pp", d_model=2, heads=1, layers=1, variant="ec")
    q = torch.tensor([[1.0, 0.0], [0.0, 0.0]]).view(1, 1, 2, 2)
    k = torch.tensor([[0.0, 0.0], [1.0, 0.0]]).view(1, 1, 2, 2)
    pos = torch.tensor([3, 1])
    with torch.no_grad():
        q2, k2 = scheme.rotate(q, k, pos, scheme.prepare(pos), 0)
    assert q2.shape == k2.shape == (1, 2, 2, 2)
    logits = (q2 @ k2.transpose(-1, -2) * scheme.qk_scale)[0, :, 0, 1]
    assert logits.tolist() == pytest.approx([math.cos(2) / math.sqrt(2), math.sin(2) / math.sqrt(2)], abs=1e-6)
    eh = make("rope-pp", d_model=32, heads=4)
    ec = make("rope-pp", d_model=32, heads=4, variant="ec")
    q, k = torch.randn(2, 1, 4, 5, 8).unbind(0)
    pos = torch.tensor([0, 3, 4, 9, 30])
    with torch.no_grad():
        a = eh.rotate(q, k, pos, eh.prepare(pos), 0)
        b = ec.rotate(q, k, pos, ec.prepare(pos), 0)
    # ec's heads 0, 1 and 4, 5 (of model heads 0 and 2) are eh's heads 0, 1 and 2, 3
    for x, y in zip(a, b):
        assert torch.equal(y[:, [0, 1, 4, 5]], x)


def test_rope_pp_equal_cache_keeps_its_heads_under_the_two_map_policies():
    """rerope with a window past the window's length is plain RoPE everywhere: the logits hook
    pairs every head as the qk hook does, and the layer keeps its 2H heads."""
    from posbench.policies import RopeScaling

    model = ec_model(heads=4, d_model=32)
    x = torch.randint(0, 50, (2, 12))
    with torch.no_grad():
        want = model(x)
        model.layout.set_scaling(RopeScaling("rerope", window=64))
        assert model.layout.schemes[0].hooks == ("logits", "heads")
        got = model(x)
        model.layout.set_scaling(RopeScaling())
        assert model.layout.schemes[0].hooks == ("qk", "heads")
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()


def test_rope_pp_equal_cache_without_its_imaginary_outputs_is_rope():
    """Zero the output projection's columns of the imaginary heads: the layer is a `rope` layer
    with the same q, k, v projections and the real heads' columns as its output projection."""
    from posbench.model import ModelConfig, Transformer
    from posbench import layout
    model = ec_model(heads=4, d_model=32)
    torch.manual_seed(0)
    dims = Dims(d_model=32, n_heads=4, n_layers=1, vocab_size=50, train_len=16, max_position=16)
    rope = Transformer(ModelConfig(50, 32, 1, 4), layout.build("rope", dims)).eval()
    attn, plain = model.blocks[0].attn, rope.blocks[0].attn
    assert plain.proj.weight.shape == (32, 32) and rope.layout.heads(0) == 1
    columns = torch.arange(64).view(8, 8)  # (2H, D): the inputs of the output projection by head
    with torch.no_grad():
        plain.qkv.weight.copy_(attn.qkv.weight)
        plain.proj.weight.copy_(attn.proj.weight[:, columns[0::2].flatten()])
        attn.proj.weight[:, columns[1::2].flatten()] = 0.0
    x = torch.randn(2, 7, 32)
    pos = torch.arange(7)
    with torch.no_grad():
        got = attn(x, model.layout.plan(pos)[0])
        want = plain(x, rope.layout.plan(pos)[0])
    assert torch.allclose(got, want, atol=1e-6), (got - want).abs().max()


@pytest.mark.slow
def test_rope_pp_equal_cache_from_the_command_line(corpus_dir, tmp_path, capsys):
    """check passes; an output gate (one unit per model head) is refused in one line; it trains."""
    assert main(["check", "rope-pp", "--param", "variant=ec", "--skip", "cost"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "rope-pp: 11 of 11 properties without a fail"
    assert main(["check", "rope-pp:variant=ec+sink", "--skip", "cost"]) == 0
    capsys.readouterr()
    assert main(["check", "rope-pp:variant=ec+gate", "--skip", "cost"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "takes no gate" in err[0]
    common = ["--data", f"files:{corpus_dir}", "--runs-dir", str(tmp_path), "--train-len", "16",
              "--steps", "3", "--batch-size", "4", "--d-model", "32", "--layers", "1", "--heads", "2",
              "--tokenizer", "bytes", "--device", "cpu"]
    assert main(["train", "--scheme", "rope-pp", "--param", "variant=ec", *common]) == 0
