"""The Python API: every command as a function of the same name, keyword arguments named as the
command line's flags (tuples and lists where it takes comma-separated values), results returned as
pandas DataFrames (the command line prints them); `plugins=[...]` loads plug-ins first.

    import posbench
    runs = posbench.train("rope", steps=200, plugins=["my_pe.py"])
    table = posbench.extrapolate(lengths=[64, 128, 256])

Every argument is checked against the type its flag takes before the command runs, as the
command line checks what it is given: one PosbenchError naming the argument (an unknown keyword
with a "did you mean"), never a TypeError from inside a command, and nothing computed or written.
A list for a flag that takes comma-separated values is that text (so `lengths=[32.5]` is refused
as `--lengths 32.5` is); an integer for a text option is its digits (`workers=4`, `seeds=3`).
"""

import functools

from posbench import commands


def __getattr__(name: str):
    if name in commands.NAMES:
        return _function(name)
    raise AttributeError(f"module 'posbench.api' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *commands.NAMES])


@functools.cache
def _function(name: str):
    """The command `name`, its arguments checked (posbench.commands.arguments); one function
    however often it is asked for."""
    from posbench.commands.arguments import checked

    return checked(getattr(commands.module(name), name))
