"""Grid axes: a task's [axes] make any [model] or [train] knob a dimension of its grid.

    [axes]
    "train.steps" = [125, 500, 2000]                  # one knob: a list of its values
    size = [{model = {d_model = 64, n_layers = 2, n_heads = 2}, train = {lr = 4e-3}},
            {model = {d_model = 128, n_layers = 4, n_heads = 4}}]   # several knobs that move together

Axes cross one another and the task's schemes x seeds; a point sets its knobs over the task's own
[model] and [train]. Each point is a run with the run_id of its settings, as if a task file had
written them: the same settings in a file without axes give the same run_id.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

from posbench.building import build
from posbench.errors import PosbenchError
from posbench.knobs import NAMES_RUN, naming_fields

SECTIONS = ("model", "train")


def flatten(raw: Any) -> dict[str, Any]:
    """A task file's [axes] with dotted keys written as nested tables (`train.steps = [...]`
    inside [axes]) turned into the quoted form ("train.steps" = [...])."""
    if not isinstance(raw, dict):
        raise PosbenchError("[axes] must be a table of NAME = [points]")
    out: dict[str, Any] = {}
    for name, value in raw.items():
        if isinstance(value, dict):
            out.update({f"{name}.{k}": v for k, v in flatten(value).items()})
        else:
            out[name] = value
    return out


def settings(name: str, point: Any) -> dict[str, Any]:
    """A point of axis `name` as {"section.knob": value}: a table of sections, or one value of the
    knob the axis is named after."""
    if isinstance(point, dict):
        flat = {}
        for section, knobs in point.items():
            if section not in SECTIONS or not isinstance(knobs, dict):
                raise PosbenchError(f"[axes] {name}: a point sets knobs of {' or '.join(SECTIONS)} as "
                                    f"{{model = {{d_model = 64}}}}, got {section} = {knobs!r}")
            flat.update({f"{section}.{k}": v for k, v in knobs.items()})
        if not flat:
            raise PosbenchError(f"[axes] {name}: a point sets nothing")
        return flat
    section = name.partition(".")[0]
    if section not in SECTIONS or "." not in name:
        raise PosbenchError(f"[axes] {name} = [{point!r}, ...]: an axis of plain values is named after its knob "
                            f'("model.d_model", "train.steps"); name a table of points otherwise')
    return {name: point}


def points(task) -> list[tuple[dict[str, Any], Any, Any]]:
    """Every combination of the task's axes, the first axis slowest: (the knobs it sets, its
    model config, its train config). A task without axes has one point, its own settings."""
    per_axis = []
    for name, values in task.axes.items():
        if not values:
            raise PosbenchError(f"[axes] {name} is empty")
        per_axis.append([settings(name, v) for v in values])
    out = []
    for combination in itertools.product(*per_axis):
        merged: dict[str, Any] = {}
        for point in combination:
            clash = set(merged) & set(point)
            if clash:
                raise PosbenchError(f"[axes]: two axes set {', '.join(sorted(clash))}")
            merged.update(point)
        configs = []
        for section in SECTIONS:
            base = dataclasses.asdict(getattr(task, section))
            changes = {k.partition(".")[2]: v for k, v in merged.items() if k.startswith(section + ".")}
            try:
                configs.append(build(type(getattr(task, section)), {**base, **changes}, section) if changes
                               else getattr(task, section))
            except PosbenchError as e:
                raise PosbenchError(f"[axes] point {describe(merged)}: {e}") from None
        out.append((merged, *configs))
    seen = set()
    for merged, model, train in out:
        named = repr((naming_fields(model), naming_fields(train)))  # what their run_ids hash
        if named in seen:
            watching = [f.name for c in (model, train) for f in dataclasses.fields(c) if f.metadata.get(NAMES_RUN) is False]
            raise PosbenchError(f"[axes]: two points give the same run ({describe(merged)}): only knobs that name "
                                f"a run tell runs apart, not {', '.join(watching)}")
        seen.add(named)
    return out


def describe(merged: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in merged.items()) or "the task's own settings"


def trains(task) -> set:
    """The train configs of the task's text runs (one per point of its axes)."""
    return {train for _, _, train in points(task)}
