"""The uncertainty next to every number posbench reports.

- Over seeds: the mean and a two-sided 95% Student t-interval, mean ± t(0.975, n-1) · s / sqrt(n).
  A t-interval rather than a bootstrap: with the 2-5 seeds a grid affords, a bootstrap's
  resamples take only a handful of distinct values and its interval is too narrow.
- Within one run: the standard error of a mean loss over scored windows by batch means (windows
  whose contexts overlap are grouped into blocks first, see `batch_se`), and the Wilson score
  interval of an accuracy, hits out of trials (Wilson 1927; it stays inside [0, 1] and keeps its
  coverage at 0 or all hits, where the normal interval collapses to a point).
- Paired differences: the same windows scored by two models, differences taken window by window
  and seed by seed (`paired_difference`).

Only the standard library: the t quantile is inverted from the exact t distribution function
for integer degrees of freedom (Abramowitz & Stegun 26.7.3-4).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Iterable, Sequence

LEVEL = 0.95
SERIES_DF = 100  # above this, the Cornish-Fisher expansion (error < 1e-6) replaces the exact series


def t_central(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with integer df (A&S 26.7.3 for odd df, 26.7.4 for even)."""
    theta = math.atan(abs(t) / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    if df % 2:
        term, total = math.cos(theta), 0.0
        for k in range(1, (df - 1) // 2 + 1):  # cos(θ) + 2/3 cos³(θ) + (2·4)/(3·5) cos⁵(θ) + ...
            total += term
            term *= c2 * (2 * k) / (2 * k + 1)
        return 2 / math.pi * (theta + math.sin(theta) * total) if df > 1 else 2 / math.pi * theta
    term, total = 1.0, 0.0
    for k in range(1, df // 2 + 1):  # 1 + 1/2 cos²(θ) + (1·3)/(2·4) cos⁴(θ) + ...
        total += term
        term *= c2 * (2 * k - 1) / (2 * k)
    return math.sin(theta) * total


def t_quantile(level: float, df: int | float) -> float:
    """The t with P(|T| <= t) = level: the half-width, in standard errors, of a two-sided interval."""
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if df < 1:
        return math.nan
    z = NormalDist().inv_cdf((1 + level) / 2)
    if math.isinf(df):
        return z
    df = int(df)
    if df > SERIES_DF:
        return (z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
                + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3))
    lo, hi = 0.0, 1.0
    while t_central(hi, df) < level:
        hi *= 2
    for _ in range(80):  # bisection to double precision
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_central(mid, df) < level else (lo, mid)
    return (lo + hi) / 2


@dataclass(frozen=True)
class Interval:
    """A mean with its standard error and two-sided interval over n observations (seeds; n = 1
    with an interval for a paired difference over the windows of one seed); se, lo and hi are NaN
    where there is no spread to measure."""

    mean: float
    lo: float
    hi: float
    n: int
    se: float

    @property
    def has_interval(self) -> bool:
        return not math.isnan(self.lo)

    def contains(self, value: float) -> bool:
        return self.lo <= value <= self.hi


def _clean(values: Iterable[float]) -> list[float]:
    return [float(v) for v in values if v is not None and not math.isnan(float(v))]


def std(values: Sequence[float]) -> float:
    """Sample standard deviation (n - 1 in the denominator); NaN below two values."""
    n = len(values)
    if n < 2:
        return math.nan
    m = sum(values) / n
    return math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1))


def mean_interval(values: Iterable[float], level: float = LEVEL) -> Interval:
    """Mean and t-interval of independent observations (NaNs dropped)."""
    xs = _clean(values)
    n = len(xs)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0, math.nan)
    mean = sum(xs) / n
    se = std(xs) / math.sqrt(n)
    half = t_quantile(level, n - 1) * se if n > 1 else math.nan
    return Interval(mean, mean - half, mean + half, n, se)


def projected_width(mean: float, sd: float, n: int, level: float = LEVEL) -> float:
    """Width of the t-interval of a mean over n observations of standard deviation sd, clipped
    to 0..1 as a table shows it: what a cell of that mean and spread would read with n seeds."""
    half = t_quantile(level, n - 1) * sd / math.sqrt(n)
    return min(mean + half, 1.0) - max(mean - half, 0.0)


def seeds_for_width(cells: Sequence[tuple[float, float, int]], target: float, most: int = 50) -> int | None:
    """The fewest seeds n (no fewer than any cell has now) at which the median of the cells' interval
    widths is `target` or less, each cell's (mean, sd, seeds) held as measured and every cell given
    n seeds: the projection of how many seeds a table needs. None past `most` or without cells."""
    if not cells:
        return None
    for n in range(max(max(k for _, _, k in cells), 2), most + 1):
        if quartiles(projected_width(m, sd, n) for m, sd, _ in cells)[1] <= target + 1e-12:
            return n
    return None


def wilson(hits: int, trials: int, level: float = LEVEL) -> tuple[float, float]:
    """Wilson score interval of a proportion hits / trials; (NaN, NaN) without trials."""
    if trials <= 0:
        return math.nan, math.nan
    if not 0 <= hits <= trials:
        raise ValueError(f"hits {hits} not in 0..{trials}")
    z = NormalDist().inv_cdf((1 + level) / 2)
    p = hits / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z / (1 + z * z / trials) * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials**2))
    return max(0.0, centre - half), min(1.0, centre + half)


def block_means(values: Sequence[float], block: int) -> list[float]:
    """Means of consecutive blocks of `block` values; a short last block is merged into the one
    before it so that every value counts."""
    block = max(1, block)
    n = len(values) // block
    if n <= 1:
        return [sum(values) / len(values)] if values else []
    edges = [k * block for k in range(n)] + [len(values)]
    return [sum(values[a:b]) / (b - a) for a, b in zip(edges[:-1], edges[1:])]


def batch_se(values: Sequence[float], block: int = 1) -> tuple[float, int]:
    """Standard error of the mean of a series whose neighbours may be correlated, by batch means:
    the standard deviation of block means over sqrt(blocks). Returns (se, blocks); se is NaN below
    two blocks. With block 1 it is the plain standard error of independent values."""
    means = block_means(values, block)
    return std(means) / math.sqrt(len(means)) if len(means) > 1 else math.nan, len(means)


def interval_from_se(mean: float, se: float, df: int, level: float = LEVEL) -> tuple[float, float]:
    half = t_quantile(level, df) * se
    return mean - half, mean + half


def paired_difference(a: dict, b: dict, block: int = 1, level: float = LEVEL) -> Interval:
    """Mean of a - b over paired observations, with its interval.

    `a` and `b` map a seed to the per-window values of that seed (the same windows, in the same
    order, for both). Windows are paired within a seed and seeds with each other; with two or
    more common seeds the unit is the seed (a t-interval of the per-seed mean differences, which
    carries the training noise), with one seed it is the window (batch means of the window
    differences: evaluation noise only, the model is fixed)."""
    seeds = sorted(set(a) & set(b))
    if not seeds:
        return Interval(math.nan, math.nan, math.nan, 0, math.nan)
    diffs = {}
    for s in seeds:
        if len(a[s]) != len(b[s]):
            raise ValueError(f"seed {s}: {len(a[s])} windows against {len(b[s])}")
        diffs[s] = [x - y for x, y in zip(a[s], b[s])]
    if len(seeds) >= 2:
        return mean_interval([sum(d) / len(d) for d in diffs.values()], level)
    d = diffs[seeds[0]]
    mean = sum(d) / len(d)
    se, blocks = batch_se(d, block)
    lo, hi = interval_from_se(mean, se, blocks - 1, level) if blocks > 1 else (math.nan, math.nan)
    return Interval(mean, lo, hi, 1, se)


def accuracy_columns(hits: int, trials: int) -> dict[str, float]:
    """The acc_lo and acc_hi columns of a probes.csv row: Wilson 95%."""
    lo, hi = wilson(hits, trials)
    return {"acc_lo": lo, "acc_hi": hi}


# --- all-or-nothing outcomes over seeds --------------------------------------------------------
# A seed often keeps a probe or loses it: 95, 90 and 0 average to 62 with an interval from 0 to
# 100. The statistics below describe such outcomes without assuming them normal.


def quartiles(values: Iterable[float]) -> tuple[float, float, float]:
    """(first quartile, median, third quartile) of `values` (NaNs dropped), by linear
    interpolation between order statistics (numpy's default, Hyndman and Fan's type 7)."""
    xs = sorted(_clean(values))
    if not xs:
        return math.nan, math.nan, math.nan

    def at(q: float) -> float:
        h = (len(xs) - 1) * q
        lo = math.floor(h)
        return xs[lo] + (h - lo) * (xs[min(lo + 1, len(xs) - 1)] - xs[lo])

    return at(0.25), at(0.5), at(0.75)


def holding(at_one: dict, at_ratio: dict, keep: float = 0.5) -> tuple[int, int]:
    """Seeds (keys of both dicts) whose accuracy at a longer length keeps at least `keep` of their
    accuracy at the training length: (how many hold, how many seeds). A seed with no accuracy at
    the training length (0) holds nothing."""
    seeds = sorted(set(at_one) & set(at_ratio))
    held = sum(1 for s in seeds if at_one[s] > 0 and at_ratio[s] >= keep * at_one[s])
    return held, len(seeds)


def sign_test(differences: Iterable[float]) -> tuple[float, int, int]:
    """Exact two-sided sign test that positive and negative differences are equally likely (ties
    dropped): (p, positives, negatives); p = 1 without a nonzero difference."""
    xs = _clean(differences)
    pos, neg = sum(1 for x in xs if x > 0), sum(1 for x in xs if x < 0)
    n = pos + neg
    if n == 0:
        return 1.0, 0, 0
    tail = sum(math.comb(n, i) for i in range(min(pos, neg) + 1)) / 2**n
    return min(1.0, 2 * tail), pos, neg


PERMUTATION_MAX = 20  # 2^20 sign assignments: exact, and a fraction of a second


def permutation_test(differences: Iterable[float]) -> float:
    """Exact two-sided paired permutation test (the sign of each seed's difference flipped in all
    2^n ways: under "A and B alike" each is as likely): the share of assignments whose |sum| is at
    least the observed one. NaN for more than PERMUTATION_MAX or no differences."""
    import numpy as np

    xs = _clean(differences)
    n = len(xs)
    if n == 0 or n > PERMUTATION_MAX:
        return math.nan
    observed = abs(sum(xs)) - 1e-9 * max(1.0, sum(abs(x) for x in xs))  # float ties count as ties
    totals = np.zeros(1)
    for x in xs:  # every signed sum of the seeds so far, doubling with each seed
        totals = np.concatenate([totals + x, totals - x])
    return float(np.count_nonzero(np.abs(totals) >= observed)) / 2**n


def t_test_p(differences: Iterable[float]) -> float:
    """Two-sided p of the one-sample t-test that the mean difference is zero (NaN below two values
    or without spread unless the mean is nonzero: then 0)."""
    xs = _clean(differences)
    n = len(xs)
    if n < 2:
        return math.nan
    mean, sd = sum(xs) / n, std(xs)
    if sd == 0:
        return 1.0 if mean == 0 else 0.0
    return max(0.0, 1.0 - t_central(abs(mean) / (sd / math.sqrt(n)), n - 1))


def paired_p(differences: Iterable[float]) -> float:
    """The p a seed-paired comparison is tested by: the exact permutation test up to
    PERMUTATION_MAX seeds, the t-test's past it; NaN below two seeds."""
    xs = _clean(differences)
    if len(xs) < 2:
        return math.nan
    return permutation_test(xs) if len(xs) <= PERMUTATION_MAX else t_test_p(xs)


FDR = 0.05  # the false discovery rate a family of seed-paired verdicts is held to


def benjamini_hochberg(pvalues: Sequence[float]) -> list[float]:
    """Benjamini-Hochberg adjusted p-values (q) of a family of tests, in the order given: the
    family is every value that is not NaN (a NaN stays NaN). A test survives a false discovery
    rate of F when its q is at most F: q of the i-th smallest of m p-values is
    min over j >= i of p_(j) * m / j, at most 1 (Benjamini & Hochberg 1995)."""
    ranked = sorted((p, k) for k, p in enumerate(pvalues) if not math.isnan(p))
    m = len(ranked)
    q = [math.nan] * len(pvalues)
    running = 1.0
    for i in range(m - 1, -1, -1):
        p, k = ranked[i]
        running = min(running, p * m / (i + 1))
        q[k] = running
    return q
