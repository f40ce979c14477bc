"""Config dataclasses from the plain values of a task file or the command line, strictly: unknown
keys (with the nearest name), wrong types and values outside their declared ranges fail in one
line. posbench.config's dataclasses and posbench.axes's points are built here."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from posbench.errors import PosbenchError, did_you_mean
from posbench.knobs import check_fields


def build(cls, raw: dict[str, Any], where: str = ""):
    """An instance of dataclass `cls` from a dict, strictly: unknown keys and wrong types fail."""
    if not isinstance(raw, dict):
        raise PosbenchError(f"[{where}] must be a table")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    values = {}
    for key, value in raw.items():
        if key not in fields:
            raise did_you_mean(key, fields, f"key in [{where}]" if where else "key")
        values[key] = _coerce(hints[key], value, f"{where}.{key}" if where else key)
    obj = cls(**values)
    validate(obj)
    return obj


def coerce_field(cls, name: str, value: Any) -> Any:
    """`value` for field `name` of config class `cls`, strictly, as a task file's would be read."""
    return _coerce(typing.get_type_hints(cls)[name], value, name)


def _coerce(hint, value, where: str):
    origin = typing.get_origin(hint)
    if dataclasses.is_dataclass(hint):
        return build(hint, value, where)
    if origin is tuple:
        (item, _) = typing.get_args(hint)
        if not isinstance(value, list):
            raise PosbenchError(f"{where} must be a list")
        return tuple(_coerce(item, v, where) for v in value)
    if origin is dict:
        if not isinstance(value, dict):
            raise PosbenchError(f"{where} must be a table")
        item = typing.get_args(hint)[1]
        if typing.get_origin(item) is tuple:  # a table of lists
            return {k: _coerce(item, v, f"{where}.{k}") for k, v in value.items()}
        for k, v in value.items():
            if not isinstance(v, dict):
                raise PosbenchError(f"{where}.{k} must be a table of KEY = VALUE, got {v!r}")
        return {k: dict(v) for k, v in value.items()}
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is bool and not isinstance(value, bool):
        raise PosbenchError(f"{where} must be true or false")
    if hint in (int, float, str) and (not isinstance(value, hint) or isinstance(value, bool)):
        raise PosbenchError(f"{where} must be {hint.__name__}, got {value!r}")
    return value


def validate(obj) -> None:
    """Range checks, shared by task files and command-line overrides: each field's declared range
    (posbench.knobs), then the dataclass's own checks across fields."""
    check_fields(obj)
