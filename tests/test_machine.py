"""The machine kind (posbench.machine): recorded in every row and in provenance.json, told apart by
threads and kernels, and named when a folder mixes kinds."""

import json

import torch

from posbench import machine, results
from posbench.cli import main


def test_the_kind_names_threads_and_kernels_and_hashes_every_detail(monkeypatch):
    here = machine.current("cpu")
    assert here.kind.startswith(f"{torch.backends.cpu.get_cpu_capability().lower()}x{torch.get_num_threads()}-")
    assert f"torch {torch.__version__}" in here.detail and f"{torch.get_num_threads()} threads" in here.detail
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1 if before > 1 else 2)
        assert machine.current("cpu").kind != here.kind
    finally:
        torch.set_num_threads(before)
    monkeypatch.setenv("MKL_CBWR", "COMPATIBLE")
    assert machine.current("cpu").kind != here.kind and "MKL_CBWR=COMPATIBLE" in machine.current("cpu").detail
    assert machine.current("cpu").columns() == {"machine": machine.current("cpu").kind,
                                                "machine_detail": machine.current("cpu").detail}


def test_a_mixture_is_named_once_with_its_kinds():
    rows = [{"status": "ok", "machine": "avx512x2-aaaa"}, {"status": "ok", "machine": "avx512x2-aaaa"},
            {"status": "failed", "machine": "avx2x4-bbbb"}]
    assert machine.mixture(rows, "runs/x") is None  # a failed run trained nothing
    rows.append({"status": "ok", "machine": ""})  # a row of before kinds were recorded
    line = machine.mixture(rows, "runs/x")
    assert line.startswith("runs/x mixes runs of 2 machine kinds: avx512x2-aaaa (2 runs), unrecorded (1 run)")
    assert "\n" not in line


def _old_runs_csv(path):
    """A runs.csv as an older posbench wrote it: no machine columns."""
    columns = [c for c in results.TABLES["runs"]["columns"] if c not in results.ADDED_LATER["runs"]]
    row = {c: "" for c in columns}
    row.update(run_id="rope-0000000000", task="t", scheme="rope", seed="0", train_len="16", steps="2",
               tokens="64", n_params="10", status="ok")
    path.write_text(",".join(columns) + "\n" + ",".join(row[c] for c in columns) + "\n")


def test_rows_record_the_kind_and_old_rows_still_merge(tmp_path):
    _old_runs_csv(tmp_path / "runs.csv")
    results.merge_rows(tmp_path, "runs", [{"run_id": "rope-1111111111", "status": "ok",
                                           **results.provenance("cpu", "float32")}])
    rows = {r["run_id"]: r for r in results.read_rows(tmp_path / "runs.csv")}
    assert rows["rope-0000000000"]["machine"] == "" and rows["rope-0000000000"]["status"] == "ok"
    assert rows["rope-1111111111"]["machine"] == machine.current("cpu").kind
    assert "threads" in rows["rope-1111111111"]["machine_detail"]


def test_report_names_the_kinds_of_a_mixed_folder(tmp_path, capsys):
    _old_runs_csv(tmp_path / "runs.csv")
    assert main(["report", str(tmp_path)]) == 0
    assert "machine kinds" not in capsys.readouterr().err  # one kind (unrecorded): nothing to say
    results.merge_rows(tmp_path, "runs", [{"run_id": "rope-1111111111", "task": "t", "scheme": "rope", "seed": 0,
                                           "train_len": 16, "steps": 2, "tokens": 64, "n_params": 10,
                                           "status": "ok", **results.provenance("cpu", "float32")}])
    assert main(["report", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "mixes runs of 2 machine kinds" in err
    assert machine.current("cpu").kind in err and "unrecorded (1 run)" in err
    assert "mixes runs of 2 machine kinds" in (tmp_path / "report.md").read_text()


def test_a_grid_records_its_machine_in_provenance(tmp_path, corpus_dir):
    from posbench.config import load_task
    from posbench.grid import write_provenance

    write_provenance(load_task("ci"), tmp_path, (1, 1), "cpu")
    prov = json.loads((tmp_path / "provenance.json").read_text())
    assert prov["machine"] == machine.current("cpu").kind and "threads" in prov["machine_detail"]
