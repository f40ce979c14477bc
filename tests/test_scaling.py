"""`posbench table scaling`: ratios over seeds, slopes against log N and log D, seed-paired verdicts
with Benjamini-Hochberg, from rows made to known values."""

import math

import pytest

from posbench import results, scaling
from posbench.cli import main
from posbench.tables import table

SIZES = [(64, 2, 100_000), (128, 4, 800_000), (256, 8, 6_400_000)]  # d_model, layers, non-embedding N
QUICK_TOKENS, BUDGETS = 1_024_000, (256_000, 4_096_000)


def write(out, slope_none=0.0, slope_rope=-0.05, unlearned=()):
    """rope's log ratio at 16x falls by 0.05 per unit log N, none's is flat and higher; alibi's is 0.
    At 1x every scheme has the same loss. Seeds add a small spread."""
    runs, ext = [], []
    points = [(d, layers, n, QUICK_TOKENS) for d, layers, n in SIZES] + [(128, 4, 800_000, t) for t in BUDGETS]
    for k, (scheme, base, slope) in enumerate((("none", 0.4, slope_none), ("rope", 0.3, slope_rope), ("alibi", 0.0, 0.0))):
        for d, layers, n, tokens in points:
            for seed in range(3):
                run_id = f"{scheme}-{d}-{tokens}-{seed}"
                noise = 0.01 * (seed - 1) * (k + 1)
                learned = (scheme, d, seed) not in unlearned
                runs.append({"run_id": run_id, "task": "scaling", "scheme": scheme, "seed": seed, "train_len": 64,
                             "steps": tokens // 2048, "tokens": tokens, "n_params": n + 500_000, "final_val_loss": 4.0,
                             "unigram_val_loss": 6.0 if learned else 3.0, "status": "ok", "d_model": d,
                             "n_layers": layers, "n_heads": d // 32, "lr": 2e-3, "non_embedding_params": n})
                for eval_len in (64, 256, 1024):
                    gap = 0.0 if eval_len == 64 else (base + slope * math.log(n / 800_000)) * (eval_len / 1024)
                    loss = 4.0 + gap + noise * (eval_len > 64) + (0.02 if scheme == "none" and eval_len > 64 else 0)
                    ext.append({"run_id": run_id, "task": "scaling", "scheme": scheme, "seed": seed, "train_len": 64,
                                "eval_len": eval_len, "ratio": eval_len / 64, "mode": "nonoverlap", "stride": 0,
                                "scaling": "none", "extension": "none", "tokens": 4096, "loss": loss,
                                "ppl": math.exp(loss), "status": "ok"})
    results.merge_rows(out, "runs", runs)
    results.merge_rows(out, "extrapolation", ext)


def test_slopes_recover_the_made_dependence(tmp_path):
    write(tmp_path)
    records = scaling.cells(tmp_path)
    by_size, by_budget = scaling.series(records)
    assert {r["params"] for r in by_size} == {n for _, _, n in SIZES}
    assert {r["tokens"] for r in by_budget} == {QUICK_TOKENS, *BUDGETS}
    for name, want in (("rope", -0.05), ("none", 0.0), ("alibi", 0.0)):
        pts = [(math.log(r["params"]), r["x16"] - r["loss"]) for r in by_size if r["label"] == name]
        iv = scaling.slope([x for x, _ in pts], [y for _, y in pts])
        assert iv.mean == pytest.approx(want, abs=1e-4) and iv.lo < want < iv.hi
    text = table("scaling", tmp_path)
    assert "| `rope` | 100k | 3 | 54.6 [" in text and "| `rope` | 6.4M | 3 |" in text  # exp(4.0) at 1x
    assert "-0.050 [" in text


def test_verdicts_and_ordering_at_every_size(tmp_path):
    write(tmp_path)
    by_size, by_budget = scaling.series(scaling.cells(tmp_path))
    pairs = scaling.pair_records(by_size, by_budget)
    at16 = {(r["label"], r["level"]): scaling.verdict(r) for r in pairs if r["ratio"] == 16 and r["series"] == "size"}
    assert all(v == "lower" for (name, _), v in at16.items() if name == "alibi")
    # none's ratio is flat and rope's falls with N: none is behind rope at the two larger sizes only
    assert {n: v for (name, n), v in at16.items() if name == "none"} == {
        (64, 2): "not separated", (128, 4): "higher", (256, 8): "higher"}
    at1 = [scaling.verdict(r) for r in pairs if r["ratio"] == 1]
    assert set(at1) == {"no spread"}  # identical losses at 1x: no test
    text = table("scaling", tmp_path)
    assert "| `alibi` | 16x | sizes | 3 | lower than rope at every one |" in text
    assert "| `none` | 16x | sizes | 3 | 0 lower, 2 higher, 1 not separated |" in text
    assert "q (BH)" in text


def test_the_series_are_read_where_they_are_widest(tmp_path):
    """With the quick size's budgets in and one other size only at one budget, the size series is
    at that budget and the budget series at the quick size, though most runs are elsewhere."""
    write(tmp_path)
    records = [r for r in scaling.cells(tmp_path) if not (r["params"] == 6_400_000)]
    extra = [dict(r, params=99, size=(1, 1), seed=r["seed"] + 10 * k) for k in range(5)
             for r in records if r["params"] == 100_000]  # many runs of a size at one budget
    by_size, by_budget = scaling.series(records + extra)
    assert {r["tokens"] for r in by_size} == {QUICK_TOKENS} and {r["size"] for r in by_budget} == {(128, 4)}


def test_schemes_of_one_size_pair_though_their_parameter_counts_differ(tmp_path):
    write(tmp_path)
    rows = results.read_rows(tmp_path / "runs.csv")
    for r in rows:
        if r["scheme"] == "alibi":
            r["non_embedding_params"] = int(r["non_embedding_params"]) + 8  # a few per-head slopes more
    results.merge_rows(tmp_path, "runs", rows)
    by_size, by_budget = scaling.series(scaling.cells(tmp_path))
    pairs = scaling.pair_records(by_size, by_budget)
    assert {r["level"] for r in pairs if r["label"] == "alibi" and r["series"] == "size"} == {(64, 2), (128, 4), (256, 8)}


def test_unlearned_seeds_are_left_out(tmp_path):
    write(tmp_path, unlearned={("rope", 256, 0)})
    by_size, _ = scaling.series(scaling.cells(tmp_path))
    assert len([r for r in by_size if r["label"] == "rope" and r["params"] == 6_400_000]) == 2


def test_cli_prints_the_table_and_writes_the_figure(tmp_path, capsys):
    write(tmp_path / "r")
    assert main(["table", "scaling", str(tmp_path / "r"), "--figure", str(tmp_path / "f.png")]) == 0
    assert "By size" in capsys.readouterr().out and (tmp_path / "f.png").stat().st_size > 1000


def test_a_folder_without_sizes_is_one_line(tmp_path, capsys):
    results.merge_rows(tmp_path, "runs", [{"run_id": "x", "status": "ok", "final_val_loss": 1, "unigram_val_loss": 2}])
    assert main(["table", "scaling", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "non_embedding_params" in err and len(err.splitlines()) == 1
