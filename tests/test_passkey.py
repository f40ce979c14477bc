"""Passkey retrieval: the data spec, prompt construction, scoring on oracle models, and the
`posbench passkey` command and `posbench run` step on tiny runs."""

import pytest
import torch

from conftest import tiny_model
from posbench import config, passkey, results
from posbench.cli import main
from posbench.data import BPETokenizer, ByteTokenizer, load_corpus
from posbench.errors import PosbenchError
from posbench.grid import run_task
from posbench.schemes import SCHEMES
from posbench.schemes.base import PositionLimitError

SPEC = "passkey:docs=200,len=110-200"


def text(tokens) -> str:
    return ByteTokenizer().decode(tokens)


# --- the data spec ---------------------------------------------------------------------------


def test_data_spec_is_deterministic_and_follows_the_construction():
    a, b, other = load_corpus(SPEC), load_corpus(SPEC), load_corpus(SPEC.replace("docs", "seed=1,docs"))
    assert a.splits == b.splits and a.fingerprint == b.fingerprint
    assert other.fingerprint != a.fingerprint
    docs = [d for split in a.splits.values() for d in split]
    assert len(docs) == 200 and all(a.splits.values())  # split by document name like other corpora
    for doc in docs:
        key = doc[-5:]
        assert key.isdigit() and key[0] != "0" and 110 <= len(doc) <= 200
        assert doc.endswith(passkey.QUESTION + key) and passkey.key_sentence(key) in doc
        before = doc[: doc.index(passkey.key_sentence(key))]
        assert passkey.filler(len(before)) == before  # filler, cut anywhere


def test_spec_options():
    assert passkey.parse_spec("passkey") == passkey.PasskeyData()
    assert passkey.parse_spec("passkey:7") == passkey.PasskeyData(seed=7)
    assert passkey.parse_spec("passkey:3,120-300,digits=4") == passkey.PasskeyData(3, 120, 300, 4)
    assert passkey.parse_spec("passkey:seed=2,len=200-220,docs=50") == passkey.PasskeyData(2, 200, 220, 5, 50)


@pytest.mark.parametrize("spec, message", [
    ("passkey:len=20-40", "needs at least 102 characters"),
    ("passkey:len=300-200", "too short or reversed"),
    ("passkey:colour=red", "unknown option 'colour'"),
    ("passkey:x", "bad seed 'x'"),
    ("passkey:docs=3", "at least 40"),
    ("passkey:digits=0", "digits must be in 1..18"),
])
def test_bad_specs_are_one_clear_error(spec, message):
    with pytest.raises(PosbenchError, match=message):
        load_corpus(spec)


# --- prompts -------------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [0.0, 0.25, 0.5, 0.75, 1.0])
def test_prompt_is_exactly_the_length_with_the_key_at_its_depth(depth):
    length = 300
    trials = passkey.Prompter(ByteTokenizer()).trials(length, depth, 8, 5, seed=0)
    for t in trials:
        assert len(t.tokens) == length and t.answer == 5
        sentence = passkey.key_sentence(t.key)
        free = length - len(sentence) - len(passkey.QUESTION) - 5
        assert abs(t.key_start - depth * free) <= 0.5
        assert text(t.tokens[t.key_start: t.key_start + len(sentence)]) == sentence
        assert text(t.tokens).endswith(passkey.QUESTION + t.key)
        assert text(t.tokens).count(t.key) == 3  # twice in the key sentence, once as the answer
        assert text(t.tokens[:-5]).endswith("The pass key is ")


def test_prompts_are_deterministic_per_seed_length_and_depth():
    p = passkey.Prompter(ByteTokenizer())
    keys = lambda *a: [t.key for t in p.trials(*a)]  # noqa: E731
    assert keys(256, 0.5, 10, 5, 0) == keys(256, 0.5, 10, 5, 0)
    assert keys(256, 0.5, 10, 5, 0) != keys(256, 0.5, 10, 5, 1)
    assert keys(256, 0.5, 10, 5, 0) != keys(512, 0.5, 10, 5, 0)
    assert len(set(keys(256, 0.5, 10, 5, 0))) > 5
    assert all(len(k) == 3 for k in keys(256, 0.0, 10, 3, 0))


def test_too_short_length_is_one_clear_error():
    with pytest.raises(PosbenchError, match="length 64 is too short: a trial needs at least 102 tokens"):
        passkey.Prompter(ByteTokenizer()).trials(64, 0.5, 1, 5, 0)


def test_bpe_prompts_are_exactly_the_length():
    corpus = load_corpus("passkey:docs=100")
    tok = BPETokenizer.train(corpus.splits["train"], 400)  # merges some digits: answers vary in tokens
    trials = passkey.Prompter(tok).trials(90, 0.5, 20, 5, seed=0)
    for t in trials:
        assert len(t.tokens) == 90
        assert tok.decode(t.tokens[-t.answer:]).strip() == t.key
        assert tok.decode(t.tokens[:-t.answer]).rstrip().endswith("The pass key is")


# --- scoring -------------------------------------------------------------------------------


class Oracle:
    """Reads the key after the first "The pass key is " and predicts it digit by digit after the
    question; `wrong(key, k)` says which digits it gets wrong (plus one, mod 10)."""

    class cfg:
        n_heads = 1

    def __init__(self, wrong=lambda key, k: False):
        self.wrong = wrong
        self.widths = []

    def __call__(self, idx, pos=None):
        self.widths.append(idx.shape[1])
        logits = torch.zeros(*idx.shape, 257)
        for b, row in enumerate(idx.tolist()):
            s = text(row)
            start = s.index("The pass key is ") + len("The pass key is ")
            key = s[start: start + 5]
            asked = s.index(passkey.QUESTION) + len(passkey.QUESTION)
            for k in range(min(5, len(s) - asked + 1)):  # position asked - 1 + k predicts digit k
                digit = (int(key[k]) + self.wrong(key, k)) % 10
                logits[b, asked - 1 + k, ord(str(digit))] = 1.0
        return logits


def greedy_hits(model, trials) -> list[bool]:
    """The reference: decode the answer token by token after the prompt."""
    out = []
    for t in trials:
        x = torch.tensor([t.tokens[:-t.answer]])
        for _ in range(t.answer):
            x = torch.cat([x, model(x)[:, -1].argmax(-1, keepdim=True)], dim=1)
        out.append(x[0, -t.answer:].tolist() == t.tokens[-t.answer:])
    return out


def test_oracle_scores_one_and_wrong_models_zero():
    trials = passkey.Prompter(ByteTokenizer()).trials(200, 0.5, 6, 5, seed=0)
    oracle = Oracle()
    assert passkey.retrieved(oracle, trials, "cpu") == [True] * 6
    assert oracle.widths == [200]  # one forward of exactly the length
    assert passkey.retrieved(Oracle(lambda key, k: True), trials, "cpu") == [False] * 6
    assert passkey.retrieved(Oracle(lambda key, k: k == 4), trials, "cpu") == [False] * 6  # last digit


def test_one_forward_gives_the_greedy_verdict():
    trials = passkey.Prompter(ByteTokenizer()).trials(150, 0.25, 40, 5, seed=3)
    sometimes = Oracle(lambda key, k: k == 2 and int(key[0]) % 2 == 1)  # wrong for some keys only
    verdicts = passkey.retrieved(sometimes, trials, "cpu")
    assert verdicts == greedy_hits(sometimes, trials) and 0 < sum(verdicts) < len(trials)


@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_every_scheme_answers_at_every_length(name):
    """Every registered scheme scores passkey prompts at 1x and 2x its training length, or says
    (PositionLimitError -> an `unsupported` row) that it has no positions there."""
    model = tiny_model(name, train_len=128, vocab=257)
    prompter = passkey.Prompter(ByteTokenizer())
    for length in (128, 256):
        trials = [t for d in (0.0, 1.0) for t in prompter.trials(length, d, 1, 5, seed=0)]
        limit = model.layout.schemes[0].position_limit()
        if limit is not None and length > limit:
            with pytest.raises(PositionLimitError):
                passkey.retrieved(model, trials, "cpu")
            continue
        verdicts = passkey.retrieved(model, trials, "cpu")
        assert len(verdicts) == 2 and all(isinstance(v, bool) for v in verdicts)
        if length == 128:  # the one-forward verdict is greedy decoding's, for this scheme too
            assert verdicts == greedy_hits(model, trials)


# --- end to end ----------------------------------------------------------------------------

TINY = ["--data", SPEC, "--tokenizer", "bytes", "--train-len", "128", "--steps", "2", "--batch-size", "2",
        "--d-model", "16", "--layers", "1", "--heads", "2", "--device", "cpu"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    runs = tmp_path_factory.mktemp("passkey_runs")
    for scheme in ("learned", "rope", "alibi"):
        assert main(["train", "--scheme", scheme, "--runs-dir", str(runs), *TINY]) == 0
    return runs


def test_passkey_cli(runs, tmp_path, capsys):
    out = tmp_path / "out"
    args = ["passkey", "--runs-dir", str(runs), "--lengths", "128,256", "--depths", "0,0.5,1",
            "--trials", "2", "--rope-scaling", "none,yarn", "--device", "cpu", "--out", str(out)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "passkey retrieval accuracy" in printed and "rope+yarn" in printed
    rows = results.read_rows(out / "passkey.csv")
    by = {}
    for r in rows:
        by.setdefault((r["scheme"], r["scaling"]), []).append(r)
    assert {k: len(v) for k, v in by.items()} == {("learned", "none"): 6, ("rope", "none"): 6,
                                                 ("rope", "yarn"): 6, ("alibi", "none"): 6}
    for r in rows:
        unsupported = r["scheme"] == "learned" and r["eval_len"] == "256"
        assert r["status"] == ("unsupported" if unsupported else "ok")
        if unsupported:
            assert "beyond its table of 128" in r["reason"] and r["accuracy"] == ""
        else:
            assert r["trials"] == "2" and 0 <= float(r["accuracy"]) <= 1 and r["ratio"] in ("1", "2")
    for name in ("learned", "rope", "rope+yarn", "alibi"):
        assert (out / f"passkey_{name}.png").stat().st_size > 1000
    assert main(args) == 0  # repeated: rows replaced, not duplicated
    assert len(results.read_rows(out / "passkey.csv")) == len(rows)


@pytest.mark.parametrize("extra, message", [
    (["--depths", "0,2"], "depths must be"),
    (["--depths", "a"], "bad depths"),
    (["--lengths", "64"], "too short"),
    (["--trials", "0"], "trials must be > 0"),
    (["--scheme", "rpoe"], "did you mean 'rope'"),
])
def test_passkey_cli_bad_input(runs, tmp_path, capsys, extra, message):
    assert main(["passkey", "--runs-dir", str(runs), "--device", "cpu", "--out", str(tmp_path), *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


TASK = f"""
version = 1
name = "tinypasskey"
schemes = ["rope", "learned"]
[data]
spec = "{SPEC}"
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
[passkey]
enabled = true
depths = [0, 1]
trials = 2
"""


def test_run_task_passkey_step_and_report(tmp_path):
    path = tmp_path / "tinypasskey.toml"
    path.write_text(TASK)
    task = config.load_task(str(path))
    assert task.passkey == config.PasskeyConfig(enabled=True, depths=(0.0, 1.0), trials=2)
    out = tmp_path / "out"
    first = run_task(task, out, device="cpu", speed=False)
    assert first["passkey"] == 2 and first["skipped_passkey"] == 0
    rows = results.read_rows(out / "passkey.csv")
    assert len(rows) == 2 * 4 * 2  # runs x lengths (1x, 2x, 4x, 8x) x depths
    assert {r["eval_len"] for r in rows} == {"128", "256", "512", "1024"}
    again = run_task(task, out, device="cpu", speed=False)
    assert again["passkey"] == 0 and again["skipped_passkey"] == 2
    assert main(["report", str(out)]) == 0
    report = (out / "report.md").read_text()
    assert "## Passkey retrieval" in report and "passkey_rope.png" in report and "unsupported" in report
    assert (out / "passkey_learned.png").exists()
