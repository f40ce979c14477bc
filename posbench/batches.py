"""Training batches, one interface for every kind of data: (tokens, targets, loss mask, positions).

- `LMWindows`: a text corpus as random windows of train_len tokens, every target scored (no mask),
  exactly the draws of the training loop before probes trained on examples, so LM runs keep their
  numbers and run_ids.
- `PoseWindows`: windows of train_len in PoSE's two chunks, positions skip-wise up to a child's
  target length (posbench.extending).
- `ProbeExamples`: a probe's whole examples, one per row, of lengths drawn across the length
  curriculum (posbench.probes.base), padded at the end; only the answer tokens carry loss, as in
  Zoology and the randomized-PE suite (labels -100 elsewhere there, a zero mask here).

A source also validates: the mean loss of what it scores on held-out data (and, for probes, the
per-answer accuracy at the training length: the learning curve of the run's log). training.py draws
every batch through `sample` and knows nothing else about the data.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from posbench.errors import PosbenchError
from posbench.positions import pose_positions, training_bound, training_positions
from posbench.probes import TOKENIZER, Probe

VALID_EXAMPLES = 256  # held-out probe examples at the training length, scored at every eval_interval


@dataclass
class Batch:
    tokens: torch.Tensor  # (B, T) inputs
    targets: torch.Tensor  # (B, T) next tokens
    # (B, T) weight of each target, 0 where it carries no loss, scaled so that its sum is B: the sum
    # of weighted losses over B rows is then the mean over scored targets, and stays so over the
    # row slices of data-parallel ranks. None: every target is scored alike.
    mask: torch.Tensor | None
    positions: torch.Tensor | None  # (T,) positions; None: 0..T-1
    # Inputs that are padding (the ends of examples shorter than T): computed on, scored nowhere.
    padding: int = 0

    def to(self, device) -> Batch:
        def move(x):
            return None if x is None else x.to(device)

        return Batch(move(self.tokens), move(self.targets), move(self.mask), move(self.positions), self.padding)

    @property
    def scored(self) -> int:
        """The targets that carry loss: every one of an LM window, the answer tokens of a probe."""
        return self.targets.numel() if self.mask is None else int((self.mask > 0).sum())


def masked_mean(losses: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """The mean of the scored losses (B, T): all of them without a mask."""
    if mask is None:
        return losses.mean()
    return (losses * mask).sum() / mask.shape[0]


class LMWindows:
    """Random windows of a token stream, every next token scored."""

    def __init__(self, stream: torch.Tensor, valid: torch.Tensor, t):
        if len(stream) < t.train_len + 2:
            raise PosbenchError(f"the training split ({len(stream)} tokens) is shorter than one window "
                                f"of train_len {t.train_len} plus its target")
        self.stream, self.valid, self.t = stream, valid, t
        self.bound = training_bound(t)  # every position of a batch is below it

    def sample(self, gen: torch.Generator) -> Batch:
        t = self.t
        starts = torch.randint(0, len(self.stream) - t.train_len - 1, (t.batch_size,), generator=gen)
        chunk = self.stream[starts[:, None] + torch.arange(t.train_len + 1)]  # (B, T + 1)
        return Batch(chunk[:, :-1], chunk[:, 1:], None, training_positions(t, gen))

    @torch.no_grad()
    def validate(self, model, device, autocast, batch: int = 16) -> dict[str, float]:
        """Mean loss over the first `eval_windows` non-overlapping windows of train_len."""
        t = self.t
        n = min(t.eval_windows, (len(self.valid) - 1) // t.train_len)
        if n < 1:
            raise PosbenchError(f"validation split is shorter than one window of {t.train_len}")
        model.eval()
        total = 0.0
        for i in range(0, n, batch):
            rows = torch.arange(i, min(n, i + batch))[:, None] * t.train_len + torch.arange(t.train_len + 1)
            chunk = self.valid[rows].to(device)
            with autocast:
                total += float(model.token_losses(chunk[:, :-1], chunk[:, 1:]).sum())
        model.train()
        return {"val_loss": total / (n * t.train_len)}


class PoseWindows(LMWindows):
    """PoSE (Zhu et al., ICLR 2024; dwzhu-pku/PoSE `train_preprocess_function_pose`): each row is
    two chunks of one text, chunk 0 its first l_0 tokens, chunk 1 the L_c - l_0 tokens that end
    e ~ U{L_c..5 L_c} tokens after its start (the reference's content skip, within 5 L_c tokens of
    text), read at positions that skip as `pose_positions` draws them up to the target length.
    Every target is the token that follows its input in the text (the reference also scores chunk
    0's last input against chunk 1's first token). The positions are drawn once per batch, which
    the rows share (Batch.positions is (T,)); the reference draws them per example."""

    SPAN = 5  # L_x = 5 L_c tokens of text per row, as the reference truncates

    def __init__(self, stream: torch.Tensor, valid: torch.Tensor, t, target: int):
        super().__init__(stream, valid, t)
        if len(stream) < self.SPAN * t.train_len + 2:
            raise PosbenchError(f"the training split ({len(stream)} tokens) is shorter than PoSE's "
                                f"{self.SPAN} x {t.train_len} tokens of text per row")
        self.target = target
        self.bound = training_bound(t, target)

    def sample(self, gen: torch.Generator) -> Batch:
        t, length = self.t, self.t.train_len
        pos, first = pose_positions(length, self.target, gen)
        span = self.SPAN * length
        starts = torch.randint(0, len(self.stream) - span - 1, (t.batch_size,), generator=gen)
        ends = torch.randint(length, span + 1, (t.batch_size,), generator=gen)  # e, from the row's start
        head = starts[:, None] + torch.arange(first)  # (B, l_0)
        tail = (starts + ends - (length - first))[:, None] + torch.arange(length - first)  # (B, L_c - l_0)
        offsets = torch.cat([head, tail], dim=1)  # (B, L_c)
        return Batch(self.stream[offsets], self.stream[offsets + 1], None, pos)


def example_rows(examples, length: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inputs, targets and answer mask (B, length) of examples of at most `length` tokens, padded
    at the end: a target is scored where it is an answer token."""
    rows = torch.full((len(examples), length + 1), TOKENIZER.pad_id, dtype=torch.long)
    mask = torch.zeros(len(examples), length)
    for b, e in enumerate(examples):
        rows[b, : len(e.tokens)] = torch.tensor(e.tokens)
        mask[b, torch.tensor(e.answer_positions) - 1] = 1.0  # answer token p is the target of input p - 1
    return rows[:, :-1], rows[:, 1:], mask


def answer_verdicts(hit: torch.Tensor, examples) -> list[list[bool]]:
    """Per example, whether each answer is right: `hit` (B, L) says whether the prediction at each
    input position is the next token, so hit[:, p - 1] judges token p; an answer is right when all
    its tokens are."""
    return [[bool(hit[b, torch.tensor(a) - 1].all()) for a in e.answers] for b, e in enumerate(examples)]


class ProbeExamples:
    """A probe's examples, one per row, lengths across the curriculum up to train_len; with a
    `target` (a PoSE child, posbench.extending), read at PoSE's skip-wise positions up to it."""

    def __init__(self, probe: Probe, t, target: int | None = None):
        probe.training_example(random.Random(0), t.train_len)  # a train_len too short fails here
        self.probe, self.t, self.target = probe, t, target
        self.bound = training_bound(t, target)  # every position of a batch is below it
        rng = random.Random(f"{probe.name}:valid")
        self.valid = [probe.example(rng, t.train_len) for _ in range(VALID_EXAMPLES)]

    def sample(self, gen: torch.Generator) -> Batch:
        t = self.t
        seeds = torch.randint(0, 2**62, (t.batch_size,), generator=gen).tolist()
        examples = [self.probe.training_example(random.Random(s), t.train_len) for s in seeds]
        x, y, mask = example_rows(examples, t.train_len)
        pos = pose_positions(t.train_len, self.target, gen)[0] if self.target else training_positions(t, gen)
        return Batch(x, y, mask * (len(examples) / mask.sum()), pos, int((x == TOKENIZER.pad_id).sum()))

    @torch.no_grad()
    def validate(self, model, device, autocast, batch: int = 64) -> dict[str, float]:
        """Answer-token loss and per-answer accuracy of the held-out examples at train_len. A run
        on randomized positions reads them at sorted draws from [0, randomize_max), as it trains
        and as `posbench probe` scores it (one fixed draw per batch of examples, the same at
        every check); at 0..L-1, positions it rarely saw, it would read lower than it scores and
        never meet its early stop."""
        model.eval()
        loss, scored, right, answers = 0.0, 0.0, 0, 0
        for i in range(0, len(self.valid), batch):
            chunk = self.valid[i: i + batch]
            x, y, mask = (v.to(device) for v in example_rows(chunk, self.t.train_len))
            pos = training_positions(self.t, torch.Generator().manual_seed(i))
            with autocast:
                logits = model(x, None if pos is None else pos.to(device))
            losses = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten(),
                                                       reduction="none").view(y.shape)
            loss += float((losses * mask).sum())
            scored += float(mask.sum())
            judged = answer_verdicts((logits.argmax(-1) == y).cpu(), chunk)
            right += sum(sum(v) for v in judged)
            answers += sum(len(v) for v in judged)
        model.train()
        return {"val_loss": loss / max(scored, 1.0), "val_accuracy": right / max(answers, 1)}


def source_for(spec, data):
    """The batch source of a run: its probe's examples, or windows of its token data."""
    from posbench.probes import PROBES, parse_probe, probe_name

    pose = spec.extension.target_len if spec.extension is not None and spec.extension.pose else None
    if probe_name(spec.data.spec) in PROBES:
        return ProbeExamples(parse_probe(spec.data.spec), spec.train, pose)
    if pose:
        return PoseWindows(data.train, data.valid, spec.train, pose)
    return LMWindows(data.train, data.valid, spec.train)
