"""Refusals that keep what is on disk: a damaged table, a finished run."""

import shutil
from pathlib import Path

import pytest

from conftest import snapshot
from posbench import results
from posbench.cli import main

BASELINE = Path(__file__).parents[1] / "results" / "baseline" / "ci"


def test_report_on_a_damaged_windows_table_refuses_and_changes_nothing(tmp_path, capsys):
    folder = tmp_path / "results"
    shutil.copytree(BASELINE, folder)
    columns = results.TABLES["windows"]["columns"]
    row = {c: "1" for c in columns} | {"run_id": "r", "mode": "nonoverlap", "window": "seven"}
    (folder / "windows.csv").write_text(",".join(columns) + "\n" + ",".join(row[c] for c in columns) + "\n")
    before = snapshot(folder)
    assert main(["report", str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [f"error: {folder / 'windows.csv'} is damaged: line 2 has window 'seven', "
                                        "not an integer"]
    assert snapshot(folder) == before


def test_train_keeps_a_finished_run_unless_asked_to_overwrite(tiny_data, tmp_path, capsys):
    from posbench.runs import FINAL

    runs = tmp_path / "runs"
    args = ["train", "--scheme", "rope", "--data", tiny_data.spec, "--tokenizer", "bytes", "--d-model", "16",
            "--layers", "1", "--heads", "2", "--train-len", "16", "--steps", "2", "--batch-size", "2",
            "--device", "cpu", "--runs-dir", str(runs)]
    assert main(args) == 0
    (run_dir,) = [p for p in runs.iterdir() if p.is_dir()]
    capsys.readouterr()
    model, table = run_dir / FINAL, results.table_path(runs, "runs")
    kept = (model.stat().st_mtime_ns, model.read_bytes(), table.read_bytes())
    assert main(args) == 0  # no --resume: kept, said so
    assert capsys.readouterr().out.strip() == (f"{run_dir.name}: already trained (finished in runs.csv), kept as it "
                                               f"is in {run_dir}; --overwrite trains it again from scratch")
    assert (model.stat().st_mtime_ns, model.read_bytes(), table.read_bytes()) == kept
    assert main([*args, "--resume", "--overwrite"]) == 2
    assert "give one" in capsys.readouterr().err
    assert main([*args, "--overwrite"]) == 0  # trained again from scratch
    assert model.stat().st_mtime_ns != kept[0]
    assert "2 steps" in capsys.readouterr().out
    # stopped while it trains again: its weights are gone, and runs.csv no longer calls it finished
    from posbench import training
    from posbench.runs import load_spec

    spec, _ = load_spec(run_dir)
    assert training.train(spec, runs, device="cpu", progress=False, overwrite=True, stop_after=1).row["status"] == \
        "partial"
    (row,) = results.read_rows(table)
    assert not model.exists() and row["status"] == "partial" and "--overwrite" in row["message"]
    assert main(args) == 0 and "already trained" not in capsys.readouterr().out  # not kept as finished: trained


@pytest.mark.slow
def test_effective_lengths_of_different_criteria_stand_side_by_side(tmp_path, capsys):
    folder = tmp_path / "results"
    shutil.copytree(BASELINE, folder)
    table = results.table_path(folder, "effective_length")
    assert main(["report", str(folder), "--tolerance", "0.2"]) == 0
    loose = results.read_rows(table)
    assert loose and {r["criterion"] for r in loose} == {"0.2"}
    assert main(["report", str(folder)]) == 0  # the default, 0.1: its rows beside, the 0.2 ones kept
    both = results.read_rows(table)
    assert [r for r in both if r["criterion"] == "0.2"] == loose
    strict = [r for r in both if r["criterion"] == "0.1"]
    assert len(strict) == len(loose)
    assert all(int(s["effective_len"] or 0) <= int(lo["effective_len"] or 0) for s, lo in zip(strict, loose))
    assert "within 10%" in (folder / "report.md").read_text()
