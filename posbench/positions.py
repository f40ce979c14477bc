"""The positions a window gets, in training and in evaluation.

Plain runs read positions 0..T-1 (the model's default). Randomized runs (Ruoss et al., ACL
2023) read T sorted distinct draws from [0, L_max), L_max = `randomize_max`, in training AND at
test time: the model has only ever seen such gapped positions, and scoring it on gap-1 positions
it almost never met would understate the method. Runs with `position_sampling = "float"` (RFS:
Shimizu, Taniguchi, Matsuo, Findings of EACL 2026, arXiv:2602.14050) read T sorted real numbers
drawn uniformly from [0, L_max) instead, likewise in training and at test time (the paper samples
its continuous indices from one shared range in both), as a float32 tensor: only schemes that read
positions as numbers (`Scheme.float_positions`) take them. Evaluation draws are seeded by L_max, the
window length and the draw's index only, never by the scheme or the run, so every randomized run
of one L_max is scored on the same positions. Every evaluation (perplexity, probes)
chooses its positions through `evaluation_positions`.

`t` below is a run's TrainConfig (posbench.config), read by attribute and not imported, so that
every evaluation module can import this one without an import circle.
"""

from __future__ import annotations

import hashlib

import torch

from posbench.errors import PosbenchError
from posbench.schemes import PositionLimitError


def sorted_draw(limit: int, n: int, gen: torch.Generator) -> torch.Tensor:
    """(n,) sorted distinct integers drawn uniformly from [0, limit)."""
    return torch.randperm(limit, generator=gen)[:n].sort().values


def float_draw(limit: int, n: int, gen: torch.Generator) -> torch.Tensor:
    """(n,) sorted float32 reals drawn uniformly from [0, limit), none rounded up to `limit`."""
    below = torch.nextafter(torch.tensor(float(limit)), torch.tensor(0.0))  # the last float32 below it
    return (torch.rand(n, generator=gen, dtype=torch.float64) * limit).sort().values.float().clamp(max=below)


def floats(t) -> bool:
    """The run reads real positions (RFS)."""
    return t.position_sampling == "float"


def randomized(t) -> bool:
    """The run reads random positions from [0, randomize_max): integers or reals."""
    return t.randomize_positions or floats(t)


def random_positions(t, n: int, gen: torch.Generator) -> torch.Tensor:
    """n sorted positions from [0, randomize_max), reals or distinct integers as the run reads them."""
    return (float_draw if floats(t) else sorted_draw)(t.randomize_max, n, gen)


def training_positions(t, gen: torch.Generator) -> torch.Tensor | None:
    """A training window's positions: None (0..T-1) unless the run is randomized."""
    if not randomized(t):
        return None
    return random_positions(t, t.train_len, gen)


def training_bound(t, target: int | None = None) -> int:
    """Every position a run trains at is below this: train_len, randomize_max for a randomized
    run, a PoSE child's target length."""
    return max(t.train_len, t.randomize_max if randomized(t) else 0, target or 0)


def randomized_column(t) -> bool | str:
    """runs.csv's `randomized`: True or False as ever, `float` for an RFS run."""
    return "float" if floats(t) else t.randomize_positions


def check_float_positions(name: str, built) -> None:
    """One line unless every scheme of the layout `built` reads its positions as numbers, so that a
    real position between two integers means something (`Scheme.float_positions`)."""
    refused = [s.name for s in built.schemes if not s.float_positions]
    if refused:
        raise PosbenchError(f"--position-sampling float: {', '.join(dict.fromkeys(refused))} of {name!r} "
                            "does not read positions as numbers (a table of integer positions, buckets of "
                            "distances, or no positions at all); RFS takes sinusoidal, the rope family, "
                            "xpos, pope, fope and alibi")


def evaluation_draws(t, draws: int) -> int:
    """How many position draws an evaluation of this run averages: 0 (positions 0..L-1, one
    pass) unless the run is randomized."""
    return draws if randomized(t) else 0


def evaluation_columns(t, draws: int) -> dict[str, int | str]:
    """What an evaluation row says of its positions: the draws averaged, and `float` for an RFS run
    (empty otherwise, as in the rows written before the column existed)."""
    return {"position_draws": evaluation_draws(t, draws), "position_sampling": "float" if floats(t) else ""}


def evaluation_positions(t, length: int, draw: int) -> torch.Tensor | None:
    """Positions of every evaluation window of `length` in draw number `draw` (0-based): None
    (0..L-1) for a plain run; for a randomized run a sorted draw from [0, randomize_max),
    the same for every scheme (an RFS run: sorted reals from the same range, their own seeds). A
    length past randomize_max has no such draw: PositionLimitError, which evaluations record as an
    `unsupported` row with its one-line reason."""
    if not randomized(t):
        return None
    if length > t.randomize_max:
        raise PositionLimitError(
            f"eval length {length} exceeds randomize_max {t.randomize_max}: a randomized run "
            f"is evaluated on {length} distinct positions drawn from [0, {t.randomize_max})"
        )
    kind = "float " if floats(t) else ""  # integer draws keep the seeds they always had
    key = f"evaluation {kind}positions:{t.randomize_max}:{length}:{draw}".encode()
    seed = int.from_bytes(hashlib.sha256(key).digest()[:8], "little")
    return random_positions(t, length, torch.Generator().manual_seed(seed))


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
