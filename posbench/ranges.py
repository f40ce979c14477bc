"""The values a setting may take (`Range`: `positive`, `at_least(1)`, `between(0, 1)`, `one_of(...)`,
combined with `&`), declared beside its default: by a scheme's `ranges` (posbench.schemes) and a
knob of a typed config (posbench.knobs). Imports no torch, so the command line can build its options
without it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from posbench.errors import PosbenchError

MAX_INT = 2**31 - 1  # bounds every integer setting: larger ones overflow tensors long before use


def check_number(value: Any, what: str) -> Any:
    """`value` when it is a finite number of at most MAX_INT in size, integer or not (else one-line
    error naming `what`); anything else as it is. A nan parameter would train to a nan loss, an inf
    one overflow, and so would 1e300 in any formula that squares or exponentiates it."""
    if isinstance(value, float) and not math.isfinite(value):
        raise PosbenchError(f"{what} must be a finite number, got {value}")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) > MAX_INT:
        raise PosbenchError(f"{what} is too large: {value} (at most {MAX_INT})")
    return value


@dataclass(frozen=True)
class Range:
    """The values a scheme parameter may take, declared beside its default in the scheme's
    `ranges`: `positive`, `non_negative`, `at_least(1)`, `above(1)`, `between(0, 1)`,
    `one_of("log", "power")`, combined with `&`. `coerce_params` refuses any other value in one
    line, before anything is built or written."""

    says: str  # completes "parameter KEY of scheme NAME must be ..."
    holds: Callable[[Any], bool]
    choices: tuple = ()  # the values of a `one_of`, which an unknown one is matched against

    def __and__(self, other: Range) -> Range:
        return Range(f"{self.says} and {other.says}", lambda v: self.holds(v) and other.holds(v))


def at_least(low) -> Range:
    return Range(f">= {low}", lambda v: v >= low)


def above(low) -> Range:
    return Range(f"> {low}", lambda v: v > low)


def below(high) -> Range:
    return Range(f"< {high}", lambda v: v < high)


def between(low, high) -> Range:
    """low <= value <= high."""
    return Range(f"in [{low}, {high}]", lambda v: low <= v <= high)


def one_of(*choices) -> Range:
    return Range(f"one of {', '.join(map(str, choices))}", lambda v: v in choices, tuple(choices))


positive = above(0)
non_negative = at_least(0)
even = Range("even", lambda v: v % 2 == 0)
# The most rows, units, buckets or taps a size parameter may ask for: beyond it a table or a
# hidden layer outgrows memory long before a tiny model could use it.
MAX_SIZE = 2**16
size = between(1, MAX_SIZE)  # a count of rows, units, buckets or taps
frequency_base = above(1)  # base^(-2t/d): frequencies that fall from 1, one wavelength per pair


def check_ranges(what: str, noun: str, defaults: dict, ranges: dict) -> None:
    """Each declared range is a Range of a declared parameter (or setting), and holds for its
    default (each item of a tuple default); one line naming `what` if not."""
    for key, allowed in ranges.items():
        if key not in defaults:
            raise PosbenchError(f"{what} declares a range for {key!r}, which is not one of its {noun}")
        if not isinstance(allowed, Range):
            raise PosbenchError(f"{what}: the range of {key} must be a posbench.schemes.Range "
                                "(positive, at_least(1), between(0, 1), one_of(...), ...)")
        for v in defaults[key] if isinstance(defaults[key], tuple) else (defaults[key],):
            if not allowed.holds(v):
                raise PosbenchError(f"{what}: the default {key}={v!r} is outside its range (must be {allowed.says})")
