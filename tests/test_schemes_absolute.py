"""Reference tests of the input schemes recurrent (FLOATER), multiplicative and complex."""

import math

import pytest
import torch
from torch import nn

from conftest import tiny_model
from posbench.catalogue import catalogue
from posbench.errors import PosbenchError
from posbench.schemes import SCHEMES, Dims
from posbench.schemes.absolute import lawson_rk4, rk4
from posbench.schemes.tables import sinusoid

D = 8


def dims(**params) -> Dims:
    return Dims(d_model=D, n_heads=2, n_layers=1, vocab_size=11, train_len=16, max_position=16,
                params=params)


def sinusoid_closed_form(n: int, dim: int) -> torch.Tensor:
    """Vaswani et al., written out: column 2i sin(k w_i), 2i+1 cos(k w_i), w_i = 10000^(-2i/dim)."""
    out = torch.empty(n, dim, dtype=torch.float64)
    for k in range(n):
        for i in range(dim // 2):
            w = 10000 ** (-2 * i / dim)
            out[k, 2 * i], out[k, 2 * i + 1] = math.sin(k * w), math.cos(k * w)
    return out


class Rotation(nn.Module):
    """dp/dt = A p with A block-diagonal [[0, w], [-w, 0]]: (sin wt, cos wt) solves it."""

    def __init__(self, dim: int):
        super().__init__()
        w = 10000 ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
        a = torch.zeros(dim, dim, dtype=torch.float64)
        a[0::2, 1::2] = torch.diag(w)
        a[1::2, 0::2] = -torch.diag(w)
        self.register_buffer("a", a)

    def forward(self, p, t):
        return self.a.to(p.dtype) @ p


# --- recurrent (FLOATER) -----------------------------------------------------------------------

def test_rk4_solves_the_sinusoidal_ode_with_fourth_order_error():
    n, closed = 40, sinusoid_closed_form(40, D)
    p0 = closed[0].clone()
    errors = [(rk4(Rotation(D), p0, n, 1.0, s) - closed).abs().max().item() for s in (4, 8)]
    assert errors[1] < 2e-4
    assert 12 < errors[0] / errors[1] < 20  # halving the step divides the error by 2^4


def test_recurrent_table_with_forced_dynamics_is_the_sinusoidal_table():
    scheme = SCHEMES["recurrent"](dims(substeps=16, solver="rk4")).eval()
    scheme.dynamics = Rotation(D)
    with torch.no_grad():
        scheme.p0.copy_(sinusoid_closed_form(1, D)[0])
        table = scheme.positions(torch.arange(64))
    assert torch.allclose(table.double(), sinusoid_closed_form(64, D), atol=1e-4)


def test_recurrent_starts_at_the_sinusoidal_table_at_its_defaults():
    """At initialization, with the default parameters, the table is the sinusoidal one at every
    position up to 8x the training length (plain RK4 with one substep damps pair 0 to 0.68 by
    k = 63), and its norm stays bounded far past that."""
    train_len, d = 64, 32
    scheme = SCHEMES["recurrent"](Dims(d_model=d, n_heads=4, n_layers=1, vocab_size=11,
                                       train_len=train_len, max_position=train_len)).eval()
    with torch.no_grad():
        table = scheme.positions(torch.arange(8 * train_len))
    assert torch.allclose(table, sinusoid(8 * train_len, d, 10000.0), atol=1e-4, rtol=0)
    with torch.no_grad():
        norms = scheme.positions(torch.arange(16 * train_len)).norm(dim=-1)
    assert norms.max() < 1.001 * math.sqrt(d / 2)  # sinusoid rows have norm sqrt(d/2)


@pytest.mark.slow
def test_lawson_and_plain_rk4_solve_the_same_ode_with_fourth_order_error():
    """With a non-zero MLP and frequencies up to 2, both solvers converge to one solution, and
    halving the step divides Lawson's error by about 2^4."""
    torch.manual_seed(0)
    scheme = SCHEMES["recurrent"](dims(hidden=16)).double()
    dyn = scheme.dynamics
    with torch.no_grad():
        dyn.out.weight.normal_(std=0.3)
        dyn.out.bias.normal_(std=0.3)
        dyn.frequency.copy_(torch.tensor([2.0, 0.7, 0.1, 0.01]))
        p0, n = scheme.p0.detach(), 12
        fine = rk4(dyn, p0, n, 1.0, 256)
        errors = [(lawson_rk4(dyn, p0, n, 1.0, s) - fine).abs().max().item() for s in (4, 8)]
        plain = (rk4(dyn, p0, n, 1.0, 8) - fine).abs().max().item()
    assert errors[1] < 1e-4 and plain < 1e-3
    assert 10 < errors[0] / errors[1] < 24


def test_recurrent_refuses_an_unknown_solver():
    with pytest.raises(PosbenchError, match="solver"):
        SCHEMES["recurrent"](dims(solver="euler"))


def test_recurrent_constant_dynamics_integrate_exactly():
    """With the rotation off and h_theta's output layer forced to a constant c,
    p_k = p_0 + c k delta."""
    scheme = SCHEMES["recurrent"](dims(delta=0.5)).eval()
    c = torch.linspace(-1, 1, D)
    with torch.no_grad():
        scheme.dynamics.frequency.zero_()
        scheme.dynamics.out.weight.zero_()
        scheme.dynamics.out.bias.copy_(c)
        table = scheme.positions(torch.arange(20))
    expected = scheme.p0.detach() + c * 0.5 * torch.arange(20.0)[:, None]
    assert torch.allclose(table, expected, atol=1e-5)


def test_recurrent_rows_do_not_depend_on_how_many_are_built():
    scheme = SCHEMES["recurrent"](dims())
    with torch.no_grad():
        long, short = scheme.integrate(48), scheme.integrate(16)
    assert torch.equal(long[:16], short)


def test_recurrent_gradient_path_equals_cached_path_and_reaches_every_parameter():
    scheme = SCHEMES["recurrent"](dims()).train()
    with torch.no_grad():  # as after a first optimizer step: out at zero blocks inp's gradient
        scheme.dynamics.out.weight.normal_(std=0.1)
    pos = torch.tensor([0, 3, 4, 9, 15])
    with_grad = scheme.positions(pos)
    with_grad.square().sum().backward()
    for name, p in scheme.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    with torch.no_grad():
        cached = scheme.eval().positions(pos)
    assert torch.equal(with_grad.detach(), cached)


def test_recurrent_cache_is_rebuilt_when_a_parameter_changes():
    scheme = SCHEMES["recurrent"](dims()).eval()
    pos = torch.arange(10)
    with torch.no_grad():
        before = scheme.positions(pos)
        scheme.dynamics.frequency.mul_(2)  # what an optimizer step or load_state_dict does
        after = scheme.positions(pos)
        fresh = scheme.integrate(10)
    assert not torch.allclose(before, after)
    assert torch.equal(after, fresh)


# --- multiplicative ----------------------------------------------------------------------------

@pytest.mark.parametrize("offset", [1.0, 0.0])
def test_multiplicative_scales_each_embedding_by_the_sinusoid(offset):
    scheme = SCHEMES["multiplicative"](dims(offset=offset))
    x = torch.randn(2, 12, D)
    pos = torch.arange(12) + 3
    out = scheme.embed(x, None, pos)
    expected = x.double() * (offset + sinusoid_closed_form(15, D)[pos])
    assert torch.allclose(out.double(), expected, atol=1e-6)


def test_multiplicative_plain_sinusoid_zeroes_the_sine_columns_at_position_zero():
    scheme = SCHEMES["multiplicative"](dims(offset=0.0))
    out = scheme.embed(torch.ones(1, 1, D), None, torch.tensor([0]))
    assert torch.equal(out[0, 0, 0::2], torch.zeros(D // 2))
    assert torch.equal(out[0, 0, 1::2], torch.ones(D // 2))


# --- complex order -----------------------------------------------------------------------------

def test_complex_embedding_is_the_complex_exponential_of_each_token():
    scheme = SCHEMES["complex"](dims())
    idx = torch.randint(0, 11, (3, 9))
    pos = torch.arange(9) * 7 + 2
    out = scheme.embed(None, idx, pos)
    r = scheme.amplitude[idx].double()
    w, theta = scheme.frequency[idx].double(), scheme.phase[idx].double()
    z = r * torch.exp(1j * (w * pos[:, None] + theta))  # r e^{i(w k + theta)}, (B, T, d/2)
    assert torch.allclose(out.double(), torch.cat([z.real, z.imag], -1), atol=1e-4)


def test_complex_shift_rotates_each_dimension_by_its_token_frequency():
    """Complex Order's defining property: e(j, k + s) = e(j, k) * exp(i w_j s)."""
    scheme = SCHEMES["complex"](dims())
    with torch.no_grad():
        scheme.frequency.uniform_(0, 1)  # token-specific frequencies
    idx = torch.tensor([[4, 7]])
    s = 5

    def as_complex(e):
        return torch.complex(e[..., : D // 2], e[..., D // 2:]).to(torch.complex128)

    a = as_complex(scheme.embed(None, idx, torch.tensor([2, 3])))
    b = as_complex(scheme.embed(None, idx, torch.tensor([2, 3]) + s))
    rotation = torch.exp(1j * scheme.frequency[idx].double() * s)
    assert torch.allclose(b, a * rotation, atol=1e-5)


def test_complex_owns_the_token_embedding():
    model = tiny_model("complex")
    assert model.tok is None
    assert torch.isfinite(model(torch.randint(0, 50, (2, 8)))).all()


def test_catalogue_states_the_choices():
    notes = {row["name"]: row["notes"] for row in catalogue()}
    assert "complex-valued layers are out of scope" in notes["complex"]
    assert "offset" in notes["multiplicative"]
    assert "once" in notes["conv"]
    assert "RK4" in notes["recurrent"] and "solver=lawson, default" in notes["recurrent"]
    assert "p2c=paper (default" in notes["deberta"] and "model width (default), head" in notes["sandwich"]
