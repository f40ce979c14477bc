"""RULER's synthetic prompts for a pretrained model (Hsieh et al. 2024, "RULER: What's the Real
Context Size of Your Long-Context Language Models?", github.com/hsiehjackson/RULER).

The tasks of RULER's scripts/synthetic.yaml, written here from its generators
(scripts/data/synthetic/niah.py, variable_tracking.py, common_words_extraction.py,
freq_words_extraction.py): the same templates and answer prefixes (its `base` model template: the
task text as is), the same needles, haystacks, counts and depths, and its way of fitting a length:
the most haystack (in its increments) whose prompt, plus the tokens the task lets the model
generate, fits the length in the model's tokens. Scored as RULER scores them: string_match_all,
the share of a prompt's references found in the output, case-insensitive.

What RULER reads that posbench does not ship, and what stands in for it (posbench/docs/pretrained.md):
- Paul Graham's essays (the essay haystack): the prose of the standard library's documentation
  (pydoc_data.topics, part of the built-in `pystdlib` corpus), or files the user names.
- wonderwords' nouns, adjectives and verbs (keys and the common words): the distinct lower-case
  words of that essay text; a key is two of them joined by a hyphen, as RULER's `adjective-noun`.
- nltk's sentence splitter: a split after `.`, `!` or `?` followed by white space.
"""

from __future__ import annotations

import hashlib
import random
import re
import string
import uuid
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Callable

from posbench.errors import PosbenchError, did_you_mean
from posbench.matching import clean, references_found  # noqa: F401 - RULER's scoring, used by the text probes

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."
DEPTHS = [round(100 * i / 39) for i in range(40)]  # numpy.linspace(0, 100, 40) rounded: RULER's needle depths (%)
TEMPLATES = {  # family -> (task template, answer prefix, tokens to generate): RULER's constants.py
    "niah": ("Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. "
             "I will quiz you about the {type_needle_v} afterwards.\n{context}\nWhat are all the special magic "
             "{type_needle_v} for {query} mentioned in the provided text?",
             " The special magic {type_needle_v} for {query} mentioned in the provided text are", 128),
    "vt": ("Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\n"
           "Question: Find all variables that are assigned the value {query} in the text above.",
           # "assgined": RULER's spelling, kept so that the prompt is its prompt
           " Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables are "
           "assgined the value {query}, they are: ", 30),
    "cwe": ("Below is a numbered list of words. In these words, some appear more often than others. Memorize the "
            "ones that appear most often.\n{context}\nQuestion: What are the 10 most common words in the above list?",
            " Answer: The top 10 words that appear most often in the list are:", 120),
    "fwe": ("Read the following coded text and track the frequency of each coded word. Find the three most "
            "frequently appeared coded words. {context}\nQuestion: Do not provide any explanation. Please ignore "
            "the dots '....'. What are the three most frequently appeared words in the above coded text?",
            " Answer: According to the coded text above, the three most frequently appeared words are:", 50),
}
COMMON = 10  # cwe: the common words asked for
HOPS = 4  # vt: assignments after the first, one chain
ICL_LENGTH = 500  # vt: the worked example's length, its variables of 3 letters (RULER's is_icl)
FWE_ALPHA = 2.0  # fwe: the Zipf exponent of the word counts
FWE_WORD = 6  # fwe: letters of a coded word


@dataclass(frozen=True)
class Task:
    """One of RULER's synthetic tasks: its family and, for a needle task, the haystack (noise: the
    grass-is-green sentences, essay: prose, needle: needles with other keys) and the needles."""

    name: str
    family: str
    haystack: str = ""
    key: str = "words"  # what keys and values are: words, numbers or uuids
    value: str = "numbers"
    keys: int = 1
    values: int = 1  # per key
    queries: int = 1  # keys asked for

    @property
    def generate(self) -> int:
        return TEMPLATES[self.family][2]


TASKS = {t.name: t for t in (  # RULER's scripts/synthetic.yaml, its QA tasks left out
    Task("niah_single_1", "niah", "noise"),
    Task("niah_single_2", "niah", "essay"),
    Task("niah_single_3", "niah", "essay", value="uuids"),
    Task("niah_multikey_1", "niah", "essay", keys=4),
    Task("niah_multikey_2", "niah", "needle"),
    Task("niah_multikey_3", "niah", "needle", key="uuids", value="uuids"),
    Task("niah_multivalue", "niah", "essay", values=4),
    Task("niah_multiquery", "niah", "essay", keys=4, queries=4),
    Task("vt", "vt"),
    Task("cwe", "cwe"),
    Task("fwe", "fwe"),
)}
PREFIX = "ruler:"


def is_ruler(name: str) -> bool:
    return name.startswith(PREFIX)


def task_of(name: str) -> Task:
    """The task of a probe name `ruler:TASK`; one line with the nearest names otherwise."""
    task = name.removeprefix(PREFIX)
    if task not in TASKS:
        raise did_you_mean(task, sorted(TASKS), "ruler task")
    return TASKS[task]


@dataclass(frozen=True)
class Prompt:
    """A prompt's text (answer prefix included), the references its output is scored against, how
    much haystack it holds (essay words, noise or needle lines, listed words or coded words), and
    for cwe and fwe the distinct words an answer could be guessed from."""

    text: str
    answers: tuple[str, ...]
    units: int
    pool: int = 0


@dataclass(frozen=True)
class Essay:
    """The essay haystack: its words (white space runs made one space, as RULER's) and the distinct
    lower-case words that keys and the common words are drawn from."""

    words: tuple[str, ...]
    vocabulary: tuple[str, ...]
    fingerprint: str


@lru_cache(maxsize=4)
def load_essay(spec: str) -> Essay:
    """The essay text of `spec`: `pystdlib` (the standard library's documentation prose,
    pydoc_data.topics, topics in name order) or `files:PATH_OR_GLOB` (the files' documents)."""
    if spec == "pystdlib":
        try:
            from pydoc_data.topics import topics
        except ImportError:
            raise PosbenchError("this Python ships no pydoc_data: name an essay with --ruler-essay files:PATH") from None
        text = "\n".join(topics[k] for k in sorted(topics))
    elif spec.startswith("files:"):
        from posbench.data import load_corpus

        text = "\n".join(doc for docs in load_corpus(spec).splits.values() for doc in docs)
    else:
        raise PosbenchError(f"bad ruler essay {spec!r}: use pystdlib or files:PATH_OR_GLOB")
    words = tuple(re.sub(r"\s+", " ", text).strip().split(" "))
    vocabulary = tuple(sorted(set(re.findall(r"\b[a-z]{4,12}\b", text))))
    if len(words) < 1000 or len(vocabulary) < 100:
        raise PosbenchError(f"ruler essay {spec} is too short: {len(words)} words, {len(vocabulary)} distinct "
                            "lower-case ones (at least 1000 and 100)")
    return Essay(words, vocabulary, hashlib.sha256(text.encode()).hexdigest()[:12])


# --- needles in a haystack (niah.py) ---------------------------------------------------------


def random_item(rng: random.Random, kind: str, essay: Essay) -> str:
    """A key or value: a 7-digit number, a UUID, or two words joined by a hyphen."""
    if kind == "numbers":
        return str(rng.randint(10**6, 10**7 - 1))
    if kind == "uuids":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    return f"{rng.choice(essay.vocabulary)}-{rng.choice(essay.vocabulary)}"


def sentences(text: str) -> list[str]:
    """Sentences of prose: a split after `.`, `!` or `?` and white space (nltk's punkt in RULER)."""
    return [s for s in re.split(r"(?<=[.!?])\s+", text.strip()) if s]


def insertion_points(count: int, depths: list[int]) -> list[int]:
    """Where needles go among `count` sentences for depths in percent: after int(count * depth / 100)
    sentences, in order, with 0 and `count` around them (RULER's essay haystack)."""
    return [0] + sorted(int(count * d / 100) for d in depths) + [count]


def essay_context(rng: random.Random, words: list[str], needles: list[str]) -> str:
    """The essay's first words cut into sentences, each needle placed between two at a depth drawn
    from DEPTHS (distinct for distinct needles)."""
    sents = sentences(" ".join(words))
    points = insertion_points(len(sents), rng.sample(DEPTHS, len(needles)))
    parts = []
    for i in range(1, len(points)):
        parts.append(" ".join(sents[points[i - 1]: points[i]]))
        if i - 1 < len(needles):
            parts.append(needles[i - 1])
    return " ".join(parts)


def niah(task: Task, rng: random.Random, units: int, essay: Essay) -> Prompt:
    """A needle prompt with `units` of haystack: essay words, noise paragraphs or other needles."""
    keys, values, needles = [], [], []
    for _ in range(max(task.keys, task.queries)):
        keys.append(random_item(rng, task.key, essay))
        values.append([random_item(rng, task.value, essay) for _ in range(task.values)])
        needles += [NEEDLE.format(type_needle_v=task.value, key=keys[-1], value=v) for v in values[-1]]
    rng.shuffle(needles)
    if task.haystack == "essay":
        words = [essay.words[i % len(essay.words)] for i in range(units)]  # a short essay is read again
        context = essay_context(rng, words, needles)
    else:
        lines = [NOISE] * units if task.haystack == "noise" else [
            NEEDLE.format(type_needle_v=task.value, key=random_item(rng, task.key, essay),
                          value=random_item(rng, task.value, essay)) for _ in range(units)]
        for index, needle in zip(sorted(rng.sample(range(units), len(needles)), reverse=True), needles):
            lines.insert(index, needle)
        context = "\n".join(lines)
    asked = rng.sample(range(len(keys)), task.queries)
    queries = [keys[i] for i in asked]
    query = queries[0] if len(queries) == 1 else ", ".join(queries[:-1]) + ", and " + queries[-1]
    template, prefix, _ = TEMPLATES["niah"]
    template, kind = template + prefix, task.value
    if task.queries * task.values == 1:  # RULER's singular wording for one answer
        for plural, singular in (("Some", "A"), ("are all", "is"), ("are", "is"), ("answers", "answer")):
            template = template.replace(plural, singular)
        kind = kind[:-1]
    text = template.format(type_needle_v=kind, context=context, query=query)
    return Prompt(text, tuple(v for i in asked for v in values[i]), units)


# --- variable tracking (variable_tracking.py) ------------------------------------------------


def chain(rng: random.Random, letters: int) -> tuple[list[str], list[str]]:
    """One chain of HOPS + 1 distinct variables: `VAR A = N` then `VAR B = VAR A ` ..."""
    names: list[str] = []
    while len(names) < HOPS + 1:
        name = "".join(rng.choices(string.ascii_uppercase, k=letters))
        names += [name] if name not in names else []
    statements = [f"VAR {names[0]} = {rng.randint(10000, 99998)}"]
    statements += [f"VAR {names[j + 1]} = VAR {names[j]} " for j in range(HOPS)]
    return names, statements


def vt_text(rng: random.Random, units: int, letters: int, template: str) -> tuple[str, list[str]]:
    """The task text with `units` noise paragraphs and the chain's statements among them."""
    names, statements = chain(rng, letters)
    lines = [NOISE + "\n"] * units
    for j, where in enumerate(sorted(rng.sample(range(len(lines)), len(statements)))):
        lines.insert(where + j, statements[j])
    context = " ".join(lines).replace(". \n", ".\n")
    value = statements[0].split("=")[-1].strip()
    return template.format(context=context, query=value, num_v=HOPS + 1), names


def icl_template() -> str:
    """RULER's worked example's template: its code cuts the model template off the question and
    drops the question's last word, joining the rest by single spaces (for the base template this
    loses "above." and the blank lines), then adds the answer prefix."""
    template, prefix, _ = TEMPLATES["vt"]
    return " ".join(template.split()[:-1]) + prefix


def vt(rng: random.Random, units: int, example: str) -> Prompt:
    """Variable tracking after a worked example (RULER adds one, fitted to ICL_LENGTH tokens)."""
    template, prefix, _ = TEMPLATES["vt"]
    text, names = vt_text(rng, units, 5, template + prefix)
    return Prompt(" " + example + "\n\n" + text, tuple(names), units)


def vt_example(rng: random.Random, units: int) -> str:
    """The worked example with its answer, as RULER puts it before the task."""
    text, names = vt_text(rng, units, 3, icl_template())
    return text + " " + " ".join(names) + "\n\n"


# --- common words (common_words_extraction.py) -----------------------------------------------


def cwe_sizes(length: int) -> tuple[tuple[int, int, int], tuple[int, int]]:
    """(example words, common and rare repeats of the example), (common and rare repeats of the
    task): RULER's smaller setting below 4,096 tokens."""
    return ((20, 3, 1), (6, 1)) if length < 4096 else ((40, 10, 3), (30, 3))


def word_list(rng: random.Random, words: list[str], count: int, common: int, rare: int) -> tuple[str, list[str]]:
    """`count` words, the first COMMON of them `common` times each and the rest `rare` times, shuffled
    and numbered `1. w 2. w ...`; and the common ones."""
    chosen = rng.sample(words, count)
    listed = chosen[:COMMON] * common + chosen[COMMON:] * rare
    rng.shuffle(listed)
    return numbered(listed), chosen[:COMMON]


def numbered(words: list[str]) -> str:
    return " ".join(f"{i + 1}. {w}" for i, w in enumerate(words))


def cwe(rng: random.Random, units: int, length: int, essay: Essay) -> Prompt:
    """The common words of a list of `units` words, after a worked example with its answer."""
    words = list(essay.vocabulary)
    (size, common, rare), (task_common, task_rare) = cwe_sizes(length)
    template, prefix, _ = TEMPLATES["cwe"]
    shown, answer = word_list(rng, words, size, common, rare)
    context, common_words = word_list(rng, words, units, task_common, task_rare)
    example = (template + prefix).format(context=shown) + numbered(answer)
    return Prompt(example + "\n" + (template + prefix).format(context=context), tuple(common_words), units, units)


# --- frequent words (freq_words_extraction.py) -----------------------------------------------


@cache
def zeta(alpha: float, terms: int = 1000) -> float:
    """Riemann's zeta at alpha > 1 (scipy.special.zeta in RULER): the first terms summed, the rest by
    Euler-Maclaurin."""
    head = sum(k ** -alpha for k in range(1, terms))
    return head + terms ** (1 - alpha) / (alpha - 1) + terms ** -alpha / 2 + alpha * terms ** (-alpha - 1) / 12


@cache
def zipf_counts(units: int, vocabulary: int, alpha: float = FWE_ALPHA) -> tuple[int, ...]:
    """How often the word of rank k = 1..`vocabulary` appears among `units` words:
    int(units * k^-alpha / zeta(alpha)), RULER's freq_words_extraction.py. Cached: every prompt of a
    size draws the same counts."""
    z = zeta(alpha)
    return tuple(int(units * k ** -alpha / z) for k in range(1, vocabulary + 1))


def fwe(rng: random.Random, units: int, length: int) -> Prompt:
    """Coded words of FWE_WORD letters in Zipf counts; the top one is the noise `...`, the next three
    the answer. The vocabulary is length // 50 words, as RULER's."""
    size = length // 50
    vocab: set[str] = set()
    while len(vocab) < size:
        vocab.add("".join(rng.choices(string.ascii_lowercase, k=FWE_WORD)))
    ranked = sorted(vocab)
    rng.shuffle(ranked)
    ranked[0] = "..."
    counts = zipf_counts(units, size)
    text = [w for w, n in zip(ranked, counts) for _ in range(n)]
    rng.shuffle(text)
    template, prefix, _ = TEMPLATES["fwe"]
    shown = sum(n > 0 for n in counts) - 1  # the coded words in the text, the noise left out
    return Prompt((template + prefix).format(context=" ".join(text)), tuple(ranked[1:4]), units, shown)


# --- lengths ------------------------------------------------------------------------------------


def increment(task: Task, length: int) -> int:
    """RULER's step of haystack while it fits a length: essay words by 500, noise and needle lines by
    25 (5 below 4,096 tokens), vt noise by 10, cwe words by 10, fwe words by length // 32."""
    if task.family == "niah":
        return 500 if task.haystack == "essay" else (25 if length >= 4096 else 5)
    return {"vt": 10, "cwe": 10, "fwe": max(1, length // 32)}[task.family]


def largest(make: Callable[[int], Prompt], count: Callable[[str], int], budget: int, step: int,
            most: int | None = None) -> tuple[Prompt | None, int]:
    """The prompt of the most haystack, in multiples of `step` (at most `most`), whose text takes at
    most `budget` tokens (None when one step is already too long), and the tokens of one step's."""
    least = count(make(step).text)
    fits = lambda k: count(make(k * step).text) <= budget  # noqa: E731
    top = most // step if most else None
    if least > budget:
        return None, least
    low, high = 1, 2
    while (top is None or high <= top) and fits(high):
        low, high = high, high * 2
    high = min(high, top + 1) if top else high
    while high - low > 1:  # low fits; high does not, or is past `most`
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return make(low * step), least


def builder(task: Task, length: int, seed: str, count: Callable[[str], int],
            essay: Essay) -> tuple[Callable[[int], Prompt], int, int | None]:
    """How the prompts of `task` grow: the prompt of a haystack size (each size drawn from `seed`
    alike), the step of the size and its most (cwe: the words there are)."""
    fresh = lambda: random.Random(seed)  # noqa: E731
    if task.family == "niah":
        return (lambda k: niah(task, fresh(), k, essay)), increment(task, length), None
    if task.family == "vt":
        example, _ = largest(lambda k: Prompt(vt_example(random.Random(seed + ":example"), k), (), k), count,
                             ICL_LENGTH - task.generate, 5)
        if example is None:
            raise PosbenchError(f"ruler:vt's worked example does not fit in {ICL_LENGTH} tokens of this tokenizer")
        return (lambda k: vt(fresh(), k, example.text)), increment(task, length), None
    if task.family == "cwe":
        return (lambda k: cwe(fresh(), k, length, essay)), increment(task, length), len(essay.vocabulary)
    return (lambda k: fwe(fresh(), k, length)), increment(task, length), None


def prompt(task: Task, length: int, seed: str, count: Callable[[str], int], essay: Essay) -> Prompt:
    """The prompt of `task` for a model whose tokenizer counts tokens by `count`: the most haystack
    whose prompt and the task's generated tokens fit in `length`. One line when nothing fits."""
    make, step, most = builder(task, length, seed, count, essay)
    found, least = largest(make, count, length - task.generate, step, most)
    if found is None or found.pool < len(found.answers) and task.family == "fwe":
        raise PosbenchError(f"length {length} is too short for ruler:{task.name}: its prompt with the least "
                            f"haystack takes {least} tokens, plus {task.generate} to generate"
                            + ("; its answers' words appear from longer texts on" if found else ""))
    return found


# --- scoring (RULER's scripts/eval/synthetic/constants.py) ---------------------------------------


def chance(p: Prompt) -> float:
    """A reference found by a guess from the prompt's own words: the answers' share of the distinct
    listed words for cwe and fwe; nil for 7-digit numbers, UUIDs and variable names."""
    return len(p.answers) / p.pool if p.pool else 0.0
