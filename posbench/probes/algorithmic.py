"""Algorithmic probes after Kazemnejad et al. 2023 (McGill-NLP/length-generalization: trained on
instances up to a size, tested on larger ones, exact match of the whole answer) and Ruoss et al.
2023 (randomized positional encodings: parity and sorting among the Chomsky-hierarchy tasks).

An instance is a line ``op x1 x2 ... = y1 y2 ...`` of single digits separated by spaces (one
token per digit and its space with the BPE of the probe tasks, two with raw bytes). Training
documents hold instances of `size` digits; a prompt of L tokens holds the largest instance that
fits, so its size grows with L and a longer prompt asks a longer problem.
"""

from __future__ import annotations

from posbench.probes.base import Answer, Probe, Text, register


def digits(xs) -> str:
    return "".join(f" {x}" for x in xs)


class Algorithmic(Probe):
    sized = True
    options = {"size": (1, 30)}
    reference = "Kazemnejad et al. 2023 (McGill-NLP/length-generalization); Ruoss et al. 2023"

    def instance(self, rng, size, variant):
        xs = [rng.randrange(self.base) for _ in range(size)]
        return [Text(f"\n{self.name}{digits(xs)} ="), Answer(digits(self.solve(xs)))]

    base = 10

    def solve(self, xs: list[int]) -> list[int]:
        raise NotImplementedError


@register
class Copy(Algorithmic):
    name = "copy"
    summary = "repeat `size` digits"

    def solve(self, xs):
        return xs


@register
class Reverse(Algorithmic):
    name = "reverse"
    summary = "the `size` digits in reverse order"

    def solve(self, xs):
        return xs[::-1]


@register
class Sort(Algorithmic):
    name = "sort"
    summary = "the `size` digits in ascending order"

    def solve(self, xs):
        return sorted(xs)


@register
class Parity(Algorithmic):
    name = "parity"
    summary = "whether `size` bits hold an odd number of ones (one answer token: 0 or 1)"
    base = 2

    def solve(self, xs):
        return [sum(xs) % 2]


@register
class Addition(Algorithmic):
    name = "addition"
    summary = ("the sum of two `size`-digit numbers, every number written least significant digit "
               "first (reversed), so each answer digit follows from digits already read plus a carry; "
               "the answer has size + 1 digits, the last one the final carry")

    def instance(self, rng, size, variant):
        a = [rng.randrange(10) for _ in range(size)]
        b = [rng.randrange(10) for _ in range(size)]
        total = int("".join(map(str, a[::-1]))) + int("".join(map(str, b[::-1])))
        out = [int(c) for c in str(total).zfill(size + 1)[::-1]]
        return [Text(f"\naddition{digits(a)} +{digits(b)} ="), Answer(digits(out))]
