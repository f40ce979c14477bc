#!/usr/bin/env python
"""The CPU attention-cost table: every registered scheme, forward and forward+backward, at
lengths 256-2048 (batch 1, 8 heads of 64), beside `none`. About ten minutes on two idle cores;
length 2048 takes three quarters of it (cope, deberta, fire and the bias schemes materialize
(H, T, T) tensors).

    python scripts/speed_table.py [--out runs/speed-cpu] [--lengths 256,512,1024,2048]
                                  [--heads 8] [--head-dim 64] [--repeats 3] [--threads N]

Writes OUT/speed.csv (merged by key) and OUT/speed.png, and prints one table per pass.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from rich.console import Console

from posbench.config import parse_int_list
from posbench.errors import PosbenchError
from posbench.timing import print_speed, run_speed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/speed-cpu")
    ap.add_argument("--schemes", default="", help="comma-separated (default: every scheme)")
    ap.add_argument("--lengths", default="256,512,1024,2048")
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    err = Console(stderr=True)
    began = time.perf_counter()

    def progress(row):
        if row["status"] != "ok":
            err.print(f"{row['scheme']} {row['pass']} {row['seq_len']}: {row['status']} "
                      f"({row['reason']})", markup=False)

    try:
        rows = run_speed(
            schemes=[s for s in args.schemes.split(",") if s] or None,
            lengths=parse_int_list(args.lengths), batch_size=args.batch_size, heads=args.heads,
            head_dim=args.head_dim, dtype="float32", device="cpu", backward=True,
            repeats=args.repeats, out_dir=args.out, on_row=progress)
    except PosbenchError as e:
        err.print(f"error: {e}", markup=False)
        return 2
    print_speed(rows, Console(width=200))
    print(f"{len(rows)} rows in {args.out}/speed.csv, plot {args.out}/speed.png; "
          f"{torch.get_num_threads()} threads, {time.perf_counter() - began:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
