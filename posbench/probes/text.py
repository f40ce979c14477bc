"""The probes that read text through a pretrained model's tokenizer (`posbench probe --model`): the
natural-language passkey test, RULER's synthetic tasks, and any plug-in that subclasses
`TextProbe`. They are listed beside the symbolic probes, which are written in posbench's symbol
vocabulary for the models it trains; each probe's `reads` says which, and a probe paired with the
other kind of model is one line derived from it (`find`).

A text probe makes, for a length and one of its variants, prompts of exactly that many tokens or
fewer (`TextPrompt`: the tokens, the references the output is judged against, how many tokens to
decode); the model decodes greedily after each and `verdicts` judges what it wrote, one verdict per
reference. posbench.probing.Verdicts reads them through the same sweep as the symbolic probes.
"""

from __future__ import annotations

import random
import re
from functools import partial

from posbench import ruler
from posbench.errors import PosbenchError
from posbench.probes.base import PROBES, TEXT, TEXT_PROBES, TextPrompt, TextProbe, encode, parse_probe, probe_name, register

SYMBOLS = "symbols"
READS = {SYMBOLS: "symbols, for trained runs", TEXT: "text through the model's tokenizer, for --model"}
PREFER = {SYMBOLS: "leave --model out", TEXT: "add --model"}  # what a probe that reads this asks of the command


FILLER = " " + ruler.NOISE  # the sentences of the passkey tests and of RULER's noise haystack
INSTRUCTION = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
               "I will quiz you about the important information there.")
KEY_SENTENCE = " The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = " What is the pass key? The pass key is"
DIGITS = 5


def passkey_prompt(tok, length: int, depth: float, key: str) -> list[int]:
    """The classic passkey prompt (Mohtashami & Jaggi 2023; LongLM's and YaRN's passkey tests) as
    exactly `length` tokens of the model's tokenizer: the instruction, filler sentences, the key
    sentence after a share `depth` of the filler, more filler, the question. Filler comes in whole
    sentences groups; the last one before the question is cut to make up the length."""
    head, needle, tail, unit = (encode(tok, text) for text in (INSTRUCTION, KEY_SENTENCE.format(key=key), QUESTION,
                                                               FILLER))
    free = length - len(head) - len(needle) - len(tail)
    if free < 0:
        raise PosbenchError(f"passkey length {length} is too short: the prompt needs at least "
                            f"{length - free} tokens")
    before = round(depth * (free // len(unit))) * len(unit)
    after = free - before
    fill = lambda n: (unit * (n // len(unit) + 1))[:n]  # noqa: E731
    return head + fill(before) + needle + fill(after) + tail


def digits_found(key: str, output: str) -> list[bool]:
    """Per digit of the key, whether the digits the model writes first (leading spaces skipped)
    spell it there."""
    said = re.match(r"\s*(\d*)", output).group(1)
    return [i < len(said) and said[i] == d for i, d in enumerate(key)]


@register
class NaturalPasskey(TextProbe):
    name = "passkey"
    summary = ("a 5-digit key in a key sentence at a depth of natural-language filler, asked for at the end; "
               "greedy decoding; depths 0, 0.25, 0.5, 0.75, 1")
    reference = "Mohtashami & Jaggi 2023; the passkey test of LongLM and YaRN"

    def variants(self) -> tuple:
        return tuple(parse_probe("passkey").variants())

    def variant_label(self, variant) -> str:
        return parse_probe("passkey").variant_label(variant)

    def prompts(self, length, variant, trials, seed):
        rng = random.Random(f"passkey:{seed}:{length}:{variant}")
        keys = [str(rng.randrange(10 ** (DIGITS - 1), 10**DIGITS)) for _ in range(trials)]
        out = []
        for key in keys:
            tokens = passkey_prompt(self.tokenizer, length, variant, key)
            out.append(TextPrompt(tokens, (key,), DIGITS + 2, partial(digits_found, key), to_end=False,
                                  skip_special=False, identity=(tokens, key)))
        return out

    def chance(self, prompts):
        return 0.1  # a digit guessed


class RulerTask(TextProbe):
    """One of RULER's synthetic tasks (posbench.ruler), its prompts fitted to the model's tokenizer."""

    reference = "Hsieh et al. 2024 (RULER), scripts/synthetic.yaml"
    settings = "trials, seed, ruler_essay"

    def __init__(self, tokenizer, cfg):
        super().__init__(tokenizer, cfg)
        self.task = ruler.task_of(self.name)
        self.essay = ruler.load_essay(cfg.ruler_essay)

    @classmethod
    def check(cls, cfg) -> None:
        ruler.load_essay(cfg.ruler_essay)

    def prompts(self, length, variant, trials, seed):
        count = lambda text: len(self.encode(text))  # noqa: E731
        made = [ruler.prompt(self.task, length, f"{self.name}:{seed}:{length}:{i}", count, self.essay)
                for i in range(trials)]
        return [TextPrompt(self.encode(p.text), p.answers, self.task.generate, partial(self.verdicts, p.answers),
                           identity=p) for p in made]

    def chance(self, prompts):
        return sum(ruler.chance(p.identity) for p in prompts) / len(prompts)

    def spec(self):
        return f"{self.name}:essay={self.cfg.ruler_essay}"

    def corpus(self):
        return f"+essay-{self.essay.fingerprint}"


def ruler_summary(t: ruler.Task) -> str:
    """What one of RULER's tasks asks, from its declaration."""
    if t.family == "niah":
        article = "an" if t.haystack == "essay" else "a"
        return (f"needles in {article} {t.haystack} haystack: {t.keys} key(s) of {t.key}, {t.values} value(s) of "
                f"{t.value} each, {t.queries} asked for; greedy output holds every value")
    return {"vt": "variable tracking: every variable bound to a value through a chain of assignments",
            "cwe": f"common words: the {ruler.COMMON} most common words of a list",
            "fwe": "frequent words: the 3 most frequent coded words of a Zipf-distributed text"}[t.family]


for _name, _task in ruler.TASKS.items():
    register(type(f"Ruler_{_name}", (RulerTask,), {"name": f"{ruler.PREFIX}{_name}", "summary": ruler_summary(_task)}))


def entries(name: str) -> list:
    """The probes of that name, symbolic and text (the passkey is both); one line for a name that
    is neither, with the nearest names."""
    if ruler.is_ruler(name):
        ruler.task_of(name)
    found = [PROBES[probe_name(name)]] if probe_name(name) in PROBES else []
    found += [TEXT_PROBES[name]] if name in TEXT_PROBES else []
    if not found:
        parse_probe(name)  # did you mean ...
    return found


def find(name: str, model: bool):
    """The probe `name` for a pretrained model (`model`) or for trained runs; one line, from what
    the probe reads, when it is not for that kind of model."""
    wanted = TEXT if model else SYMBOLS
    found = entries(name)
    for entry in found:
        if entry.reads == wanted:
            if entry.reads == SYMBOLS:
                parse_probe(name)  # its options
            return entry
    other = found[0].reads
    kind = ", ".join(e.name for e in listing() if e.reads == wanted)
    raise PosbenchError(f"{name} reads {READS[other]}: {PREFER[other]}, or take a probe that reads {wanted}: {kind}")


def listing() -> list:
    """Every probe: the symbolic ones (their classes) by name, then the text ones."""
    return [*(PROBES[name] for name in sorted(PROBES)), *TEXT_PROBES.values()]
