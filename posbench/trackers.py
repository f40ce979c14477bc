"""Training curves in TensorBoard or Weights & Biases, beside log.csv (`--tracker`, `[train] tracker`).

A tracker is told each logged step (the entry log.csv gets) and closed at the end. Per step it
records the training loss, the validation loss where one was measured, the learning rate and the
tokens per second of that step; once, the run's config as hyperparameters. The run is named by
its run_id and grouped by its task. A resumed run continues the same tracker run: TensorBoard
purges the events after the checkpoint's step (a killed run may have logged past it), W&B resumes
the run whose id is the run_id. The packages are optional extras, imported only when asked for.

- TensorBoard (`pip install posbench[tensorboard]`): event files in RUNS_DIR/tensorboard/TASK/RUN_ID,
  so `tensorboard --logdir RUNS_DIR/tensorboard` shows the runs grouped by task.
- W&B (`pip install posbench[wandb]`): project `posbench` (or WANDB_PROJECT), files in RUNS_DIR/wandb.
  Offline unless the user configured W&B (WANDB_MODE, WANDB_API_KEY, or a `wandb login`);
  `wandb sync` uploads an offline run later.
"""

from __future__ import annotations

import json
import netrc
import os
import sys
from pathlib import Path
from typing import Any

from posbench.errors import PosbenchError

PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb"}  # tracker -> the module it needs


def require(kind: str) -> None:
    """One line, before any work, when the tracker's package is not installed."""
    if kind == "none":
        return
    try:
        __import__(PACKAGES[kind])
    except ImportError:
        raise PosbenchError(f"--tracker {kind} needs the {kind} package: pip install 'posbench[{kind}]'") from None


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"train": {"lr": 0.002}} -> {"train.lr": 0.002}: hyperparameters are flat. Values that are
    not numbers, strings or booleans become JSON text."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{name}."))
        else:
            plain = isinstance(value, (int, float, str, bool))
            out[name] = value if plain else json.dumps(value, default=str)
    return out


class Tracker:
    """No tracker: the interface training calls. `log` takes a log.csv entry (step, lr, loss,
    val_loss, tokens, seconds: cumulative tokens and seconds); used as a context manager, it is
    closed at the end, also when training stops on an error."""

    def __init__(self, previous: dict[str, Any] | None = None):
        self.previous = previous or {"tokens": 0, "seconds": 0.0}

    def log(self, entry: dict[str, Any]) -> None:
        seconds = entry["seconds"] - self.previous["seconds"]
        scalars = {"train/loss": entry["loss"], "train/lr": entry["lr"],
                   "train/tokens_per_second": (entry["tokens"] - self.previous["tokens"]) / max(seconds, 1e-9)}
        if entry.get("val_loss") is not None:
            scalars["val/loss"] = entry["val_loss"]
        if entry.get("val_accuracy") is not None:  # a probe's learning curve
            scalars["val/accuracy"] = entry["val_accuracy"]
        self.previous = entry
        self.write(entry["step"], scalars)

    def write(self, step: int, scalars: dict[str, float]) -> None:
        pass

    def close(self, failed: bool) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, kind, error, trace):
        self.close(failed=kind is not None)


class TensorBoard(Tracker):
    """Scalars and hyperparameters in one event-file folder per run."""

    def __init__(self, folder: Path, config: dict[str, Any], previous: dict[str, Any] | None):
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        super().__init__(previous)
        step = previous["step"] if previous else 0
        # Events of steps after the one training restarts from are dropped when read.
        self.writer = SummaryWriter(str(folder), purge_step=step + 1)
        if not previous:
            # The hparams plugin's records, written into this run's own folder (add_hparams would
            # make a second run beside it).
            for summary in hparams(flatten(config), {"val/loss": float("nan")}):
                self.writer.file_writer.add_summary(summary)
            self.writer.add_text("config", f"```\n{json.dumps(config, indent=1, default=str)}\n```")

    def write(self, step: int, scalars: dict[str, float]) -> None:
        for name, value in scalars.items():
            self.writer.add_scalar(name, value, step)

    def close(self, failed: bool) -> None:
        self.writer.close()


class WandB(Tracker):
    """One W&B run per run_id (its id and name), in group TASK."""

    def __init__(self, folder: Path, run_id: str, task: str, config: dict[str, Any],
                 previous: dict[str, Any] | None):
        import wandb

        super().__init__(previous)
        folder.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "posbench"), id=run_id, name=run_id, group=task,
            config=config, dir=str(folder), resume="allow", mode=None if _wandb_configured() else "offline",
            settings=wandb.Settings(silent=True, console="off"))
        if self.run.settings.mode == "offline":
            print(f"W&B run {run_id} offline in {self.run.settings.sync_dir} "
                  "(upload with `wandb sync` on that folder)", file=sys.stderr)

    def write(self, step: int, scalars: dict[str, float]) -> None:
        self.run.log(scalars, step=step)

    def close(self, failed: bool) -> None:
        self.run.finish(exit_code=1 if failed else 0)


def _wandb_configured() -> bool:
    """Whether the user chose a W&B mode or logged in; otherwise runs stay offline (nothing is
    sent, no prompt)."""
    if os.environ.get("WANDB_MODE") or os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (OSError, netrc.NetrcParseError):
        return False


def start(kind: str, runs_dir: Path, run_id: str, task: str, config: dict[str, Any],
          previous: dict[str, Any] | None = None) -> Tracker:
    """The tracker of one run. `previous`: the last log entry of a resumed run (None: from step 0)."""
    require(kind)
    if kind == "tensorboard":
        return TensorBoard(Path(runs_dir) / "tensorboard" / (task or "untitled") / run_id, config, previous)
    if kind == "wandb":
        return WandB(Path(runs_dir), run_id, task, config, previous)
    return Tracker(previous)
