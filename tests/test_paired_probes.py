"""`posbench paired A B --probe P`: probe accuracy differences paired seed by seed."""

from pathlib import Path

import pytest

from posbench import results
from posbench.cli import main
from posbench.pairing import paired_probes


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
    # the interval clears zero, but three seeds give no permutation p below 0.25
    assert at64["verdict"] == "interval only"
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
    assert "paired over seeds" in out and "interval only" in out and "+10.0" in out and "q (BH)" in out
    assert main(["paired", "rope", "none", "--runs-dir", str(folder), "--probe", "all", "--lengths", "64"]) == 0
    assert main(["paired", "rpoe", "none", "--runs-dir", str(folder), "--probe", "mqar"]) == 2
    assert "did you mean 'rope'" in capsys.readouterr().err
    assert main(["paired", "rope", "none", "--runs-dir", str(folder), "--probe", "sort"]) == 2
    assert "no scored probe rows" in capsys.readouterr().err  # a probe, not scored there
    assert main(["paired", "rope", "none", "--runs-dir", str(folder), "--probe", "mqra"]) == 2
    err = capsys.readouterr().err
    assert "unknown probe 'mqra'; did you mean 'mqar'?" in err and len(err.strip().splitlines()) == 1, err
    assert main(["paired", "rope", "none", "--runs-dir", str(folder), "--probe", "mqar", "--mode", "sliding"]) == 2


def test_tests_without_normality_beside_the_interval(tmp_path, capsys):
    # ten seeds: rope ahead in nine by 10 to 90 answers of 200, behind in one by 20
    rows = []
    for seed in range(10):
        ahead = -20 if seed == 3 else 10 * (seed + 1)
        rows += [probe_row("rope", seed, 64, 100 + ahead), probe_row("none", seed, 64, 100)]
    results.merge_rows(tmp_path, "probes", rows)
    (row,) = paired_probes(tmp_path, "rope", "none")
    assert (row["for_a"], row["for_b"]) == (9, 1)
    assert row["sign_p"] == pytest.approx(0.021484375)  # scipy.stats.binomtest(9, 10).pvalue
    # answers 10, 20, 30, -20, 50, ..., 100 (sum 490): of the 1024 sign flips, |sum| >= 490 for the
    # observed one, the -20 flipped (530), the -20 with the 10 (510) or with the 20 (490), and their
    # 4 mirror images: 8
    assert row["perm_p"] == pytest.approx(8 / 1024)
    assert row["q"] == row["perm_p"] and row["verdict"] == "rope better"  # one row: q is p
    assert main(["paired", "rope", "none", "--runs-dir", str(tmp_path), "--probe", "mqar"]) == 0
    out = capsys.readouterr().out
    assert "9 of 10" in out and "0.0215" in out and "sign p" in out and "permutation p" in out


def test_three_seeds_never_reach_the_sign_tests_five_percent(folder):
    row = {r["eval_len"]: r for r in paired_probes(folder, "rope", "none", "mqar")}[64]
    assert row["sign_p"] == pytest.approx(0.25) and row["perm_p"] == pytest.approx(0.25)
    # the t-interval, with no spread at all, clears zero; no test over three seeds can, and
    # Benjamini-Hochberg over the two lengths doubles the 0.25 (32 tokens' p is 1): the interval alone
    assert row["q"] == pytest.approx(0.5) and row["verdict"] == "interval only"


def test_every_seed_is_a_point_in_the_probe_figure(folder, monkeypatch):
    from posbench import reporting

    drawn = {}
    real = reporting.results.save_figure

    def keep(fig, path, dpi):
        drawn[Path(path).name] = [[tuple(p) for p in c.get_offsets()] for ax in fig.axes for c in ax.collections]
        return real(fig, path, dpi)

    monkeypatch.setattr(reporting.results, "save_figure", keep)
    md = reporting.probes_markdown(results.read_probes(folder), folder)
    assert "![probe_mqar_seeds](probe_mqar_seeds.png)" in md and (folder / "probe_mqar_seeds.png").stat().st_size > 1000
    panels = drawn["probe_mqar_seeds.png"]  # per length (32, 64), per scheme: the seeds, then the mean
    points = {round(y, 6) for group in panels for x, y in group}
    # rope at 64: 30, 70, 100; none at 64: 20, 60, 90 (hits of 200); every one drawn
    assert {30.0, 70.0, 100.0, 20.0, 60.0, 90.0} <= points
    seeds = [group for group in panels if len(group) == 3]
    assert len(seeds) == 4  # two schemes x two lengths, three seeds each
    (equal,) = [group for group in seeds if {y for x, y in group} == {95.0}]  # rope at 32: 190 of 200 each
    assert len({x for x, y in equal}) == 3  # equal values spread sideways, none hidden


def test_one_seed_draws_no_seed_figure(tmp_path):
    from posbench import reporting

    results.merge_rows(tmp_path, "probes", [probe_row("rope", 0, 64, 56, 70), probe_row("none", 0, 64, 48, 80)])
    md = reporting.probes_markdown(results.read_probes(tmp_path), tmp_path)
    assert not any("_seeds" in line for line in md) and not (tmp_path / "probe_mqar_seeds.png").exists()
