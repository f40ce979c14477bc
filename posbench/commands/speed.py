"""posbench speed: each scheme's attention layer timed, forward and forward+backward."""

from pathlib import Path
from typing import Sequence

import pandas as pd

from posbench import config, results
from posbench.commands import console, failed, plain
from posbench.commands import frame as to_frame
from posbench.commands.options import Device, Out, Schemes, Task, load_plugins, names, settings, takes

# its line in posbench/docs/commands.md, and the pages that explain it
SUMMARY = "time each scheme's attention layer, forward and backward"
PAGES = ('gpu.md',)


@takes(config.SpeedConfig)
def speed(
    *,
    schemes: Schemes = None,
    task: Task = None,
    device: Device = "auto",
    out: Out = None,
    plugins: Sequence[str] = (),
    **given,
) -> pd.DataFrame:
    """Time each scheme's attention layer (hooks included), forward and forward+backward (default:
    every scheme; none always joins); speed.csv and speed.png in --out (default runs). A cell that
    runs out of memory or that its scheme declines is a result; one that raises otherwise (a
    plug-in's hook, say) is recorded as failed and the command exits 1 naming it."""
    from posbench.timing import run_speed

    load_plugins(plugins)
    s = settings(config.load_task(task).speed, given)
    chosen = names(schemes)
    out_dir = Path(out or "runs")
    rows = run_speed(schemes=list(chosen) if chosen else None, lengths=s.lengths, batch_size=s.batch_size,
                     heads=s.heads, head_dim=s.head_dim, dtype=s.dtype, device=device, backward=s.backward,
                     repeats=s.repeats, compile=s.compile, out_dir=out_dir)
    return to_frame(rows, out=out_dir)


def show(result: pd.DataFrame) -> int:
    from posbench.timing import print_speed

    print_speed(result.attrs["rows"], console)
    out = result.attrs["out"]
    plain(f"wrote {out / 'speed.csv'}, {out / 'speed.png'}")
    return failed(results.failed_line(result.attrs["rows"], out / "speed.csv", "cell",
                                      lambda r: f"{r['scheme']} {r['pass']} at {r['seq_len']}", "scheme"))
