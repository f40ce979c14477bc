"""`posbench run` / `compare` / `report` / `tasks` on a tiny grid."""

import json
import re
import shutil
from pathlib import Path

import pytest

from posbench import config, results
from posbench.cli import main
from conftest import TINY_TASK
from posbench.errors import PosbenchError
from posbench.grid import grid, parse_shard, run_task, shard_of

TASK = """
version = 1
name = "tiny"
schemes = ["none", "rope", "learned"]
seeds = [0, 1]
""" + TINY_TASK + """learned_extension = ["none", "hierarchical"]
[speed]
lengths = [32]
heads = 2
head_dim = 8
repeats = 2
"""


@pytest.fixture(scope="module")
def task_file(corpus_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("task") / "tiny.toml"
    path.write_text(TASK.format(corpus=corpus_dir))
    return path


@pytest.fixture(scope="module")
def full_run(task_file, tmp_path_factory):
    """One complete run of the tiny grid, shared by the tests that only read it."""
    out = tmp_path_factory.mktemp("full") / "out"
    done = run_task(config.load_task(str(task_file)), out, device="cpu", speed=False)
    assert done["trained"] == 6 and done["evaluated"] == 6
    return out


def key_rows(directory, table="extrapolation"):
    key = results.TABLES[table]["key"]
    return {tuple(r[k] for k in key): r.get("loss") for r in results.read_rows(results.table_path(directory, table))}


def test_second_run_skips_everything_and_deleted_run_is_redone(task_file, full_run, tmp_path):
    task = config.load_task(str(task_file))
    out = tmp_path / "out"
    shutil.copytree(full_run, out)
    before = key_rows(out)
    assert len(before) == 2 * 2 * 2 + 2 * 2 * 2  # (none, rope) x seeds x lengths + learned x 2 extensions
    again = run_task(task, out, device="cpu", speed=False)
    assert again == {"trained": 0, "skipped_train": 6, "evaluated": 0, "skipped_eval": 6, "probes": 0,
                     "skipped_probes": 0, "speed": 0, "failed": [], "failed_rows": None}
    victim = sorted(p for p in out.iterdir() if p.name.startswith("rope-"))[0]
    shutil.rmtree(victim)
    third = run_task(task, out, device="cpu", speed=False)
    assert third["trained"] == 1 and third["skipped_train"] == 5
    assert key_rows(out) == before  # same rows, none lost or duplicated
    assert len(results.read_rows(out / "runs.csv")) == 6


def test_rerun_completes_positions_lost_to_a_kill(task_file, full_run, tmp_path):
    task = config.load_task(str(task_file))
    out = tmp_path / "out"
    shutil.copytree(full_run, out)
    # Killed between the writes of one run's extrapolation rows and its positions rows.
    victim = sorted(p.name for p in out.iterdir() if p.name.startswith("rope-"))[0]
    columns = results.TABLES["positions"]["columns"]
    kept = [r for r in results.read_rows(out / "positions.csv") if r["run_id"] != victim]
    results.write_atomic(out / "positions.csv", results._to_csv(columns, kept))
    done = run_task(task, out, device="cpu", speed=False)
    assert done["evaluated"] == 1 and done["skipped_eval"] == 5
    assert key_rows(out, "positions") == key_rows(full_run, "positions")
    assert key_rows(out) == key_rows(full_run)


@pytest.mark.parametrize("mode", ["nonoverlap", "sliding"])
def test_position_keys_are_the_rows_evaluation_writes(full_run, mode):
    import dataclasses

    from posbench import evaluate

    cfg = dataclasses.replace(config.EvalConfig(), mode=mode, lengths=(16, 32), tokens=64,
                              learned_extension=("none",), position_buckets=8)
    statuses = set()
    for run_dir in (next(full_run.glob("rope-*")), next(full_run.glob("learned-*"))):
        rows, positions, _ = evaluate.evaluate_run(run_dir, cfg, "cpu")
        key = results.TABLES["positions"]["key"]
        written = {tuple(str(r[k]) for k in key) for r in positions}
        as_read = [{k: str(v) for k, v in r.items()} for r in rows]
        assert written and evaluate.position_keys(as_read, cfg) == written
        statuses |= {r["status"] for r in rows}
    assert statuses == {"ok", "unsupported"}  # learned has no rows beyond its table


@pytest.mark.slow
def test_shards_partition_the_grid_and_merge_to_the_full_rows(task_file, full_run, tmp_path):
    task = config.load_task(str(task_file))
    specs = grid(task)
    a, b = shard_of(specs, (1, 2)), shard_of(specs, (2, 2))
    ids_a, ids_b = {s.run_id for s in a}, {s.run_id for s in b}
    assert ids_a | ids_b == {s.run_id for s in specs} and not ids_a & ids_b and len(ids_a) == 3
    run_task(task, tmp_path / "s1", (1, 2), device="cpu", speed=False)
    run_task(task, tmp_path / "s2", (2, 2), device="cpu", speed=False)
    assert main(["report", str(tmp_path / "s1"), "--merge", str(tmp_path / "s2")]) == 0
    assert key_rows(tmp_path / "s1") == key_rows(full_run)
    merged = results.read_provenance(tmp_path / "s1")["merged"]  # what came in, and what made it
    assert len(merged) == 1 and merged[0]["folder"] == str(tmp_path / "s2") and merged[0]["shard"] == "2/2"
    assert merged[0]["rows"]["runs"] == len(ids_b) == len(results.read_rows(tmp_path / "s2" / "runs.csv"))
    run_task(task, tmp_path / "s1", (1, 2), device="cpu", speed=False, resume=True)  # a grid run later keeps it
    assert results.read_provenance(tmp_path / "s1")["merged"] == merged
    assert key_rows(tmp_path / "s1", "positions") == key_rows(full_run, "positions")
    report = (tmp_path / "s1" / "report.md").read_text()
    assert "## Extrapolation" in report and "learned+hierarchical (2 seeds)" in report and "] |" in report
    assert "## Effective length" in report and "### tiny" in report
    assert len(key_rows(tmp_path / "s1", "effective_length")) == 2 + 2 + 2 * 2  # none, rope: 2 seeds; learned: 2 seeds x 2 extensions
    assert main(["report", str(tmp_path / "s1"), "--threshold", "1.5"]) == 2


@pytest.mark.slow
def test_report_and_plots_hold_the_rows(full_run, tmp_path, monkeypatch):
    """report.md has a table row per run and per scheme variant and length, with the mean
    perplexity over seeds; extrapolation.png and positions.png, read off the figures as they are
    saved, have their axes and one series per variant through the rows' numbers."""
    import statistics

    import matplotlib.figure

    from posbench.reporting import label

    figures = {}
    save = matplotlib.figure.Figure.savefig

    def keep(fig, path, *args, **kwargs):
        figures[Path(path).name] = fig
        return save(fig, path, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", keep)
    out = tmp_path / "out"
    shutil.copytree(full_run, out)
    assert main(["report", str(out)]) == 0
    lines = (out / "report.md").read_text().splitlines()

    runs = results.read_rows(out / "runs.csv")
    assert len(runs) == 6
    for r in runs:
        assert sum(line.startswith(f"| {r['run_id']} | {r['scheme']} | ") for line in lines) == 1, r["run_id"]

    ppl, status = {}, {}  # label -> length -> perplexities over seeds; or the status where none
    for r in results.read_rows(out / "extrapolation.csv"):
        if r["ppl"]:
            ppl.setdefault(label(r), {}).setdefault(int(r["eval_len"]), []).append(float(r["ppl"]))
        else:
            status[(label(r), int(r["eval_len"]))] = r["status"]
    assert set(ppl) == {"none", "rope", "learned", "learned+hierarchical"}
    assert status == {("learned", 32): "unsupported"}  # beyond its table
    table = lines[lines.index("### nonoverlap"):]
    assert table[2] == "| scheme | 16 | 32 |"
    for name, by_len in ppl.items():
        row = next(line for line in table if line.startswith(f"| {name} (2 seeds) |"))
        cells = [c.strip().strip("*").split(" [")[0] for c in row.split("|")[2:-1]]
        assert cells == [f"{statistics.mean(by_len[n]):.2f}" if n in by_len else status[(name, n)] for n in (16, 32)]

    ax = figures["extrapolation.png"].axes[0]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("evaluation length (tokens)", "perplexity")
    assert (ax.get_xscale(), ax.get_yscale()) == ("log", "log")
    series = {line.get_label(): line for line in ax.get_lines() if not line.get_label().startswith("_")}
    assert set(series) == set(ppl)
    for name, line in series.items():
        assert list(line.get_xdata()) == sorted(ppl[name])
        assert list(line.get_ydata()) == pytest.approx([statistics.mean(ppl[name][n]) for n in sorted(ppl[name])])
    assert [line.get_xdata()[0] for line in ax.get_lines() if line.get_label().startswith("_")] == [16]

    ax = figures["positions.png"].axes[0]
    assert ax.get_xlabel().startswith("position inside the window, 1-based (window 32")
    assert ax.get_ylabel() == "mean loss (nats)" and ax.get_xscale() == "log"
    loss = {}  # label -> bucket -> losses at the longest length
    for r in results.read_rows(out / "positions.csv"):
        if int(r["eval_len"]) == 32:
            bucket = (int(r["position_start"]) + int(r["position_end"])) / 2 + 1
            loss.setdefault(label(r), {}).setdefault(bucket, []).append(float(r["loss"]))
    series = {line.get_label(): line for line in ax.get_lines() if not line.get_label().startswith("_")}
    assert set(series) == set(loss)
    for name, line in series.items():
        buckets = sorted(loss[name])
        assert list(line.get_xdata()) == buckets
        assert list(line.get_ydata()) == pytest.approx([statistics.mean(loss[name][b]) for b in buckets])


@pytest.mark.parametrize("text, message", [("0/2", "1 <= I <= N"), ("3/2", "1 <= I <= N"), ("x", "expected I/N")])
def test_bad_shard(text, message):
    with pytest.raises(PosbenchError, match=message):
        parse_shard(text)


def test_compare_gate(full_run, tmp_path, capsys):
    base = full_run
    assert main(["compare", str(base), str(base)]) == 0
    same = capsys.readouterr().out
    assert "0 regressions" in same and "baseline vs current" not in same  # no empty table
    assert main(["compare", str(base), str(base), "--all"]) == 0
    assert "baseline vs current" in capsys.readouterr().out
    worse = tmp_path / "worse"
    worse.mkdir()
    rows = results.read_rows(base / "extrapolation.csv")
    target = next(r for r in rows if r["status"] == "ok")
    for r in rows:  # every seed of one cell ten times worse
        if (r["scheme"], r["eval_len"], r["extension"], r["status"]) == (target["scheme"], target["eval_len"], target["extension"], "ok"):
            r["ppl"] = str(float(r["ppl"]) * 10)
    results.merge_rows(worse, "extrapolation", rows)
    capsys.readouterr()
    assert main(["compare", str(base), str(worse)]) == 1
    assert "worse" in capsys.readouterr().out
    # The grid has two seeds: their spread, not rtol, sets the tolerance (tests/test_uncertainty.py).
    assert main(["compare", str(base), str(worse), "--rtol", "20"]) == 1
    # An improvement passes with a warning; a missing row fails.
    assert main(["compare", str(worse), str(base)]) == 0
    assert "baseline stale?" in capsys.readouterr().err
    # Another machine kind is said, and the tolerance still decides
    other = tmp_path / "other-kind"
    shutil.copytree(base, other)
    prov = json.loads((base / "provenance.json").read_text())
    (other / "provenance.json").write_text(json.dumps({**prov, "machine": "cudax1-00000000"}))
    assert main(["compare", str(base), str(other)]) == 0
    assert f"machine kind differs: baseline {prov['machine']}, current cudax1-00000000" in capsys.readouterr().err
    missing = tmp_path / "missing"
    results.merge_rows(missing, "extrapolation", rows[1:])
    assert main(["compare", str(base), str(missing)]) == 1
    assert main(["compare", str(base), str(tmp_path / "nowhere")]) == 2


@pytest.mark.slow
def test_run_cli_end_to_end(task_file, full_run, tmp_path, capsys):
    out = tmp_path / "cli"
    assert main(["run", str(task_file), "--out", str(out), "--device", "cpu", "--no-speed", "--shard", "2/3",
                 "--compile", "off"]) == 0
    text = capsys.readouterr().out
    assert re.search(r"wall time \d+ min \d+ s", text)
    assert "trained 2" in text and (out / "report.md").exists() and (out / "extrapolation.png").exists()
    shutil.copytree(full_run, out, dirs_exist_ok=True)
    assert main(["run", str(task_file), "--out", str(out), "--device", "cpu", "--no-speed"]) == 0
    assert "trained 0, skipped 6" in capsys.readouterr().out
    # --seeds and --schemes replace the task's: the same run_ids where they overlap, new ones beside
    assert main(["run", str(task_file), "--out", str(out), "--device", "cpu", "--no-speed",
                 "--schemes", "rope", "--seeds", "0,1,7"]) == 0
    assert "trained 1, skipped 2" in capsys.readouterr().out
    seeds = {r["seed"] for r in results.read_rows(out / "runs.csv") if r["scheme"] == "rope"}
    assert seeds == {"0", "1", "7"}
    # A run of another machine kind in the folder: --resume says so in one line, naming the kinds.
    assert "machine kinds" not in capsys.readouterr().err
    rows = results.read_rows(out / "runs.csv")
    here = rows[0]["machine"]
    results.merge_rows(out, "runs", [{**rows[0], "machine": "avx2x4-0123abcd"}])
    assert main(["run", str(task_file), "--out", str(out), "--device", "cpu", "--no-speed", "--resume"]) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "mixes runs of 2 machine kinds" in err
    assert "avx2x4-0123abcd (1 run)" in err and f"{here} ({len(rows) - 1} runs)" in err


@pytest.mark.parametrize("args, message", [
    (["--seeds", "1,1"], "seeds repeat"),
    (["--seeds", "x"], "bad seeds 'x'"),
    (["--schemes", "rpoe"], "did you mean 'rope'"),
    (["--schemes", ","], "bad list ',': empty"),
])
def test_run_seed_and_scheme_overrides_are_checked(task_file, tmp_path, capsys, args, message):
    assert main(["run", str(task_file), "--out", str(tmp_path / "out"), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("text, message", [
    ('version = 1\n[train]\ntrian_len = 5\n', "did you mean 'train_len'"),
    ('version = 1\nschemes = ["rpoe"]\n', "did you mean 'rope'"),
    ('version = 1\n[train]\nsteps = "many"\n', "must be int"),
    ('version = 1\nversion = 2\n', "invalid TOML"),
    ('version = 1\n[eval]\nrope_scaling = ["llama"]\n', "did you mean 'llama3'"),
    ('version = 1\n[eval]\nllama3_low = 4.0\n', "must satisfy 0 < low < high, got 4.0 and 4.0"),
    ('version = 1\n[probes]\nname = ["copy"]\n', "did you mean 'names'"),
    ('version = 1\n[probes]\nnames = ["cpy"]\n', "unknown probe 'cpy'; did you mean 'copy'"),
    ('version = 1\n[probes]\nnames = ["mqar:spacing=2"]\n', "mqar spacing must be at least 4"),
    ('version = 1\n[probes]\ntrials = 0\n', "trials must be > 0"),
    ('version = 1\n[probes]\nrandomized = ["none"]\n', "takes no integer positions"),
    ('version = 1\n[passkey]\ndepths = [0.5]\n', r"\[passkey\] section became \[probes\]"),
])
def test_task_files_are_strict(tmp_path, text, message):
    bad = tmp_path / "bad.toml"
    bad.write_text(text)
    with pytest.raises(PosbenchError, match=message):
        config.load_task(str(bad))


@pytest.mark.parametrize("text, message", [
    ('version = 1\n[train]\nsteps = "many"\n', "train.steps must be int, got 'many'"),
    ('version = 1\n[train]\ntrian_len = 5\n', "unknown key in [train] 'trian_len'"),
    ('version = 1\n[probes]\nnames = ["copy"]\n[probes.train.copy]\ntrain_len = "long"\n',
     "probes.train.copy.train_len must be int"),
])
def test_task_file_errors_name_the_file_once(tmp_path, text, message):
    bad = tmp_path / "wrongtype.toml"
    bad.write_text(text)
    with pytest.raises(PosbenchError) as e:
        config.load_task(str(bad))
    assert str(e.value).startswith(f"{bad}: {message}") and str(e.value).count("wrongtype.toml") == 1


def test_shipped_tasks_validate(capsys):
    assert main(["tasks", "--validate"]) == 0
    out = capsys.readouterr().out
    for name in ("quick", "ci", "standard", "wikitext103", "passkey", "catalogue", "probes", "probe-seeds",
                 "probe-frontier"):
        assert name in out
    pretrained = next(line for line in out.splitlines() if " pretrained " in line)
    assert pretrained.split("│")[5].strip() == "-"  # no training length: the model's own context
    assert config.load_task("quick") == config.Task()  # the dataclass defaults are the quick task
    assert config.load_task("passkey").probes.names == ("passkey",)


def test_catalogue_task_is_every_scheme_on_the_quick_settings():
    import dataclasses

    from posbench.schemes import SCHEMES

    quick, whole = config.load_task("quick"), config.load_task("catalogue")
    assert sorted(whole.schemes) == sorted(SCHEMES)
    assert (whole.data, whole.model, whole.train) == (quick.data, quick.model, quick.train)
    assert dataclasses.replace(whole.eval, rope_scaling=quick.eval.rope_scaling,
                               learned_extension=quick.eval.learned_extension) == quick.eval


def test_refresh_baseline_script(full_run, tmp_path):
    import subprocess
    from pathlib import Path

    script = Path(__file__).parents[1] / "scripts" / "refresh_baseline.sh"
    src, dest = full_run, tmp_path / "baseline"
    missing = subprocess.run(["bash", str(script), str(tmp_path / "none"), str(dest)], capture_output=True, text=True)
    assert missing.returncode == 2 and "run 'posbench run ci" in missing.stderr
    done = subprocess.run(["bash", str(script), str(src), str(dest)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in dest.iterdir()) == ["extrapolation.csv", "provenance.json", "runs.csv"]
    assert main(["compare", str(dest), str(src)]) == 0


@pytest.mark.slow
def test_speed_step_times_again_only_what_is_missing(task_file, tmp_path):
    import dataclasses

    from posbench.grid import run_speed_once

    task = config.load_task(str(task_file))
    out = tmp_path / "out"
    first = run_speed_once(task, out, "cpu", lambda _: None)
    assert first == 3 * 2  # none, rope, learned x fwd, fwd+bwd at one length
    assert run_speed_once(task, out, "cpu", lambda _: None) == 0  # all there: skipped
    longer = dataclasses.replace(task, speed=dataclasses.replace(task.speed, lengths=(32, 48)))
    assert run_speed_once(longer, out, "cpu", lambda _: None) == 3 * 2 * 2  # a new length: the set again
    rows = results.read_rows(out / "speed.csv")
    assert len(rows) == 12 and len({(r["scheme"], r["pass"], r["seq_len"]) for r in rows}) == 12
