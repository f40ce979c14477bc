"""The `posbench` command (and `python -m posbench`). Importing the CLI imports torch, which takes
a second or more: a Ctrl-C then ends with one line, as it does once the command runs."""

import sys


def main() -> int:
    try:
        from posbench.cli import main as run
    except KeyboardInterrupt:
        print("interrupted: while starting; nothing was read or written", file=sys.stderr)
        return 130
    return run()


if __name__ == "__main__":
    raise SystemExit(main())
