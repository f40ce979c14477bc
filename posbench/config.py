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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from posbench import plugins
from posbench.data import DataConfig
from posbench.building import build, coerce_field, validate  # noqa: F401 (the callers' names)
from posbench.effective import LEARNED, SHARE, THRESHOLD, TOLERANCE
from posbench.errors import PosbenchError, did_you_mean
from posbench.knobs import UNLESS_DEFAULT, knob
from posbench.policies import POLICIES, from_eval, get_policy, specs
from posbench.ranges import MAX_INT, Range, at_least, check_number, between, non_negative, one_of, positive

TASK_VERSION = 1
EVAL_MODES = ("nonoverlap", "sliding")
DTYPES = ("float32", "bfloat16")
RANDOMIZED = "+randomized"  # the label of a scheme's probe runs on randomized positions
COMPILE = ("auto", "on", "off")  # torch.compile of the training forward; auto: on for CUDA
TRACKERS = ("none", "tensorboard", "wandb")  # posbench.trackers
SCHEDULES = ("cosine", "constant")  # the lr after warm-up (posbench.training.lr_at)
POSITION_SAMPLING = ("integer", "float")  # posbench.positions
MAX_LENGTH = 2**20  # a window longer than a million tokens outgrows any machine posbench runs on
# a sequence length: a next-token loss needs two tokens; refused before any model is loaded past the bound
LENGTH = at_least(2) & Range(f"<= {MAX_LENGTH}", lambda v: v <= MAX_LENGTH)


def _scaling_factor(v) -> bool:
    return v == 0 or v >= 1


def _randomized(t) -> bool:
    """randomize_max names a run that reads random positions only (posbench.positions.randomized)."""
    from posbench.positions import randomized

    return randomized(t)


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 0  # filled from the tokenizer
    d_model: int = knob(128, "model width", positive, flag=True)
    n_layers: int = knob(4, "transformer blocks", positive, flag="layers")
    n_heads: int = knob(4, "attention heads per block", positive, flag="heads")
    mlp_ratio: int = knob(4, "MLP width as a multiple of d_model", positive)

    def check(self) -> None:
        if self.d_model % self.n_heads:
            raise PosbenchError(f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}")


@dataclass(frozen=True)
class TrainConfig:
    train_len: int = knob(64, "training window length", positive, flag=True)
    steps: int = knob(500, "optimizer steps", positive, flag=True)
    batch_size: int = knob(32, "windows per step", positive, flag=True)
    lr: float = knob(2e-3, "peak learning rate", positive, flag=True)
    warmup: int = knob(50, "linear warm-up steps", non_negative)
    weight_decay: float = knob(0.1, "AdamW weight decay of matrices and tables", non_negative)
    grad_clip: float = knob(1.0, "gradient norm clip", positive)
    eval_interval: int = knob(100, "steps between validations", positive, names_run=False)
    eval_windows: int = knob(64, "validation windows of train_len, scored at every eval_interval", positive,
                             names_run=False)
    checkpoint_interval: int = knob(100, "steps between checkpoints", positive, names_run=False)
    randomize_positions: bool = knob(False, "train on sorted random positions from [0, randomize_max) "
                                     "(Ruoss et al. 2023)", flag=True)
    randomize_max: int = knob(2048, "L_max of randomized positions (Ruoss et al.)", positive, names_run=_randomized)
    position_sampling: str = knob("integer", "integer | float: float trains and evaluates on sorted random "
                                  "real positions from [0, randomize_max) (RFS, Shimizu et al. 2026)",
                                  one_of(*POSITION_SAMPLING), flag=True, names_run=UNLESS_DEFAULT)
    stop_accuracy: float = knob(0.0, "probes: stop once the validation accuracy reaches it (0: never)",
                                Range("in 0..1 (0: never stop early)", lambda v: 0 <= v <= 1), names_run=UNLESS_DEFAULT)
    schedule: str = knob("cosine", "after warm-up: cosine decay to 10% of lr, or constant (fine-tuning)",
                         one_of(*SCHEDULES), names_run=UNLESS_DEFAULT)
    dtype: str = knob("float32", "float32 | bfloat16 (autocast)", one_of(*DTYPES), flag=True)
    compile: str = knob("auto", "auto | on | off: torch.compile the training forward (auto: on for CUDA)",
                        one_of(*COMPILE), flag=True, names_run=False)
    tracker: str = knob("none", "none | tensorboard | wandb: training curves there too", one_of(*TRACKERS),
                        flag=True, names_run=False)

    def check(self) -> None:
        if (self.randomize_positions or self.position_sampling == "float") and self.randomize_max < self.train_len:
            raise PosbenchError("randomize_max must be at least train_len")


def policy_knob(policy: str, setting: str):
    """The [eval] key (and flag) of one setting of a built-in policy, as the policy declares it."""
    cls = get_policy(policy)
    return knob(cls.defaults[setting], cls.help[setting], cls.ranges.get(setting), flag=True)


# the flags of EvalConfig that set an eval-time RoPE policy: every command that reads
# --rope-scaling takes them all
POLICY_FLAGS = ("rope_scaling", "rope_scaling_json", "scaling_factor", *(f for cls in POLICIES.values() for f in cls.flags.values()),
                "dpe_windows")


@dataclass(frozen=True)
class EvalConfig:
    lengths: tuple[int, ...] = knob((64, 128, 256, 512, 1024), "evaluation lengths, e.g. 64,128,256",
                                    LENGTH, flag=True, required=True, name="lengths")
    mode: str = knob("nonoverlap", "nonoverlap | sliding", one_of(*EVAL_MODES), flag=True)
    stride: int = knob(0, "sliding stride (0: half the window)", non_negative, flag=True)
    tokens: int = knob(16384, "tokens scored at every length", positive, flag=True)
    batch_tokens: int = knob(16384, "tokens per forward (windows per batch = batch_tokens // L)", positive)
    rope_scaling: tuple[str, ...] = knob(("none",), f"RoPE policies read at every length: {','.join(POLICIES)} or a "
                                         "plug-in's; NAME(KEY=VALUE,...) gives a policy's settings, NAME:S its factor",
                                         flag=True)
    rope_scaling_json: str = knob("", "a policy as transformers writes rope_scaling in a config.json, e.g. "
                                  "'{\"rope_type\": \"yarn\", \"factor\": 4.0}', read beside --rope-scaling",
                                  flag=True, names_run=UNLESS_DEFAULT)
    rope_scaling_factor: float = knob(0.0, "RoPE scaling factor s (0: L_eval / L_train)",
                                      Range(">= 1 (or 0: L_eval / L_train)", _scaling_factor), flag="scaling_factor",
                                      name="rope scaling factor")
    # the per-policy keys and flags: default, help and range are the policy's own (posbench.policies.builtins)
    yarn_alpha: float = policy_knob("yarn", "alpha")
    yarn_beta: float = policy_knob("yarn", "beta")
    llama3_low: float = policy_knob("llama3", "low")
    llama3_high: float = policy_knob("llama3", "high")
    self_extend_group: int = policy_knob("self-extend", "group")
    self_extend_window: int = policy_knob("self-extend", "window")
    rerope_window: int = policy_knob("rerope", "window")
    rerope_leak: float = policy_knob("rerope", "leak")
    freq_band_cutoff: float = policy_knob("freq-band", "cutoff")
    dpe_groups: int = policy_knob("dpe", "groups")
    dpe_window: int = policy_knob("dpe", "window")
    dpe_scales: tuple[float, ...] = policy_knob("dpe", "scales")
    dpe_windows: int = knob(2, "DPE detection: validation windows scored per trial scale", positive, flag=True)
    dope_heads: float = policy_knob("dope", "heads")
    dope_rank: int = policy_knob("dope", "rank")
    longrope_factors: tuple[float, ...] = policy_knob("longrope", "factors")
    learned_extension: tuple[str, ...] = knob(("none",), "learned-table extensions: none,hierarchical",
                                              flag=True)
    position_buckets: int = knob(16, "buckets of the loss-by-position table", positive)
    key_tokens: bool = knob(True, "key-token perplexity (LongPPL): compare every token past the training length "
                            "with its loss given only the last train_len tokens", flag=True)
    key_drop: float = knob(2.0, "key tokens: the loss drop from the short to the whole window above it "
                           "(LongPPL alpha)", non_negative, flag=True)
    key_loss: float = knob(2.0, "key tokens: the loss with the whole window below it (LongPPL -beta)", positive,
                           flag=True)
    position_draws: int = knob(4, "randomized runs: position draws averaged per length", positive, flag=True)
    effective_tolerance: float = knob(TOLERANCE, "effective length: perplexity within this fraction of "
                                      "in-distribution", non_negative, flag="tolerance")
    effective_threshold: float = knob(THRESHOLD, "effective length of probes: accuracy this far from chance "
                                      "to 1", between(0, 1))
    effective_share: float = knob(SHARE, "effective length of probes, relative basis: accuracy at least this share "
                                  "of the run's own at the training length (NoLiMa)", between(0, 1), flag="share")
    learned_threshold: float = knob(LEARNED, "probes: in-length accuracy below it reads `not learned`",
                                    between(0, 1))

    def check(self) -> None:
        from posbench.schemes import SCHEMES

        for cls in POLICIES.values():  # the per-policy keys, checked by their policies (yarn: alpha < beta)
            if cls.flags:
                cls(**{key: getattr(self, flag) for key, flag in cls.flags.items()})
        for spec in specs(self):
            policy = from_eval(spec, self) if spec.strip() != "config" else None
            if policy is not None and policy.name == "longrope" and not policy.factors:
                raise PosbenchError("rope_scaling longrope needs longrope_factors, one per rotated pair (`posbench "
                                    "extend` searches them)")
        extensions = {"none", *(e for cls in SCHEMES.values() for e in cls.extensions)}
        for name in self.learned_extension:
            _choice("learned extension", name, extensions)


@dataclass(frozen=True)
class SpeedConfig:
    lengths: tuple[int, ...] = knob((256, 512, 1024, 2048), "sequence lengths, e.g. 256,512,1024", LENGTH,
                                    flag=True, required=True)
    batch_size: int = knob(1, "sequences per timed call", positive, flag=True)
    heads: int = knob(8, "attention heads", positive, flag=True)
    head_dim: int = knob(64, "dimensions per head", positive, flag=True)
    dtype: str = knob("float32", "float32 | bfloat16", one_of(*DTYPES), flag=True)
    backward: bool = knob(True, "time forward+backward too", flag=True)
    repeats: int = knob(5, "timed repeats per measurement", positive, flag=True)
    compile: str = knob("auto", "auto | on | off: torch.compile each layer as training does (auto: on for "
                        "CUDA)", one_of(*COMPILE), flag=True)


@dataclass(frozen=True)
class ProbesConfig:
    """Synthetic probes (posbench.probes): one model per probe x scheme x seed, trained on the
    probe's examples, scored by per-answer accuracy and exact match per prompt length."""

    names: tuple[str, ...] = ()  # probe data specs, e.g. "passkey", "copy:size=1-40"; empty: none
    lengths: tuple[int, ...] = knob((), "prompt lengths, e.g. 256,512 (default: 1x,2x,4x,8x each run's training "
                                    "length)", LENGTH, flag=True)
    trials: int = knob(100, "prompts per length and variant", positive, flag=True)
    seed: int = knob(0, "seed of the prompts: every scheme answers the same ones", flag=True)
    ruler_essay: str = knob("pystdlib", "essay haystack of the ruler: tasks of a pretrained model: pystdlib (the "
                            "standard library's documentation prose) or files:PATH_OR_GLOB", flag=True)
    prompts: bool = knob(False, "write each prompt's verdicts of a trained run to prompts.csv too, one row per "
                         "prompt (a pretrained model's always go there)", flag=True)
    randomized: tuple[str, ...] = ()  # schemes also trained with randomized positions (Ruoss et al.)
    # A learning-rate sweep: every cell (or those of `cells`) trained once per rate of `lrs` in
    # place of its [train] (or [probes.train.NAME]) lr; `posbench table probes --sweep` chooses per
    # cell by held-out accuracy at the training length (posbench/docs/probes.md, "Learning rates")
    lrs: tuple[float, ...] = ()
    cells: tuple[str, ...] = ()  # PROBE:SCHEME cells of the grid, e.g. "mqar:alibi", "mqar:rope+randomized"
    # probe name -> [train] keys that differ for the runs on that probe's examples
    # ([probes.train.copy] train_len = 32): each probe learned at a size a tiny model can learn
    train: dict[str, dict[str, Any]] = field(default_factory=dict)

    def check(self) -> None:
        from posbench.probes import parse_probe, probe_name
        from posbench.schemes import get_scheme

        for name in self.names:
            parse_probe(name)
        for name in self.randomized:
            if not get_scheme(name).takes_positions:
                raise PosbenchError(f"scheme {name!r} takes no integer positions to randomize")
        named = {probe_name(n) for n in self.names}
        for name in self.train:
            if name not in named:
                raise did_you_mean(name, sorted(named), "probe in [probes.train] (not in [probes] names)")
        for lr in self.lrs:
            if not (isinstance(lr, float) and math.isfinite(lr) and lr > 0):
                raise PosbenchError(f"[probes] lrs must be positive learning rates, got {lr!r}")
        if len(set(self.lrs)) < len(self.lrs):
            raise PosbenchError(f"[probes] lrs repeat: {list(self.lrs)}")
        for cell in self.cells:
            probe, _, _ = cell.partition(":")
            if probe not in named:
                raise PosbenchError(f"[probes] cells: {cell!r} names probe {probe!r}, which is not in [probes] "
                                    f"names ({', '.join(sorted(named))}); a cell is PROBE:SCHEME")

    def cell(self, probe: str, scheme: str, randomized: bool) -> bool:
        """Whether the grid holds the cell of probe NAME and scheme (its `+randomized` variant):
        every cell unless `cells` names some."""
        from posbench.probes import probe_name

        return not self.cells or f"{probe_name(probe)}:{scheme}{RANDOMIZED * randomized}" in self.cells


@dataclass(frozen=True)
class ExtendConfig:
    """Extension by fine-tuning (posbench.extending; posbench/docs/extension.md): every finished parent of a scheme
    of `methods` fine-tuned with each of its methods to `target_len`, once per budget of `steps`
    (steps of the parent's batch size at target_len: every method of one parent gets the same
    tokens), with the parent's optimizer settings but this lr, warm-up and schedule."""

    methods: dict[str, tuple[str, ...]] = field(default_factory=dict)  # scheme -> methods; empty: none
    target_len: int = knob(256, "the length to extend to (L')", LENGTH, name="lengths", flag=True)
    steps: tuple[int, ...] = knob((50,), "budgets: steps of the parent's batch size at the target length",
                                  Range("> 0", lambda v: v > 0), required=True, name="extend steps", flag=True)
    # a tenth of the quick task's: fine-tuning lr well below pretraining (PI, YaRN)
    lr: float = knob(2e-4, "fine-tuning learning rate", positive, flag=True)
    warmup: int = knob(5, "warm-up steps", non_negative, flag=True)
    schedule: str = knob("constant", "constant | cosine after the warm-up", one_of(*SCHEDULES), flag=True)
    yarn_alpha: float = knob(1.0, "YaRN alpha (beta_slow)", positive, flag=True)
    yarn_beta: float = knob(32.0, "YaRN beta (beta_fast)", positive, flag=True)
    # LongRoPE's evolutionary search (posbench/docs/extension.md): posbench's small preset, 16 + 10 x 16 evaluations
    population: int = knob(16, "longrope search: population", positive, flag=True)
    parents: int = knob(8, "longrope search: the best kept each iteration", positive)
    mutation: float = knob(0.3, "longrope search: chance that a mutation redraws a factor",
                           Range("in (0, 1]", lambda v: 0 < v <= 1), flag=True)
    iterations: int = knob(10, "longrope search: iterations", positive, flag=True)
    search_windows: int = knob(4, "longrope search: validation windows of target_len that score a candidate",
                               positive)
    # DroPE's recalibration (posbench.extending): its Llama-2 7B run recalibrates at a third of the
    # model's pretraining peak (1e-4 after 3e-4), cosine after the warm-up; a third of the quick
    # task's 2e-3
    drope_lr: float = knob(7e-4, "drope: the recalibration's peak learning rate", positive, flag=True)
    drope_schedule: str = knob("cosine", "drope: the schedule after the warm-up", one_of(*SCHEDULES))

    def check(self) -> None:
        from posbench.extension import METHODS

        check_yarn(self.yarn_alpha, self.yarn_beta)
        if self.parents > self.population:
            raise PosbenchError(f"parents ({self.parents}) must not exceed population ({self.population})")
        for methods in self.methods.values():
            if not methods:
                raise PosbenchError("an [extend.methods] list is empty")
            for method in methods:
                _choice("extension method", method, METHODS)


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
    pretrained_dtype: str = "float32"  # [model] dtype beside pretrained: what that model computes in
    workers: int | str = 1  # worker processes of `posbench run` (a number, or "auto"; posbench.workers)
    # runs that differ only in seed trained as one stacked model (posbench.ensemble): "auto", "off" or N
    ensemble: int | str = "auto"
    # [axes]: knobs of [model] and [train] that the grid crosses with schemes x seeds (posbench.axes)
    axes: dict[str, tuple[Any, ...]] = field(default_factory=dict)

    def check(self) -> None:
        from posbench import axes, layout
        from posbench.schemes import get_scheme
        from posbench.schemes.base import coerce_params

        if self.version > TASK_VERSION:
            raise PosbenchError(f"task version {self.version} is newer than this posbench ({TASK_VERSION})")
        if not self.schemes and not self.pretrained:
            raise PosbenchError("a task needs at least one scheme")
        _choice("[model] dtype", self.pretrained_dtype, DTYPES)
        if not self.seeds:
            raise PosbenchError("a task needs at least one seed (seeds = [])")
        check_seed(*self.seeds)
        check_workers(self.workers)
        check_ensemble(self.ensemble)
        if len(set(self.seeds)) < len(self.seeds):
            raise PosbenchError(f"seeds repeat: {list(self.seeds)}")
        for name in self.schemes:
            layout.check(name)
        for name in self.probes.train:
            self.train_for(name)  # every override a valid [train]
        check_extend_pairings(self)
        axes.points(self)  # every point a valid [model] and [train]
        for cell in self.probes.cells:
            scheme = cell.partition(":")[2]
            plain = scheme.removesuffix(RANDOMIZED)
            if plain not in self.schemes or (scheme != plain and plain not in self.probes.randomized):
                known = ", ".join([*self.schemes, *(f"{s}{RANDOMIZED}" for s in self.probes.randomized)])
                raise PosbenchError(f"[probes] cells: {cell!r} names scheme {scheme!r}, which the task does not "
                                    f"train (its schemes: {known})")
        for name, params in self.params.items():
            plain = layout.parse(name).plain()
            if plain is None:
                raise PosbenchError(f"params for layout {name!r}: a layout takes its parameters "
                                    "inside its spec (e.g. rope:base=500000@w16)")
            coerce_params(get_scheme(plain[0]), params)

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
        what = "is a folder, not a task file" if path.is_dir() else "does not exist"
        raise PosbenchError(f"task file {str(path)!r} {what}")
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
    if not raw:  # every default is a task too, but an empty file is far likelier a mistake
        raise PosbenchError(f"{path}: the task file sets nothing (write at least one section; `posbench tasks` "
                            "lists the shipped tasks to start from)")
    raw.setdefault("name", path.stem)
    model = raw.get("model")
    if isinstance(model, dict) and "pretrained" in model:
        # the task's, not ModelConfig fields: those enter every run_id
        raw["model"] = {k: v for k, v in model.items() if k not in ("pretrained", "dtype")}
        raw["pretrained"] = model["pretrained"]
        if "dtype" in model:
            raw["pretrained_dtype"] = model["dtype"]
    if "axes" in raw:
        from posbench.axes import flatten

        raw["axes"] = flatten(raw["axes"])
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


def check_yarn(alpha: float, beta: float) -> None:
    if alpha >= beta:
        raise PosbenchError(f"yarn_alpha ({alpha}) must be below yarn_beta ({beta})")


def check_workers(value: Any) -> int | str:
    """`workers` (task key or --workers): a whole number of processes from 1 up, or "auto"."""
    if isinstance(value, str) and value.strip() == "auto":
        return "auto"
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PosbenchError(f"workers must be a number of processes from 1 up, or \"auto\"; got {value!r}")
    return check_number(value, "workers")


ENSEMBLE = ("auto", "off")


def check_ensemble(value: Any) -> int | str:
    """`ensemble` (task key or --ensemble): "auto" (on for CUDA), "off", or at most N members
    from 1 up (1: off)."""
    if isinstance(value, str) and value.strip() in ENSEMBLE:
        return value.strip()
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PosbenchError(f'ensemble must be "auto", "off" or a number of members from 1 up; got {value!r}')
    return check_number(value, "ensemble")


MAX_SEEDS = 100_000  # seeds in one range of --seeds: more is a typo, and a list that fills the memory


def parse_seeds(text: str | Iterable[int]) -> tuple[int, ...]:
    """Seeds as the command line gives them: a comma-separated list whose items are seeds or
    ranges (0-3 is 0,1,2,3), e.g. 0-3,7; or a list of integers. Checked: in range, none twice."""
    if not isinstance(text, str):
        seeds = parse_list(text, int, "seeds")
    else:
        seeds = []
        for part in parse_list(text, str, "seeds"):
            low, dash, high = part.partition("-")
            try:
                first, last = (int(low), int(high)) if dash else (int(part), int(part))
            except ValueError:
                raise PosbenchError(f"bad seeds {text!r}: expected seeds or ranges, e.g. 0-3 or 0,1,2") from None
            if last < first:
                raise PosbenchError(f"bad seeds {text!r}: the range {part} runs backwards")
            check_number(last, "seeds")  # the task key's line, before a list of that many is built
            if last - first >= MAX_SEEDS:
                raise PosbenchError(f"bad seeds {text!r}: the range {part} holds {last - first + 1} seeds "
                                    f"(at most {MAX_SEEDS})")
            seeds += range(first, last + 1)
        seeds = tuple(seeds)
    check_seed(*seeds)
    if len(set(seeds)) < len(seeds):
        raise PosbenchError(f"seeds repeat: {list(seeds)}")
    return seeds


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


def _choice(name: str, value: str, choices) -> None:
    if value not in choices:
        raise did_you_mean(value, choices, name)


def replace(obj, **changes):
    """dataclasses.replace without the None values (flags the user did not give), validated."""
    changes = {k: v for k, v in changes.items() if v is not None}
    new = dataclasses.replace(obj, **changes) if changes else obj
    validate(new)
    return new


def only_schemes(task: Task, wanted: tuple[str, ...]) -> Task:
    """The task of `posbench run --schemes`: the runs of the labels `wanted` alone, as the tables
    name them. A scheme (preset, layout) trains its plain runs; SCHEME+randomized trains only its
    probe runs on randomized positions (a probe task's, the scheme taking integer positions). A
    task's [probes] cells keep those of `wanted`. The run_ids are those of the whole task."""
    from posbench.data import is_probe
    from posbench.probes import probe_name

    plain = tuple(w for w in wanted if not w.endswith(RANDOMIZED))
    randomized = tuple(dict.fromkeys(w.removesuffix(RANDOMIZED) for w in wanted if w.endswith(RANDOMIZED)))
    if randomized and not task.probes.names:
        raise PosbenchError(f"{randomized[0]}{RANDOMIZED}: task {task.name} trains no probe, and only probe "
                            "runs take randomized positions")
    alone = [s for s in randomized if s not in plain]
    if alone and not is_probe(task.data):
        raise PosbenchError(f"{alone[0]}{RANDOMIZED} without {alone[0]}: task {task.name} trains {alone[0]} on "
                            f"its data ({task.data.spec}) as well; name both")
    probes = dataclasses.replace(task.probes, randomized=randomized)
    if task.probes.cells or (randomized and not set(randomized) <= set(plain)):
        every = [f"{probe_name(n)}:{w}" for n in task.probes.names for w in wanted]
        cells = tuple(c for c in (task.probes.cells or every) if c.partition(":")[2] in wanted)
        if not cells:
            raise PosbenchError(f"--schemes {','.join(wanted)}: none of task {task.name}'s [probes] cells "
                                f"({', '.join(task.probes.cells)}) is of these schemes")
        probes = dataclasses.replace(probes, cells=cells)
    return replace(task, schemes=tuple(dict.fromkeys(plain + randomized)), probes=probes)


def parse_list(value: str | Iterable, item: type, what: str) -> tuple:
    """A list option as the command line gives it ("64,128") or as Python does ([64, 128]): its
    items of type `item`, one line when one is not, when there are none or when one is empty."""
    parts = _top_level(value) if isinstance(value, str) else list(value)
    parts = [p.strip() if isinstance(p, str) else p for p in parts]
    if all(p == "" for p in parts):
        raise PosbenchError(f"bad {what} {value!r}: empty")
    if "" in parts:
        raise PosbenchError(f"bad {what} {value!r}: an empty item between commas")
    try:
        if item is int and any(isinstance(p, (bool, float)) for p in parts):
            raise ValueError  # int(32.5) is 32: a length that was not asked for
        return tuple(item(p) for p in parts)
    except (TypeError, ValueError):
        kind = {int: "integers", float: "numbers"}.get(item, "names")
        raise PosbenchError(f"bad {what} {value!r}: expected comma-separated {kind}") from None


def _top_level(text: str) -> list[str]:
    """text split at its commas outside parentheses: 'none,yarn(alpha=2,beta=16)' is two items."""
    parts, depth = [""], 0
    for c in text:
        depth += (c == "(") - (c == ")")
        if c == "," and depth <= 0:
            parts.append("")
        else:
            parts[-1] += c
    return parts


def parse_int_list(text: str, what: str = "lengths") -> tuple[int, ...]:
    return parse_list(text, int, what)


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
