"""A run trained here as the sweep reads it (posbench.sweep.Reader): its variants (eval-time
policies and learned-table extensions), losses at the positions of each draw, teacher-forced
answers to prompts, the columns that name it in rows. The other reader is a pretrained model
(posbench.pretrained.Pretrained).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Hashable, Iterator

import torch

from posbench import results
from posbench.attention_measures import Recorder
from posbench.batches import answer_verdicts
from posbench.config import EvalConfig
from posbench.device import autocast, resolve_device
from posbench.extension import columns as extension_columns
from posbench.layout import run_prefix
from posbench.policies import Policy, from_eval, make, specs
from posbench.positions import evaluation_columns, evaluation_positions, randomized
from posbench.probes import Example
from posbench.runs import FINAL, RunSpec, load_trained
from posbench.sweep import Variant
from posbench.errors import PosbenchError

ATTN_BYTES = 512 * 2**20  # cap on one batch's attention scores (B * H * L * L floats)
MAX_BATCH = 64  # prompts in one forward


def find_runs(runs_dir: Path | str, schemes: list[str] | None = None) -> list[Path]:
    """Finished runs under runs_dir (those with final weights), optionally of some schemes."""
    runs_dir = Path(runs_dir)
    if not runs_dir.is_dir():
        raise PosbenchError(f"runs directory {str(runs_dir)!r} does not exist; train first")
    found = sorted(p.parent for p in runs_dir.glob(f"*/{FINAL}"))
    if schemes:
        prefixes = {run_prefix(s) for s in schemes}
        found = [p for p in found if p.name.rsplit("-", 1)[0] in prefixes]
    return found


def variants_for(spec: RunSpec, cfg: EvalConfig, layout) -> list[Variant]:
    """The variants that apply to this run's schemes (others are skipped, not failed). RoPE
    scalings skip a run trained on randomized positions: it saw positions up to randomize_max,
    so rescaling by L_eval / L_train would move its positions away from the trained ones; and a
    child fine-tuned with a rescaling (posbench.extending), which is evaluated with its own alone."""
    rescaled = spec.extension is not None and spec.extension.rescaling != "plain"
    scalable = layout.scalable and not randomized(spec.train) and not rescaled
    scalings = [from_eval(k, cfg) for k in specs(cfg)] if scalable else [make()]
    extensions = [e for e in cfg.learned_extension if e == "none" or e in layout.extensions] or ["none"]
    return [Variant(s, e) for s in dict.fromkeys(scalings) for e in dict.fromkeys(extensions)]


def windows_per_forward(length: int, heads: int, batch_tokens: int) -> int:
    """Windows of `length` scored by one forward: batch_tokens' worth, its attention scores within
    ATTN_BYTES."""
    return max(1, min(batch_tokens // length, ATTN_BYTES // (4 * heads * length * length)))


@dataclass
class TrainedScorer:
    """A trained run's model as a Scorer, at the windows' positions `pos` (None: 0..L-1)."""

    model: torch.nn.Module
    device: torch.device
    dtype: str
    batch_tokens: int
    pos: torch.Tensor | None = None

    def losses(self, tokens: torch.Tensor) -> torch.Tensor:
        tokens = tokens.to(self.device)
        pos = self.pos.to(self.device) if self.pos is not None else None
        with autocast(self.device, self.dtype):
            return self.model.token_losses(tokens[:, :-1], tokens[:, 1:], pos)  # (B, L)

    def per_forward(self, length: int) -> int:
        return windows_per_forward(length, self.model.cfg.n_heads, self.batch_tokens)


@torch.inference_mode()
def verdicts(model, prompts: list[Example], device, dtype: str = "float32",
             positions: torch.Tensor | None = None) -> list[list[bool]]:
    """Per prompt (all of one length), whether each of its answers is the model's greedy answer
    given the tokens before it (teacher forcing); `positions` (L,) the prompts' positions (None: 0..L-1)."""
    length = len(prompts[0].tokens)
    per = max(1, min(MAX_BATCH, ATTN_BYTES // (4 * model.cfg.n_heads * length * length)))
    positions = positions.to(device) if positions is not None else None
    out = []
    for i in range(0, len(prompts), per):
        chunk = prompts[i: i + per]
        tokens = torch.tensor([p.tokens for p in chunk], device=device)  # (B, L)
        with autocast(device, dtype):
            guess = model(tokens, positions).argmax(-1)  # (B, L): guess[:, p] predicts tokens[:, p + 1]
        hit = (guess[:, :-1] == tokens[:, 1:]).cpu()  # (B, L - 1): hit[:, p - 1] judges token p
        out += answer_verdicts(hit, chunk)
    return out


class TrainedReader:
    """A finished run of `run_dir`, loaded on `device`, read under the eval-time settings `cfg`
    (its policies, extensions and position draws)."""

    def __init__(self, run_dir: Path, cfg: EvalConfig, device: str | torch.device = "auto", task: str | None = None):
        self.device = resolve_device(device)
        self.spec, self.model, _ = load_trained(run_dir, self.device)
        self.cfg = cfg
        self.dtype = self.spec.train.dtype
        self.train_len = self.spec.original_len
        self.extension = "none"
        positions = evaluation_columns(self.spec.train, cfg.position_draws)
        self.draws = max(1, positions["position_draws"])
        self.columns = {"run_id": self.spec.run_id, "task": task or self.spec.task, "scheme": self.spec.scheme,
                        "params": self.model.layout.describe(), "seed": self.spec.seed, "train_len": self.train_len,
                        **extension_columns(self.spec.extension), **positions,
                        **results.provenance(self.device.type, self.dtype)}

    @property
    def layout(self):
        return self.model.layout

    def variants(self) -> list[Variant]:
        return variants_for(self.spec, self.cfg, self.layout)

    def set(self, variant: Variant) -> None:
        self.layout.set_scaling(variant.scaling)
        self.layout.set_extension(variant.extension)
        self.extension = variant.extension

    def cell(self, variant: Variant, length: int) -> dict:
        return {"scaling": variant.scaling_label, "extension": variant.extension,
                "backend": self.layout.backends(self.device, self.model.backend), **variant.scaling.provenance()}

    def distinct(self, scaling: Policy, length: int) -> Hashable:
        """Its RoPE layers' frequencies and attention factor at `length` under the policy set, and the
        extension: a policy that forms its own attention (two maps, DoPE's heads) never shares."""
        if scaling.explicit:
            return (scaling, self.extension, length)
        rotary = [s.frequencies(length) for s in self.layout.schemes if hasattr(s, "set_scaling")]
        return (tuple((inv.numpy().tobytes(), float(m)) for inv, m in rotary), self.extension, length)

    def scorer(self, length: int, draw: int = 0, batch_tokens: int = 0) -> TrainedScorer:
        return TrainedScorer(self.model, self.device, self.dtype, batch_tokens,
                             evaluation_positions(self.spec.train, length, draw))

    def rotary_pairs(self) -> tuple[int, int]:
        """(rotary pairs, training length) of its RoPE layers, the fewest pairs where they differ."""
        rotary = [s for s in self.layout.schemes if hasattr(s, "set_scaling")]
        return min(s.rotary_dim // 2 for s in rotary), rotary[0].dims.train_len

    def answers(self, prompts: list[Example], length: int, draw: int = 0) -> Iterator[list[bool]]:
        yield from verdicts(self.model, prompts, self.device, self.dtype,
                            evaluation_positions(self.spec.train, length, draw))

    def recorder(self) -> Recorder:
        """What sees each layer's attention weights (posbench.attention_measures)."""
        return Recorder(self.layout.spans, self.spec.train.train_len)

    @contextmanager
    def explicit(self):
        """Every layer on the explicit path, the only one that forms the weights, while inside."""
        forced, self.model.backend = self.model.backend, "explicit"
        try:
            yield
        finally:
            self.model.backend = forced
