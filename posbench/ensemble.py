"""Ensembles (`--ensemble auto|off|N`): runs that differ only in seed trained as one stacked model
in one process, so that a tiny model fills more of a GPU (posbench/docs/cluster.md).

Each member stays a run of its own (posbench.training's `_Run`): its model built as its solo run
builds it (so its initial weights are the solo run's), its own batch generator, optimizer,
gradient clipping, log, checkpoints, early stop and NaN failure, and its own run folder, run_id
and runs.csv row. Only the forward and backward are shared: each step the live members'
parameters are stacked (torch.stack, which the backward follows back into each member's own
`.grad`), and one `torch.func.vmap` over `functional_call` of the first member's module computes
every member's loss on its own batch. A member that stops (early stop, NaN) leaves the stack; the
others go on.

The first stacked step is a trial: each member's loss is also computed alone and compared. A
scheme whose forward cannot run under vmap (control flow on the values of positions that differ
between members, a kernel without a batching rule that autograd refuses), or whose stacked losses
differ from its own, falls back: the members then train one after another in the same process,
each step exactly a solo run's, after one line that names the scheme. Ensembles train eager (the
`compile` column says off).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import sys
import warnings
from typing import Any, Iterable

import torch

from posbench import batches
from posbench.config import check_ensemble
from posbench.device import autocast
from posbench.errors import PosbenchError, out_of_memory

# How far a member's stacked loss may lie from its loss computed alone at the trial (relative):
# float32 sums in another order; bfloat16 rounds far coarser.
TRIAL_TOLERANCE = {"float32": 1e-4, "bfloat16": 3e-2}


def size(setting: int | str, device: str, seeds: int) -> int:
    """The most members of one ensemble: `auto` is every seed on CUDA and 1 (off) elsewhere."""
    setting = check_ensemble(setting)
    if setting == "off":
        return 1
    if setting == "auto":
        return seeds if device == "cuda" else 1
    return setting


def cell(spec) -> str:
    """What a run is but its seed: runs of one cell differ only in seed."""
    raw = spec.to_json()
    raw.pop("run_id"), raw.pop("seed")
    return json.dumps(raw, sort_keys=True, default=str)


def groups(specs: Iterable, most: int) -> list[list]:
    """`specs` in groups of at most `most` runs that differ only in seed, in the order of each
    group's first run; a group's runs in seed order. `most` 1: each run alone, in order."""
    if most <= 1:
        return [[s] for s in specs]  # each run alone, in the order given
    cells: dict[str, list] = {}
    for spec in specs:
        cells.setdefault(cell(spec), []).append(spec)
    out = []
    for members in cells.values():
        members = sorted(members, key=lambda s: s.seed)
        out += [members[i:i + most] for i in range(0, len(members), most)]
    return out


class Unstackable(Exception):
    """The members' forward did not run stacked (the reason in its message)."""


class Stack:
    """The shared forward and backward of an ensemble's live members."""

    def __init__(self, scheme: str, members: int):
        self.scheme = scheme
        self.members = members
        self.stacked = 0  # steps trained stacked in this process
        self.off: str | None = None  # why the members train one after another, once they do
        self.differing: dict[tuple[str, ...], set[str]] = {}  # by the live members: their buffers that differ

    def fall_back(self, reason: str) -> None:
        self.off = reason
        print(f"note: ensemble of {self.members} runs of {self.scheme}: {reason}; training them one after "
              "another in this process instead (each as its solo run)", file=sys.stderr)

    def forward_backward(self, runs: list, drawn: list[batches.Batch]) -> list[float]:
        """Every live member's loss on its batch, its gradients in its parameters' `.grad`.
        Raises Unstackable when the stacked forward cannot run or (at the trial) disagrees with
        the members' own; nothing has then changed but the `.grad` of their parameters."""
        lead, dev, t = runs[0], runs[0].dev, runs[0].spec.train
        try:
            with autocast(dev, t.dtype), _unbatched_kernels_quiet(), stacked_kernels(dev):
                models = [r.model for r in runs]
                live = tuple(r.spec.run_id for r in runs)
                if live not in self.differing:  # buffers are fixed: compared once (a sync each on a GPU)
                    self.differing[live] = differing_buffers(models)
                losses = _stacked_losses(lead.model, models, drawn, self.differing[live])
        except (KeyboardInterrupt, PosbenchError):
            raise
        except Exception as e:  # noqa: BLE001 - whatever vmap refuses: train them one by one
            if out_of_memory(e):
                raise
            raise Unstackable(f"its forward does not run stacked ({type(e).__name__}: "
                              f"{_first_line(e)})") from None
        if not self.stacked:
            self.trial(runs, drawn, losses.detach())
        for run in runs:
            run.opt.zero_grad(set_to_none=True)
        try:
            with _unbatched_kernels_quiet():
                losses.sum().backward()
        except (KeyboardInterrupt, PosbenchError):
            raise
        except Exception as e:  # noqa: BLE001
            if out_of_memory(e):
                raise
            raise Unstackable(f"its backward does not run stacked ({type(e).__name__}: "
                              f"{_first_line(e)})") from None
        self.stacked += 1
        return losses.detach().float().tolist()

    @torch.no_grad()
    def trial(self, runs: list, drawn: list[batches.Batch], stacked: torch.Tensor) -> None:
        """Each member's loss computed alone on its batch equals its stacked one."""
        t = runs[0].spec.train
        with autocast(runs[0].dev, t.dtype):
            alone = [float(batches.masked_mean(r.model(b.tokens, b.positions, targets=b.targets), b.mask))
                     for r, b in zip(runs, drawn)]
        for run, a, s in zip(runs, alone, stacked.float().tolist()):
            if math.isfinite(a) and not abs(a - s) <= TRIAL_TOLERANCE[t.dtype] * max(1.0, abs(a)):
                raise Unstackable(f"the stacked loss of {run.spec.run_id} is {s!r}, alone {a!r}")


def differing_buffers(models: list[torch.nn.Module]) -> set[str]:
    """The buffers that differ between the models (a scheme's random features drawn from the seed);
    the others (frequencies, slopes) are read unstacked, the lead's."""
    buffers = [dict(m.named_buffers()) for m in models]
    return {k for k, first in buffers[0].items() if any(not _same(first, b[k]) for b in buffers[1:])}


def _stacked_losses(lead: torch.nn.Module, models: list[torch.nn.Module], drawn: list[batches.Batch],
                    differing: set[str] | None = None) -> torch.Tensor:
    """(members,) the masked mean loss of each member's model on its batch, in one vmap over the
    lead's module with the members' parameters and `differing` buffers (default: found here)
    stacked. The stack is differentiable: a backward fills each member's own `.grad`."""
    from torch.func import functional_call, vmap

    named = [dict(m.named_parameters()) for m in models]
    stacked: dict[str, torch.Tensor] = {k: torch.stack([p[k] for p in named]) for k in named[0]}
    buffers = [dict(m.named_buffers()) for m in models]
    for k in differing_buffers(models) if differing is None else differing:
        stacked[k] = torch.stack([b[k] for b in buffers])
    tokens = torch.stack([b.tokens for b in drawn])
    targets = torch.stack([b.targets for b in drawn])
    masked = drawn[0].mask is not None
    masks = torch.stack([b.mask for b in drawn]) if masked else tokens  # (unused without masks)
    positions = [b.positions for b in drawn]
    shared = all(p is None for p in positions) or (
        all(p is not None for p in positions) and all(_same(positions[0], p) for p in positions[1:]))
    pos = positions[0] if shared else torch.stack(positions)

    def loss(state: dict[str, Any], x, y, mask, p):
        losses = functional_call(lead, state, (x, p if not shared else pos), {"targets": y})
        return batches.masked_mean(losses, mask if masked else None)

    return vmap(loss, in_dims=(0, 0, 0, 0, None if shared else 0))(stacked, tokens, targets, masks,
                                                                   None if shared else pos)


def stacked_kernels(dev) -> contextlib.AbstractContextManager:
    """The attention kernels of a stacked forward. On CUDA, SDPA's math backend: under vmap the
    memory-efficient kernel's backward refuses the log-sum-exp that vmap's folding of members into
    the batch hands it (measured on an H200, torch 2.11: "LSE is not correctly aligned (strideH)",
    and an ensemble of ten rope runs fell back), while the math backend's products and softmax
    batch over the members as over the batch. Elsewhere SDPA chooses as it always does."""
    if torch.device(dev).type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.MATH])


@contextlib.contextmanager
def _unbatched_kernels_quiet():
    """A kernel without a batching rule (SDPA on CPU) runs once per member, right but slower;
    torch warns of it at every step."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*performance drop.*")
        yield


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a is b or (a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b)))


def _first_line(e: Exception) -> str:
    """The error's first sentence, at most 160 characters."""
    line = str(e).splitlines()[0] if str(e) else ""
    line = line.split(". ")[0]
    return line if len(line) <= 160 else line[:157] + "..."


def with_seeds(spec, seeds: Iterable[int]) -> list:
    """`spec` once for each seed."""
    return [dataclasses.replace(spec, seed=s) for s in seeds]
