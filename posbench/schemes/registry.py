"""The one registry of schemes: name -> class."""

from __future__ import annotations

from posbench.errors import did_you_mean
from posbench.schemes.base import HOOKS, Scheme

SCHEMES: dict[str, type[Scheme]] = {}


def register(cls: type[Scheme]) -> type[Scheme]:
    assert cls.name not in SCHEMES, f"scheme {cls.name} registered twice"
    assert set(cls.hooks) <= set(HOOKS), f"{cls.name}: unknown hook in {cls.hooks}"
    SCHEMES[cls.name] = cls
    return cls


def get_scheme(name: str) -> type[Scheme]:
    if name not in SCHEMES:
        raise did_you_mean(name, SCHEMES, "scheme")
    return SCHEMES[name]
