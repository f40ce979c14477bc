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
        return said(130)
    try:
        return said(run())
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def said(code: int) -> int:
    """`code`, as the process's exit status. CPython remembers a KeyboardInterrupt that ended code
    it ran from C (an extension's import runs some so), even one the command then answered, and a
    `python -m` process killed itself with SIGINT at exit for it (status -2, not 130, in about one
    Ctrl-C in ten during start-up). Running a line from C clears that record."""
    import ctypes

    ctypes.pythonapi.PyRun_SimpleString(b"")
    return code


if __name__ == "__main__":
    raise SystemExit(main())
