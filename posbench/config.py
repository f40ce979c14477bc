"""Tasks: TOML files (one per task, no includes) that name the data, the model, training,
evaluation, timing and the schemes to compare. Unknown keys are errors with a suggestion.

The dataclass defaults are the `quick` task, so the default needs no file at all.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posbench import plugins
from posbench.data import DataConfig
from posbench.effective import LEARNED, THRESHOLD, TOLERANCE
from posbench.errors import PosbenchError, did_you_mean
from posbench.model import ModelConfig
from posbench.schemes.base import MAX_INT, check_number

TASK_VERSION = 1
EVAL_MODES = ("nonoverlap", "sliding")
DTYPES = ("float32", "bfloat16")
COMPILE = ("auto", "on", "off")  # torch.compile of the training forward; auto: on for CUDA
TRACKERS = ("none", "tensorboard", "wandb")  # posbench.trackers
SCHEDULES = ("cosine", "constant")  # the lr after warm-up (posbench.training.lr_at)


@dataclass(frozen=True)
class TrainConfig:
    train_len: int = 64
    steps: int = 500
    batch_size: int = 32
    lr: float = 2e-3
    warmup: int = 50
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    eval_interval: int = 100
    eval_windows: int = 64  # validation windows of train_len, scored at every eval_interval
    checkpoint_interval: int = 100
    randomize_positions: bool = False
    randomize_max: int = 2048  # L_max of randomized positions (Ruoss et al.)
    stop_accuracy: float = 0.0  # probes: stop once the validation accuracy reaches it (0: never)
    schedule: str = "cosine"  # after warm-up: cosine decay to 10% of lr, or constant (fine-tuning)
    dtype: str = "float32"
    compile: str = "auto"
    tracker: str = "none"  # training curves also in tensorboard | wandb (posbench.trackers)


@dataclass(frozen=True)
class EvalConfig:
    lengths: tuple[int, ...] = (64, 128, 256, 512, 1024)
    mode: str = "nonoverlap"
    stride: int = 0  # sliding only; 0 means half the window
    tokens: int = 16384  # tokens scored at every length
    batch_tokens: int = 16384  # tokens per forward (windows per batch = batch_tokens // L)
    rope_scaling: tuple[str, ...] = ("none",)
    rope_scaling_factor: float = 0.0  # 0: L_eval / L_train
    yarn_alpha: float = 1.0
    yarn_beta: float = 32.0
    llama3_low: float = 1.0  # wavelengths above train_len / llama3_low are interpolated fully
    llama3_high: float = 4.0  # wavelengths below train_len / llama3_high are kept
    self_extend_group: int = 8  # Self-Extend G (posbench/docs/extension.md)
    self_extend_window: int = 0  # Self-Extend W, the neighbour window; 0: train_len / 4 to the nearest multiple of G
    rerope_window: int = 0  # ReRoPE w (posbench/docs/extension.md); 0: train_len / 4
    rerope_leak: float = 0.0  # ReRoPE k: 0 clips relative positions at w; k >= 1: leaky ReRoPE
    longrope_factors: tuple[float, ...] = ()  # LongRoPE lambda_t per rotated pair: longrope in rope_scaling
    learned_extension: tuple[str, ...] = ("none",)
    position_buckets: int = 16
    position_draws: int = 4  # randomized runs: position draws averaged per length (posbench.positions)
    effective_tolerance: float = TOLERANCE  # effective length: perplexity within this of in-distribution
    effective_threshold: float = THRESHOLD  # effective length of probes: accuracy this far from chance to 1
    learned_threshold: float = LEARNED  # probes: in-length accuracy below it reads `not learned`


@dataclass(frozen=True)
class SpeedConfig:
    lengths: tuple[int, ...] = (256, 512, 1024, 2048)
    batch_size: int = 1
    heads: int = 8
    head_dim: int = 64
    dtype: str = "float32"
    backward: bool = True
    repeats: int = 5


@dataclass(frozen=True)
class ProbesConfig:
    """Synthetic probes (posbench.probes): one model per probe x scheme x seed, trained on the
    probe's examples, scored by per-answer accuracy and exact match per prompt length."""

    names: tuple[str, ...] = ()  # probe data specs, e.g. "passkey", "copy:size=1-40"; empty: none
    lengths: tuple[int, ...] = ()  # empty: 1x, 2x, 4x and 8x each run's training length
    trials: int = 100  # prompts per (length, variant)
    seed: int = 0  # of the prompts: every scheme answers the same ones
    randomized: tuple[str, ...] = ()  # schemes also trained with randomized positions (Ruoss et al.)
    # probe name -> [train] keys that differ for the runs on that probe's examples
    # ([probes.train.copy] train_len = 32): each probe learned at a size a tiny model can learn
    train: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class ExtendConfig:
    """Extension by fine-tuning (posbench.extend; posbench/docs/extension.md): every finished parent of a scheme
    of `methods` fine-tuned with each of its methods to `target_len`, once per budget of `steps`
    (steps of the parent's batch size at target_len: every method of one parent gets the same
    tokens), with the parent's optimizer settings but this lr, warm-up and schedule."""

    methods: dict[str, tuple[str, ...]] = field(default_factory=dict)  # scheme -> methods; empty: none
    target_len: int = 256
    steps: tuple[int, ...] = (50,)
    lr: float = 2e-4  # a tenth of the quick task's: fine-tuning lr well below pretraining (PI, YaRN)
    warmup: int = 5
    schedule: str = "constant"
    yarn_alpha: float = 1.0
    yarn_beta: float = 32.0
    # LongRoPE's evolutionary search (posbench/docs/extension.md): posbench's small preset, 16 + 10 x 16 evaluations
    population: int = 16
    parents: int = 8  # the best kept each iteration
    mutation: float = 0.3  # chance that a mutation redraws each factor
    iterations: int = 10
    search_windows: int = 4  # validation windows of target_len that score a candidate
    # DroPE's recalibration (posbench.extend): its Llama-2 7B run recalibrates at a third of the
    # model's pretraining peak (1e-4 after 3e-4), cosine after the warm-up; a third of the quick
    # task's 2e-3
    drope_lr: float = 7e-4
    drope_schedule: str = "cosine"


@dataclass(frozen=True)
class Task:
    name: str = "quick"
    plugins: tuple[str, ...] = ()  # plug-in files (absolute once read) or module names
    version: int = TASK_VERSION
    description: str = "CPU-sized comparison on the built-in corpus: one scheme in about a minute"
    schemes: tuple[str, ...] = ("none", "sinusoidal", "learned", "rope", "alibi", "t5")
    seeds: tuple[int, ...] = (0,)
    params: dict[str, dict[str, Any]] = field(default_factory=dict)  # scheme -> {param: value}
    data: DataConfig = DataConfig()
    model: ModelConfig = ModelConfig()
    train: TrainConfig = TrainConfig()
    eval: EvalConfig = EvalConfig()
    speed: SpeedConfig = SpeedConfig()
    probes: ProbesConfig = ProbesConfig()
    extend: ExtendConfig = ExtendConfig()
    pretrained: str = ""  # [model] pretrained: hf:FOLDER or gguf:FILE evaluated in place of trained runs
    workers: int | str = 1  # worker processes of `posbench run` (a number, or "auto"; posbench.workers)

    def train_for(self, spec: str) -> TrainConfig:
        """The training settings of runs on data `spec`: [train], with the keys of
        [probes.train.NAME] where `spec` is the documents of probe NAME."""
        from posbench.probes import probe_name

        name = probe_name(spec)
        changes = self.probes.train.get(name)
        if not changes:
            return self.train
        return build(TrainConfig, {**dataclasses.asdict(self.train), **changes}, f"probes.train.{name}")


def shipped_tasks_dir() -> Path:
    """The task files that ship with posbench: posbench/tasks, package data in a wheel and a link
    to the top-level tasks/ in a checkout (that folder itself where git wrote the link as a file)."""
    package = Path(__file__).resolve().parent
    return package / "tasks" if (package / "tasks").is_dir() else package.parent / "tasks"


def task_files() -> dict[str, Path]:
    """Task name -> file: the shipped tasks, then the current folder's tasks/, which wins on a
    name clash (a user edits a copy there)."""
    found: dict[str, Path] = {}
    for directory in (shipped_tasks_dir(), Path.cwd() / "tasks"):
        found.update((p.stem, p) for p in sorted(directory.glob("*.toml")))
    return found


def find_task(name_or_path: str) -> Path | None:
    path = Path(name_or_path)
    if path.suffix == ".toml" or path.exists():
        return path
    return task_files().get(name_or_path)


def known_tasks() -> list[str]:
    return sorted(task_files())


def load_task(name_or_path: str | None) -> Task:
    """A task by file path or by name in tasks/; None is the default task."""
    if name_or_path is None:
        path = find_task("quick")
        return _parse(path) if path is not None else Task()
    path = find_task(name_or_path)
    if path is None:
        raise did_you_mean(name_or_path, known_tasks(), "task")
    if not path.is_file():
        raise PosbenchError(f"task file {str(path)!r} does not exist")
    return _parse(path)


def _parse(path: Path) -> Task:
    try:
        raw = tomllib.loads(path.read_bytes().decode("utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise PosbenchError(f"{path}: invalid TOML: {e}") from None
    except UnicodeDecodeError as e:
        raise PosbenchError(f"{path}: not UTF-8 text (byte {e.start})") from None
    except OSError as e:
        raise PosbenchError(f"cannot read task {path}: {e.strerror}") from None
    raw.setdefault("name", path.stem)
    model = raw.get("model")
    if isinstance(model, dict) and "pretrained" in model:
        # the task's, not a ModelConfig field: those enter every run_id
        raw["model"] = {k: v for k, v in model.items() if k != "pretrained"}
        raw["pretrained"] = model["pretrained"]
    if "passkey" in raw:
        raise PosbenchError(f'{path}: the [passkey] section became [probes]: names = ["passkey"] '
                            "(see posbench/docs/probes.md)")
    try:
        raw["plugins"] = _load_plugins(raw.get("plugins", []), path)
        return build(Task, raw)  # keys named from the top (train.steps): the line names the file once
    except PosbenchError as e:
        raise PosbenchError(f"{path}: {e}") from None


def _load_plugins(specs: Any, path: Path) -> list[str]:
    """Load a task's plug-ins (paths relative to the task file) before its scheme names are
    checked; they are recorded as absolute paths."""
    if not (isinstance(specs, list) and all(isinstance(x, str) for x in specs)):
        raise PosbenchError("plugins must be a list of file paths or module names")
    plugins.load_all(specs, base=path.parent)
    return [str(plugins.resolve(x, path.parent)) for x in specs]


def build(cls, raw: dict[str, Any], where: str = ""):
    """An instance of dataclass `cls` from a dict, strictly: unknown keys and wrong types fail."""
    if not isinstance(raw, dict):
        raise PosbenchError(f"[{where}] must be a table")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    values = {}
    for key, value in raw.items():
        if key not in fields:
            raise did_you_mean(key, fields, f"key in [{where}]" if where else "key")
        values[key] = _coerce(hints[key], value, f"{where}.{key}" if where else key)
    obj = cls(**values)
    validate(obj)
    return obj


def _coerce(hint, value, where: str):
    origin = typing.get_origin(hint)
    if dataclasses.is_dataclass(hint):
        return build(hint, value, where)
    if origin is tuple:
        (item, _) = typing.get_args(hint)
        if not isinstance(value, list):
            raise PosbenchError(f"{where} must be a list")
        return tuple(_coerce(item, v, where) for v in value)
    if origin is dict:
        if not isinstance(value, dict):
            raise PosbenchError(f"{where} must be a table")
        item = typing.get_args(hint)[1]
        if typing.get_origin(item) is tuple:  # a table of lists
            return {k: _coerce(item, v, f"{where}.{k}") for k, v in value.items()}
        for k, v in value.items():
            if not isinstance(v, dict):
                raise PosbenchError(f"{where}.{k} must be a table of KEY = VALUE, got {v!r}")
        return {k: dict(v) for k, v in value.items()}
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is bool and not isinstance(value, bool):
        raise PosbenchError(f"{where} must be true or false")
    if hint in (int, float, str) and (not isinstance(value, hint) or isinstance(value, bool)):
        raise PosbenchError(f"{where} must be {hint.__name__}, got {value!r}")
    return value


def validate(obj) -> None:
    """Range checks, shared by task files and command-line overrides."""
    _check_numbers(obj)
    if isinstance(obj, TrainConfig):
        _positive(obj, "train_len", "steps", "batch_size", "eval_interval", "eval_windows",
                  "checkpoint_interval", "lr", "grad_clip", "randomize_max")
        _non_negative(obj, "warmup", "weight_decay")
        _choice("dtype", obj.dtype, DTYPES)
        _choice("compile", obj.compile, COMPILE)
        _choice("tracker", obj.tracker, TRACKERS)
        _choice("schedule", obj.schedule, SCHEDULES)
        if obj.randomize_positions and obj.randomize_max < obj.train_len:
            raise PosbenchError("randomize_max must be at least train_len")
        if not 0 <= obj.stop_accuracy <= 1:
            raise PosbenchError(f"stop_accuracy must be in 0..1 (0: never stop early), got {obj.stop_accuracy}")
    elif isinstance(obj, EvalConfig):
        check_lengths(obj.lengths)
        _positive(obj, "tokens", "batch_tokens", "position_buckets", "position_draws", "yarn_alpha",
                  "yarn_beta")
        _non_negative(obj, "stride")
        _choice("mode", obj.mode, EVAL_MODES)
        if 0 < obj.rope_scaling_factor < 1 or obj.rope_scaling_factor < 0:
            raise PosbenchError(f"rope scaling factor must be >= 1 (or 0: L_eval / L_train), "
                                f"got {obj.rope_scaling_factor}")
        if obj.yarn_alpha >= obj.yarn_beta:
            raise PosbenchError(f"yarn_alpha ({obj.yarn_alpha}) must be below yarn_beta ({obj.yarn_beta})")
        from posbench.schemes import SCHEMES
        from posbench.schemes.rotary import SCALINGS

        for kind in obj.rope_scaling:
            _choice("rope_scaling", kind, (*SCALINGS, "longrope") if obj.longrope_factors else SCALINGS)
        if any(f <= 0 for f in obj.longrope_factors):
            raise PosbenchError("longrope_factors must be > 0")
        if not 0 < obj.llama3_low < obj.llama3_high < math.inf:
            raise PosbenchError(f"llama3_low and llama3_high must satisfy 0 < low < high, "
                                f"got {obj.llama3_low} and {obj.llama3_high}")
        if not obj.effective_tolerance >= 0:
            raise PosbenchError(f"effective_tolerance must be >= 0, got {obj.effective_tolerance}")
        if not 0 <= obj.effective_threshold <= 1:
            raise PosbenchError(f"effective_threshold must be in [0, 1], got {obj.effective_threshold}")
        if not 0 <= obj.learned_threshold <= 1:
            raise PosbenchError(f"learned_threshold must be in [0, 1], got {obj.learned_threshold}")
        if obj.self_extend_group < 1:
            raise PosbenchError(f"self_extend_group must be >= 1, got {obj.self_extend_group}")
        _non_negative(obj, "self_extend_window", "rerope_window")
        if 0 < obj.rerope_leak < 1 or obj.rerope_leak < 0:
            raise PosbenchError(f"rerope_leak must be 0 (ReRoPE) or >= 1 (leaky ReRoPE), got {obj.rerope_leak}")
        extensions = {"none", *(e for cls in SCHEMES.values() for e in cls.extensions)}
        for name in obj.learned_extension:
            _choice("learned extension", name, extensions)
    elif isinstance(obj, SpeedConfig):
        check_lengths(obj.lengths)
        _positive(obj, "batch_size", "heads", "head_dim", "repeats")
        _choice("dtype", obj.dtype, DTYPES)
    elif isinstance(obj, ProbesConfig):
        from posbench.probes import parse_probe, probe_name
        from posbench.schemes import get_scheme

        if obj.lengths:
            check_lengths(obj.lengths)
        _positive(obj, "trials")
        for name in obj.names:
            parse_probe(name)
        for name in obj.randomized:
            if not get_scheme(name).takes_positions:
                raise PosbenchError(f"scheme {name!r} takes no integer positions to randomize")
        named = {probe_name(n) for n in obj.names}
        for name in obj.train:
            if name not in named:
                raise did_you_mean(name, sorted(named), "probe in [probes.train] (not in [probes] names)")
    elif isinstance(obj, ExtendConfig):
        from posbench.extension import METHODS

        check_lengths((obj.target_len,))
        if not obj.steps:
            raise PosbenchError("extend steps is empty: give at least one budget")
        if min(obj.steps) < 1:
            raise PosbenchError(f"extend steps must be > 0, got {min(obj.steps)}")
        _positive(obj, "lr", "yarn_alpha", "yarn_beta", "population", "parents", "iterations", "search_windows",
                  "drope_lr")
        _non_negative(obj, "warmup")
        _choice("schedule", obj.schedule, SCHEDULES)
        _choice("drope_schedule", obj.drope_schedule, SCHEDULES)
        if obj.yarn_alpha >= obj.yarn_beta:
            raise PosbenchError(f"yarn_alpha ({obj.yarn_alpha}) must be below yarn_beta ({obj.yarn_beta})")
        if obj.parents > obj.population:
            raise PosbenchError(f"parents ({obj.parents}) must not exceed population ({obj.population})")
        if not 0 < obj.mutation <= 1:
            raise PosbenchError(f"mutation must be in (0, 1], got {obj.mutation}")
        for methods in obj.methods.values():
            if not methods:
                raise PosbenchError("an [extend.methods] list is empty")
            for method in methods:
                _choice("extension method", method, METHODS)
    elif isinstance(obj, ModelConfig):
        _positive(obj, "d_model", "n_layers", "n_heads", "mlp_ratio")
        if obj.d_model % obj.n_heads:
            raise PosbenchError(f"d_model {obj.d_model} is not divisible by n_heads {obj.n_heads}")
    elif isinstance(obj, Task):
        if obj.version > TASK_VERSION:
            raise PosbenchError(f"task version {obj.version} is newer than this posbench ({TASK_VERSION})")
        if not obj.schemes and not obj.pretrained:
            raise PosbenchError("a task needs at least one scheme")
        if not obj.seeds:
            raise PosbenchError("a task needs at least one seed (seeds = [])")
        check_seed(*obj.seeds)
        check_workers(obj.workers)
        if len(set(obj.seeds)) < len(obj.seeds):
            raise PosbenchError(f"seeds repeat: {list(obj.seeds)}")
        from posbench import layout
        from posbench.schemes import get_scheme
        from posbench.schemes.base import coerce_params

        for name in obj.schemes:
            layout.check(name)
        for name in obj.probes.train:
            obj.train_for(name)  # every override a valid [train]
        check_extend_pairings(obj)
        for name, params in obj.params.items():
            plain = layout.parse(name).plain()
            if plain is None:
                raise PosbenchError(f"params for layout {name!r}: a layout takes its parameters "
                                    "inside its spec (e.g. rope:base=500000@w16)")
            coerce_params(get_scheme(plain[0]), params)


def check_workers(value: Any) -> int | str:
    """`workers` (task key or --workers): a whole number of processes from 1 up, or "auto"."""
    if isinstance(value, str) and value.strip() == "auto":
        return "auto"
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PosbenchError(f"workers must be a number of processes from 1 up, or \"auto\"; got {value!r}")
    return value


def check_extend_pairings(task: Task) -> None:
    """Every scheme of [extend.methods] takes its methods at the task's sizes (one line if not)."""
    from posbench import layout
    from posbench.extension import check_pairing
    from posbench.schemes import Dims

    t, m = task.train, task.model
    for name, methods in task.extend.methods.items():
        dims = Dims(m.d_model, m.n_heads, m.n_layers, 2, t.train_len, t.train_len, task.params.get(name, {}))
        built = layout.build(layout.check(name), dims)
        for method in methods:
            check_pairing(name, built, method, t.train_len, task.extend.target_len)


def _check_numbers(obj) -> None:
    """Every number of a config: no nan or inf, no integer beyond MAX_INT (tuples item by item)."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        for v in value if isinstance(value, tuple) else (value,):
            check_number(v, f.name)


def check_seed(*seeds: int) -> None:
    for seed in seeds:
        if not 0 <= seed <= MAX_INT:
            raise PosbenchError(f"seed must be in 0..{MAX_INT}, got {seed}")


def check_lengths(lengths) -> None:
    if not lengths:
        raise PosbenchError("the length list is empty")
    bad = [n for n in lengths if n < 2]
    if bad:
        raise PosbenchError(f"lengths must be >= 2, got {bad[0]}")


def _positive(obj, *names: str) -> None:
    for name in names:
        if getattr(obj, name) <= 0:
            raise PosbenchError(f"{name} must be > 0, got {getattr(obj, name)}")


def _non_negative(obj, *names: str) -> None:
    for name in names:
        if getattr(obj, name) < 0:
            raise PosbenchError(f"{name} must be >= 0, got {getattr(obj, name)}")


def _choice(name: str, value: str, choices) -> None:
    if value not in choices:
        raise did_you_mean(value, choices, name)


def replace(obj, **changes):
    """dataclasses.replace without the None values (flags the user did not give), validated."""
    changes = {k: v for k, v in changes.items() if v is not None}
    new = dataclasses.replace(obj, **changes) if changes else obj
    validate(new)
    return new


def parse_int_list(text: str, what: str = "lengths") -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise PosbenchError(f"bad {what} {text!r}: expected comma-separated integers") from None
    if not values:
        raise PosbenchError(f"bad {what} {text!r}: empty")
    return values


def parse_params(items: list[str] | None) -> dict[str, str]:
    out = {}
    for item in items or []:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise PosbenchError(f"bad --param {item!r}: expected KEY=VALUE")
        out[key.strip()] = value.strip()
    return out


def stable_hash(obj: Any, n: int = 10) -> str:
    """A short hash of a JSON-able object: the same config gives the same id everywhere."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:n]
