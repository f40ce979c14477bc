"""posbench inspect: pictures of each encoding past the training length, or of trained runs."""

from pathlib import Path
from typing import Annotated, Optional, Sequence

import pandas as pd
import typer
from rich.markup import escape

from posbench import config
from posbench.commands import console, failed, plain
from posbench.commands import frame as to_frame
from posbench.commands.options import RUNS_DIR, Device, Task, ints, load_plugins, names, scheme_names
from posbench.errors import PosbenchError

# its line in posbench/docs/commands.md, and the pages that explain it
SUMMARY = "pictures of each encoding past L; a trained run's learned parameters and its attention by length"
PAGES = ('inspect.md',)


def inspect(
    schemes: Annotated[Optional[str], typer.Argument(help="schemes, presets or layouts, comma-separated")] = None,
    *,
    run: Annotated[Optional[str], typer.Option(help="a trained run's run_id (in --runs-dir): its learned "
                                                    "parameters and its attention by length")] = None,
    runs_dir: Annotated[Optional[Path], typer.Option(help=RUNS_DIR)] = None,
    task: Task = None,
    train_len: Annotated[Optional[int], typer.Option(help="training length L, marked on every picture (default "
                                                          "the task's)")] = None,
    lengths: Annotated[Optional[str], typer.Option(help="without a run: draw to the longest (default 16 L); with "
                                                        "a run: lengths to measure attention at (default L,2L,..,16L)")] = None,
    rope_scaling: Annotated[Optional[str], typer.Option(help="rotary schemes drawn under these scalings too, "
                                                             "comma-separated")] = None,
    device: Device = "auto",
    out: Annotated[Path, typer.Option(help="where the PNGs and inspect.md go")] = Path("inspect"),
    plugins: Sequence[str] = (),
    progress: bool = False,
) -> pd.DataFrame:
    """Pictures of each encoding past the training length (absolute tables, rotary logits and
    pair angles, biases); with a trained run (--run RUN_ID in --runs-dir, default runs), or every
    run of SCHEMES (or all) in --runs-dir, its learned parameters and its attention by length
    (entropy, distance, sink and far mass in attention.csv); inspect.md links them.

    One row per picture (scheme, kind, caption, path); `attrs["pictures"]` holds the arrays drawn."""
    from posbench import inspection, layout
    from posbench.policies import from_eval

    load_plugins(plugins)
    t = config.load_task(task)
    chosen = names(schemes)
    out_dir = Path(out)
    if run is None and runs_dir is None:
        if not chosen:
            raise PosbenchError("name the schemes to draw (e.g. rope,alibi), or a trained run with --run / --runs-dir")
        checked = [layout.check(n) for n in chosen]
        scalings = [from_eval(k, t.eval) for k in names(rope_scaling) or ()]
        if train_len is not None and not 1 <= train_len <= inspection.MAX_POSITIONS:
            raise PosbenchError(f"--train-len must be between 1 and {inspection.MAX_POSITIONS}, got {train_len}")
        dims = inspection.dims_for(t, train_len)
        n = max(ints(lengths, "lengths") or (16 * dims.train_len,))
        if not 2 <= n <= inspection.MAX_POSITIONS:
            raise PosbenchError(f"draw to between 2 and {inspection.MAX_POSITIONS} positions, not {n} "
                                "(the pictures hold n x n matrices)")
        drawn = inspection.inspect_schemes(checked, dims, n, out_dir, scalings)
        notes = [f"Drawn by `posbench inspect` with the {t.name} task's model (d_model {dims.d_model}, "
                 f"{dims.n_heads} heads of {dims.head_dim}); training length L = {dims.train_len} (dashed), "
                 f"to {n} positions."]
        path = inspection.markdown(drawn, out_dir, "What each encoding looks like", notes)
    else:
        path, drawn = inspection.inspect_runs(_runs(run, runs_dir, chosen), t, ints(lengths, "lengths"), out_dir,
                                              device, progress)
    rows = [{"scheme": p.scheme, "kind": p.kind, "caption": p.caption, "path": str(p.path or "")} for p in drawn]
    return to_frame(rows, pictures=drawn, page=str(path))


def _runs(run: str | None, runs_dir: Path | None, chosen: tuple[str, ...] | None) -> list[Path]:
    from posbench.readers import find_runs

    home = Path(runs_dir or "runs")
    if run is not None and chosen:
        raise PosbenchError("name schemes (with --runs-dir: its runs of them) or one run with --run, not both")
    if run is not None:
        if not (home / run / "config.json").exists():
            raise PosbenchError(f"no run {run!r} in {home}")
        return [home / run]
    runs = find_runs(home, scheme_names(chosen))
    if not runs:
        raise PosbenchError(f"no finished runs{' of ' + ', '.join(chosen) if chosen else ''} in {home}")
    return runs


def show(result: pd.DataFrame) -> int:
    for row in result.attrs["rows"]:
        console.print(f"{row['scheme']:24} {row['kind']:16} {row['path'] or escape(row['caption'])}",
                      soft_wrap=True, highlight=False)
    plain(f"wrote {result.attrs['page']}")
    return failed("; ".join(r["caption"] for r in result.attrs["rows"] if r["kind"] == "failed") or None)
