"""`posbench extend`: context extension by fine-tuning (posbench/docs/extension.md).

Each finished parent run is fine-tuned with each method into a child run: the parent's scheme,
data, model, seed and optimizer settings, the extension's lr, warm-up and schedule, the method's
record (posbench.extension) in its run_id, and the same training function as every run
(posbench.training.train): the child starts from the parent's final weights, draws PoSE's batches or
trains under its rescaling, checkpoints, resumes and records NaN as any run does.

Equal budgets: a budget of S steps is S x B rows of L' tokens (B the parent's batch size); `pose`
methods and `drope` spend the same tokens in rows of the parent's length L, in S L'/L steps of B
rows.

`drope` (Gelberg et al. 2025, arXiv:2512.12167; SakanaAI/DroPE) removes every RoPE layer's
rotation (the child's layout: `layout.without_rope`) and recalibrates the parent's weights at L
with the reference's optimizer settings, not the other methods': its own peak lr (`drope_lr`),
warm-up then `drope_schedule` (cosine), and no weight decay (cfgs/trainer_cfg/base.yaml,
weight_decay 0).

`longrope` searches its factors first (`search_factors`), on the parent's validation split at L'
(a probe's run: its held-out examples of L' tokens). A probe's run extends on its own examples, of
lengths up to L', and is scored by `posbench probe`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import random
from pathlib import Path

import torch

from posbench import batches, layout, results
from posbench.config import ExtendConfig
from posbench.data import TokenData, cached_tokens
from posbench.errors import PosbenchError, RunFailed, on_interrupt
from posbench.extension import DROPE, Extension, check_pairing
from posbench.positions import randomized
from posbench.probes import parse_probe
from posbench.policies import RopeScaling
from posbench.policies.frequencies import yarn_ramp
from posbench.device import resolve_device
from posbench.runs import FINAL, RunSpec, load_trained
from posbench.training import train

SEARCH = ("population", "parents", "mutation", "iterations", "search_windows")
STEP = 0.01  # LongRoPE's grid of factors (Table 4)
DROPE_WEIGHT_DECAY = 0.0  # the DroPE reference's recalibration (cfgs/trainer_cfg/base.yaml)


def child_spec(parent: RunSpec, method: str, steps: int, cfg: ExtendConfig) -> RunSpec:
    """The child of `parent` fine-tuned with `method` to cfg.target_len on a budget of `steps`."""
    base, target = parent.train.train_len, cfg.target_len
    ext_steps, row_len = steps, target
    if method.startswith("pose+") or method == DROPE:
        if (steps * target) % base:
            raise PosbenchError(f"{method}: {steps} steps of rows of {target} are not a whole number of steps "
                                f"of rows of {base} (equal tokens): choose steps or a target length that divide")
        ext_steps, row_len = steps * target // base, base
    settings: dict = {}
    if method.removeprefix("pose+") == "yarn":
        settings = {"alpha": cfg.yarn_alpha, "beta": cfg.yarn_beta}
    if method == "longrope":
        settings = {k: getattr(cfg, k) for k in SEARCH}
    # A child spends its whole budget: a parent's early stop at a target accuracy is not inherited
    t = dataclasses.replace(parent.train, train_len=row_len, steps=ext_steps, lr=cfg.lr, warmup=cfg.warmup,
                            schedule=cfg.schedule, stop_accuracy=0.0)
    scheme, params = parent.scheme, parent.params
    if method == DROPE:
        t = dataclasses.replace(t, lr=cfg.drope_lr, schedule=cfg.drope_schedule, weight_decay=DROPE_WEIGHT_DECAY)
        scheme, params = layout.without_rope(parent.scheme), {}
    ext = Extension(parent=parent.run_id, method=method, base_len=base, target_len=target, steps=steps,
                    settings=settings)
    return RunSpec(scheme=scheme, params=params, seed=parent.seed, data=parent.data,
                   model=parent.model, train=t, task=parent.task, extension=ext)


def parent_runs(runs_dir: Path, schemes: tuple[str, ...] | None) -> list[Path]:
    """Finished runs of `schemes` (all: None) trained from scratch, on text or on a probe's
    examples; one line when a named scheme has none, saying when its run is unfinished."""
    if not runs_dir.is_dir():
        raise PosbenchError(f"runs directory {str(runs_dir)!r} does not exist; train a parent first")
    found = []
    for config in sorted(runs_dir.glob("*/config.json")):
        try:
            raw = json.loads(config.read_text())
        except (OSError, ValueError):
            continue  # a damaged run fails with its own message where it is loaded
        if not isinstance(raw, dict):
            continue
        named = not schemes or layout.run_prefix(str(raw.get("scheme"))) in {layout.run_prefix(s) for s in schemes}
        if raw.get("extension") or not named:
            continue
        found.append((config.parent, raw.get("scheme"), (config.parent / FINAL).exists()))
    for name in schemes or ():
        mine = [f for f in found if layout.run_prefix(str(f[1])) == layout.run_prefix(name)]
        if not any(done for _, _, done in mine):
            unfinished = f" ({mine[0][0].name} is unfinished: continue it with --resume)" if mine else ""
            raise PosbenchError(f"no finished parent run of {name} in {runs_dir}{unfinished}")
    parents = [run for run, _, done in found if done]
    if not parents:
        raise PosbenchError(f"no finished parent runs in {runs_dir}; train one first (`posbench train`)")
    return parents


def plan(runs_dir: Path, cfg: ExtendConfig, methods_of, schemes: tuple[str, ...] | None = None,
         only: set[str] | None = None) -> list[RunSpec]:
    """Every child: each parent (of `only`, run_ids, when given) x its scheme's methods
    (`methods_of(scheme)`) x budget, every pairing checked before anything trains."""
    children = []
    for run_dir in parent_runs(runs_dir, schemes):
        if only is not None and run_dir.name not in only:
            continue
        spec, model, _ = load_trained(run_dir)
        if randomized(spec.train):
            raise PosbenchError(f"parent {spec.run_id} trained on randomized positions: extend a run "
                                "trained on positions 0..L-1")
        for method in methods_of(spec.scheme):
            check_pairing(spec.scheme, model.layout, method, spec.train.train_len, cfg.target_len)
            children += [child_spec(spec, method, steps, cfg) for steps in cfg.steps]
    return children


def extend(runs_dir: Path | str, cfg: ExtendConfig, methods_of, schemes: tuple[str, ...] | None = None,
           device: str = "auto", resume: bool = False, progress: bool = False, log=print,
           data_cache: dict | None = None, only: set[str] | None = None,
           tracker: str | None = None) -> tuple[list[RunSpec], list[str]]:
    """Train every child of the finished parents in runs_dir (finished children are skipped);
    returns every child's spec and the run_ids whose training failed (NaN: recorded as failed, the
    others go on). `tracker` (posbench.trackers) replaces the one the children take from their
    parents' settings; it is logistics and leaves run_ids alone."""
    runs_dir = Path(runs_dir)
    children = plan(runs_dir, cfg, methods_of, schemes, only)
    cache = {} if data_cache is None else data_cache
    failed = []
    for spec in children:
        if finished(runs_dir, spec):
            log(f"{spec.run_id}: already fine-tuned, skipped")
            continue
        data = cached_tokens(spec.data, cache)
        if spec.extension.method == "longrope":
            spec = with_factors(spec, runs_dir, data, device, log)
        if tracker is not None:
            spec = dataclasses.replace(spec, train=dataclasses.replace(spec.train, tracker=tracker))
        log(f"extend {spec.extension.parent} with {spec.extension.method} to {cfg.target_len}: {spec.run_id}")
        try:
            train(spec, runs_dir, device=device, resume=resume, progress=progress, data=data)
        except RunFailed as e:
            log(str(e))
            failed.append(spec.run_id)
    return children, failed


def finished(runs_dir: Path, spec: RunSpec) -> bool:
    rows = results.read_rows(results.table_path(runs_dir, "runs"))
    ok = any(r["run_id"] == spec.run_id and r["status"] == "ok" for r in rows)
    return ok and (runs_dir / spec.run_id / FINAL).exists()


# --- LongRoPE's search --------------------------------------------------------------------------


def with_factors(spec: RunSpec, runs_dir: Path, data: TokenData | None, device: str, log) -> RunSpec:
    """The child with its searched factors: those its config.json holds when it already started
    (a resumed child keeps them), else a new search, recorded in search.json beside it."""
    run_dir = runs_dir / spec.run_id
    try:
        factors = json.loads((run_dir / "config.json").read_text())["extension"]["factors"]
    except (OSError, ValueError, KeyError, TypeError):
        factors = None
    if not factors:
        dev = resolve_device(device)
        _, model, _ = load_trained(runs_dir / spec.extension.parent, dev)
        log(f"longrope: searching factors for {spec.extension.parent} at {spec.extension.target_len}")
        with on_interrupt(f"during the LongRoPE search of {spec.run_id}, which is not kept (run again to search "
                          "anew); finished runs and results are kept as they were"):
            found = search_factors(model, target_loss(model, spec, data, dev), spec.extension, spec.seed)
        factors = found["factors"]
        results.write_atomic(run_dir / "search.json", json.dumps(found, indent=1) + "\n")
    return dataclasses.replace(spec, extension=dataclasses.replace(spec.extension, factors=tuple(factors)))


def seed_factors(pairs: int, base: float, base_len: int, s: float) -> dict[str, list[float]]:
    """The search's first candidates, as lambda_t (theta_t / lambda_t): PI (s for every pair), NTK
    (s^(2t/(d-2)), its base change per pair) and YaRN (1 / (ramp/s + 1 - ramp)), d = 2 pairs."""
    d = 2 * pairs
    ramp = yarn_ramp(d, base, base_len, 1.0, 32.0).tolist()
    return {"pi": [s] * pairs,
            "ntk": [s ** (2 * t / (d - 2)) if d > 2 else s for t in range(pairs)],
            "yarn": [1 / (r / s + 1 - r) for r in ramp]}


class Search:
    """LongRoPE's evolutionary search (Ding et al., ICML 2024, section 4.1; microsoft/LongRoPE
    `evolution/`), at posbench's size: factors lambda_t on a grid of 0.01 in [1, 1.25 s],
    non-decreasing in t; the PI, NTK and YaRN factors seed a population of `population` (the rest
    their mutations); each of `iterations` rounds keeps the `parents` best and adds population/2
    mutations (each factor redrawn, with chance `mutation`, between its neighbours) and
    population/2 crossovers (each factor from either parent, sorted). Fitness: mean loss at L' on
    `search_windows` validation windows. No n^ (the first positions kept unscaled): transformers'
    longrope has none either."""

    def __init__(self, fitness, pairs: int, s: float, settings: dict, seed: int):
        self.fitness, self.pairs, self.s = fitness, pairs, s
        self.top = round(1.25 * s, 2)
        self.p = settings
        self.rng = random.Random(f"longrope:{seed}")
        self.scores: dict[tuple[float, ...], float] = {}

    def grid(self, factors) -> tuple[float, ...]:
        return tuple(sorted(min(self.top, max(1.0, round(round(f / STEP) * STEP, 2))) for f in factors))

    def score(self, factors: tuple[float, ...]) -> float:
        if factors not in self.scores:
            self.scores[factors] = self.fitness(factors)
        return self.scores[factors]

    def mutate(self, factors: tuple[float, ...]) -> tuple[float, ...]:
        out = list(factors)
        for _ in range(20):  # redraw until the candidate is new (or give up: it scores from the cache)
            for t in range(self.pairs):
                if self.rng.random() < self.p["mutation"]:
                    lo = out[t - 1] if t else 1.0
                    hi = out[t + 1] if t + 1 < self.pairs else self.top
                    out[t] = round(self.rng.randint(round(lo / STEP), round(hi / STEP)) * STEP, 2)
            if tuple(out) not in self.scores:
                break
        return self.grid(out)

    def crossover(self, a: tuple[float, ...], b: tuple[float, ...]) -> tuple[float, ...]:
        child = self.grid(x if self.rng.random() < 0.5 else y for x, y in zip(a, b))
        return child if child not in self.scores else self.mutate(a)

    def run(self, seeds: dict[str, list[float]]) -> dict:
        population = [self.grid(f) for f in seeds.values()]
        while len(population) < self.p["population"]:
            population.append(self.mutate(population[len(population) % len(seeds)]))
        for _ in range(self.p["iterations"]):
            ranked = sorted(dict.fromkeys(population), key=self.score)[: self.p["parents"]]
            half = self.p["population"] // 2
            born = [self.mutate(self.rng.choice(ranked)) for _ in range(half)]
            for _ in range(self.p["population"] - half):
                a, b = self.rng.sample(ranked, 2) if len(ranked) > 1 else (ranked[0], ranked[0])
                born.append(self.crossover(a, b))
            population = ranked + born
        best = min(dict.fromkeys(population), key=self.score)
        return {"factors": list(best), "loss": self.score(best), "evaluations": len(self.scores),
                "seed_losses": {k: self.score(self.grid(f)) for k, f in seeds.items()}, "settings": self.p}


def target_loss(model, spec: RunSpec, data: TokenData | None, device):
    """The search's fitness data: a function of no arguments giving the parent's mean loss at L'
    under the scaling set at the time, on `search_windows` validation windows of text or, for a
    probe's run, on the answer tokens of its held-out examples of L' tokens."""
    length = spec.extension.target_len
    if data is None:
        source = batches.ProbeExamples(parse_probe(spec.data.spec), dataclasses.replace(spec.train, train_len=length))
        return lambda: source.validate(model, device, contextlib.nullcontext())["val_loss"]
    n, valid = spec.extension.settings["search_windows"], data.valid
    if len(valid) < n * length + 1:
        raise PosbenchError(f"the validation split ({len(valid)} tokens) is shorter than {n} windows of {length}")
    rows = torch.arange(n)[:, None] * length + torch.arange(length + 1)
    chunk = valid[rows].to(device)  # (n, L' + 1)
    return lambda: float(model.token_losses(chunk[:, :-1], chunk[:, 1:]).mean())


@torch.inference_mode()
def search_factors(model, loss, ext: Extension, seed: int) -> dict:
    """LongRoPE factors for the parent `model` at ext.target_len (Search), with the best loss, the
    seeds' losses and the number of evaluations; `loss()` scores the scaling set (target_loss)."""
    rotary = [s for s in model.layout.schemes if hasattr(s, "set_scaling")]
    widths = {s.rotary_dim // 2 for s in rotary}
    if len(widths) != 1:
        raise PosbenchError(f"longrope needs one rotary width across the layout, got {sorted(widths)} pairs")
    pairs = widths.pop()

    def fitness(factors: tuple[float, ...]) -> float:
        model.layout.set_scaling(RopeScaling("longrope", ext.factor, factors=factors))
        return loss()

    seeds = seed_factors(pairs, rotary[0].p["base"], ext.base_len, ext.factor)
    found = Search(fitness, pairs, ext.factor, ext.settings, seed).run(seeds)
    model.layout.set_scaling(RopeScaling())
    if not math.isfinite(found["loss"]):
        raise PosbenchError(f"longrope search found no finite loss at {ext.target_len} for {ext.parent}")
    return found
