"""Settings declared once: a config field names its default, its help and the values it may take,
and from that one declaration come the task file's key, the range check, the command-line flag,
the Python API's keyword and the line in posbench/docs/commands.md.

    yarn_alpha: float = knob(1.0, "YaRN alpha (beta_slow)", positive)

Ranges are the scheme parameters' (posbench.ranges: positive, at_least(2), between(0, 1),
one_of(...)); a tuple's range holds for each item. Checks across fields live beside their
dataclass, in its `check()` method.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from posbench.errors import PosbenchError, did_you_mean
from posbench.ranges import Range, check_number

FLAG = "flag"  # metadata key: the field is a command-line flag of the commands that take its config
NAMES_RUN = "names_run"  # metadata key: whether the field enters the run_id (`naming_fields`)
UNLESS_DEFAULT = "unless default"  # names_run of a knob added after runs were trained without it


def knob(default: Any, help: str, allowed: Range | None = None, *, flag: bool | str = False, name: str = "",
         required: bool = False, names_run: bool | str | Callable[[Any], bool] = True) -> Any:
    """A config field. `allowed`: the range of its values (of each item, for a tuple); `flag`: the
    commands that take this config offer it as --NAME (True: the field's name; a string: that
    name); `name`: how errors call it (default the field's name); `required`: a tuple must not be
    empty; `names_run`: whether a run trained with this config is named by it (its run_id, through
    `naming_fields`): True, False (how the run is watched, not what it learns: validation interval,
    tracker), UNLESS_DEFAULT (a knob added later: at its default every run trained before it keeps
    its run_id), or a function of the config (whether the field means anything for it)."""
    meta = {"help": help, "allowed": allowed, FLAG: flag, "name": name, "required": required, NAMES_RUN: names_run}
    return dataclasses.field(default=default, metadata=meta)


def naming_fields(obj) -> dict[str, Any]:
    """The fields of a config instance that name a run, by their `names_run`, as dataclasses.asdict
    gives them; a field not declared by `knob` names it."""
    values = dataclasses.asdict(obj)
    kept = {}
    for f in dataclasses.fields(obj):
        rule = f.metadata.get(NAMES_RUN, True)
        if rule == UNLESS_DEFAULT:
            names = getattr(obj, f.name) != f.default
        else:
            names = rule(obj) if callable(rule) else bool(rule)
        if names:
            kept[f.name] = values[f.name]
    return kept


def check_fields(obj) -> None:
    """Every field of a config instance: a finite number within MAX_INT, within its declared range;
    then the dataclass's own cross-field `check()`."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        items = value if isinstance(value, tuple) else (value,)
        for v in items:
            check_number(v, f.name)
        name = f.metadata.get("name") or f.name
        if f.metadata.get("required") and not value:
            raise PosbenchError(f"{name} is empty")
        allowed = f.metadata.get("allowed")
        for v in items if allowed is not None else ():
            if allowed.holds(v):
                continue
            if allowed.choices:
                raise did_you_mean(v, allowed.choices, name)
            raise PosbenchError(f"{name} must be {allowed.says}, got {v}")
    check = getattr(obj, "check", None)
    if check is not None:
        check()
