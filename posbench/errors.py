"""The one exception type the CLI turns into a single clear line and a non-zero exit."""

import contextlib
import difflib


class PosbenchError(Exception):
    """A user-facing error: bad input, missing data, corrupt files. Never a bug."""


class RunFailed(PosbenchError):
    """A training run that diverged (NaN loss) or whose step the device's kernels refused (a
    compiler's error on a GPU): recorded as failed in runs.csv, so that a grid can go on with its
    other runs."""


def out_of_memory(e: BaseException) -> bool:
    """torch reports a failed CPU allocation as a plain RuntimeError, a CUDA one as its own type."""
    text = str(e)
    return (isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError"
            or "can't allocate memory" in text or "out of memory" in text)


def first_line(e: BaseException) -> str:
    """The first non-empty line of an error's message (a compiler's runs to dozens, the cause
    first), at most 300 characters."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return (lines[0] if lines else type(e).__name__)[:300]


class Interrupted(PosbenchError):
    """Ctrl-C, told in one line with what was kept; exit code 130."""


@contextlib.contextmanager
def on_interrupt(kept: str):
    """Turn a Ctrl-C inside the block into Interrupted(`kept`): what stays on disk, and how to go on."""
    try:
        yield
    except BaseException as e:
        if interrupted(e):
            raise Interrupted(kept) from None
        raise


def interrupted(e: BaseException) -> bool:
    """Whether `e` is a Ctrl-C or an error one caused, not yet said as Interrupted: Python wraps a
    KeyboardInterrupt raised while a class body is set up (`__set_name__`, as a library's import
    runs) in a RuntimeError, and a library may raise its own error while handling one."""
    seen: set[int] = set()
    cause: BaseException | None = e
    while cause is not None and id(cause) not in seen and not isinstance(cause, PosbenchError):
        if isinstance(cause, KeyboardInterrupt):
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False


@contextlib.contextmanager
def naming(path):
    """An OSError without a file name (a full disk fails a write, not an open) names `path`, so
    the one line says which file."""
    try:
        yield
    except OSError as e:
        if e.filename:
            raise
        raise OSError(e.errno, e.strerror, str(path)) from None


def did_you_mean(word: str, choices, what: str) -> PosbenchError:
    """An error for an unknown `word`, suggesting the nearest of `choices`."""
    choices = sorted(choices)
    near = difflib.get_close_matches(word, choices, n=3, cutoff=0.5)
    hint = f"; did you mean {' or '.join(repr(n) for n in near)}?" if near else ""
    return PosbenchError(f"unknown {what} {word!r}{hint} (known: {', '.join(choices)})")
