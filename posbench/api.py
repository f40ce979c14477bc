"""The Python API: the commands as functions, keyword arguments named as the command line's flags,
rows returned as pandas DataFrames. The command line (posbench.cli) prints what these return.

    import posbench
    runs = posbench.training(scheme="rope", steps=200, plugins=["my_pe.py"])
    table = posbench.extrapolate(lengths=[64, 128, 256])
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Iterable, Sequence

import pandas as pd

from posbench import config, layout, plugins, results
from posbench.errors import PosbenchError


def split_names(value: str | Iterable[str] | None) -> tuple[str, ...] | None:
    """A comma-separated string or a list, as the command line's list options take them."""
    if value is None:
        return None
    items = value.split(",") if isinstance(value, str) else [str(v) for v in value]
    names = tuple(x.strip() for x in items if x.strip())
    if not names:
        raise PosbenchError(f"empty list {value!r}")
    return names


def _ints(value: str | Sequence[int] | None, what: str) -> tuple[int, ...] | None:
    if value is None:
        return None
    return config.parse_int_list(value if isinstance(value, str) else ",".join(map(str, value)), what)


def _params(value: dict[str, Any] | Sequence[str] | None) -> dict[str, Any]:
    if isinstance(value, dict):
        return {str(k): str(v) for k, v in value.items()}
    return config.parse_params(list(value) if value else None)


def _frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The rows as a DataFrame; `attrs["rows"]` keeps them as written (None, not NaN, for an
    empty cell), which is what the command line prints from."""
    frame = pd.DataFrame(rows)
    frame.attrs["rows"] = rows
    return frame


def train(scheme: str, *, task: str | None = None, data: str | None = None, train_len: int | None = None,
          steps: int | None = None, batch_size: int | None = None, d_model: int | None = None,
          layers: int | None = None, heads: int | None = None, lr: float | None = None, seed: int | None = None,
          param: dict[str, Any] | Sequence[str] | None = None, randomize_positions: bool | None = None,
          device: str = "auto", dtype: str | None = None, compile: str | None = None,
          tokenizer: str | None = None, vocab_size: int | None = None, runs_dir: str | Path = "runs",
          resume: bool = False, tracker: str | None = None, plugins: Sequence[str] = (),
          progress: bool = False, overwrite: bool = False) -> pd.DataFrame:
    """Train one model; its runs.csv row (one row; `run_dir` and `skipped` added). A finished run
    is kept (`skipped`) unless `overwrite`, which trains it again from scratch."""
    from posbench import training

    if resume and overwrite:
        raise PosbenchError("--resume continues a run and --overwrite trains it again from scratch: give one")
    _load(plugins)
    scheme = layout.check(scheme)
    t = config.load_task(task)
    t = dataclasses.replace(
        t,
        data=config.replace(t.data, spec=data, tokenizer=tokenizer, vocab_size=vocab_size),
        model=config.replace(t.model, d_model=d_model, n_layers=layers, n_heads=heads),
        # a probe's examples train with the task's settings for that probe, as `posbench run` does
        train=config.replace(t.train_for(data or t.data.spec), train_len=train_len, steps=steps,
                             batch_size=batch_size, lr=lr, randomize_positions=randomize_positions, dtype=dtype,
                             compile=compile, tracker=tracker),
    )
    if seed is not None:
        config.check_seed(seed)
    spec = training.RunSpec(scheme=scheme, params={**t.params.get(scheme, {}), **_params(param)},
                            seed=t.seeds[0] if seed is None else seed, data=t.data, model=t.model, train=t.train,
                            task=t.name)
    result = training.train(spec, Path(runs_dir), device=device, resume=resume, progress=progress, overwrite=overwrite)
    return _frame([{**result.row, "run_dir": str(result.run_dir), "skipped": result.skipped}])


def extrapolate(*, runs_dir: str | Path = "runs", scheme: str | Iterable[str] | None = None,
                task: str | None = None, lengths: str | Sequence[int] | None = None, mode: str | None = None,
                stride: int | None = None, tokens: int | None = None,
                rope_scaling: str | Iterable[str] | None = None, scaling_factor: float | None = None,
                yarn_alpha: float | None = None, yarn_beta: float | None = None, llama3_low: float | None = None,
                llama3_high: float | None = None, self_extend_group: int | None = None,
                self_extend_window: int | None = None, rerope_window: int | None = None,
                rerope_leak: float | None = None, learned_extension: str | Iterable[str] | None = None,
                position_draws: int | None = None, tolerance: float | None = None, device: str = "auto",
                out: str | Path | None = None, attention: bool = False, plugins: Sequence[str] = (),
                progress: bool = False, model: str | None = None,
                longrope_factors: str | Sequence[float] | None = None) -> pd.DataFrame:
    """Evaluate every trained run at every length: the extrapolation rows (also written, with
    positions.csv, windows.csv, effective_length.csv and the plots, to `out` or `runs_dir`; with
    `attention`, attention.csv and its plots too, posbench.attention_measures). `model`
    (hf:FOLDER or gguf:FILE; or the task's [model] pretrained): that pretrained model instead of
    trained runs, under the task `pretrained` unless one is named (posbench.pretrained)."""
    from posbench import effective, evaluate, report

    _load(plugins)
    t = config.load_task(task or ("pretrained" if model else None))
    cfg = config.replace(
        t.eval, lengths=_ints(lengths, "lengths"), mode=mode, stride=stride, tokens=tokens,
        rope_scaling=split_names(rope_scaling), rope_scaling_factor=scaling_factor, yarn_alpha=yarn_alpha,
        yarn_beta=yarn_beta, llama3_low=llama3_low, llama3_high=llama3_high, self_extend_group=self_extend_group,
        self_extend_window=self_extend_window, rerope_window=rerope_window, rerope_leak=rerope_leak,
        learned_extension=split_names(learned_extension), position_draws=position_draws,
        effective_tolerance=tolerance, longrope_factors=_floats(longrope_factors),
    )
    out_dir = Path(out or runs_dir)
    if model or t.pretrained:
        from posbench import pretrained

        if attention:
            raise PosbenchError("--attention measures posbench's own models; a pretrained model has no such path")
        rows = pretrained.extrapolate(model or t.pretrained, cfg, t.data.spec, out_dir, t.name, progress,
                                      _task_folder(task))
    else:
        rows = evaluate.extrapolate(Path(runs_dir), cfg, _schemes(scheme), out_dir, device, progress=progress,
                                    attention=attention)
    effective.write(out_dir, cfg.effective_tolerance, cfg.effective_threshold)
    extrapolation = results.read_rows(results.table_path(out_dir, "extrapolation"))
    report.plot_extrapolation(extrapolation, out_dir / "extrapolation.png")
    if attention:
        from posbench import attention_measures

        measured = results.read_rows(results.table_path(out_dir, "attention"))
        attention_measures.plot(measured, out_dir / "attention.png", extrapolation)
        attention_measures.plot_layers(measured, out_dir / "attention_layers.png")
    report.plot_positions(results.read_rows(results.table_path(out_dir, "positions")), out_dir / "positions.png")
    return _frame(rows)


def speed(*, schemes: str | Iterable[str] | None = None, task: str | None = None,
          lengths: str | Sequence[int] | None = None, batch_size: int | None = None, heads: int | None = None,
          head_dim: int | None = None, dtype: str | None = None, device: str = "auto",
          backward: bool | None = None, repeats: int | None = None, out: str | Path = "runs",
          plugins: Sequence[str] = ()) -> pd.DataFrame:
    """Time each scheme's attention layer: the speed rows (also written to out/speed.csv)."""
    from posbench.timing import run_speed

    _load(plugins)
    s = config.replace(config.load_task(task).speed, lengths=_ints(lengths, "lengths"), batch_size=batch_size,
                       heads=heads, head_dim=head_dim, dtype=dtype, backward=backward, repeats=repeats)
    names = split_names(schemes)
    return _frame(run_speed(schemes=list(names) if names else None, lengths=s.lengths, batch_size=s.batch_size,
                            heads=s.heads, head_dim=s.head_dim, dtype=s.dtype, device=device, backward=s.backward,
                            repeats=s.repeats, out_dir=out))


def probe(probe: str | Iterable[str], *, runs_dir: str | Path = "runs", task: str | None = None,
          scheme: str | Iterable[str] | None = None, lengths: str | Sequence[int] | None = None,
          trials: int | None = None, seed: int | None = None, rope_scaling: str | Iterable[str] | None = None,
          position_draws: int | None = None, device: str = "auto", out: str | Path | None = None,
          plugins: Sequence[str] = (), progress: bool = False, model: str | None = None,
          longrope_factors: str | Sequence[float] | None = None) -> pd.DataFrame:
    """Score every run trained on the probes' examples: the probes rows (also written). `model`
    (or the task's [model] pretrained): the passkey test of that pretrained model, under the task
    `pretrained` unless one is named (posbench.pretrained)."""
    from posbench import probing
    from posbench.probes import parse_probe, probe_name

    _load(plugins)
    names = split_names(probe)
    if not names:
        raise PosbenchError("name probes with probe=NAME[,NAME] (see `posbench probe --list`)")
    for name in names:
        parse_probe(name)
    t = config.load_task(task or ("pretrained" if model else None))
    cfg = config.replace(t.probes, lengths=_ints(lengths, "lengths"), trials=trials, seed=seed)
    eval_cfg = config.replace(t.eval, rope_scaling=split_names(rope_scaling), position_draws=position_draws,
                              longrope_factors=_floats(longrope_factors))
    if model or t.pretrained:
        from posbench import pretrained

        if names != ("passkey",):
            raise PosbenchError("a pretrained model takes the passkey probe (--probe passkey): the other probes "
                                "are written in posbench's symbol vocabulary for the models it trains")
        return _frame(pretrained.passkey(model or t.pretrained, cfg, eval_cfg, cfg.lengths or t.eval.lengths,
                                         Path(out or runs_dir), t.name, progress, _task_folder(task)))
    rows = probing.evaluate(Path(runs_dir), cfg, eval_cfg, tuple(probe_name(n) for n in names), _schemes(scheme),
                            Path(out or runs_dir), device, progress=progress)
    return _frame(rows)


def run(task: str, *, shard: str | None = None, resume: bool = False, out: str | Path | None = None,
        device: str = "auto", speed: bool = True, compile: str | None = None,
        seeds: str | Sequence[int] | None = None, schemes: str | Iterable[str] | None = None,
        tracker: str | None = None, plugins: Sequence[str] = (), progress: bool = False,
        log=None, workers: int | str | None = None) -> dict[str, pd.DataFrame]:
    """A whole grid, as `posbench run`: every table of the output folder by name (runs,
    extrapolation, probes, speed, ...), read back once the grid and its report are written.
    Raises PosbenchError naming the runs whose training failed."""
    from posbench import grid, report, trackers, workers as pool

    _load(plugins)
    t = config.load_task(task)
    if t.pretrained:
        raise PosbenchError(f"task {t.name} evaluates the pretrained model {t.pretrained} and trains nothing: "
                            f"posbench extrapolate --task {task}; posbench probe --task {task} --probe passkey")
    t = dataclasses.replace(t, train=config.replace(t.train, compile=compile, tracker=tracker))
    trackers.require(t.train.tracker)
    if seeds is not None or schemes is not None:
        t = config.replace(t, seeds=_ints(seeds, "seeds"), schemes=split_names(schemes))
    out_dir = Path(out or Path("runs") / t.name)
    done = pool.run_task(t, out_dir, grid.parse_shard(shard), resume, device, progress=progress, speed=speed,
                         log=log or (lambda m: None), workers=workers)
    report.write_report(out_dir, t.eval.effective_tolerance, t.eval.effective_threshold)
    tables = {name: _frame(results.read_rows(results.table_path(out_dir, name)))
              for name in results.TABLES if results.table_path(out_dir, name).exists()}
    if done["failed"]:
        raise PosbenchError(f"training failed for {', '.join(done['failed'])} (recorded as failed in "
                            f"{results.table_path(out_dir, 'runs')})")
    return tables


def inspect(schemes: str | Iterable[str] | None = None, *, run: str | None = None,
            runs_dir: str | Path | None = None, task: str | None = None, train_len: int | None = None,
            lengths: str | Sequence[int] | None = None, rope_scaling: str | Iterable[str] | None = None,
            device: str = "auto", out: str | Path = "inspect", plugins: Sequence[str] = (),
            progress: bool = False) -> pd.DataFrame:
    """Pictures of each encoding to the longest of `lengths` (default 16x the training length),
    or, with `run` (a run_id in `runs_dir`, default runs) or `runs_dir` alone (its runs of
    `schemes`, or all), of the trained runs' learned parameters and their attention by length
    (attention.csv, posbench.attention_measures), written to `out` with inspect.md: one row per
    picture (scheme, kind, caption, path); `attrs["pictures"]` holds the arrays drawn."""
    from posbench import evaluate, inspection

    _load(plugins)
    t = config.load_task(task)
    names = split_names(schemes)
    out_dir = Path(out)
    if run is None and runs_dir is None:
        if not names:
            raise PosbenchError("name the schemes to draw (e.g. rope,alibi), or a trained run with --run / --runs-dir")
        checked = [layout.check(n) for n in names]
        scalings = [evaluate.scaling_of(k, t.eval) for k in split_names(rope_scaling) or ()]
        if train_len is not None and not 1 <= train_len <= inspection.MAX_POSITIONS:
            raise PosbenchError(f"--train-len must be between 1 and {inspection.MAX_POSITIONS}, got {train_len}")
        dims = inspection.dims_for(t, train_len)
        n = max(_ints(lengths, "lengths") or (16 * dims.train_len,))
        if not 2 <= n <= inspection.MAX_POSITIONS:
            raise PosbenchError(f"draw to between 2 and {inspection.MAX_POSITIONS} positions, not {n} "
                                "(the pictures hold n x n matrices)")
        drawn = inspection.inspect_schemes(checked, dims, n, out_dir, scalings)
        notes = [f"Drawn by `posbench inspect` with the {t.name} task's model (d_model {dims.d_model}, "
                 f"{dims.n_heads} heads of {dims.head_dim}); training length L = {dims.train_len} (dashed), "
                 f"to {n} positions."]
        path = inspection.markdown(drawn, out_dir, "What each encoding looks like", notes)
    else:
        home = Path(runs_dir or "runs")
        if run is not None and names:
            raise PosbenchError("name schemes (with --runs-dir: its runs of them) or one run with --run, not both")
        if run is not None:
            runs = [home / run]
            if not (runs[0] / "config.json").exists():
                raise PosbenchError(f"no run {run!r} in {home}")
        else:
            runs = evaluate.find_runs(home, _schemes(names))
            if not runs:
                raise PosbenchError(f"no finished runs{' of ' + ', '.join(names) if names else ''} in {home}")
        path, drawn = inspection.inspect_runs(runs, t, _ints(lengths, "lengths"), out_dir, device, progress)
    rows = [{"scheme": p.scheme, "kind": p.kind, "caption": p.caption, "path": str(p.path or "")} for p in drawn]
    frame = _frame(rows)
    frame.attrs["pictures"] = drawn
    frame.attrs["page"] = str(path)
    return frame


def check(scheme: str, *, param: dict[str, Any] | Sequence[str] | None = None,
          skip: str | Iterable[str] | None = None, plugins: Sequence[str] = ()) -> pd.DataFrame:
    """The conformance report of a scheme: one row per property (property, status, detail)."""
    from posbench.conformance import check as conformance

    _load(plugins)
    findings = conformance(scheme, _params(param), skip=split_names(skip) or ())
    return _frame([dataclasses.asdict(f) for f in findings])


def _floats(value: str | Sequence[float] | None) -> tuple[float, ...] | None:
    """LongRoPE factors, comma-separated or a list."""
    if value is None:
        return None
    items = value.split(",") if isinstance(value, str) else list(value)
    try:
        return tuple(float(v) for v in items if str(v).strip())
    except ValueError:
        raise PosbenchError(f"bad longrope factors {value!r}: expected comma-separated numbers") from None


def _task_folder(task: str | None) -> Path | None:
    """The folder of a task file, against which its relative paths (a pretrained model) are read."""
    path = config.find_task(task) if task else None
    return path.resolve().parent if path is not None else None


def _schemes(value) -> tuple[str, ...] | None:
    names = split_names(value)
    return tuple(layout.recorded(n) for n in names) if names else names


def _load(specs: Sequence[str]) -> None:
    if isinstance(specs, str):
        specs = [specs]
    plugins.load_all(specs)
