"""The bad-input contract: every case below ends with exit code 2 and one line on stderr that
says what is wrong (never a traceback), and leaves existing results as they were. A few cases have
a correct result instead, said where they are. Grouped by where the bad input comes from: flags,
task files, result files, run directories, the file system, the data source, and training."""

import errno
import json
import os
import shutil
import time
from pathlib import Path

import pytest
from conftest import TINY_TASK, snapshot

from posbench import cli, results
from posbench.cli import main

REPO = Path(__file__).resolve().parents[1]
BASELINE = REPO / "results" / "baseline" / "ci"


def fails(argv, capsys, message: str, code: int = 2) -> str:
    """Run the CLI in-process; assert the exit code and one stderr line containing `message`."""
    rv = main([str(a) for a in argv])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert rv == code, err
    assert len(lines) == 1 and message in lines[0], err
    return lines[0]


# --- command-line values --------------------------------------------------------------------

HUGE = "99999999999999999999"
SEEDS = REPO / "results" / "probes" / "seeds"  # read, never written


@pytest.mark.parametrize("argv, message", [
    (["train", "--scheme", "rope", "--lr", "nan"], "lr must be a finite number"),
    (["train", "--scheme", "rope", "--lr", "inf"], "lr must be a finite number"),
    (["train", "--scheme", "rope", "--lr", "-1"], "lr must be > 0"),
    (["train", "--scheme", "rope", "--steps", HUGE], "steps is too large"),
    (["train", "--scheme", "rope", "--train-len", "3000000000"], "train_len is too large"),
    (["train", "--scheme", "rope", "--batch-size", HUGE], "batch_size is too large"),
    (["train", "--scheme", "rope", "--seed", "-1"], "seed must be in 0.."),
    (["train", "--scheme", "rope", "--seed", HUGE], "seed must be in 0.."),
    (["extrapolate", "--scaling-factor", "nan"], "rope_scaling_factor must be a finite number"),
    (["extrapolate", "--scaling-factor", "-2"], "rope scaling factor must be >= 1"),
    (["extrapolate", "--model", "gguf:nowhere.gguf", "--lengths", "10000000"],
     "lengths must be >= 2 and <= 1048576, got 10000000"),
    (["extrapolate", "--scaling-factor", "0.5"], "rope scaling factor must be >= 1"),
    (["extrapolate", "--yarn-alpha", "nan"], "yarn_alpha must be a finite number"),
    (["extrapolate", "--yarn-beta", "inf"], "yarn_beta must be a finite number"),
    (["extrapolate", "--yarn-alpha", "-1"], "yarn_alpha must be > 0"),
    (["extrapolate", "--yarn-alpha", "40"], "yarn_alpha (40.0) must be below yarn_beta"),
    (["extrapolate", "--learned-extension", "foo"], "unknown learned extension 'foo'"),
    (["extrapolate", "--rope-scaling", "yran"], "did you mean 'yarn'"),
    (["extrapolate", "--lengths", ""], "bad lengths '': empty"),
    (["extrapolate", "--lengths", HUGE], "lengths is too large"),
    (["extrapolate", "--tokens", HUGE], "tokens is too large"),
    (["extrapolate", "--stride", "-1"], "stride must be >= 0"),
    (["extrapolate", "--key-loss", "0"], "key_loss must be > 0"),
    (["extrapolate", "--key-drop", "nan"], "key_drop must be a finite number"),
    (["extrapolate", "--share", "2"], "effective_share must be in [0, 1]"),
    (["speed", "--lengths", ""], "bad lengths '': empty"),
    (["speed", "--schemes", ""], "bad list '': empty"),
    (["speed", "--schemes", "rope,,alibi"], "bad list 'rope,,alibi': an empty item between commas"),
    (["speed", "--lengths", "16,,32"], "bad lengths '16,,32': an empty item between commas"),
    (["extrapolate", "--lengths", "16,,32"], "bad lengths '16,,32': an empty item between commas"),
    (["extrapolate", "--rope-scaling", "none,,pi"], "bad rope_scaling 'none,,pi': an empty item between commas"),
    (["train", "--scheme", "rope", "--seeds", "0,,1"], "an empty item between commas"),
    (["inspect", "rope", "--lengths", "16,,32"], "bad lengths '16,,32': an empty item between commas"),
    (["table", "probes", SEEDS, "--ratios", "-1"], "bad ratios '-1': expected positive integers"),
    (["table", "probes", SEEDS, "--pairs", "a:b"], "expected A:B:PROBE"),
    (["table", "probes", SEEDS, "--task", "probe-seeds"], "task picks the runs of the table over seeds"),
    (["train", "--scheme", "rope", "--task", REPO / "tasks"], "is a folder, not a task file"),
    (["probe", "--probe", "passkey", "--lengths", ""], "bad lengths '': empty"),
    (["probe", "--probe", "passkey:digits=nan"], "bad digits 'nan'"),
    (["probe", "--probe", "ruler:niah_singel_1"], "unknown ruler task 'niah_singel_1'; did you mean 'niah_single_1'"),
    (["probe", "--probe", "ruler:cwe"], "ruler:cwe reads text through the model's tokenizer, for --model: add --model"),
    (["probe", "--probe", "ruler:vt", "--model", "hf:nowhere", "--ruler-essay", "wiki"], "bad ruler essay 'wiki'"),
    (["compare", "a", "b", "--rtol", "nan"], "rtol must be a finite number >= 0"),
    (["compare", "a", "b", "--rtol", "inf"], "rtol must be a finite number >= 0"),
    (["compare", "a", "b", "--rtol", "-0.1"], "rtol must be a finite number >= 0"),
    (["train", "--scheme", f"rope*{HUGE}/none"], "writes out more than 4096 layers"),
    (["train", "--scheme", f"rope@w{HUGE}/none"], "window or chunk of 1 <= SIZE <= 2147483647"),
    (["train", "--scheme", "none+llama4:floor=inf"],
     "floor of temperature 'llama4' in layout 'none+llama4:floor=inf' must be a finite number"),
    (["train", "--scheme", f"none+llama4:floor={HUGE}"], "floor of temperature 'llama4'"),
    (["train", "--scheme", "none+llama4:beta=nan"],
     "beta of temperature 'llama4' in layout 'none+llama4:beta=nan' must be a finite number"),
    (["train", "--scheme", "rope:base=nan@w/none"], "parameter base of scheme 'rope' must be a finite number, got nan"),
    (["train", "--scheme", "rope", "--param", "base=inf"], "parameter base of scheme 'rope' must be a finite number, got inf"),
    (["train", "--scheme", "t5", "--param", f"num_buckets={HUGE}"], "parameter num_buckets of scheme 't5' is too large"),
    (["run", "quick", "--shard", "7/7"], "shard 7/7 of task quick holds no runs: the grid has 6 runs"),
    # refused as the task keys are, before a list of that many workers, seeds or members is built
    (["run", "quick", "--workers", "99999999999"], "workers is too large: 99999999999"),
    (["train", "--scheme", "rope", "--seeds", "0-99999999999"], "seeds is too large: 99999999999"),
    (["train", "--scheme", "rope", "--seeds", "0-1", "--ensemble", "99999999999"], "ensemble is too large"),
    (["train", "--scheme", "rope", "--seeds", "5-999999"], "the range 5-999999 holds 999995 seeds (at most 100000)"),
])
def test_bad_flag_value(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing may be written anywhere
    fails(argv, capsys, message)
    assert not list(tmp_path.iterdir())


# --- task files -----------------------------------------------------------------------------

@pytest.mark.parametrize("text, message", [
    ("", "the task file sets nothing"),
    ("# a comment alone\n", "the task file sets nothing"),
    ("seeds = []", "a task needs at least one seed"),
    ("seeds = [0, 0]", "seeds repeat"),
    ("seeds = [-1]", "seed must be in 0.."),
    ("[params]\nrope = 5", "params.rope must be a table"),
    ("[params.rope]\nbsae = 1.0", "did you mean 'base'"),
    ("[params.rope]\nbase = 'x'", "parameter base='x' of scheme 'rope' must be float"),
    ("[train]\nlr = nan", "lr must be a finite number"),
    ("[train]\nlr = inf", "lr must be a finite number"),
    ("[train]\nwarmup = -1", "warmup must be >= 0"),
    ("[train]\nweight_decay = -0.1", "weight_decay must be >= 0"),
    ("[train]\nweight_decay = nan", "weight_decay must be a finite number"),
    ("[train]\ngrad_clip = 0", "grad_clip must be > 0"),
    ("[train]\ngrad_clip = inf", "grad_clip must be a finite number"),
    ("[train]\neval_windows = 0", "eval_windows must be > 0"),
    (f"[train]\nsteps = {HUGE}", "steps is too large"),
    ("[eval]\nyarn_alpha = nan", "yarn_alpha must be a finite number"),
    ("[eval]\nyarn_beta = -inf", "yarn_beta must be a finite number"),
    ("[eval]\nrope_scaling_factor = -1.0", "rope scaling factor must be >= 1"),
    ("[eval]\nlearned_extension = ['foo']", "unknown learned extension 'foo'"),
    ("[eval]\nrope_scaling = ['yran']", "did you mean 'yarn'"),
    ("[eval]\nlengths = [64, 9999999999]", "lengths is too large"),
])
def test_bad_task_file(text, message, capsys, tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(text + "\n")
    line = fails(["run", path, "--out", tmp_path / "out"], capsys, message)
    assert str(path) in line
    assert not (tmp_path / "out").exists()


def test_task_file_not_utf8(capsys, tmp_path):
    path = tmp_path / "latin.toml"
    path.write_bytes('description = "caf\u00e9"\n'.encode("latin-1"))
    fails(["train", "--scheme", "rope", "--task", path], capsys, "not UTF-8 text")


def test_tasks_validate_rejects_bad_files(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "noseeds.toml").write_text("seeds = []\n")
    (tmp_path / "tasks" / "latin.toml").write_bytes(b"description = \"caf\xe9\"\n")
    assert main(["tasks", "--validate"]) == 1
    out = capsys.readouterr().out
    assert "at least one seed" in out and "not UTF-8" in out
    assert "Traceback" not in out


# --- result files ---------------------------------------------------------------------------

def _baseline_copy(tmp_path: Path, name: str = "base") -> Path:
    out = tmp_path / name
    out.mkdir()
    for table in ("runs", "extrapolation"):
        shutil.copy(results.table_path(BASELINE, table), results.table_path(out, table))
    return out


def _edit_csv(path: Path, edit) -> None:
    rows = results.read_rows(path)
    columns = list(rows[0])
    edit(rows, columns)
    path.write_text(results._to_csv(columns, rows))


def _cut_in_quotes(text: str) -> str:
    """The last row cut inside a quoted last cell, its line ended: every field there, the quote open."""
    *rows, last = text.splitlines()
    return "\n".join([*rows, last.rsplit(",", 1)[0] + ',"cut, short']) + "\n"


def _first_ok(rows):
    return next(r for r in rows if r["status"] == "ok")


def test_compare_passes_on_itself(capsys, tmp_path):
    base = _baseline_copy(tmp_path)
    assert main(["compare", str(base), str(BASELINE)]) == 0
    out = capsys.readouterr().out
    rows = len(results.read_rows(BASELINE / "extrapolation.csv"))
    assert f"{rows} comparisons: {rows} within tolerance" in out and "0 regressions" in out
    assert "regressed" not in out and "missing" not in out  # no table of changes when all agree


@pytest.mark.parametrize("damage, message", [
    (lambda p: p.write_text(""), "is empty"),
    (lambda p: p.write_text(p.read_text().splitlines()[0] + "\n"), "holds no rows"),
    (lambda p: p.write_text(p.read_text()[:-40]), "is truncated"),
    (lambda p: p.write_text(_cut_in_quotes(p.read_text())), "unexpected end of data"),
    (lambda p: p.write_text("\n".join(p.read_text().splitlines()[:-1] + ["a,b,c"]) + "\n"), "line"),
    (lambda p: p.write_bytes(b"\xff\xfe garbage\n"), "not a readable CSV"),
    (lambda p: p.write_text("scheme,backend,pass\nrope,sdpa,fwd\n"), "lacks columns run_id"),
    (lambda p: _edit_csv(p, lambda rows, cols: cols.remove("ppl")), "lacks columns ppl"),
    (lambda p: _edit_csv(p, lambda rows, cols: cols.append("colour")), "has columns colour"),
    (lambda p: _edit_csv(p, lambda rows, cols: _first_ok(rows).update(ppl="abc")), "has ppl 'abc', not a number"),
    (lambda p: _edit_csv(p, lambda rows, cols: _first_ok(rows).update(ppl="0")), "perplexity '0'"),
    (lambda p: _edit_csv(p, lambda rows, cols: _first_ok(rows).update(ppl="inf")), "perplexity 'inf'"),
])
def test_compare_fails_on_a_damaged_baseline(damage, message, capsys, tmp_path):
    """The CI gate must not pass when its baseline is empty, truncated or not a baseline."""
    base = _baseline_copy(tmp_path)
    damage(results.table_path(base, "extrapolation"))
    fails(["compare", base, BASELINE], capsys, message)


@pytest.mark.parametrize("damage, message", [
    (lambda p: p.write_text("hello\n"), "lacks columns run_id"),
    (lambda p: _edit_csv(p, lambda rows, cols: cols.remove("status")), "lacks columns status"),
    (lambda p: _edit_csv(p, lambda rows, cols: _first_ok(rows).update(ppl="0")), "perplexity '0'"),
    (lambda p: _edit_csv(p, lambda rows, cols: _first_ok(rows).update(ppl="x")), "has ppl 'x', not a number"),
])
def test_compare_fails_on_a_damaged_current(damage, message, capsys, tmp_path):
    cur = _baseline_copy(tmp_path, "current")
    damage(results.table_path(cur, "extrapolation"))
    fails(["compare", BASELINE, cur], capsys, message)


GARBAGE = {
    "garbage": lambda p: p.write_bytes(b"\x00\x01 not a table at all\n"),
    "few columns": lambda p: p.write_text("run_id,scheme\nxrope-1,rope\n"),
    "a word for a number": lambda p: _edit_csv(p, lambda rows, cols: rows[0].update(seed="x")),
    "foreign columns": lambda p: p.write_text("scheme,backend,pass,seq_len\nrope,sdpa,fwd,64\n"),
    "short row": lambda p: p.write_text(p.read_text() + "x,y\n"),
}


@pytest.mark.parametrize("kind", sorted(GARBAGE))
@pytest.mark.parametrize("table", ["runs", "extrapolation"])
def test_report_merge_refuses_junk_and_merges_nothing(kind, table, capsys, tmp_path):
    mine, other = _baseline_copy(tmp_path, "mine"), _baseline_copy(tmp_path, "other")
    _edit_csv(results.table_path(other, "runs"), lambda rows, cols: [r.update(run_id="x" + r["run_id"]) for r in rows])
    GARBAGE[kind](results.table_path(other, table))
    before = snapshot(mine)
    fails(["report", mine, "--merge", other], capsys, str(results.table_path(other, table)))
    assert snapshot(mine) == before


@pytest.mark.parametrize("junk, message", [("{not json", "is not JSON"), ("[1, 2]", "is not a provenance record"),
                                            ('{"merged": 3}', "is not a provenance record")])
def test_report_merge_into_a_folder_with_a_junk_provenance_merges_nothing(junk, message, capsys, tmp_path):
    mine, other = _baseline_copy(tmp_path, "mine"), _baseline_copy(tmp_path, "other")
    _edit_csv(results.table_path(other, "runs"), lambda rows, cols: [r.update(run_id="x" + r["run_id"]) for r in rows])
    (mine / "provenance.json").write_text(junk)
    before = snapshot(mine)
    fails(["report", mine, "--merge", other], capsys, message)
    assert snapshot(mine) == before


@pytest.mark.slow
def test_report_merge_records_the_merged_folders(capsys, tmp_path):
    """provenance.json's `merged`: each folder merged, with what made it (and what was merged into
    it before: a chain of merges keeps every link) and the rows it brought."""
    mine, mid, last = (_baseline_copy(tmp_path, name) for name in ("mine", "mid", "last"))
    for folder, prefix in ((mid, "m"), (last, "l")):
        _edit_csv(results.table_path(folder, "runs"), lambda rows, cols: [r.update(run_id=prefix + r["run_id"])
                                                                          for r in rows])
    (last / "provenance.json").write_text('{"command": "posbench run ci --shard 2/2", "shard": "2/2"}')
    assert main(["report", str(mid), "--merge", str(last)]) == 0
    assert main(["report", str(mine), "--merge", str(mid)]) == 0
    merged = results.read_provenance(mine)["merged"]
    assert [e["folder"] for e in merged] == [str(mid)]
    assert merged[0]["rows"]["runs"] == len(results.read_rows(results.table_path(mid, "runs")))  # its own and last's
    assert len(results.read_rows(results.table_path(mine, "runs"))) == 3 * len(
        results.read_rows(results.table_path(BASELINE, "runs")))
    inner = merged[0]["merged"]
    assert [e["folder"] for e in inner] == [str(last)] and inner[0]["shard"] == "2/2"
    assert inner[0]["command"] == "posbench run ci --shard 2/2"


@pytest.mark.parametrize("kind", sorted(GARBAGE))
def test_report_refuses_junk(kind, capsys, tmp_path):
    mine = _baseline_copy(tmp_path, "mine")
    GARBAGE[kind](results.table_path(mine, "runs"))
    before = snapshot(mine)
    fails(["report", mine], capsys, "runs.csv")
    assert snapshot(mine) == before


@pytest.mark.parametrize("column", ["hits", "accuracy", "trials"])
def test_report_refuses_a_word_in_a_number_column_of_probes(column, capsys, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    shutil.copy(REPO / "results" / "probes" / "probes.csv", results.table_path(mine, "probes"))
    _edit_csv(results.table_path(mine, "probes"), lambda rows, cols: rows[0].update({column: "abc"}))
    before = snapshot(mine)
    fails(["report", mine], capsys, f"probes.csv is damaged: line 2 has {column} 'abc'")
    assert snapshot(mine) == before


def test_paired_refuses_a_word_for_a_loss(capsys, tmp_path):
    columns = results.TABLES["windows"]["columns"]
    row = dict.fromkeys(columns, "0") | {"run_id": "rope-1", "scheme": "rope", "params": "", "mode": "nonoverlap",
                                         "scaling": "none", "extension": "none", "corpus": "c", "task": "t"}
    rows = [row, row | {"run_id": "alibi-1", "scheme": "alibi", "loss": "abc"}]
    results.table_path(tmp_path, "windows").write_text(results._to_csv(columns, rows))
    before = snapshot(tmp_path)
    fails(["paired", "rope", "alibi", "--runs-dir", tmp_path], capsys, "windows.csv is damaged: line 3 has loss 'abc'")
    assert snapshot(tmp_path) == before


# --- run directories (one tiny trained run, copied per case) ---------------------------------

TINY = ["--train-len", "16", "--steps", "4", "--batch-size", "4", "--d-model", "32", "--layers", "1",
        "--heads", "2", "--tokenizer", "bytes", "--device", "cpu"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, corpus_dir) -> tuple[Path, list[str]]:
    runs = tmp_path_factory.mktemp("trained")
    args = ["train", "--scheme", "rope", "--data", f"files:{corpus_dir}", *TINY]
    assert main(args + ["--runs-dir", str(runs)]) == 0
    return runs, args


def _copy_runs(trained, tmp_path: Path) -> tuple[Path, Path]:
    runs = tmp_path / "runs"
    shutil.copytree(trained[0], runs)
    (run_dir,) = [p for p in runs.iterdir() if p.is_dir()]
    return runs, run_dir


def _set_checkpoint_state(run_dir: Path, state: str) -> None:
    from safetensors.torch import load_file, save_file

    path = run_dir / "checkpoint.safetensors"
    save_file(load_file(path), str(path), metadata={"state": state})


@pytest.mark.parametrize("state", ["not json", "[]", '{"step": "four", "seconds": 1}', '{"seconds": 1}'])
def test_resume_with_damaged_checkpoint_metadata(state, trained, capsys, tmp_path):
    runs, run_dir = _copy_runs(trained, tmp_path)
    _set_checkpoint_state(run_dir, state)
    (run_dir / "model.safetensors").unlink()
    fails([*trained[1], "--runs-dir", runs, "--resume"], capsys, "corrupt checkpoint")


def test_resume_with_damaged_log(trained, capsys, tmp_path):
    """One line, or (where the checkpoint holds the log) a correct resume that rewrites log.csv."""
    runs, run_dir = _copy_runs(trained, tmp_path)
    (run_dir / "log.csv").write_text("step,lr,loss\nfour,x\n")
    (run_dir / "model.safetensors").unlink()
    rv = main([*trained[1], "--runs-dir", str(runs), "--resume"])
    err = capsys.readouterr().err
    if rv == 2:
        assert len(err.strip().splitlines()) == 1 and "log.csv" in err
    else:
        assert rv == 0 and [r["step"] for r in results.read_rows(run_dir / "log.csv")] == ["1", "2", "3", "4"]


@pytest.mark.parametrize("change", [
    {"train": {"train_len": "16"}}, {"seed": "0"}, {"vocab_size": "257"}, {"model": {"d_model": 3.5}},
    {"params": [1]}, {"train": None}, {"scheme": 5},
])
def test_extrapolate_with_wrong_types_in_config_json(change, trained, capsys, tmp_path):
    runs, run_dir = _copy_runs(trained, tmp_path)
    raw = json.loads((run_dir / "config.json").read_text())
    for key, value in change.items():
        raw[key] = {**raw[key], **value} if isinstance(value, dict) else value
    (run_dir / "config.json").write_text(json.dumps(raw))
    fails(["extrapolate", "--runs-dir", runs, "--lengths", "16", "--device", "cpu"], capsys,
          "unreadable run config")
    assert not (runs / "extrapolation.csv").exists()


def test_files_too_short_for_one_window_is_one_line(capsys, tmp_path):
    """datasets draws no progress bar on the way: the error is the command's only line."""
    (tmp_path / "short.txt").write_text("a few words\n")
    fails(["train", "--scheme", "rope", "--data", f"files:{tmp_path / 'short.txt'}", "--steps", "2",
           "--runs-dir", tmp_path / "runs"], capsys, "is shorter than one window of train_len")


def test_config_json_that_is_not_a_table(trained, capsys, tmp_path):
    runs, run_dir = _copy_runs(trained, tmp_path)
    (run_dir / "config.json").write_text("[1, 2]\n")
    fails(["extrapolate", "--runs-dir", runs, "--lengths", "16", "--device", "cpu"], capsys, "unreadable run config")
    fails(["extend", "--runs-dir", runs, "--method", "pi", "--device", "cpu"], capsys, "no finished parent runs")
    fails(["table", "probes", runs], capsys, f"unreadable run config {run_dir / 'config.json'}: TypeError")


@pytest.mark.parametrize("kind", sorted(GARBAGE))
def test_extrapolate_into_junk_results(kind, trained, capsys, tmp_path):
    runs, _ = _copy_runs(trained, tmp_path)
    path = results.table_path(runs, "extrapolation")
    shutil.copy(results.table_path(BASELINE, "extrapolation"), path)
    GARBAGE[kind](path)
    before = snapshot(runs)
    fails(["extrapolate", "--runs-dir", runs, "--lengths", "16", "--device", "cpu"], capsys, str(path))
    assert snapshot(runs) == before


def test_train_len_longer_than_the_training_split(trained, capsys, tmp_path):
    fails([*trained[1], "--train-len", "1000000", "--runs-dir", tmp_path], capsys,
          "is shorter than one window of train_len 1000000")


# --- Ctrl-C ---------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("module, said", [
    ("typer", "interrupted: while starting; nothing was read or written"),  # the command line itself
    ("torch", "interrupted: stopped before the command finished; what it had written is kept"),  # a command
])
def test_ctrl_c_while_importing(module, said):
    """No traceback: one line and exit code 130, while the command line starts as once the command
    runs (torch loads then, when a command computes)."""
    import subprocess
    import sys

    stop = ("import sys\n"
            "class Stop:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            f"        if name == {module!r}:\n"
            "            raise KeyboardInterrupt\n"
            "sys.meta_path.insert(0, Stop())\n"
            "from posbench.__main__ import main\n"
            "raise SystemExit(main())\n")
    proc = subprocess.run([sys.executable, "-c", stop, "schemes"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr.strip() == said


def test_ctrl_c_while_the_command_line_is_read(capsys, monkeypatch):
    """typer's first reading of the command line builds its parameter types (a few tenths of a
    second after the imports): a Ctrl-C there is the starting line too, not a silent exit 130."""
    import typer

    def pressed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(typer.core.TyperGroup, "parse_args", pressed)
    fails(["schemes"], capsys, "interrupted: while starting; nothing was read or written", code=130)


def test_the_exit_status_is_the_commands_after_a_ctrl_c_in_code_run_from_c(tmp_path):
    """A KeyboardInterrupt that ended code CPython ran from C (an extension's import), then
    answered, made `python -m posbench` kill itself with SIGINT at exit (status -2, not 130)."""
    import subprocess
    import sys

    (tmp_path / "stopped.py").write_text("import ctypes\n"
                                          "ctypes.pythonapi.PyRun_SimpleString(b'raise KeyboardInterrupt')\n"
                                          "from posbench.__main__ import said\n"
                                          "raise SystemExit(said(130))\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "stopped"], cwd=tmp_path, capture_output=True, env=env, timeout=60)
    assert proc.returncode == 130, proc


def test_ctrl_c_that_a_library_wraps_is_one_line(capsys, monkeypatch):
    """Python wraps a KeyboardInterrupt raised while a class is set up (a library's import, such as
    datasets' in the first seconds of `train`) in a RuntimeError: still the one line and 130."""
    from posbench.commands import schemes

    def wrapped(*args, **kwargs):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as e:
            raise RuntimeError("Error calling __set_name__ on 'Field' instance 'name' in 'SplitInfo'") from e

    monkeypatch.setattr(schemes, "show", wrapped)
    fails(["schemes"], capsys, "interrupted: stopped before the command finished", code=130)


def test_ctrl_c_before_the_first_step(trained, capsys, tmp_path, monkeypatch):
    from posbench import training as train

    def pressed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(train, "build_model", pressed)
    runs, _ = _copy_runs(trained, tmp_path)
    before = snapshot(runs)
    fails([*trained[1], "--seed", "1", "--runs-dir", runs], capsys, "interrupted: before rope-", code=130)
    assert snapshot(runs) == before, "no run directory of the interrupted run may stay behind"


@pytest.fixture(scope="module")
def probe_run(tmp_path_factory) -> Path:
    runs = tmp_path_factory.mktemp("probe")
    assert main(["train", "--scheme", "rope", "--data", "passkey", "--tokenizer", "bytes", "--train-len", "32",
                 "--steps", "2", "--batch-size", "2", "--d-model", "16", "--layers", "1", "--heads", "2",
                 "--device", "cpu", "--runs-dir", str(runs)]) == 0
    return runs


def test_ctrl_c_while_scoring_probes(probe_run, capsys, tmp_path, monkeypatch):
    from posbench import probing

    def pressed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(probing, "evaluate_run", pressed)
    before = snapshot(probe_run)
    line = fails(["probe", "--probe", "passkey", "--runs-dir", probe_run, "--trials", "1", "--lengths", "32",
                  "--device", "cpu"], capsys, "interrupted: while scoring the probes of rope-", code=130)
    assert "keeps the rows of the 0 run(s) scored before it" in line
    assert snapshot(probe_run) == before


def test_ctrl_c_during_the_longrope_search(trained, capsys, tmp_path, monkeypatch):
    """typer answered it with a silent exit 130: one line now, and nothing of the child written."""
    from posbench import extending

    def pressed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(extending.Search, "score", pressed)
    runs, _ = _copy_runs(trained, tmp_path)
    before = snapshot(runs)
    line = fails(["extend", "--runs-dir", runs, "--method", "longrope", "--target-len", "32", "--steps", "2",
                  "--device", "cpu"], capsys, "interrupted: during the LongRoPE search of rope-", code=130)
    assert "finished runs and results are kept" in line
    assert snapshot(runs) == before


@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c_during_training_is_one_line_and_130(trained, capsys, tmp_path, monkeypatch, presses):
    """A real SIGINT in the second optimizer step: once, the step finishes and is checkpointed;
    twice, training stops at once, here before any checkpoint, and leaves no run folder. One line,
    exit 130."""
    import signal

    import torch

    real, calls = torch.optim.AdamW.step, []

    def step(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            for _ in range(presses):
                signal.raise_signal(signal.SIGINT)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", step)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # whatever the shell chose
    try:
        message = "checkpointed at step 2 of 4" if presses == 1 else "stopped at once; rope-"
        line = fails([*trained[1], "--runs-dir", tmp_path / "runs"], capsys, message, code=130)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert line.startswith("interrupted: ")
    runs = tmp_path / "runs"
    left = [p.name for p in runs.iterdir() if p.is_dir()] if runs.exists() else []  # a folder it made goes too
    if presses == 1:
        assert "--resume" in line and (tmp_path / "runs" / left[0] / "checkpoint.safetensors").exists()
    else:
        assert "had no checkpoint yet" in line and left == []


@pytest.mark.slow
def test_ctrl_c_while_exiting_is_no_traceback(tmp_path):
    """A Ctrl-C that lands after the command's last line, while Python shuts down: the command's
    output and exit status stand, and no traceback follows."""
    import subprocess
    import sys

    late = ("import atexit, os, signal, time\n"
            "atexit.register(lambda: (os.kill(os.getpid(), signal.SIGINT), time.sleep(0.5)))\n"
            "from posbench.__main__ import main\n"
            "raise SystemExit(main())\n")
    proc = subprocess.run([sys.executable, "-c", late, "schemes", "--format", "csv"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert proc.stdout.startswith("name,") and "\nrope," in proc.stdout


# --- the file system ------------------------------------------------------------------------

def test_output_path_is_a_file(trained, capsys, tmp_path):
    (tmp_path / "file").write_text("mine\n")
    fails([*trained[1], "--runs-dir", tmp_path / "file"], capsys, "Not a directory")
    fails(["speed", "--schemes", "none", "--lengths", "16", "--heads", "1", "--head-dim", "8", "--repeats", "1",
           "--no-backward", "--device", "cpu", "--out", tmp_path / "file"], capsys, "is not a directory")
    fails(["extrapolate", "--runs-dir", trained[0], "--lengths", "16", "--device", "cpu", "--out",
           tmp_path / "file"], capsys, "is not a directory")
    assert (tmp_path / "file").read_text() == "mine\n"


def _read_only(path, mode="r", *args, **kwargs):
    if "x" in mode or "w" in mode:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
    return open(path, mode, *args, **kwargs)


class _FullDisk:
    """Files whose writes fail as on a full disk."""

    def __init__(self, path, mode="r", *args, **kwargs):
        self.f = open(path, mode, *args, **kwargs)
        self.full = any(m in mode for m in "xwa")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()

    def __getattr__(self, name):
        return getattr(self.f, name)

    def write(self, data):
        if self.full:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return self.f.write(data)


@pytest.mark.parametrize("fake, message", [(_read_only, "Read-only file system"), (_FullDisk, "No space left on device")])
def test_unwritable_output_folder(fake, message, capsys, tmp_path, monkeypatch):
    mine = _baseline_copy(tmp_path, "mine")
    other = _baseline_copy(tmp_path, "other")
    (mine / "report.md").write_text("previous report\n")
    before = snapshot(mine)
    monkeypatch.setattr(results, "open", fake, raising=False)  # what results writes with
    line = fails(["report", mine, "--merge", other], capsys, message)
    assert str(mine) in line
    monkeypatch.undo()
    assert snapshot(mine) == before, "a partial or temporary file was left behind"


def test_full_disk_names_the_file_and_leaves_no_run_directory(trained, capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(results, "open", _FullDisk, raising=False)
    line = fails([*trained[1], "--runs-dir", tmp_path / "runs"], capsys, "No space left on device")
    assert str(tmp_path / "runs") in line and ".lock" in line
    assert not (tmp_path / "runs").exists()  # neither the run's folder nor the runs folder it made


def test_read_only_runs_folder_is_named_as_such(trained, capsys, tmp_path, monkeypatch):
    """`extend` into a parent folder that cannot be written: the file system's own reason, not
    the "No such file or directory" of cleaning up a folder never made."""
    import pathlib

    runs, _ = _copy_runs(trained, tmp_path)
    before = snapshot(runs)
    mkdir = pathlib.Path.mkdir

    def read_only(self, *args, **kwargs):
        if self.parent == runs and not self.exists():
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))
        return mkdir(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "mkdir", read_only)
    line = fails(["extend", "--runs-dir", runs, "--method", "plain", "--target-len", "32", "--steps", "2",
                  "--device", "cpu"], capsys, "Read-only file system")
    assert f"{runs}/rope-" in line
    monkeypatch.undo()
    assert snapshot(runs) == before


def test_unwritable_tracker_folder_leaves_no_run_folder(trained, capsys, tmp_path):
    """The tracker's folder cannot be made (a file stands where it goes): one line naming it, and
    no run folder holding only config.json."""
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "tensorboard").write_text("a file\n")
    fails([*trained[1], "--runs-dir", runs, "--tracker", "tensorboard"], capsys,
          f"{runs / 'tensorboard'}/")
    assert [p.name for p in runs.iterdir()] == ["tensorboard"]


def _no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # as a failed write says it: no file name


def test_full_disk_while_caching_the_corpus_names_the_file(trained, capsys, tmp_path, monkeypatch):
    from posbench import data

    monkeypatch.setenv("POSBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(data.np, "save", _no_space)
    line = fails([*trained[1], "--runs-dir", tmp_path / "runs"], capsys, "No space left on device")
    assert f"{tmp_path / 'cache'}/" in line and line.split(":")[1].strip().endswith(".npy")
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").iterdir())


def test_full_disk_while_plotting_probes_names_the_file(probe_run, capsys, tmp_path, monkeypatch):
    import matplotlib.figure

    runs = tmp_path / "runs"
    shutil.copytree(probe_run, runs)
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", _no_space)
    fails(["probe", "--probe", "passkey", "--runs-dir", runs, "--trials", "1", "--lengths", "32", "--device", "cpu"],
          capsys, f"{runs / 'probe_passkey.png'}: No space left on device")


# --- data sources ---------------------------------------------------------------------------

def test_hf_offline_one_line_quickly(capsys, tmp_path):
    """With the offline flags set (as in tests/conftest.py)."""
    began = time.monotonic()
    fails(["train", "--scheme", "rope", "--data", "hf:no_such_dataset_posbench", "--runs-dir", tmp_path],
          capsys, "cannot reach the Hugging Face hub")
    assert time.monotonic() - began < 5


def test_hf_unreachable_hub_without_offline_flags(capsys, tmp_path, monkeypatch):
    """Without the flags: an unreachable hub is noticed at once (no half-minute of retries), and
    datasets is asked for its cache only."""
    import datasets
    from huggingface_hub import constants

    from posbench import data

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(data, "_hub_reachable", lambda timeout=3.0: False)
    began = time.monotonic()
    fails(["train", "--scheme", "rope", "--data", "hf:no_such_dataset_posbench", "--runs-dir", tmp_path],
          capsys, "cannot reach the Hugging Face hub")
    assert time.monotonic() - began < 5
    assert constants.HF_HUB_OFFLINE is False and datasets.config.HF_HUB_OFFLINE is False


# --- training -------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_nan_run_does_not_stop_the_grid(corpus_dir, capsys, tmp_path, monkeypatch):
    """Design: the diverged run is recorded as failed in runs.csv, the others are trained,
    evaluated and reported, and `posbench run` exits 1 naming the failed run."""
    from posbench.schemes.rotary import RoPE

    monkeypatch.setattr(RoPE, "rotate", lambda self, q, k, pos, ctx, layer: (q * float("nan"), k))
    task = tmp_path / "two.toml"
    task.write_text('schemes = ["alibi", "rope"]\n' + TINY_TASK.format(corpus=corpus_dir))
    out = tmp_path / "out"
    line = fails(["run", task, "--out", out, "--no-speed", "--device", "cpu"], capsys, "training failed for rope-",
                 code=1)
    runs = {r["scheme"]: r for r in results.read_rows(results.table_path(out, "runs"))}
    assert runs["rope"]["status"] == "failed" and "loss became nan" in runs["rope"]["message"]
    assert runs["alibi"]["status"] == "ok" and runs["rope"]["run_id"] in line
    ext = results.read_rows(results.table_path(out, "extrapolation"))
    assert {(r["scheme"], r["status"]) for r in ext} == {("alibi", "ok")}
    assert runs["rope"]["run_id"] in (out / "report.md").read_text()


@pytest.mark.slow
def test_a_kernel_that_fails_in_training_does_not_stop_the_grid(corpus_dir, capsys, tmp_path, monkeypatch):
    """A step the device's kernels refuse (as CUDA's compiler refused a FlexAttention backward):
    that run is recorded as failed with the error's first line, the others go on; out of memory
    stays the one-line error it was."""
    from posbench.schemes.rotary import RoPE

    def refused(self, q, k, pos, ctx, layer):
        raise NotImplementedError("Using multiple indexing operations is not supported.\nA workaround: clone()")

    monkeypatch.setattr(RoPE, "rotate", refused)
    task = tmp_path / "two.toml"
    task.write_text('schemes = ["rope", "alibi"]\n' + TINY_TASK.format(corpus=corpus_dir))
    out = tmp_path / "out"
    fails(["run", task, "--out", out, "--no-speed", "--device", "cpu"], capsys, "training failed for rope-", code=1)
    runs = {r["scheme"]: r for r in results.read_rows(results.table_path(out, "runs"))}
    assert runs["rope"]["status"] == "failed"
    assert runs["rope"]["message"] == ("NotImplementedError at step 0: Using multiple indexing operations is not "
                                       "supported.")
    assert runs["alibi"]["status"] == "ok"


def test_out_of_memory_one_line(trained, capsys, tmp_path, monkeypatch):
    from posbench import batches

    def no_memory(*args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory")

    monkeypatch.setattr(batches.LMWindows, "sample", no_memory)
    fails([*trained[1], "--runs-dir", tmp_path], capsys, "out of memory; use a smaller batch size")


def test_main_turns_file_system_errors_into_one_line():
    assert cli._file_system_error(FileExistsError(errno.EEXIST, "File exists", "out")) == \
        "out exists and is not a directory"
    assert cli._file_system_error(OSError(errno.ENOSPC, "No space left on device")) == "No space left on device"
