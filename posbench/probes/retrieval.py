"""Retrieval probes: facts hidden in filler text, asked for at the end.

Passkey (Mohtashami & Jaggi 2023) and the needle-in-a-haystack family of RULER (Hsieh et al.
2024, NVIDIA/RULER scripts/synthetic.yaml: niah_multikey_1, niah_multivalue, niah_multiquery,
vt), scaled to tiny models: the haystack is RULER's noise haystack (the passkey filler), needles
are short sentences ("The key of river is 123."), values have fewer digits and the question ends
in an answer prefix, as RULER's base-model prompts do. A hit is the exact answer, every value in
the order the probe states. Multi-needle probes put their needles at uniformly random depths.
"""

from __future__ import annotations

import random

from posbench.errors import PosbenchError
from posbench.probes.base import Answer, Fill, Probe, Text, filler, random_weights, register, render

WORDS = ("apple river stone cloud tiger lamp garden silver winter candle forest mirror orange "
         "window bridge rabbit copper meadow violin pepper").split()


def number(rng: random.Random, digits: int) -> str:
    return str(rng.randrange(10 ** (digits - 1), 10**digits))


def needle(word: str, value: str) -> Text:
    return Text(f"The key of {word} is {value}. ")


def haystack(rng: random.Random, needles: list[Text]) -> list:
    """The needles at uniformly random depths of the filler."""
    weights = random_weights(rng, len(needles) + 1)
    out: list = [Fill(weights[0])]
    for w, n in zip(weights[1:], needles):
        out += [n, Fill(w)]
    return out


@register
class Passkey(Probe):
    name = "passkey"
    summary = ("a random `digits`-digit key in a key sentence at a depth of the filler, asked for at "
               "the end; documents of `len` characters; scored at depths 0, 0.25, 0.5, 0.75, 1")
    reference = "Mohtashami & Jaggi 2023 (landmark attention); the test of the PI and YaRN papers"
    options = {"len": (128, 256), "digits": 5, "docs": 40000}
    variant_name = "depth"
    QUESTION = "What is the pass key? The pass key is"

    @staticmethod
    def key_sentence(key: str) -> str:
        return f"The pass key is {key}. Remember it. {key} is the pass key. "

    @property
    def fixed_len(self) -> int:
        """Characters of a document that are not filler."""
        return len(self.key_sentence("0" * self.digits)) + len(self.QUESTION) + 1 + self.digits

    def check(self) -> None:
        super().check()
        lo, hi = self.len
        if not self.fixed_len <= lo:
            raise PosbenchError(
                f"passkey document lengths {lo}-{hi} are too short: a document with {self.digits} digits "
                f"needs at least {self.fixed_len} characters"
            )

    def variants(self) -> tuple[float, ...]:
        return (0.0, 0.25, 0.5, 0.75, 1.0)

    def instance(self, rng, size, depth):
        key = number(rng, self.digits)
        return [Fill(depth), Text(self.key_sentence(key)), Fill(1.0 - depth), Text(self.QUESTION), Answer(" " + key)]

    def document(self, rng: random.Random) -> str:
        # The draws of the original generator, so the corpus (and its fingerprint) stays the same.
        key = number(rng, self.digits)
        free = rng.randint(*self.len) - self.fixed_len
        before = rng.randint(0, free)
        return filler(before) + self.key_sentence(key) + filler(free - before) + self.QUESTION + " " + key


@register
class MultiKey(Probe):
    name = "multikey"
    summary = ("`keys` needles 'The key of WORD is N.' with distinct words; the question asks for one "
               "of them (RULER niah_multikey_1: 4 keys; here `digits`-digit values)")
    reference = "Hsieh et al. 2024, RULER (NVIDIA/RULER, scripts/synthetic.yaml, niah_multikey_1)"
    options = {"len": (180, 280), "keys": 4, "digits": 4}

    def instance(self, rng, size, variant):
        words = rng.sample(WORDS, self.keys)
        values = [number(rng, self.digits) for _ in words]
        asked = rng.randrange(self.keys)
        w = words[asked]
        return haystack(rng, [needle(a, v) for a, v in zip(words, values)]) + [
            Text(f"What is the key of {w}? The key of {w} is"), Answer(" " + values[asked])]

    def check(self) -> None:
        super().check()
        if self.keys > len(WORDS):
            raise PosbenchError(f"multikey keys must be at most {len(WORDS)}, got {self.keys}")


@register
class MultiValue(Probe):
    name = "multivalue"
    summary = ("one word with `values` needles of different values; every value is asked for, in the "
               "order of the text (RULER niah_multivalue: 4 values)")
    reference = "Hsieh et al. 2024, RULER (NVIDIA/RULER, scripts/synthetic.yaml, niah_multivalue)"
    options = {"len": (180, 280), "values": 4, "digits": 3}

    def instance(self, rng, size, variant):
        w = rng.choice(WORDS)
        values = [number(rng, self.digits) for _ in range(self.values)]
        return haystack(rng, [needle(w, v) for v in values]) + [
            Text(f"What are the keys of {w}? The keys of {w} are"), Answer(" " + ", ".join(values))]


@register
class MultiQuery(Probe):
    name = "multiquery"
    summary = ("`keys` needles with distinct words; `queries` of them are asked for in one question, "
               "answered in the order asked (RULER niah_multiquery: 4 keys, 4 queries)")
    reference = "Hsieh et al. 2024, RULER (NVIDIA/RULER, scripts/synthetic.yaml, niah_multiquery)"
    options = {"len": (180, 280), "keys": 4, "queries": 2, "digits": 3}

    def check(self) -> None:
        super().check()
        if not self.queries <= self.keys <= len(WORDS):
            raise PosbenchError(f"multiquery needs queries <= keys <= {len(WORDS)}, got {self.queries}, {self.keys}")

    def instance(self, rng, size, variant):
        words = rng.sample(WORDS, self.keys)
        values = dict(zip(words, (number(rng, self.digits) for _ in words)))
        asked = rng.sample(words, self.queries)
        names = ", ".join(asked)
        return haystack(rng, [needle(w, v) for w, v in values.items()]) + [
            Text(f"What are the keys of {names}? The keys of {names} are"),
            Answer(" " + ", ".join(values[w] for w in asked))]


@register
class VarTrack(Probe):
    name = "vartrack"
    summary = ("variable tracking: 'VAR AB = N.' then `hops` assignments 'VAR CD = VAR AB.' along one "
               "chain, spread through the filler; the answer names every variable holding N, in chain "
               "order (RULER vt: 1 chain, 4 hops)")
    reference = "Hsieh et al. 2024, RULER (NVIDIA/RULER, scripts/synthetic.yaml, vt)"
    options = {"len": (180, 280), "hops": 4, "digits": 4}

    def instance(self, rng, size, variant):
        names = []
        while len(names) < self.hops + 1:  # distinct two-letter names
            name = "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(2))
            if name not in names:
                names.append(name)
        value = number(rng, self.digits)
        chain = [Text(f"VAR {names[0]} = {value}. ")] + [
            Text(f"VAR {b} = VAR {a}. ") for a, b in zip(names, names[1:])]
        return haystack(rng, chain) + [
            Text(f"Which variables hold {value}? They are"), Answer(" " + " ".join(names))]


@register
class MQAR(Probe):
    name = "mqar"
    summary = ("multi-query associative recall: key-value pairs ('ab 3 cd 7 ...'), filler, then "
               "`queries` of the keys, each to be followed by its value; a prompt of L tokens holds "
               "L / `spacing` pairs (Zoology's T / pairs = 16: (64, 4) .. (256, 16)); training "
               "documents hold `pairs` pairs and up to `spacing` characters of filler per pair")
    reference = "Arora et al. 2023, Zoology (HazyResearch/zoology, MQAR)"
    options = {"pairs": (4, 16), "queries": 4, "spacing": 16}

    def check(self) -> None:
        super().check()
        if not self.queries <= self.pairs[0] <= self.pairs[1] <= 26 * 25:
            raise PosbenchError(f"mqar needs queries <= pairs <= 650, got {self.queries}, {self.pairs}")

    def instance(self, rng, size, variant):
        keys: list[str] = []
        while len(keys) < size:  # distinct two-letter keys
            key = "".join(rng.sample("abcdefghijklmnopqrstuvwxyz", 2))
            if key not in keys:
                keys.append(key)
        values = {k: str(rng.randrange(10)) for k in keys}
        out = [Text("\n" + " ".join(f"{k} {values[k]}" for k in keys)), Fill(1.0), Text("\n?")]
        for k in rng.sample(keys, self.queries):
            out += [Text(f" {k}"), Answer(f" {values[k]}")]
        return out

    def document(self, rng):
        pairs = rng.randint(*self.pairs)
        return render(self.instance(rng, pairs, None), rng.randint(0, pairs * self.spacing))

    def prompt(self, maker, rng, length, variant):
        return maker.build(self.instance(rng, max(self.queries, length // self.spacing), variant), length, self.name)
