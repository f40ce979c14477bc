"""Golden logs: every logged loss of two small runs (one language model, one probe), committed with
the machine kind they were made on (results/baseline/golden/, scripts/golden.py).

A check trains each golden file's run again and compares its log with the file's: value for
value and to the bit where this machine is of the golden's kind (posbench.machine), since there
any change of the arithmetic (an initialisation one ulp off, a reordered sum) shows; within
TOLERANCE where it is of another kind, whose kernels round differently, so that such a machine
cannot fail the check spuriously. The check sets torch's threads to the golden's where the
machine has that many cores, so a machine of the golden's CPU compares exactly whatever its
default. Steps, learning rates and token counts match exactly on every kind.

A change that moves training numerics fails the check until the golden files are refreshed
(`python scripts/golden.py refresh`) in the same commit, the reason in its message.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from posbench import machine, results
from posbench.config import ModelConfig, TrainConfig
from posbench.data import DataConfig
from posbench.errors import PosbenchError
from posbench.runs import RunSpec, read_log
from posbench.training import train

# The golden runs: rope on the ci task's text model and settings, and rope on mqar with the probe
# suite's model, each 300 steps, stopping never (a check must see every step).
GOLDEN: dict[str, RunSpec] = {
    "lm": RunSpec("rope", data=DataConfig("pystdlib", tokenizer="bytes"),
                  model=ModelConfig(d_model=64, n_layers=2, n_heads=4),
                  train=TrainConfig(train_len=64, steps=300, batch_size=16, lr=3e-3, warmup=20,
                                    eval_interval=100, checkpoint_interval=100), task="golden"),
    "probe": RunSpec("rope", data=DataConfig("mqar"), model=ModelConfig(d_model=64, n_layers=2, n_heads=2),
                     train=TrainConfig(train_len=32, steps=300, batch_size=32, lr=3e-3, warmup=100,
                                       eval_interval=100, checkpoint_interval=100), task="golden"),
}

# The logged values whose bits depend on the machine, and how far they may move on another kind:
# a relative change of the losses, an absolute one of the accuracy (a fraction of the answers).
# The probe golden ends as mqar starts to leave its plateau, where the last bits decide how fast:
# on one Intel Xeon, with other threads or kernels (AVX2 for AVX-512), its accuracy moved by up to
# 4.6 points (step 300) and its losses by up to 7.4% (step 294) from the golden's
# (posbench/docs/reproducibility.md): the limits are about twice that.
TOLERANCE = {"loss": 0.15, "val_loss": 0.15, "val_accuracy": 0.1}
EXACT = ("step", "lr", "tokens")  # the same on every machine


@dataclass
class Verdict:
    name: str
    exact: bool  # which comparison was made
    ok: bool
    line: str  # what was compared and found, one line


def record(spec: RunSpec, path: Path | str, name: str) -> dict[str, Any]:
    """Train `spec` from scratch and write its golden file: the spec, the machine kind, the log and
    the digest of the final weights."""
    log, weights, made_on = _trajectory(spec)
    golden = {"name": name, "run_id": spec.run_id, "spec": spec.to_json(), "machine": _machine_json(made_on),
              "weights": weights, "log": log}
    results.write_atomic(Path(path), dump(golden))
    return golden


def dump(golden: dict[str, Any]) -> str:
    """A golden file's text: one line per step of its log, so that a refresh's diff reads by step."""
    head = json.dumps({k: v for k, v in golden.items() if k != "log"}, indent=1)
    steps = ",\n".join(f"  {json.dumps(entry)}" for entry in golden["log"])
    return f'{head[:-2]},\n "log": [\n{steps}\n ]\n}}\n'


def refresh(directory: Path | str, names: tuple[str, ...] | None = None) -> list[Path]:
    """Record the golden runs (all, or `names`) into directory/<name>.json."""
    written = []
    for name in _chosen(names, GOLDEN):
        written.append(Path(directory) / f"{name}.json")
        record(GOLDEN[name], written[-1], name)
    return written


def check_all(directory: Path | str, names: tuple[str, ...] | None = None) -> list[Verdict]:
    files = {p.stem: p for p in sorted(Path(directory).glob("*.json"))}
    if not files:
        raise PosbenchError(f"no golden files in {directory}: record them with `python scripts/golden.py refresh`")
    return [check(files[name]) for name in _chosen(names, files)]


def check(path: Path | str) -> Verdict:
    """Train the golden file's run again and compare its log with the file's (module docstring)."""
    golden = load(path)
    spec = RunSpec.from_json(golden["spec"])
    name = golden["name"]
    with _threads(golden["machine"]["threads"]):
        log, weights, here = _trajectory(spec)
    exact = here.kind == golden["machine"]["kind"]
    where = (f"exact, this machine is of the golden's kind {here.kind}" if exact else
             f"within tolerance (losses rtol {TOLERANCE['loss']}, accuracy atol {TOLERANCE['val_accuracy']}): "
             f"made on {golden['machine']['kind']} ({golden['machine']['detail']}), this machine is {here.kind} "
             f"({here.detail})")
    renamed = f"; its run_id is now {spec.run_id}" if spec.run_id != golden["run_id"] else ""
    head = f"golden {name} ({golden['run_id']}, {len(golden['log'])} steps{renamed}): {where}"
    problem = _difference(golden["log"], log, exact)
    if not problem and exact and weights != golden["weights"]:
        problem = f"every logged value is equal, but the final weights differ (sha256 {weights[:12]}, the golden's " \
                  f"{golden['weights'][:12]})"
    if problem:
        return Verdict(name, exact, False, f"{head}: FAILED: {problem}; if the change is meant, refresh the golden "
                                           "files (python scripts/golden.py refresh) and say why in the commit")
    values = sum(v is not None for e in log for k, v in e.items() if k in TOLERANCE)
    found = "every value and the final weights equal" if exact else f"largest change {_largest(golden['log'], log)}"
    return Verdict(name, exact, True, f"{head}: {values} logged values, {found}")


def load(path: Path | str) -> dict[str, Any]:
    path = Path(path)
    try:
        golden = json.loads(path.read_text())
        if not (isinstance(golden.get("log"), list) and golden["log"] and isinstance(golden.get("spec"), dict)
                and type(golden["machine"]["threads"]) is int and isinstance(golden["machine"]["kind"], str)
                and isinstance(golden["weights"], str)):
            raise ValueError("it needs name, run_id, spec, machine (kind, detail, threads), weights and a non-empty log")
        golden["name"], golden["run_id"], golden["machine"]["detail"] = (
            str(golden["name"]), str(golden["run_id"]), str(golden["machine"]["detail"]))
        RunSpec.from_json(golden["spec"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError, PosbenchError) as e:
        raise PosbenchError(f"unreadable golden file {path}: {e}") from None
    return golden


def _trajectory(spec: RunSpec) -> tuple[list[dict[str, Any]], str, machine.Machine]:
    """The log of `spec` trained from scratch on the CPU (timings left out), the sha256 of its
    final weights, and the machine."""
    with tempfile.TemporaryDirectory(prefix="posbench-golden-") as tmp:
        result = train(spec, tmp, device="cpu", progress=False)
        log = read_log(result.run_dir)
        digest = result.row["weights_sha256"]
    return [{k: v for k, v in e.items() if k != "seconds"} for e in log], digest, machine.current("cpu")


def _machine_json(m: machine.Machine) -> dict[str, Any]:
    return {"kind": m.kind, "detail": m.detail, **dataclasses.asdict(m)}


def _difference(golden: list[dict], log: list[dict], exact: bool) -> str | None:
    """The first disagreement of two logs, in words; None when they agree."""
    if len(log) != len(golden):
        return f"{len(log)} steps logged, the golden has {len(golden)}"
    for g, e in zip(golden, log):
        for k in (*EXACT, *TOLERANCE):
            a, b = g.get(k), e.get(k)
            if a == b:
                continue
            if exact or k in EXACT or a is None or b is None or not _within(k, a, b):
                return f"step {g['step']} {k} is {b!r}, the golden's {a!r}"
    return None


def _within(key: str, golden: float, value: float) -> bool:
    return math.isfinite(value) and abs(value - golden) <= _limit(key, golden)


def _limit(key: str, golden: float) -> float:
    """How far a value may lie from the golden's on another machine kind."""
    return TOLERANCE[key] * (1.0 if key == "val_accuracy" else abs(golden)) or 1e-12


def _largest(golden: list[dict], log: list[dict]) -> str:
    """The largest change of a tolerated value relative to its limit, in words."""
    worst = max(((abs(e[k] - g[k]) / _limit(k, g[k]), g["step"], k)
                 for g, e in zip(golden, log) for k in TOLERANCE if g.get(k) is not None), default=(0.0, 0, "loss"))
    return f"{worst[0]:.1%} of the tolerance ({worst[2]} at step {worst[1]})"


def _chosen(names: tuple[str, ...] | None, known: dict) -> list[str]:
    for name in names or ():
        if name not in known:
            raise PosbenchError(f"no golden run {name!r}: choose from {', '.join(known)}")
    return list(names or known)


@contextlib.contextmanager
def _threads(n: int):
    """torch's threads set to `n` where the machine has that many cores, as they were after."""
    before = torch.get_num_threads()
    if 1 <= n <= (os.cpu_count() or 1):
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
