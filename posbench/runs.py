"""A run's identity and files: the resolved run spec and its run_id, the model it builds, its
checkpoints and training log, and loading a finished run back (posbench.training writes them)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from posbench import layout, plugins, results
from posbench.config import ModelConfig, TrainConfig, build, stable_hash
from posbench.data import DataConfig, check_probe_corpus, is_probe
from posbench.errors import PosbenchError
from posbench.extension import Extension
from posbench.knobs import naming_fields
from posbench.model import Transformer
from posbench.positions import check_float_positions, floats, randomized
from posbench.probes import PROBES, probe_name
from posbench.schemes import Dims, get_scheme
from posbench.schemes.base import coerce_params, identity_params


@dataclass(frozen=True)
class RunSpec:
    """Everything that determines a trained model; its hash is the run_id. `scheme` is a scheme,
    a preset or a layout spec (posbench.layout); a spec that is one plain scheme becomes it."""

    scheme: str
    params: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    data: DataConfig = DataConfig()
    model: ModelConfig = ModelConfig()
    train: TrainConfig = TrainConfig()
    task: str = "quick"  # recorded, not hashed
    # A child fine-tuned from a parent run (posbench.extending); its `train` is the fine-tuning's.
    extension: Extension | None = None

    def __post_init__(self):
        lay = layout.parse(self.scheme)
        plain = lay.plain()
        if plain is None:
            if self.params:
                raise PosbenchError(f"layout {lay.name!r} takes its parameters inside its spec "
                                    "(e.g. rope:base=500000@w16), not as --param")
            object.__setattr__(self, "scheme", lay.name)
            return
        # Resolve the parameters so that `--param base=10000` and the default share one run_id.
        name, params = plain
        object.__setattr__(self, "scheme", name)
        object.__setattr__(self, "params", coerce_params(get_scheme(name), {**params, **self.params}))

    def resolved_layout(self) -> layout.Layout | None:
        """The layout with every size resolved; None for a plain scheme."""
        lay = layout.parse(self.scheme)
        return None if lay.plain() is not None else lay.resolve(self.original_len)

    @property
    def original_len(self) -> int:
        """The length the model's positions were trained at: a child's parent's (L of posbench/docs/extension.md)."""
        return self.extension.base_len if self.extension is not None else self.train.train_len

    def identity(self) -> dict[str, Any]:
        lay = self.resolved_layout()
        params = self.params if lay is not None else identity_params(get_scheme(self.scheme), self.params)
        # each config's fields that name a run, as its knobs declare (posbench.knobs: names_run)
        out = {"scheme": self.scheme, "params": params, "seed": self.seed, "data": naming_fields(self.data),
               "model": naming_fields(self.model), "train": naming_fields(self.train)}
        if lay is not None:  # a plain scheme's identity is what it was before layouts
            out["layout"] = str(lay)
        if self.extension is not None:  # likewise a run trained from scratch
            out["extension"] = self.extension.identity()
        revisions = self.revisions()
        if revisions:  # a scheme at its first revision leaves the run_id as it was
            out["revisions"] = revisions
        if is_probe(self.data) and PROBES[probe_name(self.data.spec)].revision > 1:
            # likewise a probe at its first revision; a later one trains beside the runs of the one before
            out["probe_revision"] = PROBES[probe_name(self.data.spec)].revision
        sources = self.plugin_sources()
        if sources:  # a run of built-ins keeps its run_id; a plug-in's bytes name the run
            out["plugins"] = sorted({s.sha256 for s in sources})
        return out

    def scheme_classes(self) -> list[type]:
        """The scheme class of every layer of the run's layout."""
        return [get_scheme(layer.scheme) for layer in layout.parse(self.scheme).pattern]

    def revisions(self) -> dict[str, int]:
        """The schemes of this run past their first revision (Scheme.revision), by name."""
        return {cls.name: cls.revision for cls in self.scheme_classes() if cls.revision > 1}

    def plugin_sources(self) -> list[plugins.Source]:
        """The plug-ins whose classes this run uses (its schemes' and its probe's)."""
        classes = self.scheme_classes()
        if is_probe(self.data):
            classes.append(PROBES[probe_name(self.data.spec)])
        found = {s.path: s for s in map(plugins.source_of, classes) if s is not None}
        return [found[k] for k in sorted(found)]

    @property
    def run_id(self) -> str:
        return f"{layout.run_prefix(self.scheme)}-{stable_hash(self.identity())}"

    def to_json(self) -> dict[str, Any]:
        identity = self.identity()
        identity.pop("layout", None)  # derived from scheme and train_len
        identity.pop("plugins", None)  # recorded with their files below
        sources = self.plugin_sources()
        train = dataclasses.asdict(self.train)
        if not floats(self.train):  # a config.json of integer positions stays what it was, and readable by an older posbench
            train.pop("position_sampling")
        return {"run_id": self.run_id, "task": self.task, **identity, "train": train,
                **({"plugins": [s.record() for s in sources]} if sources else {}),
                **({"extension": dataclasses.asdict(self.extension)} if self.extension is not None else {})}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> RunSpec:
        # Strictly, as a task file is read: a damaged config.json fails with one line.
        if not (isinstance(raw["scheme"], str) and type(raw["seed"]) is int and isinstance(raw["params"], dict)):
            raise TypeError("scheme must be a string, seed an integer and params a table")
        return cls(
            scheme=raw["scheme"], params=raw["params"], seed=raw["seed"], task=str(raw.get("task", "")),
            data=build(DataConfig, raw["data"], "data"),
            model=build(ModelConfig, raw["model"], "model"),
            train=build(TrainConfig, raw["train"], "train"),
            extension=Extension.from_json(raw["extension"]) if raw.get("extension") is not None else None,
        )



def build_model(spec: RunSpec, vocab_size: int) -> Transformer:
    torch.manual_seed(spec.seed)
    model_layout = build_layout(spec, vocab_size)
    cfg = dataclasses.replace(spec.model, vocab_size=vocab_size)
    return Transformer(cfg, model_layout)


def build_layout(spec: RunSpec, vocab_size: int) -> layout.ModelLayout:
    """The schemes of `spec`'s model, built and checked against its training settings."""
    t = spec.train
    dims = Dims(
        d_model=spec.model.d_model, n_heads=spec.model.n_heads, n_layers=spec.model.n_layers,
        vocab_size=vocab_size, train_len=spec.original_len,
        max_position=t.randomize_max if randomized(t) else spec.original_len,
        params=spec.params,
    )
    model_layout = layout.build(spec.scheme, dims)
    if floats(t):
        check_float_positions(spec.scheme, model_layout)
    elif t.randomize_positions and not model_layout.takes_positions:
        raise PosbenchError(f"scheme {spec.scheme!r} takes no integer positions to randomize")
    if spec.extension is not None:
        model_layout.set_trained_scaling(spec.extension.scaling())
    return model_layout


def load_parent(model: Transformer, spec: RunSpec, runs_dir: Path) -> None:
    """A child starts from its parent's final weights (posbench.extending)."""
    parent = runs_dir / spec.extension.parent
    if not (parent / FINAL).exists():
        raise PosbenchError(f"parent run {spec.extension.parent} of {spec.run_id} is missing or unfinished "
                            f"(no {FINAL} in {parent}): train it to the end first")
    tensors, _ = _read_safetensors(parent / FINAL)
    model.load_state_dict(tensors)


# --- checkpoints -----------------------------------------------------------------------------

CHECKPOINT = "checkpoint.safetensors"
FINAL = "model.safetensors"


def save_checkpoint(run_dir: Path, model, opt, gen, state: dict[str, Any], log: list[dict[str, Any]]) -> None:
    """Model, optimizer, batch generator and the training log as of one completed step, in one
    file written by one rename: a kill at any moment leaves either the previous checkpoint or this
    one, never a log that disagrees with the weights. log.csv is a view of it, written after."""
    from safetensors.torch import save

    tensors = {f"model.{k}": v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    for i, s in opt.state_dict()["state"].items():
        for k, v in s.items():
            tensors[f"opt.{i}.{k}"] = torch.as_tensor(v).cpu().contiguous()
    tensors["rng.batch"] = gen.get_state()
    tensors["log"] = _log_tensor(log)
    # Serialized here and written by write_atomic: safetensors' own save_file makes files 0600.
    results.write_atomic(run_dir / CHECKPOINT, save(tensors, metadata={"state": json.dumps(state)}))
    write_log(run_dir, log)


def weights_digest(tensors: dict[str, torch.Tensor]) -> str:
    """The sha256 of a model's weights: every tensor's name and bytes, in name order. Equal digests
    mean bitwise equal models, whatever the file's layout (runs.csv's `weights_sha256`, the golden logs)."""
    digest = hashlib.sha256()
    for key in sorted(tensors):
        data = tensors[key].detach().cpu().contiguous().reshape(-1).view(torch.uint8)  # any dtype, bfloat16 too
        digest.update(key.encode() + data.numpy().tobytes())
    return digest.hexdigest()


def _read_safetensors(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return {k: f.get_tensor(k) for k in f.keys()}, (f.metadata() or {})
    except Exception as e:  # safetensors raises its own error types for every kind of damage
        raise PosbenchError(
            f"corrupt checkpoint {path}: {str(e).splitlines()[0] if str(e) else type(e).__name__}; "
            "delete the run directory and train it again"
        ) from None


def load_checkpoint(run_dir: Path, model, opt, gen) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The state dict and log of the checkpoint; model, optimizer and generator are set to it."""
    tensors, meta = _read_safetensors(run_dir / CHECKPOINT)
    try:
        state = json.loads(meta["state"])
        if not (isinstance(state, dict) and type(state.get("step")) is int and state["step"] >= 0
                and isinstance(state.get("seconds"), (int, float))):
            raise ValueError(f"bad state {meta['state'][:80]!r}")
        log = _log_rows(tensors["log"])
        if [e["step"] for e in log] != list(range(1, state["step"] + 1)):
            raise ValueError(f"its log does not hold steps 1..{state['step']}")
        model.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
        opt_state = opt.state_dict()
        per_param: dict[int, dict[str, torch.Tensor]] = {}
        for k, v in tensors.items():
            if k.startswith("opt."):
                _, i, name = k.split(".", 2)
                per_param.setdefault(int(i), {})[name] = v
        opt_state["state"] = per_param
        opt.load_state_dict(opt_state)
        gen.set_state(tensors["rng.batch"])
    except (KeyError, RuntimeError, ValueError, TypeError) as e:
        raise PosbenchError(
            f"corrupt checkpoint {run_dir / CHECKPOINT}: {str(e).splitlines()[0]}; "
            "delete the run directory and train it again"
        ) from None
    return state, log


def read_log(run_dir: Path) -> list[dict[str, Any]]:
    """The training log of a run's last checkpoint, every value exact (log.csv rounds lr and seconds)."""
    tensors, _ = _read_safetensors(Path(run_dir) / CHECKPOINT)
    try:
        return _log_rows(tensors["log"])
    except (KeyError, ValueError) as e:
        raise PosbenchError(f"corrupt checkpoint {Path(run_dir) / CHECKPOINT}: {e}") from None


def data_spec(run_dir: Path) -> str:
    """The data its config.json names (a corpus, or a probe's `name:options`), read alone: where
    the run's scheme or plug-ins need not be loaded."""
    config = Path(run_dir) / "config.json"
    try:
        return str(json.loads(config.read_text())["data"]["spec"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise PosbenchError(f"unreadable run config {config}: {type(e).__name__}: {e}") from None


def load_spec(run_dir: Path) -> tuple[RunSpec, dict]:
    """A run's spec and its config.json as read."""
    run_dir = Path(run_dir)
    try:
        raw = json.loads((run_dir / "config.json").read_text())
        recorded = raw.get("plugins") or []
        if not (isinstance(recorded, list) and all(isinstance(p, dict) for p in recorded)):
            raise TypeError("plugins must be a list of {path, sha256}")
    except (OSError, ValueError, AttributeError, TypeError) as e:
        raise PosbenchError(f"unreadable run config in {run_dir}: {e}") from None
    check_plugins(raw, run_dir)
    try:
        spec = RunSpec.from_json(raw)
        vocab = raw["vocab_size"]
        if type(vocab) is not int or vocab < 1:
            raise TypeError(f"vocab_size must be a positive integer, got {vocab!r}")
    except (OSError, ValueError, KeyError, TypeError, PosbenchError) as e:
        raise PosbenchError(f"unreadable run config in {run_dir}: {e}") from None
    if raw.get("revisions", {}) != spec.revisions():
        raise PosbenchError(f"run {raw.get('run_id', run_dir.name)} was trained by scheme revisions "
                            f"{raw.get('revisions', {})}, posbench has {spec.revisions()}: train it again")
    return spec, raw


def check_plugins(raw: dict[str, Any], run_dir: Path) -> None:
    """A run trained with plug-ins is read only with the very files it was trained with."""
    loaded = plugins.loaded()
    for entry in raw.get("plugins") or []:
        path, sha = str(entry.get("path", "")), str(entry.get("sha256", ""))
        if sha in {s.sha256 for s in loaded}:
            continue
        same_file = [s for s in loaded if s.path == path]
        if same_file:  # the file was passed, in another version
            raise PosbenchError(
                f"run {raw.get('run_id', run_dir.name)} needs plugin {path} with sha256 {sha[:12]}; the loaded "
                f"{path} has sha256 {same_file[0].sha256[:12]} (edited since): it needs that version of the file "
                "(restore it, e.g. from version control, or train the run again with the edited file)")
        raise PosbenchError(f"run {raw.get('run_id', run_dir.name)} needs plugin {path} with sha256 {sha[:12]}: "
                            "pass that file with --plugin (or list it in the task's plugins)")


def load_trained(run_dir: Path, device="cpu") -> tuple[RunSpec, Transformer, int]:
    """A finished run: its spec, its model with final weights (eval mode), its vocab size. A probe
    run trained on another revision of its probe is refused."""
    run_dir = Path(run_dir)
    spec, raw = load_spec(run_dir)
    vocab = raw["vocab_size"]
    check_probe_corpus(spec.data, raw.get("corpus"), spec.run_id)
    tensors, _ = _read_safetensors(run_dir / FINAL)
    model = build_model(spec, vocab)
    try:
        model.load_state_dict(tensors)
    except RuntimeError as e:
        raise PosbenchError(f"checkpoint {run_dir / FINAL} does not fit its config: {str(e).splitlines()[0]}") from None
    return spec, model.to(device).eval(), vocab



# --- the training log ----------------------------------------------------------------------

LOG_COLUMNS = ["step", "lr", "loss", "val_loss", "val_accuracy", "tokens", "seconds"]
# Of the tokens a run computed on (every position of every batch: `tokens`, which tokens/s and MFU
# count), those whose targets carry loss and those that are padding; a probe run's rows tell them apart.
COUNTS = ("scored_tokens", "padding_tokens")


def write_log(run_dir: Path, rows: list[dict[str, Any]]) -> None:
    # Losses at full precision: a resumed run's final_train_loss averages logged values, and
    # must equal the uninterrupted run's.
    def cell(column: str, value: Any) -> str:
        exact = column in ("loss", "val_loss") and isinstance(value, float)
        return repr(value) if exact else results._fmt(value)

    lines = [",".join(LOG_COLUMNS)]
    for r in rows:
        lines.append(",".join(cell(c, r.get(c)) for c in LOG_COLUMNS))
    results.write_atomic(run_dir / "log.csv", "\n".join(lines) + "\n")


def _log_tensor(log: list[dict[str, Any]]) -> torch.Tensor:
    # float64 holds every logged value exactly (float32 losses, Python floats, integer counts).
    rows = [[math.nan if e.get(c) is None else float(e[c]) for c in LOG_COLUMNS] for e in log]
    return torch.tensor(rows, dtype=torch.float64).reshape(len(log), len(LOG_COLUMNS))


def _log_rows(table: torch.Tensor) -> list[dict[str, Any]]:
    if table.dim() != 2 or table.shape[1] != len(LOG_COLUMNS):
        raise ValueError(f"its log has shape {tuple(table.shape)}, not (steps, {len(LOG_COLUMNS)})")
    counts = ("step", "tokens")
    return [
        {c: (int(v) if c in counts else None if math.isnan(v) else v) for c, v in zip(LOG_COLUMNS, row)}
        for row in table.tolist()
    ]


