"""DPE's scales (Lu et al. 2025, arXiv:2504.18857): the scale of each group of rotary pairs, detected
as the one of least loss at the evaluation length, or a default when nothing was detected.
"""

from __future__ import annotations

import dataclasses
import math

from posbench.errors import PosbenchError
from posbench.policies.scaling import RopeScaling


def dpe_default(length: int, train_len: int) -> float:
    """The scale DPE's detection gives the groups not under test, 2 L / L_train (the reference's
    `run_niah_detect.sh`: factor = TEST_MAX_LENGTH / PRETRAIN_LENGTH * 2), at least 1."""
    return max(1.0, 2 * length / train_len)


def dpe_candidates(length: int, window: int) -> list[float]:
    """The scales DPE's detection tries for a group: L / l for l = L, L/2, L/4, ... down to the
    window W (the reference halves from TEST_MAX_LENGTH while the length is >= 1024, its W)."""
    found, s = [1.0], 2.0
    while length / s >= window:
        found.append(s)
        s *= 2
    return found


def detect_dpe_scales(loss, scaling: RopeScaling, pairs: int, length: int, train_len: int) -> RopeScaling:
    """DPE's detection of the most effective scale per group (the reference's step a,
    `run_niah_detect.sh`): group by group, the other groups at `dpe_default`, the group under test
    at each of `dpe_candidates`, keeping the scale with the least loss(scaling) (NIAH accuracy in
    the reference; posbench scores the validation loss, ties to the smaller scale). Returns the
    scaling with the scales found, marked detected."""
    if scaling.given_scales:
        return scaling
    g, default = min(scaling.groups, pairs), dpe_default(length, train_len)
    window = scaling.neighbour_window(train_len)
    scored: dict[tuple[float, ...], float] = {}  # every group at the default is one trial, scored once

    def trial(scales: tuple[float, ...]) -> float:
        if scales not in scored:
            value = loss(dataclasses.replace(scaling, scales=scales, detected=True))
            scored[scales] = value if math.isfinite(value) else math.inf
        return scored[scales]

    found = []
    for group in range(g):
        found.append(min(dpe_candidates(length, window),
                         key=lambda s, group=group: trial(tuple(s if i == group else default for i in range(g)))))
    return dataclasses.replace(scaling, scales=tuple(found), detected=True)


def dpe_ready(scaling: RopeScaling, pairs: int, length: int, train_len: int) -> RopeScaling:
    """The scaling with DPE's scales: those detected or given, else (nothing detected: a picture, a
    probe of a trained run) every group at `dpe_default`. Other policies as they are."""
    if scaling.kind != "dpe":
        return scaling
    if len(scaling.scales) > pairs:
        raise PosbenchError(f"dpe: {len(scaling.scales)} scales for {pairs} rotary pairs; give at most one per pair")
    default = (dpe_default(length, train_len),) * min(scaling.groups, pairs)
    return scaling if scaling.scales else dataclasses.replace(scaling, scales=default)
