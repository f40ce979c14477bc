"""Absolute schemes: a vector per position, combined with the token embeddings once, before the
first block (posbench/docs/schemes.md: none, learned, sinusoidal, recurrent,
multiplicative, complex)."""

from __future__ import annotations

import math

import torch
from torch import nn

from posbench.errors import PosbenchError
from posbench.schemes.base import MAX_SIZE, Scheme, at_least, below, between, frequency_base, one_of, positive, size
from posbench.schemes.registry import register
from posbench.schemes.tables import GrowingTable, position_count, sinusoid, sinusoid_at


def hierarchical_table(p: torch.Tensor, alpha: float) -> torch.Tensor:
    """(n, d) trained table -> (n^2, d) (Su 2020): row (i-1)n + j - 1 is a u_i + (1 - a) u_j with
    u_i = (p_i - a p_1) / (1 - a), 1-based; rows 0..n-1 equal p exactly."""
    n = p.shape[0]
    u = (p - alpha * p[:1]) / (1 - alpha)  # (n, d)
    return (alpha * u[:, None, :] + (1 - alpha) * u[None, :, :]).reshape(n * n, -1)


@register
class NoPE(Scheme):
    """No positional information at all; a causal decoder still infers order from its mask
    (Haviv et al. 2022; Kazemnejad et al. 2023). The baseline of every comparison."""

    name = "none"
    formula = "s_ij = q_i.k_j / sqrt(D); order reaches the model only through the causal mask"
    family = "none"
    relative = True
    takes_positions = False
    reference = "Kazemnejad et al. 2023, arXiv:2305.19466"


@register
class Learned(Scheme):
    """A trainable table P (max_len, d): h_k = x_k + P_k (Gehring et al. 2017; BERT; GPT-2).

    No row exists past max_len. At evaluation the `hierarchical` extension (Su 2020,
    kexue.fm/archives/7947) builds, from the trained p_1..p_n (1-based),
    u_i = (p_i - a p_1) / (1 - a) and q_{(i-1)n+j} = a u_i + (1 - a) u_j, reaching n^2 positions
    and reproducing p_k exactly for k <= n.
    """

    name = "learned"
    formula = "h_k = x_k + P_k, P a trained table (max_len, d)"
    family = "absolute"
    hooks = ("input",)
    reference = "Gehring et al. 2017, arXiv:1705.03122"
    extrapolates = "extension"
    notes = "beyond max_len: unsupported, or --learned-extension hierarchical"
    extensions = ("hierarchical",)
    defaults = {"max_len": 0, "alpha": 0.4}  # max_len 0: the largest training position
    ranges = {"max_len": between(0, MAX_SIZE), "alpha": at_least(0) & below(1)}  # alpha 1 divides by 0

    def __init__(self, dims):
        super().__init__(dims)
        self.n = self.p["max_len"] or dims.max_position
        self.table = nn.Parameter(torch.randn(self.n, dims.d_model) * 0.5)

    def position_limit(self):
        return self.n**2 if self.extension == "hierarchical" else self.n

    def embed(self, x, idx, pos):
        table = self.table
        if self.extension == "hierarchical":
            table = hierarchical_table(table, self.p["alpha"])
        return x + table[pos]


@register
class Sinusoidal(Scheme):
    """Fixed sinusoids added to the embeddings (Vaswani et al. 2017):
    p_{k,2i} = sin(k / 10000^(2i/d)), p_{k,2i+1} = cos(k / 10000^(2i/d))."""

    name = "sinusoidal"
    float_positions = True
    formula = "h_k = x_k + p_k, p_{k,2i} = sin(k / base^(2i/d)), p_{k,2i+1} = cos(k / base^(2i/d))"
    family = "absolute"
    hooks = ("input",)
    reference = "Vaswani et al. 2017, arXiv:1706.03762"
    extrapolates = "no"
    notes = "defined at every position; known to fail past the training length"
    defaults = {"base": 10000.0}
    ranges = {"base": frequency_base}

    def __init__(self, dims):
        super().__init__(dims)
        self.table = GrowingTable(lambda n, dev: sinusoid(n, dims.d_model, self.p["base"], dev),
                                  lambda pos: sinusoid_at(pos, dims.d_model, self.p["base"]))

    def embed(self, x, idx, pos):
        return x + self.table(pos, self.position_bound).to(x.dtype)


def rk4(h, p0: torch.Tensor, n: int, delta: float, substeps: int = 1) -> torch.Tensor:
    """(n, d) solution of dp/dt = h(p, t), p(0) = p0 (d,), at t = k * delta for k < n, by
    classical fourth-order Runge-Kutta with `substeps` fixed steps per delta. Row k depends only
    on the k * substeps steps before it, never on n."""
    step = delta / substeps
    rows, p = [p0], p0
    for k in range(n - 1):
        for s in range(substeps):
            t = (k * substeps + s) * step
            k1 = h(p, t)
            k2 = h(p + step / 2 * k1, t + step / 2)
            k3 = h(p + step / 2 * k2, t + step / 2)
            k4 = h(p + step * k3, t + step)
            p = p + step / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
        rows.append(p)
    return torch.stack(rows)


def lawson_rk4(dynamics: Dynamics, p0: torch.Tensor, n: int, delta: float, substeps: int = 1) -> torch.Tensor:
    """As `rk4` for dp/dt = A p + g(p, t), but integrating the linear part exactly: RK4 in the
    frame that turns with A (Lawson 1967, "integrating factor" RK4). With E(s) = exp(A s), a
    rotation, and step h:

        a = E(h/2)(p + h/2 k1),  b = E(h/2) p + h/2 k2,  c = E(h) p + h E(h/2) k3,
        p' = E(h) p + h/6 (E(h) k1 + 2 E(h/2)(k2 + k3) + k4),

    k1..k4 = g at (p, t), (a, t + h/2), (b, t + h/2), (c, t + h). Where g = 0 every step is the
    exact rotation, at any step size; plain RK4 damps a pair of frequency w by
    |1 - (wh)^2/2 + (wh)^4/24 + i(wh - (wh)^3/6)| < 1 per step (0.994 at wh = 1)."""
    step = delta / substeps

    def half(x: torch.Tensor) -> torch.Tensor:  # E(h/2) x
        return dynamics.rotate(x, step / 2)

    rows, p = [p0], p0
    for k in range(n - 1):
        for s in range(substeps):
            t = (k * substeps + s) * step
            k1 = dynamics.drift(p, t)
            k2 = dynamics.drift(half(p + step / 2 * k1), t + step / 2)
            k3 = dynamics.drift(half(p) + step / 2 * k2, t + step / 2)
            k4 = dynamics.drift(half(half(p) + step * k3), t + step)
            p = half(half(p + step / 6 * k1) + step / 3 * (k2 + k3)) + step / 6 * k4
        rows.append(p)
    return torch.stack(rows)


class Dynamics(nn.Module):
    """h_theta(p, t) = A p + g(p, t) for p (d,), d even.

    A is block-diagonal with 2x2 blocks [[0, w_i], [-w_i, 0]], the frequencies w_i learned and
    initialized to the sinusoidal ones (base^(-2i/d)): with g = 0 and p(0) = (0, 1, 0, 1, ...)
    the solution is the sinusoidal table, the "particular solution" FLOATER contains. g is the
    free-form part: [p, t] (d + 1) -> tanh hidden layer -> (d,), its output layer initialized
    to zero so training starts from the sinusoids and learns the correction. (A tanh MLP
    alone, randomly initialized, has a non-zero mean drift: |p_k| then grows linearly in k and
    drowns the token embeddings within the training length.)
    """

    def __init__(self, dim: int, hidden: int, base: float):
        super().__init__()
        self.frequency = nn.Parameter(base ** (-torch.arange(0, dim, 2, dtype=torch.float32) / dim))
        self.inp = nn.Linear(dim + 1, hidden)
        self.out = nn.Linear(hidden, dim)
        nn.init.zeros_(self.out.weight)  # g = 0 at the start; inp learns once out has moved
        nn.init.zeros_(self.out.bias)

    def drift(self, p: torch.Tensor, t: float) -> torch.Tensor:
        """g(p, t), (d,)."""
        pt = torch.cat([p, p.new_full((1,), t)])
        return self.out(torch.tanh(self.inp(pt)))

    def rotate(self, p: torch.Tensor, time: float) -> torch.Tensor:
        """exp(A time) p: each (sin, cos) pair advanced by the angle w_i * time."""
        sin, cos = p[0::2], p[1::2]
        angle = self.frequency * time
        c, s = angle.cos(), angle.sin()
        return torch.stack([sin * c + cos * s, cos * c - sin * s], dim=-1).flatten()

    def forward(self, p: torch.Tensor, t: float) -> torch.Tensor:
        sin, cos = p[0::2], p[1::2]
        rotation = torch.stack([self.frequency * cos, -self.frequency * sin], dim=-1).flatten()
        return rotation + self.drift(p, t)


SOLVERS = {"lawson": lawson_rk4, "rk4": rk4}
MAX_SUBSTEPS = 1024  # RK4 steps per position: the cost of a table grows with them


@register
class Recurrent(Scheme):
    """FLOATER (Liu et al., ICML 2020): positions from a neural ODE, dp/dt = h_theta(p_t, t),
    p(0) learned; p_k = p(k * delta), h_k = x_k + p_k. h_theta (`Dynamics`) is a learned
    block rotation plus a small tanh MLP; it starts as the rotation by the sinusoidal
    frequencies, with p(0) = (0, 1, 0, 1, ...), whose solution at delta = 1 is the sinusoidal
    table (sinusoidal positions are one particular solution of the ODE), and training moves it from there.

    Integrated by fixed-step RK4, so the positions extend to any length and row k does not
    depend on how many rows are built. `solver=lawson` (default, `lawson_rk4`) integrates the
    rotation exactly and the MLP by RK4, so the initial table is the sinusoidal one at every
    position; `solver=rk4` (`rk4`, what a generic ODE solver does) applies RK4 to the whole
    field, which damps the fast pairs at large steps (pair 0 amplitude 0.68 at k = 63 with one
    substep). While gradients flow, the table (max(pos) + 1, d) is integrated afresh in every
    forward; without them it is cached and grown, and rebuilt whenever a parameter has changed
    (its version counter moved).
    """

    name = "recurrent"
    formula = ("h_k = x_k + p(k delta), dp/dt = h_theta(p, t) (a learned rotation plus a tanh MLP), p(0) "
               "learned")
    family = "absolute"
    hooks = ("input",)
    reference = "Liu et al. 2020, arXiv:2003.09229"
    extrapolates = "no"
    notes = (
        "FLOATER ODE, fixed-step RK4 to t = k*delta (solver=lawson, default: the rotation exact, "
        "the MLP by RK4; solver=rk4: RK4 of the whole field), h = learned rotation + tanh MLP, "
        "starting at the sinusoidal solution; added once at the input (the paper also "
        "re-injects positions in every block); sequential: cost grows with the largest position"
    )
    defaults = {"hidden": 32, "delta": 1.0, "substeps": 1, "base": 10000.0, "solver": "lawson"}
    ranges = {"hidden": size, "delta": positive, "substeps": between(1, MAX_SUBSTEPS), "base": frequency_base,
              "solver": one_of(*SOLVERS)}

    def __init__(self, dims):
        super().__init__(dims)
        if dims.d_model % 2:
            raise PosbenchError(f"{self.name} needs an even model width, got {dims.d_model}")
        self.p0 = nn.Parameter(torch.arange(dims.d_model).remainder(2).float())  # (sin 0, cos 0, ...)
        self.dynamics = Dynamics(dims.d_model, self.p["hidden"], self.p["base"])
        self.table = GrowingTable(lambda n, dev: self.integrate(n))
        self._versions: tuple = ()

    def integrate(self, n: int) -> torch.Tensor:
        """(n, d) positions p_0..p_{n-1}, in float32 whatever the autocast."""
        solve = SOLVERS[self.p["solver"]]
        with torch.autocast(self.p0.device.type, enabled=False):
            return solve(self.dynamics, self.p0, n, self.p["delta"], self.p["substeps"])

    def positions(self, pos: torch.Tensor) -> torch.Tensor:
        params = list(self.parameters())
        if torch.is_grad_enabled() and any(p.requires_grad for p in params):
            self.table.clear()
            return self.integrate(position_count(pos, self.position_bound))[pos]
        versions = tuple((p._version, p.data_ptr()) for p in params)
        if versions != self._versions:
            self.table.clear()
            self._versions = versions
        return self.table(pos, self.position_bound)

    def embed(self, x, idx, pos):
        return x + self.positions(pos).to(x.dtype)


@register
class Multiplicative(Scheme):
    """Position multiplied into the embeddings: h_k = x_k * p_k elementwise,
    p_k = offset + s_k, s the sinusoidal table (`sinusoid`: s_{k,2i} = sin(k / base^(2i/d)),
    s_{k,2i+1} = cos(.)). x (B, T, d), p (T, d).

    offset = 1 (default) keeps every factor in [0, 2] and near 1 for the slow columns; offset = 0
    is the plain sinusoid, which zeroes every sine column at k = 0 and nearly zeroes the slow sine
    columns at every small k, erasing those token features.
    """

    name = "multiplicative"
    formula = "h_k = x_k * (offset + s_k) elementwise, s the sinusoidal table"
    family = "absolute"
    hooks = ("input",)
    reference = "Su 2021, kexue.fm/archives/8130"
    extrapolates = "no"
    notes = "h = x * (offset + sinusoid), offset 1 by default (0: plain sinusoid, zeros at k = 0)"
    defaults = {"base": 10000.0, "offset": 1.0}
    ranges = {"base": frequency_base, "offset": between(-100, 100)}  # far past it x swamps the residual stream

    def __init__(self, dims):
        super().__init__(dims)
        self.table = GrowingTable(lambda n, dev: sinusoid(n, dims.d_model, self.p["base"], dev))

    def embed(self, x, idx, pos):
        return x * (self.p["offset"] + self.table(pos, self.position_bound)).to(x.dtype)


@register
class ComplexOrder(Scheme):
    """Complex Order (Wang et al., ICLR 2020): token j has amplitude r_j, frequency w_j and phase
    theta_j (three tables (V, d/2)); at position k its embedding is r_j exp(i(w_j k + theta_j)),
    fed to the real model as [r cos(w k + theta), r sin(w k + theta)] (B, T, d). It builds the
    token embedding itself: the model has no token table.

    Initialization: r ~ N(0, 2) so the embedding has unit variance like the model's token table,
    theta ~ U(0, 2 pi), and every token's w_t = base^(-2t/d) (the sinusoidal frequencies), so
    training starts from a rotary-style rotation of each token vector by its position.
    """

    name = "complex"
    formula = ("token j at position k: [r_j cos(w_j k + theta_j), r_j sin(w_j k + theta_j)], r, w, theta "
               "learned per token")
    family = "absolute"
    hooks = ("input",)
    reference = "Wang et al. 2020, arXiv:1912.12333"
    extrapolates = "no"
    owns_token_embedding = True
    notes = (
        "real and imaginary parts concatenated into the real-valued model; the paper's fully "
        "complex-valued layers are out of scope"
    )
    defaults = {"base": 10000.0}
    ranges = {"base": frequency_base}

    def __init__(self, dims):
        super().__init__(dims)
        if dims.d_model % 2:
            raise PosbenchError(f"{self.name} needs an even model width, got {dims.d_model}")
        d = dims.d_model
        half = d // 2
        inv = self.p["base"] ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
        self.amplitude = nn.Parameter(torch.randn(dims.vocab_size, half) * 2**0.5)
        self.frequency = nn.Parameter(inv.float().expand(dims.vocab_size, half).clone())
        self.phase = nn.Parameter(torch.rand(dims.vocab_size, half) * 2 * math.pi)

    def embed(self, x, idx, pos):
        angle = self.frequency[idx] * pos[:, None].float() + self.phase[idx]  # (B, T, d/2)
        r = self.amplitude[idx]
        return torch.cat([r * angle.cos(), r * angle.sin()], dim=-1)  # (B, T, d)
