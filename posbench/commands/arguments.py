"""The arguments of a command called from Python (posbench.api), checked as the command line
checks its flags: bound to the command's signature and each converted to, or refused as not being,
the type its flag takes, in one line naming the argument."""

import enum
import functools
import inspect
import os
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Callable, Union

from posbench.errors import PosbenchError, did_you_mean


def checked(fn: Callable) -> Callable:
    """`fn` (a command) taking only what its command line takes: arguments bound to its
    signature and each converted to, or refused as not being, its flag's type."""
    sig = inspect.signature(fn, eval_str=True)
    where = f"posbench.{fn.__name__}"

    @functools.wraps(fn)
    def call(*args, **kwargs):
        known = [p.name for p in sig.parameters.values() if p.kind is not p.VAR_KEYWORD]
        for key in kwargs:
            if key not in known:
                raise did_you_mean(key, known, f"keyword of {where}")
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError as e:
            raise PosbenchError(f"{where}: {e} (its arguments: {', '.join(known)})") from None
        for name, value in bound.arguments.items():
            param = sig.parameters[name]
            if param.kind is not param.VAR_KEYWORD:
                bound.arguments[name] = typed(value, param, where)
        return fn(*bound.args, **bound.kwargs)

    return call


def _plain(hint) -> tuple[Any, bool]:
    """The type a flag's annotation names, and whether None is allowed."""
    if typing.get_origin(hint) is Annotated:
        hint = typing.get_args(hint)[0]
    if typing.get_origin(hint) in (Union, types.UnionType):
        rest = [a for a in typing.get_args(hint) if a is not type(None)]
        return (rest[0] if len(rest) == 1 else Any), True
    return hint, False


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def typed(value: Any, param: inspect.Parameter, where: str) -> Any:
    """`value` as the flag `param` takes it, or one line saying what it takes."""
    hint, optional = _plain(param.annotation)
    if value is None and (optional or param.default is None):
        return None
    name = param.name
    origin = typing.get_origin(hint)
    if hint is bool:
        ok, says = isinstance(value, bool), "True or False"
    elif hint is int:
        ok, says = isinstance(value, int) and not isinstance(value, bool), "an integer"
    elif hint is float:
        ok, says = _number(value), "a number"
    elif hint is str:  # a text, a list for comma-separated values, or the digits of an integer
        if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) or _number(v) for v in value):
            value = ",".join(map(str, value))
        elif isinstance(value, int) and not isinstance(value, bool) and param.kind is param.KEYWORD_ONLY:
            value = str(value)  # workers=4, seeds=3; a name (a scheme, a task) is no number
        ok, says = isinstance(value, str), "a string, as its flag takes (a list for comma-separated values)"
    elif hint is Path:
        ok, says = isinstance(value, (str, os.PathLike)), "a path (str or pathlib.Path)"
        value = Path(value) if ok else value
    elif origin in (list, typing.List, typing.Sequence, tuple) or hint in (list, tuple):
        item = (typing.get_args(hint) or (str,))[0]
        items = [value] if isinstance(value, (str, os.PathLike)) else value
        ok = isinstance(items, (list, tuple)) and all(isinstance(v, (str, os.PathLike)) for v in items)
        says = "a path or a list of paths" if item is Path else "a string or a list of strings"
        if ok:
            value = [Path(v) if item is Path else os.fspath(v) for v in items]
    elif isinstance(hint, type) and issubclass(hint, enum.Enum):
        choices = [m.value for m in hint]
        if isinstance(value, str) and value not in choices:
            raise did_you_mean(value, choices, f"{name} of {where}")
        ok, says = isinstance(value, (str, hint)), f"one of {', '.join(map(str, choices))}"
        value = hint(value) if ok else value
    else:
        return value
    if not ok:
        raise PosbenchError(f"{where}: {name} must be {says}, got {value!r}")
    return value
