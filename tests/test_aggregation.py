"""RULER's aggregation probes (cwe, fwe): their counts against RULER's generators' numbers, their
growth with the length, the order of their answers, and `posbench probe` on a run trained on one."""

import math
import random
from collections import Counter

import pytest

from posbench import config, results
from posbench.cli import main
from posbench.grid import run_task
from posbench.probes import Text, parse_probe
from posbench.probes.aggregation import NOISE, POOL
from posbench.ruler import zeta, zipf_counts
from posbench.probes.symbols import SYMBOLS


def text_of(segments) -> list[str]:
    """The word list of an instance: its first segment."""
    assert isinstance(segments[0], Text)
    return list(segments[0].symbols)


def answers_of(segments) -> list[str]:
    return [s.symbols[0] for s in segments if type(s).__name__ == "Answer"]


def test_zeta_is_riemanns():
    assert zeta(2) == pytest.approx(math.pi**2 / 6, abs=1e-12)
    assert zeta(3) == pytest.approx(1.2020569031595942, abs=1e-12)


def test_fwe_counts_are_rulers():
    # RULER's freq_words_extraction.py: int(num_words * k**-alpha / scipy.special.zeta(alpha)),
    # num_words 1000, alpha 2 -> 607, 151, 67, 37, 24 for the five most frequent words
    assert zipf_counts(1000, 5, 2) == (607, 151, 67, 37, 24)
    fwe = parse_probe("fwe")
    segments = fwe.instance(random.Random(0), 1000, None)
    counts = Counter(text_of(segments))
    assert counts[NOISE] == 607  # the most frequent word is noise, not asked for
    assert [counts[w] for w in answers_of(segments)] == [151, 67, 37]  # the next three, the most frequent first
    assert sorted(counts.values(), reverse=True)[:5] == [607, 151, 67, 37, 24]


def test_cwe_at_rulers_long_setting_repeats_its_words_as_ruler():
    # RULER from 4k tokens: 10 common words 30 times each, the others 3 times each
    cwe = parse_probe("cwe:common=10,repeats=30,rare_repeats=3")
    segments = cwe.instance(random.Random(0), 90, None)
    words = text_of(segments)
    counts = Counter(words)
    assert len(words) == 10 * 30 + 90 * 3 and sorted(Counter(counts.values()).items()) == [(3, 90), (30, 10)]
    answers = answers_of(segments)
    assert {counts[w] for w in answers} == {30} and answers == sorted(answers, key=POOL.index)
    assert answers != sorted(answers, key=words.index)  # revision 1's order (first occurrence) is not it here


def test_sizes_grow_with_the_length():
    cwe, fwe = parse_probe("cwe"), parse_probe("fwe")
    # cwe: 4 words x 3, the question (5) and 4 answers with commas (7) leave L - 24 rare words, at most 124
    assert [cwe.size_for(n) for n in (24, 25, 64, 128, 512)] == [0, 1, 40, 104, len(POOL) - 4]
    sizes = [fwe.size_for(n) for n in (64, 128, 256, 512, 4096)]
    assert sizes == sorted(sizes) and sizes[-1] > 4000 and all(fwe.valid(n) for n in sizes)
    assert all(fwe.tokens(n) <= length for n, length in zip(sizes, (64, 128, 256, 512, 4096)))
    ties = [n for n in range(1, 200) if not fwe.valid(n)]
    assert ties  # some sizes rank two answers equal: they are skipped
    assert all(fwe.size_for(fwe.tokens(n)) != n for n in ties)
    assert fwe.min_length() == fwe.tokens(next(n for n in range(1, 200) if fwe.valid(n)))


def test_examples_are_the_length_and_their_words_one_symbol():
    for name in ("cwe", "fwe"):
        probe = parse_probe(name)
        for length in (probe.min_length(), 64, 300):
            e = probe.example(random.Random(length), length)
            assert len(e.tokens) == length and all(SYMBOLS[e.tokens[a[0]]] in POOL for a in e.answers)


@pytest.mark.parametrize("spec, message", [
    ("cwe:repeats=1", "cwe repeats must exceed rare_repeats"),
    ("cwe:common=128", "cwe common must be below 128"),
    ("fwe:alpha=1", "fwe alpha must be at least 2"),
])
def test_bad_options_are_one_clear_line(spec, message, capsys):
    assert main(["train", "--scheme", "rope", "--data", spec, "--steps", "1"]) == 2
    assert message in capsys.readouterr().err


TASK = """
version = 1
name = "tinyaggregation"
schemes = ["rope"]
[data]
spec = "cwe"
[model]
d_model = 16
n_layers = 1
n_heads = 2
[train]
train_len = 40
steps = 2
batch_size = 4
eval_interval = 2
[probes]
names = ["cwe", "fwe"]
trials = 3
"""


def test_a_task_trains_and_scores_both(tmp_path, capsys):
    path = tmp_path / "tinyaggregation.toml"
    path.write_text(TASK)
    out = tmp_path / "out"
    summary = run_task(config.load_task(str(path)), out, device="cpu", speed=False)
    assert summary["trained"] == 2 and summary["probes"] == 2
    rows = results.read_rows(out / "probes.csv")
    answers = {"cwe": 4, "fwe": 3}  # per prompt: every common word, the three most frequent
    assert {(r["probe"], r["eval_len"]) for r in rows} == {(p, str(n)) for p in answers for n in (40, 80, 160, 320)}
    for r in rows:
        assert int(r["answers"]) == 3 * answers[r["probe"]] and float(r["chance"]) == 1 / 128
        assert float(r["accuracy"]) == int(r["hits"]) / int(r["answers"])
    capsys.readouterr()
    assert main(["probe", "--list"]) == 0
    listed = capsys.readouterr().out
    assert "common words extraction" in listed and "frequent words extraction" in listed
