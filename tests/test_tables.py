"""posbench.tables: each table renders from its committed results folder and is, byte for byte,
the table committed in that folder's README (so a README table that drifts from its CSVs fails
here); every `posbench table` command the documentation names is a table with its options; bad
names and options are one clear line."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pandas as pd
import pytest

from posbench import reporting, results, stats, tables
from posbench.errors import PosbenchError
from posbench.tables import table

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "results"
# The seed-paired readings of results/probes/seeds/README.md, in the order of its table.
SEED_PAIRS = ("none:rope:passkey,none:rope:multivalue,none:rope:vartrack,none:rope:sort,none:kerple:sort,"
              "kerple:none:copy,rope+randomized:rope:mqar,rope+randomized:rope:passkey,"
              "rope+randomized:rope:multivalue,rope+randomized:rope:vartrack,rope+randomized:rope:copy,"
              "rope+randomized:rope:sort,rope+randomized:rope+yarn:mqar,fox:rope:passkey,kerple:rope:passkey,"
              "alibi:rope:passkey,kerple:fox:passkey,fox:fire:passkey,kerple:fire:passkey,kerple:rope:mqar")


def markdown_tables(text: str) -> list[str]:
    """Every markdown table of `text`: runs of lines that start with `|`."""
    found, current = [], []
    for line in text.splitlines():
        if line.startswith("|"):
            current.append(line)
        elif current:
            found.append("\n".join(current))
            current = []
    if current:
        found.append("\n".join(current))
    return found


def readme_table(readme: Path, header: str, nth: int = 0) -> str:
    """The `nth` table of `readme` whose first line is `header`."""
    found = [t for t in markdown_tables(readme.read_text(encoding="utf-8")) if t.splitlines()[0] == header]
    assert len(found) > nth, f"{readme.relative_to(REPO)} has no table headed {header!r}"
    return found[nth]


def assert_in_readme(rendered: str, readme: Path, nth: dict[int, int] | None = None) -> None:
    """Each table of `rendered` equals the README's table with the same header line, and a width
    line the README quotes under a table is the one printed under it."""
    parts = markdown_tables(rendered)
    assert parts, "no table rendered"
    text = readme.read_text(encoding="utf-8")
    for i, part in enumerate(parts):
        committed = readme_table(readme, part.splitlines()[0], (nth or {}).get(i, 0))
        assert part == committed, (f"{readme.relative_to(REPO)}: the table headed {part.splitlines()[0]!r} "
                                   "differs from what its CSVs give (regenerate it with `posbench table`)")
        quoted = text[text.index(committed) + len(committed):].lstrip("\n").partition("\n")[0]
        if quoted.startswith(WIDTH):
            printed = rendered[rendered.index(part) + len(part):].lstrip("\n").partition("\n")[0]
            assert quoted == printed, f"{readme.relative_to(REPO)}: the width line under {part.splitlines()[0]!r}"


WIDTH = "Median width of the 95% intervals over seeds"


FRONTIER_PAIRS = ",".join(f"{s}:rope:{p}" for s in ("selective-rope", "grape", "rope+sink", "rope+gate")
                          for p in ("mqar", "passkey", "multivalue"))
PROBE_2026 = "rope,rope-pp,rope-pp(variant=ec),accum-rope,repo"

# (README, table, folder, options): every README table these make, regenerated from its folder
CASES = [
    ("README.md", "headline", ".", {}),
    ("README.md", "probes", "probes/seeds", {"seeds": True, "compact": True, "task": "probe-seeds", "ratios": "2,4,8"}),
    ("probes/README.md", "probes", "probes", {}),
    ("probes/seeds/README.md", "probes", "probes/seeds", {"seeds": True, "task": "probe-seeds"}),
    ("probes/seeds/README.md", "probes", "probes/seeds", {"task": "probe-seeds", "ratios": "2,4,8", "pairs": SEED_PAIRS}),
    ("probes/seeds/README.md", "probes", ("probes/seeds", "probe-frontier"),
     {"seeds": True, "task": "probe-frontier-seeds", "nth": {0: 1}}),
    ("probes/seeds/README.md", "probes", ("probes/seeds", "probe-frontier"), {"ratios": "2,4,8", "pairs": FRONTIER_PAIRS, "nth": {0: 1}}),
    ("probes/lr/README.md", "probes", "probes/lr", {"task": "probe-lr", "sweep": True}),
    ("probes/aggregation/README.md", "probes", "probes/aggregation/grid", {"seeds": True, "task": "probe-aggregation"}),
    ("probes/aggregation/README.md", "probes", "probes/aggregation/grid", {"task": "probe-aggregation", "ratios": "2,4,8",
     "pairs": "fire:rope:cwe,rope+yarn:rope:cwe,rope+randomized:rope:cwe,fire:alibi:cwe,fire:kerple:cwe,"
              "rope+yarn:rope:fwe,kerple:rope:fwe,fox:rope:fwe,fire:rope:fwe"}),
    ("probe-2026/README.md", "probes", "probe-2026",
     {"seeds": True, "compact": True, "task": "probe-2026", "ratios": "2,4,8", "schemes": PROBE_2026}),
    ("probe-2026/README.md", "probes", "probe-2026", {"seeds": True, "task": "probe-2026", "schemes": PROBE_2026}),
    ("extend-passkey/README.md", "extend", "extend-passkey", {}),
    ("pretrained/README.md", "pretrained", "pretrained", {"nth": {7: 1}}),  # the bfloat16 model's probe lengths
    ("pretrained/key-tokens/README.md", "pretrained", "pretrained/key-tokens", {}),
    ("attention/README.md", "attention", "attention",
     {"schemes": "none,sinusoidal,learned,rope,rope+logn,rope+ssmax,alibi,t5,uniform"}),
    ("attention/README.md", "attention", "attention",
     {"by_layer": "entropy_norm", "schemes": "none,sinusoidal,rope,rope+logn,rope+ssmax,alibi,t5", "lengths": "64,1024"}),
]


@pytest.mark.parametrize("readme, name, folder, opts", CASES,
                         ids=[f"{c[1]}-{c[0].split('/')[0]}-{i}" for i, c in enumerate(CASES)])
def test_each_readme_table_is_what_its_results_folder_gives(readme, name, folder, opts):
    path = REPO / readme if readme == "README.md" else RESULTS / readme
    opts = dict(opts)
    nth = opts.pop("nth", None)  # {i: k}: the i-th rendered table is the README's k-th of its header
    dirs = [RESULTS / f for f in folder] if isinstance(folder, tuple) else RESULTS / folder  # a tuple: read as one
    assert_in_readme(table(name, dirs, **opts), path, nth)


def test_every_table_name_has_a_committed_readme_table_or_a_rendering_test():
    # speed: test_speed_table below; scaling: tests/test_scaling.py (no committed folder yet)
    assert {c[1] for c in CASES} | {"speed", "scaling"} == set(tables.TABLES)


def test_the_headline_writes_its_figure(tmp_path):
    text = table("headline", RESULTS, figure=tmp_path / "headline.png")
    assert (tmp_path / "headline.png").stat().st_size > 0
    assert text.splitlines()[0] == "| scheme | seeds | 64 (1x) | 256 (4x) | 1024 (16x) | effective length |"


def test_speed_table(tmp_path):
    from posbench.timing import run_speed

    rows = run_speed(schemes=["alibi"], lengths=(16, 32), batch_size=1, heads=2, head_dim=8, dtype="float32",
                     device="cpu", backward=True, repeats=1, out_dir=tmp_path)
    text = table("speed", tmp_path)
    assert text == reporting.speed_markdown(pd.DataFrame(results.read_rows(tmp_path / "speed.csv")))
    assert "**fwd+bwd**" in text and "| alibi (" in text and len(rows) == 8
    assert "| scheme | 16 | 32 |\n|---|---|---|" in text


def test_the_table_over_seeds_says_how_wide_its_intervals_are():
    # widths as fractions: the 2x cells 0.30, 0.50 and 0.20 (median 30), one seed has none
    records = [{"widths": [0.05, w]} for w in (0.30, 0.50, 0.20)] + [{"widths": [None, None]}]
    assert tables.width_line(records, (1, 2)) == ("\n\nMedian width of the 95% intervals over seeds, in points: "
                                                  "1x 5 (3 cells), 2x 30 (3 cells).")
    assert tables.width_line([{"widths": [None]}], (2,)) == ""
    # a median cell of sd 0.2 at 30 points wide: 30 seeds bring it to 15 (tests/test_stats.py)
    spread = [{"widths": [0.05, 0.30], "spreads": [(0.5, 0.02, 3), (0.5, 0.2, 3)]}] * 3
    assert tables.width_line(spread, (1, 2)).endswith(
        "1x 5 (3 cells), 2x 30 (3 cells). Seeds for a median width of 15 points, each cell's mean and spread"
        " held (the interval narrows as t/sqrt(n)): 2x 30.")
    text = table("probes", RESULTS / "probes" / "seeds", seeds=True, task="probe-seeds", ratios="2")
    widths, _, projection = text.rsplit("Median width", 1)[1].partition(" Seeds for")
    width = float(widths.split("2x ", 1)[1].split()[0])
    assert (width > 15) == bool(projection)  # a projection exactly where the median is wider than 15
    assert not projection or int(projection.rsplit("2x ", 1)[1].rstrip(".")) > 10  # more seeds than it has
    cells = [re.search(r"\[(\d+), (\d+)\]", line) for line in text.splitlines()[2:] if line.startswith("|")]
    spans = sorted(int(m[2]) - int(m[1]) for m in cells if m)
    assert abs(width - spans[len(spans) // 2]) <= 2  # the cells' own (rounded) widths agree


def test_every_table_goes_through_the_one_markdown_writer():
    modules = sorted((REPO / "posbench" / "tables").glob("*.py"))
    assert len(modules) > 1
    for path in modules:
        source = path.read_text(encoding="utf-8")
        assert '" | ".join' not in source and "|---" not in source, path.name


# ---- the commands the documentation names -------------------------------------------------------

def documented_commands() -> list[tuple[Path, str]]:
    pages = [REPO / "README.md", *sorted((REPO / "posbench" / "docs").glob("*.md")), *sorted(RESULTS.rglob("README.md"))]
    found = []
    for page in pages:
        text = page.read_text(encoding="utf-8").replace("\\\n", " ")
        for match in re.finditer(r"posbench table [^`#\n]*", text):
            if not match.group(0).startswith(("posbench table NAME", "posbench table [OPTIONS]")):  # synopses
                found.append((page, match.group(0).strip()))
    return found


def parse(command: str) -> tuple[str, list[str], dict]:
    """`posbench table NAME DIR... [--option [VALUE]]...` as table()'s arguments, as the CLI reads it."""
    words = shlex.split(command)[2:]
    name, rest = words[0], words[1:]
    known = tables.options(name)
    dirs = []
    while rest and not rest[0].startswith("--"):
        dirs.append(rest.pop(0))
    opts = {}
    while rest:
        key = rest.pop(0)[2:].replace("-", "_")
        if isinstance(known.get(key), bool):
            opts[key] = True
        else:
            opts[key] = rest.pop(0)
    return name, dirs, opts


def test_every_documented_table_command_names_a_table_and_its_options():
    commands = documented_commands()
    assert len(commands) >= 10
    for page, command in commands:
        name, dirs, opts = parse(command)
        known = tables.options(name)  # an unknown name raises
        unknown = set(opts) - set(known)
        assert not unknown, f"{page.relative_to(REPO)}: `{command}` has options {unknown} the {name} table lacks"
        assert dirs, f"{page.relative_to(REPO)}: `{command}` names no folder"


@pytest.mark.slow
def test_the_documented_commands_on_committed_folders_give_the_readme_tables():
    """`posbench table NAME results/...` lines in a README: run as written, their tables are there."""
    checked = 0
    for page, command in documented_commands():
        name, dirs, opts = parse(command)
        if page.name != "README.md" or not all(d.startswith("results") and (REPO / d).is_dir() for d in dirs):
            continue
        if name == "headline":  # its table is the README's (results/catalogue names the command too)
            opts.pop("figure", None)  # the test writes no figure into the repository
            page = REPO / "README.md"
        tables_here = markdown_tables(page.read_text(encoding="utf-8"))
        for part in markdown_tables(table(name, [REPO / d for d in dirs], **opts)):  # any table of its header
            assert part in tables_here, f"{page.relative_to(REPO)}: `{command}` gives a table that is not there"
        checked += 1
    assert checked >= 5


# ---- bad input: one clear line ------------------------------------------------------------------

def one_line(call, *match: str) -> str:
    with pytest.raises(PosbenchError) as caught:
        call()
    text = str(caught.value)
    assert "\n" not in text
    for m in match:
        assert m in text, text
    return text


def test_unknown_table_names_the_nearest():
    one_line(lambda: table("probe", RESULTS / "probes"), "unknown table 'probe'", "did you mean 'probes'",
             "known: attention, extend, headline, pretrained, probes, scaling, speed")
    one_line(lambda: tables.options("headlines"), "did you mean 'headline'")


def test_unknown_option_names_the_nearest():
    one_line(lambda: table("probes", RESULTS / "probes", ratio="2,4"),
             "unknown option of the probes table 'ratio'", "did you mean 'ratios'")
    one_line(lambda: table("attention", RESULTS / "attention", bylayer="entropy"), "did you mean 'by_layer'")
    one_line(lambda: table("speed", RESULTS / "probes", lengths="1,2"), "the speed table takes no options")
    one_line(lambda: table("pretrained", RESULTS / "pretrained", x=1), "the pretrained table takes no options")


@pytest.mark.parametrize("call, matches", [
    (lambda: table("probes", RESULTS / "probes", ratios="two"), ("bad ratios 'two'",)),
    (lambda: table("probes", RESULTS / "probes", ratios=""), ("bad ratios '': empty",)),
    (lambda: table("probes", RESULTS / "probes", compact=True), ("give seeds too",)),
    (lambda: table("probes", RESULTS / "probes/seeds", pairs="rope-none-copy"), ("bad pair 'rope-none-copy'",)),
    (lambda: table("probes", RESULTS / "probes/seeds", pairs="rope:nope:copy"), ("no scored rows of nope on copy",)),
    (lambda: table("probes", [RESULTS / "probes", RESULTS / "probes/seeds"]), ("only with seeds or pairs",)),
    (lambda: table("probes", RESULTS / "probes", curves="mqar"), ("no runs of mqar with a log",)),
    (lambda: table("probes", RESULTS / "probes", curves="copy", every=0), ("bad every 0",)),
    (lambda: table("extend", RESULTS / "extend", pairs="yarn"), ("bad pairs yarn: expected A:B",)),
    (lambda: table("extend", RESULTS / "extend", lengths="64,x"), ("bad lengths '64,x'",)),
    (lambda: table("extend", RESULTS / "pretrained" / "nowhere"), ("no such results folder",)),
    (lambda: table("extend", [RESULTS / "extend", RESULTS / "extend"]), ("reads one results folder (got 2)",)),
    (lambda: table("attention", RESULTS / "attention", by_layer="entropi"), ("did you mean 'entropy'",)),
    (lambda: table("attention", RESULTS / "attention", schemes="rope,ropee"), ("unknown scheme in the attention table 'ropee'",)),
    (lambda: table("attention", RESULTS / "probes"), ("no attention.csv rows", "posbench extrapolate --attention",)),
    (lambda: table("speed", RESULTS / "probes"), ("no speed.csv rows",)),
    (lambda: table("pretrained", RESULTS / "probes"), ("no rows of a pretrained model",)),
    (lambda: table("headline", RESULTS / "probes"), ("no extrapolation.csv rows in", "posbench run catalogue",)),
])
def test_bad_options_and_folders_are_one_line(call, matches):
    one_line(call, *matches)


@pytest.mark.parametrize("name", sorted(tables.TABLES))
def test_an_empty_folder_is_one_line(name, tmp_path):
    one_line(lambda: table(name, tmp_path), str(tmp_path))


# ---- seed-paired verdicts: Benjamini-Hochberg, machine kinds, the two gates for "learned" ---------

def pair_rows(text: str) -> dict[tuple[str, ...], dict[str, str]]:
    """(A, B, probe, ratio) -> the row's cells by column, of a seed-paired table."""
    lines = markdown_tables(text)[0].splitlines()
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = [dict(zip(head, (c.strip() for c in line.strip("|").split("|")))) for line in lines[2:]]
    return {(r["A"], r["B"], r["probe"], r["ratio"]): r for r in rows}


def test_a_nominal_verdict_that_fails_benjamini_hochberg_is_at_the_edge():
    from posbench.pairing import SeedPair, seed_pairs_table

    lead = [12, 30, -5, 8, 1, 22, 15, -2, 40, 9]  # interval [+3, +23]; exact permutation p 0.0137
    p = stats.permutation_test(lead)
    assert stats.mean_interval(lead).lo > 0 and p < 0.05
    same = dict.fromkeys(range(10), True)
    alone = seed_pairs_table([SeedPair(["a", "b", "x", "2x"], dict(enumerate(lead)), same)])
    assert pair_rows(alone)[("a", "b", "x", "2x")]["verdict"] == "holds"  # a family of one: q = p
    nulls = [SeedPair(["a", "b", "x", f"{k}x"], dict(enumerate([1, -1] * 5)), same) for k in range(3, 7)]
    family = seed_pairs_table([SeedPair(["a", "b", "x", "2x"], dict(enumerate(lead)), same), *nulls])
    row = pair_rows(family)[("a", "b", "x", "2x")]
    assert row["q (BH)"] == f"{5 * p:.3f}" and row["verdict"] == "at the edge"  # q = 0.068: five tests
    assert "family of 5 comparisons" in family and "at the edge: the interval clear of zero" in family
    # three seeds: no permutation p is below 0.25, so a clear interval is read as the interval only
    three = seed_pairs_table([SeedPair(["a", "b", "x", "2x"], {0: 50, 1: 52, 2: 48}, dict.fromkeys(range(3), True))])
    assert pair_rows(three)[("a", "b", "x", "2x")]["verdict"] == "interval only" and "2/2^n" in three


def test_a_verdict_that_rests_on_cross_kind_pairs_says_so():
    from posbench.pairing import SeedPair, seed_pairs_table

    diffs = {s: (30 + s if s < 8 else (-1) ** s * 2) for s in range(16)}  # the lead in seeds 0-7 alone
    kinds = {s: s >= 8 for s in range(16)}  # seeds 0-7 compare runs of two machine kinds
    row = pair_rows(seed_pairs_table([SeedPair(["a", "b", "x", "2x"], diffs, kinds)]))[("a", "b", "x", "2x")]
    assert row["verdict"] == "holds" and row["same kind"] == "8 of 16: does not hold"
    same = pair_rows(seed_pairs_table([SeedPair(["a", "b", "x", "2x"], diffs, dict.fromkeys(range(16), True))]))
    assert same[("a", "b", "x", "2x")]["same kind"] == "16 of 16"


@pytest.mark.slow
def test_committed_pairs_read_benjamini_hochberg_and_machine_kinds():
    rows = pair_rows(table("probes", RESULTS / "probes/seeds", task="probe-seeds", ratios="2,4,8", pairs=SEED_PAIRS))
    # fox over rope on passkey at 2x: its interval [+0, +50] clears zero (it read "holds"), p 0.051
    fox = rows[("fox", "rope", "passkey", "2x")]
    assert fox["mean [95%]"] == "+25 [+0, +50]" and fox["verdict"] == "at the edge"
    assert fox["same kind"] == "9 of 16: does not hold"  # 7 of its 16 pairs are runs of two kinds


@pytest.mark.slow
def test_the_table_over_seeds_shows_both_gates_for_learned():
    text = table("probes", RESULTS / "probes/seeds", seeds=True, task="probe-seeds")
    lines = markdown_tables(text)[0].splitlines()
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {(r["probe"], r["scheme"]): r for r in
            (dict(zip(head, (c.strip() for c in line.strip("|").split("|")))) for line in lines[2:])}
    # rope's two passkey misses both met the early stop (95% held-out) and not the probe's 90%
    assert rows[("passkey", "rope")]["learned"] == "14 of 16"
    assert rows[("passkey", "rope")]["stopped early"] == "16 of 16, 2 not learned"
    assert rows[("passkey", "none")]["stopped early"] == "16 of 16"


def test_every_committed_holds_is_a_verdict_that_survives_its_q():
    """The house rule, checkable: in every README's seed-paired table, "holds" and "reversed" stand
    only on a row whose interval clears zero and whose q (BH) is at most 0.05."""
    readmes = [REPO / "README.md", *sorted(RESULTS.rglob("README.md"))]
    checked = 0
    for readme in readmes:
        for part in markdown_tables(readme.read_text(encoding="utf-8")):
            header = part.splitlines()[0]
            if "| q (BH) |" not in header:
                continue
            if "mean [95%]" not in header:  # the scaling table: lower/higher stand on q alone
                names = [c.strip() for c in header.strip("|").split("|")]
                for line in part.splitlines()[2:]:
                    row = dict(zip(names, (c.strip() for c in line.strip("|").split("|"))))
                    if row["verdict"] in ("lower", "higher"):
                        assert float(row["q (BH)"]) <= 0.05, f"{readme.relative_to(REPO)}: {row}"
                continue
            for row in pair_rows(part).values():
                lo, hi = (float(v) for v in row["mean [95%]"].split("[")[1].rstrip("]").split(","))
                if row["verdict"] in ("holds", "reversed"):
                    assert float(row["q (BH)"]) <= 0.05 and (lo > 0 if row["verdict"] == "holds" else hi < 0), \
                        f"{readme.relative_to(REPO)}: {row}"
                checked += 1
    assert checked >= 150  # seeds (60), the frontier (36), aggregation (27), probe-2026 (45)
