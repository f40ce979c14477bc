"""Per-position tables cached across forwards and grown, never sliced past their end."""

from __future__ import annotations

from typing import Callable

import torch

from posbench.errors import PosbenchError


def position_count(pos: torch.Tensor, bound: int | None = None) -> int:
    """max(pos) + 1. Reading it waits for the device, and inside torch.compile it splits the graph
    in two; there the count is `bound` when one is given: a compiled training forward reads the
    bound its run reserved (Transformer.reserve_positions, every training position below it),
    which checked limits and grew tables to it beforehand, eagerly."""
    if bound is not None and torch.compiler.is_compiling():
        return bound
    if not torch.compiler.is_compiling():
        pos = every_member(pos)
    return int(pos.max()) + 1


def every_member(pos: torch.Tensor) -> torch.Tensor:
    """Inside torch.func.vmap, where an ensemble's members read positions of their own
    (posbench.ensemble), the positions of all of them: a table grown to their largest serves each.
    Elsewhere `pos` itself."""
    try:
        from torch._C._functorch import get_unwrapped, is_batchedtensor
    except ImportError:  # a torch without functorch's internals: vmap refuses max(pos), the ensemble falls back
        return pos
    while is_batchedtensor(pos):
        pos = get_unwrapped(pos)
    return pos


class GrowingTable:
    """Rows for positions 0..n-1 from ``build(n, device)``, rebuilt larger when a position past the
    end arrives. ``build`` must compute row k independently of n, so a table grown to 2T and then
    read at T equals one built at T. With ``at(pos)``, the rows at real positions pos (float (T,)),
    by the same formula: a table of a function of the position, not of learned integer rows, which
    real positions (posbench.positions, RFS) read there instead."""

    def __init__(self, build: Callable[[int, torch.device], torch.Tensor],
                 at: Callable[[torch.Tensor], torch.Tensor] | None = None):
        self.build = build
        self.at = at
        self.table: torch.Tensor | None = None

    def __call__(self, pos: torch.Tensor, bound: int | None = None) -> torch.Tensor:
        if pos.is_floating_point():
            if self.at is None:
                raise PosbenchError("real positions reach a table of integer positions")
            return self.at(pos)
        need = position_count(pos, bound)
        t = self.table
        if t is None or t.shape[0] < need or t.device != pos.device:
            size = max(need, 2 * t.shape[0] if t is not None else 0)
            self.table = t = self.build(size, pos.device)
        return t[pos]

    def clear(self) -> None:
        self.table = None


def sinusoid(n: int, dim: int, base: float, device=None) -> torch.Tensor:
    """(n, dim) table, interleaved: column 2i is sin(k / base^(2i/dim)), 2i+1 is cos."""
    return sinusoid_at(torch.arange(n, device=device, dtype=torch.float64), dim, base)


def sinusoid_at(k: torch.Tensor, dim: int, base: float) -> torch.Tensor:
    """(len(k), dim) rows of `sinusoid` at positions k (any reals), computed in float64."""
    inv = base ** (-torch.arange(0, dim, 2, device=k.device, dtype=torch.float64) / dim)
    angle = k.double()[:, None] * inv  # (n, dim/2)
    return torch.stack([angle.sin(), angle.cos()], dim=-1).flatten(1).float()
