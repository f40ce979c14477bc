"""Plug-ins: schemes and probes written outside posbench, registered exactly as the built-ins are.

A plug-in is a Python file or an importable module that imports `posbench.schemes.Scheme` and
`posbench.schemes.register` (or `posbench.probes.Probe` and `posbench.probes.register`) and
decorates its classes. Three ways in, all through `load`: `--plugin PATH_OR_MODULE` on any
command, `plugins = [...]` in a task file (paths relative to the file), and installed
distributions declaring entry points in the group ``posbench.plugins`` (`load_installed`).

Every class registered while a plug-in is imported remembers its `Source`: the file and the sha256
of its bytes. That hash enters the run_id of every run using the class (posbench.runs.RunSpec),
so an edited plug-in trains a new run and never resumes or scores an old one.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import sys
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from posbench.errors import PosbenchError, first_line

GROUP = "posbench.plugins"


@dataclass(frozen=True)
class Source:
    """Where a plug-in's classes come from."""

    path: str  # the file imported, absolute
    sha256: str  # of the file's bytes
    origin: str = ""  # "" for a file given by path; "module NAME"; "distribution NAME VERSION"

    @property
    def label(self) -> str:
        """How listings show it: the file, or the distribution or module it came from."""
        return self.origin or self.path

    def record(self) -> dict[str, str]:
        return {"path": self.path, "sha256": self.sha256}


_loaded: dict[str, Source] = {}  # module name or resolved path -> source
_loading: list[Source] = []  # the plug-in being imported (registrations made now belong to it)
_undo: list[Callable[[], None]] = []  # how to unregister what the import in progress registered


def loading() -> Source | None:
    """The plug-in whose import is in progress, if any: a registry records it on each class."""
    return _loading[-1] if _loading else None


def registered(unregister: Callable[[], None]) -> None:
    """A registry says how to take back a class registered during a plug-in's import, so that a
    plug-in that fails half-way leaves nothing of itself behind."""
    if _loading:
        _undo.append(unregister)


def enter(registry: dict, kind: str, name: str, cls):
    """Register `cls` as `name` in `registry` (schemes, policies, probes): a name taken is refused,
    naming where the class that holds it came from; the class records the plug-in it came from,
    and a plug-in that fails half-way takes it back. Returns the class."""
    if name in registry:
        raise PosbenchError(f"{kind} {name!r} clashes with the {kind} of that name from {describe(registry[name])}")
    cls.plugin_source = loading()
    registry[name] = cls
    registered(lambda: registry.pop(name, None))
    return cls


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def load(spec: str, base: Path | None = None) -> Source:
    """Import plug-in `spec`: a path to a .py file (relative to `base`, else the working folder)
    or a module name. Loading the same file or module again is a no-op."""
    resolved = resolve(spec, base)
    if isinstance(resolved, Path):
        return _load_file(resolved, str(spec))
    return _load_module(resolved, origin=f"module {resolved}")


def resolve(spec: str, base: Path | None = None) -> Path | str:
    """A plug-in's file as an absolute path (relative to `base`, else the working folder), or
    its module name."""
    spec = str(spec).strip()
    if not spec:
        raise PosbenchError("a plugin is a file or a module name, got an empty string")
    if spec.endswith(".py") or "/" in spec or "\\" in spec:
        path = Path(spec).expanduser()
        return (path if path.is_absolute() else (base or Path.cwd()) / path).resolve()
    return spec


def load_all(specs, base: Path | None = None) -> list[Source]:
    return [load(s, base) for s in specs or ()]


def load_installed() -> list[Source]:
    """Every installed distribution's entry point in the group `posbench.plugins`."""
    out = []
    for ep in importlib.metadata.entry_points(group=GROUP):
        dist = f"distribution {ep.dist.name} {ep.dist.version}" if ep.dist is not None else f"entry point {ep.name}"
        out.append(_load_module(ep.module, origin=dist))
    return out


def _load_file(path: Path, given: str) -> Source:
    if not path.is_file():
        raise PosbenchError(f"plugin {given}: no such file ({path})")
    key = str(path)
    digest = sha256_of(path)
    for source in _loaded.values():  # given by path here, maybe by module name before
        if source.path == key:
            if source.sha256 != digest:
                raise PosbenchError(f"plugin {given} changed since it was loaded in this process")
            return source
    source = Source(key, digest)
    name = f"posbench_plugin_{digest[:16]}"
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise PosbenchError(f"plugin {given}: not a Python file")
    module = importlib.util.module_from_spec(module_spec)
    with _importing(source, given):
        sys.modules[name] = module
        try:
            module_spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(name, None)
            raise
    _loaded[key] = source
    return source


def _load_module(name: str, origin: str) -> Source:
    if name in _loaded:
        return _loaded[name]
    try:
        module_spec = importlib.util.find_spec(name)
    except (ImportError, ValueError) as e:
        raise PosbenchError(f"plugin {name}: {e}") from None
    if module_spec is None or not module_spec.origin or not Path(module_spec.origin).is_file():
        raise PosbenchError(f"plugin {name}: no such file or importable module")
    path = Path(module_spec.origin).resolve()
    source = Source(str(path), sha256_of(path), origin)
    with _importing(source, name):
        importlib.import_module(name)
    _loaded[name] = source
    return source


@contextmanager
def _importing(source: Source, given: str) -> Iterator[None]:
    """Registrations made inside belong to `source`; an import that fails takes them back and
    becomes one line naming the file, the line and the error."""
    _loading.append(source)
    mark = len(_undo)
    try:
        yield
    except KeyboardInterrupt:
        _take_back(mark)
        raise
    except SystemExit as e:  # a plug-in that ends the process at import: said, not obeyed
        _take_back(mark)
        raise PosbenchError(f"plugin {given}: {_where(e, source.path)}calls sys.exit({_exit_code(e)}) at import; "
                            "a plug-in only defines and registers its classes") from None
    except BaseException as e:
        _take_back(mark)
        raise PosbenchError(f"plugin {given}: {_where(e, source.path)}{_last_line(e)}") from e
    finally:
        _loading.pop()
        del _undo[mark:]


def _take_back(mark: int) -> None:
    for undo in reversed(_undo[mark:]):
        undo()


def _where(e: BaseException, path: str) -> str:
    """'line N: ' of the plug-in's own line the error arose at (its last frame in the file)."""
    if isinstance(e, SyntaxError) and e.lineno:
        return f"line {e.lineno}: "
    lines = [f.lineno for f in traceback.extract_tb(e.__traceback__) if f.filename == path]
    return f"line {lines[-1]}: " if lines else ""


def _exit_code(e: SystemExit) -> str:
    return "" if e.code is None else repr(e.code)


def _last_line(e: BaseException) -> str:
    if isinstance(e, PosbenchError):
        return str(e)
    return traceback.format_exception_only(type(e), e)[-1].strip()


def blame(e: BaseException) -> str | None:
    """When a loaded plug-in's own code raised `e` (a frame of its file on the traceback, or on
    the traceback of the error it arose from): 'plugin FILE: line N: Type: first line of the
    message', naming the plug-in's last line on the way. None for an error of posbench's own."""
    files = {s.path for s in _loaded.values()}
    seen: set[int] = set()
    cause: BaseException | None = e
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        frames = [f for f in traceback.extract_tb(cause.__traceback__) if str(Path(f.filename).resolve()) in files]
        if frames:
            what = (f"calls sys.exit({_exit_code(e)})" if isinstance(e, SystemExit)
                    else f"{type(e).__name__}: {first_line(e)}")
            return f"plugin {frames[-1].filename}: line {frames[-1].lineno}: {what}"
        cause = cause.__cause__ or cause.__context__
    return None


def as_error(e: BaseException) -> BaseException:
    """An exception raised by a plug-in's code (anywhere: its __init__, a hook at evaluation, a
    range test, sys.exit) as the one-line PosbenchError that names the file and line; any other
    exception as it is (a Ctrl-C stays a Ctrl-C)."""
    if isinstance(e, (PosbenchError, KeyboardInterrupt)):
        return e
    line = blame(e)
    return PosbenchError(line) if line else e


_command_line: list[str] = []  # the --plugin values of this process's command, resolved


def load_command_line(specs: list[str]) -> list[Source]:
    """The plug-ins given with --plugin: loaded, and remembered for what this command hands on
    (a Slurm submission freezes them beside its task)."""
    _command_line.extend(str(resolve(s)) for s in specs)
    return load_all(specs)


def command_line() -> list[str]:
    return list(_command_line)


def loaded() -> list[Source]:
    return list(_loaded.values())


def source_of(cls) -> Source | None:
    """The plug-in a scheme or probe class came from (None: built into posbench)."""
    return getattr(cls, "plugin_source", None)


def describe(cls) -> str:
    source = source_of(cls)
    return source.label if source is not None else "built-in"
