"""Aggregation probes: which words of a long text are the most frequent.

RULER's two aggregation tasks (Hsieh et al. 2024, NVIDIA/RULER
scripts/data/synthetic/common_words_extraction.py and freq_words_extraction.py), written in the
probe family's one-token symbols, their words drawn from the 64 key and 64 value symbols:

- cwe (common words extraction): `common` words repeated `repeats` times each among words seen
  `rare_repeats` times each, shuffled; asked for the common words. RULER: 10 common words, 30 and 3
  repeats from 4k tokens (6 and 1 below), a longer prompt holding more rare words.
- fwe (frequent words extraction): a text of N words whose k-th most frequent word occurs
  floor(N k^-alpha / zeta(alpha)) times (Zipf, alpha 2), the most frequent one noise (RULER's
  '...', here '.'); asked for the `answers` (3) most frequent words after it. A longer prompt holds
  a larger N.

Every answer word is its own verdict, so per-answer accuracy is RULER's string_match_all (the
share of reference words found). RULER scores the words in any order; a verdict here is teacher
forced, so the answers come in one order a reader can compute from the words alone: cwe's in the
symbols' own order (the key symbols, then the value symbols, as the vocabulary lists them), fwe's
from the most frequent down (sizes where two answers would tie are skipped).

cwe's revision 1 listed its answers in the order each first occurs in the text. A tiny model found
the common words but not that order (results/probes/aggregation): the verdict read the position of
each word's first occurrence as much as the counting RULER's any-order score asks for. Revision 2's
order needs only the words.
"""

from __future__ import annotations

from posbench.errors import PosbenchError
from posbench.probes.base import Probe, Text, register
from posbench.probes.retrieval import listed
from posbench.probes.symbols import KEYS, VALUES
from posbench.ruler import zipf_counts

POOL = (*KEYS, *VALUES)  # the words of an aggregation text
NOISE = "."  # fwe's most frequent word, as RULER's '...'


def answer_tokens(answers: int) -> int:
    """Tokens of `answers` one-symbol answers listed with commas between them."""
    return 2 * answers - 1


@register
class CommonWords(Probe):
    name = "cwe"
    summary = ("common words extraction: `common` (4) words repeated `repeats` (3) times each among rare "
               "words seen `rare_repeats` (1) times each, shuffled; 'what is here again ?' asks for the common "
               "words in the symbols' order, each its own verdict (RULER cwe: 10 common words, "
               "30 and 3 repeats; 6 and 1 below 4k tokens)")
    reference = ("Hsieh et al. 2024, RULER (NVIDIA/RULER, scripts/data/synthetic/"
                 "common_words_extraction.py)")
    options = {"common": 4, "repeats": 3, "rare_repeats": 1}
    grows = "rare words, at most 128 words in all, then haystack"
    sized = True
    revision = 2  # 2: the answers in the symbols' order, not the order each first occurs
    question = ("what", "is", "here", "again", "?")

    def check(self) -> None:
        super().check()
        if self.repeats <= self.rare_repeats:
            raise PosbenchError(f"cwe repeats must exceed rare_repeats, got {self.repeats} and {self.rare_repeats}")
        if self.common >= len(POOL):
            raise PosbenchError(f"cwe common must be below {len(POOL)} (the words), got {self.common}")

    @property
    def chance(self) -> float:
        return 1 / len(POOL)

    def size_for(self, length: int) -> int:
        fixed = self.common * self.repeats + len(self.question) + answer_tokens(self.common)
        return max(0, min(len(POOL) - self.common, (length - fixed) // self.rare_repeats))

    def instance(self, rng, size, variant):
        words = rng.sample(POOL, self.common + size)
        common, rare = words[: self.common], words[self.common:]
        text = common * self.repeats + rare * self.rare_repeats
        rng.shuffle(text)
        answers = sorted(common, key=POOL.index)  # in the symbols' order: computable from the words alone
        return [Text(tuple(text)), Text(self.question), *listed((w,) for w in answers)]


@register
class FrequentWords(Probe):
    name = "fwe"
    summary = ("frequent words extraction: N words whose k-th most frequent occurs floor(N k^-`alpha` / "
               "zeta(`alpha`)) times (Zipf, alpha 2), the most frequent one noise ('.'), shuffled; 'which are "
               "here again ?' asks for the `answers` (3) most frequent words after it, the most frequent "
               "first, each its own verdict (RULER fwe: alpha 2, the top 3)")
    reference = "Hsieh et al. 2024, RULER (NVIDIA/RULER, scripts/data/synthetic/freq_words_extraction.py)"
    options = {"alpha": 2, "answers": 3}
    grows = "words: N as large as fits"
    sized = True
    question = ("which", "are", "here", "again", "?")

    def check(self) -> None:
        super().check()
        if self.alpha < 2:
            raise PosbenchError(f"fwe alpha must be at least 2 (Zipf's law with a finite sum), got {self.alpha}")
        if self.answers >= len(POOL):
            raise PosbenchError(f"fwe answers must be below {len(POOL)} (the words), got {self.answers}")

    @property
    def chance(self) -> float:
        return 1 / len(POOL)

    def counts(self, n: int) -> list[int]:
        """The counts of the noise and the words, most frequent first, those that occur at all."""
        return [c for c in zipf_counts(n, len(POOL) + 1, self.alpha) if c > 0]

    def valid(self, n: int) -> bool:
        """Whether N = n ranks the answers strictly: each answer word, and the first word after
        them, occurs fewer times than the one before."""
        ranked = self.counts(n)[1: self.answers + 2]
        ranked += [0] * (self.answers + 1 - len(ranked))
        return all(a > b for a, b in zip(ranked, ranked[1:]))

    def tokens(self, n: int) -> int:
        return sum(self.counts(n)) + len(self.question) + answer_tokens(self.answers)

    def size_for(self, length: int) -> int:
        """The largest valid N whose prompt fits `length` (0: none)."""
        lo, hi = 0, 2 * length  # the words of N number at most N: the largest fitting N is below 2L
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if self.tokens(mid) <= length else (lo, mid - 1)
        while lo > 0 and not self.valid(lo):
            lo -= 1
        return lo

    def min_length(self) -> int:
        if self._min_length is None:
            n = 1
            while not self.valid(n):
                n += 1
            self._min_length = self.tokens(n)
        return self._min_length

    def instance(self, rng, size, variant):
        counts = self.counts(size)
        words = [NOISE, *rng.sample(POOL, len(counts) - 1)]  # ranked: the noise, then the words
        text = [w for w, c in zip(words, counts) for _ in range(c)]
        rng.shuffle(text)
        return [Text(tuple(text)), Text(self.question),
                *listed((w,) for w in words[1: self.answers + 1])]
