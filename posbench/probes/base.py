"""What every probe shares: options parsed from its data spec, training documents, and prompts of
exactly L tokens in the model's own tokens with the answer's positions.

A probe instance is a list of segments: `Text` (given to the model), `Answer` (to be produced)
and `Fill` (filler text, "The grass is green. ...", whose amount makes up the length; its weight
is its share of the filler). A training document renders the segments as text with a random
amount of filler in characters; a prompt of length L renders them as tokens, each run of text
encoded on its own and the filler cut from the tokens of a long filler text, so the prompt is
exactly L tokens. A probe whose instance grows (`sized`: copy, mqar, ...) gets the largest size
whose prompt fits L; the others keep their instance and fill the rest of L with filler.

Answers start after a space or a newline (" 12345"), so the tokenizer's pre-tokenization starts a
new token there and encoding the answer on its own gives the tokens of the whole text; the
answer's positions are its tokens that are not whitespace alone.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, ClassVar

from posbench.errors import PosbenchError, did_you_mean

FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
PAD_CHARS = 8  # filler before a sized instance in training: at test the remainder of L is less than an item


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class Answer:
    text: str


@dataclass(frozen=True)
class Fill:
    weight: float


Segment = Text | Answer | Fill


@dataclass(frozen=True)
class Prompt:
    tokens: list[int]  # exactly the prompt's length, answers included
    answer: list[int]  # positions of the answer tokens, ascending
    answer_text: str  # the answers, as text, for reading


def filler(n: int) -> str:
    """The first n characters of the repeated filler."""
    return (FILLER * (n // len(FILLER) + 1))[:n]


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


def render(segments: list[Segment], fill_chars: int) -> str:
    """A training document: the segments as text with `fill_chars` characters of filler."""
    fills = iter(fill_sizes([s.weight for s in segments if isinstance(s, Fill)], fill_chars))
    return "".join(filler(next(fills)) if isinstance(s, Fill) else s.text for s in segments)


def fixed_chars(segments: list[Segment]) -> int:
    return sum(len(s.text) for s in segments if not isinstance(s, Fill))


class Probe:
    """A synthetic task: its data spec options, training documents and prompts.

    Subclasses set `name`, `summary` (what it asks and its settings), `reference`, `options`
    (defaults: an int or a (low, high) range, written ``low-high``) and write `instance`."""

    name: ClassVar[str]
    summary: ClassVar[str]
    reference: ClassVar[str]
    options: ClassVar[dict[str, Any]]
    sized: ClassVar[bool] = False  # the instance grows to fill the prompt (option `size` in training)
    variant_name: ClassVar[str] = ""  # what variants vary (passkey: depth); "" for none

    def __init__(self, **values: Any):
        self.opts = {**self.defaults(), **values}

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        return {"seed": 0, "docs": 20000, **cls.options}

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
        """The probe of a data spec ``NAME[:key=value,...]``; a bare number is the seed, a bare
        ``low-high`` the range option (len or size)."""
        _, _, rest = spec.partition(":")
        defaults = cls.defaults()
        usage = f"use {cls.name}[:" + ",".join(f"{k}={_show(v)}" for k, v in defaults.items()) + "]"
        values: dict[str, Any] = {}
        for item in (p.strip() for p in rest.split(",") if p.strip()):
            key, eq, value = item.partition("=")
            if not eq:
                ranged = next((k for k, v in defaults.items() if isinstance(v, tuple)), "seed")
                key, value = (ranged, item) if "-" in item else ("seed", item)
            key = key.strip()
            if key not in defaults:
                raise PosbenchError(f"unknown option {key!r} in data spec {spec!r}: {usage}")
            try:
                if isinstance(defaults[key], tuple):
                    lo, hi = value.split("-")
                    values[key] = (int(lo), int(hi))
                else:
                    values[key] = int(value)
            except ValueError:
                raise PosbenchError(f"bad {key} {value!r} in data spec {spec!r}: {usage}") from None
        probe = cls(**values)
        probe.check()
        return probe

    def check(self) -> None:
        """Range checks of the options (subclasses add their own)."""
        if self.docs < 40:
            raise PosbenchError(f"{self.name} docs must be at least 40 (for the split), got {self.docs}")
        if "digits" in self.opts and not 1 <= self.digits <= 18:
            raise PosbenchError(f"{self.name} digits must be in 1..18, got {self.digits}")
        for key, value in self.opts.items():
            if isinstance(value, tuple) and not 0 < value[0] <= value[1]:
                raise PosbenchError(f"{self.name} {key} {value[0]}-{value[1]} must be positive and low-high")
            if key not in ("seed", "docs") and isinstance(value, int) and value < 1:
                raise PosbenchError(f"{self.name} {key} must be at least 1, got {value}")

    def settings(self) -> str:
        return ",".join(f"{k}={_show(v)}" for k, v in self.opts.items())

    # --- what a probe writes ---------------------------------------------------------------

    def instance(self, rng: random.Random, size: int, variant: Any) -> list[Segment]:
        """The segments of one instance (`size` for sized probes; `variant` None in training)."""
        raise NotImplementedError

    def variants(self) -> tuple[Any, ...]:
        """The values of the variant a length is scored at (passkey: key depths)."""
        return (None,)

    def variant_label(self, variant: Any) -> str:
        return "" if variant is None else f"{self.variant_name}={variant:g}"

    # --- training documents ----------------------------------------------------------------

    def document(self, rng: random.Random) -> str:
        if self.sized:
            segments = self.instance(rng, rng.randint(*self.size), None)
            return render([Fill(1.0), *segments], rng.randint(0, PAD_CHARS))
        segments = self.instance(rng, 0, None)
        # An instance longer than the drawn length (long words, many needles) gets no filler.
        return render(segments, max(0, rng.randint(*self.len) - fixed_chars(segments)))

    def documents(self) -> tuple[list[str], list[str]]:
        """The probe's `docs` training documents and their names, from its seed alone."""
        rng = random.Random(self.seed)
        names = [f"{self.name}-{i:07d}" for i in range(self.docs)]
        return names, [self.document(rng) for _ in names]

    # --- prompts ---------------------------------------------------------------------------

    def prompt_rng(self, seed: int, length: int, variant: Any) -> random.Random:
        """The generator of a cell's prompts: every scheme (and tokenizer) gets the same ones."""
        return random.Random(f"{self.name}:{seed}:{length}:{variant!r}")

    def prompts(self, maker: PromptMaker, length: int, variant: Any, n: int, seed: int) -> list[Prompt]:
        rng = self.prompt_rng(seed, length, variant)
        return [self.prompt(maker, rng, length, variant) for _ in range(n)]

    def prompt(self, maker: PromptMaker, rng: random.Random, length: int, variant: Any) -> Prompt:
        if not self.sized:
            return maker.build(self.instance(rng, 0, variant), length, self.name)
        state = rng.getstate()

        def tokens_at(size: int) -> int:
            rng.setstate(state)
            return maker.fixed_tokens(self.instance(rng, size, variant))

        lo, hi = 1, length  # the largest size whose prompt fits (token counts grow with size)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if tokens_at(mid) <= length else (lo, mid - 1)
        rng.setstate(state)
        return maker.build([Fill(1.0), *self.instance(rng, lo, variant)], length, self.name)


def _show(value: Any) -> str:
    return f"{value[0]}-{value[1]}" if isinstance(value, tuple) else str(value)


class PromptMaker:
    """Renders segments as tokens of one tokenizer (anything with `encode_documents` and `decode`,
    as posbench.data's tokenizers), so every prompt is exactly its length in the model's tokens."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._filler: list[int] = []

    def encode(self, text: str) -> list[int]:
        return [int(i) for i in self.tokenizer.encode_documents([text])[:-1]]  # without the separator

    def filler(self, n: int) -> list[int]:
        while len(self._filler) < n:
            self._filler = self.encode(FILLER * (2 * len(self._filler) // 8 + 8))
        return self._filler[:n]

    def chunks(self, segments: list[Segment]) -> list[tuple[str, Any]]:
        """("fill", weight) or ("text" | "answer", tokens): neighbouring texts encoded together."""
        out: list[tuple[str, Any]] = []
        pending = ""
        for s in segments:
            if isinstance(s, Text):
                pending += s.text
                continue
            if pending:
                out.append(("text", self.encode(pending)))
                pending = ""
            out.append(("fill", s.weight) if isinstance(s, Fill) else ("answer", self.encode(s.text)))
        if pending:
            out.append(("text", self.encode(pending)))
        return out

    def fixed_tokens(self, segments: list[Segment]) -> int:
        return sum(len(v) for kind, v in self.chunks(segments) if kind != "fill")

    def build(self, segments: list[Segment], length: int, name: str) -> Prompt:
        chunks = self.chunks(segments)
        free = length - sum(len(v) for kind, v in chunks if kind != "fill")
        if free < 0 or (free > 0 and not any(kind == "fill" for kind, _ in chunks)):
            raise PosbenchError(
                f"{name} length {length} is too short: a prompt needs at least {length - free} tokens"
            )
        fills = iter(fill_sizes([v for kind, v in chunks if kind == "fill"], free))
        tokens: list[int] = []
        answer: list[int] = []
        for kind, value in chunks:
            if kind == "fill":
                tokens += self.filler(next(fills))
                continue
            if kind == "answer":  # from its first token that is not whitespace alone
                skip = next(k for k, t in enumerate(value) if self.tokenizer.decode([t]).strip())
                answer += range(len(tokens) + skip, len(tokens) + len(value))
            tokens += value
        text = " | ".join(s.text.strip() for s in segments if isinstance(s, Answer))
        return Prompt(tokens, answer, text)


PROBES: dict[str, type[Probe]] = {}


def register(cls: type[Probe]) -> type[Probe]:
    assert cls.name not in PROBES, f"probe {cls.name} registered twice"
    PROBES[cls.name] = cls
    return cls


def probe_name(spec: str) -> str:
    """The name part of a data spec ``NAME[:options]`` (a probe's name when it is one)."""
    return spec.partition(":")[0].strip()


def parse_probe(spec: str) -> Probe:
    """The probe of a data spec; one clear error for an unknown name or a bad option."""
    name = probe_name(spec)
    if name not in PROBES:
        raise did_you_mean(name, PROBES, "probe")
    return PROBES[name].parse(spec)
