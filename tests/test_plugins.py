"""Plug-ins: a scheme or probe of the user's own, from a file, a module or an installed
distribution; its bytes name its runs; bad ones are one line; `posbench check` judges it."""

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import TINY_TASK
from posbench import plugins, results, training
from posbench.conformance import check
from posbench.cli import main
from posbench.schemes import SCHEMES

GOOD = '''
import torch
from posbench.schemes import Scheme, register


@register
class LearnedSlopes(Scheme):
    """A distance penalty with one learned slope per head."""
    name = "{name}"
    family = "bias"
    hooks = ("bias",)
    relative = True
    reference = "a test"
    defaults = {{"scale": 0.5}}

    def __init__(self, dims):
        super().__init__(dims)
        self.slope = torch.nn.Parameter(torch.full((dims.n_heads,), self.p["scale"]))

    def bias_fn(self, h, qpos, kpos):
        return -self.slope[h] * (qpos - kpos).clamp(min=0)
'''

# Planted defects, each for the property that must catch it.
PEEKS = """
import torch
from posbench.schemes import Scheme, register


@register
class Peeks(Scheme):
    name = "peeks"
    family = "absolute"
    hooks = ("input",)

    def embed(self, x, idx, pos):
        return x + 0.5 * torch.roll(x, -1, dims=1)  # the next token's embedding: a leak
"""
FALSE_RELATIVE = GOOD.replace('name = "{name}"', 'name = "falsely-relative"').replace(
    "return -self.slope[h] * (qpos - kpos).clamp(min=0)",
    "return -self.slope[h] * (qpos - kpos).clamp(min=0) * (1 + 0.1 * qpos)").replace("{{", "{").replace("}}", "}")
NAN_PAST = GOOD.replace('name = "{name}"', 'name = "nan-past"').replace(
    "return -self.slope[h] * (qpos - kpos).clamp(min=0)",
    "b = -self.slope[h] * (qpos - kpos).clamp(min=0)\n        return torch.where(qpos >= self.dims.train_len, "
    "torch.full_like(b, float('nan')), b)").replace("{{", "{").replace("}}", "}")

INDEXED_TWICE = GOOD.replace('name = "{name}"', 'name = "indexed-twice"').replace(
    "return -self.slope[h] * (qpos - kpos).clamp(min=0)",
    "return -torch.nn.functional.softplus(self.slope)[h] * (qpos - kpos).clamp(min=0)").replace(
    "{{", "{").replace("}}", "}")

# Reads the window's length: position i's outputs change when tokens are appended after it.
LENGTH_READER = """
import torch
from posbench.schemes import Scheme, register


@register
class LengthReader(Scheme):
    name = "length-reader"
    family = "bias"
    hooks = ("bias",)
    relative = True

    def __init__(self, dims):
        super().__init__(dims)
        self.slope = torch.nn.Parameter(torch.linspace(0.5, 1.0, dims.n_heads))

    def bias_fn(self, h, qpos, kpos):
        n = kpos.max() - kpos.min() + 1  # the window's length
        return -self.slope[h] * (qpos - kpos) / n
"""

# An absolute table of 64 rows that does not declare where it ends (no position_limit()), nor
# anything about its extrapolation.
TABLE = """
import torch
from posbench.schemes import Scheme, register


@register
class TablePE(Scheme):
    name = "tablepe"
    family = "absolute"
    hooks = ("input",)

    def __init__(self, dims):
        super().__init__(dims)
        self.table = torch.nn.Parameter(0.02 * torch.randn(64, dims.d_model))

    def embed(self, x, idx, pos):
        return x + self.table[pos]
"""


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


def test_schemes_lists_a_plugin_with_its_source(registry, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "my_pe.py", GOOD.format(name="my-pe"))
    assert main(["schemes", "--format", "json", "--plugin", "my_pe.py"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["my-pe"]["source"] == str(tmp_path / "my_pe.py")
    assert rows["rope"]["source"] == "built-in" and rows["my-pe"]["learned_params"] == "4"


@pytest.mark.slow
def test_a_plugin_trains_extrapolates_probes_and_times(registry, tmp_path, corpus_dir, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    plugin = write(tmp_path / "my_pe.py", GOOD.format(name="my-pe"))
    tiny = ["--train-len", "16", "--steps", "4", "--batch-size", "4", "--d-model", "32", "--layers", "1",
            "--heads", "2", "--tokenizer", "bytes", "--device", "cpu", "--data", f"files:{corpus_dir}"]
    assert main(["train", "--plugin", "my_pe.py", "--scheme", "my-pe", *tiny]) == 0
    run = results.read_rows(tmp_path / "runs" / "runs.csv")[0]
    assert run["plugins"].startswith(f"{plugin}@") and run["status"] == "ok"
    config = json.loads((tmp_path / "runs" / run["run_id"] / "config.json").read_text())
    assert config["plugins"] == [{"path": str(plugin), "sha256": plugins.sha256_of(plugin)}]
    assert main(["extrapolate", "--plugin", "my_pe.py", "--lengths", "16,32", "--tokens", "64"]) == 0
    assert {r["eval_len"] for r in results.read_rows(tmp_path / "runs" / "extrapolation.csv")} == {"16", "32"}
    assert main(["speed", "--plugin", "my_pe.py", "--schemes", "my-pe,rope", "--lengths", "32",
                 "--batch-size", "1", "--heads", "2", "--head-dim", "8", "--out", "sp"]) == 0
    assert {r["scheme"] for r in results.read_rows(tmp_path / "sp" / "speed.csv")} >= {"my-pe", "rope"}
    # A probe run of the plug-in, scored.
    assert main(["train", "--plugin", "my_pe.py", "--scheme", "my-pe", "--data", "copy", "--train-len", "16",
                 "--steps", "2", "--batch-size", "4", "--d-model", "16", "--layers", "1", "--heads", "2",
                 "--runs-dir", "probe-runs"]) == 0
    assert main(["probe", "--plugin", "my_pe.py", "--probe", "copy", "--runs-dir", "probe-runs",
                 "--lengths", "16", "--trials", "2"]) == 0
    assert [r["scheme"] for r in results.read_rows(tmp_path / "probe-runs" / "probes.csv")] == ["my-pe"]
    capsys.readouterr()
    # The same run read without its plug-in, or with an edited one: one line naming file and hash.
    plugins._loaded.clear()
    SCHEMES.pop("my-pe")
    assert main(["extrapolate", "--lengths", "16", "--tokens", "64"]) == 2
    assert f"needs plugin {plugin} with sha256 {plugins.sha256_of(plugin)[:12]}" in capsys.readouterr().err
    write(plugin, GOOD.format(name="my-pe") + "# edited\n")
    assert main(["extrapolate", "--plugin", "my_pe.py", "--lengths", "16", "--tokens", "64"]) == 2
    assert "(edited since)" in capsys.readouterr().err
    # Training again with the edited file is a new run beside the old one.
    assert main(["train", "--plugin", "my_pe.py", "--scheme", "my-pe", *tiny]) == 0
    ids = [r["run_id"] for r in results.read_rows(tmp_path / "runs" / "runs.csv")]
    assert len(ids) == 2 and ids[0] != ids[1] and all(i.startswith("my-pe-") for i in ids)


def test_train_takes_a_scheme_from_the_task_files_plugins(registry, tmp_path, corpus_dir, capsys):
    """`posbench train --task T --scheme S` where S comes from T's own plugins = [...]."""
    (tmp_path / "pe").mkdir()
    write(tmp_path / "pe" / "my_pe.py", GOOD.format(name="my-pe"))
    task = tmp_path / "pe" / "grid.toml"
    task.write_text('plugins = ["my_pe.py"]\nschemes = ["my-pe"]\n' + TINY_TASK.format(corpus=corpus_dir))
    assert main(["train", "--task", str(task), "--scheme", "my-pe", "--steps", "1",
                 "--runs-dir", str(tmp_path / "runs")]) == 0
    assert [r["scheme"] for r in results.read_rows(tmp_path / "runs" / "runs.csv")] == ["my-pe"]


@pytest.mark.slow
def test_a_task_with_plugins_runs_sharded_and_resumes(tmp_path, corpus_dir):
    """In fresh processes, as Slurm shards run: the task's plug-in path is relative to the task."""
    (tmp_path / "pe").mkdir()
    write(tmp_path / "pe" / "my_pe.py", GOOD.format(name="my-pe"))
    task = tmp_path / "pe" / "grid.toml"
    task.write_text('plugins = ["my_pe.py"]\nschemes = ["my-pe", "alibi"]\n' + TINY_TASK.format(corpus=corpus_dir))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = tmp_path / "out"
    for shard in ("1/2", "2/2", "1/2"):
        proc = subprocess.run([sys.executable, "-m", "posbench", "run", str(task), "--shard", shard, "--out",
                               str(out), "--no-speed", "--resume"], capture_output=True, text=True, env=env,
                              cwd=tmp_path, timeout=300)
        assert proc.returncode == 0, proc.stderr
    assert "skipped 1 finished" in proc.stdout  # the rerun of shard 1 trained nothing
    rows = results.read_rows(out / "runs.csv")
    assert sorted(r["scheme"] for r in rows) == ["alibi", "my-pe"]
    assert json.loads((out / "provenance.json").read_text())["plugins"][0]["path"] == str(tmp_path / "pe" / "my_pe.py")


def test_submit_freezes_the_plugins_beside_the_task(registry, tmp_path, corpus_dir, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "my_pe.py", GOOD.format(name="my-pe"))
    write(tmp_path / "extra.py", GOOD.format(name="extra-pe"))
    task = tmp_path / "grid.toml"
    task.write_text('plugins = ["my_pe.py"]  # mine\nschemes = ["my-pe", "extra-pe"]\n'
                    + TINY_TASK.format(corpus=corpus_dir))
    assert main(["submit", str(task), "--shards", "2", "--dry-run", "--out", "o", "--plugin", "extra.py"]) == 0
    frozen = tmp_path / "o" / "slurm" / "grid.toml"
    copies = sorted(p.name for p in (frozen.parent / "plugins").iterdir())
    assert [c.split("-", 1)[1] for c in copies] == ["extra.py", "my_pe.py"]
    import tomllib
    assert sorted(tomllib.loads(frozen.read_text())["plugins"]) == [f"plugins/{c}" for c in copies]


@pytest.mark.slow
def test_an_installed_distribution_is_found_without_a_flag(tmp_path):
    site = tmp_path / "site"
    (site / "my_pe_dist-0.3.dist-info").mkdir(parents=True)
    write(site / "my_pe_dist.py", GOOD.format(name="dist-pe"))
    (site / "my_pe_dist-0.3.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: my-pe-dist\nVersion: 0.3\n")
    (site / "my_pe_dist-0.3.dist-info" / "entry_points.txt").write_text("[posbench.plugins]\nmine = my_pe_dist\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *sys.path])}
    proc = subprocess.run([sys.executable, "-m", "posbench", "schemes", "--format", "csv"], capture_output=True,
                          text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("dist-pe,"))
    assert line.endswith("distribution my-pe-dist 0.3")


@pytest.mark.parametrize("text, message", [
    (None, "no such file"),
    ("x = = 1\n", "line 1: SyntaxError"),
    ("import torch\n\ntorch.nope()\n", "line 3: AttributeError"),
    (GOOD.format(name="rope"), "clashes with the scheme of that name from built-in"),
    (GOOD.format(name="my-pe").replace('    family = "bias"\n', ""), "has no `family`"),
    (GOOD.format(name="my-pe").replace('hooks = ("bias",)', 'hooks = ("bias", "magic")'), "unknown hook(s) magic"),
    (GOOD.format(name="my-pe").replace('defaults = {"scale": 0.5}', 'defaults = {"scale": [0.5]}'),
     "parameter scale has a default of type list"),
    ("import sys\n\nsys.exit(3)\n", "line 3: calls sys.exit(3) at import"),
    ("import sys\n\nsys.exit()\n", "line 3: calls sys.exit() at import"),
])
def test_bad_plugins_are_one_line_and_write_nothing(registry, tmp_path, monkeypatch, capsys, text, message):
    monkeypatch.chdir(tmp_path)
    if text is not None:
        write(tmp_path / "bad.py", text)
    before = set(SCHEMES)
    assert main(["train", "--plugin", "bad.py", "--scheme", "rope", "--steps", "2"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "plugin bad.py" in err
    assert set(SCHEMES) == before and not (tmp_path / "runs").exists()


INIT_RAISES = GOOD.replace("        super().__init__(dims)\n",
                           "        super().__init__(dims)\n        raise ValueError('no table for ' + str(dims.d_model))\n")


@pytest.mark.parametrize("command", [
    ["train", "--scheme", "init-raises", "--steps", "2"],
    ["check", "init-raises"],
    ["inspect", "init-raises", "--out", "pictures"],
    ["speed", "--schemes", "init-raises", "--lengths", "32", "--out", "sp"],
])
def test_a_plugin_whose_init_raises_is_one_line(registry, tmp_path, monkeypatch, capsys, command):
    monkeypatch.chdir(tmp_path)
    plugin = write(tmp_path / "bad.py", INIT_RAISES.format(name="init-raises"))
    if command[0] == "train":  # the scheme fails before the corpus is read and tokenized
        monkeypatch.setattr(training, "load_tokens", lambda *a: pytest.fail("the corpus was read"))
    rc = main([*command, "--plugin", "bad.py"])
    err = capsys.readouterr().err
    if command[0] == "speed":  # speed records a scheme it cannot build as failed rows, goes on, exits 1
        assert rc == 1 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        assert "cell(s) failed (init-raises fwd at 32" in err and "init-raises: ValueError: no table for " in err, err
        rows = [r for r in results.read_rows(tmp_path / "sp" / "speed.csv") if r["scheme"] == "init-raises"]
        assert rows and all(r["status"] != "ok" and "no table for" in r["reason"] for r in rows), rows
        return
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert f"plugin {plugin}: line 18: ValueError: no table for " in err, err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "pictures").exists()  # no runs folder, no picture


def test_a_plugin_that_fails_while_drawn_is_one_line(registry, tmp_path, monkeypatch, capsys):
    """Past its 64 rows the table plug-in raises inside its own hook: without a run, `inspect`
    draws to 16x the training length and stops there, naming the plug-in's line."""
    monkeypatch.chdir(tmp_path)
    plugin = write(tmp_path / "tablepe.py", TABLE)
    assert main(["inspect", "tablepe", "--plugin", "tablepe.py", "--train-len", "16", "--out", "pictures"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert f"plugin {plugin}: line 17: IndexError" in err, err
    assert main(["inspect", "tablepe", "--plugin", "tablepe.py", "--train-len", "16", "--lengths", "64",
                 "--out", "pictures"]) == 0


def test_two_plugins_with_one_name_clash(registry, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "a.py", GOOD.format(name="twin"))
    write(tmp_path / "b.py", GOOD.format(name="twin"))
    assert main(["schemes", "--plugin", "a.py", "--plugin", "b.py"]) == 2
    assert f"from {tmp_path / 'a.py'}" in capsys.readouterr().err


@pytest.mark.slow
def test_debug_shows_the_traceback(tmp_path):
    write(tmp_path / "bad.py", "import torch\n\ntorch.nope()\n")
    proc = subprocess.run([sys.executable, "-m", "posbench", "schemes", "--plugin", "bad.py", "--debug"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode != 0 and "Traceback" in proc.stderr and "torch.nope()" in proc.stderr


@pytest.mark.slow
def test_check_passes_every_builtin_scheme_and_preset():
    from posbench import layout

    for name in sorted(SCHEMES) + list(layout.PRESETS):
        # flex backward: tests/test_attention.py checks every scheme on the flex path the same way
        bad = [f for f in check(name, skip=("cost", "compiled graph", "flex backward")) if f.status == "fail"]
        assert not bad, (name, bad)


@pytest.mark.slow
@pytest.mark.parametrize("source, prop", [(PEEKS, "causality"), (LENGTH_READER, "causality"),
                                          (FALSE_RELATIVE, "translation"),
                                          (NAN_PAST, "past training length"),
                                          (INDEXED_TWICE, "flex backward")])
def test_check_catches_planted_defects(registry, tmp_path, monkeypatch, capsys, source, prop):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "defect.py", source)
    name = next(line.split('"')[1] for line in source.splitlines() if line.strip().startswith("name ="))
    assert main(["check", name, "--plugin", "defect.py", "--skip", "cost,compiled graph"]) == 1
    out = capsys.readouterr().out
    failed = [line for line in out.splitlines() if line.startswith("fail")]
    assert prop in [line.split("  ")[0].removeprefix("fail ").strip() for line in failed], out


# A bias whose hook raises whenever it runs: every property that runs the model fails by its line.
RAISER = """
import torch
from posbench.schemes import Scheme, register


@register
class Raiser(Scheme):
    name = "raiser"
    family = "bias"
    hooks = ("bias",)
    relative = True

    def bias_fn(self, h, qpos, kpos):
        raise ValueError("no bias today")
"""


def test_a_plugin_that_raises_inside_a_property_is_named_by_file_and_line(registry, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "raiser.py", RAISER)
    plugins.load_all(["raiser.py"])
    findings = check("raiser", skip=("cost", "compiled graph", "flex backward"))
    causality = next(f for f in findings if f.prop == "causality")
    line = next(i for i, text in enumerate(RAISER.splitlines(), start=1) if "raise ValueError" in text)
    assert causality.status == "fail" and causality.detail == (
        f"plugin {(tmp_path / 'raiser.py').resolve()}: line {line}: ValueError: no bias today"), causality


def test_causality_grows_the_sequence_on_every_path(registry, tmp_path, monkeypatch, capsys):
    """Changing one token leaves the earlier outputs of a length reader alone; appending tokens
    does not, and the finding says so on each path (SDPA's mask and explicit)."""
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "reader.py", LENGTH_READER)
    assert main(["check", "length-reader", "--plugin", "reader.py", "--skip", "cost,compiled graph,flex backward"]) == 1
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("fail causality"))
    assert line.count("were appended to the first 8") == 2 and "sdpa" in line and "explicit" in line, line
    assert "changed when token 8 did" not in line, line
    finding = next(f for f in check("length-reader", skip=("cost", "compiled graph", "flex backward"))
                   if f.prop == "causality")
    assert finding.status == "fail" and "position 1 changed" in finding.detail, finding


@pytest.mark.slow
def test_check_of_a_good_plugin_passes_with_cost_and_graph(registry, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "my_pe.py", GOOD.format(name="my-pe"))
    assert main(["check", "my-pe", "--plugin", "my_pe.py", "--param", "scale=0.25"]) == 0
    out = capsys.readouterr().out
    assert "pass compiled graph" in out and "pass flex backward" in out and "x rope" in out and "12 of 12" in out
    assert main(["check", "my-pe", "--param", "sclae=1"]) == 2
    assert "did you mean 'scale'" in capsys.readouterr().err


@pytest.mark.slow
def test_the_readme_example_runs_verbatim(registry, tmp_path, monkeypatch, capsys):
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    block = readme.split("<!-- api-example -->", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(tmp_path)
    exec(compile(block, "README.md", "exec"), {"__name__": "__main__"})
    out = capsys.readouterr().out
    assert "compiled graph" in out and "fail" not in out
    runs = results.read_rows(tmp_path / "runs" / "mine" / "runs.csv")
    assert sorted(r["scheme"] for r in runs) == ["decay", "rope"] and all(r["status"] == "ok" for r in runs)
    # It learned: the validation loss is well below chance over the 256 byte values.
    assert all(float(r["final_val_loss"]) < math.log(256) - 1 for r in runs)
    ppl = results.read_rows(tmp_path / "runs" / "mine" / "extrapolation.csv")
    assert {(r["scheme"], r["eval_len"]) for r in ppl} == {(s, n) for s in ("decay", "rope") for n in ("32", "64", "128")}


@pytest.mark.slow
def test_the_api_returns_frames_and_refuses_bad_input(registry, tmp_path, corpus_dir, monkeypatch):
    import pandas as pd

    import posbench
    from posbench.errors import PosbenchError

    monkeypatch.chdir(tmp_path)
    write(tmp_path / "my_pe.py", GOOD.format(name="my-pe"))
    row = posbench.train("my-pe", plugins=["my_pe.py"], data=f"files:{corpus_dir}", tokenizer="bytes",
                         train_len=16, steps=3, batch_size=4, d_model=16, layers=1, heads=2, device="cpu")
    assert isinstance(row, pd.DataFrame) and row.loc[0, "status"] == "ok" and Path(row.loc[0, "run_dir"]).is_dir()
    again = posbench.train("my-pe", data=f"files:{corpus_dir}", tokenizer="bytes", train_len=16, steps=3,
                           batch_size=4, d_model=16, layers=1, heads=2, device="cpu", resume=True)
    assert bool(again.loc[0, "skipped"]) and again.loc[0, "run_id"] == row.loc[0, "run_id"]
    assert set(posbench.check("my-pe", skip=["cost", "compiled graph"])["status"]) == {"pass"}
    with pytest.raises(PosbenchError, match="did you mean 'rope'"):
        posbench.train("rpoe")
    with pytest.raises(PosbenchError, match="no such file"):
        posbench.speed(plugins=["missing.py"])


@pytest.mark.slow
def test_a_scheme_that_fails_past_its_table_fails_those_lengths_only(registry, tmp_path, corpus_dir, monkeypatch,
                                                                     capsys):
    monkeypatch.chdir(tmp_path)
    plugin = write(tmp_path / "tablepe.py", TABLE)
    tiny = ["--train-len", "16", "--steps", "2", "--batch-size", "2", "--d-model", "16", "--layers", "1",
            "--heads", "2", "--tokenizer", "bytes", "--device", "cpu", "--data", f"files:{corpus_dir}"]
    for scheme in ("tablepe", "rope"):
        assert main(["train", "--plugin", "tablepe.py", "--scheme", scheme, *tiny]) == 0
    capsys.readouterr()
    assert main(["extrapolate", "--plugin", "tablepe.py", "--lengths", "32,64,128", "--tokens", "256"]) == 1
    out, err = capsys.readouterr()
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "1 row(s) failed (tablepe-" in err and "at 128" in err and "the other rows were written" in err, err
    rows = results.read_rows(tmp_path / "runs" / "extrapolation.csv")
    status = {(r["scheme"], r["eval_len"]): r["status"] for r in rows}
    assert status == {("tablepe", "32"): "ok", ("tablepe", "64"): "ok", ("tablepe", "128"): "failed",
                      ("rope", "32"): "ok", ("rope", "64"): "ok", ("rope", "128"): "ok"}, status
    failed = next(r for r in rows if r["status"] == "failed")
    assert failed["reason"].startswith(f"at 128 positions: plugin {plugin}: line 17: IndexError: ")
    assert "position_limit()" in failed["reason"] and failed["ppl"] == "" and failed["tokens"] == "0"
    assert "failed" in out  # the table shows the cell as failed
    assert "* the lowest (best) mean perplexity at that length" in out  # what the star means
    # The positions of the failed length: none, and none asked for.
    assert {r["eval_len"] for r in results.read_rows(tmp_path / "runs" / "positions.csv")
            if r["scheme"] == "tablepe"} == {"32", "64"}
    # inspect --run: the pictures past the table and the measures at 128 fail, the rest is written.
    run_id = failed["run_id"]
    assert main(["inspect", "--run", run_id, "--plugin", "tablepe.py", "--lengths", "32,128", "--out", "ins"]) == 1
    out, err = capsys.readouterr()
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1 and f"{run_id} at 128" in err, err
    measured = {r["eval_len"] for r in results.read_rows(tmp_path / "ins" / "attention.csv")}
    assert measured == {"32"} and "not drawn, it failed at 128 positions" in (tmp_path / "ins" / "inspect.md").read_text()
    # A stale plug-in is refused before any other run's rows are evaluated again or rewritten.
    before = {name: (tmp_path / "runs" / f"{name}.csv").read_bytes() for name in ("extrapolation", "windows")}
    plugins._loaded.clear()  # a fresh process, with an edited file
    SCHEMES.pop("tablepe")
    write(plugin, TABLE + "# edited\n")
    assert main(["extrapolate", "--plugin", "tablepe.py", "--lengths", "32,64,128", "--tokens", "256"]) == 2
    err = capsys.readouterr().err
    assert "needs plugin" in err and "that version of the file" in err, err
    assert {name: (tmp_path / "runs" / f"{name}.csv").read_bytes() for name in before} == before


def test_a_plugin_that_declares_nothing_is_unknown_and_check_says_what_it_found(registry, tmp_path, monkeypatch,
                                                                                capsys):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "tablepe.py", TABLE)
    assert main(["schemes", "--format", "json", "--plugin", "tablepe.py"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["tablepe"]["extrapolates"] == "unknown"
    assert rows["rope"]["extrapolates"] == "yes" and rows["sinusoidal"]["extrapolates"] == "no"
    found = {f.prop: f for f in check("tablepe", skip=("cost", "compiled graph", "flex backward"))}
    past = found["past training length"]
    assert past.status == "fail" and past.detail.startswith("tablepe declares no `extrapolates` (listed as unknown)")
    assert "fails at 256 positions" in past.detail and "line 17: IndexError" in past.detail
    assert "position_limit()" in past.detail


@pytest.mark.slow
def test_probe_and_run_record_the_failed_lengths_and_go_on(registry, tmp_path, corpus_dir, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    plugin = write(tmp_path / "tablepe.py", TABLE)
    assert main(["train", "--plugin", "tablepe.py", "--scheme", "tablepe", "--data", "copy", "--train-len", "16",
                 "--steps", "2", "--batch-size", "2", "--d-model", "16", "--layers", "1", "--heads", "2",
                 "--runs-dir", "probe-runs"]) == 0
    capsys.readouterr()
    assert main(["probe", "--plugin", "tablepe.py", "--probe", "copy", "--runs-dir", "probe-runs",
                 "--lengths", "16,128", "--trials", "2"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1 and "at 128" in err, err
    rows = results.read_rows(tmp_path / "probe-runs" / "probes.csv")
    assert {r["eval_len"] for r in rows if r["status"] == "failed"} == {"128"}
    assert {r["eval_len"] for r in rows if r["status"] != "failed"} == {"16"}
    assert all(f"plugin {plugin}: line 17: IndexError" in r["reason"] for r in rows if r["status"] == "failed")
    # A grid of the plug-in beside a built-in: both trained, every length written, exit 1 naming the row.
    task = tmp_path / "grid.toml"
    task.write_text('plugins = ["tablepe.py"]\nschemes = ["tablepe", "alibi"]\n'
                    + TINY_TASK.format(corpus=corpus_dir).replace("lengths = [16, 32]", "lengths = [16, 128]"))
    assert main(["run", str(task), "--out", "grid", "--no-speed"]) == 1
    err = capsys.readouterr().err  # with the corpus loader's progress lines
    assert "Traceback" not in err and len([x for x in err.splitlines() if x.startswith("error:")]) == 1, err
    assert "1 row(s) failed (tablepe-" in err and "at 128" in err, err
    status = {(r["scheme"], r["eval_len"]): r["status"] for r in results.read_rows(tmp_path / "grid" / "extrapolation.csv")}
    assert status == {("tablepe", "16"): "ok", ("tablepe", "128"): "failed", ("alibi", "16"): "ok",
                      ("alibi", "128"): "ok"}, status
    assert (tmp_path / "grid" / "report.md").exists()


@pytest.mark.parametrize("command", ["train", "extrapolate", "check"])
def test_every_commands_help_names_plugin(command, capsys):
    assert main([command, "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--plugin FILE_OR_MODULE" in out and "--debug" in out, out
