"""Algorithmic probes after Kazemnejad et al. 2023 (McGill-NLP/length-generalization: trained on
instances up to a size, tested on larger ones) and Ruoss et al. 2023 (randomized positional
encodings: parity and sorting among the Chomsky-hierarchy tasks).

An instance is ``OP x1 x2 ... = y1 y2 ...`` in one-digit symbols; every output digit is its own
verdict. An example of L tokens holds the largest instance that fits (filler before it makes up the
rest), so a longer prompt asks a longer problem and the training lengths span the sizes.
"""

from __future__ import annotations

from posbench.probes.base import Answer, Probe, Text, register


class Algorithmic(Probe):
    sized = True
    grows = "digits"
    reference = "Kazemnejad et al. 2023 (McGill-NLP/length-generalization); Ruoss et al. 2023"
    base = 10

    @property
    def chance(self) -> float:
        return 1 / self.base

    def instance(self, rng, size, variant):
        xs = [rng.randrange(self.base) for _ in range(size)]
        return [Text((self.name, *map(str, xs), "=")), *(Answer((str(y),)) for y in self.solve(xs))]

    def solve(self, xs: list[int]) -> list[int]:
        raise NotImplementedError


@register
class Copy(Algorithmic):
    name = "copy"
    summary = "repeat the digits"

    def solve(self, xs):
        return xs


@register
class Reverse(Algorithmic):
    name = "reverse"
    summary = "the digits in reverse order"

    def solve(self, xs):
        return xs[::-1]


@register
class Sort(Algorithmic):
    name = "sort"
    summary = "the digits in ascending order"

    def solve(self, xs):
        return sorted(xs)


@register
class Parity(Algorithmic):
    name = "parity"
    summary = "whether the bits hold an odd number of ones (one answer: 0 or 1)"
    base = 2

    def solve(self, xs):
        return [sum(xs) % 2]


@register
class Addition(Algorithmic):
    name = "addition"
    summary = ("the sum of two numbers of as many digits, every number written least significant digit "
               "first (reversed), so each answer digit follows from digits already read plus a carry; "
               "the answer has one digit more, the last one the final carry")

    def instance(self, rng, size, variant):
        a = [rng.randrange(10) for _ in range(size)]
        b = [rng.randrange(10) for _ in range(size)]
        total = int("".join(map(str, a[::-1]))) + int("".join(map(str, b[::-1])))
        out = str(total).zfill(size + 1)[::-1]
        return [Text(("addition", *map(str, a), "+", *map(str, b), "=")), *(Answer((d,)) for d in out)]
