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
    names, scheme_names, settings, takes, task_folder, trained_only
from posbench.errors import PosbenchError

# its line in posbench/docs/commands.md, and the pages that explain it
SUMMARY = "synthetic retrieval and algorithmic probes, accuracy by length"
PAGES = ('probes.md',)


@takes(config.ProbesConfig, config.EvalConfig, only=("lengths", "trials", "seed", "ruler_essay", "position_draws",
                                                     *config.POLICY_FLAGS))
def probe(
    probe: Annotated[Optional[str], typer.Option(help="probe names, comma-separated (see --list)")] = None,
    *,
    list_: Annotated[bool, typer.Option("--list", help="list the probes (those of --probe, or every one): settings "
                                                       "and reference")] = False,
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
    from posbench import probing, reporting
    from posbench.probes import probe_name

    load_plugins(plugins)
    chosen = names(probe) if probe else None
    if list_:
        return to_frame(catalogue(chosen), listing=True)
    if not chosen:
        raise PosbenchError("name probes with --probe NAME[,NAME] (see `posbench probe --list`)")
    t = config.load_task(task or ("pretrained" if model else None))
    check_names(chosen, bool(model or t.pretrained))
    cfg = settings(t.probes, given)
    eval_cfg = settings(t.eval, {k: given.get(k) for k in ("position_draws", *config.POLICY_FLAGS)})
    out_dir = Path(out or runs_dir)
    if model or t.pretrained:
        from posbench import pretrained
        from posbench.device import resolve_device

        dev, rows, precision = resolve_device(device), [], dtype or t.pretrained_dtype
        results.check_folder(out_dir)  # before the model loads: a refusal is the command's one line
        for name in chosen:
            if name == "passkey":
                rows += pretrained.passkey(model or t.pretrained, cfg, eval_cfg, cfg.lengths or t.eval.lengths,
                                           out_dir, t.name, progress, task_folder(task), resume, dev, precision)
            else:
                rows += pretrained.ruler_probe(name, model or t.pretrained, cfg, eval_cfg, cfg.lengths or t.eval.lengths,
                                               out_dir, t.name, progress, task_folder(task), resume, dev, precision)
    elif resume:
        raise PosbenchError("--resume keeps the rows of a pretrained model's prompts (--model); a trained run's "
                            "probes are scored again in seconds")
    else:
        trained_only(dtype)
        rows = probing.evaluate(Path(runs_dir), cfg, eval_cfg, tuple(probe_name(n) for n in chosen),
                                scheme_names(schemes), out_dir, device, progress=progress)
    reporting.write_report(out_dir, t.eval.effective_tolerance, t.eval.effective_threshold, t.eval.effective_share)
    return to_frame(rows, eval=eval_cfg, out=out_dir)


def check_names(chosen: tuple[str, ...], model: bool) -> None:
    """One line for a probe that is not one, or not one for this kind of model: RULER's tasks
    (ruler:TASK) read text and are for pretrained models; the passkey test reads either; the
    other probes are written in posbench's symbol vocabulary for the models it trains."""
    from posbench import ruler
    from posbench.probes import parse_probe

    for name in chosen:
        if ruler.is_ruler(name):
            ruler.task_of(name)
            if not model:
                raise PosbenchError(f"{name} is one of RULER's prompts for a pretrained model: add --model")
        elif model and name != "passkey":
            parse_probe(name)
            raise PosbenchError(f"a pretrained model takes --probe passkey or ruler:TASK (ruler:{', ruler:'.join(ruler.TASKS)}):"
                                f" {name} is written in posbench's symbol vocabulary for the models it trains")
        else:
            parse_probe(name)


def catalogue(chosen: Optional[Sequence[str]] = None) -> list[dict[str, str]]:
    """A row per probe: those named, or every one."""
    from posbench import ruler
    from posbench.probes import PROBES, parse_probe, probe_name

    for spec in chosen or ():
        if ruler.is_ruler(spec):
            raise PosbenchError(f"{spec} is one of RULER's prompts for a pretrained model; --list lists the probes "
                                f"posbench trains models on")
        parse_probe(spec)
    named = dict.fromkeys(probe_name(spec) for spec in chosen) if chosen else sorted(PROBES)
    return [{"name": name, "what it asks": (p := parse_probe(name)).summary, "default settings": p.settings(),
             "reference": p.reference, "source": plugins.describe(PROBES[name])}
            for name in named]


def show(result: pd.DataFrame) -> int:
    from posbench import reporting

    rows = result.attrs["rows"]
    if result.attrs.get("listing"):
        table = Table(title="posbench probes (data spec: NAME[:key=value,...])", show_lines=True)
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
