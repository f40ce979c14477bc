"""Retrieval probes: facts hidden in a haystack, asked for at the end.

Passkey (Mohtashami & Jaggi 2023) and the needle-in-a-haystack family of RULER (Hsieh et al.
2024, NVIDIA/RULER scripts/synthetic.yaml: niah_multikey_1, niah_multivalue, niah_multiquery,
vt), scaled to tiny models and written in one-token symbols: the haystack is RULER's noise
sentences ("the grass is green ."), a needle is ``KEY is 1 2 3 .`` (a key symbol, digits), the
question ends where the answer starts, as RULER's base-model prompts do; where a question names
keys, each answer follows its key, as RULER's answer prefix repeats the query ("The special magic
number for KEY mentioned in the provided text is"). A longer example holds
more haystack. Multi-needle probes put their needles at uniformly random depths. MQAR (Zoology)
grows by pairs instead: every key of its list is queried, each query its own verdict.
"""

from __future__ import annotations

import random

from posbench.errors import PosbenchError
from posbench.probes.base import Answer, Fill, Probe, Text, fixed_tokens, random_weights, register
from posbench.probes.symbols import KEYS, N_KEYS, N_VALUES, VALUES


def number(rng: random.Random, digits: int) -> tuple[str, ...]:
    """A number of `digits` digits (no leading zero), one symbol per digit."""
    return tuple(str(rng.randrange(10 ** (digits - 1), 10**digits)))


def needle(key: str, value: tuple[str, ...]) -> Text:
    return Text((key, "is", *value, "."))


def haystack(rng: random.Random, needles: list[Text]) -> list:
    """The needles at uniformly random depths of the filler."""
    weights = random_weights(rng, len(needles) + 1)
    out: list = [Fill(weights[0])]
    for w, n in zip(weights[1:], needles):
        out += [n, Fill(w)]
    return out


def listed(answers) -> list:
    """Answers in order, a comma given between them: each answer is its own verdict."""
    out: list = []
    for i, a in enumerate(answers):
        out += [Text((",",))] if i else []
        out.append(Answer(tuple(a)))
    return out


class NumberAnswers(Probe):
    """Probes whose answers are `digits`-digit numbers: a uniform guess is right once in 10^digits."""

    @property
    def chance(self) -> float:
        return 10.0 ** -self.digits


@register
class Passkey(NumberAnswers):
    name = "passkey"
    summary = ("a random `digits`-digit key in a key sentence at a depth of the haystack (after a short "
               "instruction), asked for at the end; longer examples hold more haystack; scored at depths "
               "0, 0.25, 0.5, 0.75, 1")
    reference = "Mohtashami & Jaggi 2023 (landmark attention); the test of the PI and YaRN papers"
    options = {"digits": 5}
    variant_name = "depth"
    revision = 2  # 2: the instruction before the haystack

    def variants(self) -> tuple[float, ...]:
        return (0.0, 0.25, 0.5, 0.75, 1.0)

    def instance(self, rng, size, depth):
        key = number(rng, self.digits)
        depth = rng.random() if depth is None else depth
        # The reference's prompt opens with an instruction before the haystack, so a needle at depth
        # 0 is not the first token (which every causal model reads alone, an attention sink)
        return [Text(("remember", "the", "key", ".")), Fill(depth),
                Text(("pass", "key", "is", *key, ".", "remember", "it", ".")), Fill(1.0 - depth),
                Text(("what", "is", "the", "pass", "key", "?")), Answer(key)]


class NeedleValues(NumberAnswers):
    """RULER's needle probes, whose values are one value symbol each by default (`digits` 0), as
    MQAR's: a tiny model copies a one-token value once it finds its needle, where with several
    needles of several digits each a digit of the answer recurs in other needles and the copy of
    the next digit is ambiguous (multikey with 4-digit values: 1.5% per answer after 8,000 steps
    of rope). `digits=N`: N-digit numbers, as RULER."""

    least_digits = 0
    revision = 2  # 2: value symbols by default

    @property
    def pool(self) -> int:
        """How many key and value symbols the needles draw from (an option of multikey and
        multiquery; multivalue draws from all)."""
        return self.opts.get("pool", min(N_KEYS, N_VALUES))

    def check(self) -> None:
        super().check()
        if not 1 <= self.pool <= min(N_KEYS, N_VALUES):
            raise PosbenchError(f"{self.name} pool must be from 1 to {min(N_KEYS, N_VALUES)} symbols, got {self.pool}")

    @property
    def chance(self) -> float:
        return 1 / self.pool if self.digits == 0 else 10.0 ** -self.digits

    def draw_keys(self, rng: random.Random, n: int) -> list[str]:
        """n distinct keys of the first `pool` key symbols."""
        return rng.sample(KEYS[: self.pool], n)

    def draw_values(self, rng: random.Random, n: int) -> list[tuple[str, ...]]:
        if self.digits == 0:
            return [(v,) for v in rng.sample(VALUES[: self.pool], n)]
        return [number(rng, self.digits) for _ in range(n)]


class GrowingNeedles(NeedleValues):
    """Multikey and multiquery grow by needles, as MQAR by pairs: an example of L tokens holds
    L / `spacing` needles, rounded up, at most `keys`, then more haystack; so short training
    examples hold 1-3 needles, where a key must be told apart from fewer others."""

    grows = "needles: L / `spacing` (16), at most `keys`, then haystack"
    sized = True

    def size_for(self, length: int) -> int:
        n = min(self.keys, max(1, -(-length // self.spacing)))
        while n and fixed_tokens(self.instance(random.Random(0), n, None)) > length:
            n -= 1  # the needles, question and answers of n do not fit
        return n


@register
class MultiKey(GrowingNeedles):
    name = "multikey"
    summary = ("`keys` needles 'KEY is V .' with distinct keys; the question asks for one of them and "
               "the answer follows the key, 'what is KEY ? KEY is V' (RULER niah_multikey_1: 4 keys, "
               "its answer prefix repeating the key); V one value symbol, or a `digits`-digit number")
    reference = "Hsieh et al. 2024, RULER (NVIDIA/RULER, scripts/synthetic.yaml, niah_multikey_1)"
    options = {"keys": 4, "digits": 0, "pool": 64, "spacing": 16}
    revision = 3  # 3: the answer follows its key, as RULER's answer prefix; needles grow with the length

    def check(self) -> None:
        super().check()
        if self.keys > self.pool:
            raise PosbenchError(f"multikey keys must be at most its pool of {self.pool} symbols, got {self.keys}")

    def instance(self, rng, size, variant):
        keys = self.draw_keys(rng, size)
        values = self.draw_values(rng, size)
        asked = rng.randrange(size)
        return haystack(rng, [needle(k, v) for k, v in zip(keys, values)]) + [
            Text(("what", "is", keys[asked], "?", keys[asked], "is")), Answer(values[asked])]


@register
class MultiValue(NeedleValues):
    name = "multivalue"
    summary = ("one key with `values` needles of different values; every value is asked for, in the "
               "order of the text, each its own verdict (RULER niah_multivalue: 4 values)")
    reference = "Hsieh et al. 2024, RULER (NVIDIA/RULER, scripts/synthetic.yaml, niah_multivalue)"
    options = {"values": 4, "digits": 0}

    def check(self) -> None:
        super().check()
        if self.digits == 0 and self.values > self.pool:
            raise PosbenchError(f"multivalue values must be at most its pool of {self.pool} value symbols, got {self.values}")

    def instance(self, rng, size, variant):
        key = rng.choice(KEYS[: self.pool])
        values = self.draw_values(rng, self.values)
        return haystack(rng, [needle(key, v) for v in values]) + [
            Text(("what", "are", key, "?")), *listed(values)]


@register
class MultiQuery(GrowingNeedles):
    name = "multiquery"
    summary = ("`keys` needles with distinct keys; `queries` of them are asked for in one question, "
               "answered in the order asked, each answer after its key, 'what are K1 , K2 ? K1 is V1 , "
               "K2 is V2', each its own verdict (RULER niah_multiquery: 4 keys, 4 queries)")
    reference = "Hsieh et al. 2024, RULER (NVIDIA/RULER, scripts/synthetic.yaml, niah_multiquery)"
    options = {"keys": 4, "queries": 4, "digits": 0, "pool": 64, "spacing": 16}
    revision = 3  # 3: each answer follows its key, as RULER's answer prefix; needles grow with the length

    def check(self) -> None:
        super().check()
        if not self.queries <= self.keys <= self.pool:
            raise PosbenchError(f"multiquery needs queries <= keys <= pool ({self.pool}), got {self.queries}, {self.keys}")

    def instance(self, rng, size, variant):
        keys = self.draw_keys(rng, size)
        values = dict(zip(keys, self.draw_values(rng, size)))
        asked = rng.sample(keys, min(self.queries, size))
        question = [s for i, k in enumerate(asked) for s in ((",", k) if i else (k,))]
        answers: list = []
        for i, k in enumerate(asked):
            answers += [Text((",", k, "is") if i else ("?", k, "is")), Answer(values[k])]
        return haystack(rng, [needle(k, v) for k, v in values.items()]) + [
            Text(("what", "are", *question)), *answers]


@register
class VarTrack(Probe):
    name = "vartrack"
    summary = ("variable tracking: 'var X = N .' then `hops` assignments 'var Y = var X .' along one "
               "chain, spread through the haystack; the answer names every variable holding N, in "
               "chain order, each its own verdict (RULER vt: 1 chain, 4 hops)")
    reference = "Hsieh et al. 2024, RULER (NVIDIA/RULER, scripts/synthetic.yaml, vt)"
    options = {"hops": 4, "digits": 4}

    def check(self) -> None:
        super().check()
        if self.hops + 1 > N_KEYS:
            raise PosbenchError(f"vartrack hops must be at most {N_KEYS - 1}, got {self.hops}")

    @property
    def chance(self) -> float:
        return 1 / N_KEYS

    def instance(self, rng, size, variant):
        names = rng.sample(KEYS, self.hops + 1)
        value = number(rng, self.digits)
        chain = [Text(("var", names[0], "=", *value, "."))] + [
            Text(("var", b, "=", "var", a, ".")) for a, b in zip(names, names[1:])]
        return haystack(rng, chain) + [
            Text(("which", "var", "hold", *value, "?")), *(Answer((n,)) for n in names)]


@register
class MQAR(Probe):
    name = "mqar"
    summary = ("multi-query associative recall: a list of key-value pairs 'k3 v17 k9 v2 ...' (keys "
               "and values single symbols from disjoint sets of `keys` and `values`), then every key "
               "once more in random order, each followed by its value (one verdict each), filler at "
               "random between the queries; an example of L tokens holds L / `spacing` pairs, rounded up, "
               "at most `keys` (Zoology's T / pairs is 16; 8 here, (32, 4) .. (128, 16), and 16 keys and "
               "values: a tiny model leaves its plateau sooner than with Zoology's thousands)")
    reference = "Arora et al. 2023, Zoology (HazyResearch/zoology, MQAR)"
    options = {"spacing": 8, "keys": 16, "values": 16}
    grows = "pairs"
    sized = True

    def check(self) -> None:
        super().check()
        if self.keys > N_KEYS or self.values > N_VALUES:
            raise PosbenchError(f"mqar takes at most {N_KEYS} keys and {N_VALUES} values, "
                                f"got {self.keys} and {self.values}")
        if self.spacing < 4:
            raise PosbenchError(f"mqar spacing must be at least 4 (a pair and its query), got {self.spacing}")

    @property
    def chance(self) -> float:
        return 1 / self.values

    def size_for(self, length: int) -> int:
        return min(self.keys, max(1, -(-length // self.spacing))) if length >= 4 else 0

    def instance(self, rng, size, variant):
        keys = rng.sample(KEYS[: self.keys], size)
        values = {k: rng.choice(VALUES[: self.values]) for k in keys}
        gaps = random_weights(rng, size)
        out: list = [Text(tuple(s for k in keys for s in (k, values[k])))]
        for k, gap in zip(rng.sample(keys, size), gaps):
            out += [Fill(gap), Text((k,)), Answer((values[k],))]
        return out
