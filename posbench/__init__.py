"""posbench: positional-encoding benchmark and length-extrapolation harness.

The commands are functions too (posbench.api): ``posbench.train``, ``extrapolate``, ``probe``,
``speed``, ``run`` and ``check``, imported on first use so that ``import posbench`` stays cheap.
"""

__version__ = "0.1.0"

API = ("train", "extrapolate", "probe", "speed", "run", "check")


def __getattr__(name: str):
    if name in API:
        from posbench import api

        return getattr(api, name)
    raise AttributeError(f"module 'posbench' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *API])
