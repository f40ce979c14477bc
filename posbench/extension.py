"""What makes a run a child (posbench/docs/extension.md): the parent it was fine-tuned
from, the method, the target length and the method's settings. posbench.extending builds children;
training and evaluation read this record only, so a child's evaluation applies its method
(the rescaling it trained with) by itself.

Methods, with s = L' / L (L: the parent's training length, L': the target):
- `plain`: fine-tune at L', positions and frequencies unchanged (any scheme);
- `pi`, `ntk`, `yarn`: posbench's eval-time formulas (posbench.policies) at the fixed s,
  in training and at evaluation (YaRN with its attention factor 0.1 ln s + 1);
- `longrope`: per-pair factors searched on validation loss at L' before fine-tuning
  (posbench/docs/extension.md), with the attention factor sqrt(1 + ln s / ln L). posbench's variant is long-factors-only:
  the searched factors apply at every length. transformers' `longrope` holds two sets and takes
  `short_factor` for windows up to the original length L (`long_factor` beyond), and LongRoPE
  searches the short set separately (section 3.3) to recover short-context quality; posbench
  searches no short set, so a child's windows of L or fewer tokens are read with the long factors
  (and the attention factor), and its perplexity there measures that, not transformers' model;
- `pose+R` (R one of plain, pi, ntk, yarn): fine-tune at L with PoSE's skip-wise positions
  covering L' (posbench.positions.pose_positions), under the rescaling R;
- `drope` (Gelberg et al. 2025, DroPE): the child's layout is the parent's with every RoPE layer
  NoPE (`none`), on the parent's weights, recalibrated at L with the reference's lr schedule
  (posbench.extending); evaluated with no positional encoding at any length.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from posbench.errors import PosbenchError, did_you_mean
from posbench.policies import RopeScaling

RESCALINGS = ("pi", "ntk", "yarn", "longrope")
POSE = "pose+"
DROPE = "drope"
METHODS = ("plain", *RESCALINGS, *(POSE + r for r in ("plain", "pi", "ntk", "yarn")), DROPE)


@dataclass(frozen=True)
class Extension:
    parent: str  # the parent's run_id
    method: str  # one of METHODS
    base_len: int  # L, the parent's training length
    target_len: int  # L'
    steps: int  # the budget: steps of the parent's batch size at L' (pose: the same tokens in rows of L)
    settings: dict[str, Any] = field(default_factory=dict)  # the method's: yarn alpha, beta; longrope search
    # longrope: the searched lambda_t. Recorded in config.json, not in the run_id: they follow from the
    # parent and the search settings, and the run_id must be known before the search.
    factors: tuple[float, ...] = ()

    @property
    def pose(self) -> bool:
        return self.method.startswith(POSE)

    @property
    def rescaling(self) -> str:
        """The frequency rescaling: the method without pose+ (plain: none)."""
        return self.method.removeprefix(POSE)

    @property
    def factor(self) -> float:
        return self.target_len / self.base_len

    def scaling(self) -> RopeScaling:
        """The RoPE scaling the child trains and is evaluated with."""
        kind = self.rescaling
        if kind in ("plain", DROPE):
            return RopeScaling()
        extra = {k: self.settings[k] for k in ("alpha", "beta") if kind == "yarn" and k in self.settings}
        return RopeScaling(kind, self.factor, factors=self.factors, **extra)

    def identity(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out.pop("factors")
        return out

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Extension:
        if not (isinstance(raw, dict) and isinstance(raw.get("settings", {}), dict)):
            raise TypeError("extension must be a table with a settings table")
        return cls(parent=str(raw["parent"]), method=str(raw["method"]), base_len=int(raw["base_len"]),
                   target_len=int(raw["target_len"]), steps=int(raw["steps"]), settings=dict(raw.get("settings", {})),
                   factors=tuple(float(f) for f in raw.get("factors", ())))

    def columns(self) -> dict[str, Any]:
        """What result rows of the child say of it."""
        return {"parent_run": self.parent, "extend_method": self.method, "extend_len": self.target_len,
                "extend_steps": self.steps}


def columns(extension: Extension | None) -> dict[str, Any]:
    """The child columns of a result row; empty for a run trained from scratch."""
    if extension is None:
        return {"parent_run": None, "extend_method": None, "extend_len": None, "extend_steps": None}
    return extension.columns()


def check_pairing(name: str, built, method: str, base_len: int, target_len: int) -> None:
    """One line when the scheme or layout `name` (`built`: its ModelLayout) cannot be extended from
    `base_len` to `target_len` with `method`: RoPE-family layouts take every method, the others
    `plain`, and `pose+plain` where they read integer positions."""
    if method not in METHODS:
        raise did_you_mean(method, METHODS, "extension method")
    if target_len <= base_len:
        raise PosbenchError(f"target length {target_len} must exceed the parent's training length {base_len}")
    takes = "plain" + (" and pose+plain" if built.takes_positions else "")
    if method.removeprefix(POSE) != "plain" and not built.scalable:
        raise PosbenchError(f"{name} has no RoPE layer to rescale: method {method!r} needs a RoPE-family "
                            f"scheme (rope, p-rope, a layout with rope layers); {name} takes {takes}")
    if method.startswith(POSE) and not built.takes_positions:
        raise PosbenchError(f"{name} reads no integer positions for {method} to skip; it takes plain")
    limit = built.position_limit()
    if limit is not None and limit < target_len:
        raise PosbenchError(f"{name} represents positions below {limit} only: it cannot be fine-tuned "
                            f"to {target_len} tokens")
