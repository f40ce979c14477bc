"""Synthetic probes: deterministic generators, prompts of exactly L tokens whose answers an
independent solver agrees with, the one-forward verdict (oracle 1, wrong 0, equal to greedy
decoding), the `posbench probe` command, the [probes] step of `posbench run`, and bad input."""

import re

import pytest
import torch

from conftest import tiny_model
from posbench import config, probing, results, stats
from posbench.cli import main
from posbench.data import BPETokenizer, ByteTokenizer, load_corpus
from posbench.errors import PosbenchError
from posbench.grid import run_task
from posbench.probes import PROBES, PromptMaker, parse_probe

NAMES = sorted(PROBES)
LENGTH = 400  # bytes: long enough for every probe's default settings


def text(tokens) -> str:
    return ByteTokenizer().decode(tokens)


def ints(s: str) -> list[int]:
    return [int(d) for d in s.split()]


def passkey(before: str) -> str:
    return re.search(r"The pass key is (\d+)\. Remember", before).group(1)


def needles(before: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for word, value in re.findall(r"The key of (\w+) is (\d+)\. ", before):
        found.setdefault(word, []).append(value)
    return found


def multikey(before: str) -> str:
    return needles(before)[re.search(r"What is the key of (\w+)\?", before).group(1)][0]


def multivalue(before: str) -> str:
    return ", ".join(needles(before)[re.search(r"What are the keys of (\w+)\?", before).group(1)])


def multiquery(before: str) -> str:
    asked = re.search(r"What are the keys of ([\w, ]+)\?", before).group(1).split(", ")
    return ", ".join(needles(before)[w][0] for w in asked)


def vartrack(before: str) -> str:
    value = re.search(r"Which variables hold (\d+)\?", before).group(1)
    holding = []
    for name, source in re.findall(r"VAR ([A-Z]+) = (VAR [A-Z]+|\d+)\. ", before):
        if source == value or source[4:] in holding:
            holding.append(name)
    return " ".join(holding)


def mqar(before: str, queries: list[str]) -> str:
    pairs = dict(re.findall(r"([a-z]{2}) (\d)", before.split("\n")[1]))
    return " | ".join(pairs[q] for q in queries)


def algorithmic(name: str, before: str) -> str:
    xs = before.rsplit(f"\n{name}", 1)[1].rstrip(" =")
    if name == "addition":
        a, b = (ints(part)[::-1] for part in xs.split("+"))
        total = int("".join(map(str, a))) + int("".join(map(str, b)))
        return " ".join(str(total).zfill(len(a) + 1)[::-1])
    xs = ints(xs)
    return " ".join(map(str, {"copy": xs, "reverse": xs[::-1], "sort": sorted(xs),
                              "parity": [sum(xs) % 2]}[name]))


def solve(name: str, prompt) -> str:
    """The answer, worked out from the prompt's text alone (mqar: the text before each answer)."""
    before = text(prompt.tokens[: prompt.answer[0]])
    if name == "mqar":
        queries = [text(prompt.tokens[: a]).split()[-1] for a in prompt.answer]
        return mqar(before, queries)
    solvers = {"passkey": passkey, "multikey": multikey, "multivalue": multivalue,
               "multiquery": multiquery, "vartrack": vartrack}
    return solvers[name](before) if name in solvers else algorithmic(name, before)


def prompts(name, length=LENGTH, n=6, seed=0, tokenizer=None):
    probe = parse_probe(name)
    maker = PromptMaker(tokenizer or ByteTokenizer())
    return [p for v in probe.variants() for p in probe.prompts(maker, length, v, n, seed)]


# --- generators ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_documents_are_deterministic_per_seed(name):
    spec = f"{name}:docs=200"
    a, b, other = load_corpus(spec), load_corpus(spec), load_corpus(f"{spec},seed=1")
    assert a.splits == b.splits and a.fingerprint == b.fingerprint
    assert other.fingerprint != a.fingerprint and all(a.splits.values())
    assert sum(len(s) for s in a.splits.values()) == 200


@pytest.mark.parametrize("name", NAMES)
def test_prompts_are_deterministic_and_exactly_the_length(name):
    first, again, other = prompts(name), prompts(name), prompts(name, seed=1)
    assert [p.tokens for p in first] == [p.tokens for p in again]
    assert [p.tokens for p in first] != [p.tokens for p in other]
    longer = prompts(name, 2 * LENGTH, n=2)
    for p in first + longer:
        assert len(p.tokens) in (LENGTH, 2 * LENGTH) and p.answer == sorted(p.answer)
        assert p.answer[0] > 0 and p.answer[-1] < len(p.tokens)


@pytest.mark.parametrize("name", NAMES)
def test_the_answer_is_where_the_probe_says_and_right(name):
    for p in prompts(name):
        assert text(p.tokens[i] for i in p.answer).replace(" ", "") == p.answer_text.replace(" ", "").replace("|", "")
        assert solve(name, p) == p.answer_text


def test_sized_probes_grow_with_the_length():
    short, long = prompts("copy", 100, n=1)[0], prompts("copy", 400, n=1)[0]
    assert 3 * len(short.answer) < len(long.answer)


@pytest.mark.parametrize("name", NAMES)
def test_bpe_prompts_are_exactly_the_length(name):
    corpus = load_corpus(f"{name}:docs=60")
    tok = BPETokenizer.train(corpus.splits["train"], 400)
    for p in prompts(name, 300, n=3, tokenizer=tok):
        assert len(p.tokens) == 300
        answer = tok.decode([p.tokens[i] for i in p.answer])
        assert answer.replace(" ", "") == p.answer_text.replace(" ", "").replace("|", "")


def test_passkey_keeps_its_construction():
    p = prompts("passkey", 300, n=4)
    probe = parse_probe("passkey")
    for depth, group in zip(probe.variants(), [p[i: i + 4] for i in range(0, len(p), 4)]):
        for t in group:
            key = t.answer_text
            sentence = probe.key_sentence(key)
            free = 300 - len(sentence) - len(probe.QUESTION) - 1 - len(key)
            assert text(t.tokens).index(sentence) == round(depth * free)
            assert text(t.tokens).endswith(f"{probe.QUESTION} {key}") and len(t.answer) == 5


def test_options_and_canonical_settings():
    assert parse_probe("passkey:3,120-300,digits=4").settings() == "seed=3,docs=40000,len=120-300,digits=4"
    assert parse_probe("copy:size=2-9").size == (2, 9)
    assert parse_probe("copy") == parse_probe("copy:seed=0")


@pytest.mark.parametrize("spec, message", [
    ("pasky", "unknown probe 'pasky'; did you mean 'passkey'"),
    ("copy:colour=red", "unknown option 'colour' in data spec 'copy:colour=red': use copy[:seed=0"),
    ("copy:size=a-b", "bad size 'a-b'"),
    ("copy:x", "bad seed 'x'"),
    ("copy:size=9-3", "size 9-3 must be positive and low-high"),
    ("copy:docs=3", "docs must be at least 40"),
    ("passkey:len=20-40", "needs at least 102 characters"),
    ("passkey:digits=0", "digits must be in 1..18"),
    ("mqar:queries=0", "queries must be at least 1"),
    ("multikey:keys=99", "keys must be at most 20"),
    ("multiquery:queries=5", "queries <= keys"),
])
def test_bad_specs_are_one_clear_error(spec, message):
    with pytest.raises(PosbenchError, match=re.escape(message)):
        parse_probe(spec)


def test_too_short_length_is_one_clear_error():
    with pytest.raises(PosbenchError, match="passkey length 64 is too short: a prompt needs at least 102 tokens"):
        prompts("passkey", 64)


# --- scoring ---------------------------------------------------------------------------------


def prefix_hashes(row) -> list[int]:
    """h[a] identifies row[:a] (a polynomial hash), so a lookup by prefix costs one pass per row."""
    h = [0]
    for t in row:
        h.append((h[-1] * 1_000_003 + t + 1) % (1 << 61))
    return h


class Oracle:
    """Knows every prompt's answers: after a prompt's prefix it puts its mass on the next answer
    token, plus `wrong(prompt, k)` (mod the vocabulary) on the k-th answer token."""

    class cfg:
        n_heads = 1

    def __init__(self, prompts, wrong=lambda i, k: 0):
        self.next = {}
        for i, p in enumerate(prompts):
            h = prefix_hashes(p.tokens)
            for k, a in enumerate(p.answer):
                self.next[(a, h[a])] = (p.tokens[a] + wrong(i, k)) % 257
        self.widths = []

    def __call__(self, idx, pos=None):
        self.widths.append(idx.shape[1])
        logits = torch.zeros(*idx.shape, 257)
        for b, row in enumerate(idx.tolist()):
            for a, h in enumerate(prefix_hashes(row)):
                if (a, h) in self.next:
                    logits[b, a - 1, self.next[(a, h)]] = 1.0
        return logits


def greedy(model, prompt) -> bool:
    """The reference: decode token by token after the first answer's prompt, the model's choice at
    answer positions and the prompt's tokens elsewhere; a hit is every answer token right."""
    x = list(prompt.tokens[: prompt.answer[0]])
    for at in range(prompt.answer[0], len(prompt.tokens)):
        x.append(int(model(torch.tensor([x]))[0, -1].argmax()) if at in prompt.answer else prompt.tokens[at])
    return all(x[a] == prompt.tokens[a] for a in prompt.answer)


@pytest.mark.parametrize("name", NAMES)
def test_oracle_scores_one_and_wrong_answers_zero(name):
    ps = prompts(name, n=3)
    oracle = Oracle(ps)
    assert probing.verdicts(oracle, ps, "cpu") == [True] * len(ps)
    assert oracle.widths == [LENGTH]  # one forward of exactly the length
    assert probing.verdicts(Oracle(ps, lambda i, k: 1), ps, "cpu") == [False] * len(ps)
    last = {i: len(p.answer) - 1 for i, p in enumerate(ps)}
    assert probing.verdicts(Oracle(ps, lambda i, k: k == last[i]), ps, "cpu") == [False] * len(ps)


@pytest.mark.parametrize("name", NAMES)
def test_one_forward_gives_the_greedy_verdict(name):
    ps = prompts(name, 100 if parse_probe(name).sized else LENGTH, n=4)
    sometimes = Oracle(ps, lambda i, k: i % 2 and k == 0)  # wrong on every other prompt
    verdicts = probing.verdicts(sometimes, ps, "cpu")
    assert verdicts == [greedy(sometimes, p) for p in ps] and 0 < sum(verdicts) < len(ps)
    model = tiny_model("rope", train_len=LENGTH, vocab=257)
    assert probing.verdicts(model, ps[:1], "cpu") == [greedy(model, ps[0])]


# --- end to end ------------------------------------------------------------------------------

TASK = """
version = 1
name = "tinyprobes"
schemes = ["rope", "learned"]
[data]
spec = "passkey:docs=200,len=110-200"
tokenizer = "bytes"
[model]
d_model = 16
n_layers = 1
n_heads = 2
[train]
train_len = 128
steps = 2
batch_size = 2
warmup = 1
eval_interval = 2
eval_windows = 2
[eval]
lengths = [128]
tokens = 128
[probes]
names = ["passkey:docs=200,len=110-200", "copy:docs=100,size=1-20"]
lengths = [128, 256]
trials = 2
randomized = ["rope"]
"""


@pytest.fixture(scope="module")
def probe_run(tmp_path_factory):
    path = tmp_path_factory.mktemp("task") / "tinyprobes.toml"
    path.write_text(TASK)
    out = tmp_path_factory.mktemp("probe_run")
    return path, out, run_task(config.load_task(str(path)), out, device="cpu", speed=False)


def test_run_trains_one_model_per_probe_and_scheme_and_resumes(probe_run):
    path, out, first = probe_run
    # passkey is also the task's data: its runs are shared; rope once more randomized per probe
    assert first["trained"] == 2 * 3 and first["evaluated"] == 2 and first["probes"] == 6
    rows = results.read_rows(out / "probes.csv")
    count = {}
    for r in rows:
        cell = (r["probe"], r["scheme"], r["position_draws"])
        count[cell] = count.get(cell, 0) + 1
    assert count == {(p, s, z): n * 2 for p, n in (("passkey", 5), ("copy", 1))  # randomized: 4 draws
                     for s, z in (("rope", "0"), ("learned", "0"), ("rope", "4"))}
    for r in rows:
        unsupported = r["scheme"] == "learned" and r["eval_len"] == "256"
        assert r["status"] == ("unsupported" if unsupported else "ok")
        assert r["ratio"] == ("1" if r["eval_len"] == "128" else "2")
    assert {r["variant"] for r in rows if r["probe"] == "copy"} == {""}
    assert {r["variant"] for r in rows if r["probe"] == "passkey"} == {f"depth={d:g}" for d in (0, .25, .5, .75, 1)}
    attempts = {r["run_id"]: 2 * max(1, int(r["position_draws"])) for r in rows}
    for r in (r for r in rows if r["status"] == "ok"):
        wilson = stats.wilson(int(r["hits"]), attempts[r["run_id"]])
        assert (float(r["acc_lo"]), float(r["acc_hi"])) == pytest.approx(wilson, abs=1e-5)
    again = run_task(config.load_task(str(path)), out, device="cpu", speed=False)
    assert again["trained"] == 0 and again["probes"] == 0 and again["skipped_probes"] == 6
    assert len(results.read_rows(out / "probes.csv")) == len(rows)
    assert main(["report", str(out)]) == 0
    report = (out / "report.md").read_text()
    assert "## Probes" in report and "### copy" in report and "probe_passkey.png" in report
    assert "rope+randomized" in report and "unsupported" in report
    assert "Wilson 95% interval" in report and "## Effective length" in report
    # one effective length per run and probe, hits pooled over the passkey depths
    effective = results.read_rows(out / "effective_length.csv")
    accuracy = [(r["run_id"], r["protocol"]) for r in effective if r["metric"] == "accuracy"]
    assert sorted(accuracy) == sorted({(r["run_id"], r["probe"]) for r in rows})
    assert (out / "probe_copy.png").stat().st_size > 1000


def test_probe_cli_scores_runs_of_the_probe(probe_run, tmp_path, capsys):
    _, runs, _ = probe_run
    out = tmp_path / "out"
    args = ["probe", "--probe", "copy", "--runs-dir", str(runs), "--lengths", "128,512", "--trials", "3",
            "--scheme", "rope", "--rope-scaling", "none,yarn", "--device", "cpu", "--out", str(out)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "copy: exact-match accuracy" in printed and "rope+yarn" in printed and "rope+randomized" in printed
    rows = results.read_rows(out / "probes.csv")
    # (rope: 2 scalings, rope randomized: none only, as it saw positions to randomize_max) x lengths
    assert len(rows) == (2 + 1) * 2 and {r["trials"] for r in rows} == {"3"}
    assert {r["scaling"] for r in rows if r["position_draws"] != "0"} == {"none"}
    assert {r["probe"] for r in rows} == {"copy"} and {r["eval_len"] for r in rows} == {"128", "512"}
    assert main(args) == 0  # repeated: rows replaced, not duplicated
    assert len(results.read_rows(out / "probes.csv")) == len(rows)


def test_probe_list(capsys):
    assert main(["probe", "--list"]) == 0
    printed = capsys.readouterr().out
    for name in NAMES:
        assert name in printed
    assert "RULER" in printed and "Zoology" in printed and "Kazemnejad" in printed


@pytest.mark.parametrize("args, message", [
    (["probe", "--probe", "pasky"], "did you mean 'passkey'"),
    (["probe", "--probe", "copy:colour=red"], "unknown option 'colour'"),
    (["probe", "--probe", "copy:size=1"], "bad size '1'"),
    (["probe", "--probe", ","], "empty list"),
    (["probe"], "name probes with --probe"),
    (["probe", "--probe", "copy", "--trials", "0"], "trials must be > 0"),
    (["probe", "--probe", "copy", "--lengths", "12,x"], "bad lengths"),
    (["probe", "--probe", "copy", "--runs-dir", "/nonexistent/runs"], "does not exist"),
    (["train", "--scheme", "rope", "--data", "mqar:pairs=4-1"], "pairs 4-1 must be positive and low-high"),
])
def test_bad_probe_input_is_one_line_and_exit_2(args, message, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_too_short_lengths_fail_before_scoring(probe_run, tmp_path, capsys):
    _, runs, _ = probe_run
    assert main(["probe", "--probe", "passkey", "--runs-dir", str(runs), "--lengths", "64",
                 "--device", "cpu", "--out", str(tmp_path)]) == 2
    assert "too short" in capsys.readouterr().err and not (tmp_path / "probes.csv").exists()


def test_old_passkey_csv_is_read_as_probe_rows(tmp_path):
    old = {"run_id": "rope-abc", "task": "passkey", "scheme": "rope", "params": "", "seed": "0",
           "train_len": "128", "eval_len": "256", "ratio": "2", "depth": "0.25", "trials": "20", "hits": "5",
           "accuracy": "0.25", "scaling": "none", "extension": "none", "backend": "sdpa", "status": "ok",
           "reason": ""}
    (tmp_path / "passkey.csv").write_text(",".join(old) + "\n" + ",".join(old.values()) + "\n")
    rows = results.read_probes(tmp_path)
    assert len(rows) == 1 and rows[0]["probe"] == "passkey" and rows[0]["variant"] == "depth=0.25"
    assert rows[0]["accuracy"] == "0.25"
    results.merge_rows(tmp_path, "probes", [{**rows[0], "accuracy": 0.5}])
    assert [r["accuracy"] for r in results.read_probes(tmp_path)] == ["0.5"]  # probes.csv wins
    assert main(["report", str(tmp_path)]) == 0
    assert "### passkey" in (tmp_path / "report.md").read_text()


PER_PROBE = """
schemes = ["rope", "none"]
[data]
spec = "pystdlib"
[train]
train_len = 128
steps = 100
[probes]
names = ["passkey", "copy:size=1-14", "copy:size=1-30"]
randomized = ["rope"]
[probes.train.copy]
train_len = 32
steps = 300
"""


def test_a_probe_trains_with_its_own_settings(tmp_path):
    from posbench.grid import grid

    path = tmp_path / "per_probe.toml"
    path.write_text(PER_PROBE)
    task = config.load_task(str(path))
    assert task.train_for("copy:size=1-14").train_len == 32 and task.train_for("copy").steps == 300
    assert task.train_for("passkey") == task.train and task.train_for("pystdlib") == task.train
    runs = grid(task)
    assert len(runs) == 2 + 3 * 3  # the corpus, then each probe x (rope, none, rope randomized)
    for run in runs:
        copy = run.data.spec.startswith("copy")
        assert (run.train.train_len, run.train.steps) == ((32, 300) if copy else (128, 100))
    randomized = [r for r in runs if r.train.randomize_positions]
    assert len(randomized) == 3 and all(r.scheme == "rope" for r in randomized)
    # `posbench train --task` on the probe's documents gets the same run as the grid
    from posbench.cli import _task_with_overrides

    cli_task = _task_with_overrides(str(path), "copy:size=1-14", *[None] * 12)
    assert cli_task.train == task.train_for("copy:size=1-14")
    # ... and probes are scored at 1x..8x their own training length
    assert probing.lengths_for(task.probes, task.train_for("copy").train_len) == (32, 64, 128, 256)


@pytest.mark.parametrize("extra, message", [
    ("[probes.train.sort]\nsteps = 3", "probe in [probes.train]"),
    ("[probes.train.copy]\nstep = 3", "did you mean 'steps'"),
    ("[probes.train.copy]\nsteps = 0", "steps must be > 0"),
    ("[probes.train.copy]\ntrain_len = 'long'", "must be int"),
    ("[probes.train]\ncopy = 3", "must be a table"),
])
def test_bad_per_probe_settings_are_one_clear_error(tmp_path, extra, message):
    path = tmp_path / "bad.toml"
    path.write_text(PER_PROBE.replace("[probes.train.copy]\ntrain_len = 32\nsteps = 300\n", extra))
    with pytest.raises(PosbenchError, match=re.escape(message)):
        config.load_task(str(path))
