"""Pictures of each encoding (`posbench inspect`), drawn from the schemes' own hooks on schemes
built as the model builds them (posbench.layout), to a length past the training length L, L
marked on every picture:

- input schemes (absolute tables): the vector each position adds to a token's embedding, as a
  heatmap, and the cosine similarity of every pair of positions;
- qk and logits schemes (rotary ones, and RoPE under each eval-time scaling): the logit of a query
  at the last position against a key at distance d, for independent random unit vectors q, k (its
  mean and spread over draws) and for q = k (RoFormer's long-term decay); and the angle by which
  each frequency pair turns against position, marking the pairs that complete a period within L;
- bias schemes: the bias against distance per head, and the (H, T, T) matrix;
- with a trained run, the same from its learned parameters, FoX's and CABLE's gates along a text
  of the test split, and the attention measures by length (posbench.attention_measures).

The arrays behind each picture are returned (`Picture.data`), so that they can be checked.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from posbench import layout, results
from posbench.errors import PosbenchError
from posbench.schemes import Dims, Scheme

MAX_POSITIONS = 8192  # the similarity and bias pictures hold n x n matrices
SAMPLES = 64  # random unit vectors averaged for the logit against distance
MATRIX_FACTOR = 4  # the (T, T) bias matrix is drawn to 4L: the far corner of 16L is all one colour
TABLE_HOOKS = {"input"}  # a vector per position (a mixer has none)
LOGIT_HOOKS = {"qk", "logits"}
FAILED = "failed"  # the kind of a row saying what failed (a picture not drawn, lengths not measured)


@dataclass
class Picture:
    """One PNG and what it shows; `data`: the arrays it is drawn from."""

    scheme: str
    kind: str
    caption: str
    path: Path | None = None
    data: dict[str, Any] = field(default_factory=dict)


def schemes_of(name: str, dims: Dims) -> list[Scheme]:
    """The distinct schemes of a scheme, preset or layout `name`, built as the model builds them."""
    built = layout.build(name, dims)
    return list(built.schemes)


def dims_for(task, train_len: int | None = None) -> Dims:
    """The dimensions of the task's model, at its training length (or `train_len`)."""
    n = train_len or task.train.train_len
    return Dims(d_model=task.model.d_model, n_heads=task.model.n_heads, n_layers=task.model.n_layers,
                vocab_size=2, train_len=n, max_position=n)


# --- the arrays ----------------------------------------------------------------------------------


@torch.no_grad()
def position_vectors(scheme: Scheme, n: int) -> torch.Tensor:
    """(n, d): what the input hook makes of one token at each position 0..n-1. An additive scheme
    adds its table to a zero embedding (its table itself); one that scales the embedding is
    given ones; one that builds token embeddings itself embeds token 0."""
    pos = torch.arange(n)
    idx = torch.zeros(1, n, dtype=torch.long)
    if scheme.owns_token_embedding:
        return scheme.embed(None, idx, pos)[0].float()
    d = scheme.dims.d_model
    out = scheme.embed(torch.zeros(1, n, d), idx, pos)[0]
    if not out.abs().sum():
        out = scheme.embed(torch.ones(1, n, d), idx, pos)[0]
    return out.float()


def cosine_similarity(vectors: torch.Tensor) -> torch.Tensor:
    """(n, d) -> (n, n) cosine similarity of every pair of rows."""
    unit = torch.nn.functional.normalize(vectors.double(), dim=-1)
    return (unit @ unit.T).float()


@torch.no_grad()
def scores(scheme: Scheme, q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor, last: bool = True) -> torch.Tensor:
    """The pre-softmax scores the scheme's hooks give q, k (B, H, T, D) at positions pos (T,):
    (B, H, T) of the last query against every key when `last`, else (B, H, T, T). No mask."""
    ctx = scheme.prepare(pos)
    if "logits" in scheme.hooks:
        s = scheme.logits(q, k, pos, ctx, 0)
        s = s[..., -1, :] if last else s
    else:
        if "qk" in scheme.hooks:
            q, k = scheme.rotate(q, k, pos, ctx, 0)
        query = q[..., -1:, :] if last else q
        s = (query @ k.transpose(-1, -2)) * scheme.qk_scale
        s = s[..., 0, :] if last else s
    if "bias" in scheme.hooks:
        b = scheme.bias(pos, ctx)
        s = s + (b[:, -1, :] if last else b)
    return s.float()


def unit_vectors(b: int, h: int, d: int, generator: torch.Generator) -> torch.Tensor:
    """(b, h, 1, d) random unit vectors."""
    return torch.nn.functional.normalize(torch.randn(b, h, 1, d, generator=generator), dim=-1)


@torch.no_grad()
def logit_by_distance(scheme: Scheme, n: int, samples: int = SAMPLES, seed: int = 0) -> dict[str, torch.Tensor]:
    """A query at position n-1 and keys at every position, the same content at every position:
    the logit against distance d = 0..n-1 (the key at n-1-d), per head. `random_mean`,
    `random_std` (H, n): over independent random unit q, k; `same` (H, n): the mean for q = k."""
    g = torch.Generator().manual_seed(seed)
    h, d = scheme.n_heads, scheme.head_dim
    pos = torch.arange(n)
    # the logits hook forms (B, H, T, T): fewer draws keep it small at 16L
    b = samples if "logits" not in scheme.hooks else max(2, samples // 16)
    q, k = unit_vectors(b, h, d, g), unit_vectors(b, h, d, g)
    rand = scores(scheme, q.expand(b, h, n, d), k.expand(b, h, n, d), pos).flip(-1)  # (B, H, n) by distance
    same = scores(scheme, q.expand(b, h, n, d), q.expand(b, h, n, d), pos).flip(-1)
    return {"distance": torch.arange(n), "random_mean": rand.mean(0), "random_std": rand.std(0),
            "same": same.mean(0)}


@torch.no_grad()
def pair_angles(scheme: Scheme, n: int, train_len: int) -> dict[str, torch.Tensor]:
    """The angle (radians, unwrapped) by which each rotated pair of dims turns at positions
    0..n-1, read from the qk hook: the unit vector on a pair's first dim, rotated, moves onto its
    partner. `angles` (P, n) for the P pairs that turn (head 0), `pairs` (P, 2) their dims,
    `periodic` (P,) whether a pair completes a full turn within L positions."""
    d = scheme.head_dim
    pos = torch.arange(n)
    basis = torch.eye(d)[:, None, None, :].expand(d, scheme.n_heads, n, d)  # (D, H, n, D)
    turned, _ = scheme.rotate(basis, basis, pos, scheme.prepare(pos), 0)
    turned = turned[:, 0].double()  # (D, n, D')
    if turned.shape[-1] != d:
        raise PosbenchError(f"{scheme.name} widens the head to {turned.shape[-1]} dims: no pairs to draw")
    moved = turned.abs().sum(1)  # (D, D): how much of dim t lands on each dim, over positions
    pairs, angles = [], []
    for t in range(d):
        others = moved[t].clone()
        others[t] = 0
        partner = int(others.argmax())
        if others[partner] <= 1e-9 * n or partner < t and moved[partner, t] > 1e-9 * n:
            continue  # a dim that never turns, or a pair already taken from its first dim
        angle = torch.atan2(turned[t, :, partner], turned[t, :, t])
        pairs.append((t, partner))
        angles.append(_unwrap(angle).abs())
    if not angles:
        raise PosbenchError(f"{scheme.name}: no pair of dims turns with position")
    angles = torch.stack(angles)  # (P, n)
    at_len = angles[:, min(train_len, n - 1)]
    return {"angles": angles.float(), "pairs": torch.tensor(pairs), "periodic": at_len >= 2 * math.pi}


def _unwrap(angle: torch.Tensor) -> torch.Tensor:
    """Angles along positions with the jumps of 2 pi removed (steps below pi each)."""
    step = torch.diff(angle, prepend=angle[:1])
    step = (step + math.pi) % (2 * math.pi) - math.pi
    return step.cumsum(0)


@torch.no_grad()
def bias_by_distance(scheme: Scheme, n: int) -> dict[str, torch.Tensor]:
    """The bias of a query at position n-1 on a key at distance d = 0..n-1, per head, (H, n)."""
    pos = torch.arange(n)
    return {"distance": torch.arange(n), "bias": scheme.bias(pos, scheme.prepare(pos))[:, -1, :].flip(-1).float()}


@torch.no_grad()
def bias_matrix(scheme: Scheme, n: int) -> torch.Tensor:
    """(H, n, n) the bias on every (query, key) pair of a window of n, -inf above the diagonal."""
    pos = torch.arange(n)
    b = scheme.bias(pos, scheme.prepare(pos)).float()
    return b.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))


@torch.no_grad()
def gates_along(model, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """The per-token gates of a trained model's gate scheme along one text, tokens (T,): `c`
    (layers, H, T) each layer's cumulative log decay (posbench.schemes.gate), `decay` (layers, H,
    T) the weight factor exp(c_{T-1} - c_j) the last query gives key j."""
    inputs: dict[int, torch.Tensor] = {}
    hooks = [block.attn.register_forward_pre_hook(lambda m, args, i=i: inputs.__setitem__(i, args[0]))
             for i, block in enumerate(model.blocks)]
    try:
        model(tokens[None])
    finally:
        for hook in hooks:
            hook.remove()
    lay = model.layout
    c = []
    for i in sorted(inputs):
        scheme = lay.schemes[lay.layer_scheme[i]]
        if "gate" in scheme.hooks:
            c.append(scheme.gate(inputs[i], i)[0])  # (H, T)
    if not c:
        raise PosbenchError("the run has no gate scheme")
    c = torch.stack(c).float()
    return {"c": c, "decay": (c[..., -1:] - c).exp()}


# --- the pictures --------------------------------------------------------------------------------


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _mark(ax, train_len: int, axis: str = "x") -> None:
    line = ax.axvline if axis == "x" else ax.axhline
    line(train_len, color="grey", linestyle="--", linewidth=1)


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    return results.save_figure(fig, path, 100)


def draw_table(p: Picture, train_len: int) -> None:
    plt = _plt()
    vectors, sim = p.data["vectors"], p.data["similarity"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.8))
    im = a.imshow(vectors.T.numpy(), aspect="auto", cmap="RdBu_r", interpolation="nearest")
    a.set_xlabel("position")
    a.set_ylabel("dimension")
    a.set_title(f"{p.scheme}: position vectors")
    _mark(a, train_len)
    fig.colorbar(im, ax=a)
    im = b.imshow(sim.numpy(), cmap="viridis", vmin=-1, vmax=1, interpolation="nearest")
    b.set_xlabel("position")
    b.set_ylabel("position")
    b.set_title(f"{p.scheme}: cosine similarity")
    _mark(b, train_len)
    _mark(b, train_len, "y")
    fig.colorbar(im, ax=b)
    _save(fig, p.path)


def draw_logits(p: Picture, train_len: int) -> None:
    plt = _plt()
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5), sharey=False)
    for i, (label, data) in enumerate(p.data.items()):
        colour = plt.get_cmap("tab10")(i % 10)
        dist = data["distance"].numpy()[1:]  # log-x: distance 0 is the value at the left edge's
        mean, std = data["random_mean"].mean(0).numpy()[1:], data["random_std"].mean(0).numpy()[1:]
        a.plot(dist, mean, color=colour, linewidth=1, label=label)
        a.fill_between(dist, mean - std, mean + std, color=colour, alpha=0.15, linewidth=0)
        b.plot(dist, data["same"].mean(0).numpy()[1:], color=colour, linewidth=1, label=label)
    a.set_title(f"{p.scheme}: logit, random unit q, k (mean +- sd, heads averaged)", fontsize=9)
    b.set_title(f"{p.scheme}: logit, q = k (long-term decay, heads averaged)", fontsize=9)
    for ax in (a, b):
        _mark(ax, train_len)
        ax.set_xscale("log")
        ax.set_xlabel("distance (tokens)")
        ax.set_ylabel("logit")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    _save(fig, p.path)


def draw_angles(p: Picture, train_len: int) -> None:
    plt = _plt()
    labels = list(p.data)
    fig, axes = plt.subplots(1, len(labels), figsize=(6 * len(labels), 4.5), squeeze=False)
    for ax, label in zip(axes[0], labels):
        data = p.data[label]
        turns = (data["angles"] / (2 * math.pi)).numpy()
        n = turns.shape[1]
        cmap = plt.get_cmap("viridis")
        for i, row in enumerate(turns):
            ax.plot(range(1, n), row[1:], color=cmap(i / max(1, len(turns) - 1)), linewidth=1,
                    linestyle="-" if bool(data["periodic"][i]) else ":")
        _mark(ax, train_len)
        ax.axhline(1, color="black", linewidth=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_ylim(bottom=max(1e-6, float(turns[:, 1:].min()) or 1e-6))
        done = int(data["periodic"].sum())
        ax.set_title(f"{p.scheme} {label}: turns of each pair ({done} of {len(turns)} complete one "
                     f"within L, solid)", fontsize=9)
        ax.set_xlabel("position")
        ax.set_ylabel("angle / 2 pi (fastest pair purple, slowest yellow)")
        ax.grid(alpha=0.3, which="both")
    _save(fig, p.path)


def draw_bias(p: Picture, train_len: int) -> None:
    plt = _plt()
    bias, matrix = p.data["bias"], p.data["matrix"]
    heads = bias.shape[0]
    fig, axes = plt.subplots(1, heads + 1, figsize=(3.6 * (heads + 1), 3.8))
    for h in range(heads):
        axes[0].plot(p.data["distance"].numpy()[1:], bias[h].numpy()[1:], linewidth=1, label=f"head {h}")
    _mark(axes[0], train_len)
    axes[0].set_xscale("log")
    axes[0].set_xlabel("distance (tokens)")
    axes[0].set_ylabel("bias")
    axes[0].set_title(f"{p.scheme}: bias by distance", fontsize=9)
    axes[0].legend(fontsize=6)
    axes[0].grid(alpha=0.3)
    finite = matrix[torch.isfinite(matrix)]
    lo, hi = (float(finite.min()), float(finite.max())) if finite.numel() else (0.0, 1.0)
    for h in range(heads):
        ax = axes[h + 1]
        im = ax.imshow(matrix[h].numpy(), cmap="magma", vmin=lo, vmax=hi, interpolation="nearest")
        _mark(ax, train_len)
        _mark(ax, train_len, "y")
        ax.set_title(f"head {h}: (query, key)", fontsize=9)
    fig.colorbar(im, ax=axes[-1])
    _save(fig, p.path)


def draw_gates(p: Picture, train_len: int) -> None:
    plt = _plt()
    c, decay = p.data["c"], p.data["decay"]
    layers, heads, t = c.shape
    fig, axes = plt.subplots(2, layers, figsize=(3.8 * layers, 6.5), squeeze=False)
    step = torch.diff(c, dim=-1, prepend=torch.zeros_like(c[..., :1])).exp()  # each token's gate f_t
    for layer in range(layers):
        for h in range(heads):
            axes[0][layer].plot(step[layer, h].numpy(), linewidth=0.7, label=f"head {h}")
            axes[1][layer].plot(decay[layer, h].flip(-1).numpy(), linewidth=1, label=f"head {h}")
        axes[0][layer].set_title(f"layer {layer}: gate f_t along the text", fontsize=9)
        axes[0][layer].set_xlabel("position")
        axes[1][layer].set_title(f"layer {layer}: last query's decay by distance", fontsize=9)
        axes[1][layer].set_xlabel("distance (tokens)")
        axes[1][layer].set_yscale("log")
        for ax in (axes[0][layer], axes[1][layer]):
            _mark(ax, train_len)
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=6)
    _save(fig, p.path)


DRAW = {"table": draw_table, "logits": draw_logits, "angles": draw_angles, "bias": draw_bias, "gates": draw_gates}


# --- what each scheme shows ----------------------------------------------------------------------


def pictures(scheme: Scheme, n: int, train_len: int, scalings=(), name: str | None = None) -> list[Picture]:
    """The pictures of one built scheme to n positions; `scalings`: RopeScaling variants drawn
    beside the plain encoding by schemes that take one (`set_scaling`)."""
    name = name or scheme.name
    hooks = set(scheme.hooks)
    out: list[Picture] = []
    limit = scheme.position_limit()
    if hooks & TABLE_HOOKS:
        m = min(n, limit) if limit else n
        vectors = position_vectors(scheme, m)
        out.append(Picture(name, "table", f"{name}: the vector each position adds (left) and the cosine "
                           f"similarity of positions (right), to {m}" + (f" (its table ends at {limit})" if limit and limit < n else ""),
                           data={"vectors": vectors, "similarity": cosine_similarity(vectors)}))
    if hooks & LOGIT_HOOKS and "content" not in hooks:
        variants = {"none": None}
        if hasattr(scheme, "set_scaling"):
            variants.update({s.label: s for s in scalings if s.kind != "none"})
        logits, angles = {}, {}
        before = getattr(scheme, "scaling", None)
        for label, scaling in variants.items():
            if scaling is not None:
                scheme.set_scaling(scaling)
            try:
                logits[label] = logit_by_distance(scheme, n)
                if "qk" in scheme.hooks:  # a two-map scaling (self-extend, rerope, dpe) or dope forms logits instead
                    try:
                        angles[label] = pair_angles(scheme, n, train_len)
                    except PosbenchError:
                        pass  # no pairs that turn (a widened head): the logits say it all
            finally:
                if scaling is not None:
                    scheme.set_scaling(before)
        out.append(Picture(name, "logits", f"{name}: the logit of the last query on a key at each distance, "
                           "for independent random unit q, k (left, mean and spread) and for q = k (right)",
                           data=logits))
        if angles:
            out.append(Picture(name, "angles", f"{name}: the angle each frequency pair turns by against position "
                               "(log-log; solid: the pair completes a period within L)", data=angles))
    if "bias" in hooks:
        m = min(n, MATRIX_FACTOR * train_len)
        out.append(Picture(name, "bias", f"{name}: the bias of the last query on a key at each distance, per "
                           f"head, and the (query, key) bias of a window of {m}",
                           data={**bias_by_distance(scheme, n), "matrix": bias_matrix(scheme, m)}))
    return out


def inspect_schemes(names, dims: Dims, n: int, out: Path, scalings=()) -> list[Picture]:
    """The pictures of each named scheme, preset or layout (its distinct schemes), written to out."""
    drawn = []
    for name in names:
        built = schemes_of(name, dims)
        for scheme in built:
            label = name if layout.parse(name).plain() is not None else scheme.name
            found = pictures(scheme, n, dims.train_len, scalings, label)
            if not found:
                drawn.append(Picture(label, "none", f"{label}: hooks {', '.join(scheme.hooks) or 'none'} "
                                     "read content; only a trained run shows them (--run)"))
            drawn += found
    return write(drawn, out, dims.train_len)


def inspect_run(run_dir: Path, n: int, out: Path, device: str = "cpu") -> list[Picture]:
    """The pictures of a trained run's learned schemes and of its gates along a test text."""
    from posbench.data import load_tokens
    from posbench.runs import load_trained

    spec, model, _ = load_trained(run_dir, device)
    train_len = spec.train.train_len
    drawn: list[Picture] = []
    for scheme in model.layout.schemes:
        if not any(True for _ in scheme.parameters()):
            continue  # nothing learned: it draws as it does without a run
        scheme.cpu()
        name = spec.run_id if len(model.layout.schemes) == 1 else f"{spec.run_id}-{scheme.name}"
        try:
            drawn += [dataclasses.replace(p, caption=f"trained {p.caption}")
                      for p in pictures(scheme, n, train_len, name=name)]
        except Exception as e:  # the scheme fails to n positions: said, and the run's measures go on
            from posbench.sweep import failure

            reason = failure(e, n)
            if reason is None:
                raise
            drawn.append(Picture(name, FAILED, f"{name}: not drawn, it failed {reason}"))
        scheme.to(device)
        if "gate" in scheme.hooks:
            tokens = load_tokens(spec.data).test[: min(n, MATRIX_FACTOR * train_len)].to(device)
            drawn.append(Picture(spec.run_id, "gates", f"trained {spec.run_id}: each token's gate along a test "
                                 f"text of {len(tokens)} tokens (top) and the last query's decay by distance "
                                 "(bottom), per layer", data=gates_along(model, tokens)))
    return write(drawn, out, train_len)


def inspect_runs(runs: list[Path], task, lengths: tuple[int, ...] | None, out: Path, device: str = "auto",
                 progress: bool = False) -> tuple[Path, list[Picture]]:
    """Each run's learned pictures, and its attention measured by length (default 1x to 16x its
    training length, the task's other [eval] settings) into out/attention.csv with its plots
    and the perplexity tables beside it; inspect.md links them all."""
    from posbench import attention_measures, config, results
    from posbench.readings import Models, extrapolate_runs
    from posbench.device import resolve_device
    from posbench.runs import load_spec

    dev = resolve_device(device)
    drawn: list[Picture] = []
    for run_dir in runs:
        spec, _ = load_spec(run_dir)
        train_len = spec.train.train_len
        measured = lengths or tuple(train_len * 2**k for k in range(5))
        drawn += inspect_run(run_dir, max(measured), out, dev)
        cfg = config.replace(task.eval, lengths=measured)
        rows = extrapolate_runs(Models(run_dir.parent, runs=[run_dir], device=str(dev)), cfg, Path(out), progress,
                                attention=True)
        failed = results.failed_line(rows, results.table_path(out, "extrapolation"))
        if failed:
            drawn.append(Picture(spec.run_id, FAILED, f"{spec.run_id}: {failed}"))
    rows = results.read_rows(results.table_path(out, "attention"))
    extrapolation = results.read_rows(results.table_path(out, "extrapolation"))
    for name, draw in (("attention", lambda p: attention_measures.plot(rows, p, extrapolation)),
                       ("attention_layers", lambda p: attention_measures.plot_layers(rows, p))):
        drawn.append(Picture("attention", name, f"attention by length in {', '.join(r.name for r in runs)} "
                             "(posbench/docs/inspect.md defines the measures)",
                             path=draw(Path(out) / f"{name}.png")))
    notes = [f"Trained runs: {', '.join(r.name for r in runs)}. Measures by length in attention.csv, "
             "perplexity in extrapolation.csv."]
    return markdown(drawn, out, "What the trained encodings learned, and what their attention does", notes), drawn


def write(drawn: list[Picture], out: Path, train_len: int) -> list[Picture]:
    for p in drawn:
        if p.kind in DRAW:
            p.path = Path(out) / f"{layout.run_prefix(p.scheme)}-{p.kind}.png"
            DRAW[p.kind](p, train_len)
    return drawn


def markdown(drawn: list[Picture], out: Path, title: str, notes: list[str] = ()) -> Path:
    """inspect.md: every picture with its caption, relative links."""
    from posbench.results import write_atomic

    lines = [f"# {title}", "", *notes, ""] if notes else [f"# {title}", ""]
    for p in drawn:
        lines.append(f"## {p.scheme}: {p.kind}" if p.path else f"## {p.scheme}")
        lines += ["", p.caption + ".", ""]
        if p.path:
            lines += [f"![{p.scheme} {p.kind}]({p.path.name})", ""]
    path = Path(out) / "inspect.md"
    write_atomic(path, "\n".join(lines))
    return path
