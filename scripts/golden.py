"""Golden logs of training (posbench.golden; posbench/docs/reproducibility.md).

    python scripts/golden.py check [--dir DIR] [--only lm,probe]     exit 1 when a log moved
    python scripts/golden.py refresh [--dir DIR] [--only lm,probe]   record them again

DIR defaults to results/baseline/golden. `check` says for each golden whether it compared exactly
(this machine is of the golden's kind) or within the tolerance (another kind). Refresh in the
commit that moves training numerics, and say why in its message.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from posbench import golden
from posbench.errors import PosbenchError

DEFAULT = Path(__file__).resolve().parents[1] / "results" / "baseline" / "golden"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("check", "refresh"))
    parser.add_argument("--dir", type=Path, default=DEFAULT, help="where the golden files are")
    parser.add_argument("--only", default=None, help="comma-separated golden names (default: all)")
    args = parser.parse_args(argv)
    names = tuple(n for n in args.only.split(",") if n) if args.only else None
    try:
        if args.action == "refresh":
            for path in golden.refresh(args.dir, names):
                print(f"recorded {path}")
            return 0
        verdicts = golden.check_all(args.dir, names)
    except PosbenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for v in verdicts:
        print(v.line, file=sys.stdout if v.ok else sys.stderr)
    return 0 if all(v.ok for v in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
