"""The `fla` path (posbench.fla_path): flash-linear-attention's kernels for stick-breaking, FoX
and PaTH, against posbench's explicit path. On CPU, fla's own PyTorch references (its naive.py
files, loaded alone: the package itself imports Triton) take the kernels' place, which checks the
argument layouts and gate conventions; on CUDA the kernels themselves, outputs and gradients.
Both skip where the `fla` extra is not installed."""

import importlib.util
from pathlib import Path

import pytest
import torch

from posbench import attention, fla_path
from posbench.schemes import SCHEMES, Dims

B, H, T, D = 2, 2, 70, 16  # T: one chunk of 64 and part of another
NAMES = list(fla_path.SCHEMES)


def fla_references():
    """fla's naive references by operation, or a skip where fla is not installed."""
    spec = importlib.util.find_spec("fla")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("flash-linear-attention is not installed (the fla extra)")
    ops = Path(list(spec.submodule_search_locations)[0]) / "ops"

    def load(folder, name):
        path = ops / folder / "naive.py"
        module_spec = importlib.util.spec_from_file_location(f"fla_naive_{folder}", path)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        return getattr(module, name)

    return {"stickbreaking": load("stickbreaking_attn", "naive_stickbreaking_attn"),
            "forgetting": load("forgetting_attn", "naive_forgetting_attn"),
            "path": load("path_attn", "naive_path_attn")}


def layer_inputs(name, device="cpu", seed=0):
    """A scheme of 2 heads of 16, and one layer's q, k, v (B, H, T, D) and what its gate and
    content hooks read of a random input, every tensor needing gradients."""
    torch.manual_seed(seed)
    scheme = SCHEMES[name](Dims(d_model=H * D, n_heads=H, n_layers=1, vocab_size=50, train_len=T,
                                max_position=T)).to(device)
    with torch.no_grad():
        for p in scheme.parameters():
            p.add_(torch.randn_like(p) * 0.3)  # away from init, where beta = 1 and gates are equal
    x = torch.randn(B, T, H * D, device=device)
    q, k, v = (torch.randn(B, H, T, D, device=device, requires_grad=True) for _ in range(3))
    return scheme, x, (q, k, v)


def both_paths(name, ops, device="cpu"):
    """(explicit, fla) outputs and the gradients of a fixed projection of each with respect to
    q, k, v and the scheme's parameters."""
    scheme, x, (q, k, v) = layer_inputs(name, device)
    pos = torch.arange(T, device=device)
    ctx = attention.prepare(scheme, pos, "explicit")
    weights = torch.randn(B, H, T, D, device=device, generator=None)
    params = [q, k, v, *[p for p in scheme.parameters() if p.requires_grad]]
    results = []
    for path in ("explicit", "fla"):
        gate = scheme.gate(x, 0) if "gate" in scheme.hooks else None
        content = scheme.content(x, 0) if "content" in scheme.hooks else None
        if path == "explicit":
            out = attention.explicit_attention(q, k, v, scheme, ctx, 0, gate, content)
        else:
            out = fla_path.attend(q, k, v, scheme, gate, content, ops=ops)
        grads = torch.autograd.grad((out * weights).sum(), params, allow_unused=True)
        results.append((out.detach(), [None if g is None else g.detach() for g in grads]))
    return results


@pytest.mark.parametrize("name", NAMES)
def test_fla_references_equal_the_explicit_path(name):
    """Outputs within 1e-5 and gradients within 1e-4 (float32: both sum in another order)."""
    (out, grads), (fla_out, fla_grads) = both_paths(name, fla_references())
    assert torch.allclose(fla_out, out, atol=1e-5, rtol=1e-4), (fla_out - out).abs().max()
    for g, fla_g in zip(grads, fla_grads):
        if g is None:
            assert fla_g is None or not fla_g.any()
        else:
            assert torch.allclose(fla_g, g, atol=1e-4, rtol=1e-3), (fla_g - g).abs().max()


def test_the_fla_path_is_chosen_on_cuda_only_and_for_full_spans_without_a_sink(monkeypatch):
    monkeypatch.setattr(fla_path, "available", lambda: True)
    dims = Dims(d_model=H * D, n_heads=H, n_layers=1, vocab_size=50, train_len=T, max_position=T)
    window = attention.Span("window", 8)
    for name in NAMES:
        scheme = SCHEMES[name](dims)
        assert attention.choose_backend(scheme, "cuda") == "fla"
        assert attention.choose_backend(scheme, "cpu") != "fla"
        assert attention.choose_backend(scheme, "cuda", window) != "fla"
        assert attention.choose_backend(scheme, "cuda", sink=True) != "fla"
    assert attention.choose_backend(SCHEMES["alibi"](dims), "cuda") != "fla"
    monkeypatch.setattr(fla_path, "available", lambda: False)
    assert attention.choose_backend(SCHEMES["fox"](dims), "cuda") != "fla"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the fla kernels run on CUDA")
@pytest.mark.parametrize("name", NAMES)
def test_cuda_fla_kernels_equal_the_explicit_path(name):
    """fla's Triton kernels against the explicit path, float32 inputs: outputs within 2e-3 and
    gradients within 1e-2 (the kernels compute in blocks, with TF32 dot products where Triton
    takes them)."""
    if not fla_path.available():
        pytest.skip("flash-linear-attention is not installed (the fla extra)")
    (out, grads), (fla_out, fla_grads) = both_paths(name, fla_path.kernels(), device="cuda")
    assert torch.allclose(fla_out, out, atol=2e-3, rtol=2e-3), (fla_out - out).abs().max()
    for g, fla_g in zip(grads, fla_grads):
        if g is not None:
            assert torch.allclose(fla_g, g, atol=1e-2, rtol=1e-2), (fla_g - g).abs().max()


@pytest.mark.parametrize("name", ["path", "path-fox"])
def test_paths_vectors_strengths_and_gate_reach_the_kernel_in_float32(name):
    """fla's PaTH kernel refuses w, beta and g in any dtype but float32 (bfloat16 training on CUDA
    would fall back to eager, then fail): they go in float32 whatever q, k and v are."""
    scheme, x, (q, k, v) = layer_inputs(name)
    seen = {}

    def path(qt, kt, vt, w, beta, g, scale):
        seen.update(q=qt.dtype, w=w.dtype, beta=beta.dtype, g=g.dtype)
        return torch.zeros_like(vt), None

    gate = scheme.gate(x, 0) if "gate" in scheme.hooks else None
    q, k, v = (t.detach().bfloat16() for t in (q, k, v))
    out = fla_path.attend(q, k, v, scheme, gate, scheme.content(x, 0), ops={"path": path})
    assert seen == {"q": torch.bfloat16, "w": torch.float32, "beta": torch.float32, "g": torch.float32}
    assert out.dtype == torch.bfloat16 and out.shape == v.shape
