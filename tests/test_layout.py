"""Layouts (posbench.layout): spans, temperatures, presets, the spec syntax, and the one-scheme
layout being the model it was before layouts."""

import math

import pytest
import torch

from conftest import tiny_model
from posbench import attention, layout
from posbench.attention import Span
from posbench.config import TrainConfig
from posbench.errors import PosbenchError
from posbench.model import ModelConfig
from posbench.temperature import Temperature
from posbench.runs import RunSpec, build_model
from posbench.training import make_optimizer

T = 16


def layer_io(model, layer: int, x: torch.Tensor):
    """The normed input of `layer`'s attention and its output, on the model's own path."""
    seen = {}

    def hook(module, args, out):
        seen["out"] = out

    handle = model.blocks[layer].attn.register_forward_hook(hook)
    try:
        model(x)
    finally:
        handle.remove()
    return seen["out"]


def attention_with_kv(model, layer: int, x: torch.Tensor, kv_noise: torch.Tensor | None):
    """Layer `layer`'s attention on input x with the given noise added to k and v after the
    projection: perturbs keys and values of chosen tokens only."""
    attn = model.blocks[layer].attn
    pos = torch.arange(x.shape[1])
    plan = model.layout.plan(pos, model.backend)[layer]
    original = attn.qkv.forward

    def qkv(inp):
        out = original(inp)
        if kv_noise is None:
            return out
        d = out.shape[-1] // 3
        return torch.cat([out[..., :d], out[..., d:] + kv_noise], dim=-1)

    attn.qkv.forward = qkv
    try:
        return attn(x, plan)
    finally:
        attn.qkv.forward = original


@pytest.mark.parametrize("backend", [None, "explicit"])
@pytest.mark.parametrize("spec,outside", [
    ("rope@w4", lambda i, j: i - j >= 4),
    ("rope@c4", lambda i, j: i // 4 != j // 4),
    ("alibi@w4", lambda i, j: i - j >= 4),
])
def test_keys_outside_the_span_change_nothing(spec, outside, backend):
    """Perturb the keys and values of every token outside query i's span: row i is unchanged;
    perturb one inside: it changes (so the test could fail)."""
    model = tiny_model(spec, n_layers=1)
    model.backend = backend
    x = torch.randn(1, T, 32)
    i = 11
    out_keys = torch.tensor([outside(i, j) for j in range(T)])
    noise = torch.zeros(1, T, 64)
    noise[0, out_keys] = torch.randn(int(out_keys.sum()), 64) * 3
    with torch.no_grad():
        base = attention_with_kv(model, 0, x, None)
        moved = attention_with_kv(model, 0, x, noise)
        inside = torch.zeros(1, T, 64)
        inside[0, i - 1] = 3.0
        moved_inside = attention_with_kv(model, 0, x, inside)
    assert out_keys.any()
    assert torch.allclose(base[0, i], moved[0, i], atol=1e-6)
    assert not torch.allclose(base[0, i], moved_inside[0, i], atol=1e-4)


@pytest.mark.parametrize("span", [Span("window", 5), Span("chunk", 6), attention.FULL])
def test_span_mask_and_counts(span):
    t = 20
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    if span.kind == "window":
        ref = (i - span.size < j) & (j <= i)
    elif span.kind == "chunk":
        ref = (i // span.size == j // span.size) & (j <= i)
    else:
        ref = j <= i
    assert torch.equal(span.mask(t, "cpu"), ref)
    assert torch.equal(span.visible(t, "cpu"), ref.sum(1))


def test_block_mask_skips_blocks_outside_a_window():
    """The BlockMask from mask_mod: a window of one block leaves every block but the diagonal
    and the one before it out (what lets FlexAttention's cost grow linearly)."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    t, block = 1024, 128
    window = attention.block_mask(Span("window", block), t, "cpu").to_dense()[0, 0]
    full = attention.block_mask(attention.FULL, t, "cpu").to_dense()[0, 0]
    n = t // block
    assert int(full.sum()) == n * (n + 1) // 2
    assert int(window.sum()) == 2 * n - 1
    chunk = attention.block_mask(Span("chunk", block), t, "cpu").to_dense()[0, 0]
    assert torch.equal(chunk.bool(), torch.eye(n, dtype=torch.bool))


@pytest.mark.slow
@pytest.mark.parametrize("span", [Span("window", 5), Span("chunk", 8), attention.FULL])
@pytest.mark.parametrize("scheme", ["rope", "alibi"])
def test_paths_agree_with_explicit_with_gradients(scheme, span):
    """SDPA (bool or float mask) equals the explicit path, outputs and gradients; the eager
    FlexAttention forward (CPU runs no flex backward) likewise."""
    from posbench.schemes import Dims, get_scheme

    dims = Dims(d_model=64, n_heads=4, n_layers=1, vocab_size=50, train_len=T, max_position=64)
    sch = get_scheme(scheme)(dims)
    pos = torch.arange(24)
    q, k, v = (torch.randn(2, 4, 24, 16, requires_grad=True) for _ in range(3))
    outs = {}
    for backend in (attention.choose_backend(sch, "cpu", span), "explicit"):
        ctx = attention.prepare(sch, pos, backend, span)
        y = attention.attend(q, k, v, sch, ctx, 0)
        grads = torch.autograd.grad(y.square().sum(), (q, k, v))
        outs[backend] = (y.detach(), grads)
    (a, ga), (b, gb) = outs.values()
    assert list(outs)[0] != "explicit"
    assert torch.allclose(a, b, atol=1e-5)
    for x, y in zip(ga, gb):
        assert torch.allclose(x, y, atol=1e-5)
    from torch.nn.attention.flex_attention import flex_attention

    ctx = attention.prepare(sch, pos, "flex", span)
    with torch.no_grad():
        flex = flex_attention(q.detach(), k.detach(), v.detach(), score_mod=ctx.score_mod,
                              block_mask=ctx.block_mask, scale=sch.qk_scale)
    assert torch.allclose(flex, b, atol=1e-5)


def test_logn_formula_and_one_inside_training_length():
    temp = Temperature("logn", {}, n_heads=2, train_len=64)
    pos = torch.arange(300)
    f = temp.factor(pos, attention.FULL)[:, 0]
    assert torch.equal(f[:64], torch.ones(64))
    for p in (64, 100, 299):
        assert f[p].item() == pytest.approx(math.log(p + 1) / math.log(64), rel=1e-6)


def test_llama4_temperature_formula():
    temp = Temperature("llama4", {"beta": 0.1, "floor": 16}, n_heads=2, train_len=64)
    f = temp.factor(torch.arange(100), attention.FULL)[:, 0]
    for p in (0, 14, 15, 47, 99):
        assert f[p].item() == pytest.approx(1 + 0.1 * math.log((p + 1) // 16 + 1), rel=1e-6)


def test_ssmax_scales_by_visible_keys_and_learns():
    model = tiny_model("rope@w4+ssmax", n_layers=1)
    temp = model.layout.temperatures[0]
    f = temp.factor(torch.arange(T), Span("window", 4))
    assert f.shape == (4, T, 1)
    n = torch.arange(1, T + 1).clamp(max=4).float()
    assert torch.allclose(f[0, :, 0], 0.43 * torch.log(n))
    x = torch.randint(0, 50, (2, T))
    model.token_losses(x, x).mean().backward()
    assert temp.s.grad is not None and temp.s.grad.abs().sum() > 0


def test_one_scheme_layout_reproduces_the_model_before_layouts():
    """Losses after two AdamW steps and run_ids, as computed before layouts existed (same seed,
    same init order): a plain scheme is the same model and the same run."""
    before = {  # scheme: (loss after 2 steps, run_id of this spec, run_id of the default spec)
        "rope": (3.902240514755249, "rope-526f511877", "rope-9bd2603e43"),
        "alibi": (3.9021570682525635, "alibi-79f0afb7f2", "alibi-c87d54b8ef"),
        "learned": (3.8700318336486816, "learned-fbd0403bf4", "learned-b954a8ee94"),
        "xl": (3.8846805095672607, "xl-a42a16167e", "xl-a464f1d4cc"),
    }
    steps = {"steps": 500}  # the default when these were recorded
    for name, (loss, run_id, default_id) in before.items():
        spec = RunSpec(scheme=name, model=ModelConfig(d_model=32, n_layers=2, n_heads=4),
                       train=TrainConfig(train_len=16, batch_size=2, **steps))
        assert spec.run_id == run_id
        assert RunSpec(scheme=name, train=TrainConfig(**steps)).run_id == default_id
        model = build_model(spec, 50)
        opt = make_optimizer(model, spec.train)
        gen = torch.Generator().manual_seed(1)
        for _ in range(2):
            x = torch.randint(0, 50, (2, 17), generator=gen)
            step_loss = model(x[:, :-1], targets=x[:, 1:]).mean()
            opt.zero_grad()
            step_loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        with torch.no_grad():
            got = float(model(x[:, :-1], targets=x[:, 1:]).mean())
        assert got == pytest.approx(loss, abs=1e-6), name


def test_weights_saved_before_layouts_load():
    model = tiny_model("learned", train_len=16)
    old = {k.replace("layout.schemes.0.", "scheme."): v for k, v in model.state_dict().items()}
    assert "scheme.table" in old
    fresh = tiny_model("learned", train_len=16, seed=3)
    fresh.load_state_dict(old)
    assert torch.equal(fresh.layout.schemes[0].table, model.layout.schemes[0].table)


def test_distinct_schemes_built_once_and_shared():
    model = tiny_model("rope@w*3/none", n_layers=8)
    assert [type(s).name for s in model.layout.schemes] == ["rope", "none"]
    assert model.layout.layer_scheme == [0, 0, 0, 1] * 2
    assert [s.kind for s in model.layout.spans] == ["window"] * 3 + ["full"] + ["window"] * 3 + ["full"]
    assert model.layout.spans[0].size == 4  # train_len 16 / 4


def test_contexts_built_once_per_scheme_and_span(monkeypatch):
    model = tiny_model("alibi@w*3/alibi", n_layers=4)
    calls = []
    original = attention.prepare

    def counting(scheme, pos, backend, span=attention.FULL, shared=None):
        calls.append(span)
        return original(scheme, pos, backend, span, shared)

    monkeypatch.setattr(attention, "prepare", counting)
    with torch.no_grad():
        model(torch.randint(0, 50, (1, T)))
    assert len(calls) == 2


@pytest.mark.parametrize("spec,canonical", [
    ("rope@w*3/none", "rope@w*3/none"),
    ("rope/rope", "rope"),
    ("rope:base=10000", "rope"),
    ("rope:base=500@w8/none/rope:base=500@w8/none", "rope:base=500.0@w8/none"),
    ("none+llama4:beta=0.1", "none+llama4"),
    ("rope@full+logn", "rope+logn"),
    ("rnope-swa", "rnope-swa"),
    ("rope:base=2e9@w", "rope:base=2000000000.0@w"),
])
def test_canonical_form(spec, canonical):
    assert layout.check(spec) == canonical
    assert layout.check(canonical) == canonical  # the canonical form parses to itself


@pytest.mark.parametrize("spec,message", [
    ("rope//none", "empty layer"),
    ("rope:base=1e20@w", "parameter base of scheme 'rope' is too large"),
    ("rope/", "empty layer"),
    ("rope@x4", "span 'x4'"),
    ("rope@w0", "span 'w0'"),
    ("rope@w4@c4", "more than one span"),
    ("rope+logn+ssmax", "more than one temperature"),
    ("rope+warm", "unknown temperature or modifier 'warm'"),
    ("rope+", "name is missing"),
    ("rope*0", "repeat count '0'"),
    ("rope*x", "repeat count 'x'"),
    ("rope*2*2", "more than one '*'"),
    ("ropee@w4", "unknown scheme 'ropee'"),
    ("rope:base", "must be KEY=VALUE"),
    ("rope:bse=5", "parameter"),
    ("rope:base=abc", "must be float"),
    ("none+llama4:beta=x", "must be a number"),
    ("none+logn:beta=1", "has no parameter 'beta'"),
    ("learned/sinusoidal", "mixes input schemes"),
    ("rnope_swa", "unknown scheme or layout"),
])
def test_malformed_specs_one_line(spec, message):
    with pytest.raises(PosbenchError, match=message) as e:
        layout.check(spec)
    assert "\n" not in str(e.value)


def test_runspec_of_layouts():
    spec = RunSpec(scheme="rope@w16*3/none")
    assert spec.run_id.startswith("rope_w16_3_none-") and spec.scheme == "rope@w16*3/none"
    assert spec.identity()["layout"] == "rope@w16*3/none"
    assert RunSpec(scheme="rnope-swa").run_id.startswith("rnope-swa-")
    # a default size resolves to train_len/4 in the identity: the same model, the same run
    assert RunSpec(scheme="rope@w*3/none").identity()["layout"] == "rope@w16*3/none"
    # a spec that is one plain scheme is that scheme, its parameters included
    assert RunSpec(scheme="rope:base=500").run_id == RunSpec(scheme="rope", params={"base": 500}).run_id
    assert RunSpec(scheme="rope/rope").run_id == RunSpec(scheme="rope").run_id
    with pytest.raises(PosbenchError, match="inside its spec"):
        RunSpec(scheme="rnope-swa", params={"base": 5})


def test_presets_build_on_the_tiny_model():
    for name in layout.PRESETS:
        model = tiny_model(name, n_layers=4)
        assert len(model.layout.spans) == 4
        with torch.no_grad():
            assert torch.isfinite(model(torch.randint(0, 50, (1, 4 * T)))).all()
    irope = tiny_model("irope", n_layers=4).layout
    assert [t.kind for t in irope.temperatures] == ["none"] * 3 + ["llama4"]
    assert irope.temperatures[3].p["floor"] == 4
    gemma = tiny_model("gemma3-local-global", n_layers=4).layout
    assert [s.p["base"] for s in gemma.schemes] == [10000.0, 1e6]


def test_task_files_take_layouts(tmp_path):
    from posbench.config import load_task

    task = load_task("layouts")
    assert "rnope-swa" in task.schemes and task.eval.lengths[-1] == 16 * task.train.train_len
    path = tmp_path / "t.toml"
    path.write_text('schemes = ["rope@w*3/none"]\n[params.rnope-swa]\nbase = 5\n')
    with pytest.raises(PosbenchError, match="inside its spec"):
        load_task(str(path))
    path.write_text('schemes = ["rope@w*3/nne"]\n')
    with pytest.raises(PosbenchError, match="unknown scheme 'nne'"):
        load_task(str(path))


@pytest.mark.parametrize("spec", ["rope@w4+ssmax/alibi@c4+logn", "irope"])
def test_model_paths_agree_with_explicit_with_gradients(spec):
    """Whole models, temperatures included: the chosen paths and the explicit one give the same
    losses and gradients (positions past train_len, so logn and llama4 are active)."""
    import copy

    fast = tiny_model(spec, n_layers=4).train()
    slow = copy.deepcopy(fast)
    slow.backend = "explicit"
    x = torch.randint(0, 50, (2, 3 * T))
    losses = [m.token_losses(x, x).mean() for m in (fast, slow)]
    for loss in losses:
        loss.backward()
    assert torch.allclose(losses[0], losses[1], atol=1e-5)
    for (n, a), (_, b) in zip(fast.named_parameters(), slow.named_parameters()):
        assert (a.grad is None) == (b.grad is None), n
        if a.grad is not None:
            assert torch.allclose(a.grad, b.grad, atol=1e-5), n


def test_plain_scheme_parameters_reach_the_model():
    from posbench.runs import RunSpec, build_model

    model = build_model(RunSpec("rope", params={"base": 500}), vocab_size=50)
    assert model.layout.schemes[0].p["base"] == 500.0
    spec_model = build_model(RunSpec("rope:base=500"), vocab_size=50)
    assert spec_model.layout.schemes[0].p["base"] == 500.0
