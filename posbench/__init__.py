"""posbench: positional-encoding benchmark and length-extrapolation harness.

Every command is a function too (posbench.api): ``posbench.train``, ``posbench.extrapolate``,
``posbench.compare``, ..., imported on first use so that ``import posbench`` stays cheap. The
catalogue is ``posbench.api.schemes()``: ``posbench.schemes`` is the package plug-ins import.
"""

__version__ = "0.1.0"

API = ("check", "train", "extrapolate", "inspect", "extend", "speed", "run", "submit", "compare",
       "paired", "report", "tasks", "probe", "table")  # posbench.commands.NAMES but schemes


def __getattr__(name: str):
    if name in API:
        from posbench import api

        return getattr(api, name)
    raise AttributeError(f"module 'posbench' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *API])
