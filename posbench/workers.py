"""`posbench run TASK --workers N|auto`: the runs of a grid (of its shard, after `--shard`) on N
worker processes of one machine, each taking the next run, the longest expected first (by the
training seconds of the same runs under other seeds where the folder has them, else by tokens).

On CPU each worker computes with cores // N torch threads (the rows' machine kind says how many:
posbench.machine); on CUDA several workers share a GPU, as many as its free memory holds at about
8 GB each (`auto`), spread over the GPUs. `auto` on CPU is one worker per core, one thread each.
The thread count follows from N alone, never from how many runs are left, so the same command
gives rows of the same machine kind however far a grid had got.

Workers write into the one output folder as `posbench run` does (posbench.results merges rows
under a lock, and a run's folder is held by one writer), so rows are neither lost nor
duplicated. A worker process that dies (killed, out of memory) fails its run only: the run is
recorded as failed in runs.csv (unless its training had finished), a fresh worker takes the next
run, and the grid goes on. Ctrl-C reaches the parent alone (workers run in process groups of
their own); it passes one interrupt on to each worker, whose training finishes its step and
checkpoints, and says in one line what was kept: `--resume` continues. Speed timing and
provenance.json are written by the parent once the runs are done; the report by the caller, once.

With `--ensemble` (posbench.ensemble) a job is an ensemble: the unfinished runs that differ only
in seed, trained as one stacked model by one worker (their run_ids joined by commas in the queue).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import statistics
import threading
import time
from multiprocessing import connection
from pathlib import Path
from typing import Any, Callable

from posbench import config, ensemble, grid, plugins, positions, results
from posbench.errors import Interrupted, PosbenchError, first_line, out_of_memory

CUDA_WORKER_BYTES = 8 * 10**9  # a probe run's training and scoring, with room (scripts/gpu_session.sh)
STOP_GRACE = 60.0  # seconds a worker has to checkpoint after an interrupt before it is terminated
INTERRUPTED = 130


def cpu_cores() -> int:
    """The cores this process may run on (a Slurm or taskset allotment, else the machine's)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def gpu_free_memory() -> list[int]:
    """Free bytes on each visible GPU."""
    import torch

    return [torch.cuda.mem_get_info(i)[0] for i in range(torch.cuda.device_count())]


@dataclasses.dataclass(frozen=True)
class Plan:
    workers: int
    threads: int  # torch threads of each worker
    gpus: tuple[int | None, ...]  # the GPU of worker k (None on CPU)
    line: str  # what was chosen, and why, in one line


def plan(setting: int | str, device: str, cores: int | None = None, free: list[int] | None = None) -> Plan:
    """N workers (`setting`: a number, or "auto") on `device` ("cpu" or "cuda")."""
    setting = config.check_workers(setting)
    cores = cpu_cores() if cores is None else cores
    if device != "cuda":
        n = cores if setting == "auto" else setting
        threads = max(1, cores // n)
        why = f"auto: {cores} cores" if setting == "auto" else f"{cores} cores"
        return Plan(n, threads, (None,) * n,
                    f"workers: {n} ({why}, {threads} torch thread{'s' * (threads > 1)} each)")
    free = gpu_free_memory() if free is None else free
    if not free:
        raise PosbenchError("--workers on cuda: no GPU is visible")
    if setting == "auto":
        fits = [int(b // CUDA_WORKER_BYTES) for b in free]
        order = [i for k in range(max(fits)) for i, f in enumerate(fits) if f > k]  # spread over the GPUs
        if not order:
            raise PosbenchError(f"--workers auto: no GPU has the {CUDA_WORKER_BYTES / 1e9:.0f} GB free that a "
                                f"worker takes (free: {', '.join(f'{b / 1e9:.1f} GB' for b in free)}); "
                                "name a number with --workers N")
        order = order[:cores]  # a thread at least for each worker to drive its GPU
        n = len(order)
        why = (f"auto: {', '.join(f'{b / 1e9:.0f} GB' for b in free)} free on {len(free)} "
               f"GPU{'s' * (len(free) > 1)} at {CUDA_WORKER_BYTES / 1e9:.0f} GB a worker, {cores} cores")
    else:
        n = setting
        order = [k % len(free) for k in range(n)]
        why = f"{len(free)} GPU{'s' * (len(free) > 1)}, {cores} cores"
    threads = max(1, cores // n)
    return Plan(n, threads, tuple(order), f"workers: {n} ({why}, {threads} torch thread{'s' * (threads > 1)} each)")


def expected_cost(spec) -> int:
    """What a run is expected to take before anything like it has run: the tokens it trains on
    (steps x batch_size x train_len of its own training settings, a probe's [probes.train.NAME]
    included)."""
    t = spec.train
    return t.steps * t.batch_size * t.train_len


def measured(specs: list, out: Path | None) -> dict[str, float]:
    """Per run of `specs` whose cell has finished in `out` (the same run under any seed of out's
    runs.csv, itself included), the median of their training seconds."""
    rows = {r["run_id"]: r for r in results.read_rows(results.table_path(out, "runs"))
            if r["status"] == "ok" and r["train_seconds"] and r["seed"]} if out is not None else {}
    seeds = sorted({int(r["seed"]) for r in rows.values()})
    found = {}
    for spec in specs:
        took = [float(rows[other.run_id]["train_seconds"]) for other in
                (dataclasses.replace(spec, seed=seed) for seed in seeds) if other.run_id in rows]
        if took:
            found[spec.run_id] = statistics.median(took)
    return found


def expected(specs: list, out: Path | None = None) -> dict[str, float]:
    """What each run of `specs` is expected to take, by run_id: where its cell has finished in
    `out`, the cell's median training seconds (a probe that stops early, a scheme that trains
    slowly); otherwise its tokens (expected_cost) at the median seconds per token of the runs that
    were measured (plain tokens when none was)."""
    seconds = measured(specs, out)
    rates = [seconds[s.run_id] / expected_cost(s) for s in specs if s.run_id in seconds]
    rate = statistics.median(rates) if rates else 1.0
    return {s.run_id: seconds.get(s.run_id, expected_cost(s) * rate) for s in specs}


def order(specs: list, out: Path | None = None) -> list:
    """The longest expected first (`expected`); equal ones in the grid's order (by run_id)."""
    cost = expected(specs, out)
    return sorted(specs, key=lambda s: (-cost[s.run_id], s.run_id))


@dataclasses.dataclass(frozen=True)
class Job:
    """What a worker process needs: the task, where to write, how, and its share of the machine."""

    task: config.Task
    out: str
    shard: tuple[int, int]
    resume: bool
    device: str
    threads: int
    gpu: int | None
    plugins: tuple[str, ...]
    index: int
    runner: Callable  # runs one run_id of the grid in the worker: run_one


def run_one(job: Job, run_id: str) -> dict:
    """One job of the grid, as `posbench run` trains, evaluates and probes it: a run, or the runs
    of an ensemble (their run_ids joined by commas: `members`)."""
    return grid.run_task(job.task, Path(job.out), job.shard, job.resume, job.device, speed=False,
                         log=lambda m: print(f"worker {job.index}: {m}", flush=True), only=set(members(run_id)))


def members(job: str) -> list[str]:
    """The run_ids of a job of the queue: one, or an ensemble's joined by commas."""
    return job.split(",")


def jobs(specs: list, out: Path, most: int) -> list[str]:
    """The queue: each run a job (`most` 1), or the unfinished runs that differ only in seed in
    ensembles of at most `most` (posbench.ensemble), a finished run alone (to be evaluated where
    it was not); the longest expected first (`expected`, an ensemble by its first run)."""
    if most <= 1:
        return [s.run_id for s in order(specs, out)]
    cost = expected(specs, out)
    done = [s for s in specs if grid.finished(out, s)]
    groups = ensemble.groups([s for s in specs if s not in done], most) + [[s] for s in done]
    groups.sort(key=lambda g: (-cost[g[0].run_id], g[0].run_id))
    return [",".join(s.run_id for s in g) for g in groups]


def work(job: Job, conn) -> None:
    """A worker process: runs each run_id the parent sends until it sends None; answers
    ("done", counts), ("error", message) or, on an interrupt, ("interrupted", message) and exits."""
    os.setpgrp()  # Ctrl-C goes to the parent, which passes it on once
    signal.signal(signal.SIGINT, signal.default_int_handler)  # started ignored: see `start`
    try:
        import torch

        torch.set_num_threads(job.threads)
        if job.gpu is not None:
            torch.cuda.set_device(job.gpu)
        plugins.load_installed()
        plugins.load_all(job.plugins)
        conn.send(("ready", None))
        while True:
            run_id = conn.recv()
            if run_id is None:
                return
            try:
                conn.send(("done", job.runner(job, run_id)))
            except (Interrupted, KeyboardInterrupt):
                raise
            except PosbenchError as e:
                conn.send(("error", str(e)))
            except BaseException as e:  # noqa: BLE001 - a worker's failure is its run's, told in one line
                conn.send(("error", "out of memory" if out_of_memory(e) else f"{type(e).__name__}: {first_line(e)}"))
    except (Interrupted, KeyboardInterrupt) as e:
        try:
            conn.send(("interrupted", str(e) if isinstance(e, Interrupted) else ""))
        except OSError:
            pass
        raise SystemExit(INTERRUPTED) from None
    except (EOFError, BrokenPipeError):  # the parent is gone
        raise SystemExit(1) from None
    except Exception as e:  # noqa: BLE001 - setting up (a plug-in, the GPU): told to the parent
        try:
            conn.send(("error", first_line(e)))
        except OSError:
            pass
        raise SystemExit(1) from None


def _plugin_specs() -> tuple[str, ...]:
    """What a worker loads to register the plug-ins loaded here (installed ones it finds itself)."""
    specs = []
    for source in plugins.loaded():
        if not source.origin:
            specs.append(source.path)
        elif source.origin.startswith("module "):
            specs.append(source.origin.split(" ", 1)[1])
    return tuple(specs)


class Worker:
    def __init__(self, context, job: Job):
        self.job = job
        self.conn, child = context.Pipe()
        self.process = context.Process(target=work, args=(job, child), name=f"posbench-worker-{job.index}",
                                       daemon=True)
        with _signal(signal.SIGINT, signal.SIG_IGN):  # the child starts ignoring Ctrl-C
            self.process.start()
        child.close()
        self.run_id: str | None = None
        self.began = 0.0
        self.ready = False

    def give(self, run_id: str | None) -> bool:
        """Send the next run (None: stop); False when the worker is gone."""
        try:
            self.conn.send(run_id)
        except OSError:
            return False
        self.run_id, self.began = run_id, time.monotonic()
        return True

    def messages(self) -> list[tuple[str, Any]]:
        out = []
        try:
            while self.conn.poll():
                out.append(self.conn.recv())
        except (EOFError, OSError):
            pass
        return out


def run_task(task: config.Task, out: Path | str, shard: tuple[int, int] = (1, 1), resume: bool = False,
             device: str = "auto", progress: bool = False, speed: bool = True, log=print,
             workers: int | str | None = None, runner: Callable | None = None,
             cores: int | None = None) -> dict:
    """posbench.grid.run_task on `workers` processes (default: the task's `workers`; 1 runs in
    this process). Returns the same counts; `failed` also names runs whose worker died."""
    setting = config.check_workers(task.workers if workers is None else workers)
    if setting == 1:
        return grid.run_task(task, out, shard, resume, device, progress=progress, speed=speed, log=log)
    out = Path(out)
    everything = grid.grid(task)
    specs = grid.shard_of(everything, shard)
    if not specs:
        raise PosbenchError(f"shard {shard[0]}/{shard[1]} of task {task.name} holds no runs: the grid has "
                            f"{len(everything)} runs (schemes x seeds, probes included), so at most "
                            f"{len(everything)} shards have work; nothing was written to {out}")
    kind = grid.resolve_device(device).type
    chosen = plan(setting, kind, cores)
    log(chosen.line)
    out.mkdir(parents=True, exist_ok=True)
    queue = jobs(specs, out, ensemble.size(task.ensemble, kind, len(task.seeds)))
    by_id = {s.run_id: s for s in specs}
    done = {"trained": 0, "skipped_train": 0, "evaluated": 0, "skipped_eval": 0, "probes": 0,
            "skipped_probes": 0, "speed": 0, "failed": [], "failed_rows": None}
    job = Job(task, str(out), shard, resume, kind, chosen.threads, None, _plugin_specs(), 0, runner or run_one)
    pool = Pool(job, chosen, min(chosen.workers, len(queue)), log)
    try:
        pool.run(queue, by_id, done, out, kind)
    except KeyboardInterrupt:
        stopped = pool.stop()
        raise Interrupted(f"{stopped} worker{'s' * (stopped != 1)} stopped; finished runs, results and "
                          "checkpoints are kept (run the same command with --resume to go on)") from None
    finally:
        pool.close()
    if speed and shard[0] == 1:
        done["speed"] = grid.run_speed_once(task, out, device, log)
    grid.write_provenance(task, out, shard, kind)
    return done


class Pool:
    """The worker processes, each given the next run of the queue when it is free."""

    def __init__(self, job: Job, chosen: Plan, slots: int, log):
        import multiprocessing

        self.context = multiprocessing.get_context("spawn")  # torch and fork do not mix
        self.job, self.chosen, self.slots, self.log = job, chosen, slots, log
        self.workers: dict[int, Worker] = {}

    def start(self, slot: int) -> None:
        job = dataclasses.replace(self.job, gpu=self.chosen.gpus[slot], index=slot + 1)
        self.workers[slot] = Worker(self.context, job)

    def run(self, queue: list[str], by_id: dict, done: dict, out: Path, kind: str) -> None:
        with _signal(signal.SIGTERM, _as_interrupt):  # a scheduler's stop: as Ctrl-C
            for slot in range(self.slots):
                self.start(slot)
            total, finished = len(queue), 0
            while self.workers:
                ready = connection.wait([w.process.sentinel for w in self.workers.values()]
                                        + [w.conn for w in self.workers.values()])
                for slot, w in list(self.workers.items()):
                    for what, value in w.messages():
                        if what == "ready":
                            w.ready = True
                        elif what == "done":
                            finished += 1
                            for k, v in value.items():  # counts add up; the lines on failed rows join
                                done[k] = "; ".join(filter(None, (done[k], v))) or None if k == "failed_rows" \
                                    else done[k] + v
                            self.log(f"{finished}/{total}: {w.run_id} done by worker {slot + 1} in "
                                     f"{time.monotonic() - w.began:.0f} s")
                            w.run_id = None
                        elif what == "error" and w.run_id is None:
                            raise PosbenchError(f"worker {slot + 1} could not start: {value}")
                        elif what == "error":
                            finished += 1
                            self.log(f"{finished}/{total}: {w.run_id} failed in worker {slot + 1}: {value}")
                            for run_id in members(w.run_id):
                                record_failure(out, by_id[run_id], value, kind)
                                done["failed"].append(run_id)
                            w.run_id = None
                        elif what == "interrupted":
                            raise KeyboardInterrupt
                    if w.run_id is None and w.ready and w.process.is_alive():
                        if not queue:
                            w.give(None)
                            w.process.join()
                            del self.workers[slot]
                            continue
                        if w.give(queue[0]):
                            queue.pop(0)
                            continue
                    if w.process.sentinel in ready or not w.process.is_alive():
                        w.process.join()
                        if w.run_id is not None:
                            finished += 1
                            cause = _death(w.process.exitcode)
                            self.log(f"{finished}/{total}: {w.run_id} failed: worker {slot + 1} {cause}")
                            for run_id in members(w.run_id):
                                record_failure(out, by_id[run_id], f"its worker process {cause}", kind)
                                done["failed"].append(run_id)
                        elif not w.ready:
                            raise PosbenchError(f"worker {slot + 1} {_death(w.process.exitcode)} while starting")
                        del self.workers[slot]
                        if queue:
                            self.start(slot)  # a fresh worker takes the next run

    def stop(self) -> int:
        """Pass one interrupt on to each worker, give them STOP_GRACE seconds to checkpoint, then
        terminate what is left. Returns how many were running."""
        alive = [w for w in self.workers.values() if w.process.is_alive()]
        for w in alive:
            with _quiet():
                os.kill(w.process.pid, signal.SIGINT)
        until = time.monotonic() + STOP_GRACE
        try:
            for w in alive:
                w.process.join(max(0.0, until - time.monotonic()))
        except KeyboardInterrupt:  # Ctrl-C again: at once (the last checkpoints stay)
            pass
        for w in alive:
            if w.process.is_alive():
                w.process.kill()
                w.process.join()
        return len(alive)

    def close(self) -> None:
        for w in self.workers.values():
            if w.process.is_alive():
                w.process.kill()
                w.process.join()
            w.conn.close()
        self.workers.clear()


@contextlib.contextmanager
def _signal(signum, handler):
    """`handler` for `signum` inside the block (in the main thread; elsewhere nothing changes)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signum, handler)
    try:
        yield
    finally:
        signal.signal(signum, previous)


def _as_interrupt(signum, frame):
    raise KeyboardInterrupt


class _quiet:
    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        return kind is not None and issubclass(kind, ProcessLookupError)


def _death(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            return f"died ({signal.Signals(-exitcode).name})"
        except ValueError:
            return f"died (signal {-exitcode})"
    return f"exited with status {exitcode}"


def record_failure(out: Path, spec, message: str, device: str) -> None:
    """A failed row in runs.csv for a run whose worker failed, unless its training had finished
    (then its ok row stays, and a later `posbench run` evaluates what is missing)."""
    rows = results.read_rows(results.table_path(out, "runs"))
    if any(r["run_id"] == spec.run_id and r["status"] == "ok" for r in rows):
        return
    t = spec.train
    prov = results.provenance(device, t.dtype)
    prov.update(machine="", machine_detail="")  # the worker's kind is unknown here
    results.merge_rows(out, "runs", [{
        "run_id": spec.run_id, "task": spec.task, "scheme": spec.scheme, "seed": spec.seed,
        "train_len": spec.original_len, "randomized": positions.randomized_column(t), "steps": t.steps,
        "status": "failed", "message": message, **prov,
    }])
