"""posbench extrapolate: every trained run (or a pretrained model) scored at every length."""

from pathlib import Path
from typing import Annotated, Sequence

import pandas as pd
import typer

from posbench import config, results
from posbench.commands import console, failed, plain, say
from posbench.commands import frame as to_frame
from posbench.commands.options import Device, Model, ModelDtype, Out, RunsDir, Schemes, Task, load_plugins, \
    models, reading, settings, takes

# its line in posbench/docs/commands.md, and the pages that explain it
SUMMARY = "perplexity of the trained runs at longer lengths, eval-time RoPE scaling"
PAGES = ('evaluation.md',)


@takes(config.EvalConfig)
def extrapolate(
    *,
    runs_dir: RunsDir = Path("runs"),
    schemes: Schemes = None,
    task: Task = None,
    model: Model = None,
    dtype: ModelDtype = None,
    device: Device = "auto",
    out: Out = None,
    attention: Annotated[bool, typer.Option(
        "--attention", help="also measure attention per layer and head (entropy, distance, sink and far mass): "
                            "attention.csv and plots")] = False,
    plugins: Sequence[str] = (),
    progress: bool = False,
    **given,
) -> pd.DataFrame:
    """Evaluate every trained run on the test split at every length; CSVs, a table and plots
    (--out, default the runs folder). With --model, a pretrained model instead of trained runs."""
    from posbench import effective, readings, reporting

    load_plugins(plugins)
    t = reading(task, model)
    cfg = settings(t.eval, given)
    out_dir = Path(out or runs_dir)
    rows = readings.extrapolate(models(t, task, runs_dir, schemes, model, dtype, device), cfg, out_dir, progress,
                                attention)
    effective.write(out_dir, cfg.effective_tolerance, cfg.effective_threshold, cfg.effective_share)
    extrapolation = results.read_rows(results.table_path(out_dir, "extrapolation"))
    reporting.plot_extrapolation(extrapolation, out_dir / "extrapolation.png")
    written = [results.table_path(out_dir, t) for t in ("extrapolation", "positions", "windows", "effective_length")]
    plots = [out_dir / "extrapolation.png", out_dir / "positions.png"]
    if attention:
        from posbench import attention_measures

        measured = results.read_rows(results.table_path(out_dir, "attention"))
        attention_measures.plot(measured, out_dir / "attention.png", extrapolation)
        attention_measures.plot_layers(measured, out_dir / "attention_layers.png")
        written.append(results.table_path(out_dir, "attention"))
        plots += [out_dir / "attention.png", out_dir / "attention_layers.png"]
    reporting.plot_positions(results.read_rows(results.table_path(out_dir, "positions")), out_dir / "positions.png")
    return to_frame(rows, eval=cfg, written=[*written, *plots])


def show(result: pd.DataFrame) -> int:
    from posbench import effective, reporting

    rows, cfg = result.attrs["rows"], result.attrs["eval"]
    eff = reporting.effective_by_label(effective.perplexity_rows(rows, cfg.effective_tolerance))
    console.print(reporting.ppl_table(rows, f"perplexity, {cfg.mode}", eff))
    note_scalings(rows, cfg.rope_scaling)
    plain(f"wrote {', '.join(map(str, result.attrs['written']))}")
    return failed(results.failed_line(rows, result.attrs["written"][0]))


def note_scalings(rows: list[dict], kinds: tuple[str, ...]) -> None:
    """One line when an asked-for RoPE scaling did not apply to some runs (posbench.evaluate.scaling_note)."""
    from posbench.evaluate import scaling_note

    line = scaling_note(rows, kinds)
    if line:
        say(line, "note")
