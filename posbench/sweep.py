"""One sweep for every evaluation: a model x its eval-time policies x lengths x a measure.

A model is read through a `Reader`, of which there are two: a run trained here
(posbench.readers.TrainedReader) and a pretrained model (posbench.pretrained.Pretrained). A
measure (perplexity, posbench.evaluate.Perplexity; prompt verdicts, posbench.probing.Verdicts)
says what one cell, a policy at a length, reads and which rows it writes. The sweep alone owns
what every evaluation shares:

- **forwards that repeat**: a policy whose forward at a length is the one another policy already
  read there (the same frequencies and attention factor: every rescaling at s = 1) is not read
  again; its rows carry the numbers of the first, and say so in `reason`;
- **detection**: a policy that finds its settings at the evaluation length (DPE's scales) finds
  them on what the measure offers (validation windows, or the length's first prompt) before the
  cell is read; its rows say what it found;
- **status rows**: a cell past a scheme's declared limit is `unsupported`; a cell whose code
  fails (an index past an undeclared table, a plug-in's exception, non-finite frequencies) is
  `failed` with the error's first line, and the other cells are read; an error that is not the
  cell's (bad input, out of memory, Ctrl-C) stops the sweep;
- **merging and resuming**: each cell's rows are merged into the output folder as the cell is
  done, and a cell the folder holds already for the same model, measure and policy (`--resume`)
  is kept, not read again.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Hashable, Iterable, Protocol

import torch

from posbench import plugins, results
from posbench.errors import PosbenchError, first_line, out_of_memory
from posbench.policies import Policy, PolicyFailure, make
from posbench.schemes import PositionLimitError

Cell = dict[str, list[dict]]  # a cell's rows by table; the measure's own table first


@dataclass(frozen=True)
class Variant:
    """One eval-time configuration of a model: a policy (RoPE scaling) and/or, for a trained run's
    learned table, a position-table extension."""

    scaling: Policy = make()
    extension: str = "none"

    @property
    def scaling_label(self) -> str:
        return self.scaling.label


class Scorer(Protocol):
    """What perplexity asks of a model: the loss of each next token."""

    def losses(self, tokens: torch.Tensor) -> torch.Tensor:
        """Windows of tokens (B, L + 1) -> the loss of each next token (B, L)."""

    def per_forward(self, length: int) -> int:
        """How many windows of `length` one call of `losses` takes."""


class Reader(Protocol):
    """What the sweep needs of a model."""

    columns: dict  # the columns that name the model in every row (run_id, scheme, seed, provenance)
    train_len: int  # its training length (a pretrained model: its context)
    draws: int  # the position draws each cell reads (1 but for a run trained on randomized positions)
    extension: str  # the learned table's extension it reads with now ("none" but for a trained run's)

    def variants(self) -> list[Variant]:
        """The eval-time variants that apply to it, each checked so that a bad one fails first."""

    def set(self, variant: Variant) -> None:
        """Read with `variant` from now on."""

    def cell(self, variant: Variant, length: int) -> dict:
        """The columns of a cell's rows beyond `columns`: the policy's label and file, the backend."""

    def distinct(self, scaling: Policy, length: int) -> Hashable:
        """What a forward at `length` depends on under `scaling` (set): equal for forwards alike."""

    def scorer(self, length: int, draw: int = 0, batch_tokens: int = 0) -> Scorer:
        """Losses of windows of `length` at the positions of `draw`, `batch_tokens` a forward (0: one window)."""

    def rotary_pairs(self) -> tuple[int, int]:
        """(rotary pairs, training length) of its RoPE: what a detecting policy searches over."""

    def answers(self, prompts: list, length: int, draw: int = 0) -> Iterable[list[bool]]:
        """Per prompt, in order, whether each of its answers is the model's: teacher-forced for a
        trained run (its argmax at every answer token), greedy decoding for a pretrained model."""


class Measure(Protocol):
    """What one cell reads and writes."""

    tables: tuple[str, ...]  # the tables its rows go to, merged in this order; the last says a cell is done
    columns: dict  # what its rows say beyond the model's columns (the task, the corpus, the probe)
    gates: bool  # whether `finish` may change a variant's rows once all its lengths are read

    def kept(self, common: dict) -> Cell | None:
        """The cell's rows as the output folder holds them already (`--resume`), or None."""

    def detection(self, length: int) -> tuple[torch.Tensor, int, str]:
        """Where a detecting policy finds its settings at `length`: windows (B, L' + 1), L', and what they are."""

    def read(self, reader: Reader, length: int, common: dict):
        """What the cell measures (forwards run here), shared with a policy whose forward repeats it."""

    def rows(self, common: dict, result, reason: str) -> Cell:
        """The cell's rows from what `read` measured; `reason` says whence (DPE's scales, a shared forward)."""

    def unread(self, common: dict, status: str, reason: str) -> Cell:
        """The rows of a cell that was not read: `unsupported` or `failed`, and why."""

    def finish(self, rows: list[dict]) -> list[dict]:
        """A variant's rows once all its lengths are read (a trained probe run's gate)."""


def sweep(reader: Reader, measure: Measure, lengths: Iterable[int], out: Path | None = None) -> Cell:
    """Every variant of `reader` x every length, read by `measure`: the rows by table. With `out`,
    each cell's rows are merged into out/*.csv as the cell is done (a measure that gates a
    variant's rows merges them again once gated)."""
    written: Cell = {table: [] for table in measure.tables}
    lengths = list(dict.fromkeys(lengths))
    read: dict[Hashable, tuple[object, str]] = {}  # forwards read, and by which policy
    for variant in reader.variants():
        reader.set(variant)
        group: list[Cell] = []
        for length in lengths:
            common = {**reader.columns, **measure.columns, "eval_len": length, "ratio": length / reader.train_len,
                      **reader.cell(variant, length)}
            cell = measure.kept(common)
            if cell is None:
                cell = read_cell(reader, measure, variant.scaling, length, common, read)
                if out is not None:
                    record(out, measure.tables, cell)
            elif not variant.scaling.detects:  # a policy with these frequencies later takes the kept rows
                read.setdefault(reader.distinct(variant.scaling, length), (Kept(cell), common["scaling"]))
            group.append(cell)
        main = measure.tables[-1]
        gated = measure.finish([r for c in group for r in c.get(main, [])])
        if out is not None and measure.gates and gated:
            results.merge_rows(out, main, gated)
        for table in measure.tables:
            written[table] += gated if table == main else [r for c in group for r in c.get(table, [])]
    return written


def read_cell(reader: Reader, measure: Measure, scaling: Policy, length: int, common: dict,
              read: dict[Hashable, tuple[object, str]]) -> Cell:
    """One cell: its policy's settings detected when it detects them, its forward read unless
    another policy of the sweep read the same one at this length, its rows; a status row when the
    cell cannot be read."""
    try:
        note = ""
        if scaling.detects:
            scaling, note = detect(reader, measure, scaling, length)
        key = reader.distinct(scaling, length)
        if key in read:
            result, label = read[key]
            note = note or results.shared_note(label)
            if isinstance(result, Kept):
                return result.relabelled(common, note)
        else:
            result = measure.read(reader, length, common)
            read[key] = (result, common["scaling"])
    except Exception as e:  # the cell fails: its rows say so, the other cells are read
        return measure.unread(common, **unread(e, length))
    return measure.rows(common, result, note)


@dataclass(frozen=True)
class Kept:
    """A cell's rows as the output folder held them (`--resume`), for a policy whose forward repeats it."""

    cell: Cell

    def relabelled(self, common: dict, reason: str) -> Cell:
        """The rows as the policy of `common` reads them: its columns, and `reason` saying whence."""
        return {table: [{**r, **{k: v for k, v in common.items() if k in r}, "reason": reason} for r in rows]
                for table, rows in self.cell.items()}


def record(out: Path, tables: tuple[str, ...], cell: Cell) -> None:
    """Merge a cell's rows into out/*.csv in the measure's order (the last table says the cell is done)."""
    for table in tables:
        if cell.get(table):
            results.merge_rows(out, table, cell[table])


def unread(e: Exception, length: int) -> dict:
    """The status and reason of a cell whose reading raised `e` at `length`: `unsupported` past a
    declared limit, `failed` with the error's first line for an error of the scheme's or policy's
    code; an error that is not theirs (bad input, out of memory, Ctrl-C) stops the sweep."""
    if isinstance(e, PositionLimitError):
        return {"status": "unsupported", "reason": str(e)}
    reason = failure(e, length)
    if reason is None:
        raise e
    return {"status": "failed", "reason": reason}


def failure(e: Exception, length: int) -> str | None:
    """What a row says when reading at `length` raised `e`: the error's first line, led by the
    plug-in file and line it arose at, and for an index out of range the hint that a finite table
    declares its limit. None for an error that is not the scheme's (bad input, out of memory),
    which stops the command."""
    if isinstance(e, PolicyFailure):
        return f"at {length} positions: {e}"
    if out_of_memory(e) or (isinstance(e, PosbenchError) and plugins.blame(e) is None):
        return None
    said = plugins.blame(e) or f"{type(e).__name__}: {first_line(e)}"
    return f"at {length} positions: {said}{limit_hint(e)}"


def limit_hint(e: BaseException) -> str:
    """For an index out of range (a table read past its last row): how a scheme says where its
    table ends, so that evaluation records those lengths as beyond it."""
    text = str(e)
    if isinstance(e, IndexError) or "out of range" in text or "out of bounds" in text:
        return ("; a scheme with a finite table declares it with position_limit() and raises "
                "PositionLimitError past it (posbench/docs/plugins.md)")
    return ""


# ---- detection (DPE) -----------------------------------------------------------------------------

def detect(reader: Reader, measure: Measure, scaling: Policy, length: int) -> tuple[Policy, str]:
    """A detecting policy's settings at `length`, found on the measure's detection windows and set
    on the model: the policy found and the note its rows carry."""
    tokens, at, text = measure.detection(length)
    found = detect_dpe(reader.scorer(at), lambda trial: reader.set(Variant(trial, reader.extension)),
                       scaling, *reader.rotary_pairs(), at, tokens)
    return found, dpe_note(found, text)


@torch.inference_mode()
def detect_dpe(scorer: Scorer, set_scaling, scaling: Policy, pairs: int, train_len: int, length: int,
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


def detection_windows(valid: torch.Tensor, length: int, count: int, seed: int = 0) -> torch.Tensor:
    """(count, L + 1) windows of the token stream `valid` (a validation split) at starts drawn
    uniformly with `seed`: the text DPE's detection scores its trial scales on."""
    room = len(valid) - length - 1
    if room < 0:
        raise PosbenchError(f"dpe: the detection text ({len(valid)} tokens) is shorter than one window of {length}")
    starts = torch.randint(0, room + 1, (count,), generator=torch.Generator().manual_seed(seed))
    return valid[starts[:, None] + torch.arange(length + 1)]
