"""Properties every registered scheme must have; a new scheme is tested here automatically."""

import copy

import pytest
import torch

from conftest import tiny_model
from posbench import attention, layout
from posbench.catalogue import catalogue
from posbench.schemes import SCHEMES

# The registry and the layout presets, plus a spec that mixes a bias scheme with spans, the
# modifiers (posbench.modifiers) on a scheme, on a bias with a span, and on a preset, and a scheme
# with the heads hook (2H attention heads) beside a plain layer, with a sink and a temperature.
ALL = sorted(SCHEMES) + list(layout.PRESETS) + ["alibi@c4/t5@w3+ssmax", "rope+sink", "none+gate",
                                                 "alibi@w5+sink+gate:elementwise=true", "rnope-swa+gate",
                                                 "rope-pp:variant=ec+sink+ssmax/none"]
RELATIVE = [n for n in ALL if layout.relative(layout.parse(n))]
T = 16
# At init the attention branch is small (weights std 0.02), so a scheme acting on the logits
# (fire, tupe) moves the outputs by ~1e-5 under a shift, while float noise in relative schemes
# stays below ~1e-7: one tolerance between the two serves both shift tests.
SHIFT_ATOL = 1e-6


@pytest.mark.parametrize("name", ALL)
def test_causal(name):
    """Changing token t changes no output before t."""
    model = tiny_model(name)
    x = torch.randint(0, 50, (2, T))
    t = 9
    y = x.clone()
    y[:, t] = (y[:, t] + 1) % 50
    with torch.no_grad():
        a, b = model(x), model(y)
    assert torch.allclose(a[:, :t], b[:, :t], atol=1e-5)
    assert not torch.allclose(a[:, t:], b[:, t:], atol=1e-5)


@pytest.mark.parametrize("name", RELATIVE)
def test_translation_invariant(name):
    """Shifting every position by a constant leaves the outputs unchanged."""
    model = tiny_model(name)
    x = torch.randint(0, 50, (2, T))
    pos = torch.arange(T)
    with torch.no_grad():
        a = model(x, pos)
        b = model(x, pos + 5)
    assert torch.allclose(a, b, atol=SHIFT_ATOL), (a - b).abs().max()


@pytest.mark.parametrize("name", [n for n in SCHEMES if not SCHEMES[n].relative and SCHEMES[n].takes_positions])
def test_absolute_schemes_see_positions(name):
    """The converse, so the test above could fail: absolute schemes change under a shift."""
    model = tiny_model(name, train_len=32)
    x = torch.randint(0, 50, (2, T))
    with torch.no_grad():
        a, b = model(x, torch.arange(T)), model(x, torch.arange(T) + 5)
    assert not torch.allclose(a, b, atol=SHIFT_ATOL)


def reads_positions(name: str) -> bool:
    """Some layer of the spec reads integer positions."""
    return any(SCHEMES[lay.scheme].takes_positions for lay in layout.parse(name).pattern)


@pytest.mark.parametrize("name", ALL)
def test_runs_at_8x_training_length(name):
    """A window of 8x the training length runs to finite outputs (or is refused past a declared
    limit); and the same T tokens placed at the end of it (positions 7T..8T-1) give the outputs
    they give at 0..T-1 for relative schemes, other outputs for schemes that read positions."""
    model = tiny_model(name)
    limit = model.layout.schemes[0].position_limit()
    x = torch.randint(0, 50, (1, 8 * T))
    if limit is not None and limit < 8 * T:
        with pytest.raises(Exception, match="beyond"):
            model(x)
        return
    with torch.no_grad():
        out = model(x)
        near, far = model(x[:, :T], torch.arange(T)), model(x[:, :T], torch.arange(T) + 7 * T)
    assert torch.isfinite(out).all()
    assert torch.equal(out[:, :T], near) or torch.allclose(out[:, :T], near, atol=1e-6)
    if layout.relative(layout.parse(name)):
        assert torch.allclose(near, far, atol=SHIFT_ATOL), (near - far).abs().max()
    elif reads_positions(name):
        assert not torch.allclose(near, far, atol=SHIFT_ATOL)


@pytest.mark.parametrize("name", ALL)
def test_cache_grown_then_used_short_equals_fresh(name):
    model = tiny_model(name, train_len=64)
    fresh = copy.deepcopy(model)
    x = torch.randint(0, 50, (1, 2 * T))
    with torch.no_grad():
        model(x)  # grows any per-length table to 2T
        a = model(x[:, :T])
        b = fresh(x[:, :T])
    assert torch.equal(a, b)


@pytest.mark.parametrize("shift", [0, 5])
@pytest.mark.parametrize("name", ALL)
def test_backends_agree_with_explicit_math(name, shift):
    """The fast path equals the explicit path, in outputs and in gradients (the same parameters
    get one), with positions given explicitly, at a length that is not a power of two."""
    torch.manual_seed(1)
    fast = tiny_model(name, train_len=32).train()
    slow = copy.deepcopy(fast)
    slow.backend = "explicit"
    x = torch.randint(0, 50, (2, T + 3))
    pos = torch.arange(T + 3) + shift
    la = fast.token_losses(x, x, pos).mean()
    lb = slow.token_losses(x, x, pos).mean()
    la.backward()
    lb.backward()
    assert torch.allclose(la, lb, atol=1e-5)
    for (n, pa), (_, pb) in zip(fast.named_parameters(), slow.named_parameters()):
        assert (pa.grad is None) == (pb.grad is None), n
        if pa.grad is not None:
            assert torch.allclose(pa.grad, pb.grad, atol=1e-5, rtol=1e-4), n


@pytest.mark.parametrize("name", ALL)
def test_backends_agree_in_bfloat16(name):
    """Under bf16 autocast, as training runs: the float mask cast to the query's dtype keeps
    its -inf, and the fast path stays within bf16 rounding of the explicit one."""
    fast = tiny_model(name)
    slow = copy.deepcopy(fast)
    slow.backend = "explicit"
    x = torch.randint(0, 50, (2, T))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        a, b = fast.token_losses(x, x), slow.token_losses(x, x)
    assert torch.isfinite(a).all()
    assert torch.allclose(a, b, atol=0.05, rtol=0.02), (a - b).abs().max()


@pytest.mark.parametrize("name", [n for n in SCHEMES if SCHEMES[n].takes_positions])
def test_randomized_positions(name):
    """Sorted positions far beyond the window (Ruoss et al.) are accepted within the table."""
    from posbench.schemes import Dims
    from posbench.model import ModelConfig, Transformer

    dims = Dims(d_model=32, n_heads=4, n_layers=2, vocab_size=50, train_len=T, max_position=512)
    model = Transformer(ModelConfig(50, 32, 2, 4), layout.build(name, dims))
    pos = torch.randperm(512)[:T].sort().values
    out = model(torch.randint(0, 50, (2, T)), pos)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("name", ALL)
def test_catalogue_fields(name):
    row = next((r for r in catalogue() if r["name"] == name), None)
    assert row is not None or layout.is_spec(name)
    if row is not None:
        assert row["family"] and row["reference"] and row["extrapolates"] in ("yes", "no", "extension")
    for backend in tiny_model(name).layout.backends("cpu").split("+"):
        assert backend in attention.BACKENDS
