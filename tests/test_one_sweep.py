"""One sweep for both kinds of model (posbench.sweep): a trained run and a pretrained model are read
by the same loop, which shares a forward two policies have alike, writes a `failed` row for a cell
whose code fails and reads the others, for either kind; a text probe plug-in reads a pretrained
model as a symbolic one reads trained runs."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers", reason="the pretrained extra (transformers) is not installed")

from posbench import evaluate, results, sweep  # noqa: E402
from posbench.cli import main  # noqa: E402
from posbench.runs import RunSpec  # noqa: E402
from posbench.training import train  # noqa: E402
from tests.conftest import TINY_MODEL, TINY_TRAIN, write_corpus  # noqa: E402
from tests.test_pretrained import build  # noqa: E402

pytestmark = pytest.mark.slow  # a model trained and a pretrained one loaded


@pytest.fixture(scope="module")
def models(tmp_path_factory, tiny_data):
    """A trained RoPE run (training length 16) and a tiny pretrained Llama (context 32)."""
    home = tmp_path_factory.mktemp("sweep")
    train(RunSpec("rope", data=tiny_data, model=TINY_MODEL, train=TINY_TRAIN), home / "runs", device="cpu",
          progress=False)
    build(home / "tiny-llama")
    return home / "runs", home / "tiny-llama"


def test_both_kinds_of_model_go_through_the_same_sweep(models, tmp_path, monkeypatch):
    runs, folder = models
    readers, real = [], sweep.read_cell

    def seen(reader, *args):
        readers.append(type(reader).__name__)
        return real(reader, *args)

    monkeypatch.setattr(sweep, "read_cell", seen)
    failing = evaluate.Perplexity.read

    def fails_beyond(self, reader, length, common):  # the code of the cell fails at 4x the training length
        if length == 4 * reader.train_len:
            raise RuntimeError("the scheme's table ends here")
        return failing(self, reader, length, common)

    monkeypatch.setattr(evaluate.Perplexity, "read", fails_beyond)
    corpus = write_corpus(tmp_path / "corpus", n_docs=4, words=200)
    for args, train_len in ((["--runs-dir", str(runs)], 16), (["--model", f"hf:{folder}"], 32)):
        out = tmp_path / str(train_len)
        lengths = [train_len, 2 * train_len, 4 * train_len]
        assert main(["extrapolate", *args, "--out", str(out), "--rope-scaling", "none,pi:1", "--lengths",
                     ",".join(map(str, lengths)), "--tokens", "128", "--device", "cpu",
                     *(["--task", str(write_task(tmp_path, corpus))] if "--model" in args else [])]) == 1
        rows = {(r["scaling"], int(r["eval_len"])): r for r in results.read_rows(out / "extrapolation.csv")}
        assert set(rows) == {(s, n) for s in ("none", "pi:1") for n in lengths}
        for n in lengths[:2]:  # pi at factor 1 is none's forward: read once, said so
            assert rows[("pi:1", n)]["ppl"] == rows[("none", n)]["ppl"] and rows[("none", n)]["status"] == "ok"
            assert rows[("pi:1", n)]["reason"].startswith("same frequencies as none")
        failed = rows[("none", lengths[2])]
        assert failed["status"] == "failed" and "RuntimeError: the scheme's table ends here" in failed["reason"]
        assert failed["reason"].startswith(f"at {lengths[2]} positions")
    assert set(readers) == {"TrainedReader", "Pretrained"}


def write_task(tmp_path, corpus):
    path = tmp_path / "task.toml"
    path.write_text(f'version = 1\nname = "both"\ndescription = "both kinds"\nschemes = ["rope"]\n\n'
                    f'[data]\nspec = "files:{corpus}"\n')
    return path


ECHO = '''
from posbench.probes import TextProbe, register


@register
class Echo(TextProbe):
    name = "echo"
    summary = "a word at the start of the prompt, asked for at its end"
    reference = "posbench's tests"

    def prompts(self, length, variant, trials, seed):
        words = ["abc", "xyz", "k9q"]
        out = []
        for i in range(trials):
            word = words[(seed + i) % len(words)]
            text = word + " " + "." * (length - 2 * len(word) - 3) + " " + word[:1]
            out.append(self.prompt(text, (word[1:],), 3))
        return out
'''


def test_a_text_probe_plug_in_reads_a_pretrained_model(models, tmp_path, capsys, registry):
    runs, folder = models
    path = tmp_path / "echo.py"
    path.write_text(ECHO)
    out = tmp_path / "out"
    args = ["probe", "--probe", "echo", "--plugin", str(path), "--out", str(out)]
    assert main([*args, "--model", f"hf:{folder}", "--lengths", "32,64", "--trials", "2", "--rope-scaling",
                 "none,yarn", "--resume"]) == 0
    rows = {(r["scaling"], r["eval_len"]): r for r in results.read_probes(out)}
    assert sorted(rows) == [(s, n) for s in ("none", "yarn") for n in ("32", "64")]
    assert all(r["probe"] == "echo" and r["trials"] == "2" and r["answers"] == "2" for r in rows.values())
    prompts = results.read_rows(out / "prompts.csv")
    assert len(prompts) == 2 * 3  # none at 32 and 64, yarn at 64 (at its context 32 it shares none's forward)
    for (scaling, n), r in rows.items():  # a cell's counts are its prompts' verdicts
        read = scaling if (scaling, n) != ("yarn", "32") else "none"
        assert int(r["hits"]) == sum(int(p["hits"]) for p in prompts if (p["scaling"], p["eval_len"]) == (read, n))
    capsys.readouterr()
    assert main(["probe", "--list", "--plugin", str(path)]) == 0
    listed = capsys.readouterr().out
    assert "echo" in listed and "echo.py" in listed
    assert main([*args, "--runs-dir", str(runs)]) == 2  # a text probe with trained runs: one line
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "echo reads text through the model's tokenizer" in err[0], err
