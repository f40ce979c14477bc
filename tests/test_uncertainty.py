"""Effective length, seed intervals in the tables, the paired comparison and the CI gate, on
constructed rows whose answer is known."""

import math

import pytest

from pathlib import Path

from posbench import effective, results
from posbench.cli import main
from posbench.comparison import compare
from posbench.pairing import paired
from posbench.reporting import accuracy_cell, effective_text, ppl_grid

RESULTS = Path(__file__).resolve().parent.parent / "results"


def ext_row(scheme, seed, eval_len, ppl, status="ok", train_len=64, mode="nonoverlap", stride=0, **extra):
    loss = math.log(ppl) if ppl else ""
    return {"run_id": f"{scheme}-{seed}", "task": "t", "scheme": scheme, "params": "", "seed": seed,
            "train_len": train_len, "eval_len": eval_len, "mode": mode, "stride": stride, "scaling": "none",
            "extension": "none", "loss": loss, "ppl": ppl, "status": status, "corpus": "c", **extra}


def strings(rows):
    """Rows as they come back from a CSV."""
    return [{k: "" if v is None else str(v) for k, v in r.items()} for r in rows]


def by_run(rows):
    return {(r["run_id"], r["protocol"]): (r["effective_len"], r["status"]) for r in rows}


def test_effective_length_is_contiguous_from_the_training_length():
    rows = strings(
        [ext_row("a", 0, n, p) for n, p in [(32, 30.0), (64, 10.0), (128, 10.9), (256, 11.5), (512, 10.5)]]
        + [ext_row("b", 0, n, p) for n, p in [(64, 10.0), (128, 10.5), (256, 11.0)]]  # 11.0 = 1.1 x: within
        + [ext_row("c", 0, 64, 10.0), ext_row("c", 0, 128, None, "unsupported")]
        + [ext_row("d", 0, n, p) for n, p in [(128, 9.0), (256, 9.5)]]  # nothing at or below 64
        + [ext_row("e", 0, n, p) for n, p in [(32, 20.0), (128, 21.0), (256, 30.0)]]  # reference: 32
    )
    got = by_run(effective.perplexity_rows(rows, tolerance=0.10))
    # a: 512 is back within 10%, but 256 broke the run: "stays" means contiguous.
    assert got[("a-0", "nonoverlap")] == (128, "ok")
    assert got[("b-0", "nonoverlap")] == (256, "censored")
    assert got[("c-0", "nonoverlap")] == (64, "ok")
    assert got[("d-0", "nonoverlap")] == (None, "no reference")
    assert got[("e-0", "nonoverlap")] == (128, "ok")
    assert by_run(effective.perplexity_rows(rows, tolerance=0.2))[("a-0", "nonoverlap")] == (512, "censored")
    (a,) = [r for r in effective.perplexity_rows(rows) if r["run_id"] == "a-0"]
    assert a["reference"] == 10.0 and a["ratio"] == 2 and a["max_len"] == 512
    assert effective_text(a) == "128 (2x)"


def test_effective_length_protocols_of_sliding_strides():
    half = [ext_row("a", 0, n, 10.0, mode="sliding", stride=n // 2) for n in (64, 128, 256)]
    fixed = [ext_row("a", 0, n, 10.0, mode="sliding", stride=16) for n in (64, 128)]
    got = by_run(effective.perplexity_rows(strings(half + [ext_row("a", 0, 64, 10.0)])))
    assert got == {("a-0", "sliding/half"): (256, "censored"), ("a-0", "nonoverlap"): (64, "censored")}
    assert by_run(effective.perplexity_rows(strings(fixed))) == {("a-0", "sliding/16"): (128, "censored")}


def acc_rows(scheme, seed, hits_by_len, trials=10, train_len=64):
    """probes.csv rows of the passkey probe: two depths per length; hits split between them."""
    return [{"run_id": f"{scheme}-{seed}", "task": "t", "probe": "passkey", "scheme": scheme, "seed": seed,
             "train_len": train_len, "eval_len": n, "variant": f"depth={d}", "trials": trials, "answers": trials,
             "hits": h // 2 + (h % 2 if d else 0),
             "accuracy": "", "scaling": "none", "extension": "none", "status": "ok"}
            for n, h in hits_by_len.items() for d in (0, 1)]


def test_effective_length_of_accuracy_pools_probe_variants():
    rows = strings(acc_rows("a", 0, {64: 20, 128: 11, 256: 9, 512: 20})  # 55%, then 45%
                   + acc_rows("b", 0, {64: 8, 128: 20}))  # below the threshold in-length
    got = by_run(effective.accuracy_rows(rows, threshold=0.5))
    assert got == {("a-0", "passkey"): (128, "ok"), ("b-0", "passkey"): (None, "no reference")}
    assert by_run(effective.accuracy_rows(rows, threshold=0.4))[("a-0", "passkey")] == (512, "censored")
    # A randomized run reads every trial once per position draw: 20, 11, 9 hits of 40 answers.
    drawn = [{**r, "position_draws": "2", "answers": "20"} for r in rows if r["run_id"] == "a-0"]
    assert by_run(effective.accuracy_rows(drawn, threshold=0.5))[("a-0", "passkey")] == (64, "ok")
    assert by_run(effective.accuracy_rows(drawn, threshold=0.25))[("a-0", "passkey")] == (128, "ok")


def test_relative_effective_length_is_a_share_of_the_runs_own_score():
    # a: 100% in length, then 90%, 80%; b: 60% in length, then 55%, 55%; chance 0
    rows = strings(acc_rows("a", 0, {64: 20, 128: 18, 256: 16}) + acc_rows("b", 0, {64: 12, 128: 11, 256: 11}))
    absolute = effective.accuracy_rows(rows, threshold=0.5)
    relative = effective.relative_rows(rows, share=0.85)
    # absolute (at least 50%): both hold to 256; relative (85% of its own): a to 128 (80% < 85%), b to 256
    assert by_run(absolute) == {("a-0", "passkey"): (256, "censored"), ("b-0", "passkey"): (256, "censored")}
    assert by_run(relative) == {("a-0", "passkey/relative"): (128, "ok"), ("b-0", "passkey/relative"): (256, "censored")}
    assert {r["basis"] for r in absolute} == {"absolute"} and {r["basis"] for r in relative} == {"relative"}
    assert [r["criterion"] for r in relative] == pytest.approx([0.85, 0.85 * 0.6])
    not_learned = effective.relative_rows([{**r, "status": "not learned"} for r in rows])
    assert {r["status"] for r in not_learned} == {"not learned"}
    assert {r["basis"] for r in effective.perplexity_rows(strings([ext_row("a", 0, 64, 10.0)]))} == {"relative"}


def test_rulers_tasks_pass_at_rulers_threshold_and_a_reference_at_chance_keeps_nothing():
    # A pretrained model on ruler:cwe (chance 0.1): 90% at its context, 80%, 40% past it.
    model = [{**r, "probe": "ruler:cwe", "chance": "0.1", "variant": ""}
             for r in acc_rows("m", 0, {8: 18, 16: 16, 32: 8}, train_len=8) if r["variant"] == "depth=1"]
    model = strings([{**r, "hits": h, "answers": 20, "trials": 20} for r, h in zip(model, (18, 16, 8))])
    (absolute,) = effective.accuracy_rows(model, threshold=0.5)
    assert absolute["criterion"] == 0.856 and (absolute["effective_len"], absolute["status"]) == (8, "ok")
    (relative,) = effective.relative_rows(model)
    assert (relative["effective_len"], relative["status"]) == (16, "ok")  # 80% >= 0.85 x 90%
    # Read only below its context: no reference on either basis.
    short = [{**r, "train_len": "64"} for r in model]
    assert {r["status"] for r in effective.accuracy_rows(short) + effective.relative_rows(short)} == {"no reference"}
    # A model at chance at its own context: no absolute length, and no relative one either.
    weak = [{**r, "hits": "2"} if r["eval_len"] == "8" else r for r in model]
    assert [(r["effective_len"], r["status"]) for r in effective.accuracy_rows(weak) + effective.relative_rows(weak)] \
        == [(None, "no reference")] * 2


def test_the_pretrained_table_reads_rulers_effective_length_both_ways(tmp_path):
    from posbench import probing, tables

    def cell(policy, n, hits):
        counts = {"hits": hits, "answers": 50, "exact": 0, "trials": 10}
        return {**probing.verdict_columns(counts), **counts, "run_id": "hf:m@0", "task": "pretrained",
                "probe": "ruler:vt", "spec": "ruler:vt", "scheme": "m", "params": "", "seed": 0, "train_len": 8192,
                "eval_len": n, "ratio": n / 8192, "variant": "", "chance": 0.0, "scaling": policy,
                "extension": "none", "status": "ok", "position_draws": 0}
    # none: 90% at 8k, 30% at 16k; yarn: 80% at 8k, 70% at 16k (>= 85% of its own 80%, below 85.6%)
    results.merge_rows(tmp_path, "probes", [cell("none", 8192, 45), cell("none", 16384, 15),
                                            cell("yarn", 8192, 40), cell("yarn", 16384, 35)])
    effective.write(tmp_path)
    text = tables.table("pretrained", tmp_path)  # a folder of prompts alone: no perplexity sections
    assert "| ruler:vt | none | 90% | 8192 (1x) at 85.6% | 8192 (1x) at 76.5% |" in text
    assert "| ruler:vt | yarn | 80% | - | ≥16384 (2x) at 68.0% |" in text
    assert "### RULER's synthetic tasks" in text and "Perplexity" not in text and "### Passkey" not in text


def test_report_cells_show_seed_intervals_or_one_seed_as_such():
    rows = [ext_row("a", s, 64, p, loss_se=0.01) for s, p in enumerate([10.0, 11.0, 12.0])]
    rows += [ext_row("b", 0, 64, 20.0, loss_se=0.05), ext_row("b", 0, 128, 30.0, loss_se=0.05)]
    rows += [ext_row("a", s, 128, p) for s, p in enumerate([13.0, 15.0])]
    lengths, cells = ppl_grid(strings(rows), lambda t: t + "*")
    assert lengths == [64, 128]
    half = 4.302653 * 1.0 / math.sqrt(3)  # t(0.975, 2) * sd / sqrt(3), sd = 1
    assert cells[0] == ["a (3 seeds)", f"11.00 [{11 - half:.2f}, {11 + half:.2f}]*",
                        "14.00 [1.29, 26.71]* (n=2)"]  # 14 ± t(0.975, 1) * sqrt(2) / sqrt(2)
    assert cells[1] == ["b (1 seed)", "20.00 ± 1.00", "30.00 ± 1.50"]  # ppl * loss_se
    import pandas as pd

    one = pd.DataFrame(strings(acc_rows("a", 0, {64: 10})))
    assert accuracy_cell(one) == "50% (30–70)"  # Wilson, 10 of 20
    assert accuracy_cell(one.assign(position_draws="2", answers="20")) == "25% (14–40)"  # 10 of 40 answers
    several = pd.DataFrame(strings(acc_rows("a", 0, {64: 10}) + acc_rows("a", 1, {64: 12}) + acc_rows("a", 2, {64: 14})))
    assert accuracy_cell(several) == "60% [35, 85]"  # 0.6 ± 4.303 * 0.1 / sqrt(3)
    two = pd.DataFrame(strings(acc_rows("a", 0, {64: 10}) + acc_rows("a", 1, {64: 14})))
    assert accuracy_cell(two) == "60% [0, 100]"  # clipped to the possible range


def test_plot_intervals_are_the_tables(tmp_path):
    import pandas as pd

    from posbench.reporting import accuracy_interval, plot_extrapolation, plot_probe_heatmap, ppl_interval

    one = pd.DataFrame(strings([ext_row("a", 0, 64, 20.0, ppl_lo=18.0, ppl_hi=22.5)]))
    one["ppl"] = pd.to_numeric(one["ppl"])
    assert ppl_interval(one) == (20.0, 18.0, 22.5)  # one seed: the row's interval over windows
    several = pd.DataFrame({"ppl": [10.0, 12.0, 14.0]})
    mean, lo, hi = ppl_interval(several)  # 12 ± 4.303 * 2 / sqrt(3)
    assert (mean, lo, hi) == pytest.approx((12.0, 12 - 4.968, 12 + 4.968), abs=1e-3)
    assert accuracy_interval(pd.DataFrame(strings(acc_rows("a", 0, {64: 10})))) == pytest.approx(
        (0.5, 0.2993, 0.7007, 1), abs=1e-4)
    # the bands are drawn: a plot with intervals differs from one whose intervals are points
    rows = [ext_row(s, 0, n, p, ppl_lo=p * 0.8, ppl_hi=p * 1.25)
            for s, base in (("a", 20.0), ("b", 30.0)) for n, p in ((64, base), (128, base * 1.1))]
    flat = [{**r, "ppl_lo": r["ppl"], "ppl_hi": r["ppl"]} for r in rows]
    banded = plot_extrapolation(strings(rows), tmp_path / "banded.png").read_bytes()
    assert banded != plot_extrapolation(strings(flat), tmp_path / "flat.png").read_bytes()
    df = pd.DataFrame(strings(acc_rows("a", 0, {64: 10, 128: 0})))
    df["label"] = "a"
    df["eval_len"] = df["eval_len"].astype(int)
    df["accuracy"] = pd.to_numeric(df["accuracy"])
    assert plot_probe_heatmap(df, tmp_path / "heat.png", "t").stat().st_size > 1000


def windows(directory, scheme, seed, losses, eval_len=64, task="t", start_step=64):
    results.merge_rows(directory, "windows", [
        {"run_id": f"{scheme}-{task}-{seed}", "task": task, "scheme": scheme, "seed": seed, "train_len": 64,
         "eval_len": eval_len, "mode": "nonoverlap", "stride": 0, "scaling": "none", "extension": "none",
         "corpus": "c", "window": i, "start": i * start_step, "loss": v} for i, v in enumerate(losses)])


def test_paired_comparison_on_constructed_windows(tmp_path, capsys):
    hard = [float(i % 10) for i in range(30)]  # window difficulty dominates the spread
    for seed, (gap, noise) in enumerate([(0.05, 0.01), (0.07, -0.02), (0.06, 0.01)]):
        windows(tmp_path, "a", seed, hard)
        windows(tmp_path, "b", seed, [x + gap for x in hard])
        windows(tmp_path, "c", seed, [x + noise for x in hard])  # no difference on average
    (row,) = paired(tmp_path, "a", "b")
    assert row["seeds"] == 3 and row["windows"] == 30
    assert row["diff"] == pytest.approx(-0.06) and row["hi"] < 0 and row["verdict"] == "a better"
    assert row["lo"] == pytest.approx(-0.06 - 4.302653 * 0.01 / math.sqrt(3), abs=1e-6)
    assert row["ratio"] == pytest.approx(math.exp(-0.06))
    (same,) = paired(tmp_path, "a", "c")
    assert same["verdict"] == "no clear difference" and same["lo"] < 0 < same["hi"]
    assert main(["paired", "b", "a", "--runs-dir", str(tmp_path)]) == 0
    assert "a better" in capsys.readouterr().out
    assert main(["paired", "a", "rpoe", "--runs-dir", str(tmp_path)]) == 2
    assert "unknown scheme variant" in capsys.readouterr().err
    assert main(["paired", "a", "b", "--runs-dir", str(tmp_path), "--lengths", "128"]) == 2
    windows(tmp_path, "a", 0, hard, task="other")  # a second run of a with seed 0
    assert main(["paired", "a", "b", "--runs-dir", str(tmp_path)]) == 2
    assert "--task" in capsys.readouterr().err
    assert paired(tmp_path, "a", "b", task="t")[0]["verdict"] == "a better"


def test_paired_with_one_seed_pairs_windows(tmp_path):
    hard = [float(i % 10) for i in range(30)]
    windows(tmp_path, "a", 0, hard)
    windows(tmp_path, "b", 0, [x + 0.05 + (0.001 if i % 3 else 0) for i, x in enumerate(hard)])
    (row,) = paired(tmp_path, "a", "b")
    assert row["seeds"] == 1 and row["verdict"] == "a better" and row["hi"] < 0 and row["hi"] - row["lo"] < 0.01


def gate_dirs(tmp_path, base_ppls, cur_ppls):
    for name, ppls in (("base", base_ppls), ("cur", cur_ppls)):
        results.merge_rows(tmp_path / name, "extrapolation",
                           [ext_row("a", s, 64, p, run_id=f"a-{s}") for s, p in enumerate(ppls)])
    return compare(tmp_path / "base", tmp_path / "cur", rtol=0.05)


def test_gate_uses_the_baseline_spread_with_seeds_and_rtol_without(tmp_path):
    # Three seeds, sd 1 around 10: the bound is t(2) * 1 * sqrt(1/3 + 1/3) = 3.51 for three current seeds.
    wide = gate_dirs(tmp_path / "w", [9.0, 10.0, 11.0], [12.0, 13.0, 13.0])  # +27%, inside 13.51
    assert wide.regressions == 0 and wide.rows[0]["verdict"] == "same" and wide.rows[0]["seed"] == "0,1,2"
    assert gate_dirs(tmp_path / "o", [9.0, 10.0, 11.0], [14.0, 14.0, 13.0]).regressions == 1  # 13.67 > 13.51
    # A tight baseline flags a change smaller than rtol.
    tight = gate_dirs(tmp_path / "t", [10.0, 10.01, 9.99], [10.2, 10.2, 10.2])  # +2%
    assert tight.regressions == 1 and tight.rows[0]["verdict"] == "worse"
    assert gate_dirs(tmp_path / "b", [10.0, 10.01, 9.99], [9.5, 9.5, 9.5]).rows[0]["verdict"] == "better"
    # One seed: rtol.
    assert gate_dirs(tmp_path / "1", [10.0], [10.4]).regressions == 0
    assert gate_dirs(tmp_path / "2", [10.0], [10.6]).regressions == 1


def test_committed_one_seed_baseline_passes_against_itself():
    from pathlib import Path

    base = Path(__file__).parents[1] / "results" / "baseline" / "ci"
    out = compare(base, base)
    assert out.regressions == 0 and all("change" in e for e in out.rows if e["verdict"] == "same" and e["current"])


@pytest.mark.parametrize("folder", sorted(str(p.parent.relative_to(RESULTS))
                                          for p in RESULTS.glob("**/effective_length.csv")))
def test_each_committed_effective_length_is_what_its_rows_give(folder):
    """A results folder's effective_length.csv holds the rows that its extrapolation.csv and
    probes.csv give under today's rules, no more (`posbench report DIR` rewrites it)."""
    d = RESULTS / folder
    probes = results.read_probes(d)
    made = (effective.perplexity_rows(results.read_rows(results.table_path(d, "extrapolation")))
            + effective.accuracy_rows(probes) + effective.relative_rows(probes))

    def keyed(rows):
        return {(r["run_id"], r["protocol"], r["scaling"], r["extension"]):
                (str(r["effective_len"] or ""), r["status"], r["basis"]) for r in rows}

    assert keyed(results.read_rows(d / "effective_length.csv")) == keyed(made), f"run `posbench report results/{folder}`"



def test_a_perplexity_interval_never_reaches_below_1():
    from posbench.evaluate import loss_interval
    from posbench.tables import table

    # three windows far apart: mean loss 1.0, t(2) * se = 4.303 * 0.9 / sqrt(3) = 2.24 reaches past 0
    row = loss_interval(1.0, [0.1, 1.0, 1.9], 1)
    assert row["ppl_lo"] == 1.0 and row["ppl_hi"] > math.e
    tight = loss_interval(1.0, [0.99, 1.0, 1.01], 1)
    assert math.e ** 0.9 < tight["ppl_lo"] < math.e  # a bound above 0 keeps its value
    # the committed key-token rows were written with bounds below 1: the table reads them at 1
    text = table("pretrained", RESULTS / "pretrained/key-tokens")
    assert "| yarn | 4.09 [1.00, 25.79] (3 w) |" in text and "[0.6" not in text
