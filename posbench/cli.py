"""The command line, built from the commands (posbench.commands): each command's function gives
its options (its signature) and its help (its docstring), its `show` prints the result."""

from __future__ import annotations

import functools
import inspect
import os
import sys

import click
import typer

from posbench import commands, plugins
from posbench.commands import err, plain
from posbench.commands.options import API_ONLY
from posbench.errors import Interrupted, PosbenchError, interrupted, on_interrupt, out_of_memory

# typer may vendor its own click: catch both.
USAGE_ERRORS = tuple({click.ClickException, getattr(typer, "TyperException", click.ClickException)})
ABORTS = tuple({click.exceptions.Abort, typer.Abort})

INTERRUPTED = "stopped before the command finished; what it had written is kept"
STARTING = "while starting; nothing was read or written"  # as posbench.__main__ says it


class Commands(typer.core.TyperGroup):
    """typer answers a Ctrl-C with a silent exit 130 while it reads the command line (its first
    reading imports and builds its parameter types: a few tenths of a second) and inside a
    command: it goes on to `main` instead, as Interrupted, which says in one line what was kept."""

    def make_context(self, *args, **kwargs):
        with on_interrupt(STARTING):
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx):
        with on_interrupt(INTERRUPTED):
            return super().invoke(ctx)


EPILOG = ("Every command also takes --plugin FILE_OR_MODULE (repeatable: schemes and probes of your own) and "
          "--debug (a traceback instead of one line; or POSBENCH_DEBUG=1).")


def build() -> typer.Typer:
    """The command line: one command per module of posbench.commands, as it stands now."""
    built = typer.Typer(cls=Commands, add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                        help="Train tiny language models that differ only in their positional encoding; measure "
                             "how each extrapolates past its training length and what its attention costs.\n\n"
                             + EPILOG)
    for name in commands.NAMES:
        built.command(name, epilog=EPILOG)(command_line(name))
    return built


def command_line(name: str):
    """Command `name` as typer takes it: the function's signature without the keywords only Python
    callers pass (plug-ins, progress, log), calling its `show` on the result; its exit code."""
    module = commands.module(name)
    fn = getattr(module, name)
    sig = inspect.signature(fn, eval_str=True)
    passes = [k for k in API_ONLY if k in sig.parameters and k != "plugins"]

    @functools.wraps(fn)
    def run(**kwargs):
        extra = {"progress": sys.stderr.isatty(), "log": plain}  # what a command says while it works
        return module.show(fn(**kwargs, **{k: extra[k] for k in passes}))

    run.__doc__ = " ".join(inspect.cleandoc(fn.__doc__).split("\n\n")[0].split())  # the rest speaks to Python callers
    run.__signature__ = sig.replace(parameters=[p for p in sig.parameters.values() if p.name not in API_ONLY])
    del run.__wrapped__  # typer reads __signature__, not the wrapped function's
    return run


app = build()


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
        raise Interrupted(INTERRUPTED) if interrupted(e) else plugins.as_error(e)
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
