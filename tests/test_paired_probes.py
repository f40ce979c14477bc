"""`posbench paired A B --probe P`: probe accuracy differences paired seed by seed."""

import pytest

from posbench import results
from posbench.cli import main
from posbench.paired import paired_probes


def probe_row(scheme, seed, length, hits, answers=200, probe="mqar", task="t"):
    return {"run_id": f"{scheme}-{seed:010d}", "task": task, "probe": probe, "spec": probe, "scheme": scheme,
            "seed": seed, "train_len": 32, "eval_len": length, "ratio": length / 32, "variant": "", "trials": 50,
            "position_draws": 0, "answers": answers, "hits": hits, "accuracy": hits / answers,
            "scaling": "none", "extension": "none", "status": "ok"}


@pytest.fixture
def folder(tmp_path):
    # Seeds differ a lot (one learned late), but rope beats none by 20 answers in every seed.
    rows = []
    for seed, base in enumerate((40, 120, 180)):
        rows += [probe_row("rope", seed, 64, base + 20), probe_row("none", seed, 64, base)]
        rows += [probe_row("rope", seed, 32, 190), probe_row("none", seed, 32, 190 + (seed - 1))]
    results.merge_rows(tmp_path, "probes", rows)
    return tmp_path


def test_seed_pairing_removes_the_spread_of_the_seeds(folder):
    rows = {r["eval_len"]: r for r in paired_probes(folder, "rope", "none", "mqar")}
    at64 = rows[64]
    assert at64["seeds"] == 3 and at64["diff"] == pytest.approx(0.1)
    # Every seed's difference is 0.1: no spread left, though the accuracies range from 20% to 90%.
    assert at64["lo"] == pytest.approx(0.1) and at64["hi"] == pytest.approx(0.1)
    assert at64["verdict"] == "rope better"
    at32 = rows[32]  # differences -0.005, 0, +0.005 (none - rope flips): no clear difference
    assert at32["diff"] == pytest.approx(0.0, abs=1e-12) and at32["lo"] < 0 < at32["hi"]
    assert at32["verdict"] == "no clear difference"
    assert [r["eval_len"] for r in paired_probes(folder, "rope", "none", lengths=(32,))] == [32]


def test_one_seed_takes_newcombes_interval(tmp_path):
    """Newcombe (1998), Table II, method 10: 56/70 - 48/80 = 0.2000, 95% interval 0.0524 to 0.3339."""
    results.merge_rows(tmp_path, "probes", [probe_row("rope", 0, 64, 56, 70), probe_row("none", 0, 64, 48, 80)])
    (row,) = paired_probes(tmp_path, "rope", "none")
    assert row["seeds"] == 1 and row["diff"] == pytest.approx(0.2)
    assert row["lo"] == pytest.approx(0.0524, abs=1e-4) and row["hi"] == pytest.approx(0.3339, abs=1e-4)


def test_paired_probe_cli(folder, capsys):
    assert main(["paired", "rope", "none", "--runs-dir", str(folder), "--probe", "mqar"]) == 0
    out = capsys.readouterr().out
    assert "paired over seeds" in out and "rope better" in out and "+10.0" in out
    assert main(["paired", "rope", "none", "--runs-dir", str(folder), "--probe", "all", "--lengths", "64"]) == 0
    assert main(["paired", "rpoe", "none", "--runs-dir", str(folder), "--probe", "mqar"]) == 2
    assert "did you mean 'rope'" in capsys.readouterr().err
    assert main(["paired", "rope", "none", "--runs-dir", str(folder), "--probe", "sort"]) == 2
    assert "no scored probe rows" in capsys.readouterr().err  # a probe, not scored there
    assert main(["paired", "rope", "none", "--runs-dir", str(folder), "--probe", "mqra"]) == 2
    err = capsys.readouterr().err
    assert "unknown probe 'mqra'; did you mean 'mqar'?" in err and len(err.strip().splitlines()) == 1, err
    assert main(["paired", "rope", "none", "--runs-dir", str(folder), "--probe", "mqar", "--mode", "sliding"]) == 2
