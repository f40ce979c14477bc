"""The training loop: one model with one scheme or layout trained from its RunSpec (posbench.runs),
with checkpoints, resume, the NaN stop and early stopping, and the row it adds to runs.csv."""

from __future__ import annotations

import contextlib
import json
import math
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from posbench import batches, ensemble, flops, results, trackers
from posbench.config import TrainConfig
from posbench.data import TokenData, check_probe_corpus, is_probe, load_tokens, probe_corpus, unigram_loss
from posbench.device import Distributed, TrainingForward, autocast, resolve_device
from posbench.errors import Interrupted, PosbenchError, RunFailed, first_line, on_interrupt, out_of_memory
from posbench.extension import columns as extension_columns
from posbench.model import Transformer, non_embedding_params
from posbench.positions import randomized_column
from posbench.runs import (CHECKPOINT, COUNTS, FINAL, RunSpec, build_layout, build_model, load_checkpoint, load_parent,
                           save_checkpoint, weights_digest, write_log)
from posbench.schemes.base import Scheme


def lr_at(step: int, t: TrainConfig) -> float:
    """Linear warm-up, then cosine decay to 10% of the peak (or, `constant`, the peak)."""
    if step < t.warmup:
        return t.lr * (step + 1) / t.warmup
    if t.schedule == "constant":
        return t.lr
    progress = (step - t.warmup) / max(1, t.steps - t.warmup)
    return t.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def make_optimizer(model: Transformer, t: TrainConfig) -> torch.optim.Optimizer:
    """AdamW with weight decay on the tensors of 2 or more dimensions (matrices, tables), except
    those a scheme names in `no_weight_decay`; biases, norms and the rest take none."""
    exempt = {id(p) for m in model.modules() if isinstance(m, Scheme) for p in m.undecayed()}
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2 and id(p) not in exempt]
    rest = [p for p in params if p.dim() < 2 or id(p) in exempt]
    groups = [{"params": decay, "weight_decay": t.weight_decay}, {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=t.lr, betas=(0.9, 0.95))



@dataclass
class TrainResult:
    run_id: str
    run_dir: Path
    row: dict[str, Any]
    skipped: bool = False



# Ctrl-C, and how a scheduler asks a job to stop: SIGTERM (preemption, scancel) and SIGUSR1 (sent
# ahead of a time limit by the scripts of posbench.cluster).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)


@contextlib.contextmanager
def _interrupt_at_step_end():
    """Ctrl-C, SIGTERM or SIGUSR1 during a step lets the step finish: model, optimizer, batch
    generator and log then all stand after the same step, and the checkpoint resumes bitwise. A
    second signal stops at once (KeyboardInterrupt), leaving the last checkpoint, also a consistent
    one. Yields a list that is non-empty once a signal came. Signals reach only the main thread:
    elsewhere they are left as they are, and so is a signal that the parent process chose to
    ignore. A scheduler's signal is acknowledged in the job's log at once; Ctrl-C is answered by
    the one line that says what was kept (Interrupted)."""
    pressed: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield pressed
        return

    def handler(signum, frame):
        if pressed:
            raise KeyboardInterrupt
        pressed.append(signum)
        if signum != signal.SIGINT:
            print(f"{signal.Signals(signum).name}: finishing this step, then saving a checkpoint; "
                  "Ctrl-C again stops at once", file=sys.stderr)

    caught = [s for s in STOP_SIGNALS if signal.getsignal(s) is not signal.SIG_IGN]
    previous = {s: signal.signal(s, handler) for s in caught}
    try:
        yield pressed
    finally:
        for s, before in previous.items():
            default = signal.default_int_handler if s == signal.SIGINT else signal.SIG_DFL
            signal.signal(s, before if before is not None else default)


def train(
    spec: RunSpec,
    runs_dir: Path | str = "runs",
    device: str = "auto",
    resume: bool = False,
    progress: bool = True,
    data: TokenData | None = None,
    stop_after: int | None = None,
    overwrite: bool = False,
) -> TrainResult:
    """Train `spec` into runs_dir/<run_id>/ and record it in runs_dir/runs.csv.

    A finished run is left as it is (`skipped`) unless `overwrite`, which trains it again from
    scratch. With `resume` an interrupted run continues from its last checkpoint; without, it
    starts again. `stop_after` ends the loop after that many steps as an interruption would (tests).
    A run whose loss becomes NaN (or whose kernel the device refused) raises RunFailed.
    """
    (outcome,) = train_ensemble([spec], runs_dir, device, resume, progress, data, stop_after, overwrite)
    if isinstance(outcome, RunFailed):
        raise outcome
    return outcome


def train_ensemble(
    specs: list[RunSpec],
    runs_dir: Path | str = "runs",
    device: str = "auto",
    resume: bool = False,
    progress: bool = True,
    data: TokenData | None = None,
    stop_after: int | None = None,
    overwrite: bool = False,
) -> list[TrainResult | RunFailed]:
    """Train runs that differ only in seed as one stacked model (posbench.ensemble), each into its
    own folder and row as `train` would; one run trains as `train` trains it. Returns, in the
    order of `specs`, each run's result, or the RunFailed that ended it (recorded as failed in
    runs.csv; the others trained on)."""
    runs_dir = Path(runs_dir)
    specs = list(specs)
    if len({ensemble.cell(s) for s in specs}) > 1 or len({s.seed for s in specs}) < len(specs):
        raise PosbenchError("an ensemble's runs must differ in seed and in nothing else")
    for spec in specs:
        trackers.require(spec.train.tracker)
    ddp, dev = Distributed.from_env(resolve_device(device))
    if ddp.world > 1 and len(specs) > 1:
        ddp.close()
        raise PosbenchError("an ensemble trains in one process: under torchrun give one seed (--ensemble off)")
    outcomes: dict[str, TrainResult | RunFailed] = {}
    names = ", ".join(s.run_id for s in specs)
    try:
        with contextlib.ExitStack() as claims, \
                on_interrupt(f"before {names} took a step; finished runs, results and checkpoints "
                             "are kept as they were (run again, with --resume, to go on)"):
            for spec in specs:
                run_dir = runs_dir / spec.run_id
                if ddp.main:  # config.json alone is not worth keeping: a run that fails before its first checkpoint leaves nothing
                    claims.enter_context(results.claim(run_dir, f"run {spec.run_id}", setup=("config.json",)))
                if resume and (run_dir / "config.json").exists():
                    recorded = None
                    with contextlib.suppress(OSError, ValueError, AttributeError):  # unreadable: the checkpoint speaks
                        recorded = json.loads((run_dir / "config.json").read_text()).get("corpus")
                    check_probe_corpus(spec.data, recorded, spec.run_id)
                if not overwrite and (run_dir / FINAL).exists():
                    done = [r for r in results.read_rows(results.table_path(runs_dir, "runs")) if r["run_id"] == spec.run_id]
                    if done and done[0]["status"] == "ok":
                        outcomes[spec.run_id] = TrainResult(spec.run_id, run_dir, done[0], skipped=True)
            left = [s for s in specs if s.run_id not in outcomes]
            if left and data is None and not is_probe(left[0].data):
                # a scheme that cannot be built says so before the corpus is read and tokenized
                # (a minute, the first time), with the vocabulary it asks for
                build_layout(left[0], left[0].data.vocab_size)
                data = load_tokens(left[0].data)  # the members share their data
            together = len(left) > 1
            runs = [_start(spec, runs_dir, dev, ddp, resume, data, "off" if together else None) for spec in left]
            if together:
                for run in runs:
                    run.row["ensemble"] = len(runs)
            outcomes.update(_loop(runs, progress and ddp.main, stop_after))
            ddp.wait()
            return [outcomes[s.run_id] for s in specs]
    finally:
        ddp.close()


@dataclass
class _Run:
    """A run in training: what it computes with, and where it stands after its last step (the
    checkpoint holds exactly this)."""

    spec: RunSpec
    runs_dir: Path
    dev: torch.device
    ddp: Distributed
    data: TokenData | None
    source: batches.LMWindows | batches.ProbeExamples
    model: Transformer
    net: TrainingForward
    opt: torch.optim.Optimizer
    gen: torch.Generator
    row: dict[str, Any]  # the columns of its runs.csv row known before training
    tracker: trackers.Tracker = field(default_factory=trackers.Tracker)
    step: int = 0
    seconds: float = 0.0
    log: list[dict[str, Any]] = field(default_factory=list)
    counted: dict[str, int | None] = field(default_factory=lambda: dict.fromkeys(COUNTS, 0))
    saved: int = 0  # the step of the last checkpoint
    gen_at_step_start: torch.Tensor | None = None

    @property
    def run_dir(self) -> Path:
        return self.runs_dir / self.spec.run_id

    def checkpoint(self) -> None:
        if self.ddp.main:
            state = {"step": self.step, "seconds": self.seconds, **self.counted}
            save_checkpoint(self.run_dir, self.model, self.opt, self.gen, state, self.log)
        self.saved = self.step

    def fail(self, message: str):
        """Record the run as failed, checkpointed at the step before this one, and raise RunFailed."""
        self.gen.set_state(self.gen_at_step_start)
        self.checkpoint()
        t = self.spec.train
        if self.ddp.main:
            results.merge_rows(self.runs_dir, "runs", [{**self.row, "status": "failed", "message": message,
                                                        "tokens": self.step * t.batch_size * t.train_len,
                                                        **self.counted}])
        raise RunFailed(f"{self.spec.run_id}: {message}; recorded as failed in {self.runs_dir / 'runs.csv'}")


def _start(spec: RunSpec, runs_dir: Path, dev: torch.device, ddp: Distributed, resume: bool,
           data: TokenData | None, compile: str | None = None) -> _Run:
    """The model, optimizer and batch generator of a run, its config.json written, and, with
    `resume`, everything set to its last checkpoint. `compile` overrides the run's setting (an
    ensemble's members train eager)."""
    t, run_dir = spec.train, runs_dir / spec.run_id
    if data is None and not is_probe(spec.data):
        data = load_tokens(spec.data)
    source = batches.source_for(spec, data)
    vocab_size, fingerprint = (data.vocab_size, data.fingerprint) if data is not None else probe_corpus(spec.data)
    model = build_model(spec, vocab_size).to(dev)
    if spec.extension is not None:
        load_parent(model, spec, runs_dir)
    net = TrainingForward(ddp.wrap(model), compile or t.compile, dev)
    if net.status == "on":
        model.reserve_positions(source.bound, t.train_len)
    opt = make_optimizer(model, t)
    gen = torch.Generator().manual_seed(spec.seed)
    config = {**spec.to_json(), "vocab_size": vocab_size, "corpus": fingerprint}
    if ddp.main:
        run_dir.mkdir(parents=True, exist_ok=True)
        results.write_atomic(run_dir / "config.json", json.dumps(config, indent=1, default=str))
    row = {
        "run_id": spec.run_id, "task": spec.task, "scheme": spec.scheme,
        "params": model.layout.describe(), "seed": spec.seed, "train_len": spec.original_len,
        "randomized": randomized_column(t), "steps": t.steps,
        "n_params": sum(p.numel() for p in model.parameters()), "non_embedding_params": non_embedding_params(model),
        "d_model": spec.model.d_model, "n_layers": spec.model.n_layers, "n_heads": spec.model.n_heads, "lr": t.lr,
        "backend": model.layout.backends(dev),
        "compile": net.status, **extension_columns(spec.extension),
        "plugins": ";".join(f"{s.path}@{s.sha256[:12]}" for s in spec.plugin_sources()),
        **results.provenance(dev.type, t.dtype, fingerprint),
    }
    run = _Run(spec, runs_dir, dev, ddp, data, source, model, net, opt, gen, row)
    if resume and (run_dir / CHECKPOINT).exists():
        state, run.log = load_checkpoint(run_dir, model, opt, gen)
        run.step, run.seconds = state["step"], state["seconds"]
        run.saved = run.step
        run.counted = {k: state.get(k) for k in COUNTS}  # a checkpoint of an older posbench: unknown
        if ddp.main:
            write_log(run_dir, run.log)  # the view may lag its checkpoint after a kill
    elif ddp.main:
        if (run_dir / FINAL).exists():  # --overwrite: runs.csv must not call it finished while it retrains
            results.merge_rows(runs_dir, "runs", [{**row, "status": "partial",
                                                   "message": "training again from scratch (--overwrite)"}])
        (run_dir / FINAL).unlink(missing_ok=True)
        (run_dir / CHECKPOINT).unlink(missing_ok=True)
    if ddp.main:
        run.tracker = trackers.start(t.tracker, runs_dir, spec.run_id, spec.task, config, run.log[-1] if run.log else None)
    return run


def _loop(runs: list[_Run], progress: bool, stop_after: int | None) -> dict[str, TrainResult | RunFailed]:
    """Steps every run until its last (or its early stop, or `stop_after` more), checkpointing
    every checkpoint_interval steps; a signal stops them all at the end of a step, checkpointed.
    Several runs (an ensemble) step together, stacked (posbench.ensemble); one that ends while
    others go on is finished at once, one that fails is left out. Returns each run's result or
    the RunFailed that ended it, by run_id."""
    if not runs:
        return {}
    lead = runs[0]
    t = lead.spec.train  # an ensemble's members share their training settings
    stack = ensemble.Stack(lead.spec.scheme, len(runs)) if len(runs) > 1 else None
    outcomes: dict[str, TrainResult | RunFailed] = {}
    stop_at = {r.spec.run_id: t.steps if stop_after is None else min(t.steps, r.step + stop_after) for r in runs}
    live = list(runs)
    for run in runs:
        run.model.train()
    bar = _progress(progress)
    bars = {r.spec.run_id: bar.add_task(r.spec.run_id, total=t.steps, completed=r.step, loss=float("nan"), tps=0.0)
            for r in runs}
    with bar, contextlib.ExitStack() as tracking, _interrupt_at_step_end() as pressed:
        for run in runs:  # a run's tracker closes as failed when it failed, or when all stop on an error
            tracking.push(lambda kind, error, trace, run=run: run.tracker.close(
                failed=kind is not None or isinstance(outcomes.get(run.spec.run_id), RunFailed)))
        try:
            while live := [r for r in live if r.step < stop_at[r.spec.run_id] and r.spec.run_id not in outcomes]:
                if lead.ddp.any(bool(pressed), lead.dev):
                    for run in live:
                        run.checkpoint()
                    where = ", ".join(f"{r.spec.run_id} checkpointed at step {r.step} of {t.steps}" for r in live)
                    raise Interrupted(f"{where}; finished runs and results are kept (continue with the same "
                                      "command and --resume, without --overwrite)")
                for run, entry in _steps(live, stack, outcomes):
                    if t.stop_accuracy and run.ddp.any(learned(entry, t), run.dev):  # no extra collective otherwise
                        stop_at[run.spec.run_id] = run.step
                    bar.update(bars[run.spec.run_id], completed=run.step, loss=entry["loss"],
                               tps=t.batch_size * t.train_len * run.step / max(run.seconds, 1e-9))
                    if run.step % t.checkpoint_interval == 0:
                        run.checkpoint()
                going = [r for r in live if r.step < stop_at[r.spec.run_id] and r.spec.run_id not in outcomes]
                for run in live if going else ():  # ended while others go on: finished now
                    if run not in going and run.spec.run_id not in outcomes:
                        run.checkpoint()
                        outcomes[run.spec.run_id] = _finish(run)
        except KeyboardInterrupt:
            held = [r for r in runs if r.spec.run_id not in outcomes]
            kept = "; ".join(f"{r.spec.run_id} keeps its checkpoint of step {r.saved} (--resume continues from it)"
                             if r.saved else f"{r.spec.run_id} had no checkpoint yet (run it again)" for r in held)
            raise Interrupted(f"stopped at once; {kept}") from None
    for run in runs:
        if run.spec.run_id not in outcomes:
            run.checkpoint()
            outcomes[run.spec.run_id] = _finish(run)
    return outcomes


def _steps(live: list[_Run], stack: ensemble.Stack | None, outcomes: dict) -> list[tuple[_Run, dict[str, Any]]]:
    """One step of every live run: stacked when several share it, else each its own solo step. A
    run that fails is in `outcomes` with its RunFailed, and not among the steps returned."""
    if stack is not None and stack.off is None and len(live) > 1:
        try:
            return _stacked_step(live, stack, outcomes)
        except ensemble.Unstackable as e:
            for run in live:  # nothing stepped: each draws its batch again, alone
                run.gen.set_state(run.gen_at_step_start)
                run.opt.zero_grad(set_to_none=True)
            stack.fall_back(str(e))
            if not stack.stacked:  # not one step stacked: they train as their solo runs do
                for run in live:
                    run.row["ensemble"] = None
    out = []
    for run in live:
        try:
            out.append((run, _step(run)))
        except RunFailed as e:
            outcomes[run.spec.run_id] = e
    return out


def _stacked_step(live: list[_Run], stack: ensemble.Stack, outcomes: dict) -> list[tuple[_Run, dict[str, Any]]]:
    """One optimizer step of each live member of an ensemble on its own batch, the forward and
    backward shared (posbench.ensemble); then each member's own clip, step and log as `_step`."""
    began = time.perf_counter()
    drawn = [_draw(run) for run in live]
    values = stack.forward_backward(live, [batch for _, batch in drawn])
    stepped = []
    for run, (sample, _), value in zip(live, drawn, values):
        try:
            if not math.isfinite(value):
                run.fail(f"loss became {value} at step {run.step}")
        except RunFailed as e:
            outcomes[run.spec.run_id] = e
            continue
        _update(run)
        stepped.append((run, sample, value))
    elapsed = time.perf_counter() - began  # each member's share of the device is the whole step
    out = []
    for run, sample, value in stepped:
        run.seconds += elapsed
        out.append((run, _record(run, sample, value)))
    return out


def _draw(run: _Run) -> tuple[batches.Batch, batches.Batch]:
    """The step's learning rate set and its batch drawn: as drawn, and this rank's on the device."""
    run.gen_at_step_start = run.gen.get_state()
    for group in run.opt.param_groups:
        group["lr"] = lr_at(run.step, run.spec.train)
    drawn = run.source.sample(run.gen)
    return drawn, run.ddp.local(drawn).to(run.dev)


def _update(run: _Run) -> None:
    """The clipped gradients applied."""
    torch.nn.utils.clip_grad_norm_(run.model.parameters(), run.spec.train.grad_clip)
    run.opt.step()
    run.step += 1


def _step(run: _Run) -> dict[str, Any]:
    """One optimizer step on a freshly drawn batch; the log entry it adds."""
    began = time.perf_counter()
    drawn, batch = _draw(run)
    try:
        value = run.net.first_step(lambda: _forward_backward(run, batch))
    except (RuntimeError, NotImplementedError) as e:
        # a kernel this device refused (a compiler's error in the backward on a GPU): this run
        # fails and a grid goes on; running out of memory stays the error
        if out_of_memory(e):
            raise
        run.fail(f"{type(e).__name__} at step {run.step}: {first_line(e)}")
    run.row["compile"] = run.net.status  # "fallback" once the first step failed to compile
    _update(run)
    run.seconds += time.perf_counter() - began
    return _record(run, drawn, value)


def _record(run: _Run, drawn: batches.Batch, value: float) -> dict[str, Any]:
    """The log entry of the step just taken (validated at every eval_interval)."""
    t, dev = run.spec.train, run.dev
    for k, n in zip(COUNTS, (drawn.scored, drawn.padding)):
        run.counted[k] = None if run.counted[k] is None else run.counted[k] + n
    entry = {"step": run.step, "lr": lr_at(run.step - 1, t), "loss": value, "val_loss": None,
             "val_accuracy": None, "tokens": run.step * t.batch_size * t.train_len, "seconds": run.seconds}
    if (run.step % t.eval_interval == 0 or run.step == t.steps) and run.ddp.main:
        entry.update(run.source.validate(run.model, dev, autocast(dev, t.dtype)))
    run.log.append(entry)
    run.tracker.log(entry)
    return entry


def _forward_backward(run: _Run, batch: batches.Batch) -> float:
    with autocast(run.dev, run.spec.train.dtype):
        loss = batches.masked_mean(run.net(batch.tokens, batch.positions, targets=batch.targets), batch.mask)
    run.opt.zero_grad(set_to_none=True)
    loss.backward()
    # Read once the backward is queued: on a GPU, reading between forward and backward would leave
    # the device idle while the backward launches. The weights are not yet stepped, so a
    # non-finite loss still fails with the checkpoint of the step before.
    value = run.ddp.mean(loss.detach()).item()
    if not math.isfinite(value):
        run.fail(f"loss became {value} at step {run.step}")
    return value


def _finish(run: _Run) -> TrainResult:
    """The run's final weights and its runs.csv row (status partial when it stopped short)."""
    t, spec, log = run.spec.train, run.spec, run.log
    stopped = bool(log) and learned(log[-1], t)
    if run.step < t.steps and not stopped:
        return TrainResult(spec.run_id, run.run_dir, {**run.row, "status": "partial"})
    if not run.ddp.main:
        return TrainResult(spec.run_id, run.run_dir, {**run.row, "status": "ok"})

    from safetensors.torch import save

    weights = {k: v.detach().cpu().contiguous() for k, v in run.model.state_dict().items()}
    results.write_atomic(run.run_dir / FINAL, save(weights))
    tail = [e["loss"] for e in log[-10:]]
    tokens = run.step * t.batch_size * t.train_len
    data = run.data
    row = {
        **run.row, "tokens": tokens, **run.counted, "stopped_at": run.step if run.step < t.steps else None,
        "final_train_loss": sum(tail) / len(tail),
        "final_val_loss": log[-1]["val_loss"], "final_val_accuracy": log[-1]["val_accuracy"],
        "unigram_val_loss": unigram_loss(data.train, data.valid, data.vocab_size) if data is not None else None,
        "train_seconds": run.seconds, "tokens_per_second": tokens / max(run.seconds, 1e-9),
        "status": "ok", "message": "", "weights_sha256": weights_digest(weights),
    }
    row.update(compute_rate(run.model, spec, run.dev, row["tokens_per_second"]))
    results.merge_rows(run.runs_dir, "runs", [row])
    return TrainResult(spec.run_id, run.run_dir, row)


def learned(entry: dict[str, Any], t: TrainConfig) -> bool:
    """Whether a log entry's validation accuracy reached the early-stopping target (when set)."""
    accuracy = entry.get("val_accuracy")
    return bool(t.stop_accuracy) and accuracy is not None and accuracy >= t.stop_accuracy


def compute_rate(model: Transformer, spec: RunSpec, dev: torch.device, tokens_per_second: float) -> dict:
    """Achieved model FLOP/s (posbench.flops) and its fraction of the device's peak in the
    precision the matmuls ran in, where known; `mfu_peak` names that precision (fp32, tf32, bf16;
    empty without a peak)."""
    per_token = flops.training_flops_per_token(model, spec.model.n_layers, spec.model.d_model,
                                               spec.train.train_len)
    achieved = per_token * tokens_per_second
    precision, peak = flops.mfu_peak(dev, spec.train.dtype)
    return {"model_flops_per_second": achieved, "mfu": achieved / peak if peak else None,
            "mfu_peak": precision}


def _progress(enabled: bool):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    return Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]:.3f}"), TextColumn("{task.fields[tps]:,.0f} tok/s"),
        TimeRemainingColumn(), disable=not enabled, transient=False,
    )
