"""Training one tiny language model with one scheme or layout: the resolved run spec, its run_id, the
training loop with checkpoints, resume, NaN stop, and the row it adds to runs.csv."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from posbench import batches, flops, layout, plugins, results, trackers
from posbench.config import TrainConfig, build, stable_hash
from posbench.data import DataConfig, TokenData, check_probe_corpus, is_probe, load_tokens, probe_corpus, unigram_loss
from posbench.errors import Interrupted, PosbenchError, RunFailed, first_line, on_interrupt, out_of_memory
from posbench.extension import Extension, columns as extension_columns
from posbench.model import ModelConfig, Transformer
from posbench.probes import PROBES, probe_name
from posbench.schemes import Dims, get_scheme
from posbench.schemes.base import Scheme, coerce_params, identity_params


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
    # A child fine-tuned from a parent run (posbench.extend); its `train` is the fine-tuning's.
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
        train = dataclasses.asdict(self.train)
        for logistics in ("eval_interval", "checkpoint_interval", "eval_windows", "compile", "tracker"):
            train.pop(logistics)
        if not self.train.randomize_positions:
            train.pop("randomize_max")
        if not self.train.stop_accuracy:  # added later: runs without it keep their run_ids
            train.pop("stop_accuracy")
        if self.train.schedule == "cosine":  # likewise
            train.pop("schedule")
        lay = self.resolved_layout()
        params = self.params if lay is not None else identity_params(get_scheme(self.scheme), self.params)
        out = {"scheme": self.scheme, "params": params, "seed": self.seed,
               "data": dataclasses.asdict(self.data), "model": dataclasses.asdict(self.model),
               "train": train}
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
        return {"run_id": self.run_id, "task": self.task, **identity,
                "train": dataclasses.asdict(self.train),
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


@dataclass(frozen=True)
class Distributed:
    """Data parallelism under torchrun (WORLD_SIZE > 1): every rank draws the same global batch
    from the same generator and trains on its slice, so N processes follow the trajectory of one
    process with the same global batch. Rank 0 alone writes files."""

    rank: int = 0
    world: int = 1

    @classmethod
    def from_env(cls, dev: torch.device) -> tuple[Distributed, torch.device]:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world == 1:
            return cls(), dev
        import torch.distributed as dist

        if dev.type == "cuda":
            dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(dev)
        if not dist.is_initialized():
            dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
        return cls(dist.get_rank(), world), dev

    @property
    def main(self) -> bool:
        return self.rank == 0

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        if self.world == 1:
            return model
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model)

    def local(self, batch: batches.Batch) -> batches.Batch:
        """This rank's rows of the batch (positions are shared by every row)."""
        rows = batch.tokens.shape[0]
        if rows % self.world:
            raise PosbenchError(f"batch size {rows} is not divisible by {self.world} processes")
        per = rows // self.world

        def part(x):
            return None if x is None else x[self.rank * per: (self.rank + 1) * per]

        return batches.Batch(part(batch.tokens), part(batch.targets), part(batch.mask), batch.positions)

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        if self.world == 1:
            return value
        import torch.distributed as dist

        value = value.detach().clone()
        dist.all_reduce(value)
        return value / self.world

    def any(self, flag: bool, device: torch.device) -> bool:
        """Whether `flag` is set on any rank, so that every rank stops at the same step."""
        if self.world == 1:
            return flag
        return self.mean(torch.tensor(float(flag), device=device)).item() > 0

    def close(self) -> None:
        if self.world > 1:
            import torch.distributed as dist

            dist.destroy_process_group()


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise PosbenchError(f"unknown device {device!r}: use auto, cpu or cuda")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise PosbenchError("--device cuda was asked for but no CUDA device is available")
    return torch.device(device)


def autocast(device: torch.device, dtype: str):
    enabled = dtype == "bfloat16"
    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=enabled)


class TrainingForward:
    """The model's training forward, compiled once (torch.compile, fixed shapes: every training
    batch has the same) or eager. `status` is what runs.csv records: on, off, or fallback when
    compilation failed and training went on eager after one warning line. Validation calls the
    eager model, which shares the weights: a few forwards per run do not repay a second
    compilation for eval mode and no_grad."""

    def __init__(self, net: torch.nn.Module, setting: str, device: torch.device):
        self.net = net
        self.status = "on" if setting == "on" or (setting == "auto" and device.type == "cuda") else "off"
        self.compiled = net
        self.proven = self.status == "off"  # a compiled step ran forward and backward once
        if self.status == "on":
            # One run, one graph: the compiled frames of earlier runs in this process (a grid
            # trains its schemes one after another) would each hold a cache entry of the model's
            # forward, and past torch's limit of 8 a later scheme would train eager unnoticed.
            import torch._dynamo

            torch._dynamo.reset()
            try:
                self.compiled = torch.compile(net, dynamic=False)
            except Exception as e:  # noqa: BLE001 - any failure of the compiler means eager
                self.fall_back(e)

    def fall_back(self, error: Exception) -> None:
        first = str(error).splitlines()[0] if str(error) else ""
        print(f"warning: torch.compile failed ({type(error).__name__}: {first[:200]}); "
              "training eager", file=sys.stderr)
        self.compiled, self.status, self.proven = self.net, "fallback", True

    def __call__(self, *args, **kwargs):
        return self.compiled(*args, **kwargs)

    def first_step(self, step):
        """Run `step` (forward, backward); compilation happens lazily inside the first one, so
        its failure there falls back to eager and the step runs again from the same batch."""
        if self.proven:
            return step()
        try:
            out = step()
        except PosbenchError:
            raise
        except Exception as e:  # noqa: BLE001
            self.fall_back(e)
            return step()
        self.proven = True
        return out


def build_model(spec: RunSpec, vocab_size: int) -> Transformer:
    torch.manual_seed(spec.seed)
    t = spec.train
    dims = Dims(
        d_model=spec.model.d_model, n_heads=spec.model.n_heads, n_layers=spec.model.n_layers,
        vocab_size=vocab_size, train_len=spec.original_len,
        max_position=t.randomize_max if t.randomize_positions else spec.original_len,
        params=spec.params,
    )
    model_layout = layout.build(spec.scheme, dims)
    if t.randomize_positions and not model_layout.takes_positions:
        raise PosbenchError(f"scheme {spec.scheme!r} takes no integer positions to randomize")
    if spec.extension is not None:
        model_layout.set_trained_scaling(spec.extension.scaling())
    cfg = dataclasses.replace(spec.model, vocab_size=vocab_size)
    return Transformer(cfg, model_layout)


def load_parent(model: Transformer, spec: RunSpec, runs_dir: Path) -> None:
    """A child starts from its parent's final weights (posbench.extend)."""
    parent = runs_dir / spec.extension.parent
    if not (parent / FINAL).exists():
        raise PosbenchError(f"parent run {spec.extension.parent} of {spec.run_id} is missing or unfinished "
                            f"(no {FINAL} in {parent}): train it to the end first")
    tensors, _ = _read_safetensors(parent / FINAL)
    model.load_state_dict(tensors)


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
    _write_log(run_dir, log)


def _read_safetensors(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return {k: f.get_tensor(k) for k in f.keys()}, (f.metadata() or {})
    except Exception as e:  # safetensors raises its own error types for every kind of damage
        raise PosbenchError(
            f"corrupt checkpoint {path}: {str(e).splitlines()[0] if str(e) else type(e).__name__}; "
            "delete the run directory or train again without --resume"
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
            "delete the run directory or train again without --resume"
        ) from None
    return state, log


def read_log(run_dir: Path) -> list[dict[str, Any]]:
    """The training log of a run's last checkpoint, every value exact (log.csv rounds lr and seconds)."""
    tensors, _ = _read_safetensors(Path(run_dir) / CHECKPOINT)
    try:
        return _log_rows(tensors["log"])
    except (KeyError, ValueError) as e:
        raise PosbenchError(f"corrupt checkpoint {Path(run_dir) / CHECKPOINT}: {e}") from None


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


# --- the loop --------------------------------------------------------------------------------

LOG_COLUMNS = ["step", "lr", "loss", "val_loss", "val_accuracy", "tokens", "seconds"]
# Of the tokens a run computed on (every position of every batch: `tokens`, which tokens/s and MFU
# count), those whose targets carry loss and those that are padding; a probe run's rows tell them apart.
COUNTS = ("scored_tokens", "padding_tokens")


@dataclass
class TrainResult:
    run_id: str
    run_dir: Path
    row: dict[str, Any]
    skipped: bool = False


def _write_log(run_dir: Path, rows: list[dict[str, Any]]) -> None:
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
    """
    runs_dir = Path(runs_dir)
    run_dir = runs_dir / spec.run_id
    trackers.require(spec.train.tracker)
    ddp, dev = Distributed.from_env(resolve_device(device))
    # config.json alone is not worth keeping: a run that fails before its first checkpoint leaves nothing
    claim = results.claim(run_dir, f"run {spec.run_id}", setup=("config.json",)) if ddp.main else contextlib.nullcontext()
    try:
        with claim, \
                on_interrupt(f"before {spec.run_id} took a step; finished runs, results and checkpoints "
                             "are kept as they were (run again, with --resume, to go on)"):
            return _train(spec, runs_dir, run_dir, dev, ddp, resume, progress and ddp.main, data, stop_after,
                          overwrite)
    finally:
        ddp.close()


def _train(spec, runs_dir, run_dir, dev, ddp: Distributed, resume, progress, data, stop_after, overwrite):
    t = spec.train
    if resume and (run_dir / "config.json").exists():
        recorded = None
        with contextlib.suppress(OSError, ValueError, AttributeError):  # unreadable: the checkpoint's own checks speak
            recorded = json.loads((run_dir / "config.json").read_text()).get("corpus")
        check_probe_corpus(spec.data, recorded, spec.run_id)
    if not overwrite and (run_dir / FINAL).exists():
        done = [r for r in results.read_rows(results.table_path(runs_dir, "runs")) if r["run_id"] == spec.run_id]
        if done and done[0]["status"] == "ok":
            return TrainResult(spec.run_id, run_dir, done[0], skipped=True)
    if data is None and not is_probe(spec.data):
        data = load_tokens(spec.data)
    source = batches.source_for(spec, data)
    vocab_size, fingerprint = (data.vocab_size, data.fingerprint) if data is not None else probe_corpus(spec.data)
    model = build_model(spec, vocab_size).to(dev)
    if spec.extension is not None:
        load_parent(model, spec, runs_dir)
    net = TrainingForward(ddp.wrap(model), t.compile, dev)
    if net.status == "on":
        model.reserve_positions(source.bound, t.train_len)
    opt = make_optimizer(model, t)
    gen = torch.Generator().manual_seed(spec.seed)
    if ddp.main:
        run_dir.mkdir(parents=True, exist_ok=True)
        config = {**spec.to_json(), "vocab_size": vocab_size, "corpus": fingerprint}
        results.write_atomic(run_dir / "config.json", json.dumps(config, indent=1, default=str))

    step, seconds, log = 0, 0.0, []
    counted: dict[str, int | None] = dict.fromkeys(COUNTS, 0)
    if resume and (run_dir / CHECKPOINT).exists():
        state, log = load_checkpoint(run_dir, model, opt, gen)
        step, seconds = state["step"], state["seconds"]
        counted = {k: state.get(k) for k in COUNTS}  # a checkpoint of an older posbench: unknown
        if ddp.main:
            _write_log(run_dir, log)  # the view may lag its checkpoint after a kill
    elif ddp.main:
        (run_dir / FINAL).unlink(missing_ok=True)
        (run_dir / CHECKPOINT).unlink(missing_ok=True)
    tracker = trackers.start(t.tracker, runs_dir, spec.run_id, spec.task, config,
                             log[-1] if log else None) if ddp.main else trackers.Tracker()

    backend = model.layout.backends(dev)
    row_base = {
        "run_id": spec.run_id, "task": spec.task, "scheme": spec.scheme,
        "params": model.layout.describe(), "seed": spec.seed, "train_len": spec.original_len,
        "randomized": t.randomize_positions, "steps": t.steps,
        "n_params": sum(p.numel() for p in model.parameters()), "backend": backend,
        "compile": net.status, **extension_columns(spec.extension),
        "plugins": ";".join(f"{s.path}@{s.sha256[:12]}" for s in spec.plugin_sources()),
        **results.provenance(dev.type, t.dtype, fingerprint),
    }

    saved = step

    def checkpoint():
        nonlocal saved
        if ddp.main:
            save_checkpoint(run_dir, model, opt, gen, {"step": step, "seconds": seconds, **counted}, log)
        saved = step

    def fail(message: str):
        gen.set_state(gen_at_step_start)  # the checkpoint holds the step before this one
        checkpoint()
        if ddp.main:
            results.merge_rows(runs_dir, "runs", [{**row_base, "status": "failed", "message": message,
                                                   "tokens": step * t.batch_size * t.train_len, **counted}])
        raise RunFailed(f"{spec.run_id}: {message}; recorded as failed in {runs_dir / 'runs.csv'}")

    def forward_backward(batch: batches.Batch) -> float:
        with autocast(dev, t.dtype):
            loss = batches.masked_mean(net(batch.tokens, batch.positions, targets=batch.targets), batch.mask)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        # Read once the backward is queued: on a GPU, reading between forward and backward would
        # leave the device idle while the backward launches. The weights are not yet stepped, so a
        # non-finite loss still fails with the checkpoint of the step before.
        value = ddp.mean(loss.detach()).item()
        if not math.isfinite(value):
            fail(f"loss became {value} at step {step}")
        return value

    model.train()
    bar = _progress(progress)
    task_id = bar.add_task(spec.run_id, total=t.steps, completed=step, loss=float("nan"), tps=0.0)
    stop_at = t.steps if stop_after is None else min(t.steps, step + stop_after)
    with bar, tracker, _interrupt_at_step_end() as pressed:
        try:
            while step < stop_at:
                if ddp.any(bool(pressed), dev):
                    checkpoint()
                    raise Interrupted(f"{spec.run_id} checkpointed at step {step} of {t.steps}; finished runs "
                                      "and results are kept (continue with the same command and --resume)")
                began = time.perf_counter()
                gen_at_step_start = gen.get_state()
                for group in opt.param_groups:
                    group["lr"] = lr_at(step, t)
                drawn = source.sample(gen)
                batch = ddp.local(drawn).to(dev)
                try:
                    value = net.first_step(lambda: forward_backward(batch))
                except (RuntimeError, NotImplementedError) as e:
                    # a kernel this device refused (a compiler's error in the backward on a GPU):
                    # this run fails and a grid goes on; running out of memory stays the error
                    if out_of_memory(e):
                        raise
                    fail(f"{type(e).__name__} at step {step}: {first_line(e)}")
                row_base["compile"] = net.status  # "fallback" once the first step failed to compile
                torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
                opt.step()
                step += 1
                seconds += time.perf_counter() - began
                for k, n in zip(COUNTS, (drawn.scored, drawn.padding)):
                    counted[k] = None if counted[k] is None else counted[k] + n
                entry = {"step": step, "lr": lr_at(step - 1, t), "loss": value, "val_loss": None,
                         "val_accuracy": None, "tokens": step * t.batch_size * t.train_len, "seconds": seconds}
                if (step % t.eval_interval == 0 or step == t.steps) and ddp.main:
                    entry.update(source.validate(model, dev, autocast(dev, t.dtype)))
                log.append(entry)
                tracker.log(entry)
                if t.stop_accuracy and ddp.any(learned(entry, t), dev):  # no extra collective otherwise
                    stop_at = step
                bar.update(task_id, completed=step, loss=entry["loss"],
                           tps=t.batch_size * t.train_len * step / max(seconds, 1e-9))
                if step % t.checkpoint_interval == 0:
                    checkpoint()
        except KeyboardInterrupt:
            kept = (f"{spec.run_id} keeps its checkpoint of step {saved} (--resume continues from it)" if saved
                    else f"{spec.run_id} had no checkpoint yet (run it again)")
            raise Interrupted(f"stopped at once; {kept}") from None
    checkpoint()
    stopped = bool(log) and learned(log[-1], t)
    if step < t.steps and not stopped:
        return TrainResult(spec.run_id, run_dir, {**row_base, "status": "partial"})
    if not ddp.main:
        return TrainResult(spec.run_id, run_dir, {**row_base, "status": "ok"})

    from safetensors.torch import save

    results.write_atomic(run_dir / FINAL, save({k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}))
    tail = [e["loss"] for e in log[-10:]]
    tokens = step * t.batch_size * t.train_len
    row = {
        **row_base, "tokens": tokens, **counted, "stopped_at": step if step < t.steps else None,
        "final_train_loss": sum(tail) / len(tail),
        "final_val_loss": log[-1]["val_loss"], "final_val_accuracy": log[-1]["val_accuracy"],
        "unigram_val_loss": unigram_loss(data.train, data.valid, data.vocab_size) if data is not None else None,
        "train_seconds": seconds, "tokens_per_second": tokens / max(seconds, 1e-9),
        "status": "ok", "message": "",
    }
    row.update(compute_rate(model, spec, dev, row["tokens_per_second"]))
    results.merge_rows(runs_dir, "runs", [row])
    return TrainResult(spec.run_id, run_dir, row)


def learned(entry: dict[str, Any], t: TrainConfig) -> bool:
    """Whether a log entry's validation accuracy reached the early-stopping target (when set)."""
    accuracy = entry.get("val_accuracy")
    return bool(t.stop_accuracy) and accuracy is not None and accuracy >= t.stop_accuracy


def compute_rate(model: Transformer, spec: RunSpec, dev: torch.device, tokens_per_second: float) -> dict:
    """Achieved model FLOP/s (posbench.flops) and its fraction of the device's peak, where known."""
    per_token = flops.training_flops_per_token(model, spec.model.n_layers, spec.model.d_model,
                                               spec.train.train_len)
    achieved = per_token * tokens_per_second
    peak = flops.peak_flops(dev, spec.train.dtype)
    return {"model_flops_per_second": achieved, "mfu": achieved / peak if peak else None}


def _progress(enabled: bool):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    return Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]:.3f}"), TextColumn("{task.fields[tps]:,.0f} tok/s"),
        TimeRemainingColumn(), disable=not enabled, transient=False,
    )
