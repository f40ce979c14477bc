"""The shards of a probe grid still to run, one run per shard, the longest expected first.

    python scripts/probe_queue.py TASK SHARDS DONE_DIR [--have RESULTS] [--expect RESULTS]

Prints one shard index (1..SHARDS) a line. A shard is left out when DONE_DIR/I.log says the shard
finished ("wall time") or when every run of it has an ok row in RESULTS/runs.csv (--have, e.g. an
earlier call's merged results). The order: steps to the early stop of the same cell's seed-0 run
in the --expect results (e.g. results/probes), longest first, so the long runs start early
and the short ones fill the end; a cell with no such row counts as half the task's steps.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from posbench import config, grid, results


def queue(task_name: str, shards: int, done: Path, have: list[Path], expect: list[Path]) -> list[int]:
    task = config.load_task(task_name)
    finished = {r["run_id"] for h in have for r in results.read_rows(results.table_path(h, "runs")) if r["status"] == "ok"}
    steps = {r["run_id"]: int(r["stopped_at"] or r["steps"])
             for e in expect for r in results.read_rows(results.table_path(e, "runs")) if r["status"] == "ok"}
    expected: dict[int, int] = {}
    for k, spec in enumerate(grid.grid(task)):
        shard = k % shards + 1
        log = done / f"{shard}.log"
        if spec.run_id in finished or (log.exists() and "wall time" in log.read_text(errors="replace")):
            continue
        first = dataclasses.replace(spec, seed=0).run_id  # the same cell's seed-0 run
        expected[shard] = expected.get(shard, 0) + steps.get(first, spec.train.steps // 2)
    return sorted(expected, key=lambda s: (-expected[s], s))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("task")
    p.add_argument("shards", type=int)
    p.add_argument("done", type=Path)
    p.add_argument("--have", type=Path, action="append", default=[])
    p.add_argument("--expect", type=Path, action="append", default=[])
    a = p.parse_args()
    print("\n".join(str(s) for s in queue(a.task, a.shards, a.done, a.have, a.expect)))


if __name__ == "__main__":
    main()
