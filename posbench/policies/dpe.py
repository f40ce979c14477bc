"""DPE's scales (Lu et al. 2025, arXiv:2504.18857): the scale of each group of rotary pairs, detected
as the one of least loss at the evaluation length, or a default when nothing was detected.
"""

from __future__ import annotations

import math


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


def detect_dpe_scales(loss, policy, pairs: int, length: int, train_len: int):
    """DPE's detection of the most effective scale per group (the reference's step a,
    `run_niah_detect.sh`): group by group, the other groups at `dpe_default`, the group under test
    at each of `dpe_candidates`, keeping the scale with the least loss(policy) (NIAH accuracy in
    the reference; posbench scores the validation loss, ties to the smaller scale). Returns the
    policy with the scales found, marked detected; given scales are kept."""
    if policy.given_scales:
        return policy
    g, default = min(policy.groups, pairs), dpe_default(length, train_len)
    window = policy.neighbour_window(train_len)
    scored: dict[tuple[float, ...], float] = {}  # every group at the default is one trial, scored once

    def trial(scales: tuple[float, ...]) -> float:
        if scales not in scored:
            value = loss(policy.replace(scales=scales, detected=True))
            scored[scales] = value if math.isfinite(value) else math.inf
        return scored[scales]

    found = []
    for group in range(g):
        found.append(min(dpe_candidates(length, window),
                         key=lambda s, group=group: trial(tuple(s if i == group else default for i in range(g)))))
    return policy.replace(scales=tuple(found), detected=True)

