"""The Python API: every command as a function of the same name, keyword arguments named as the
command line's flags (tuples and lists where it takes comma-separated values), results returned as
pandas DataFrames (the command line prints them); `plugins=[...]` loads plug-ins first.

    import posbench
    runs = posbench.train("rope", steps=200, plugins=["my_pe.py"])
    table = posbench.extrapolate(lengths=[64, 128, 256])
"""

from posbench import commands


def __getattr__(name: str):
    if name in commands.NAMES:
        return getattr(commands.module(name), name)
    raise AttributeError(f"module 'posbench.api' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *commands.NAMES])
