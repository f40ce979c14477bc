"""One progress display for the readings (evaluation of trained runs, pretrained models, passkey
prompts): a transient bar on a terminal; elsewhere, where asked, a line per step on stderr, so that
a log of a long reading shows how far it got."""

from __future__ import annotations

import sys
import time


class Bar:
    """`start(label, total)` a stage, `step(note)` per unit done (the seconds since the one before
    appended). `progress`: draw the bar (a terminal); `lines`: without one, print a line per step."""

    def __init__(self, progress: bool, unit: str = "window", lines: bool = True):
        self.progress, self.unit, self.lines = progress, unit, lines
        self.job = None
        self.label, self.done, self.total, self.last = "", 0, 0, time.perf_counter()

    def __enter__(self):
        if self.progress:
            from rich.progress import Progress

            self.bar = Progress(transient=True).__enter__()
        return self

    def __exit__(self, *exc):
        if self.progress:
            self.bar.__exit__(*exc)

    def start(self, label: str, total: int) -> None:
        self.label, self.done, self.total, self.last = label, 0, total, time.perf_counter()
        if self.progress:
            self.job = self.bar.add_task(label, total=total)

    def step(self, note: str) -> None:
        """One more done; `note` and the seconds since the one before."""
        now = time.perf_counter()
        note, self.last = f"{note}, {now - self.last:.0f} s", now
        self.done += 1
        if self.progress:
            self.bar.update(self.job, advance=1, description=f"{self.label}: {note}")
        elif self.lines:
            print(f"{self.label}: {self.unit} {self.done}/{self.total}, {note}", file=sys.stderr, flush=True)
