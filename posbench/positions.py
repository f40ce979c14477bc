"""The integer positions a window gets, in training and in evaluation.

Plain runs read positions 0..T-1 (the model's default). Randomized runs (Ruoss et al., ACL
2023) read T sorted distinct draws from [0, L_max), L_max = `randomize_max`, in training AND at
test time: the model has only ever seen such gapped positions, and scoring it on gap-1 positions
it almost never met would understate the method. Evaluation draws are seeded by L_max, the
window length and the draw's index only, never by the scheme or the run, so every randomized run
of one L_max is scored on the same positions. Every evaluation (perplexity, probes)
chooses its positions through `evaluation_positions`.

`t` below is a run's TrainConfig (posbench.config), read by attribute and not imported, so that
every evaluation module can import this one without an import circle.
"""

from __future__ import annotations

import hashlib

import torch

from posbench.schemes import PositionLimitError


def sorted_draw(limit: int, n: int, gen: torch.Generator) -> torch.Tensor:
    """(n,) sorted distinct integers drawn uniformly from [0, limit)."""
    return torch.randperm(limit, generator=gen)[:n].sort().values


def training_positions(t, gen: torch.Generator) -> torch.Tensor | None:
    """A training window's positions: None (0..T-1) unless the run is randomized."""
    if not t.randomize_positions:
        return None
    return sorted_draw(t.randomize_max, t.train_len, gen)


def training_bound(t, target: int | None = None) -> int:
    """Every position a run trains at is below this: train_len, randomize_max for a randomized
    run, a PoSE child's target length."""
    return max(t.train_len, t.randomize_max if t.randomize_positions else 0, target or 0)


def evaluation_draws(t, draws: int) -> int:
    """How many position draws an evaluation of this run averages: 0 (positions 0..L-1, one
    pass) unless the run is randomized."""
    return draws if t.randomize_positions else 0


def evaluation_positions(t, length: int, draw: int) -> torch.Tensor | None:
    """Positions of every evaluation window of `length` in draw number `draw` (0-based): None
    (0..L-1) for a plain run; for a randomized run a sorted draw from [0, randomize_max),
    the same for every scheme. A length past randomize_max has no such draw: PositionLimitError,
    which evaluations record as an `unsupported` row with its one-line reason."""
    if not t.randomize_positions:
        return None
    if length > t.randomize_max:
        raise PositionLimitError(
            f"eval length {length} exceeds randomize_max {t.randomize_max}: a randomized run "
            f"is evaluated on {length} distinct positions drawn from [0, {t.randomize_max})"
        )
    key = f"evaluation positions:{t.randomize_max}:{length}:{draw}".encode()
    seed = int.from_bytes(hashlib.sha256(key).digest()[:8], "little")
    return sorted_draw(t.randomize_max, length, torch.Generator().manual_seed(seed))


def pose_positions(length: int, target: int, gen: torch.Generator) -> tuple[torch.Tensor, int]:
    """PoSE's skip-wise positions (Zhu et al., ICLR 2024; dwzhu-pku/PoSE
    `train_preprocess_function_pose`): a window of L_c = `length` tokens in two chunks whose
    positions reach up to L_t - 1, L_t = `target`. l_0 ~ U{1..floor((L_c + 1)/2)}: chunk 0 holds
    positions 0..l_0 - 1; u ~ U{0..L_t - L_c}: chunk 1 holds l_0 + u..L_c - 1 + u. Returns the
    positions (L_c,) long and l_0."""
    first = int(torch.randint(1, (length + 1) // 2 + 1, (1,), generator=gen))
    skip = int(torch.randint(0, target - length + 1, (1,), generator=gen))
    pos = torch.arange(length)
    pos[first:] += skip
    return pos, first
