"""A run's identity comes from its configs' fields: each knob says whether it names a run
(`knob(..., names_run=...)`), and RunSpec.identity hashes exactly those. A knob added that does not
name runs leaves every committed run_id as it is; one that does moves them all."""

import csv
import dataclasses
import functools
import json
from pathlib import Path

import pytest

from posbench import config
from posbench.config import TrainConfig
from posbench.grid import grid
from posbench.knobs import UNLESS_DEFAULT, knob
from posbench.runs import RunSpec

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "results" / "baseline" / "golden"


def committed_ids() -> set[str]:
    return {row["run_id"] for path in REPO.glob("results/**/runs.csv")
            for row in csv.DictReader(path.open(encoding="utf-8"))}


@pytest.fixture(scope="module")
def committed_specs() -> list[RunSpec]:
    """The specs of every shipped task's grid (seeds 0..15) whose run_id a committed runs.csv holds,
    and the golden logs' specs: run_ids recomputed from their specs."""
    committed = committed_ids()
    found = {}
    for name in config.known_tasks():
        task = config.load_task(name)
        for spec in grid(dataclasses.replace(task, seeds=tuple(range(16)))):
            if spec.run_id in committed:
                found[spec.run_id] = spec
    for path in sorted(GOLDEN.glob("*.json")):
        golden = json.loads(path.read_text())
        spec = RunSpec.from_json(golden["spec"])
        assert spec.run_id == golden["run_id"], path.name
        found[spec.run_id] = spec
    assert len(found) > 1000  # most of results/: every grid run of a shipped task, trained from scratch
    return list(found.values())


@functools.cache
def train_config_with_knob(names_run) -> type:
    """TrainConfig with one more knob, `extra`, declared with `names_run`."""
    field = knob(3, "a knob added after these runs were trained", names_run=names_run)
    return dataclasses.make_dataclass("TrainConfig", [("extra", int, field)], bases=(TrainConfig,), frozen=True)


def with_knob(spec: RunSpec, names_run=True) -> RunSpec:
    """The spec trained with that knob at its default."""
    return dataclasses.replace(spec, train=train_config_with_knob(names_run)(**dataclasses.asdict(spec.train)))


def test_a_knob_that_names_no_run_keeps_every_committed_run_id(committed_specs):
    for spec in committed_specs:
        assert with_knob(spec, names_run=False).run_id == spec.run_id
        assert with_knob(spec, names_run=UNLESS_DEFAULT).run_id == spec.run_id  # added later, at its default


def test_a_knob_that_names_runs_moves_every_run_id(committed_specs):
    committed = committed_ids()
    for spec in committed_specs:
        moved = with_knob(spec).run_id
        assert moved != spec.run_id and moved not in committed
        assert moved.split("-")[0] == spec.run_id.split("-")[0]  # the scheme's prefix stays


def test_the_logistics_of_training_name_no_run():
    """How a run is watched (validation, checkpoints, compile, tracker) leaves its run_id; what it
    learns from moves it; a knob added later names a run only away from its default."""
    spec = RunSpec("rope")
    same = TrainConfig(eval_interval=7, eval_windows=3, checkpoint_interval=9, compile="off", tracker="tensorboard",
                       randomize_max=4096, schedule="cosine", stop_accuracy=0.0)
    assert dataclasses.replace(spec, train=same).run_id == spec.run_id
    for changed in ({"lr": 1e-3}, {"schedule": "constant"}, {"stop_accuracy": 0.9}, {"dtype": "bfloat16"},
                    {"randomize_positions": True}, {"position_sampling": "float"}):
        assert dataclasses.replace(spec, train=TrainConfig(**changed)).run_id != spec.run_id, changed
    randomized = RunSpec("rope", train=TrainConfig(randomize_positions=True))
    assert RunSpec("rope", train=TrainConfig(randomize_positions=True, randomize_max=4096)).run_id != randomized.run_id
