"""`posbench run TASK`: the whole grid in one command: train every scheme x seed, extend the
task's [extend] schemes by fine-tuning (posbench.extending), extrapolate parents and children,
train and score one model per probe x scheme x seed (the task's [probes]), time the kernels,
write the report. Finished
work (same resolved config, same run_id) is skipped, and `--shard I/N` runs a deterministic slice
so N machines can split a grid (`--shard auto`: the slice of this Slurm array task)."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from posbench import axes, ensemble, layout, plugins, results
from posbench.config import Task
from posbench.data import cached_tokens, is_probe
from posbench.errors import PosbenchError, RunFailed, on_interrupt
from posbench.device import resolve_device
from posbench.runs import FINAL, RunSpec, load_trained
from posbench.training import train_ensemble


def parse_shard(text: str | None, environ=os.environ) -> tuple[int, int]:
    if text is None:
        return 1, 1
    if text == "auto":
        return array_shard(environ)
    try:
        i, n = (int(v) for v in text.split("/"))
    except ValueError:
        raise PosbenchError(f"bad shard {text!r}: expected I/N, e.g. 1/4") from None
    if not 1 <= i <= n:
        raise PosbenchError(f"bad shard {text!r}: need 1 <= I <= N")
    return i, n


ARRAY_VARIABLES = ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_STEP",
                   "SLURM_ARRAY_TASK_COUNT")


def array_shard(environ) -> tuple[int, int]:
    """`--shard auto`: the shard I/N of this task of a Slurm job array, whose N tasks, in index
    order MIN, MIN+STEP, ..., are shards 1..N (`--array=0-9` and `--array=1-10` alike)."""
    try:
        index, low, step, count = (int(environ[name]) for name in ARRAY_VARIABLES)
    except KeyError:
        raise PosbenchError("--shard auto takes the shard from a Slurm job array, and this is not one "
                            "(SLURM_ARRAY_TASK_ID is not set); use --shard I/N") from None
    except ValueError:
        raise PosbenchError(f"--shard auto: the Slurm array variables {', '.join(ARRAY_VARIABLES)} must be "
                            f"integers, got {', '.join(repr(environ[n]) for n in ARRAY_VARIABLES)}") from None
    before, off = divmod(index - low, step) if step > 0 else (-1, 0)
    if off or not 0 <= before < count:
        raise PosbenchError(f"--shard auto: array task {index} is not one of the {count} tasks from {low} "
                            f"in steps of {step}; use --shard I/N")
    return before + 1, count


def grid(task: Task) -> list[RunSpec]:
    """Every scheme x seed of the task on its data, then on every probe's examples with the
    probe's training settings (the randomized schemes of [probes] once more with randomized
    positions), each run once, sorted by run_id (the order shards slice). A probe named as the
    task's data shares its runs. [probes] `cells` keeps only the cells it names, and `lrs` trains
    each probe cell once per learning rate (a sweep; a rate equal to the cell's own lr shares the
    run_id of the run without the sweep). The task's [axes] cross all of it: every point of them
    (posbench.axes) its own runs."""
    cells = []
    for _, model, train in axes.points(task):
        cells += [(task.data, s, model, train) for s in task.schemes
                  if not is_probe(task.data) or task.probes.cell(task.data.spec, s, False)]
        for name in task.probes.names:
            data = dataclasses.replace(task.data, spec=name)
            own = task.train_for(name)
            if train != task.train:  # the axis point's knobs over the probe's own settings
                own = dataclasses.replace(own, **{f.name: getattr(train, f.name) for f in dataclasses.fields(train)
                                                  if getattr(train, f.name) != getattr(task.train, f.name)})
            rates = [dataclasses.replace(own, lr=lr) for lr in task.probes.lrs] or [own]
            for randomized, schemes in ((False, task.schemes), (True, task.probes.randomized)):
                cells += [(data, s, model, dataclasses.replace(t, randomize_positions=True) if randomized else t)
                          for s in schemes if task.probes.cell(name, s, randomized) for t in rates]
    specs = {
        spec.run_id: spec
        for data, s, model, train in cells for seed in task.seeds
        for spec in [RunSpec(scheme=s, params=task.params.get(s, {}), seed=seed, data=data,
                             model=model, train=train, task=task.name)]
    }
    return sorted(specs.values(), key=lambda r: r.run_id)


def text_run(task: Task, spec: RunSpec) -> bool:
    """A run of the task's own data and training settings (at one point of its axes), not a
    probe's."""
    return spec.data == task.data and spec.train in axes.trains(task)


def shard_of(specs: list[RunSpec], shard: tuple[int, int]) -> list[RunSpec]:
    i, n = shard
    return [s for k, s in enumerate(specs) if k % n == i - 1]


def finished(out: Path, spec: RunSpec) -> bool:
    rows = results.read_rows(results.table_path(out, "runs"))
    ok = any(r["run_id"] == spec.run_id and r["status"] == "ok" for r in rows)
    return ok and (out / spec.run_id / FINAL).exists()


def seeded(out: Path, spec: RunSpec, task: Task) -> bool:
    """A probe run whose folder is not here but whose rows are: its ok row in runs.csv and every
    probes.csv row its scoring would write, merged from another folder (`posbench report
    --merge`), so that neither training nor scoring is needed again. The keys come from a model
    built from the spec, untrained: which eval-time variants apply depends on its layout alone."""
    from posbench import probing
    from posbench.data import probe_corpus
    from posbench.runs import build_model

    if not is_probe(spec.data) or (out / spec.run_id / FINAL).exists():
        return False
    runs = results.read_rows(results.table_path(out, "runs"))
    if not any(r["run_id"] == spec.run_id and r["status"] == "ok" for r in runs):
        return False
    built = build_model(spec, probe_corpus(spec.data)[0])
    return evaluated(out, "probes", probing.row_keys(spec, task.probes, task.eval, built.layout))


def table_rows(out: Path, table: str, keys: set[tuple[str, ...]]) -> list[dict[str, str]]:
    """The rows of out/<table>.csv whose key is one of `keys`."""
    key = results.TABLES[table]["key"]
    return [r for r in results.read_rows(results.table_path(out, table)) if tuple(r[k] for k in key) in keys]


def evaluated(out: Path, table: str, expected: set[tuple[str, ...]]) -> bool:
    """Whether out/<table>.csv already holds a row for every key of `expected`."""
    key = results.TABLES[table]["key"]
    rows = results.read_rows(results.table_path(out, table))
    return expected <= {tuple(r[k] for k in key) for r in rows}


def run_task(task: Task, out: Path | str, shard: tuple[int, int] = (1, 1), resume: bool = False,
             device: str = "auto", progress: bool = False, speed: bool = True, log=print,
             only: set[str] | None = None) -> dict:
    """Run (this shard of) the grid into `out` (of the shard, only the runs named in `only`, when
    given). Returns counts of what was done and skipped, and the run_ids whose training failed (NaN
    loss, a kernel refused): those are recorded as failed in runs.csv and left out of evaluation,
    and the grid goes on with the others; `failed_rows`, one line on the evaluation rows of this
    call whose scheme failed at their length (None when none did), which are recorded with status
    `failed` while the other lengths and runs go on."""
    from rich.progress import Progress

    from posbench import evaluate

    out = Path(out)
    everything = grid(task)
    specs = shard_of(everything, shard)
    if not specs:
        raise PosbenchError(f"shard {shard[0]}/{shard[1]} of task {task.name} holds no runs: the grid has "
                            f"{len(everything)} runs (schemes x seeds, probes included), so at most "
                            f"{len(everything)} shards have work; nothing was written to {out}")
    if only is not None:
        specs = [s for s in specs if s.run_id in only]
    out.mkdir(parents=True, exist_ok=True)
    done = {"trained": 0, "skipped_train": 0, "evaluated": 0, "skipped_eval": 0, "probes": 0,
            "skipped_probes": 0, "speed": 0, "failed": [], "failed_rows": None}
    failed_rows: dict[str, list[dict]] = {"extrapolation": [], "probes": []}
    cache: dict = {}
    with Progress(disable=not progress) as bar:
        overall = bar.add_task(f"{task.name} {shard[0]}/{shard[1]}", total=2 * len(specs))
        train_grid(task, specs, out, device, resume, done, cache, log, lambda n: bar.advance(overall, n))
        specs = [s for s in specs if s.run_id not in done["failed"]]
        specs += run_extend(task, out, specs, device, resume, done, cache, log)
        for spec in specs:
            if is_probe(spec.data) or (spec.extension is None and not text_run(task, spec)):
                bar.advance(overall)  # a probe's run (or its child): scored on its probe below
                continue
            run_dir = out / spec.run_id
            _, model, _ = load_trained(run_dir)
            # Each table is checked for its own rows: a kill between the writes below leaves
            # extrapolation.csv complete and positions.csv not (windows.csv goes first, so
            # extrapolation rows imply its rows).
            keys = evaluate.row_keys(spec, task.eval, model.layout)
            positions = evaluate.position_keys(table_rows(out, "extrapolation", keys), task.eval)
            if evaluated(out, "extrapolation", keys) and evaluated(out, "positions", positions):
                done["skipped_eval"] += 1
            else:
                log(f"extrapolate {spec.run_id}")
                rows, _, _ = evaluate.evaluate_run(run_dir, task.eval, device, cache, task.name, out=out)
                failed_rows["extrapolation"] += [r for r in rows if r["status"] == "failed"]
                done["evaluated"] += 1
            bar.advance(overall)
        failed_rows["probes"] = run_probes(task, out, specs, device, done, log)
    lines = [results.failed_line(rows, results.table_path(out, table)) for table, rows in failed_rows.items()]
    done["failed_rows"] = "; ".join(line for line in lines if line) or None
    if speed and shard[0] == 1:
        done["speed"] = run_speed_once(task, out, device, log)
    write_provenance(task, out, shard, resolve_device(device).type)
    return done


def train_grid(task: Task, specs: list[RunSpec], out: Path, device: str, resume: bool, done: dict, cache: dict,
               log, advance) -> None:
    """Train the runs of `specs` not finished (or seeded) in `out`: one at a time, or the seeds of
    one configuration stacked when the task's `ensemble` allows; counts go to `done`, a run that
    failed is recorded as failed and the others go on. `advance(n)`: n runs dealt with."""
    most = ensemble.size(task.ensemble, resolve_device(device).type, len(task.seeds))
    pending = []
    for spec in specs:
        if finished(out, spec) or seeded(out, spec, task):
            done["skipped_train"] += 1
            advance(1)
        else:
            pending.append(spec)
    for group in ensemble.groups(pending, most):  # one run each unless --ensemble stacks seeds
        stacked = f" (an ensemble of {len(group)} seeds)" if len(group) > 1 else ""
        log(f"train {', '.join(s.run_id for s in group)}{stacked}")
        outcomes = train_ensemble(group, out, device=device, resume=resume, progress=False,
                                  data=cached_tokens(group[0].data, cache))
        for spec, outcome in zip(group, outcomes):
            if isinstance(outcome, RunFailed):  # recorded as failed in runs.csv; the other runs go on
                log(str(outcome))
                done["failed"].append(spec.run_id)
            else:
                done["trained"] += 1
        advance(len(group))


def run_extend(task: Task, out: Path, specs: list[RunSpec], device: str, resume: bool, done: dict, cache: dict,
               log) -> list[RunSpec]:
    """The children of this shard's text runs of the task's [extend] schemes (finished ones
    skipped); returns those that trained, to be evaluated with the others."""
    from posbench import extending

    methods = {layout.recorded(k): v for k, v in task.extend.methods.items()}
    parents = [s for s in specs if text_run(task, s) and s.scheme in methods]
    if not parents:
        return []
    schemes = tuple(dict.fromkeys(s.scheme for s in parents))
    children, failed = extending.extend(out, task.extend, lambda scheme: methods[scheme], schemes, device, resume,
                                     log=log, data_cache=cache, only={s.run_id for s in parents})
    done["failed"] += failed
    return [c for c in children if c.run_id not in failed]


def run_probes(task: Task, out: Path, specs: list[RunSpec], device: str, done: dict, log) -> list[dict]:
    """Probe scores of every run of the shard trained on a probe of the task, skipping runs whose
    rows exist; returns the rows scored here that failed."""
    from posbench import probing

    failed = []
    for spec in specs:
        if spec.data.spec not in task.probes.names:
            continue
        if seeded(out, spec, task):
            done["skipped_probes"] += 1
            continue
        run_dir = out / spec.run_id
        _, model, _ = load_trained(run_dir)
        if evaluated(out, "probes", probing.row_keys(spec, task.probes, task.eval, model.layout)):
            done["skipped_probes"] += 1
            continue
        log(f"probe {spec.data.spec} {spec.run_id}")
        with on_interrupt(probing.scoring_kept(run_dir, done["probes"] + done["skipped_probes"], out)):
            rows = probing.evaluate_run(run_dir, task.probes, task.eval, device, task.name, out=out)
        failed += [r for r in rows if r["status"] == "failed"]
        done["probes"] += 1
    return failed


def run_speed_once(task: Task, out: Path, device: str, log) -> int:
    """Kernel timing for the task's schemes (shard 1 only: timings from different machines are not
    comparable). Skipped when speed.csv already holds this machine's row for every scheme, length
    and pass of the task; otherwise the whole set is timed again, so every ratio_vs_none compares
    timings of one run."""
    from posbench.timing import BASELINE, PASSES, device_name, run_speed

    s = task.speed
    wanted = {
        (name, str(n), p)
        for name in {*map(layout.check, task.schemes), BASELINE} for n in s.lengths for p in (PASSES if s.backward else PASSES[:1])
    }
    here = {"device_name": device_name(resolve_device(device)), "dtype": s.dtype,
            "batch": str(s.batch_size), "heads": str(s.heads), "head_dim": str(s.head_dim)}
    have = {
        (r["scheme"], r["seq_len"], r["pass"])
        for r in results.read_rows(results.table_path(out, "speed"))
        if all(r.get(k) == v for k, v in here.items())
    }
    if wanted <= have:
        return 0
    log("speed")
    rows = run_speed(schemes=list(task.schemes), lengths=list(s.lengths), batch_size=s.batch_size,
                     heads=s.heads, head_dim=s.head_dim, dtype=s.dtype, device=device,
                     backward=s.backward, repeats=s.repeats, compile=s.compile, out_dir=out)
    return len(rows)


def write_provenance(task: Task, out: Path, shard: tuple[int, int], device: str = "cpu") -> None:
    """provenance.json: the task, the command, and the machine kind this invocation ran on (each
    row of the tables records its own); the folders merged into it before are kept."""
    import sys

    prov = {
        "task": task.name, "task_version": task.version,
        "command": " ".join(["posbench", *sys.argv[1:]]) if sys.argv else "",
        "shard": f"{shard[0]}/{shard[1]}",
        "task_config": json.loads(json.dumps(dataclasses.asdict(task), default=str)),
        "plugins": [source.record() for source in plugins.loaded()],
        **results.provenance(device, ""),
    }
    prov.pop("device"), prov.pop("dtype"), prov.pop("corpus")
    results.write_provenance(out, prov)
