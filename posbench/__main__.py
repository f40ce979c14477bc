"""The `posbench` command (and `python -m posbench`). Importing the CLI imports no torch (help
answers at once; torch loads when a command computes), yet pandas and typer take a moment: a Ctrl-C
then ends with one line, as it does once the command runs. Once the
command has said its last line, a Ctrl-C while the interpreter shuts down (threads joined,
buffers flushed) changes nothing: the exit status is the command's, and no traceback follows."""

import signal
import sys


def main() -> int:
    try:
        from posbench.cli import main as run
    except BaseException as e:  # a Ctrl-C, or the RuntimeError a library's import wraps it in
        from posbench.errors import interrupted

        if not interrupted(e):
            raise
        print("interrupted: while starting; nothing was read or written", file=sys.stderr)
        return 130
    try:
        return run()
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


if __name__ == "__main__":
    raise SystemExit(main())
