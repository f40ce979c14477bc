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
from typing import Callable, Protocol

import torch

from posbench import results, stats
from posbench.attention import observe
from posbench.attention_measures import Recorder
from posbench.config import EvalConfig
from posbench.data import TokenData, load_tokens
from posbench import plugins
from posbench.errors import PosbenchError, first_line, out_of_memory
from posbench.extension import columns as extension_columns
from posbench.layout import run_prefix, takes_rope_scaling
from posbench.positions import evaluation_columns, evaluation_positions, randomized
from posbench.progress import Bar
from posbench.probes import PROBES, probe_name
from posbench.schemes import SCHEMES, PositionLimitError
from posbench.policies import Policy, PolicyFailure, from_eval, make, refuse_stale, specs
from posbench.device import autocast, resolve_device
from posbench.runs import FINAL, RunSpec, data_spec, load_spec, load_trained

ATTN_BYTES = 512 * 2**20  # cap on one batch's attention scores (B * H * L * L floats)


@dataclass(frozen=True)
class Variant:
    """One eval-time configuration of a run: RoPE scaling and/or a position-table extension."""

    scaling: Policy = make()
    extension: str = "none"

    @property
    def scaling_label(self) -> str:
        return self.scaling.label


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


def on_probe(run_dir: Path) -> bool:
    """Whether a run trained on a probe's examples (its config names a probe as its data)."""
    try:
        spec = data_spec(run_dir)
    except PosbenchError:
        return False  # a damaged config fails with its own message where the run is loaded
    return probe_name(spec) in PROBES


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


def detection_windows(valid: torch.Tensor, length: int, count: int, seed: int = 0) -> torch.Tensor:
    """(count, L + 1) windows of the token stream `valid` (a validation split) at starts drawn
    uniformly with `seed`: the text DPE's detection scores its trial scales on."""
    room = len(valid) - length - 1
    if room < 0:
        raise PosbenchError(f"dpe: the detection text ({len(valid)} tokens) is shorter than one window of {length}")
    starts = torch.randint(0, room + 1, (count,), generator=torch.Generator().manual_seed(seed))
    return valid[starts[:, None] + torch.arange(length + 1)]


def rotary_pairs(layout) -> tuple[int, int]:
    """(rotary pairs, training length) of a layout's RoPE layers, the fewest pairs where they differ."""
    rotary = [s for s in layout.schemes if hasattr(s, "set_scaling")]
    return min(s.rotary_dim // 2 for s in rotary), rotary[0].dims.train_len


@torch.inference_mode()
def detect_dpe(scorer, set_scaling, scaling: Policy, pairs: int, train_len: int, length: int,
               tokens: torch.Tensor) -> Policy:
    """A detecting policy's settings at `length` (its `detect` hook: DPE's scales), each trial scored
    by the mean loss of `scorer` on the windows `tokens` (B, L + 1); the policy found is set."""
    def loss(trial: Policy) -> float:
        set_scaling(trial)
        return float(scorer.losses(tokens).mean())

    found = scaling.detect(loss, pairs, length, train_len)
    set_scaling(found)
    return found


def dpe_note(scaling: Policy, text: str = "validation windows") -> str:
    """The reason column of a row of a detecting policy: DPE's scales it read with, and whence
    (detected on `text`); another policy's settings as its label names them."""
    if scaling.name != "dpe":
        return f"{scaling.label} (detected on {text})"
    how = f"detected on {text}" if scaling.detected else "given"
    return f"dpe scales {'-'.join(f'{s:g}' for s in scaling.scales)} ({how})"


def trained_dpe(model, dev, dtype: str, scaling: Policy, length: int, tokens: torch.Tensor, text: str) -> str:
    """A trained run's DPE scales at `length`, detected on the windows `tokens` (`text` says what
    they are) and set on its layout: the note its rows carry."""
    found = detect_dpe(TrainedScorer(model, dev, dtype, 0), model.layout.set_scaling, scaling,
                       *rotary_pairs(model.layout), length, tokens)
    return dpe_note(found, text)


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


def windows_per_forward(length: int, heads: int, batch_tokens: int) -> int:
    """Windows of `length` scored by one forward: batch_tokens' worth, its attention scores within
    ATTN_BYTES."""
    return max(1, min(batch_tokens // length, ATTN_BYTES // (4 * heads * length * length)))


class Scorer(Protocol):
    """What perplexity asks of a model, trained here or pretrained (posbench.pretrained)."""

    def losses(self, tokens: torch.Tensor) -> torch.Tensor:
        """Windows of tokens (B, L + 1) -> the loss of each next token (B, L)."""

    def per_forward(self, length: int) -> int:
        """How many windows of `length` one call of `losses` takes."""


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


def evaluate_run(run_dir: Path, cfg: EvalConfig, device: str = "auto", data_cache=None,
                 task: str | None = None, attention: list[dict] | None = None
                 ) -> tuple[list[dict], list[dict], list[dict]]:
    """Rows for extrapolation.csv, positions.csv and windows.csv of one finished run; given a
    list `attention`, the rows of attention.csv are appended to it (the weights' measures at
    every length, posbench.attention_measures)."""
    dev = resolve_device(device)
    spec, model, _ = load_trained(run_dir, dev)
    data_cache = {} if data_cache is None else data_cache
    if spec.data not in data_cache:
        data_cache[spec.data] = load_tokens(spec.data)
    data: TokenData = data_cache[spec.data]
    stream = data.test
    base = {
        "run_id": spec.run_id, "task": task or spec.task, "scheme": spec.scheme,
        "params": model.layout.describe(), "seed": spec.seed, "train_len": spec.original_len,
        "mode": cfg.mode, **extension_columns(spec.extension), **evaluation_columns(spec.train, cfg.position_draws),
        **results.provenance(dev.type, spec.train.dtype, data.fingerprint),
    }
    draws = max(1, base["position_draws"])
    rows, positions, per_window = [], [], []
    for variant in variants_for(spec, cfg, model.layout):
        model.layout.set_scaling(variant.scaling)
        model.layout.set_extension(variant.extension)
        for length in cfg.lengths:
            row = {**base, "eval_len": length, "ratio": length / spec.original_len,
                   "stride": stride_for(cfg, length), "scaling": variant.scaling_label, "extension": variant.extension,
                   "backend": model.layout.backends(dev, model.backend), **variant.scaling.provenance()}
            total = count = window_loss = 0
            keys = key_tokens(cfg, None, spec.original_len)
            recorder = Recorder(model.layout.spans, spec.train.train_len) if attention is not None else None
            # The explicit path is the only one that forms the weights: a run already on it is
            # recorded while it is scored, any other by a second pass over the same windows.
            inline = recorder is not None and row["backend"] == "explicit"
            note = ""
            try:
                if variant.scaling.detects:
                    note = trained_dpe(model, dev, spec.train.dtype, variant.scaling, length,
                                       detection_windows(data.valid, length, cfg.dpe_windows), "validation windows")
                for draw in range(draws):
                    pos = evaluation_positions(spec.train, length, draw)
                    with observe(recorder if inline else None):
                        scorer = TrainedScorer(model, dev, spec.train.dtype, cfg.batch_tokens, pos)
                        if keys is not None:  # the short windows at the positions of their own length
                            keys.scorer = TrainedScorer(model, dev, spec.train.dtype, cfg.batch_tokens,
                                                        evaluation_positions(spec.train, keys.context, draw))
                        t, c, starts, w = score(scorer, stream, length, cfg, cfg.lengths, keys=keys)
                    total, count, window_loss = total + t, count + c, window_loss + w
                    if recorder is not None and not inline:
                        record_attention(model, stream, length, cfg, dev, spec.train.dtype, pos, recorder)
            except PositionLimitError as e:
                rows.append({**row, "status": "unsupported", "reason": str(e), "tokens": 0})
                continue
            except Exception as e:
                reason = failure(e, length)
                if reason is None:
                    raise
                rows.append({**row, "status": "failed", "reason": reason, "tokens": 0})
                continue
            # Every draw scores the same tokens: means over draws, per window index and per window.
            total, count, window_loss = total / draws, count / draws, window_loss / draws
            loss = float(total.sum() / count.sum())
            status = "ok" if math.isfinite(loss) else "failed"
            rows.append({**row, "tokens": int(count.sum()), "loss": loss, "ppl": math.exp(loss),
                         **loss_interval(loss, window_loss.tolist(), correlated_windows(cfg.mode, length, row["stride"])),
                         **(keys.columns() if keys is not None else {}), "status": status,
                         "reason": note if status == "ok" else non_finite(loss, total, count, length)})
            positions += position_rows(row, total, count, cfg.position_buckets)
            per_window += window_rows(row, starts, window_loss)
            if recorder is not None:
                kept = {k: v for k, v in row.items() if k != results.POLICY_SHA}  # attention.csv has no such column
                attention += [{**kept, **r, "backend": "explicit"} for r in recorder.rows()]
    return rows, positions, per_window


def record(out: Path, rows: list[dict], positions: list[dict], per_window: list[dict]) -> None:
    """Merge what a reading measured into out/windows.csv, extrapolation.csv and positions.csv, in
    that order: positions.csv, last, is what tells a resumed grid that a cell was evaluated. Trained
    runs and pretrained models alike."""
    results.merge_rows(out, "windows", per_window)
    results.merge_rows(out, "extrapolation", rows)
    results.merge_rows(out, "positions", positions)


def failure(e: Exception, length: int) -> str | None:
    """What a row says when scoring at `length` raised `e`: the error's first line, led by the
    plug-in file and line it arose at, and for an index out of range the hint that a finite table
    declares its limit. None for an error that is not the scheme's (bad input, out of memory),
    which stops the command as before."""
    if isinstance(e, PolicyFailure):
        return f"at {length} positions: {e}"
    if out_of_memory(e) or (isinstance(e, PosbenchError) and plugins.blame(e) is None):
        return None
    said = plugins.blame(e) or f"{type(e).__name__}: {first_line(e)}"
    return f"at {length} positions: {said}{limit_hint(e)}"


def non_finite(loss: float, total: torch.Tensor, count: torch.Tensor, length: int) -> str:
    """The reason of a row whose loss is not a number: what it is, and the first position of the
    window whose loss is not finite (total, count: per position of the window)."""
    bad = ((~torch.isfinite(total)) & (count > 0)).nonzero()
    where = f", first at position {int(bad[0])} of the window" if len(bad) else ""
    return f"non-finite loss ({loss}) at {length} positions{where}: the scheme's outputs overflow or are undefined there"


def limit_hint(e: BaseException) -> str:
    """For an index out of range (a table read past its last row): how a scheme says where its
    table ends, so that evaluation records those lengths as beyond it."""
    text = str(e)
    if isinstance(e, IndexError) or "out of range" in text or "out of bounds" in text:
        return ("; a scheme with a finite table declares it with position_limit() and raises "
                "PositionLimitError past it (posbench/docs/plugins.md)")
    return ""


def record_attention(model, stream: torch.Tensor, length: int, cfg: EvalConfig, device, dtype: str,
                     pos: torch.Tensor | None, recorder: Recorder) -> None:
    """The windows `score` reads, run again with every layer on the explicit path, each
    layer's weights seen by `recorder`."""
    forced, model.backend = model.backend, "explicit"
    try:
        with observe(recorder):
            score(TrainedScorer(model, device, dtype, cfg.batch_tokens, pos), stream, length, cfg, cfg.lengths)
    finally:
        model.backend = forced


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


def extrapolate(runs_dir: Path | str, cfg: EvalConfig, schemes: list[str] | None = None,
                out: Path | str | None = None, device: str = "auto", progress: bool = False,
                runs: list[Path] | None = None, attention: bool = False) -> list[dict]:
    """Evaluate every finished run (or those of `schemes`); merge rows into out/*.csv (with
    `attention`, attention.csv too)."""
    runs = find_runs(runs_dir, schemes) if runs is None else runs
    found = len(runs)
    runs = [r for r in runs if not on_probe(r)]  # scored by `posbench probe`, not by perplexity
    if not runs:
        named = f" of schemes {', '.join(schemes)}" if schemes else ""
        probes = f" ({found} trained on probes: score them with `posbench probe`)" if found else ""
        raise PosbenchError(f"no trained runs{named} on text in {runs_dir}{probes}; run `posbench train` first")
    for run_dir in runs:  # every run's plug-ins and config before any run is evaluated or a row rewritten
        load_spec(run_dir)
    out = Path(out or runs_dir)
    tables = ("windows", "extrapolation", "positions") + (("attention",) if attention else ())
    for table in tables:  # a damaged table fails before any is written
        results.read_rows(results.table_path(out, table))
    refuse_stale(results.read_rows(results.table_path(out, "extrapolation")),
                 [from_eval(k, cfg) for k in specs(cfg)], str(results.table_path(out, "extrapolation")))
    cache: dict = {}
    all_rows = []
    with Bar(progress, "run", lines=False) as bar:
        bar.start("extrapolate", len(runs))
        for run_dir in runs:
            measured = [] if attention else None
            rows, positions, per_window = evaluate_run(run_dir, cfg, device, cache, attention=measured)
            if measured:
                results.merge_rows(out, "attention", measured)
            record(out, rows, positions, per_window)
            all_rows += rows
            bar.step(run_dir.name)
    return all_rows
