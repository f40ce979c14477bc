"""Passkey retrieval (Mohtashami & Jaggi 2023; the test of the PI and YaRN papers): a random
number hidden at some depth inside repeated filler text, asked for at the end. Extrapolation is
then measured as retrieval accuracy instead of perplexity.

Training data is the data SPEC ``passkey``: many generated documents of this construction, alone
(not mixed with another corpus: a tiny model trained from scratch learns retrieval only from a
dense signal, and the passkey answer is a few tokens out of hundreds even so). A document is

    filler[:a] + "The pass key is K. Remember it. K is the pass key. " + filler[:b]
    + "What is the pass key? The pass key is " + K

where filler is "The grass is green. ... There and back again. " repeated and cut, K a random
`digits`-digit number and a + b fills the document to a random length in [MIN, MAX] characters
(tokens with the bytes tokenizer). The spec's options, comma-separated after ``passkey:``:
``SEED`` (or ``seed=SEED``), ``MIN-MAX`` (or ``len=MIN-MAX``), ``digits=N``, ``docs=N``. The
default, ``passkey`` = ``passkey:seed=0,len=128-256,digits=5,docs=40000``, suits a training
length of 256 bytes, or 128 tokens of a 300-token BPE: most documents fit a training window whole.

Evaluation: a trial at length L is a sequence of exactly L tokens, prompt and answer together:
filler, the key sentence after a fraction `depth` of the filler (0: first, 1: just before the
question), the question ending in "The pass key is ", then the answer (the `digits` digits with
the bytes tokenizer). The model reads the whole trial in one forward (teacher forcing), and a hit
is every answer token being the model's argmax given the tokens before it: for a causal model
that is exactly whether greedy decoding after the prompt spells the key, at one forward instead of
one per digit. No window is longer than L, so L = the training length is in-length for every
scheme. accuracy = hits / trials per (length, depth). Keys come from a generator seeded by the
seed, the length and the depth, so every scheme answers the same prompts. A randomized run reads
every trial once per position draw (`posbench.positions.evaluation_positions`, as perplexity
does): hits then count over the `position_draws` draws and accuracy = hits / (trials x draws).
"""

from __future__ import annotations

import json
import math
import random
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from posbench import results, stats
from posbench.config import EvalConfig, PasskeyConfig
from posbench.data import ByteTokenizer, Corpus, _fingerprint, load_tokenizer, load_tokens, split_documents
from posbench.errors import PosbenchError
from posbench.evaluate import ATTN_BYTES, find_runs, variants_for
from posbench.positions import evaluation_draws, evaluation_positions
from posbench.schemes import PositionLimitError
from posbench.train import RunSpec, autocast, load_trained, resolve_device

FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
QUESTION = "What is the pass key? The pass key is "


def key_sentence(key: str) -> str:
    return f"The pass key is {key}. Remember it. {key} is the pass key. "


# --- training data -------------------------------------------------------------------------


@dataclass(frozen=True)
class PasskeyData:
    """The options of a ``passkey`` data spec."""

    seed: int = 0
    min_len: int = 128  # characters per document, answer included
    max_len: int = 256
    digits: int = 5
    docs: int = 40000

    @property
    def fixed_len(self) -> int:
        """Characters of a document that are not filler."""
        return len(key_sentence("0" * self.digits)) + len(QUESTION) + self.digits


def parse_spec(spec: str) -> PasskeyData:
    kind, _, rest = spec.partition(":")
    if kind != "passkey":
        raise PosbenchError(f"not a passkey data spec: {spec!r}")
    values: dict[str, int] = {}
    usage = "use passkey[:SEED][,MIN-MAX][,digits=N][,docs=N]"
    for item in (p.strip() for p in rest.split(",") if p.strip()):
        key, eq, value = item.partition("=")
        if not eq:
            key, value = ("len", item) if "-" in item else ("seed", item)
        try:
            if key == "len":
                lo, hi = value.split("-")
                values["min_len"], values["max_len"] = int(lo), int(hi)
            elif key in ("seed", "digits", "docs"):
                values[key] = int(value)
            else:
                raise PosbenchError(f"unknown option {key!r} in data spec {spec!r}: {usage}")
        except ValueError:
            raise PosbenchError(f"bad {key} {value!r} in data spec {spec!r}: {usage}") from None
    cfg = PasskeyData(**values)
    if not 1 <= cfg.digits <= 18:
        raise PosbenchError(f"passkey digits must be in 1..18, got {cfg.digits}")
    if cfg.docs < 40:
        raise PosbenchError(f"passkey docs must be at least 40 (for the split), got {cfg.docs}")
    if not cfg.fixed_len <= cfg.min_len <= cfg.max_len:
        raise PosbenchError(
            f"passkey document lengths {cfg.min_len}-{cfg.max_len} are too short or reversed: "
            f"a document with {cfg.digits} digits needs at least {cfg.fixed_len} characters"
        )
    return cfg


def random_key(rng: random.Random, digits: int) -> str:
    return str(rng.randrange(10 ** (digits - 1), 10**digits))


def filler(n: int) -> str:
    return (FILLER * (n // len(FILLER) + 1))[:n]


def document(rng: random.Random, cfg: PasskeyData) -> str:
    key = random_key(rng, cfg.digits)
    free = rng.randint(cfg.min_len, cfg.max_len) - cfg.fixed_len
    before = rng.randint(0, free)
    return filler(before) + key_sentence(key) + filler(free - before) + QUESTION + key


def load_passkey(spec: str) -> Corpus:
    """The generated documents, split by the hash of their names like any other corpus."""
    cfg = parse_spec(spec)
    rng = random.Random(cfg.seed)
    names = [f"passkey-{i:07d}" for i in range(cfg.docs)]
    docs = [document(rng, cfg) for _ in names]
    fp = _fingerprint(names, [d.encode() for d in docs])
    return Corpus(spec, fp, split_documents(names, docs))


# --- evaluation ----------------------------------------------------------------------------

RATIOS = (1, 2, 4, 8)  # eval lengths, in training lengths, when the config names none
MAX_BATCH = 64


@dataclass(frozen=True)
class Trial:
    tokens: list[int]  # exactly the trial's length: prompt, then answer
    answer: int  # the last `answer` tokens are the answer
    key: str
    key_start: int  # index of the key sentence's first token


def lengths_for(cfg: PasskeyConfig, train_len: int) -> tuple[int, ...]:
    return cfg.lengths or tuple(r * train_len for r in RATIOS)


def _encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode_documents([text])[:-1].tolist()  # without the document separator


class Prompter:
    """Builds trials token by token with one tokenizer, so every trial is exactly L tokens."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._filler: list[int] = []

    def filler(self, n: int) -> list[int]:
        while len(self._filler) < n:
            self._filler = _encode(self.tokenizer, FILLER * (2 * len(self._filler) // 8 + 8))
        return self._filler[:n]

    def trial(self, key: str, length: int, depth: float) -> Trial:
        key_ids = _encode(self.tokenizer, key_sentence(key))
        end = _encode(self.tokenizer, QUESTION + key)
        # The answer: the fewest final tokens that spell the key (its digits with bytes; BPE may
        # merge digits, and the space before them, into fewer tokens).
        answer = next(n for n in range(1, len(end) + 1) if key in self.tokenizer.decode(end[-n:]))
        free = length - len(key_ids) - len(end)
        if free < 0:
            raise PosbenchError(
                f"passkey length {length} is too short: a trial needs at least {length - free} tokens "
                "(key sentence, question and answer)"
            )
        before = round(depth * free)
        tokens = self.filler(before) + key_ids + self.filler(free - before) + end
        return Trial(tokens, answer, key, before)

    def trials(self, length: int, depth: float, n: int, digits: int, seed: int) -> list[Trial]:
        """`n` trials; the keys depend on (seed, length, depth) only, not on the tokenizer."""
        rng = random.Random(f"passkey:{seed}:{length}:{depth!r}")
        return [self.trial(random_key(rng, digits), length, depth) for _ in range(n)]


@torch.inference_mode()
def retrieved(model, trials: list[Trial], device, dtype: str = "float32",
              pos: torch.Tensor | None = None) -> list[bool]:
    """Whether the model's greedy answer to each trial (all of one length) is the key; `pos`
    (L,) the trials' positions (None: 0..L-1).

    One forward over the whole trial, answer included (teacher forcing): a causal model's greedy
    answer is the key exactly when every answer token is the argmax given the right tokens
    before it, so this is greedy decoding's verdict at a fifth of the cost of decoding."""
    length = len(trials[0].tokens)
    per = max(1, min(MAX_BATCH, ATTN_BYTES // (4 * model.cfg.n_heads * length * length)))
    out = []
    pos = pos.to(device) if pos is not None else None
    for i in range(0, len(trials), per):
        chunk = trials[i: i + per]
        tokens = torch.tensor([t.tokens for t in chunk], device=device)  # (B, L)
        with autocast(device, dtype):
            guess = model(tokens, pos).argmax(-1)  # (B, L): guess[:, p] predicts tokens[:, p + 1]
        for b, t in enumerate(chunk):
            out.append(bool((guess[b, -t.answer - 1: -1] == tokens[b, -t.answer:]).all()))
    return out


def run_tokenizer(run_dir: Path, spec: RunSpec):
    """The tokenizer the run was trained with, and its corpus fingerprint."""
    try:
        fingerprint = json.loads((Path(run_dir) / "config.json").read_text()).get("corpus", "")
    except (OSError, ValueError) as e:
        raise PosbenchError(f"unreadable run config in {run_dir}: {e}") from None
    if spec.data.tokenizer == "bytes":
        return ByteTokenizer(), fingerprint
    try:
        return load_tokenizer(spec.data, fingerprint), fingerprint
    except Exception:  # the tokenizer cache is gone (another machine): rebuild it from the corpus
        data = load_tokens(spec.data)
        return load_tokenizer(spec.data, data.fingerprint), data.fingerprint


def row_keys(spec: RunSpec, cfg: PasskeyConfig, eval_cfg: EvalConfig, layout) -> set[tuple[str, ...]]:
    """The passkey.csv keys that evaluating this run writes."""
    return {
        (spec.run_id, str(n), results._fmt(float(d)), v.scaling_label, v.extension)
        for v in variants_for(spec, eval_cfg, layout)
        for n in lengths_for(cfg, spec.train.train_len) for d in cfg.depths
    }


def evaluate_run(run_dir: Path, cfg: PasskeyConfig, eval_cfg: EvalConfig, device: str = "auto",
                 task: str | None = None) -> list[dict]:
    """passkey.csv rows of one finished run: every variant x length x depth."""
    dev = resolve_device(device)
    spec, model, _ = load_trained(run_dir, dev)
    tokenizer, fingerprint = run_tokenizer(run_dir, spec)
    prompter = Prompter(tokenizer)
    lengths = lengths_for(cfg, spec.train.train_len)
    # Every prompt first: a length too short for the prompt fails before any model runs.
    cells = {(n, d): prompter.trials(n, d, cfg.trials, cfg.digits, cfg.seed) for n in lengths for d in cfg.depths}
    base = {
        "run_id": spec.run_id, "task": task or spec.task, "scheme": spec.scheme,
        "params": model.layout.describe(), "seed": spec.seed, "train_len": spec.train.train_len,
        "trials": cfg.trials, "position_draws": evaluation_draws(spec.train, eval_cfg.position_draws),
        **results.provenance(dev.type, spec.train.dtype, fingerprint),
    }
    draws = max(1, base["position_draws"])
    rows = []
    for variant in variants_for(spec, eval_cfg, model.layout):
        model.layout.set_scaling(variant.scaling)
        model.layout.set_extension(variant.extension)
        for length in lengths:
            common = {**base, "eval_len": length, "ratio": length / spec.train.train_len,
                      "scaling": variant.scaling_label, "extension": variant.extension,
                      "backend": model.layout.backends(dev, model.backend)}
            trials = [t for d in cfg.depths for t in cells[(length, d)]]
            hit = [0] * len(trials)
            try:  # every depth of a length in one batch, once per position draw
                for draw in range(draws):
                    pos = evaluation_positions(spec.train, length, draw)
                    hit = [h + v for h, v in zip(hit, retrieved(model, trials, dev, spec.train.dtype, pos))]
            except PositionLimitError as e:
                rows += [{**common, "depth": float(d), "status": "unsupported", "reason": str(e)} for d in cfg.depths]
                continue
            for k, depth in enumerate(cfg.depths):
                hits = sum(hit[k * cfg.trials: (k + 1) * cfg.trials])
                rows.append({**common, "depth": float(depth), "hits": hits,
                             "accuracy": hits / (cfg.trials * draws),
                             **stats.accuracy_columns(hits, cfg.trials * draws), "status": "ok", "reason": ""})
    return rows


def evaluate(runs_dir: Path | str, cfg: PasskeyConfig, eval_cfg: EvalConfig,
             schemes: list[str] | None = None, out: Path | str | None = None, device: str = "auto",
             progress: bool = False) -> list[dict]:
    """Passkey accuracy of every finished run (or those of `schemes`), merged into out/passkey.csv."""
    runs = find_runs(runs_dir, schemes)
    if not runs:
        named = f" of schemes {', '.join(schemes)}" if schemes else ""
        raise PosbenchError(f"no trained runs{named} in {runs_dir}; run `posbench train` first")
    out = Path(out or runs_dir)
    all_rows = []
    from rich.progress import Progress

    with Progress(disable=not progress, transient=True) as bar:
        task = bar.add_task("passkey", total=len(runs))
        for run_dir in runs:
            bar.update(task, description=f"passkey {run_dir.name}")
            rows = evaluate_run(run_dir, cfg, eval_cfg, device)
            results.merge_rows(out, "passkey", rows)
            all_rows += rows
            bar.advance(task)
    return all_rows


# --- tables and heatmaps -------------------------------------------------------------------


def accuracy_frame(rows):
    import pandas as pd

    from posbench.report import label

    df = pd.DataFrame(rows) if not isinstance(rows, pd.DataFrame) else rows.copy()
    df["label"] = df.apply(label, axis=1)
    df["accuracy"] = pd.to_numeric(df.get("accuracy"), errors="coerce")
    df["eval_len"] = df["eval_len"].astype(int)
    df["depth"] = df["depth"].astype(float)
    return df


def _cells(df) -> tuple[list[int], list[list[str]]]:
    """Schemes x lengths: accuracy (pooled over depths; interval over seeds or trials) as text, or the status."""
    from posbench.report import accuracy_cell, label_grid

    return label_grid(df, "accuracy", lambda n, g: accuracy_cell(g))


def _header(df, n: int) -> str:
    train = sorted(df["train_len"].astype(int).unique())
    return f"{n} ({n / train[0]:g}x)" if len(train) == 1 else str(n)


def accuracy_table(rows, title: str = "passkey retrieval accuracy (mean over depths)"):
    from rich.table import Table

    from posbench.report import ACCURACY_NOTE

    df = accuracy_frame(rows)
    lengths, body = _cells(df)
    train = ", ".join(map(str, sorted(df["train_len"].astype(int).unique())))
    table = Table(title=f"{title}; trained at {train}", caption=ACCURACY_NOTE)
    table.add_column("scheme")
    for n in lengths:
        table.add_column(_header(df, n), justify="right")
    for cells in body:
        table.add_row(*cells)
    return table


def accuracy_markdown(rows) -> str:
    from posbench.report import markdown_table

    df = accuracy_frame(rows)
    lengths, body = _cells(df)
    return markdown_table(["scheme"] + [_header(df, n) for n in lengths], body)


def heatmap_name(label: str) -> str:
    return "passkey_" + re.sub(r"[^A-Za-z0-9_.+-]", "_", label) + ".png"


def plot_heatmaps(rows, directory: Path | str) -> list[Path]:
    """One PNG per scheme variant: accuracy by depth (rows) and length (columns), annotated."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    df = accuracy_frame(rows)
    paths = []
    for name, g in sorted(df.groupby("label")):
        lengths = sorted(g["eval_len"].unique())
        depths = sorted(g["depth"].unique())
        acc = g.groupby(["depth", "eval_len"])["accuracy"].mean()
        grid = np.array([[acc.get((d, n), np.nan) for n in lengths] for d in depths])
        fig, ax = plt.subplots(figsize=(1.2 * len(lengths) + 2.2, 0.55 * len(depths) + 1.6))
        cmap = matplotlib.colormaps["RdYlGn"].with_extremes(bad="lightgrey")
        ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=0, vmax=1, aspect="auto")
        for i in range(len(depths)):
            for j in range(len(lengths)):
                v = grid[i, j]
                dark = not math.isnan(v) and (v < 0.15 or v > 0.85)  # the ends of the colour map
                ax.text(j, i, "n/a" if math.isnan(v) else f"{100 * v:.0f}", ha="center", va="center",
                        fontsize=9, color="white" if dark else "black")
        ax.set_xticks(range(len(lengths)), [_header(g, n) for n in lengths], fontsize=8)
        ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths], fontsize=8)
        ax.set_xlabel("prompt length (tokens)")
        ax.set_ylabel("key depth")
        train = ", ".join(map(str, sorted(g["train_len"].astype(int).unique())))
        ax.set_title(f"passkey accuracy (%): {name}, trained at {train}", fontsize=9)
        fig.tight_layout()
        path = directory / heatmap_name(name)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths
