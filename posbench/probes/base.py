"""What every probe shares: options parsed from its data spec, and examples of exactly L tokens in
the probe family's symbol vocabulary (posbench.probes.symbols) with the positions of each answer.

A probe instance is a list of segments: `Text` (given to the model), `Answer` (one verdict: a
queried value, an output digit) and `Fill` (haystack filler whose amount makes up the length; its
weight is its share of the filler). One generator makes every example, for training and for
scoring alike: `example(rng, L)` renders an instance as exactly L tokens. A probe states how an
instance grows with L (`grows`): a sized probe (copy, mqar, ...) takes the largest size that fits L
(more digits, more pairs) and fills the rest; the others keep their instance and fill the rest of L
with filler (passkey: more haystack). Training examples take lengths drawn uniformly from the
shortest instance up to the training length (the length curriculum of Ruoss et al. 2023), so the
prompt scored at the training length is one of the training distribution.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, ClassVar

from posbench import plugins
from posbench.errors import PosbenchError, did_you_mean
from posbench.matching import references_found
from posbench.probes.symbols import FILLER, TOKENIZER


@dataclass(frozen=True)
class Text:
    symbols: tuple[str, ...]


@dataclass(frozen=True)
class Answer:
    symbols: tuple[str, ...]


@dataclass(frozen=True)
class Fill:
    weight: float


Segment = Text | Answer | Fill


@dataclass(frozen=True)
class Example:
    tokens: list[int]  # exactly the example's length, answers included
    answers: list[list[int]]  # per answer (one verdict each), the positions of its tokens
    answer_text: str  # the answers, as symbols, for reading

    @property
    def answer_positions(self) -> list[int]:
        return [p for a in self.answers for p in a]


def filler(n: int) -> list[str]:
    """The first n symbols of the repeated filler sentences."""
    return list((FILLER * (n // len(FILLER) + 1))[:n])


def fill_sizes(weights: list[float], free: int) -> list[int]:
    """`free` units split by `weights` (summing to 1), by rounding the cumulative shares."""
    cuts, total = [0], 0.0
    for w in weights[:-1]:
        total += w
        cuts.append(round(total * free))
    cuts.append(free)
    return [b - a for a, b in zip(cuts, cuts[1:])]


def random_weights(rng: random.Random, n: int) -> list[float]:
    """n shares of the filler, uniformly random (the gaps between n - 1 sorted uniform cuts)."""
    cuts = sorted(rng.random() for _ in range(n - 1))
    return [b - a for a, b in zip([0.0, *cuts], [*cuts, 1.0])]


def fixed_tokens(segments: list[Segment]) -> int:
    return sum(len(s.symbols) for s in segments if not isinstance(s, Fill))


def render(segments: list[Segment], length: int, name: str) -> Example:
    """The segments as exactly `length` tokens, the filler sized to make up the rest."""
    free = length - fixed_tokens(segments)
    fills = [s.weight for s in segments if isinstance(s, Fill)]
    if free < 0 or (free > 0 and not fills):
        raise PosbenchError(f"{name} length {length} is too short: an example needs at least "
                            f"{length - free} tokens")
    sizes = iter(fill_sizes(fills, free))
    symbols: list[str] = []
    answers: list[list[int]] = []
    for s in segments:
        if isinstance(s, Fill):
            symbols += filler(next(sizes))
            continue
        if isinstance(s, Answer):
            answers.append(list(range(len(symbols), len(symbols) + len(s.symbols))))
        symbols += s.symbols
    text = " | ".join(" ".join(s.symbols) for s in segments if isinstance(s, Answer))
    return Example(TOKENIZER.encode(symbols), answers, text)


class Probe:
    """A synthetic task: its data spec options and its examples.

    Subclasses set `name`, `summary` (what it asks and its settings), `reference`, `options`
    (integer defaults), `grows` (what a longer example holds more of), write `instance`, and
    declare `chance`: the per-answer accuracy of a uniform guess over what an answer can be."""

    name: ClassVar[str]
    summary: ClassVar[str]
    reference: ClassVar[str]
    options: ClassVar[dict[str, int]] = {}
    grows: ClassVar[str] = "filler"
    sized: ClassVar[bool] = False  # the instance grows with the length (`size`)
    variant_name: ClassVar[str] = ""  # what variants vary (passkey: depth); "" for none
    least_digits: ClassVar[int] = 1  # the smallest `digits` option (0: a value symbol, see retrieval)
    revision: ClassVar[int] = 1  # raised when the generator changes, so rows' fingerprints tell them apart
    reads: ClassVar[str] = "symbols"  # posbench's symbol vocabulary: the models it trains (posbench.probes.text)

    def __init__(self, **values: Any):
        self.opts = {**self.options, **values}
        # min_length and size_for(length) depend on the options alone: each is computed once
        # (drawing a whole instance per call made them most of the cost of a training batch)
        self._sizes: dict[int, int] = {}
        self._min_length: int | None = None

    def __getattr__(self, key: str) -> Any:
        opts = self.__dict__.get("opts", {})
        if key in opts:
            return opts[key]
        raise AttributeError(key)

    def __eq__(self, other) -> bool:
        return type(self) is type(other) and self.opts == other.opts

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.settings()})"

    @classmethod
    def parse(cls, spec: str) -> Probe:
        """The probe of a data spec ``NAME[:key=value,...]``."""
        _, _, rest = spec.partition(":")
        usage = f"use {cls.name}" + (":" + ",".join(f"{k}={v}" for k, v in cls.options.items()) if cls.options else "")
        values: dict[str, int] = {}
        for item in (p.strip() for p in rest.split(",") if p.strip()):
            key, eq, value = (x.strip() for x in item.partition("="))
            if not eq or key not in cls.options:
                raise PosbenchError(f"unknown option {key!r} in data spec {spec!r}: {usage}")
            try:
                values[key] = int(value)
            except ValueError:
                raise PosbenchError(f"bad {key} {value!r} in data spec {spec!r}: {usage}") from None
        probe = cls(**values)
        probe.check()
        return probe

    def check(self) -> None:
        """Range checks of the options (subclasses add their own)."""
        if "digits" in self.opts and not self.least_digits <= self.digits <= 18:
            raise PosbenchError(f"{self.name} digits must be in {self.least_digits}..18, got {self.digits}")
        for key, value in self.opts.items():
            if value < 1 and key != "digits":
                raise PosbenchError(f"{self.name} {key} must be at least 1, got {value}")

    def settings(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.opts.items())

    @property
    def chance(self) -> float:
        raise NotImplementedError

    # --- what a probe writes ---------------------------------------------------------------

    def instance(self, rng: random.Random, size: int, variant: Any) -> list[Segment]:
        """The segments of one instance (`size` for sized probes; `variant` None: drawn at random)."""
        raise NotImplementedError

    def variants(self) -> tuple[Any, ...]:
        """The values of the variant a length is scored at (passkey: key depths)."""
        return (None,)

    def variant_label(self, variant: Any) -> str:
        return "" if variant is None else f"{self.variant_name}={variant:g}"

    # --- examples --------------------------------------------------------------------------

    def size_for(self, length: int) -> int:
        """A sized probe's largest size whose instance fits `length` tokens (0: none fits).
        Token counts depend on the size alone, so any generator measures them."""
        def fits(size: int) -> bool:
            return fixed_tokens(self.instance(random.Random(0), size, None)) <= length

        lo, hi = 0, length
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
        return lo

    def min_length(self) -> int:
        """The shortest example: the smallest instance with no filler."""
        if self._min_length is None:
            self._min_length = fixed_tokens(self.instance(random.Random(0), 1, None))
        return self._min_length

    def _size(self, length: int) -> int:
        if length not in self._sizes:
            self._sizes[length] = self.size_for(length)
        return self._sizes[length]

    def example(self, rng: random.Random, length: int, variant: Any = None) -> Example:
        """One example of exactly `length` tokens."""
        if not self.sized:
            return render(self.instance(rng, 0, variant), length, self.name)
        size = self._size(length)
        if size < 1:
            raise PosbenchError(f"{self.name} length {length} is too short: an example needs at least "
                                f"{self.min_length()} tokens")
        segments = self.instance(rng, size, variant)
        if not any(isinstance(s, Fill) for s in segments):  # filler before it makes up the length
            segments = [Fill(1.0), *segments]
        return render(segments, length, self.name)

    def training_example(self, rng: random.Random, max_len: int) -> Example:
        """An example of a length drawn uniformly from min_length() .. max_len."""
        lo = self.min_length()
        if max_len < lo:
            raise PosbenchError(f"{self.name} examples need at least {lo} tokens; train_len is {max_len}")
        return self.example(rng, rng.randint(lo, max_len))

    def prompts(self, length: int, variant: Any, n: int, seed: int) -> list[Example]:
        """A cell's `n` prompts: every scheme gets the same ones."""
        rng = random.Random(f"{self.name}:{seed}:{length}:{variant!r}")
        return [self.example(rng, length, variant) for _ in range(n)]


TEXT = "text"  # what a text probe reads: text through a pretrained model's tokenizer


@dataclass(frozen=True)
class TextPrompt:
    """One prompt of a text probe: its tokens, the references the output is judged against, the
    tokens to decode after it (`to_end`: fewer where the model writes its end token; `skip_special`:
    the output decoded without special tokens), and how it is judged (`check`: output text ->
    one verdict per reference). `identity` is what its fingerprint in prompts.csv is taken of."""

    tokens: list[int]
    references: tuple[str, ...]
    steps: int
    check: Callable[[str], list[bool]] = field(compare=False, repr=False)
    to_end: bool = True
    skip_special: bool = True
    identity: Any = None


def encode(tok, text: str) -> list[int]:
    """The tokens of `text` by the model's tokenizer `tok`, no special tokens added (as prompts are counted)."""
    return tok(text, add_special_tokens=False).input_ids


class TextProbe:
    """A probe a pretrained model reads as text. A subclass sets `name`, `summary`, `reference` (and
    `settings`, the [probes] keys it reads) and writes `prompts`; `variants`, `variant_label`,
    `verdicts` and `chance` have defaults (one variant; a reference found anywhere in the output,
    case-insensitive, as RULER's string_match_all; chance 0). Register it with
    `@posbench.probes.register`. The probe is made for one model: `tokenizer` is the model's."""

    name: ClassVar[str]
    summary: ClassVar[str]
    reference: ClassVar[str]
    settings: ClassVar[str] = "trials, seed"
    reads: ClassVar[str] = TEXT

    def __init__(self, tokenizer, cfg):
        self.tokenizer = tokenizer
        self.cfg = cfg  # the [probes] settings: trials, seed, ruler_essay

    @classmethod
    def check(cls, cfg) -> None:
        """One line for settings of `cfg` it cannot take, before any model loads."""

    def encode(self, text: str) -> list[int]:
        return encode(self.tokenizer, text)

    def prompt(self, text: str, references: tuple[str, ...], steps: int, identity: Any = None) -> TextPrompt:
        """A prompt of `text` judged by `verdicts` against `references` after `steps` decoded tokens."""
        references = tuple(references)
        return TextPrompt(self.encode(text), references, steps, partial(self.verdicts, references),
                          identity=identity if identity is not None else (text, references))

    def variants(self) -> tuple:
        return (None,)

    def variant_label(self, variant) -> str:
        return "" if variant is None else str(variant)

    def prompts(self, length: int, variant, trials: int, seed: int) -> list[TextPrompt]:
        """`trials` prompts of at most `length` tokens (the same for every policy and model of a tokenizer)."""
        raise NotImplementedError(f"text probe {self.name!r} writes no prompts")

    def verdicts(self, references: tuple[str, ...], output: str) -> list[bool]:
        """Per reference, whether the decoded output holds it."""
        return references_found(output, references)

    def chance(self, prompts: list[TextPrompt]) -> float:
        """The share of verdicts a guess gets right, over a cell's prompts."""
        return 0.0

    def spec(self) -> str:
        """The probes.csv `spec`: the probe and the settings its prompts depend on."""
        return self.name

    def corpus(self) -> str:
        """What the prompts are drawn from, after the tokenizer's name in the `corpus` column."""
        return ""


PROBES: dict[str, type[Probe]] = {}
TEXT_PROBES: dict[str, type[TextProbe]] = {}  # the probes a pretrained model reads as text (posbench.probes.text)


def register(cls: type) -> type:
    """Class decorator: add a probe to its registry under `cls.name` (built-ins and plug-ins): a
    posbench.probes.Probe, which reads posbench's symbols, to PROBES; a posbench.probes.TextProbe,
    which reads text through a pretrained model's tokenizer, to TEXT_PROBES."""
    name = cls.__dict__.get("name")
    if not isinstance(name, str) or not name.strip() or any(c in name for c in ", "):
        raise PosbenchError(f"probe class {getattr(cls, '__name__', cls)} needs a `name`: a string without , or spaces")
    text = isinstance(cls, type) and issubclass(cls, TextProbe)
    if not (isinstance(cls, type) and (issubclass(cls, Probe) or text)):
        raise PosbenchError(f"probe {name!r} must subclass posbench.probes.Probe (symbols, for trained runs) or "
                            f"posbench.probes.TextProbe (text, for --model)")
    if not text and ":" in name:
        raise PosbenchError(f"probe class {cls.__name__} needs a `name`: a string without , : or spaces")
    for attr in ("summary", "reference"):
        if not isinstance(getattr(cls, attr, None), str):
            raise PosbenchError(f"probe {name!r} has no `{attr}` (a string)")
    if cls.reads != ("text" if text else "symbols"):
        raise PosbenchError(f"probe {name!r} sets reads = {cls.reads!r}: a Probe reads posbench's symbols, for trained "
                            f"runs; a probe that reads text through a model's tokenizer subclasses "
                            f"posbench.probes.TextProbe")
    return plugins.enter(TEXT_PROBES if text else PROBES, "text probe" if text else "probe", name, cls)


def probe_name(spec: str) -> str:
    """The name part of a data spec ``NAME[:options]`` (a probe's name when it is one)."""
    return spec.partition(":")[0].strip()


def parse_probe(spec: str) -> Probe:
    """The probe of a data spec; one clear error for an unknown name or a bad option."""
    name = probe_name(spec)
    if name not in PROBES:
        raise did_you_mean(name, PROBES, "probe")
    return PROBES[name].parse(spec)
