"""The command line: a thin layer over functions that tests call directly."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import sys
import time
from enum import Enum
from pathlib import Path
from typing import List, Optional

import click
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from posbench import config, plugins
from posbench.errors import Interrupted, PosbenchError, did_you_mean, out_of_memory
from posbench.schemes.rotary import SCALINGS

# typer may vendor its own click: catch both.
USAGE_ERRORS = tuple({click.ClickException, getattr(typer, "TyperException", click.ClickException)})
ABORTS = tuple({click.exceptions.Abort, typer.Abort})

INTERRUPTED = "stopped before the command finished; what it had written is kept"
COMMON_OPTIONS = ("Every command also takes --plugin FILE_OR_MODULE (repeatable: schemes and probes of your own) "
                  "and --debug (a traceback instead of one line; or POSBENCH_DEBUG=1).")


class Commands(typer.core.TyperGroup):
    """typer answers a Ctrl-C inside a command with a silent exit 130: it goes on to `main`
    instead, as Interrupted, which says in one line what was kept."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            raise Interrupted(INTERRUPTED) from None

    def get_command(self, ctx, name):  # every command's --help names the options the pre-parser takes
        command = super().get_command(ctx, name)
        if command is not None and not command.epilog:
            command.epilog = COMMON_OPTIONS
        return command


app = typer.Typer(
    cls=Commands,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Train tiny language models that differ only in their positional encoding; measure "
    "how each extrapolates past its training length and what its attention costs.\n\n" + COMMON_OPTIONS,
)
ROPE_SCALING_HELP = f"comma-separated: {','.join(SCALINGS)}"
MODEL_HELP = ("hf:FOLDER | gguf:FILE: a pretrained RoPE model, read from local files only, in place of "
              "trained runs; its default task is `pretrained` (posbench/docs/pretrained.md)")
LONGROPE_HELP = "comma-separated LongRoPE factors, one per rotated pair: longrope in --rope-scaling"
TRACKER_HELP = "none | tensorboard | wandb: training curves there too (default: the task's, none)"
console = Console(width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True)


class Format(str, Enum):
    table = "table"
    csv = "csv"
    json = "json"
    markdown = "markdown"


@app.command()
def schemes(fmt: Format = typer.Option(Format.table, "--format",
                                       help="table, csv, json or markdown (the catalogue page, posbench/docs/schemes.md)")):
    """List every positional scheme: family, hooks, learned parameters, extrapolation, paper, formula."""
    from posbench.catalogue import catalogue, markdown

    rows = catalogue()
    if fmt == Format.markdown:
        sys.stdout.write(markdown(rows))
    elif fmt == Format.json:
        print(json.dumps(rows, indent=1))
    elif fmt == Format.csv:
        import csv

        writer = csv.DictWriter(sys.stdout, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    else:
        table = Table(title="posbench schemes", show_lines=False)
        for col in rows[0]:
            table.add_column(col, overflow="fold")
        for row in rows:
            table.add_row(*(str(v) for v in row.values()))
        console.print(table)


@app.command("check")
def check_cmd(
    scheme: str = typer.Argument(..., help="a scheme, preset or layout spec (a plug-in's with --plugin)"),
    param: Optional[List[str]] = typer.Option(None, help="scheme parameter KEY=VALUE (repeatable)"),
    skip: Optional[str] = typer.Option(None, help="properties to leave out, comma-separated (e.g. cost)"),
) -> int:
    """Conformance report of a scheme: causality on every path, claimed translation invariance,
    behaviour past the training length, paths agreeing, batch independence, determinism,
    save/load, gradients, bfloat16, one compiled graph, FlexAttention's backward as CUDA compiles
    it, cost. Exit 1 on any fail."""
    from posbench import api

    findings = api.check(scheme, param=param, skip=skip).attrs["rows"]
    styles = {"pass": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}
    for f in findings:
        console.print(f"[{styles[f['status']]}]{f['status']:4}[/] {f['prop']:21} {escape(f['detail'])}",
                      soft_wrap=True)
    failed = [f["prop"] for f in findings if f["status"] == "fail"]
    console.print(f"{scheme}: {len(findings) - len(failed)} of {len(findings)} properties without a fail"
                  + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


@app.command()
def train(
    scheme: str = typer.Option(..., help="scheme, preset or layout spec (see `posbench schemes`)"),
    task: Optional[str] = typer.Option(None, help="task name in tasks/ or a TOML path (default: quick)"),
    data: Optional[str] = typer.Option(None, help="pystdlib | files:PATH_OR_GLOB | hf:NAME[:CONFIG]"),
    train_len: Optional[int] = typer.Option(None, help="training window length"),
    steps: Optional[int] = typer.Option(None),
    batch_size: Optional[int] = typer.Option(None),
    d_model: Optional[int] = typer.Option(None),
    layers: Optional[int] = typer.Option(None),
    heads: Optional[int] = typer.Option(None),
    lr: Optional[float] = typer.Option(None),
    seed: Optional[int] = typer.Option(None, help="default: the task's first seed"),
    param: Optional[List[str]] = typer.Option(None, help="scheme parameter KEY=VALUE (repeatable)"),
    randomize_positions: Optional[bool] = typer.Option(
        None, "--randomize-positions/--no-randomize-positions",
        help="train on sorted random positions from [0, randomize_max) (Ruoss et al. 2023)"),
    device: str = typer.Option("auto", help="auto | cpu | cuda"),
    dtype: Optional[str] = typer.Option(None, help="float32 | bfloat16 (autocast)"),
    compile_: Optional[str] = typer.Option(
        None, "--compile", help="auto | on | off: torch.compile the training forward (auto: on for CUDA)"),
    tokenizer: Optional[str] = typer.Option(None, help="bpe | bytes"),
    vocab_size: Optional[int] = typer.Option(None, help="BPE vocabulary size"),
    runs_dir: Path = typer.Option(Path("runs"), help="where runs and runs.csv go"),
    resume: bool = typer.Option(False, help="continue an interrupted run from its checkpoint"),
    overwrite: bool = typer.Option(False, help="train a finished run again from scratch (else it is kept)"),
    tracker: Optional[str] = typer.Option(None, help=TRACKER_HELP),
):
    """Train one model with one scheme or layout (the task's settings, overridden by flags). A
    finished run is kept unless --overwrite."""
    from posbench import api

    row = api.train(scheme, task=task, data=data, train_len=train_len, steps=steps, batch_size=batch_size,
                    d_model=d_model, layers=layers, heads=heads, lr=lr, seed=seed, param=param,
                    randomize_positions=randomize_positions, device=device, dtype=dtype, compile=compile_,
                    tokenizer=tokenizer, vocab_size=vocab_size, runs_dir=runs_dir, resume=resume,
                    tracker=tracker, progress=sys.stderr.isatty(), overwrite=overwrite).attrs["rows"][0]
    run_id, train_len = row["run_id"], row["train_len"]
    if os.environ.get("RANK", "0") != "0":
        return  # under torchrun, rank 0 reports
    if row["skipped"]:
        console.print(f"{run_id}: already trained (finished in runs.csv), kept as it is in {row['run_dir']}; "
                      "--overwrite trains it again from scratch", soft_wrap=True, highlight=False)
        return
    if row["status"] != "ok":
        console.print(f"{run_id}: stopped early; continue with --resume")
        return
    if row.get("final_val_accuracy") is not None:  # a probe: loss on answers, their accuracy in length
        scored = f"validation accuracy {row['final_val_accuracy']:.1%} at {train_len} tokens"
    else:
        scored = f"unigram model: {row['unigram_val_loss']:.4f}"
    steps_run = row["stopped_at"] or row["steps"]
    stopped = f" (stopped early at step {steps_run} of {row['steps']})" if row["stopped_at"] else ""
    computed = ""
    if isinstance(row.get("padding_tokens"), int) and row["padding_tokens"]:  # a probe: answers scored, padding computed
        computed = (f" computed on ({row['padding_tokens'] / row['tokens']:.0%} of them padding, "
                    f"{row['scored_tokens'] / row['tokens']:.0%} answers)")
    console.print(
        f"{run_id}: {steps_run} steps{stopped}, train loss {row['final_train_loss']:.4f}, "
        f"validation loss {row['final_val_loss']:.4f} ({scored}), "
        f"{row['tokens_per_second']:,.0f} tokens/s{computed}, {row['train_seconds']:.1f} s -> {row['run_dir']}"
    )


@app.command()
def extrapolate(
    runs_dir: Path = typer.Option(Path("runs"), help="where trained runs are"),
    scheme: Optional[List[str]] = typer.Option(None, help="only runs of these schemes (repeatable or comma-separated)"),
    task: Optional[str] = typer.Option(None, help="task whose [eval] settings are the defaults"),
    lengths: Optional[str] = typer.Option(None, help="evaluation lengths, e.g. 64,128,256"),
    mode: Optional[str] = typer.Option(None, help="nonoverlap | sliding"),
    stride: Optional[int] = typer.Option(None, help="sliding stride (default: half the window)"),
    tokens: Optional[int] = typer.Option(None, help="tokens scored at every length"),
    rope_scaling: Optional[str] = typer.Option(None, help=ROPE_SCALING_HELP),
    scaling_factor: Optional[float] = typer.Option(None, help="RoPE scaling factor s (default L_eval/L_train)"),
    yarn_alpha: Optional[float] = typer.Option(None, help="YaRN alpha (beta_slow)"),
    yarn_beta: Optional[float] = typer.Option(None, help="YaRN beta (beta_fast)"),
    llama3_low: Optional[float] = typer.Option(None, help="Llama 3 low_freq_factor"),
    llama3_high: Optional[float] = typer.Option(None, help="Llama 3 high_freq_factor"),
    self_extend_group: Optional[int] = typer.Option(None, help="Self-Extend group G"),
    self_extend_window: Optional[int] = typer.Option(None, help="Self-Extend neighbour window W, a multiple of G (0: train_len/4 rounded to a multiple of G)"),
    rerope_window: Optional[int] = typer.Option(None, help="ReRoPE window w (0: train_len/4)"),
    rerope_leak: Optional[float] = typer.Option(None, help="ReRoPE leak k (0: clip at w; >= 1: leaky ReRoPE)"),
    learned_extension: Optional[str] = typer.Option(None, help="comma-separated: none,hierarchical"),
    position_draws: Optional[int] = typer.Option(None, help="randomized runs: position draws averaged per length"),
    tolerance: Optional[float] = typer.Option(None, help="effective length: perplexity within this fraction of in-distribution (default 0.1)"),
    model: Optional[str] = typer.Option(None, help=MODEL_HELP),
    longrope_factors: Optional[str] = typer.Option(None, help=LONGROPE_HELP),
    device: str = typer.Option("auto", help="auto | cpu | cuda"),
    out: Optional[Path] = typer.Option(None, help="where CSVs and plots go (default: the runs directory)"),
    attention: bool = typer.Option(False, "--attention", help="also measure attention per layer and head "
                                   "(entropy, distance, sink and far mass): attention.csv and plots"),
):
    """Evaluate every trained run on the test split at every length; CSVs, a table and plots."""
    from posbench import api, effective, evaluate, report, results

    out_dir = out or runs_dir
    frame = api.extrapolate(
        runs_dir=runs_dir, scheme=_scheme_names(scheme), task=task, lengths=lengths, mode=mode, stride=stride,
        tokens=tokens, rope_scaling=rope_scaling, scaling_factor=scaling_factor, yarn_alpha=yarn_alpha,
        yarn_beta=yarn_beta, llama3_low=llama3_low, llama3_high=llama3_high, self_extend_group=self_extend_group,
        self_extend_window=self_extend_window, rerope_window=rerope_window, rerope_leak=rerope_leak,
        learned_extension=learned_extension, position_draws=position_draws, tolerance=tolerance, device=device,
        out=out, attention=attention, progress=sys.stderr.isatty(), model=model, longrope_factors=longrope_factors)
    rows = frame.attrs["rows"]
    cfg = config.replace(config.load_task(task or ("pretrained" if model else None)).eval, effective_tolerance=tolerance,
                         mode=mode)
    eff = report.effective_by_label(effective.perplexity_rows(rows, cfg.effective_tolerance))
    console.print(report.ppl_table(rows, f"perplexity, {cfg.mode}", eff))
    _note_scalings(rows, _split(rope_scaling) or config.load_task(task).eval.rope_scaling)
    written = [results.table_path(out_dir, t) for t in ("extrapolation", "positions", "windows", "effective_length")]
    plots = [Path(out_dir) / "extrapolation.png", Path(out_dir) / "positions.png"]
    if attention:
        written.append(results.table_path(out_dir, "attention"))
        plots += [Path(out_dir) / "attention.png", Path(out_dir) / "attention_layers.png"]
    console.print(f"wrote {', '.join(map(str, written + plots))}")
    return _failed(evaluate.failed_rows(rows, results.table_path(out_dir, "extrapolation")))


@app.command()
def inspect(
    schemes: Optional[str] = typer.Argument(None, help="schemes, presets or layouts, comma-separated"),
    run: Optional[str] = typer.Option(None, help="a trained run's run_id (in --runs-dir): its learned "
                                      "parameters and its attention by length"),
    runs_dir: Optional[Path] = typer.Option(None, help="trained runs (default runs): with --run, where it is; "
                                            "alone, every run of SCHEMES (or all)"),
    task: Optional[str] = typer.Option(None, help="task whose model and training length are drawn (default quick)"),
    train_len: Optional[int] = typer.Option(None, help="training length L, marked on every picture (default the task's)"),
    lengths: Optional[str] = typer.Option(None, help="without a run: draw to the longest (default 16 L); with a "
                                          "run: lengths to measure attention at (default L,2L,..,16L)"),
    rope_scaling: Optional[str] = typer.Option(None, help=f"rotary schemes drawn under these too; {ROPE_SCALING_HELP}"),
    device: str = typer.Option("auto", help="auto | cpu | cuda (trained runs)"),
    out: Path = typer.Option(Path("inspect"), help="where the PNGs and inspect.md go"),
):
    """Pictures of each encoding past the training length (absolute tables, rotary logits and
    pair angles, biases); with a trained run, its learned parameters and its attention by length
    (entropy, distance, sink and far mass in attention.csv); inspect.md links them."""
    from posbench import api

    frame = api.inspect(schemes, run=run, runs_dir=runs_dir, task=task, train_len=train_len, lengths=lengths,
                        rope_scaling=rope_scaling, device=device, out=out, progress=sys.stderr.isatty())
    for row in frame.attrs["rows"]:
        console.print(f"{row['scheme']:24} {row['kind']:16} {row['path'] or escape(row['caption'])}",
                      soft_wrap=True, highlight=False)
    console.print(f"wrote {frame.attrs['page']}", highlight=False)
    return _failed("; ".join(r["caption"] for r in frame.attrs["rows"] if r["kind"] == "failed") or None)


@app.command()
def extend(
    method: str = typer.Option(..., help="comma-separated: plain, pi, ntk, yarn, longrope, pose+plain, pose+pi, "
                                         "pose+ntk, pose+yarn, drope. longrope is long-factors-only: its searched "
                                         "factors apply at every length (transformers switches to short_factor "
                                         "up to the parent's length; posbench searches no short factors)"),
    runs_dir: Path = typer.Option(Path("runs"), help="where the parent runs are; children go beside them"),
    scheme: Optional[List[str]] = typer.Option(None, help="only parents of these schemes (repeatable or comma-separated)"),
    task: Optional[str] = typer.Option(None, help="task whose [extend] settings are the defaults"),
    target_len: Optional[int] = typer.Option(None, help="the length to extend to (L')"),
    steps: Optional[str] = typer.Option(None, help="budgets: steps of the parent's batch size at the target length, e.g. 25,100"),
    lr: Optional[float] = typer.Option(None, help="fine-tuning learning rate"),
    warmup: Optional[int] = typer.Option(None, help="warm-up steps"),
    schedule: Optional[str] = typer.Option(None, help="constant | cosine after the warm-up"),
    yarn_alpha: Optional[float] = typer.Option(None, help="YaRN alpha (beta_slow)"),
    yarn_beta: Optional[float] = typer.Option(None, help="YaRN beta (beta_fast)"),
    population: Optional[int] = typer.Option(None, help="longrope search: population"),
    iterations: Optional[int] = typer.Option(None, help="longrope search: iterations"),
    mutation: Optional[float] = typer.Option(None, help="longrope search: chance that a mutation redraws a factor"),
    drope_lr: Optional[float] = typer.Option(None, help="drope: the recalibration's peak learning rate"),
    device: str = typer.Option("auto", help="auto | cpu | cuda"),
    resume: bool = typer.Option(False, help="continue interrupted children from their checkpoints"),
    tracker: Optional[str] = typer.Option(None, help=TRACKER_HELP),
) -> int:
    """Fine-tune every finished parent with each method into a child run that extends it to the
    target length, every method on the same tokens; evaluate children with `extrapolate`."""
    from posbench import extend as extending
    from posbench import results

    t = config.load_task(task)
    cfg = config.replace(t.extend, target_len=target_len,
                         steps=config.parse_int_list(steps, "steps") if steps is not None else None, lr=lr,
                         warmup=warmup, schedule=schedule, yarn_alpha=yarn_alpha, yarn_beta=yarn_beta,
                         population=population, iterations=iterations, mutation=mutation, drope_lr=drope_lr)
    methods = _split(method)
    for name in methods:  # an unknown method: one line before any work
        if name not in extending.METHODS:
            raise did_you_mean(name, extending.METHODS, "extension method")
    if tracker is not None:
        from posbench import trackers

        config.replace(t.train, tracker=tracker)  # an unknown tracker: one line
        trackers.require(tracker)
    children, failed = extending.extend(runs_dir, cfg, lambda scheme: methods, _scheme_names(scheme), device, resume,
                                        progress=sys.stderr.isatty(), log=lambda m: console.print(f"[dim]{escape(m)}[/]"),
                                        tracker=tracker)
    rows = {r["run_id"]: r for r in results.read_rows(results.table_path(runs_dir, "runs"))}
    table = Table(title=f"children at {cfg.target_len} tokens")
    for col in ("run", "parent", "method", "steps", "tokens", "seconds", "val loss", "status"):
        table.add_column(col)
    for spec in children:
        r = rows.get(spec.run_id, {})
        table.add_row(spec.run_id, spec.extension.parent, spec.extension.method, r.get("steps", ""),
                      r.get("tokens", ""), r.get("train_seconds", ""), r.get("final_val_loss", ""), r.get("status", ""))
    console.print(table)
    if failed:
        err.print(f"error: fine-tuning failed for {', '.join(failed)} (recorded as failed in "
                  f"{results.table_path(runs_dir, 'runs')}); the other children completed", markup=False,
                  highlight=False, soft_wrap=True)
        return 1
    return 0


@app.command()
def speed(
    schemes: Optional[str] = typer.Option(None, help="comma-separated schemes (default: all); none always joins"),
    task: Optional[str] = typer.Option(None, help="task whose [speed] settings are the defaults"),
    lengths: Optional[str] = typer.Option(None, help="sequence lengths, e.g. 256,512,1024"),
    batch_size: Optional[int] = typer.Option(None),
    heads: Optional[int] = typer.Option(None),
    head_dim: Optional[int] = typer.Option(None),
    dtype: Optional[str] = typer.Option(None, help="float32 | bfloat16"),
    device: str = typer.Option("auto", help="auto | cpu | cuda"),
    backward: Optional[bool] = typer.Option(None, "--backward/--no-backward", help="time fwd+bwd too"),
    repeats: Optional[int] = typer.Option(None, help="timed repeats per measurement"),
    out: Path = typer.Option(Path("runs"), help="where speed.csv and speed.png go"),
):
    """Time each scheme's attention layer (hooks included), forward and forward+backward."""
    from posbench import api
    from posbench.timing import print_speed

    rows = api.speed(schemes=schemes, task=task, lengths=lengths, batch_size=batch_size, heads=heads,
                     head_dim=head_dim, dtype=dtype, device=device, backward=backward, repeats=repeats, out=out)
    print_speed(rows.attrs["rows"], console)
    console.print(f"wrote {Path(out) / 'speed.csv'}, {Path(out) / 'speed.png'}")


@app.command()
def run(
    task: str = typer.Argument(..., help="task name in tasks/ or a TOML path"),
    shard: Optional[str] = typer.Option(
        None, help="I/N: run a deterministic 1/N slice of the grid; auto: this Slurm array task's"),
    resume: bool = typer.Option(False, help="continue interrupted trainings from their checkpoints"),
    out: Optional[Path] = typer.Option(None, help="output directory (default: runs/TASK)"),
    device: str = typer.Option("auto", help="auto | cpu | cuda"),
    speed: bool = typer.Option(True, "--speed/--no-speed", help="time the attention kernels too"),
    compile_: Optional[str] = typer.Option(
        None, "--compile", help="auto | on | off: torch.compile the training forward (auto: on for CUDA)"),
    seeds: Optional[str] = typer.Option(None, help="seeds instead of the task's, e.g. 0,1,2 (same run_ids)"),
    schemes: Optional[str] = typer.Option(None, help="schemes instead of the task's, comma-separated"),
    tracker: Optional[str] = typer.Option(None, help=TRACKER_HELP),
) -> int:
    """Run a whole grid: train every scheme x seed, extrapolate, time kernels, write the report.
    Exit 1 when a run failed (NaN loss, a kernel the device refused): the others are trained,
    evaluated and reported."""
    from posbench import grid, report, trackers

    began = time.perf_counter()
    t = config.load_task(task)
    t = dataclasses.replace(t, train=config.replace(t.train, compile=compile_, tracker=tracker))
    trackers.require(t.train.tracker)
    if seeds is not None or schemes is not None:
        t = config.replace(t, seeds=config.parse_int_list(seeds, "seeds") if seeds is not None else None,
                           schemes=_split(schemes))
    part = grid.parse_shard(shard)
    out_dir = out or Path("runs") / t.name
    done = grid.run_task(t, out_dir, part, resume, device, progress=sys.stderr.isatty(), speed=speed,
                         log=lambda m: console.print(f"[dim]{m}[/]"))
    console.print(
        f"{t.name} shard {part[0]}/{part[1]}: trained {done['trained']}, skipped {done['skipped_train']} "
        f"finished; evaluated {done['evaluated']}, skipped {done['skipped_eval']}; probed {done['probes']}, "
        f"skipped {done['skipped_probes']}; speed rows {done['speed']}"
    )
    _warn_mixed_machines(out_dir)
    path = report.write_report(out_dir, t.eval.effective_tolerance, t.eval.effective_threshold)
    from posbench import effective, results

    rows = [r for r in results.read_rows(results.table_path(out_dir, "extrapolation")) if r["mode"] == t.eval.mode]
    if rows:
        eff = report.effective_by_label(effective.perplexity_rows(rows, t.eval.effective_tolerance))
        console.print(report.ppl_table(rows, f"perplexity, {t.name}, {t.eval.mode}", eff))
    console.print(f"report: {path}")
    console.print(f"wall time {_minutes(time.perf_counter() - began)}")
    if done["failed"]:
        err.print(f"error: training failed for {', '.join(done['failed'])} (recorded as failed in "
                  f"{results.table_path(out_dir, 'runs')}); the other runs completed", markup=False,
                  highlight=False, soft_wrap=True)
        return 1
    return _failed(done["failed_rows"])


@app.command()
def submit(
    task: str = typer.Argument(..., help="task name in tasks/ or a TOML path"),
    shards: int = typer.Option(..., help="number of shards: array tasks, one slice of the grid each"),
    out: Optional[Path] = typer.Option(None, help="output directory (default: runs/TASK)"),
    gpus_per_shard: int = typer.Option(0, help="GPUs per shard; more than 1: torchrun, one process per GPU"),
    cpus_per_shard: Optional[int] = typer.Option(None, help="CPU cores per shard (default: the cluster's)"),
    time_limit: Optional[str] = typer.Option(None, "--time", help="time limit per shard in a Slurm format: minutes, "
                                             "MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS (e.g. 4:00:00) or UNLIMITED"),
    partition: Optional[str] = typer.Option(None, help="Slurm partition"),
    sbatch_arg: Optional[List[str]] = typer.Option(None, help="extra sbatch option, e.g. --account=lab (repeatable): "
                                                   "--NAME or --NAME=VALUE, no spaces, quotes or ; & | < > ( ) ` $ \\"),
    dry_run: bool = typer.Option(False, help="write and print the scripts; submit nothing"),
    wait: bool = typer.Option(False, help="wait for the shards and the merge; exit 1 naming failed shards"),
) -> int:
    """Run a grid on a Slurm cluster: a job array of shards (each resumable, requeued on
    preemption) and a merge job that writes the report once all succeeded."""
    from posbench import cluster

    resources = cluster.Resources(gpus=gpus_per_shard, cpus=cpus_per_shard, time=time_limit,
                                  partition=partition, sbatch_args=tuple(sbatch_arg or ()))
    plan = cluster.plan(task, shards, out, resources, dry_run)
    plan.write()
    if dry_run:
        for path in (plan.array_script, plan.merge_script):
            print(f"# {path}\n{path.read_text()}")
        print(f"# submitted by: {shlex.join(plan.sbatch_array())}")
        print(f"#          and: {shlex.join(plan.sbatch_merge('ARRAY_JOB_ID'))}")
        return 0
    job = cluster.Submission(plan, wait)
    console.print(f"shards: job {job.array_id} (array 1-{shards}), logs {plan.logs}/shard-I.log, results "
                  f"{plan.out}/shards/I", soft_wrap=True, highlight=False)
    console.print(f"merge: job {job.merge_id} after all shards succeed, log {plan.log('merge')}, report "
                  f"{plan.out / 'report.md'}", soft_wrap=True, highlight=False)
    if not wait:
        console.print(f"watch: squeue -j {job.array_id},{job.merge_id}", highlight=False)
        return 0
    failed = job.wait()
    for line in failed:
        err.print(f"error: {line}", markup=False, highlight=False, soft_wrap=True)
    if failed:
        err.print(f"rerun a shard: sbatch --array=I {plan.array_script}; then merge: sbatch {plan.merge_script}",
                  markup=False, highlight=False, soft_wrap=True)
        return 1
    console.print(f"report: {plan.out / 'report.md'}", highlight=False)
    return 0


@app.command()
def compare(
    baseline: Path = typer.Argument(..., help="baseline results directory (or extrapolation.csv)"),
    current: Path = typer.Argument(..., help="current results directory (or extrapolation.csv)"),
    rtol: float = typer.Option(0.05, help="relative perplexity tolerance"),
    all_rows: bool = typer.Option(False, "--all", help="show unchanged rows too"),
) -> int:
    """Compare perplexities with a baseline; exit 1 on a regression or a missing row."""
    from posbench.compare import compare as run_compare, diff_table

    cmp = run_compare(baseline, current, rtol)
    if all_rows or any(e["verdict"] != "same" for e in cmp.rows):  # no empty table when all agree
        console.print(diff_table(cmp, only_changes=not all_rows))
    for warning in cmp.warnings:
        err.print(f"warning: {warning}", markup=False, highlight=False, soft_wrap=True)
    same = sum(e["verdict"] == "same" for e in cmp.rows)
    console.print(f"{len(cmp.rows)} comparisons: {same} within tolerance (the seeds' interval, or rtol {rtol} "
                  f"with one seed), {cmp.regressions} regressions")
    return 1 if cmp.regressions else 0


@app.command()
def paired(
    a: str = typer.Argument(..., help="scheme variant A, as the tables label it (rope, rope+yarn, ...)"),
    b: str = typer.Argument(..., help="scheme variant B"),
    runs_dir: Path = typer.Option(Path("runs"), help="results directory with windows.csv"),
    lengths: Optional[str] = typer.Option(None, help="only these evaluation lengths, e.g. 256,512"),
    mode: Optional[str] = typer.Option(None, help="nonoverlap | sliding (default: every mode evaluated)"),
    task: Optional[str] = typer.Option(None, help="only runs of this task (when a directory holds several)"),
    probe: Optional[str] = typer.Option(
        None, help="compare per-answer accuracy on this probe (probes.csv; all: every probe) instead of losses"),
):
    """Is A better than B? The loss difference over the same windows and seeds, with its interval;
    with --probe, the accuracy difference on a probe, seed by seed."""
    from posbench import paired as pairing

    chosen = config.parse_int_list(lengths) if lengths else None
    if probe is not None:
        if mode is not None:
            raise PosbenchError("--mode is a protocol of window losses; probes have none: leave it out with --probe")
        rows = pairing.paired_probes(runs_dir, a, b, None if probe == "all" else probe, chosen, task)
        console.print(pairing.paired_probes_table(rows, a, b))
        return
    rows = pairing.paired(runs_dir, a, b, chosen, mode, task)
    console.print(pairing.paired_table(rows, a, b))


@app.command("report")
def report_cmd(
    directory: Path = typer.Argument(Path("runs"), help="results directory"),
    merge: Optional[List[Path]] = typer.Option(None, help="other results directories (shards) to merge in first"),
    tolerance: float = typer.Option(config.EvalConfig.effective_tolerance,
                                    help="effective length: perplexity within this fraction of in-distribution"),
    threshold: float = typer.Option(config.EvalConfig.effective_threshold,
                                    help="effective length of probes: accuracy at least this"),
):
    """Write report.md and PNG plots from a results directory (merging shards first)."""
    from posbench import report, results

    config.replace(config.EvalConfig(), effective_tolerance=tolerance, effective_threshold=threshold)  # range checks
    incoming = []  # read (and checked) every table before merging any, so a bad one merges nothing
    for other in merge or []:
        if not other.is_dir():
            raise PosbenchError(f"no results directory {str(other)!r}")
        for table in results.TABLES:
            results.read_rows(results.table_path(directory, table))
            rows = (results.read_probes(other) if table == "probes"
                    else results.read_rows(results.table_path(other, table)))
            if rows:
                incoming.append((table, rows))
    for table, rows in incoming:
        results.merge_rows(directory, table, rows)
    _warn_mixed_machines(directory)
    console.print(f"wrote {report.write_report(directory, tolerance, threshold)}")


def _note_scalings(rows: list[dict], kinds: tuple[str, ...]) -> None:
    """One line when an asked-for RoPE scaling did not apply to some runs (posbench.evaluate.scaling_note)."""
    from posbench.evaluate import scaling_note

    line = scaling_note(rows, kinds)
    if line:
        err.print(f"note: {line}", markup=False, highlight=False, soft_wrap=True)


def _warn_mixed_machines(directory: Path) -> None:
    """One line when the folder's runs were trained on machines of different kinds."""
    from posbench import machine, results

    line = machine.mixture(results.read_rows(results.table_path(directory, "runs")), str(directory))
    if line:
        err.print(f"warning: {line}", markup=False, highlight=False, soft_wrap=True)


@app.command()
def tasks(validate: bool = typer.Option(False, "--validate", help="load every task strictly; exit 1 on any error")):
    """List the tasks that ship with posbench and those in ./tasks/ (which win on a name clash),
    and validate them."""
    table = Table(title="posbench tasks", caption="./tasks/ wins over a shipped task of the same name")
    for col in ("name", "version", "schemes", "seeds", "train_len", "eval lengths", "data", "file", "status"):
        table.add_column(col, overflow="fold")
    bad = []
    for name, path in sorted(config.task_files().items()):
        where = _shown_path(path)
        try:
            t = config.load_task(str(path))
        except PosbenchError as e:
            bad.append(f"{where}: {e}")
            table.add_row(name, "", "", "", "", "", "", where, "[red]error (below)[/]")
            continue
        trained_at = "-" if t.pretrained else str(t.train.train_len)  # a pretrained model: its own context
        table.add_row(name, str(t.version), ",".join(t.schemes), ",".join(map(str, t.seeds)),
                      trained_at, ",".join(map(str, t.eval.lengths)), t.data.spec, where, "ok")
    console.print(table)
    for line in bad:  # whole lines, whatever the terminal's width
        console.print(f"[red]{escape(line)}[/]", soft_wrap=True)
    return 1 if validate and bad else 0


def _shown_path(path: Path) -> str:
    """A task file's path, relative to the current folder when under it."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


@app.command()
def probe(
    list_: bool = typer.Option(False, "--list", help="list every probe: settings and reference"),
    probe: Optional[str] = typer.Option(None, help="probe names, comma-separated (see --list)"),
    runs_dir: Path = typer.Option(Path("runs"), help="where trained runs are"),
    task: Optional[str] = typer.Option(None, help="task whose [probes] and [eval] settings are the defaults"),
    scheme: Optional[List[str]] = typer.Option(None, help="only runs of these schemes (repeatable or comma-separated)"),
    lengths: Optional[str] = typer.Option(None, help="prompt lengths, e.g. 256,512 (default: 1x,2x,4x,8x train_len)"),
    trials: Optional[int] = typer.Option(None, help="prompts per length and variant"),
    seed: Optional[int] = typer.Option(None, help="seed of the prompts"),
    rope_scaling: Optional[str] = typer.Option(None, help=ROPE_SCALING_HELP),
    position_draws: Optional[int] = typer.Option(None, help="randomized runs: position draws per length"),
    device: str = typer.Option("auto", help="auto | cpu | cuda"),
    out: Optional[Path] = typer.Option(None, help="where probes.csv and heatmaps go (default: the runs directory)"),
    model: Optional[str] = typer.Option(None, help=MODEL_HELP + "; takes --probe passkey"),
    longrope_factors: Optional[str] = typer.Option(None, help=LONGROPE_HELP),
):
    """Synthetic probes: per-answer accuracy and exact match by prompt length of every run trained
    on a probe's examples; a table per probe, probes.csv and one heatmap per probe. With --model,
    the passkey test of a pretrained model (natural-language filler, greedy decoding)."""
    from posbench import evaluate, probing, report, results
    from posbench.probes import PROBES, parse_probe, probe_name

    if list_:
        table = Table(title="posbench probes (data spec: NAME[:key=value,...])", show_lines=True)
        for col in ("name", "what it asks", "default settings", "reference", "source"):
            table.add_column(col, overflow="fold")
        for name in sorted(PROBES):
            p = parse_probe(name)
            table.add_row(name, p.summary, p.settings(), p.reference, plugins.describe(PROBES[name]))
        console.print(table)
        return
    if not probe:
        raise PosbenchError("name probes with --probe NAME[,NAME] (see `posbench probe --list`)")
    from posbench import api

    out_dir = out or runs_dir
    rows = api.probe(probe, runs_dir=runs_dir, task=task, scheme=_scheme_names(scheme), lengths=lengths,
                     trials=trials, seed=seed, rope_scaling=rope_scaling, position_draws=position_draws,
                     device=device, out=out, progress=sys.stderr.isatty(), model=model,
                     longrope_factors=longrope_factors).attrs["rows"]
    for table in report.probe_tables(rows):
        console.print(table)
    e = config.load_task(task).eval
    _note_scalings(rows, _split(rope_scaling) or e.rope_scaling)
    report.write_report(out_dir, e.effective_tolerance, e.effective_threshold)
    console.print(f"wrote {results.table_path(out_dir, 'probes')}, probe_*.png and {Path(out_dir) / 'report.md'}")
    return _failed(evaluate.failed_rows(rows, results.table_path(out_dir, "probes")))


def _failed(line: str | None) -> int:
    """Exit 1 with one line on stderr when some rows failed (the others were written); 0 otherwise."""
    if line:
        err.print(f"error: {line}", markup=False, highlight=False, soft_wrap=True)
    return 1 if line else 0


def _minutes(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s"


def _split(text: str | None) -> tuple[str, ...] | None:
    from posbench.api import split_names

    return split_names(text)


def _scheme_names(scheme: list[str] | None) -> tuple[str, ...] | None:
    """--scheme values (repeatable or comma-separated), each checked: schemes, presets and
    layout specs, as their runs record them."""
    from posbench import layout

    names = _split(",".join(scheme)) if scheme else None
    return tuple(layout.recorded(name) for name in names) if names else names


def common_options(argv: list[str]) -> tuple[list[str], list[str], bool]:
    """The options every command takes, wherever they stand on the line: `--plugin X` (repeatable)
    and `--debug`. Returns the other arguments, the plug-ins and whether to debug."""
    rest, found, debug = [], [], False
    args = iter(argv)
    for arg in args:
        if arg == "--":
            rest += [arg, *args]
            break
        if arg == "--plugin":
            value = next(args, None)
            if value is None:
                raise PosbenchError("--plugin needs a file or a module name")
            found.append(value)
        elif arg.startswith("--plugin="):
            found.append(arg.partition("=")[2])
        elif arg == "--debug":
            debug = True
        else:
            rest.append(arg)
    return rest, found, debug


def main(argv: list[str] | None = None) -> int:
    """Entry point: every user error becomes one line on stderr and exit code 2 (a traceback
    only with --debug or POSBENCH_DEBUG=1)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = os.environ.get("POSBENCH_DEBUG", "") not in ("", "0")
    try:
        argv, given, flag = common_options(argv)
        debug = debug or flag
        plugins.load_installed()
        plugins.load_command_line(given)
        rv = app(args=argv, standalone_mode=False)
        return rv if isinstance(rv, int) else 0
    except BaseException:
        if debug:
            raise
        return _one_line(sys.exc_info()[1])


def _one_line(e: BaseException) -> int:
    """The exit code of `e`, said in one line on stderr."""
    try:
        raise plugins.as_error(e)
    except Interrupted as e:
        err.print(f"interrupted: {e}", markup=False, highlight=False, soft_wrap=True)
        return 130
    except PosbenchError as e:
        err.print(f"error: {e}", markup=False, highlight=False, soft_wrap=True)
        return 2
    except ABORTS:
        err.print("aborted")
        return 130
    except USAGE_ERRORS as e:
        err.print(f"error: {e.format_message()}", markup=False, highlight=False, soft_wrap=True)
        return getattr(e, "exit_code", 2)
    except KeyboardInterrupt:
        err.print(f"interrupted: {INTERRUPTED}", markup=False, highlight=False, soft_wrap=True)
        return 130
    except OSError as e:  # the file system refused: read-only, full, a file where a folder goes
        err.print(f"error: {_file_system_error(e)}", markup=False, highlight=False, soft_wrap=True)
        return 2
    except (MemoryError, RuntimeError) as e:
        if not out_of_memory(e):
            raise
        err.print("error: out of memory; use a smaller batch size, length or model", markup=False,
                  highlight=False, soft_wrap=True)
        return 2


def _file_system_error(e: OSError) -> str:
    if isinstance(e, FileExistsError):
        return f"{e.filename} exists and is not a directory"
    return f"{e.filename}: {e.strerror}" if e.filename else (e.strerror or str(e))
