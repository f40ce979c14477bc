"""The probe family's symbol vocabulary: every key, value, digit, word and separator is one token.

Probe text is never split by a tokenizer trained on it: a key is the same token in the context and
in the query, and a 4-digit value is four digit tokens wherever it occurs (Zoology's MQAR draws
keys and values as single tokens from disjoint halves of its vocabulary). The list is fixed, so
its name and size, recorded in a run's config, say everything about it; a change to it gets a
new name.
"""

from __future__ import annotations

PAD = "<pad>"
SEPARATORS = ("|", "?", "=", "+", ",", ".", ":")
# The haystack's words (RULER's noise sentences) and the probes' question words.
WORDS = tuple(
    "the grass is green sky blue sun yellow here we go there and back again "
    "pass key remember it what are which hold they var copy reverse sort parity addition".split()
)
DIGITS = tuple(str(d) for d in range(10))
N_KEYS = 64
N_VALUES = 64
KEYS = tuple(f"k{i}" for i in range(N_KEYS))  # mqar keys, needle words, variable names
VALUES = tuple(f"v{i}" for i in range(N_VALUES))  # mqar values, disjoint from the keys

SYMBOLS = (PAD, *SEPARATORS, *WORDS, *DIGITS, *KEYS, *VALUES)
NAME = f"symbols{len(SYMBOLS)}"
FILLER = tuple("the grass is green . the sky is blue . the sun is yellow . here we go . "
               "there and back again .".split())


class SymbolTokenizer:
    """Symbols to ids and back; `decode` joins symbols with spaces, for reading."""

    vocab_size = len(SYMBOLS)
    pad_id = 0
    name = NAME

    def __init__(self):
        self.ids = {s: i for i, s in enumerate(SYMBOLS)}

    def encode(self, symbols) -> list[int]:
        return [self.ids[s] for s in symbols]

    def decode(self, ids) -> str:
        return " ".join(SYMBOLS[i] for i in ids if i != self.pad_id)


TOKENIZER = SymbolTokenizer()
