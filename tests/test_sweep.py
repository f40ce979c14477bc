"""A learning-rate sweep of probe cells ([probes] lrs and cells), the table that chooses a rate by
held-out accuracy at the training length, and grids that reuse rows merged from another folder."""

from pathlib import Path

import pytest

from conftest import TINY_PASSKEY
from posbench import config, results, tables
from posbench.cli import main
from posbench.errors import PosbenchError
from posbench.grid import grid, run_task

SWEEP = """
version = 1
name = "tinysweep"
schemes = ["none", "rope"]
seeds = [0, 1]
""" + TINY_PASSKEY + """[eval]
rope_scaling = ["none"]
[probes]
names = ["passkey"]
lengths = [32, 64]
trials = 2
randomized = ["rope"]
"""


def task(tmp_path: Path, extra: str = "", name: str = "tinysweep") -> config.Task:
    path = tmp_path / f"{name}.toml"
    path.write_text(SWEEP + extra)
    return config.load_task(str(path))


def test_lrs_and_cells_shape_the_grid(tmp_path):
    plain = task(tmp_path)
    assert len(grid(plain)) == 3 * 2  # none, rope, rope+randomized x 2 seeds
    swept = task(tmp_path, 'lrs = [1e-3, 2e-3, 1e-2]\ncells = ["passkey:none", "passkey:rope+randomized"]\n', "swept")
    specs = grid(swept)
    assert len(specs) == 2 * 3 * 2  # 2 cells x 3 rates x 2 seeds
    assert {s.train.lr for s in specs} == {1e-3, 2e-3, 1e-2}
    assert {(s.scheme, s.train.randomize_positions) for s in specs} == {("none", False), ("rope", True)}
    # at the task's own rate (2e-3, [train]'s default) a cell keeps the run_ids it has without a sweep
    own = {s.run_id for s in specs if s.train.lr == 2e-3}
    assert own == {s.run_id for s in grid(plain) if (s.scheme, s.train.randomize_positions) != ("rope", False)}
    assert not own & {s.run_id for s in specs if s.train.lr != 2e-3}


def test_schemes_select_the_labels_the_tables_name(tmp_path):
    """`--schemes` takes the labels of the tables: `rope` its plain runs alone, `rope+randomized`
    its runs on randomized positions alone; a sweep's cells keep those of the labels named. The
    run_ids are the whole task's."""
    plain = task(tmp_path)
    whole = {s.run_id: (s.scheme, s.train.randomize_positions) for s in grid(plain)}

    def picked(t, wanted):
        specs = grid(config.only_schemes(t, wanted))
        assert {s.run_id for s in specs} <= set(whole) or t is not plain
        return sorted({(s.scheme, s.train.randomize_positions) for s in specs})

    assert picked(plain, ("none",)) == [("none", False)]
    assert picked(plain, ("rope",)) == [("rope", False)]
    assert picked(plain, ("rope+randomized",)) == [("rope", True)]
    assert picked(plain, ("rope", "rope+randomized")) == [("rope", False), ("rope", True)]
    assert len(grid(config.only_schemes(plain, ("rope+randomized",)))) == 2  # its two seeds
    swept = task(tmp_path, 'lrs = [1e-3, 2e-3]\ncells = ["passkey:none", "passkey:rope+randomized"]\n', "swept")
    assert picked(swept, ("none",)) == [("none", False)]
    assert picked(swept, ("rope+randomized", "none")) == [("none", False), ("rope", True)]
    with pytest.raises(PosbenchError, match=r"--schemes rope: none of task tinysweep's \[probes\] cells"):
        config.only_schemes(swept, ("rope",))
    with pytest.raises(PosbenchError, match="task quick trains no probe"):
        config.only_schemes(config.load_task("quick"), ("rope+randomized",))


def test_run_trains_the_randomized_runs_alone(tmp_path, capsys):
    path = tmp_path / "tinysweep.toml"
    path.write_text(SWEEP)
    out = tmp_path / "out"
    assert main(["run", str(path), "--schemes", "rope+randomized", "--no-speed", "--out", str(out)]) == 0
    rows = results.read_rows(results.table_path(out, "runs"))
    assert sorted((r["scheme"], r["randomized"], r["seed"]) for r in rows) == [("rope", "True", "0"), ("rope", "True", "1")]


@pytest.mark.parametrize("extra, message", [
    ('cells = ["passkey:alibi"]\n',
     r"cells: 'passkey:alibi' names scheme 'alibi', which the task does not train \(its schemes: none, rope, rope\+randomized\)"),
    ('cells = ["passkey:none+randomized"]\n', r"'passkey:none\+randomized' names scheme 'none\+randomized'"),
    ('cells = ["mqar:none"]\n', r"'mqar:none' names probe 'mqar', which is not in \[probes\] names \(passkey\)"),
    ('lrs = [1e-3, 1e-3]\n', r"lrs repeat"),
    ('lrs = [0.0]\n', r"lrs must be positive"),
])
def test_bad_sweeps_are_refused_in_one_line(tmp_path, extra, message):
    with pytest.raises(PosbenchError, match=message):
        task(tmp_path, extra)


def rows_for(specs, held_out: dict, accuracy: dict):
    """runs.csv and probes.csv rows for `specs`: held-out accuracy and scored accuracy at 1x and
    2x by (lr, seed)."""
    runs, probes = [], []
    for s in specs:
        h = held_out[(s.train.lr, s.seed)]
        runs.append({"run_id": s.run_id, "task": "tinysweep", "scheme": s.scheme, "seed": s.seed,
                     "train_len": 32, "randomized": False, "steps": 2, "status": "ok", "final_val_accuracy": h})
        for ratio, hits in zip((1, 2), accuracy[(s.train.lr, s.seed)]):
            probes.append({"run_id": s.run_id, "task": "tinysweep", "probe": "passkey", "spec": "passkey",
                           "scheme": s.scheme, "params": "", "seed": s.seed, "train_len": 32, "eval_len": 32 * ratio,
                           "ratio": ratio, "variant": "", "scaling": "none", "extension": "none", "hits": hits,
                           "answers": 10, "accuracy": hits / 10, "status": "ok" if h >= 0.9 else "not learned"})
    return runs, probes


def test_the_sweep_chooses_by_held_out_accuracy_at_the_training_length(tmp_path):
    swept = task(tmp_path, 'lrs = [1e-3, 2e-3, 1e-2]\ncells = ["passkey:none"]\n', "swept")
    # 1e-2 scores best at 2x, but 1e-3 has the best held-out accuracy at 1x: 1e-3 is chosen
    held = {(1e-3, 0): 0.97, (1e-3, 1): 0.95, (2e-3, 0): 0.90, (2e-3, 1): 0.40, (1e-2, 0): 0.92, (1e-2, 1): 0.93}
    scored = {(1e-3, 0): (9, 2), (1e-3, 1): (9, 3), (2e-3, 0): (9, 1), (2e-3, 1): (4, 0),
              (1e-2, 0): (9, 9), (1e-2, 1): (9, 8)}
    runs, probes = rows_for(grid(swept), held, scored)
    out = tmp_path / "out"
    results.merge_rows(out, "runs", runs)
    results.merge_rows(out, "probes", probes)
    records = tables.sweep_records([out], str(tmp_path / "swept.toml"), (1, 2))
    assert [(r["lr"], r["learned"], r["chosen"]) for r in records] == [(1e-3, 2, True), (2e-3, 1, False),
                                                                      (1e-2, 2, False)]
    assert records[0]["held_out"] == pytest.approx(0.96)
    assert records[2]["means"] == pytest.approx([0.9, 0.85])
    # a tie goes to the cell's own rate
    tied = {k: 0.95 for k in held}
    out2 = tmp_path / "tied"
    runs, probes = rows_for(grid(swept), tied, scored)
    results.merge_rows(out2, "runs", runs)
    results.merge_rows(out2, "probes", probes)
    chosen = [r["lr"] for r in tables.sweep_records([out2], str(tmp_path / "swept.toml"), (1, 2)) if r["chosen"]]
    assert chosen == [2e-3]


def test_a_cell_chooses_once_every_rate_has_every_seed_and_a_failed_run_scores_zero(tmp_path):
    swept = task(tmp_path, 'lrs = [1e-3, 2e-3, 1e-2]\ncells = ["passkey:none"]\n', "swept")
    held = {(1e-3, 0): 0.60, (1e-3, 1): 0.62, (2e-3, 0): 0.90, (2e-3, 1): 0.91, (1e-2, 0): 0.99, (1e-2, 1): 0.99}
    specs = grid(swept)
    runs, probes = rows_for(specs, held, {k: (9, 5) for k in held})
    out = tmp_path / "out"
    diverged = next(s.run_id for s in specs if (s.train.lr, s.seed) == (1e-2, 1))
    later = next(s.run_id for s in specs if (s.train.lr, s.seed) == (1e-3, 1))
    results.merge_rows(out, "runs", [r for r in runs if r["run_id"] != later])  # 1e-3's seed 1 not yet run
    results.merge_rows(out, "probes", [p for p in probes if p["run_id"] not in (diverged, later)])
    results.merge_rows(out, "runs", [{**next(r for r in runs if r["run_id"] == diverged), "status": "failed",
                                      "final_val_accuracy": ""}])
    records = tables.sweep_records([out], str(tmp_path / "swept.toml"), (1, 2))
    assert [(r["lr"], r["seeds"], r["failed"], r["complete"], r["chosen"]) for r in records] == [
        (1e-3, 1, 0, False, False), (2e-3, 2, 0, False, False), (1e-2, 2, 1, False, False)]
    assert records[2]["held_out"] == pytest.approx(0.495)  # 0.99 and the failed seed's 0
    table = tables.sweep_table(records, (1, 2))
    assert "| 0.01 | 2 | 1 of 2 (1 failed) | 50 |" in table and table.count("waits for seeds") == 3
    results.merge_rows(out, "runs", [r for r in runs if r["run_id"] == later])
    results.merge_rows(out, "probes", [p for p in probes if p["run_id"] == later])
    records = tables.sweep_records([out], str(tmp_path / "swept.toml"), (1, 2))
    assert [r["lr"] for r in records if r["chosen"]] == [2e-3]  # 1e-2 lost a seed to NaN: 0.495 < 0.905


def test_sweep_table_from_the_cli(tmp_path, capsys):
    swept = task(tmp_path, 'lrs = [1e-3, 2e-3]\ncells = ["passkey:rope"]\n', "swept")
    held = {(lr, s): 0.5 + lr * 100 for lr in (1e-3, 2e-3) for s in (0, 1)}
    runs, probes = rows_for(grid(swept), held, {k: (5, 1) for k in held})
    out = tmp_path / "out"
    results.merge_rows(out, "runs", runs)
    results.merge_rows(out, "probes", probes)
    assert main(["table", "probes", str(out), "--task", str(tmp_path / "swept.toml"), "--sweep",
                 "--ratios", "1,2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| probe | scheme | lr | seeds | learned | held-out at 1x | 1x mean | 2x mean | chosen")
    assert lines[2].startswith("| passkey | rope | 0.001 | 2 | 0 of 2 | 60 | 50 | 10 |")
    assert lines[3].endswith("| chosen |")
    assert main(["table", "probes", str(out), "--sweep"]) == 2  # --sweep needs --task: a usage error
    assert "give --task too" in capsys.readouterr().err


@pytest.mark.slow
def test_a_grid_reuses_rows_merged_from_another_folder(tmp_path, capsys):
    path = tmp_path / "tinysweep.toml"
    path.write_text(SWEEP)
    first, second = tmp_path / "first", tmp_path / "second"
    done = run_task(config.load_task(str(path)), first, speed=False, log=lambda m: None)
    assert done["trained"] == 6 and done["probes"] == 6
    assert main(["report", str(second), "--merge", str(first)]) == 0
    done = run_task(config.load_task(str(path)), second, speed=False, log=lambda m: None)
    assert (done["trained"], done["skipped_train"], done["probes"], done["skipped_probes"]) == (0, 6, 0, 6)
    assert not [p for p in second.iterdir() if p.is_dir()]  # no run trained again
    # a run whose probe rows are incomplete is trained and scored again
    keep = [r for r in results.read_rows(results.table_path(second, "probes")) if r["seed"] != "1" or r["scheme"] != "none"]
    results.table_path(second, "probes").unlink()
    results.merge_rows(second, "probes", keep)
    done = run_task(config.load_task(str(path)), second, speed=False, log=lambda m: None)
    assert (done["trained"], done["probes"]) == (1, 1)
