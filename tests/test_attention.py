"""The attention paths (posbench.attention) beyond what the registry-wide backend test covers:
FlexAttention's score_mod against the explicit path, the compiled kernel where this machine can
run it, and the float mask built once per forward."""

import shutil
import warnings

import pytest
import torch
from torch import nn

from conftest import tiny_model
from posbench import attention, layout
from posbench.schemes import SCHEMES, Dims, Scheme

H, D, T = 4, 16, 40
FLEX = [n for n in sorted(SCHEMES)
        if attention.choose_backend(SCHEMES[n](Dims(H * D, H, 1, 50, T, T)), "cuda") == "flex"]
needs_flex = pytest.mark.skipif(not attention.flex_available(), reason="no FlexAttention in this torch")


def scheme_with_random_parameters(name: str) -> Scheme:
    torch.manual_seed(0)
    scheme = SCHEMES[name](Dims(H * D, H, 1, 50, T, T + 8))
    with torch.no_grad():
        for p in scheme.parameters():
            p.add_(torch.randn_like(p) * 0.3)  # t5's table starts at zero: make it matter
    return scheme


def flex_and_explicit(scheme, flex_fn, pos, head_dim=D):
    """Outputs of one attention call through `flex_fn` and through the explicit path."""
    q, k, v = (torch.randn(2, H, pos.shape[0], head_dim) for _ in range(3))
    ctx = attention.prepare(scheme, pos, "flex")
    if "qk" in scheme.hooks:
        q, k = (t.detach() for t in scheme.rotate(q, k, pos, ctx.shared, 0))
    out = flex_fn(q, k, v, score_mod=ctx.score_mod, block_mask=ctx.block_mask, scale=scheme.qk_scale)
    ref = attention.explicit_attention(q, k, v, scheme, attention.prepare(scheme, pos, "explicit"), 0)
    return out, ref


@pytest.mark.slow
@needs_flex
@pytest.mark.parametrize("name", FLEX)
def test_score_mod_equals_explicit_bias_and_gradients(name):
    """Every scheme sent to FlexAttention on CUDA: its score_mod (eager FlexAttention, which runs
    on CPU) gives the explicit path's output and the same gradients into the scheme's parameters,
    which reach them only through tensors the score_mod captures."""
    from torch.nn.attention.flex_attention import flex_attention

    scheme = scheme_with_random_parameters(name)
    pos = torch.arange(T) + 3
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager FlexAttention warns that it is unfused
        out, ref = flex_and_explicit(scheme, flex_attention, pos)
        assert torch.allclose(out, ref, atol=1e-5), (out - ref).abs().max()
        params = [p for p in scheme.parameters() if p.requires_grad]
        if params and out.requires_grad:
            g = torch.randn_like(out)
            got = torch.autograd.grad(out, params, g, allow_unused=True)
            want = torch.autograd.grad(ref, params, g, allow_unused=True)
            for a, b in zip(got, want):
                assert (a is None) == (b is None)
                if a is not None:
                    assert torch.allclose(a, b, atol=1e-4, rtol=1e-4), (a - b).abs().max()


@pytest.mark.slow
@needs_flex
@pytest.mark.parametrize("name", ["t5", "tupe"])
@pytest.mark.parametrize("t", [T, 200])  # 200: five times the training length, past max_distance 128
def test_learned_table_bias_reads_a_distance_vector_with_the_explicit_gradients(name, t, monkeypatch):
    """t5 and tupe gather a small learned bucket table by distance. Their score_mod reads a
    vector of the window's distances built once per forward (2n - 1 cells per head), never the
    table; outputs and the gradients into q, k, v and the table equal the explicit path's (1e-5
    and 1e-4), at the training length and past it."""
    import torch.nn.attention.flex_attention as flex_module
    from torch.nn.attention.flex_attention import flex_attention
    from torch.overrides import TorchFunctionMode

    # eager FlexAttention refuses gradients into q, k, v on a CPU before computing; its dense
    # reference computes them (posbench.conformance.checked_flex likewise)
    monkeypatch.setattr(flex_module, "_validate_device", lambda *args: None)
    torch.manual_seed(0)
    scheme = SCHEMES[name](Dims(H * D, H, 1, 50, T, 256))
    with torch.no_grad():
        for p in scheme.parameters():
            p.add_(torch.randn_like(p) * 0.3)  # the bucket tables start at zero
    table = scheme.table if name == "t5" else scheme.buckets
    pos = torch.arange(t) + 5
    q, k, v = (torch.randn(2, H, t, D, requires_grad=True) for _ in range(3))

    def attend(backend):
        ctx = attention.prepare(scheme, pos, backend)
        q2, k2 = scheme.rotate(q, k, pos, ctx.shared, 0) if "qk" in scheme.hooks else (q, k)
        if backend == "explicit":
            return attention.explicit_attention(q2, k2, v, scheme, ctx, 0), ctx
        return flex_attention(q2, k2, v, score_mod=ctx.score_mod, block_mask=ctx.block_mask,
                              scale=scheme.qk_scale), ctx

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager FlexAttention warns that it is unfused
        out, ctx = attend("flex")
    ref, _ = attend("explicit")
    assert torch.allclose(out, ref, atol=1e-5), (out - ref).abs().max()
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, [q, k, v, table], g)
    want = torch.autograd.grad(ref, [q, k, v, table], g)
    for which, a, b in zip("qkvt", got, want):
        assert b.abs().max() > 0, which
        assert torch.allclose(a, b, atol=1e-4, rtol=1e-4), (which, (a - b).abs().max())

    read = []

    class Reads(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is torch.Tensor.__getitem__ and args[0].requires_grad:
                read.append(tuple(args[0].shape))
            return func(*args, **(kwargs or {}))

    i = torch.arange(t)
    with Reads():
        bias = ctx.score_mod(torch.zeros(t, t), 0, torch.arange(H)[:, None, None], i[:, None], i[None, :])
    n = 64 if t == T else 256  # max(pos) + 1 rounded up to a power of two
    assert read == [(H, 2 * n - 1)]
    assert torch.equal(bias, scheme.bias(pos))  # the same cells of the table, bitwise


def test_what_flex_cannot_run_keeps_the_float_mask():
    """A 0-dim learned tensor in score_mod, or a head dim below 16, breaks FlexAttention: such a
    scheme is not sent there."""

    class ScalarBias(Scheme):
        name, family, hooks = "scalar-bias", "bias", ("bias",)

        def __init__(self, dims):
            super().__init__(dims)
            self.c = nn.Parameter(torch.tensor(0.5))

        def bias_fn(self, h, qpos, kpos):
            return -self.c * (qpos - kpos)

    scheme = ScalarBias(Dims(H * D, H, 1, 50, T, T))
    assert not attention.flex_supports(scheme)
    assert attention.choose_backend(scheme, "cuda") == "sdpa-bias"
    assert attention.flex_supports(SCHEMES["alibi"](Dims(H * D, H, 1, 50, T, T)))
    assert not attention.flex_supports(SCHEMES["alibi"](Dims(H * 8, H, 1, 50, T, T)))  # head dim 8


def cpu_compiler() -> bool:
    return any(shutil.which(c) for c in ("g++", "c++", "clang++"))


@pytest.mark.slow
@needs_flex
@pytest.mark.skipif(not cpu_compiler(), reason="compiled FlexAttention on CPU needs a C++ compiler")
@pytest.mark.parametrize("name", ["alibi", "t5"])
def test_compiled_flex_cpu_forward_equals_explicit_without_recompiling(name):
    """The kernel the flex path runs (compiled once), on CPU where it is inference-only; a second
    forward at the same length, with a new score_mod closure and new positions, reuses it.
    Head dim 32: torch 2.13's CPU kernel with a BlockMask returns garbage at head dims 8 and 16
    for some lengths (e.g. 24, 40), a case posbench never sends there (flex is CUDA-only)."""
    scheme = scheme_with_random_parameters(name)
    compiled = attention._compiled_flex()
    with torch.no_grad():
        out, ref = flex_and_explicit(scheme, compiled, torch.arange(T), head_dim=32)
        assert torch.allclose(out, ref, atol=1e-5), (out - ref).abs().max()
        with torch._dynamo.config.patch(error_on_recompile=True):
            out, ref = flex_and_explicit(scheme, compiled, torch.arange(T) + 7, head_dim=32)
        assert torch.allclose(out, ref, atol=1e-5), (out - ref).abs().max()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", FLEX)
def test_flex_on_cuda_agrees_with_explicit_forward_and_gradients(name):
    """The compiled FlexAttention kernel with a causal BlockMask, gradients into captured tables
    included (atomic adds: equal to tolerance, not bitwise)."""
    import copy

    from posbench.model import ModelConfig, Transformer

    torch.manual_seed(1)
    dims = Dims(d_model=H * D, n_heads=H, n_layers=2, vocab_size=50, train_len=64, max_position=256)
    fast = Transformer(ModelConfig(50, H * D, 2, H), layout.build(name, dims)).cuda().train()
    assert attention.choose_backend(fast.layout.schemes[0], "cuda") == "flex"
    slow = copy.deepcopy(fast)
    slow.backend = "explicit"
    with torch.no_grad():
        for p in fast.layout.schemes[0].parameters():
            p.add_(torch.randn_like(p) * 0.3)
        slow.layout.schemes[0].load_state_dict(fast.layout.schemes[0].state_dict())
    for t in (64, 200):  # 200: not a multiple of the 128 block
        x = torch.randint(0, 50, (2, t), device="cuda")
        la = fast.token_losses(x, x).mean()
        lb = slow.token_losses(x, x).mean()
        fast.zero_grad()
        slow.zero_grad()
        la.backward()
        lb.backward()
        assert torch.allclose(la, lb, atol=1e-4)
        for (n, pa), (_, pb) in zip(fast.named_parameters(), slow.named_parameters()):
            assert (pa.grad is None) == (pb.grad is None), n
            if pa.grad is not None:
                assert torch.allclose(pa.grad, pb.grad, atol=1e-4, rtol=1e-3), n


@pytest.mark.slow
@needs_flex
@pytest.mark.parametrize("name", FLEX + ["rope+sink", "alibi+sink", "rope@w"])
def test_flex_backward_graphs_pass_cuda_compiler_check_and_gradients_agree(name):
    """What the CUDA test above needs a GPU for, on CPU: the model on the flex path, compiled
    as on CUDA up to the kernel generation, its FlexAttention backward graphs checked as CUDA's
    compiler checks them (kerple, fire and fox once failed there: a learned tensor indexed twice
    in their score_mods), and its loss and gradients against the explicit path."""
    import copy

    from posbench.conformance import checked_flex
    from posbench.model import ModelConfig, Transformer

    checked: list = []
    torch.manual_seed(1)
    dims = Dims(d_model=H * D, n_heads=H, n_layers=2, vocab_size=50, train_len=64, max_position=256)
    fast = Transformer(ModelConfig(50, H * D, 2, H), layout.build(name, dims)).train()
    slow = copy.deepcopy(fast)
    fast.backend, slow.backend = "flex", "explicit"
    with torch.no_grad():
        for p in fast.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    slow.load_state_dict(fast.state_dict())
    x = torch.randint(0, 50, (2, 40))
    with checked_flex(checked), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        la = fast.token_losses(x, x).mean()
        la.backward()
    lb = slow.token_losses(x, x).mean()
    lb.backward()
    assert checked, "no FlexAttention backward graph was traced"
    assert torch.allclose(la, lb, atol=1e-5), (la, lb)
    for (n, pa), (_, pb) in zip(fast.named_parameters(), slow.named_parameters()):
        assert (pa.grad is None) == (pb.grad is None), n
        if pa.grad is not None:
            assert torch.allclose(pa.grad, pb.grad, atol=1e-5, rtol=1e-4), (n, (pa.grad - pb.grad).abs().max())


def test_float_mask_built_once_per_forward(monkeypatch):
    """The sdpa-bias path materializes the bias once per forward, not once per layer."""
    model = tiny_model("alibi")
    calls = []
    original = type(model.layout.schemes[0]).bias

    def counting(self, pos, ctx=None):
        calls.append(pos.shape[0])
        return original(self, pos, ctx)

    monkeypatch.setattr(type(model.layout.schemes[0]), "bias", counting)
    with torch.no_grad():
        model(torch.randint(0, 50, (2, 16)))
    assert len(model.blocks) > 1 and calls == [16]
