"""Perplexity beyond the training length (posbench/docs/evaluation.md).

- ``nonoverlap`` (Press et al.): the test stream is cut into windows of L and every token is
  scored. Every length scores the same budget of target tokens, the same tokens where L divides
  the budget; the count is recorded.
- ``sliding``: windows of L advance by S and only their last S tokens are scored, so each scored
  token sees at least L - S tokens of context. The scored targets start at the largest evaluated
  length, so every length scores the same tokens.

Per-position loss (mean loss by index inside the window) goes to positions.csv. A scheme that
cannot run at a length yields a row with status `unsupported` and the reason; one whose code fails
there (an index past an undeclared table, a plug-in's exception) a row with status `failed` and
the error's first line (naming the plug-in's file and line), and the other lengths and runs go on.

A randomized run's windows read sorted position draws from [0, randomize_max), as in training
(`posbench.positions.evaluation_positions`): every length is scored `position_draws` times, once
per draw, and its loss is the mean over draws (the count is the row's `position_draws`; 0 for a
plain run, whose windows read 0..L-1). A bucket of positions.csv is then an index range inside
the window, whatever positions the draws gave those indices.

Every row carries `loss_se`, the standard error of its mean loss over windows, and `ppl_lo`,
`ppl_hi`, the 95% interval exp(loss -+ t * loss_se), its lower end at least 1 (a loss of 0). Windows score equal numbers of tokens, so the
mean loss is the mean of window losses. Nonoverlapping windows share no context and count as
independent; sliding windows overlap by L - S tokens, so each block of ceil(L / S) consecutive
windows, whose contexts chain into each other, is one observation (batch means,
`stats.batch_se`; a randomized run's window loss is its mean over the draws). Each window's loss
also goes to windows.csv (window index, start offset in the test stream), for paired comparisons
of two models on the same windows (posbench.pairing).
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from posbench import results, stats
from posbench.attention import observe
from posbench.config import EvalConfig
from posbench.data import TokenData, load_tokens
from posbench.errors import PosbenchError
from posbench.extension import columns as extension_columns
from posbench.layout import takes_rope_scaling
from posbench.probes import PROBES, probe_name
from posbench.readers import TrainedReader, variants_for
from posbench.schemes import SCHEMES
from posbench.runs import RunSpec, data_spec
from posbench.sweep import Scorer, detection_windows, sweep


def on_probe(run_dir: Path) -> bool:
    """Whether a run trained on a probe's examples (its config names a probe as its data)."""
    try:
        spec = data_spec(run_dir)
    except PosbenchError:
        return False  # a damaged config fails with its own message where the run is loaded
    return probe_name(spec) in PROBES


def scaling_note(rows: list[dict], kinds: tuple[str, ...]) -> str | None:
    """One line on the eval-time RoPE scalings asked for (`kinds`, e.g. yarn) that `variants_for`
    left out of `rows` (extrapolation or probes rows): which schemes take them, and which runs
    have `none` rows only. None when every run has them all."""
    asked = [k for k in dict.fromkeys(re.match(r"[\w-]*", k)[0] for k in kinds) if k not in ("none", "", "config")]
    got, scheme = defaultdict(set), {}
    for r in rows:
        if results.of_model(r):
            continue  # a pretrained model reads every policy asked
        got[r["run_id"]].add(re.match(r"[\w-]*", r["scaling"])[0])  # the kind of a label such as yarn:4
        scheme[r["run_id"]] = r["scheme"]
    missing = sorted(run for run, labels in got.items() if not set(asked) <= labels)
    if not asked or not missing:
        return None
    takes = sorted(name for name, cls in SCHEMES.items() if hasattr(cls, "set_scaling"))
    parts = [f"--rope-scaling {','.join(asked)} applies to {', '.join(takes)} and the layouts with them"]
    unscaled = sorted({scheme[run] for run in missing if not takes_rope_scaling(scheme[run])})
    if unscaled:
        parts.append(f"{', '.join(unscaled)} take none: their rows are `none` only")
    own = [run for run in missing if takes_rope_scaling(scheme[run])]
    if own:
        parts.append(f"{', '.join(own)} trained on randomized positions or fine-tuned with a rescaling, so they "
                     "are evaluated as trained: `none` rows only")
    return "; ".join(parts)


def stride_for(cfg: EvalConfig, length: int) -> int:
    return (cfg.stride or max(1, length // 2)) if cfg.mode == "sliding" else 0


def row_keys(spec: RunSpec, cfg: EvalConfig, layout) -> set[tuple[str, ...]]:
    """The extrapolation.csv keys that evaluating this run under `cfg` writes."""
    return {
        (spec.run_id, str(n), cfg.mode, str(stride_for(cfg, n)), v.scaling_label, v.extension)
        for v in variants_for(spec, cfg, layout) for n in cfg.lengths
    }


def windows(stream: torch.Tensor, length: int, cfg: EvalConfig, lengths: tuple[int, ...]):
    """(starts, first_scored): input windows stream[s : s + L] predict stream[s + 1 : s + L + 1];
    positions >= first_scored inside each window are scored."""
    budget = cfg.tokens
    if cfg.mode == "nonoverlap":
        n = max(1, budget // length)
        if (n * length) + 1 > len(stream):
            n = (len(stream) - 1) // length
        if n < 1:
            raise PosbenchError(f"the test split ({len(stream)} tokens) is shorter than one window of {length}")
        return torch.arange(n) * length, 0
    stride = stride_for(cfg, length)
    if stride > length:
        raise PosbenchError(f"stride {stride} is longer than the window {length}")
    first_target = max(lengths)  # every length has full context before it
    n = max(1, budget // stride)
    while n and first_target + n * stride > len(stream):
        n -= 1
    if n < 1:
        raise PosbenchError(f"the test split ({len(stream)} tokens) is too short for sliding windows of {length}")
    # Window k, stream[s : s + L], scores its last S predictions: targets F + kS .. F + kS + S - 1.
    starts = first_target + (torch.arange(n) + 1) * stride - length - 1
    return starts, length - stride


def correlated_windows(mode: str, length: int, stride: int) -> int:
    """How many consecutive windows share context: the block size of batch means."""
    return math.ceil(length / stride) if mode == "sliding" else 1


def short_losses(scorer: Scorer, tokens: torch.Tensor, context: int) -> torch.Tensor:
    """Windows of tokens (B, L + 1) -> each target's loss given at most its last `context` tokens
    (B, L), NaN for the first `context` targets (the whole window gives them no more). Short
    windows of `context` tokens advance by context / 4 and score their last quarter, so a target
    reads between 3/4 of `context` and `context` tokens, never more than the short reading's limit
    (LongPPL's short windows, trunc_len + sliding_window tokens, give its targets trunc_len to
    trunc_len + sliding_window - 1)."""
    width = tokens.shape[1] - 1
    out = torch.full((tokens.shape[0], width), math.nan, dtype=torch.float64)
    step = max(1, context // 4)
    for first in range(context, width, step):
        end = min(first + step, width)  # targets first .. end - 1 read tokens end - context .. t
        losses = scorer.losses(tokens[:, end - context: end + 1])  # (B, context)
        out[:, first:end] = losses[:, context - (end - first):].double().cpu()
    return out


@dataclass
class KeyTokens:
    """LongPPL's key tokens (Fang et al. 2025, PKU-ML/LongPPL `find_key_token`): a target whose
    loss with the whole window is lower by more than `drop` than with only its last `context`
    tokens, and below `ceiling` with the whole window (LongPPL's alpha 2 and beta -2), is a key
    token: one the model predicts from context beyond `context`. Counts pool every window of a
    length: the key tokens, their summed loss, and the targets compared (those past `context`)."""

    scorer: Scorer  # reads the short windows (a randomized run: at positions of their length)
    context: int  # the training length, or a pretrained model's context
    drop: float
    ceiling: float
    keys: int = 0
    key_loss: float = 0.0
    compared: int = 0

    def add(self, tokens: torch.Tensor, full: torch.Tensor, first: int) -> None:
        """Windows (B, L + 1) and their whole-window losses (B, L), scored from index `first`."""
        if tokens.shape[1] - 1 <= self.context:
            return
        with observe(None):  # the short windows' attention is no part of the length's measures
            short = short_losses(self.scorer, tokens, self.context)[:, first:]
        full = full[:, first:].double().cpu()
        compared = ~short.isnan()
        key = compared & (short - full > self.drop) & (full < self.ceiling)
        self.compared += int(compared.sum())
        self.keys += int(key.sum())
        self.key_loss += float(full[key].sum())

    def columns(self) -> dict:
        """extrapolation.csv's key-token columns: perplexity on the key tokens, their share of the
        targets compared, and their count (no share where no target reads past `context`, no
        perplexity where no target is a key token)."""
        if not self.compared:
            return {"key_ppl": None, "key_share": None, "key_tokens": 0}
        ppl = math.exp(self.key_loss / self.keys) if self.keys else None
        return {"key_ppl": ppl, "key_share": self.keys / self.compared, "key_tokens": self.keys}


def key_tokens(cfg: EvalConfig, scorer: Scorer | None, context: int) -> KeyTokens | None:
    """A count of key tokens past `context` under `cfg`'s thresholds, or None when cfg asks for none."""
    return KeyTokens(scorer, context, cfg.key_drop, cfg.key_loss) if cfg.key_tokens else None


@torch.inference_mode()
def score(scorer: Scorer, stream: torch.Tensor, length: int, cfg: EvalConfig, lengths,
          on_forward: Callable[[torch.Tensor], None] | None = None, keys: KeyTokens | None = None):
    """Summed loss and count per window index (L,) over every scored window, the window starts (W,)
    and each window's mean loss over its scored tokens (W,): the one perplexity of trained runs and
    pretrained models alike. `on_forward` sees each forward's window losses (progress); `keys`
    counts the key tokens of the scored targets."""
    starts, first = windows(stream, length, cfg, lengths)
    total = torch.zeros(length, dtype=torch.float64)
    count = torch.zeros(length, dtype=torch.float64)
    per_window = []
    offsets = torch.arange(length + 1)
    for chunk in starts.split(scorer.per_forward(length)):
        tokens = stream[chunk[:, None] + offsets]  # (B, L + 1)
        losses = scorer.losses(tokens)  # (B, L)
        if keys is not None:
            keys.add(tokens, losses, first)
        scored = losses[:, first:].double().cpu()  # (B, L - first)
        total[first:] += scored.sum(0)
        count[first:] += losses.shape[0]
        per_window.append(scored.mean(1))
        if on_forward is not None:
            on_forward(per_window[-1])
    return total, count, starts, torch.cat(per_window)


@dataclass
class Perplexity:
    """Perplexity of `stream` at each length, a measure of posbench.sweep: rows for
    extrapolation.csv, positions.csv and windows.csv (and attention.csv rows appended to
    `attention`, given a list: a trained run's attention at every length). DPE detects its scales on
    windows of `valid`; `on_length(label, windows)` and `on_forward(window losses)` see progress."""

    cfg: EvalConfig
    stream: torch.Tensor
    columns: dict
    valid: torch.Tensor | None = None
    attention: list[dict] | None = None
    on_length: Callable[[str, int], None] | None = None
    on_forward: Callable[[torch.Tensor], None] | None = None
    tables = ("windows", "extrapolation", "positions")
    gates = False

    def kept(self, common: dict):
        return None

    def detection(self, length: int) -> tuple[torch.Tensor, int, str]:
        return detection_windows(self.valid, length, self.cfg.dpe_windows), length, "validation windows"

    def read(self, reader, length: int, common: dict):
        cfg = self.cfg
        if self.on_length is not None:
            self.on_length(f"{common['scaling']} {length}", len(windows(self.stream, length, cfg, cfg.lengths)[0]))
        keys = key_tokens(cfg, None, reader.train_len)
        recorder = reader.recorder() if self.attention is not None else None
        # The explicit path is the only one that forms the weights: a run already on it is
        # recorded while it is scored, any other by a second pass over the same windows.
        inline = recorder is not None and common["backend"] == "explicit"
        total = count = window_loss = 0
        for draw in range(reader.draws):
            with observe(recorder if inline else None):
                if keys is not None:  # the short windows at the positions of their own length
                    keys.scorer = reader.scorer(keys.context, draw, cfg.batch_tokens)
                t, c, starts, w = score(reader.scorer(length, draw, cfg.batch_tokens), self.stream, length, cfg,
                                        cfg.lengths, self.on_forward, keys)
            total, count, window_loss = total + t, count + c, window_loss + w
            if recorder is not None and not inline:
                with reader.explicit(), observe(recorder):
                    score(reader.scorer(length, draw, cfg.batch_tokens), self.stream, length, cfg, cfg.lengths)
        # Every draw scores the same tokens: means over draws, per window index and per window.
        draws = reader.draws
        return (total / draws, count / draws, starts, window_loss / draws, keys.columns() if keys is not None else {},
                recorder.rows() if recorder is not None else [])

    def rows(self, common: dict, result, reason: str) -> dict[str, list[dict]]:
        total, count, starts, window_loss, key_columns, measured = result
        row = {**common, "stride": stride_for(self.cfg, common["eval_len"])}
        if self.attention is not None:
            kept = {k: v for k, v in row.items() if k != results.POLICY_SHA}  # attention.csv has no such column
            self.attention += [{**kept, **r, "backend": "explicit"} for r in measured]
        loss = float(total.sum() / count.sum())
        status = "ok" if math.isfinite(loss) else "failed"
        row = row | {"tokens": int(count.sum()), "loss": loss, "ppl": math.exp(loss),
                **loss_interval(loss, window_loss.tolist(), correlated_windows(self.cfg.mode, row["eval_len"], row["stride"])),
                **key_columns, "status": status,
                "reason": reason if status == "ok" else non_finite(loss, total, count, row["eval_len"])}
        return {"windows": window_rows(row, starts, window_loss), "extrapolation": [row],
                "positions": position_rows(row, total, count, self.cfg.position_buckets)}

    def unread(self, common: dict, status: str, reason: str) -> dict[str, list[dict]]:
        return {"extrapolation": [{**common, "stride": stride_for(self.cfg, common["eval_len"]), "status": status,
                                   "reason": reason, "tokens": 0}]}

    def finish(self, rows: list[dict]) -> list[dict]:
        return rows


def evaluate_run(run_dir: Path, cfg: EvalConfig, device: str = "auto", data_cache=None,
                 task: str | None = None, attention: list[dict] | None = None, out: Path | None = None
                 ) -> tuple[list[dict], list[dict], list[dict]]:
    """Rows for extrapolation.csv, positions.csv and windows.csv of one finished run (merged into
    out/*.csv cell by cell, given `out`); given a list `attention`, the rows of attention.csv are
    appended to it (the weights' measures at every length, posbench.attention_measures)."""
    reader = TrainedReader(run_dir, cfg, device, task)
    data_cache = {} if data_cache is None else data_cache
    spec = reader.spec
    if spec.data not in data_cache:
        data_cache[spec.data] = load_tokens(spec.data)
    data: TokenData = data_cache[spec.data]
    measure = Perplexity(cfg, data.test, {"mode": cfg.mode, "corpus": data.fingerprint}, data.valid, attention)
    done = sweep(reader, measure, cfg.lengths, out)
    return done["extrapolation"], done["positions"], done["windows"]


def non_finite(loss: float, total: torch.Tensor, count: torch.Tensor, length: int) -> str:
    """The reason of a row whose loss is not a number: what it is, and the first position of the
    window whose loss is not finite (total, count: per position of the window)."""
    bad = ((~torch.isfinite(total)) & (count > 0)).nonzero()
    where = f", first at position {int(bad[0])} of the window" if len(bad) else ""
    return f"non-finite loss ({loss}) at {length} positions{where}: the scheme's outputs overflow or are undefined there"


def loss_interval(loss: float, window_loss: list[float], block: int) -> dict:
    """loss_se and the perplexity interval of a row, from its windows' losses: exp of the loss's
    interval, whose lower end stops at a loss of 0 (perplexity 1), below which no mean
    cross-entropy lies (a few windows far apart give a t-interval that reaches past it)."""
    se, blocks = stats.batch_se(window_loss, block)
    if blocks < 2:
        return {"loss_se": math.nan, "ppl_lo": math.nan, "ppl_hi": math.nan}
    lo, hi = stats.interval_from_se(loss, se, blocks - 1)
    return {"loss_se": se, "ppl_lo": math.exp(max(lo, 0.0)), "ppl_hi": math.exp(hi)}


def window_rows(row: dict, starts: torch.Tensor, window_loss: torch.Tensor) -> list[dict]:
    keep = ("run_id", "task", "scheme", "params", "seed", "train_len", "eval_len", "mode", "stride",
            "scaling", "extension", "position_draws", "corpus", *extension_columns(None))
    # `float` for an RFS run: without it its windows would read as a randomized run's (+randomized)
    base = {k: row[k] for k in keep} | {"position_sampling": row.get("position_sampling", "")}
    return [base | {"window": i, "start": int(s), "loss": float(v)}
            for i, (s, v) in enumerate(zip(starts.tolist(), window_loss.tolist()))]


def bucket_edges(length: int, buckets: int) -> list[int]:
    """Log-spaced bucket edges over window positions 0..length: fine near the start of the window,
    where the early-token curse and the training length sit, coarse far out."""
    raw = torch.logspace(0, math.log10(length), buckets).round().long().tolist()
    return sorted({0, *raw, length})


def position_rows(row: dict, total: torch.Tensor, count: torch.Tensor, buckets: int) -> list[dict]:
    edges = bucket_edges(total.shape[0], buckets)
    out = []
    for b, (lo, hi) in enumerate(zip(edges[:-1], edges[1:])):
        n = float(count[lo:hi].sum())
        if n == 0:
            continue
        keep = ("run_id", "scheme", "train_len", "eval_len", "mode", "stride", "scaling", "extension")
        out.append({k: row[k] for k in keep}
                   | {"bucket": b, "position_start": lo, "position_end": hi - 1, "tokens": int(n),
                      "loss": float(total[lo:hi].sum()) / n})
    return out


def position_keys(rows: list[dict[str, str]], cfg: EvalConfig) -> set[tuple[str, ...]]:
    """The positions.csv keys that go with these extrapolation.csv rows: one per bucket that holds
    a scored position (a sliding window scores its last `stride`); none for an unsupported length
    or one that failed before scoring."""
    keys = set()
    for r in rows:
        if r["status"] == "unsupported" or (r["status"] == "failed" and r["tokens"] in ("0", "")):
            continue  # nothing scored: no positions
        length = int(r["eval_len"])
        first = length - int(r["stride"]) if r["mode"] == "sliding" else 0
        edges = bucket_edges(length, cfg.position_buckets)
        keys |= {
            (r["run_id"], r["eval_len"], r["mode"], r["stride"], r["scaling"], r["extension"], str(b))
            for b, end in enumerate(edges[1:]) if end > first
        }
    return keys
