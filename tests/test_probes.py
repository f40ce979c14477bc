"""Synthetic probes: deterministic generators of examples of exactly L tokens in one-token symbols
whose answers an independent solver agrees with, the length curriculum, the answer-only loss mask,
per-answer and exact verdicts (oracle, greedy decoding), the learned-in-length gate, the `posbench
probe` command, the [probes] step of `posbench run`, and bad input."""

import contextlib
import random
import re
import shutil
from collections import Counter

import pandas as pd
import pytest
import torch

from conftest import TINY_PASSKEY, tiny_model
from posbench import batches, config, effective, probing, readers, results, stats
from posbench.cli import main
from posbench.config import TrainConfig
from posbench.data import DataConfig
from posbench.errors import PosbenchError
from posbench.grid import grid, run_task
from posbench.probes import PROBES, TOKENIZER, parse_probe
from posbench.probes.symbols import KEYS, SYMBOLS, VALUES

NAMES = sorted(PROBES)
LENGTH = 96  # tokens: long enough for every probe's default settings


def symbols(tokens) -> list[str]:
    return [SYMBOLS[t] for t in tokens]


def sentences(before: list[str]) -> list[list[str]]:
    out, current = [], []
    for s in before:
        current.append(s)
        if s in (".", "?"):
            out.append(current)
            current = []
    return out + [current]


def needles(before: list[str]) -> dict[str, list[str]]:
    """KEY -> the values of its needles 'KEY is d d d .', in order."""
    found: dict[str, list[str]] = {}
    for i, s in enumerate(before):
        if s in KEYS and i + 1 < len(before) and before[i + 1] == "is":
            value = before[i + 2: before.index(".", i)]
            found.setdefault(s, []).append("".join(value))
    return found


def question(before: list[str]) -> list[str]:
    start = max(i for i, s in enumerate(before) if s in ("what", "which"))
    return before[start:]


def solve(name: str, e) -> list[str]:
    """Each answer, worked out from the symbols before the first answer alone (mqar: before each)."""
    toks = symbols(e.tokens)
    before = toks[: e.answers[0][0]]
    if name == "mqar":
        listing = toks[: next(i for i, s in enumerate(toks) if s not in KEYS + VALUES)]
        pairs = dict(zip(listing[::2], listing[1::2]))
        return [pairs[toks[a[0] - 1]] for a in e.answers]
    if name == "passkey":
        i = before.index("pass")
        return ["".join(before[i + 3: before.index(".", i)])]
    if name in ("copy", "reverse", "sort", "parity", "addition"):
        return algorithmic(name, before)
    if name in ("cwe", "fwe"):
        return most_frequent(name, before, len(e.answers))
    q = question(before)
    asked = [s for s in q[: q.index("?")] if s in KEYS]  # the keys asked for, before the answer prefix
    text = needles(before[: -len(q)])
    if name == "multikey":
        return [text[asked[0]][0]]
    if name == "multivalue":
        return text[asked[0]]
    if name == "multiquery":
        return [text[k][0] for k in asked]
    assert name == "vartrack"
    value = "".join(s for s in question(before) if s.isdigit())
    holding = []
    for s in sentences(before[: -len(question(before))]):
        if "var" in s:  # 'var X = d d d d .' or 'var Y = var X .' after some filler
            i = s.index("var")
            target, source = s[i + 1], s[i + 3:-1]
            if "".join(source) == value or (source[:1] == ["var"] and source[1] in holding):
                holding.append(target)
    return holding


def most_frequent(name: str, before: list[str], n: int) -> list[str]:
    """The n most frequent words of the text before the question: cwe's in the symbols' order
    (keys, then values, each by number), fwe's the most frequent first."""
    text = [s for s in before[: len(before) - len(question(before))] if s in KEYS + VALUES]
    top = [w for w, _ in Counter(text).most_common(n)]
    return sorted(top, key=(KEYS + VALUES).index) if name == "cwe" else top


def algorithmic(name: str, before: list[str]) -> list[str]:
    xs = before[len(before) - before[::-1].index(name):-1]
    if name == "addition":
        cut = xs.index("+")
        a, b = (list(map(int, part))[::-1] for part in (xs[:cut], xs[cut + 1:]))
        total = int("".join(map(str, a))) + int("".join(map(str, b)))
        return list(str(total).zfill(len(a) + 1)[::-1])
    xs = list(map(int, xs))
    return [str(y) for y in {"copy": xs, "reverse": xs[::-1], "sort": sorted(xs), "parity": [sum(xs) % 2]}[name]]


def prompts(name, length=LENGTH, n=6, seed=0):
    probe = parse_probe(name)
    return [p for v in probe.variants() for p in probe.prompts(length, v, n, seed)]


# --- generators ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_prompts_are_deterministic_and_exactly_the_length(name):
    first, again, other = prompts(name), prompts(name), prompts(name, seed=1)
    assert [p.tokens for p in first] == [p.tokens for p in again]
    assert [p.tokens for p in first] != [p.tokens for p in other]
    for p in first + prompts(name, 2 * LENGTH, n=2):
        assert len(p.tokens) in (LENGTH, 2 * LENGTH) and p.answer_positions == sorted(p.answer_positions)
        assert p.answers[0][0] > 0 and p.answers[-1][-1] < len(p.tokens)
        assert TOKENIZER.pad_id not in p.tokens


@pytest.mark.parametrize("name", NAMES)
def test_every_answer_is_where_the_probe_says_and_right(name):
    for p in prompts(name):
        given = ["".join(symbols(p.tokens[i] for i in a)) for a in p.answers]
        assert given == solve(name, p), TOKENIZER.decode(p.tokens)
        assert p.answer_text.replace(" ", "").split("|") == given


@pytest.mark.parametrize("name", ["mqar", "multikey", "multiquery", "vartrack"])
def test_a_key_is_one_token_the_same_in_the_context_and_the_query(name):
    for p in prompts(name):
        toks = p.tokens[: p.answers[0][0]]
        keys = [t for t in toks if SYMBOLS[t] in KEYS]
        asked = keys[-1]  # the last key before the first answer is a query
        assert keys.count(asked) >= 2  # once in the context, once in the question
        assert all(len(SYMBOLS[t].split()) == 1 for t in toks)


def test_every_symbol_is_one_token_and_the_vocabulary_is_recorded():
    assert len(set(SYMBOLS)) == len(SYMBOLS) == TOKENIZER.vocab_size
    assert TOKENIZER.encode(["k3", "v7", "4"]) == [SYMBOLS.index("k3"), SYMBOLS.index("v7"), SYMBOLS.index("4")]
    data = DataConfig(spec="mqar", tokenizer="bpe", vocab_size=300)
    assert (data.tokenizer, data.vocab_size) == ("symbols", TOKENIZER.vocab_size)
    assert DataConfig(spec="pystdlib").tokenizer == "bpe"


def test_instances_grow_as_the_probe_says():
    short, long = prompts("copy", 24, n=1)[0], prompts("copy", 96, n=1)[0]
    assert 3 * len(short.answers) < len(long.answers)
    mqar = parse_probe("mqar")
    assert [len(prompts("mqar", n, n=1)[0].answers) for n in (32, 64, 128, 256)] == [4, 8, 16, 16]
    assert mqar.grows == "pairs" and parse_probe("copy").grows == "digits"
    multikey = parse_probe("multikey")  # needles: one per 16 tokens, at most 4, then haystack
    assert [multikey.size_for(n) for n in (10, 11, 16, 17, 48, 49, 64, 512)] == [0, 1, 1, 2, 3, 4, 4, 4]
    assert [len(e.answers) for e in (parse_probe("multiquery").example(random.Random(0), n) for n in (12, 40, 64))] == [1, 3, 4]
    near, far = prompts("passkey", 64, n=1)[0], prompts("passkey", 256, n=1)[0]
    assert len(near.answers) == len(far.answers) == 1 and parse_probe("passkey").grows == "filler"
    assert parse_probe("mqar:keys=8").size_for(1024) == 8  # no more pairs than keys


@pytest.mark.parametrize("name", ["mqar", "copy", "passkey"])
def test_training_lengths_span_the_range(name):
    probe = parse_probe(name)
    rng = random.Random(0)
    lengths = [len(probe.training_example(rng, 64).tokens) for _ in range(2000)]
    lo = probe.min_length()
    assert min(lengths) == lo and max(lengths) == 64
    assert len(set(lengths)) == 64 - lo + 1  # every length of the range occurs
    middle = sum(lo + (64 - lo) / 4 <= n <= 64 - (64 - lo) / 4 for n in lengths) / len(lengths)
    assert 0.4 < middle < 0.6  # about uniform


def test_the_prompt_at_the_training_length_is_a_training_example():
    probe, rng = parse_probe("mqar"), random.Random(1)
    shapes = {len(probe.training_example(rng, 32).answers) for _ in range(500)}
    assert shapes == {1, 2, 3, 4} and len(prompts("mqar", 32, n=1)[0].answers) == 4


def test_options_and_canonical_settings():
    assert parse_probe("passkey:digits=4").settings() == "digits=4"
    assert parse_probe("mqar:spacing=16,keys=64").settings() == "spacing=16,keys=64,values=16"
    assert parse_probe("copy") == parse_probe("copy:")


@pytest.mark.parametrize("spec, message", [
    ("pasky", "unknown probe 'pasky'; did you mean 'passkey'"),
    ("copy:colour=red", "unknown option 'colour' in data spec 'copy:colour=red': use copy"),
    ("mqar:spacing=x", "bad spacing 'x'"),
    ("mqar:size=1-4", "unknown option 'size'"),
    ("passkey:digits=0", "digits must be in 1..18"),
    ("mqar:spacing=2", "spacing must be at least 4"),
    ("mqar:keys=99", "at most 64 keys"),
    ("multikey:keys=99", "keys must be at most its pool of 64"),
    ("multikey:pool=99", "pool must be from 1 to 64"),
    ("multiquery:keys=8,pool=4", "queries <= keys <= pool (4)"),
    ("multiquery:queries=5", "queries <= keys"),
    ("multivalue:digits=-1", "digits must be in 0..18"),
    ("multivalue:values=65", "at most its pool of 64 value symbols"),
])
def test_bad_specs_are_one_clear_error(spec, message):
    with pytest.raises(PosbenchError, match=re.escape(message)):
        parse_probe(spec)


def test_too_short_length_is_one_clear_error():
    with pytest.raises(PosbenchError, match="passkey length 16 is too short: an example needs at least 27 tokens"):
        prompts("passkey", 16)
    with pytest.raises(PosbenchError, match="multikey examples need at least 17 tokens; train_len is 16"):
        parse_probe("multikey:digits=4").training_example(random.Random(0), 16)  # one needle of 4 digits
    with pytest.raises(PosbenchError, match="vartrack examples need at least 45 tokens; train_len is 32"):
        parse_probe("vartrack").training_example(random.Random(0), 32)


# --- batches: whole examples, the loss on answers only ----------------------------------------


def probe_batch(name="mqar", train_len=32, batch_size=4, seed=0):
    source = batches.ProbeExamples(parse_probe(name), TrainConfig(train_len=train_len, batch_size=batch_size))
    return source.sample(torch.Generator().manual_seed(seed))


def test_examples_are_rows_padded_at_the_end_with_the_answers_scored():
    b = probe_batch()
    assert b.tokens.shape == b.targets.shape == b.mask.shape == (4, 32) and b.positions is None
    assert torch.equal(b.tokens[:, 1:], b.targets[:, :-1])
    scored = b.mask > 0
    assert not (b.targets[scored] == TOKENIZER.pad_id).any()
    assert all(SYMBOLS[t].startswith("v") for t in b.targets[scored].tolist())  # mqar's answers are values
    assert float(b.mask.sum()) == pytest.approx(4.0)  # weights sum to the rows: a row-mean is the answer mean


def test_a_randomized_run_is_validated_at_drawn_positions():
    seen = []

    class Reader(torch.nn.Module):
        def forward(self, tokens, positions=None):
            seen.append(positions)
            return torch.zeros(*tokens.shape, TOKENIZER.vocab_size)

    def validate(**train):
        seen.clear()
        t = TrainConfig(train_len=32, batch_size=4, **train)
        source = batches.ProbeExamples(parse_probe("mqar"), t)
        out = source.validate(Reader(), "cpu", contextlib.nullcontext())
        return out, list(seen)

    _, plain = validate()
    assert plain and all(p is None for p in plain)  # 0..L-1
    first, drawn = validate(randomize_positions=True, randomize_max=256)
    assert len(drawn) == len(plain) and all(p is not None and len(p) == 32 for p in drawn)
    assert all(bool((p[1:] > p[:-1]).all()) and int(p.max()) < 256 for p in drawn)
    assert any(int(p.max()) >= 32 for p in drawn)
    again, redrawn = validate(randomize_positions=True, randomize_max=256)
    assert all(torch.equal(a, b) for a, b in zip(drawn, redrawn)) and first == again  # the same every check


def test_a_non_answer_target_does_not_move_the_loss_and_an_answer_target_does():
    model = tiny_model("rope", train_len=32, vocab=TOKENIZER.vocab_size)
    b = probe_batch()

    @torch.no_grad()
    def loss(targets):
        return float(batches.masked_mean(model(b.tokens, None, targets=targets), b.mask))

    base = loss(b.targets)
    free = (b.mask == 0).nonzero()[0].tolist()
    answer = (b.mask > 0).nonzero()[0].tolist()
    other = b.targets.clone()
    other[free[0], free[1]] = (other[free[0], free[1]] + 1) % TOKENIZER.vocab_size
    assert loss(other) == base
    other = b.targets.clone()
    other[answer[0], answer[1]] = (other[answer[0], answer[1]] + 1) % TOKENIZER.vocab_size
    assert loss(other) != base
    with torch.no_grad():
        per = model(b.tokens, None, targets=b.targets)
    assert base == pytest.approx(float(per[b.mask > 0].mean()))


def test_row_slices_average_to_the_batch_mean():
    """Data-parallel ranks each take rows; the mean of their masked means is the batch's."""
    b = probe_batch(batch_size=8)
    losses = torch.rand(8, 32)
    halves = [batches.masked_mean(losses[i: i + 4], b.mask[i: i + 4]) for i in (0, 4)]
    assert float(sum(halves) / 2) == pytest.approx(float(batches.masked_mean(losses, b.mask)))


def test_lm_windows_are_the_draws_of_before():
    stream = torch.arange(1000)
    t = TrainConfig(train_len=16, batch_size=3)
    b = batches.LMWindows(stream, stream, t).sample(torch.Generator().manual_seed(5))
    gen = torch.Generator().manual_seed(5)
    starts = torch.randint(0, len(stream) - 17, (3,), generator=gen)
    chunk = stream[starts[:, None] + torch.arange(17)]
    assert torch.equal(b.tokens, chunk[:, :-1]) and torch.equal(b.targets, chunk[:, 1:]) and b.mask is None


# --- scoring ---------------------------------------------------------------------------------


def prefix_hashes(row) -> list[int]:
    """h[a] identifies row[:a] (a polynomial hash), so a lookup by prefix costs one pass per row."""
    h = [0]
    for t in row:
        h.append((h[-1] * 1_000_003 + t + 1) % (1 << 61))
    return h


class Oracle:
    """Knows every prompt's answers: after a prompt's prefix it puts its mass on the next answer
    token, plus `wrong(prompt, k)` (mod the vocabulary) on the tokens of its k-th answer."""

    class cfg:
        n_heads = 1

    def __init__(self, prompts, wrong=lambda i, k: 0):
        self.next = {}
        for i, p in enumerate(prompts):
            h = prefix_hashes(p.tokens)
            for k, answer in enumerate(p.answers):
                for a in answer:
                    self.next[(a, h[a])] = (p.tokens[a] + wrong(i, k)) % TOKENIZER.vocab_size
        self.widths = []

    def __call__(self, idx, pos=None):
        self.widths.append(idx.shape[1])
        logits = torch.zeros(*idx.shape, TOKENIZER.vocab_size)
        for b, row in enumerate(idx.tolist()):
            for a, h in enumerate(prefix_hashes(row)):
                if (a, h) in self.next:
                    logits[b, a - 1, self.next[(a, h)]] = 1.0
        return logits


def greedy(model, prompt) -> list[bool]:
    """The reference: decode token by token after the first answer's prompt, the model's choice at
    answer positions and the prompt's tokens elsewhere (teacher forcing between answers: an answer
    is judged given the true ones before it, as Zoology's per-query accuracy)."""
    out = []
    for answer in prompt.answers:
        x = list(prompt.tokens[: answer[0]])
        for at in answer:
            x.append(int(model(torch.tensor([x]))[0, -1].argmax()))
        out.append(x[answer[0]:] == prompt.tokens[answer[0]: answer[-1] + 1])
    return out


@pytest.mark.parametrize("name", NAMES)
def test_oracle_scores_one_and_wrong_answers_zero(name):
    ps = prompts(name, n=3)
    oracle = Oracle(ps)
    assert readers.verdicts(oracle, ps, "cpu") == [[True] * len(p.answers) for p in ps]
    assert oracle.widths == [LENGTH]  # one forward of exactly the length
    assert readers.verdicts(Oracle(ps, lambda i, k: 1), ps, "cpu") == [[False] * len(p.answers) for p in ps]
    last = {i: len(p.answers) - 1 for i, p in enumerate(ps)}
    judged = readers.verdicts(Oracle(ps, lambda i, k: k == last[i]), ps, "cpu")
    assert judged == [[True] * (len(p.answers) - 1) + [False] for p in ps]


@pytest.mark.parametrize("name", ["mqar", "multivalue", "copy", "passkey"])
def test_one_forward_gives_the_greedy_verdicts(name):
    ps = prompts(name, n=4)
    sometimes = Oracle(ps, lambda i, k: i % 2 and k == 0)  # wrong first answer on every other prompt
    judged = readers.verdicts(sometimes, ps, "cpu")
    assert judged == [greedy(sometimes, p) for p in ps] and 0 < sum(all(v) for v in judged) < len(ps)
    model = tiny_model("rope", train_len=LENGTH, vocab=TOKENIZER.vocab_size)
    assert readers.verdicts(model, ps[:1], "cpu") == [greedy(model, ps[0])]


def test_per_answer_and_exact_verdicts_of_hand_built_cells():
    cell = probing.counts([[True, False, True, True], [True, True, True, True], [False, False, False, False]])
    assert cell == {"answers": 12, "hits": 7, "trials": 3, "exact": 1}
    cols = probing.verdict_columns(cell)
    assert cols["accuracy"] == pytest.approx(7 / 12) and cols["exact_match"] == pytest.approx(1 / 3)
    assert (cols["acc_lo"], cols["acc_hi"]) == pytest.approx(stats.wilson(7, 12))
    assert (cols["em_lo"], cols["em_hi"]) == pytest.approx(stats.wilson(1, 3))


def gated(accuracy_at_home, threshold=0.9):
    rows = [{"scaling": s, "extension": "none", "train_len": 64, "eval_len": n, "status": "ok", "reason": "",
             "answers": 100, "hits": round(100 * (accuracy_at_home if n == 64 else 0.1))}
            for s in ("none", "yarn") for n in (64, 128)]
    rows[2]["hits"] = 95  # yarn learned at home
    return probing.gate(rows, threshold)


def test_a_run_below_the_learned_threshold_in_length_is_not_learned():
    rows = gated(0.5)
    assert [r["status"] for r in rows] == ["not learned", "not learned", "ok", "ok"]
    assert "below 0.9" in rows[0]["reason"]
    assert [r["status"] for r in gated(0.95)] == ["ok"] * 4


def test_effective_length_of_a_not_learned_run_and_the_criterion_above_chance():
    base = {"run_id": "r", "task": "t", "scheme": "rope", "params": "", "seed": "0", "train_len": "64",
            "probe": "parity", "scaling": "none", "extension": "none", "chance": "0.5", "answers": "100",
            "trials": "100", "position_draws": "0"}
    rows = [{**base, "eval_len": str(n), "hits": str(h), "status": "ok"} for n, h in ((64, 100), (128, 70))]
    (row,) = effective.accuracy_rows(rows, 0.5)
    assert row["criterion"] == 0.75 and row["effective_len"] == 64  # 70% is below half-way from chance
    (row,) = effective.accuracy_rows([{**r, "status": "not learned"} for r in rows], 0.5)
    assert row["status"] == "not learned" and row["effective_len"] is None


# --- end to end ------------------------------------------------------------------------------

TASK = """
version = 1
name = "tinyprobes"
schemes = ["rope", "learned"]
""" + TINY_PASSKEY + """eval_windows = 2
[eval]
lengths = [32]
tokens = 64
[probes]
names = ["passkey", "copy"]
lengths = [32, 64]
trials = 2
randomized = ["rope"]
"""


@pytest.fixture(scope="module")
def probe_run(tmp_path_factory):
    path = tmp_path_factory.mktemp("task") / "tinyprobes.toml"
    path.write_text(TASK)
    out = tmp_path_factory.mktemp("probe_run")
    return path, out, run_task(config.load_task(str(path)), out, device="cpu", speed=False)


@pytest.mark.slow
def test_run_trains_one_model_per_probe_and_scheme_and_resumes(probe_run):
    path, out, first = probe_run
    # passkey is also the task's data: its runs are shared (and scored by probes, not perplexity)
    assert first["trained"] == 2 * 3 and first["evaluated"] == 0 and first["probes"] == 6
    rows = results.read_rows(out / "probes.csv")
    count = {}
    for r in rows:
        cell = (r["probe"], r["scheme"], r["position_draws"])
        count[cell] = count.get(cell, 0) + 1
    assert count == {(p, s, z): n * 2 for p, n in (("passkey", 5), ("copy", 1))  # randomized: 4 draws
                     for s, z in (("rope", "0"), ("learned", "0"), ("rope", "4"))}
    for r in rows:
        unsupported = r["scheme"] == "learned" and r["eval_len"] == "64"
        # two steps learn nothing: every scored row is `not learned`, numbers kept
        assert r["status"] == ("unsupported" if unsupported else "not learned")
        assert r["ratio"] == ("1" if r["eval_len"] == "32" else "2")
    assert {r["variant"] for r in rows if r["probe"] == "copy"} == {""}
    assert {r["variant"] for r in rows if r["probe"] == "passkey"} == {f"depth={d:g}" for d in (0, .25, .5, .75, 1)}
    for r in (r for r in rows if r["status"] == "not learned"):
        draws = max(1, int(r["position_draws"]))
        assert int(r["trials"]) == 2 and float(r["chance"]) == parse_probe(r["probe"]).chance
        assert (float(r["acc_lo"]), float(r["acc_hi"])) == pytest.approx(stats.wilson(int(r["hits"]), int(r["answers"])), abs=1e-5)
        assert (float(r["em_lo"]), float(r["em_hi"])) == pytest.approx(stats.wilson(int(r["exact"]), 2 * draws), abs=1e-5)
    again = run_task(config.load_task(str(path)), out, device="cpu", speed=False)
    assert again["trained"] == 0 and again["probes"] == 0 and again["skipped_probes"] == 6
    assert len(results.read_rows(out / "probes.csv")) == len(rows)
    assert main(["report", str(out)]) == 0
    report = (out / "report.md").read_text()
    assert "## Probes" in report and "### copy" in report and "probe_passkey.png" in report
    assert "rope+randomized" in report and "unsupported" in report and "Chance per answer" in report
    assert "not learned in length" in report and "Not learned in length (no extrapolation reading)" in report
    # one effective length per run and probe, every one `not learned`
    effective_rows = results.read_rows(out / "effective_length.csv")
    accuracy = [r for r in effective_rows if r["metric"] == "accuracy" and r["basis"] == "absolute"]
    assert sorted((r["run_id"], r["protocol"]) for r in accuracy) == sorted({(r["run_id"], r["probe"]) for r in rows})
    assert {r["status"] for r in accuracy} == {"not learned"} and "| not learned" in report
    relative = [r for r in effective_rows if r["basis"] == "relative" and r["metric"] == "accuracy"]
    assert sorted(r["protocol"] for r in relative) == sorted(f"{r['protocol']}/relative" for r in accuracy)
    assert "copy/relative" in report and "relative basis" in report
    assert (out / "probe_copy.png").stat().st_size > 1000


def test_probe_cli_scores_runs_of_the_probe(probe_run, tmp_path, capsys):
    _, runs, _ = probe_run
    out = tmp_path / "out"
    args = ["probe", "--probe", "copy", "--runs-dir", str(runs), "--lengths", "32,128", "--trials", "3",
            "--scheme", "rope", "--rope-scaling", "none,yarn", "--device", "cpu", "--out", str(out)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "copy: per-answer accuracy" in printed and "rope+yarn" in printed and "rope+randomized" in printed
    assert "not learned in length" in printed
    rows = results.read_rows(out / "probes.csv")
    # (rope: 2 scalings, rope randomized: none only, as it saw positions to randomize_max) x lengths
    assert len(rows) == (2 + 1) * 2 and {r["trials"] for r in rows} == {"3"}
    assert {r["scaling"] for r in rows if r["position_draws"] != "0"} == {"none"}
    assert {r["probe"] for r in rows} == {"copy"} and {r["eval_len"] for r in rows} == {"32", "128"}
    assert main(args) == 0  # repeated: rows replaced, not duplicated
    assert len(results.read_rows(out / "probes.csv")) == len(rows)


def test_probe_resume_reads_only_the_cells_out_lacks(probe_run, tmp_path, monkeypatch, capsys):
    """--resume on trained runs: a cell --out holds for the same run, probe, prompts and policy is kept
    as written (its `created` too) and no forward reads it; a new length or policy is read, and the
    gate is drawn again over kept and new rows; other prompts (trials, seed) are not kept."""
    _, runs, _ = probe_run
    out = tmp_path / "out"
    real, calls = readers.verdicts, []

    def counted(model, prompts, *args, **kwargs):
        calls.append(len(prompts[0].tokens))
        return real(model, prompts, *args, **kwargs)

    monkeypatch.setattr(readers, "verdicts", counted)
    args = ["probe", "--probe", "copy", "--runs-dir", str(runs), "--trials", "2", "--scheme", "rope", "--prompts",
            "--device", "cpu", "--out", str(out)]
    assert main(args + ["--lengths", "32", "--rope-scaling", "none"]) == 0
    first = {(r["run_id"], r["scaling"], r["eval_len"]): r for r in results.read_rows(out / "probes.csv")}
    assert len(first) == 2 and calls  # rope and rope randomized (4 draws) at 32
    calls[:] = []
    assert main(args + ["--lengths", "32", "--rope-scaling", "none", "--resume"]) == 0
    assert calls == []  # nothing read again
    assert {(r["run_id"], r["scaling"], r["eval_len"]): r for r in results.read_rows(out / "probes.csv")} == first
    assert main(args + ["--lengths", "32,64", "--rope-scaling", "none,yarn", "--resume"]) == 0
    # rope: none and yarn at 64, yarn at 32 the frequencies of none's kept cell; randomized (none only): 64,
    # once per draw
    assert sorted(calls) == [64, 64] + [64] * 4
    rows = {(r["run_id"], r["scaling"], r["eval_len"]): r for r in results.read_rows(out / "probes.csv")}
    (yarn,) = [r for k, r in rows.items() if k[1:] == ("yarn", "32")]
    assert yarn["reason"].startswith("same frequencies as none") and yarn["hits"] == first[(yarn["run_id"], "none", "32")]["hits"]
    assert len(rows) == 2 + 4 and all(rows[k] == row for k, row in first.items())  # created unchanged
    assert {r["status"] for r in rows.values()} == {"not learned"}  # two steps: the gate drawn over both
    prompts = results.read_rows(out / "prompts.csv")  # each prompt's verdicts (each draw's in turn)
    for (run, scaling, length), r in rows.items():
        said = [p for p in prompts if (p["run_id"], p["scaling"], p["eval_len"]) == (run, scaling, length)]
        if not r["reason"].startswith("same frequencies as"):
            assert len(said) == 2 and sum(int(p["hits"]) for p in said) == int(r["hits"])
            assert sum(len(p["verdicts"]) for p in said) == int(r["answers"])
    calls[:] = []
    assert main(args[:-2] + ["--trials", "3", "--lengths", "32", "--rope-scaling", "none", "--resume", "--out",
                             str(out)]) == 0
    assert sorted(calls) == [32] * 5  # other prompts: read again
    assert main(args + ["--lengths", "32", "--seed", "1", "--resume"]) == 2
    assert "drop --seed 1 or --resume" in capsys.readouterr().err
    unasked = tmp_path / "unasked"  # without --prompts a trained run's verdicts stay in probes.csv alone
    assert main([a for a in args[:-1] if a != "--prompts"] + [str(unasked), "--lengths", "32"]) == 0
    assert (unasked / "probes.csv").exists() and not (unasked / "prompts.csv").exists()


def test_lengths_too_short_for_a_probe_are_one_line_naming_its_shortest_and_score_nothing(probe_run, tmp_path,
                                                                                          capsys):
    _, runs, _ = probe_run
    out = tmp_path / "out"
    args = ["probe", "--probe", "copy,passkey", "--runs-dir", str(runs), "--lengths", "16,32", "--trials", "2",
            "--device", "cpu", "--out", str(out)]
    assert main(args) == 2
    err = capsys.readouterr().err
    shortest = parse_probe("passkey").min_length()
    assert err.strip().splitlines() == [
        f"error: --lengths 16 is too short for passkey, whose shortest prompt takes {shortest} tokens: "
        f"give lengths of at least {shortest}"]
    assert not out.exists()  # not even the copy runs, which fit, are scored


@pytest.mark.slow
def test_runs_of_an_earlier_revision_of_the_probe_are_refused_and_new_ones_train_beside(probe_run, tmp_path, monkeypatch, capsys):
    path, runs, _ = probe_run
    before = (runs / "probes.csv").read_bytes()
    monkeypatch.setattr(PROBES["passkey"], "revision", PROBES["passkey"].revision + 1)
    args = ["probe", "--probe", "passkey", "--runs-dir", str(runs), "--device", "cpu", "--out", str(tmp_path)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "examples of an earlier revision of the probe" in err and "Traceback" not in err
    assert (runs / "probes.csv").read_bytes() == before
    assert main(["probe", "--probe", "copy", "--runs-dir", str(runs), "--device", "cpu", "--trials", "2",
                 "--out", str(tmp_path)]) == 0  # other probes' runs are today's
    # The grid names today's passkey runs by the new revision: it trains them beside the old ones,
    # which it neither skips as finished nor scores.
    grid_dir = tmp_path / "grid"
    shutil.copytree(runs, grid_dir)
    old = {p.name for p in grid_dir.iterdir() if p.is_dir()}
    done = run_task(config.load_task(str(path)), grid_dir, device="cpu", speed=False, resume=True)
    assert (done["trained"], done["probes"], done["skipped_probes"]) == (3, 3, 3)
    now = {p.name for p in grid_dir.iterdir() if p.is_dir()}
    assert old < now and len(now - old) == 3
    scored = {r["run_id"] for r in results.read_rows(grid_dir / "probes.csv") if r["probe"] == "passkey"}
    assert now - old <= scored


def grid_run_id(task: str, data: str, scheme: str) -> str:
    """The run_id of the grid's run of `scheme` on `data` (not randomized)."""
    (spec,) = [s for s in grid(config.load_task(task)) if s.data.spec == data and s.scheme == scheme
               and not s.train.randomize_positions]
    return spec.run_id


def test_a_probe_past_its_first_revision_names_its_runs_and_one_at_it_keeps_its_run_ids(monkeypatch):
    # what `posbench train --task probes --data mqar --scheme rope` trained before revisions named runs
    assert PROBES["mqar"].revision == 1 and grid_run_id("probes", "mqar", "rope") == "rope-2069d89c64"
    assert grid_run_id("probes", "copy", "rope") == "rope-2d6f2f0807"
    assert PROBES["passkey"].revision == 2 and grid_run_id("probes", "passkey", "rope") == "rope-7d71f0e060"
    monkeypatch.setattr(PROBES["passkey"], "revision", 3)
    assert grid_run_id("probes", "passkey", "rope") != "rope-7d71f0e060"
    monkeypatch.setattr(PROBES["mqar"], "revision", 2)
    assert grid_run_id("probes", "mqar", "rope") != "rope-2069d89c64"


def test_fingerprints_of_before_revisions_were_kept_pass_at_revision_1():
    from posbench.data import check_probe_corpus, probe_corpus

    copy, passkey = DataConfig(spec="copy"), DataConfig(spec="passkey")
    assert PROBES["copy"].revision == 1 and PROBES["passkey"].revision > 1
    check_probe_corpus(copy, probe_corpus(copy)[1], "a")
    check_probe_corpus(copy, probe_corpus(copy, revision=False)[1], "b")  # trained on revision 1 all the same
    with pytest.raises(PosbenchError, match="earlier revision"):  # passkey has changed since
        check_probe_corpus(passkey, probe_corpus(passkey, revision=False)[1], "c")
    with pytest.raises(PosbenchError, match="earlier revision"):  # another probe's examples
        check_probe_corpus(DataConfig(spec="reverse"), probe_corpus(copy)[1], "d")


def test_probes_table(probe_run, tmp_path):
    from posbench.tables import table

    _, runs, _ = probe_run
    out = table("probes", runs, ratios="1,2")
    steps, accuracy = out.split("\n\n", 1)[0], out.split("\n\n", 1)[1]
    # two steps of 2: no early stop, so each cell is the final held-out accuracy in parentheses
    header, _, *lines = steps.splitlines()
    row = next(line for line in lines if line.startswith("| copy |"))
    cells = {k.strip(): v.strip() for k, v in zip(header.strip("|").split("|"), row.strip("|").split("|"))}
    assert cells["none"] == "" and cells["learned"].startswith("(")
    assert cells["rope"].startswith("(") and cells["rope+randomized"].startswith("(")
    assert "6 runs" in out
    hits = results.read_rows(runs / "probes.csv")
    cell = next(r for r in hits if r["probe"] == "copy" and r["scheme"] == "rope" and r["eval_len"] == "32"
                and r["position_draws"] == "0")
    lo, hi = stats.wilson(int(cell["hits"]), int(cell["answers"]))
    want = f"| copy | rope (not learned) | {100 * float(cell['hits']) / int(cell['answers']):.0f} [{100 * lo:.0f}, {100 * hi:.0f}]"
    assert want in accuracy
    curves = table("probes", runs, curves="copy", every=2).splitlines()
    assert curves[0] == "| data | scheme | 2 |" and len(curves) == 2 + 3  # rope, rope+randomized, learned
    log = pd.read_csv(runs / cell["run_id"] / "log.csv").dropna(subset=["val_accuracy"])
    assert f"| copy | rope | {100 * log['val_accuracy'].iloc[-1]:.0f} |" in curves
    with pytest.raises(PosbenchError, match="no such results folder"):
        table("probes", tmp_path / "absent")


def test_extrapolate_leaves_probe_runs_to_probe(probe_run, capsys):
    _, runs, _ = probe_run
    assert main(["extrapolate", "--runs-dir", str(runs), "--device", "cpu"]) == 2
    assert "score them with `posbench probe`" in capsys.readouterr().err


def test_probe_list(capsys):
    assert main(["probe", "--list"]) == 0
    printed = capsys.readouterr().out
    for name in NAMES:
        assert name in printed
    assert "RULER" in printed and "Zoology" in printed and "Kazemnejad" in printed


def test_one_listing_of_every_probe_each_with_what_it_reads_and_pairings_from_it(capsys):
    """--list: the symbolic probes, the text passkey and RULER's tasks in one table, each saying what
    it reads; a probe given to the other kind of model is one line naming what it reads."""
    from posbench import ruler
    from posbench.commands.probe import catalogue
    from posbench.probes.text import READS, TEXT_PROBES

    rows = catalogue()
    reads = {}
    for r in rows:
        reads.setdefault(r["name"], set()).add(r["reads"])
    assert {n for n, r in reads.items() if READS["symbols"] in r} == set(PROBES)
    assert {n for n, r in reads.items() if READS["text"] in r} == {"passkey", *(f"ruler:{t}" for t in ruler.TASKS)}
    assert reads["passkey"] == set(READS.values()) and set(TEXT_PROBES) <= set(reads)
    assert main(["probe", "--probe", "mqar", "--model", "hf:nowhere"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: mqar reads symbols, for trained runs: leave --model out"), err
    assert "ruler:niah_single_1" in err[0]
    assert main(["probe", "--probe", "ruler:vt,copy"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ruler:vt reads text through the model's tokenizer"), err


def test_a_registered_probe_reads_symbols():
    from posbench.probes import Probe, register

    class Spoken(Probe):
        name, summary, reference, reads = "spoken", "asks in words", "none", "text"

    with pytest.raises(PosbenchError, match=r"reads = .text.: a Probe reads posbench.s symbols.*posbench.probes.TextProbe"):
        register(Spoken)
    assert "spoken" not in PROBES


def test_probe_list_of_named_probes(capsys):
    assert main(["probe", "--list", "--probe", "mqar,passkey,mqar"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("│ mqar ") == 1 and printed.count("│ passkey ") == 2  # passkey: symbols and text
    assert not any(f"│ {name} " in printed for name in NAMES if name not in ("mqar", "passkey"))
    assert main(["probe", "--list", "--probe", "ruler:cwe,passkey"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("│ ruler:cwe ") == 1 and printed.count("│ passkey ") == 2 and "│ mqar " not in printed
    assert main(["probe", "--list", "--probe", "ruler:cwx"]) == 2
    assert "did you mean 'cwe'" in capsys.readouterr().err
    assert main(["probe", "--list", "--probe", "mqar:colour=red"]) == 2
    assert "unknown option 'colour'" in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (["probe", "--probe", "pasky"], "did you mean 'passkey'"),
    (["probe", "--probe", "copy:colour=red"], "unknown option 'colour'"),
    (["probe", "--probe", ","], "bad list ',': empty"),
    (["probe"], "name probes with --probe"),
    (["probe", "--probe", "copy", "--trials", "0"], "trials must be > 0"),
    (["probe", "--probe", "copy", "--lengths", "12,x"], "bad lengths"),
    (["probe", "--probe", "copy", "--runs-dir", "/nonexistent/runs"], "does not exist"),
    (["train", "--scheme", "rope", "--data", "mqar:spacing=1"], "spacing must be at least 4"),
    (["train", "--scheme", "rope", "--data", "vartrack", "--train-len", "16"], "need at least 45 tokens"),
])
def test_bad_probe_input_is_one_line_and_exit_2(args, message, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_too_short_lengths_fail_before_scoring(probe_run, tmp_path, capsys):
    _, runs, _ = probe_run
    assert main(["probe", "--probe", "passkey", "--runs-dir", str(runs), "--lengths", "16",
                 "--device", "cpu", "--out", str(tmp_path)]) == 2
    assert "too short" in capsys.readouterr().err and not (tmp_path / "probes.csv").exists()


PER_PROBE = """
schemes = ["rope", "none"]
[data]
spec = "pystdlib"
[train]
train_len = 128
steps = 100
[probes]
names = ["passkey", "copy", "mqar:spacing=8"]
randomized = ["rope"]
[probes.train.copy]
train_len = 32
steps = 300
"""


def train_spec(task_path, data):
    """The spec `posbench train --task TASK --data DATA` trains, caught before any training."""
    from posbench import api, training

    caught = []

    class Caught(Exception):
        pass

    def catch(spec, *args, **kwargs):
        caught.append(spec)
        raise Caught

    real, training.train = training.train, catch
    try:
        with pytest.raises(Caught):
            api.train(task=str(task_path), data=data, scheme="rope")
    finally:
        training.train = real
    return caught[0]


def test_a_probe_trains_with_its_own_settings(tmp_path):
    from posbench.grid import grid

    path = tmp_path / "per_probe.toml"
    path.write_text(PER_PROBE)
    task = config.load_task(str(path))
    assert task.train_for("copy").train_len == 32 and task.train_for("copy").steps == 300
    assert task.train_for("passkey") == task.train and task.train_for("pystdlib") == task.train
    runs = grid(task)
    assert len(runs) == 2 + 3 * 3  # the corpus, then each probe x (rope, none, rope randomized)
    for run in runs:
        copy = run.data.spec.startswith("copy")
        assert (run.train.train_len, run.train.steps) == ((32, 300) if copy else (128, 100))
    randomized = [r for r in runs if r.train.randomize_positions]
    assert len(randomized) == 3 and all(r.scheme == "rope" for r in randomized)
    assert train_spec(path, "copy").train == task.train_for("copy")  # `posbench train --data copy` alike
    # probes are scored at 1x..8x their own training length
    assert probing.lengths_for(task.probes, task.train_for("copy").train_len) == (32, 64, 128, 256)


@pytest.mark.parametrize("extra, message", [
    ("[probes.train.sort]\nsteps = 3", "probe in [probes.train]"),
    ("[probes.train.copy]\nstep = 3", "did you mean 'steps'"),
    ("[probes.train.copy]\nsteps = 0", "steps must be > 0"),
    ("[probes.train.copy]\ntrain_len = 'long'", "must be int"),
    ("[probes.train]\ncopy = 3", "must be a table"),
    ("[probes.train.copy]\nstop_accuracy = 2.0", "stop_accuracy must be in 0..1"),
])
def test_bad_per_probe_settings_are_one_clear_error(tmp_path, extra, message):
    path = tmp_path / "bad.toml"
    path.write_text(PER_PROBE.replace("[probes.train.copy]\ntrain_len = 32\nsteps = 300\n", extra))
    with pytest.raises(PosbenchError, match=re.escape(message)):
        config.load_task(str(path))


@pytest.mark.parametrize("name", ["multikey", "multivalue", "multiquery"])
def test_needle_values_are_one_symbol_unless_digits_are_asked(name):
    """Each answer of RULER's needle probes is one value symbol by default (chance 1/64), a
    number of `digits` digits on request (chance 10^-digits); the solver reads both."""
    for spec, width, chance in ((name, 1, 1 / 64), (f"{name}:digits=3", 3, 1e-3)):
        probe = parse_probe(spec)
        e = probe.example(random.Random(3), 64)
        assert {len(a) for a in e.answers} == {width} and probe.chance == pytest.approx(chance)
        assert [" ".join(symbols([e.tokens[p] for p in a])).replace(" ", "") for a in e.answers] == solve(name, e)
    if name == "multivalue":  # the values of one key differ
        e = parse_probe(name).example(random.Random(4), 64)
        assert len({e.tokens[a[0]] for a in e.answers}) == 4


@pytest.mark.parametrize("name", NAMES)
def test_sizes_computed_once_give_the_examples_computed_afresh(name):
    """A probe remembers its shortest example and its instance size per length: one probe drawing
    many examples gives the examples that a new probe gives for each."""
    shared = parse_probe(name)
    length = shared.min_length() + 13
    for seed in range(40):
        fresh = parse_probe(name)
        n = random.Random(seed).randint(shared.min_length(), length)
        assert shared.example(random.Random(seed), n) == fresh.example(random.Random(seed), n)
        assert shared.training_example(random.Random(seed), length) == fresh.training_example(random.Random(seed), length)


def test_probes_table_over_seeds_reads_folders_as_one(tmp_path):
    from posbench.tables import holding_cell, table

    common = {"scheme": "rope", "params": "", "scaling": "none", "extension": "none", "position_draws": "0",
              "extend_method": "", "probe": "copy"}

    def write(folder, runs, scored):
        folder.mkdir()
        for name, rows in (("runs", runs), ("probes", scored)):
            frame = pd.DataFrame(rows).reindex(columns=results.TABLES[name]["columns"])
            frame.to_csv(folder / f"{name}.csv", index=False)

    def run(seed, stopped):
        return {"run_id": f"rope-{seed}", "scheme": "rope", "seed": seed, "steps": 8000, "stopped_at": stopped,
                "status": "ok", "randomized": False}

    def cell(seed, ratio, hits, status="ok"):
        return {**common, "run_id": f"rope-{seed}", "seed": seed, "ratio": ratio, "hits": hits, "answers": 100,
                "status": status}

    write(tmp_path / "a", [run(0, 400)], [cell(0, 1, 97), cell(0, 2, 30)])
    write(tmp_path / "b", [run(0, 9999), run(1, ""), run(2, 1000)],  # rope-0 again: the first folder's counts
          [cell(0, 1, 10), cell(0, 2, 10), cell(1, 1, 60, "not learned"), cell(1, 2, 20), cell(2, 1, 95),
           cell(2, 2, 40)])
    header, _, row, _, width = table("probes", [tmp_path / "a", tmp_path / "b"], seeds=True, ratios="1,2").splitlines()
    assert width.startswith("Median width of the 95% intervals over seeds, in points: 1x ")
    cells = dict(zip((c.strip() for c in header.strip("|").split("|")), (c.strip() for c in row.strip("|").split("|"))))
    assert cells["seeds"] == "3" and cells["learned"] == "2 of 3"
    assert cells["stopped early"] == "2 of 3"  # seed 1 spent its steps (and did not learn: no disagreement)
    assert cells["steps to stop"] == "1,000 (400-8,000+)"  # seed 1 spent its 8,000 steps
    at1 = stats.mean_interval([0.97, 0.60, 0.95])
    assert cells["1x mean [95%]"] == f"{100 * at1.mean:.0f} [{100 * max(at1.lo, 0):.0f}, {100 * min(at1.hi, 1):.0f}]"
    assert cells["2x mean [95%]"].startswith("30 [")  # (30 + 20 + 40) / 3
    assert cells["2x median (IQR)"] == "30 (25-35)"  # 20, 30, 40: quartiles half-way between
    # half of 97, 60 and 95 at 1x is 48.5, 30, 47.5: none of 30, 20, 40 keeps it; Wilson [0, 56%]
    assert cells["2x holding"] == "0 of 3 (0-56%)" and "1x holding" not in cells
    assert holding_cell({0: .9, 1: .8, 2: .9}, {0: .5, 1: .3, 2: .9}) == "2 of 3 (21-94%)"  # Wilson 2/3
    compact = table("probes", [tmp_path / "a", tmp_path / "b"], seeds=True, compact=True, ratios=[2])
    assert compact.splitlines()[::2] == ["| probe | rope |", "| copy | 30 (2 of 3 learned) |"]
    with pytest.raises(PosbenchError, match="only with seeds or pairs"):  # several folders: seeds or pairs alone
        table("probes", [tmp_path / "a", tmp_path / "b"])
    other = [{**cell(seed, 2, 10), "scheme": "none", "run_id": f"none-{seed}"} for seed in (0, 1, 2)]
    write(tmp_path / "c", [{**run(seed, 400), "scheme": "none", "run_id": f"none-{seed}"} for seed in (0, 1, 2)], other)
    folders = [tmp_path / d for d in "abc"]
    ours = [{**cell(seed, 2, 50), "scheme": "accum-rope", "run_id": f"acc-{seed}"} for seed in (0, 1, 2)]
    write(tmp_path / "d", [{**run(seed, 400), "scheme": "accum-rope", "run_id": f"acc-{seed}"} for seed in (0, 1, 2)],
          ours)
    every = folders + [tmp_path / "d"]  # a scheme outside the usual columns gets one after them
    assert table("probes", every, seeds=True, compact=True, ratios="2").splitlines()[0] == \
        "| probe | none | rope | accum-rope |"
    chosen = table("probes", every, seeds=True, compact=True, ratios="2", schemes="accum-rope,none").splitlines()
    assert chosen[0] == "| probe | accum-rope | none |" and chosen[2] == "| copy | 50 | 10 |"
    with pytest.raises(PosbenchError, match="no probe rows of fire"):
        table("probes", every, seeds=True, schemes="fire")
    with pytest.raises(PosbenchError, match="give seeds too"):
        table("probes", every, schemes="rope")
    *_, row, _, key = table("probes", folders, pairs="rope:none:copy", ratios="2").splitlines()
    gap = stats.mean_interval([20, 10, 30])  # rope's 30, 20, 40 against none's 10 in each seed
    # the permutation p: 2 of the 8 sign flips of the seeds' differences reach |+60|; one comparison:
    # q = p; no machine kind recorded: no pair shares one
    assert (f"| rope | none | copy | 2x | 3 | 0 of 3 | +20 / +10 / +30 | +20 [{gap.lo:+.0f}, {gap.hi:+.0f}] "
            "| 0.250 | 0.250 | 3 of 3 |") in row
    assert row.endswith("| every seed, not the interval |")  # 3 seeds: t(2) makes it [-5, +45]
    assert key.startswith("q (BH): the permutation p adjusted by Benjamini-Hochberg over this table's family of 1 ")
    with pytest.raises(PosbenchError, match="bad pair 'rope-none-copy': expected A:B:PROBE"):
        table("probes", folders, pairs="rope-none-copy")


@pytest.mark.parametrize("steps, cell", [
    ([(400, False), (1000, False), (8000, True)], "1,000 (400-8,000+)"),
    ([(400, False), (1000, False), (1400, False), (8000, True)], "1,200 (400-8,000+)"),
    ([(400, False), (7600, False), (8000, True), (8000, True)], "7,800+ (400-8,000+)"),  # at least 7,800
    ([(2000, False), (8000, True), (8000, True), (8000, True)], "8,000+ (2,000-8,000+)"),
])
def test_steps_cell_marks_a_median_that_a_run_without_a_stop_bounds(steps, cell):
    from posbench.tables import steps_cell
    assert steps_cell(steps) == cell
