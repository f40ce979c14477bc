"""The options of the commands, each declared once: those several commands share (task, device,
runs folder, output folder, scheme selection, ...) as annotated types, and every knob of a typed
config (posbench.knobs) as a flag, a keyword and a line of posbench/docs/commands.md at once.

A command function names its options with these types; `takes(*configs)` adds the flag fields of
those configs to its signature, so that typer (posbench.cli) and Python callers see the same
keywords, and `settings(obj, given)` applies what the caller gave to a config, parsed and checked.
"""

import dataclasses
import functools
import inspect
import typing
from pathlib import Path
from typing import Annotated, Any, Callable, Iterable, List, Optional, Sequence

import typer

from posbench import config, plugins
from posbench.errors import PosbenchError, did_you_mean
from posbench.knobs import FLAG

Task = Annotated[Optional[str], typer.Option(help="task name in tasks/ or a TOML path; its settings are the "
                                                  "defaults (default: quick)")]
Device = Annotated[str, typer.Option(help="auto | cpu | cuda")]
RUNS_DIR = "where the trained runs and runs.csv are"
RunsDir = Annotated[Path, typer.Option(help=RUNS_DIR)]
Out = Annotated[Optional[Path], typer.Option(help="where the tables and plots go (the command says its default)")]
Schemes = Annotated[Optional[List[str]], typer.Option(
    "--schemes", "--scheme", help="only these schemes, presets or layouts (comma-separated or repeated)")]
Param = Annotated[Optional[List[str]], typer.Option(help="scheme parameter KEY=VALUE (repeatable)")]
Resume = Annotated[bool, typer.Option(help="continue interrupted work: trainings from their checkpoints; "
                                             "probe: keep the cells (with --model or --prompts, the prompts too) already read in --out")]
Model = Annotated[Optional[str], typer.Option(
    help="hf:FOLDER | gguf:FILE: a pretrained RoPE model, read from local files only, in place of trained "
         "runs; its default task is `pretrained` (posbench/docs/pretrained.md)")]
ModelDtype = Annotated[Optional[str], typer.Option(
    "--dtype", help="with --model: float32 | bfloat16, what the pretrained model's weights compute in (bfloat16: "
                    "as RULER and vLLM run models; on a CPU with AMX several times faster; default: the task's "
                    "[model] dtype, else float32). Its rows carry +bfloat16 in the model's name and run_id")]
Tolerance = Annotated[float, typer.Option(help="effective length: perplexity within this fraction of "
                                               "in-distribution")]
Threshold = Annotated[float, typer.Option(help="effective length of probes: accuracy at least this far from "
                                               "chance to 100% (0.5: half-way)")]
Share = Annotated[float, typer.Option(help="effective length of probes, relative basis: accuracy at least this "
                                          "share of the run's own at the training length")]


def trained_only(dtype: str | None) -> None:
    """--dtype is a pretrained model's: a trained run is scored in the dtype it trained in."""
    if dtype not in (None, "float32"):
        raise PosbenchError(f"--dtype {dtype} is for a pretrained model (--model); a trained run is scored in "
                            "the dtype it trained in ([train] dtype)")


# Keywords the Python API takes and the command line does not: plug-ins come from the pre-parsed
# --plugin there (posbench.cli), progress bars from whether stderr is a terminal.
API_ONLY = ("plugins", "progress", "log")


def flag_name(f: dataclasses.Field) -> str:
    named = f.metadata.get(FLAG)
    return named if isinstance(named, str) else f.name


def knob_fields(*configs: type, only: Sequence[str] = ()) -> dict[str, tuple[type, dataclasses.Field]]:
    """Flag name -> (config class, field) of every flag field of `configs` (or of those named)."""
    out = {}
    for cls in configs:
        for f in dataclasses.fields(cls):
            name = flag_name(f)
            if f.metadata.get(FLAG) and (not only or name in only):
                out.setdefault(name, (cls, f))  # a name two configs share is the first one's
    return out


def _annotation(cls: type, f: dataclasses.Field):
    hint = typing.get_type_hints(cls)[f.name]
    name = "--" + flag_name(f).replace("_", "-")
    if hint is bool:
        return Annotated[Optional[bool], typer.Option(f"{name}/--no-{name[2:]}", help=f.metadata["help"])]
    if typing.get_origin(hint) is tuple:  # a list on the command line: comma-separated
        return Annotated[Optional[str], typer.Option(name, help=f"{f.metadata['help']} (comma-separated)")]
    return Annotated[Optional[hint], typer.Option(name, help=f.metadata["help"])]


def takes(*configs: type, only: Sequence[str] = ()) -> Callable:
    """A command that also takes the flag fields of `configs` (or those named in `only`) as
    keyword-only options, each defaulting to the task's value; they arrive in its `**given`."""
    fields = knob_fields(*configs, only=only)

    def decorate(fn):
        sig = inspect.signature(fn, eval_str=True)
        params = [p for p in sig.parameters.values() if p.kind is not p.VAR_KEYWORD]
        added = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=_annotation(cls, f))
                 for name, (cls, f) in fields.items()]

        @functools.wraps(fn)
        def command(*args, **kwargs):
            known = {p.name for p in params} | set(fields)
            for key in kwargs:
                if key not in known:
                    raise did_you_mean(key, sorted(known), f"keyword of posbench.{fn.__name__}")
            return fn(*args, **kwargs)

        command.__signature__ = sig.replace(parameters=params + added)
        command.knobs = fields
        return command

    return decorate


def settings(obj, given: dict[str, Any]):
    """`obj` (a config) with the flag fields the caller gave, parsed (a comma-separated string or a
    list for a tuple) and checked; flags of other configs in `given` are left alone."""
    changes = {}
    for f in dataclasses.fields(obj):
        name = flag_name(f)
        value = given.get(name) if f.metadata.get(FLAG) else None
        if value is None:
            continue
        hint = typing.get_type_hints(type(obj))[f.name]
        if typing.get_origin(hint) is tuple:
            value = config.parse_list(value, typing.get_args(hint)[0], name)
        changes[f.name] = value
    return config.replace(obj, **_typed(obj, changes))


def _typed(obj, changes: dict[str, Any]) -> dict[str, Any]:
    """The changes with each value of the field's type, checked as a task file's (one line if not)."""
    return {k: config.coerce_field(type(obj), k, list(v) if isinstance(v, tuple) else v) for k, v in changes.items()}


def names(value: str | Iterable[str] | None) -> tuple[str, ...] | None:
    """A comma-separated string or a list (repeated options), as the list options take them."""
    if value is None:
        return None
    return config.parse_list(value if isinstance(value, str) else ",".join(map(str, value)), str, "list")


def scheme_names(value: str | Iterable[str] | None) -> tuple[str, ...] | None:
    """Scheme selection, each checked: schemes, presets and layout specs, as their runs record them."""
    from posbench import layout  # the schemes, with torch: when a command runs, not when the line is built

    found = names(value)
    return tuple(layout.recorded(n) for n in found) if found else found


def ints(value: str | Sequence[int] | None, what: str) -> tuple[int, ...] | None:
    return None if value is None else config.parse_list(value, int, what)


def params(value: dict[str, Any] | Sequence[str] | None) -> dict[str, Any]:
    if isinstance(value, dict):
        return {str(k): str(v) for k, v in value.items()}
    return config.parse_params(list(value) if value else None)


def load_plugins(specs: Sequence[str] | str) -> None:
    plugins.load_all([specs] if isinstance(specs, str) else specs)


def reading(task: str | None, model: str | None) -> config.Task:
    """The task an evaluation command reads under: --task, else the pretrained task for --model, else
    the default."""
    return config.load_task(task or ("pretrained" if model else None))


def models(t, task: str | None, runs_dir: Path, schemes, model: str | None, dtype: str | None, device: str):
    """What an evaluation command reads (posbench.readings.Models): --model or the task's pretrained
    model, else the finished runs of the runs folder (of --schemes); --dtype is a pretrained model's."""
    from posbench.readings import Models

    model = model or t.pretrained
    if not model:
        trained_only(dtype)
    return Models(Path(runs_dir), scheme_names(schemes), model=model, task=t.name, corpus=t.data.spec,
                  base=task_folder(task), device=device, dtype=dtype or t.pretrained_dtype)


def task_folder(task: str | None) -> Path | None:
    """The folder of a task file, against which its relative paths (a pretrained model) are read."""
    path = config.find_task(task) if task else None
    return path.resolve().parent if path is not None else None
