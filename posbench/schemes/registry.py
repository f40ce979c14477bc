"""The one registry of schemes: name -> class. Built-ins and plug-ins (posbench.plugins) register
through the same `register`, which refuses what a model could not use, in one line."""

from __future__ import annotations

from posbench import plugins
from posbench.errors import PosbenchError, did_you_mean
from posbench.ranges import check_ranges
from posbench.schemes.base import HOOKS, Scheme

SCHEMES: dict[str, type[Scheme]] = {}
PARAM_TYPES = (bool, int, float, str)  # what `--param KEY=VALUE` can be cast to


def register(cls: type[Scheme]) -> type[Scheme]:
    """Class decorator: add a scheme to the registry under `cls.name`."""
    name = cls.__dict__.get("name")
    if not isinstance(name, str) or not name.strip():
        raise PosbenchError(f"scheme class {cls.__name__} has no `name` (a string)")
    if not isinstance(cls.__dict__.get("family", getattr(cls, "family", None)), str):
        raise PosbenchError(f"scheme {name!r} has no `family` (a string such as 'rotary' or 'bias')")
    if not (isinstance(cls, type) and issubclass(cls, Scheme)):
        raise PosbenchError(f"scheme {name!r} must subclass posbench.schemes.Scheme")
    unknown = [h for h in cls.hooks if h not in HOOKS]
    if unknown:
        raise PosbenchError(f"scheme {name!r} declares unknown hook(s) {', '.join(unknown)}; the hooks are "
                            f"{', '.join(HOOKS)}")
    for key, value in cls.defaults.items():
        if type(value) not in PARAM_TYPES:
            raise PosbenchError(f"scheme {name!r}: parameter {key} has a default of type "
                                f"{type(value).__name__}; parameters are bool, int, float or str")
    check_ranges(f"scheme {name!r}", "parameters", cls.defaults, cls.ranges)
    if any(c in name for c in ",/@+*: "):
        raise PosbenchError(f"scheme name {name!r} holds one of , / @ + * : or a space, which layouts use")
    return plugins.enter(SCHEMES, "scheme", name, cls)


def get_scheme(name: str) -> type[Scheme]:
    if name not in SCHEMES:
        raise did_you_mean(name, SCHEMES, "scheme")
    return SCHEMES[name]
