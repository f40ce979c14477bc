"""posbench probe: the synthetic probes' accuracy by prompt length for every run trained on them."""

from pathlib import Path
from typing import Annotated, Optional, Sequence

import pandas as pd
import typer
from rich.table import Table

from posbench import config, plugins, results
from posbench.commands import console, failed, plain
from posbench.commands import frame as to_frame
from posbench.commands.extrapolate import note_scalings
from posbench.commands.options import Device, Model, ModelDtype, Out, Resume, RunsDir, Schemes, Task, load_plugins, \
    models, reading, names, settings, takes
from posbench.errors import PosbenchError

# its line in posbench/docs/commands.md, and the pages that explain it
SUMMARY = "synthetic retrieval and algorithmic probes, accuracy by length"
PAGES = ('probes.md',)


@takes(config.ProbesConfig, config.EvalConfig, only=("lengths", "trials", "seed", "ruler_essay", "prompts", "position_draws",
                                                     *config.POLICY_FLAGS))
def probe(
    probe: Annotated[Optional[str], typer.Option(help="probe names, comma-separated (see --list)")] = None,
    *,
    list_: Annotated[bool, typer.Option("--list", help="list the probes (those of --probe, or every one): what each "
                                                       "reads, settings and reference")] = False,
    runs_dir: RunsDir = Path("runs"),
    task: Task = None,
    schemes: Schemes = None,
    model: Model = None,
    dtype: ModelDtype = None,
    device: Device = "auto",
    out: Out = None,
    plugins: Sequence[str] = (),
    progress: bool = False,
    resume: Resume = False,
    **given,
) -> pd.DataFrame:
    """Synthetic probes: per-answer accuracy and exact match by prompt length of every run trained
    on a probe's examples (lengths default to 1x, 2x, 4x, 8x each run's); a table per probe,
    probes.csv, one heatmap per probe and report.md (--out, default the runs folder). With
    --model, the passkey test of a pretrained model (natural-language filler, greedy decoding) and
    RULER's synthetic tasks (--probe ruler:TASK, e.g. ruler:niah_single_1, ruler:cwe)."""
    from posbench import readings, reporting

    load_plugins(plugins)
    chosen = names(probe) if probe else None
    if list_:
        return to_frame(catalogue(chosen), listing=True)
    if not chosen:
        raise PosbenchError("name probes with --probe NAME[,NAME] (see `posbench probe --list`)")
    t = reading(task, model)
    which = models(t, task, runs_dir, schemes, model, dtype, device)
    check_names(chosen, which.pretrained)
    cfg = settings(t.probes, given)
    eval_cfg = settings(t.eval, {k: given.get(k) for k in ("position_draws", *config.POLICY_FLAGS)})
    out_dir = Path(out or runs_dir)
    rows = readings.probe(which, chosen, cfg, eval_cfg, cfg.lengths or t.eval.lengths, out_dir, progress, resume)
    reporting.write_report(out_dir, t.eval.effective_tolerance, t.eval.effective_threshold, t.eval.effective_share)
    return to_frame(rows, eval=eval_cfg, out=out_dir)


def check_names(chosen: tuple[str, ...], model: bool) -> None:
    """One line for a probe that is not one, or not one for this kind of model (what it reads:
    posbench's symbols for trained runs, text for a pretrained model; posbench.probes.text)."""
    from posbench.probes.text import find

    for name in chosen:
        find(name, model)


def catalogue(chosen: Optional[Sequence[str]] = None) -> list[dict[str, str]]:
    """A row per probe, symbolic and text, each with what it reads: those named, or every one."""
    from posbench.probes import parse_probe
    from posbench.probes.text import READS, SYMBOLS, entries, listing

    named = {}
    for name in chosen or ():
        for e in entries(name):
            if e.reads == SYMBOLS:
                parse_probe(name)  # its options
            named.setdefault((e.name, e.reads), e)
    return [{"name": e.name, "reads": READS[e.reads], "what it asks": e.summary,
             "default settings": parse_probe(e.name).settings() if e.reads == SYMBOLS else e.settings,
             "reference": e.reference, "source": plugins.describe(e)}
            for e in (named.values() if chosen else listing())]


def show(result: pd.DataFrame) -> int:
    from posbench import reporting

    rows = result.attrs["rows"]
    if result.attrs.get("listing"):
        table = Table(title="posbench probes (--probe NAME[:key=value,...]), each with what it reads", show_lines=True)
        for col in rows[0]:
            table.add_column(col, overflow="fold")
        for row in rows:
            table.add_row(*row.values())
        console.print(table)
        return 0
    for table in reporting.probe_tables(rows):
        console.print(table)
    note_scalings(rows, result.attrs["eval"].rope_scaling)
    out = result.attrs["out"]
    plain(f"wrote {results.table_path(out, 'probes')}, probe_*.png and {out / 'report.md'}")
    return failed(results.failed_line(rows, results.table_path(out, "probes")))
