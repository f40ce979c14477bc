"""`posbench check`: the conformance report of a scheme, preset or layout (a plug-in's above all).

Each property builds a small model with the scheme (2 layers, d_model 32, 2 heads of 16: the
smallest FlexAttention takes) at training length 16 and answers pass, warn or fail:

- causality: the Jacobian of the outputs before position t with respect to the token embeddings
  from t on is exactly zero; outputs before t do not change when token t does, nor when tokens
  are appended after a prefix of t (a dependence on the window's length fails too); on every
  attention path the scheme can take (FlexAttention too, uncompiled) and for three draws of the
  weights (as initialized, moved off it, and x30);
- translation: with `relative = True`, shifting every position by a constant leaves the outputs
  unchanged; without it, a warn when they are unchanged all the same;
- past the training length: finite outputs at 16x, or the scheme's own PositionLimitError;
- paths agree: the scheme's fast path and the explicit path give the same outputs;
- batch independence, determinism (same seed, same bits), save/load round trip, gradients
  reaching every parameter of the scheme, a finite bfloat16 forward;
- one compiled graph (torch._dynamo.explain), a warn naming the break otherwise;
- flex backward: a scheme that takes FlexAttention on CUDA, forced onto that path here and
  compiled up to kernel generation, passes the check CUDA's compiler makes of each backward
  graph (a learned tensor indexed once in the score_mod), with the explicit path's gradients;
- cost: forward+backward time at two lengths as ratios to `none` and `rope`, medians of the same
  run (a warn above 10x rope at the longer length: it is a reading, not a rule); a scheme with a
  finite table inside it.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import statistics
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch
from safetensors.torch import load, save

from posbench import attention, catalogue, layout, plugins
from posbench.config import ModelConfig
from posbench.errors import PosbenchError, first_line
from posbench.model import Transformer
from posbench.schemes import Dims, PositionLimitError

T = 16  # the training length of the checks
VOCAB = 64
EXTRAPOLATION = 16  # x the training length
ATOL = 1e-5  # float32 noise of two computations of one output
SHIFT_ATOL = 1e-6  # a relative scheme's outputs under a shift (see tests/test_scheme_properties.py)
COST_LENGTHS = (128, 512)
PROPERTIES = ("causality", "translation", "past training length", "paths agree", "batch independence",
              "determinism", "save/load", "gradients", "bfloat16", "compiled graph", "flex backward", "cost")


@dataclass(frozen=True)
class Finding:
    prop: str
    status: str  # pass | warn | fail | skip
    detail: str = ""


def build(name: str, params: dict[str, Any] | None = None, seed: int = 0, d_model: int = 32,
          n_heads: int = 2, n_layers: int | None = None, train_len: int = T) -> Transformer:
    """The scheme `name` (scheme, preset or layout spec) on a small model, in eval mode."""
    lay = layout.parse(name)
    if params and lay.plain() is None:
        raise PosbenchError(f"layout {name!r} takes its parameters inside its spec, not as --param")
    n_layers = n_layers or max(2, len(lay.pattern))
    torch.manual_seed(seed)
    dims = Dims(d_model=d_model, n_heads=n_heads, n_layers=n_layers, vocab_size=VOCAB, train_len=train_len,
                max_position=train_len, params=dict(params or {}))
    cfg = ModelConfig(vocab_size=VOCAB, d_model=d_model, n_layers=n_layers, n_heads=n_heads)
    return Transformer(cfg, layout.build(name, dims)).eval()


def paths(model: Transformer) -> list[tuple[str, str | None]]:
    """The attention paths the model can take here, as (label, forced backend): each layer its
    own (None: the model's choice), and every layer explicit."""
    own = sorted({model.layout.backend(i, "cpu") for i in range(len(model.blocks))})
    return [("+".join(own), None)] + ([("explicit", "explicit")] if own != ["explicit"] else [])


def _forced(model: Transformer, backend: str | None) -> Transformer:
    model.backend = backend
    return model


def _tokens(n: int = 2, t: int = T, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n, t), generator=torch.Generator().manual_seed(seed))


def _first_apart(a: torch.Tensor, b: torch.Tensor, atol: float = ATOL) -> int | None:
    """The first position (dim 1) where two outputs (B, T, d) differ beyond float noise (`atol`);
    a non-finite output differs from everything. None when they agree."""
    apart = ~torch.isclose(a, b, atol=atol, rtol=0)
    found = apart.any(dim=(0, 2)).nonzero()
    return int(found[0]) if len(found) else None


# The weights the causality check reads: as initialized, every weight moved off its value (a
# zero-initialized one too, since a leak through a zero weight is silent until training moves it),
# and those multiplied by 30 (a trained model's weights are not small). Each is (label, noise, scale).
DRAWS = (("as initialized", 0.0, 1.0), ("redrawn", 0.5, 1.0), ("redrawn x30", 0.5, 30.0))


def _drawn(model: Transformer, noise: float, scale: float, seed: int = 7) -> Transformer:
    """Every floating-point parameter plus `noise` times a normal draw times its mean magnitude
    (1 for an all-zero one), then multiplied by `scale`."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.is_floating_point():
                if noise:
                    p.add_(noise * (float(p.abs().mean()) or 1.0) * torch.randn(p.shape, generator=g).to(p.dtype))
                p.mul_(scale)
    return model


@contextlib.contextmanager
def _eager_flex():
    """FlexAttention uncompiled on this device (its reference computation, backward included), so
    the causality check reads the score_mod and block mask a CUDA run takes."""
    import torch.nn.attention.flex_attention as flex_module

    saved = flex_module._validate_device, attention._compiled_flex
    flex_module._validate_device = lambda *args: None
    attention._compiled_flex = attention._flex
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        flex_module._validate_device, attention._compiled_flex = saved


def causal_paths(model: Transformer) -> list[tuple[str, str | None]]:
    """paths(model), and FlexAttention where a layer takes it on CUDA."""
    found = paths(model)
    if attention.flex_available() and "flex" in {model.layout.backend(i, "cuda") for i in range(len(model.blocks))}:
        found.append(("flex", "flex"))
    return found


def _run(model: Transformer, backend: str | None, *args, **kwargs) -> torch.Tensor:
    model.backend = backend
    with _eager_flex() if backend == "flex" else contextlib.nullcontext():
        return model(*args, **kwargs)


def _with_leaf(model: Transformer, backend: str | None, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The outputs (B, T, V) and the token embeddings they were computed from, as a leaf that
    takes gradients: the token table's output, or the first block's input for a scheme that builds
    token embeddings itself (an input or mixer hook that reads ahead then shows in the Jacobian)."""
    grabbed: list[torch.Tensor] = []

    def leaf(e: torch.Tensor) -> torch.Tensor:
        grabbed.append(e.detach().requires_grad_(True))
        return grabbed[-1]

    hook = (model.tok.register_forward_hook(lambda module, args, out: leaf(out)) if model.tok is not None else
            model.blocks[0].register_forward_pre_hook(lambda module, args: (leaf(args[0]),) + tuple(args[1:])))
    try:
        with torch.enable_grad():
            out = _run(model, backend, x)
    finally:
        hook.remove()
    return out, grabbed[0]


def _later(grad: torch.Tensor, i: int) -> torch.Tensor:
    """The largest |d output_i / d e_j| for each j > i, of a gradient (T, d); NaN stays NaN."""
    return grad[i + 1:].abs().amax(dim=-1)


def jacobian_leak(model: Transformer, x: torch.Tensor, backend: str | None) -> str | None:
    """Where an output reads a later input, exactly: the Jacobian of every output (a fixed random
    projection of position i's logits) with respect to every token embedding after i must be zero
    to the bit (a masked attention weight is an exact zero, and so is its gradient). `x` is one
    sequence (1, T). One backward reads every row: copy c of the sequence in a batch of T - 1
    projects its output at c. Where a row is not zero, each row is read again on the sequence
    alone, so a scheme that mixes a batch (batch independence fails it) is not called a leak here.
    None when nothing leaks; 'non-finite' when the outputs cannot be read."""
    t = x.shape[1]
    r = torch.randn(VOCAB, generator=torch.Generator().manual_seed(2))
    rows = torch.arange(t - 1)
    out, e = _with_leaf(model, backend, x.expand(t - 1, t))
    if not torch.isfinite(out).all():
        return "non-finite"
    with _eager_flex() if backend == "flex" else contextlib.nullcontext():
        (grad,) = torch.autograd.grad((out[rows, rows] @ r).sum(), e)
    if all(bool((_later(grad[c], c) == 0).all()) for c in range(t - 1)):
        return None
    out, e = _with_leaf(model, backend, x)
    for i in range(t - 1):
        with _eager_flex() if backend == "flex" else contextlib.nullcontext():
            (grad,) = torch.autograd.grad(out[0, i] @ r, e, retain_graph=True)
        later = _later(grad[0], i)
        moved = (later != 0).nonzero()
        if len(moved):
            j = int(moved[0])
            return f"the output at {i} reads the input at {i + 1 + j} (d/dx up to {float(later[j]):.1e}, not 0)"
    return None


def causality(name, params) -> Finding:
    """Three ways the future can reach position i < t, on every path and every draw of the
    weights (DRAWS): the Jacobian of the outputs before each position with respect to the token
    embeddings after it must be exactly zero; changing token t must leave the outputs before t as
    they were; and appending tokens t..T-1 to the prefix x[:t] must leave its outputs as they were
    (the outputs of the prefix alone equal the first t outputs of the whole window), which catches
    a dependence on the window's length as well as on any later token. Each path reports the first
    draw it fails on."""
    x = _tokens()
    t = T // 2
    y = x.clone()
    y[:, t] = (y[:, t] + 1) % VOCAB
    leaks, unread = [], []
    found = causal_paths(build(name, params))
    for label, backend in found:
        for draw, noise, scale in DRAWS:
            model = _drawn(build(name, params), noise, scale)
            with torch.no_grad():
                a, b = _run(model, backend, x), _run(model, backend, y)
                prefix = _run(model, backend, x[:, :t])
            if not torch.isfinite(a).all():
                first = int((~torch.isfinite(a)).any(dim=(0, 2)).nonzero()[0])
                if draw == DRAWS[0][0]:
                    leaks.append(f"{label}: non-finite outputs from position {first}, so nothing can be compared")
                    break
                unread.append(f"{label} {draw}")  # outside what the scheme's outputs survive: no reading
                continue
            found_here = []
            leak = jacobian_leak(model, x[:1], backend)
            if leak not in (None, "non-finite"):
                found_here.append(leak)
            noise_floor = ATOL * max(1.0, float(a.abs().max()))  # float noise grows with the outputs
            changed = _first_apart(a[:, :t], b[:, :t], noise_floor)
            if changed is not None:
                found_here.append(f"position {changed} changed when token {t} did")
            grown = _first_apart(a[:, :t], prefix, noise_floor)
            if grown is not None:
                found_here.append(f"position {grown} changed when tokens {t}..{T - 1} were appended to the first {t} "
                                  "(the outputs read the window's length or a later token)")
            if found_here:
                leaks.append(f"{label}, weights {draw}: " + "; ".join(found_here))
                break
    if leaks:
        return Finding("causality", "fail", "; ".join(leaks))
    said = "; outputs non-finite, not read: " + ", ".join(unread) if unread else ""
    return Finding("causality", "pass", f"paths {', '.join(label for label, _ in found)}; weights "
                                        f"{', '.join(d for d, _, _ in DRAWS)}: no output reads a later token "
                                        f"embedding (a zero Jacobian), and a prefix of {t} gives the window's "
                                        f"first {t} outputs{said}")


def translation(name, params) -> Finding:
    shift = 2 * T + 5  # past the training length: a scheme that scales there shows it
    model = build(name, params)
    if model.layout.position_limit() is not None:  # a table long enough for the shifted positions
        model = build(name, params, train_len=4 * T)
    if not model.layout.takes_positions:
        return Finding("translation", "skip", "the scheme takes no integer positions")
    claims = layout.relative(layout.parse(name))
    x, pos = _tokens(), torch.arange(T)
    with torch.no_grad():
        a, b = model(x, pos), model(x, pos + shift)
    equal = torch.allclose(a, b, atol=SHIFT_ATOL)
    gap = f"max difference {float((a - b).abs().max()):.2g} under a shift of {shift}"
    if claims and not equal:
        return Finding("translation", "fail", f"claims relative = True, but {gap}")
    if not claims and equal:
        return Finding("translation", "warn", f"behaves relatively ({gap}) without claiming relative = True")
    return Finding("translation", "pass", ("relative, " if claims else "absolute, ") + gap)


def past_training_length(name, params) -> Finding:
    found = _past_training_length(name, params)
    undeclared = sorted(s.name for s in build(name, params).layout.schemes
                        if catalogue.extrapolates(type(s)) == "unknown")
    if not undeclared:
        return found
    said = (f"{', '.join(undeclared)} declare{'s' if len(undeclared) == 1 else ''} no `extrapolates` (listed as "
            "unknown); found: ")
    return dataclasses.replace(found, detail=said + found.detail)


def _past_training_length(name, params) -> Finding:
    from posbench.sweep import failure

    model = build(name, params)
    n = EXTRAPOLATION * T
    limit = model.layout.position_limit()
    try:
        with torch.no_grad():
            out = model(_tokens(1, n))
    except PositionLimitError as e:
        if limit is not None and limit < n:
            return Finding("past training length", "pass", f"refuses past its limit of {limit}: {e}")
        return Finding("past training length", "fail", f"PositionLimitError below its declared limit {limit}: {e}")
    except Exception as e:
        reason = failure(e, n)
        if reason is None:
            raise
        return Finding("past training length", "fail", f"fails {reason}")
    if limit is not None and limit < n:
        return Finding("past training length", "fail", f"declares a limit of {limit} but ran at {n} positions")
    bad = ~torch.isfinite(out)
    if bad.any():
        first = int(bad.any(dim=(0, 2)).nonzero()[0])
        return Finding("past training length", "fail", f"non-finite outputs at {n} positions, first at position {first}")
    return Finding("past training length", "pass", f"finite at {n} positions ({EXTRAPOLATION}x)")


def paths_agree(name, params) -> Finding:
    model = build(name, params)
    found = paths(model)
    if len(found) == 1:
        return Finding("paths agree", "skip", "one path: explicit")
    x = _tokens()
    with torch.no_grad():
        ref = _forced(model, "explicit")(x)
        gap = float((_forced(model, None)(x) - ref).abs().max())
    return Finding("paths agree", "fail" if gap > ATOL else "pass", f"{found[0][0]} vs explicit {gap:.1e}")


def batch_independence(name, params) -> Finding:
    model = build(name, params)
    x = _tokens(3)
    with torch.no_grad():
        together, alone = model(x)[1], model(x[1:2])[0]
    gap = float((together - alone).abs().max())
    return Finding("batch independence", "pass" if gap <= ATOL else "fail", f"max difference {gap:.1e}")


def determinism(name, params) -> Finding:
    a, b = build(name, params, seed=3), build(name, params, seed=3)
    x = _tokens()
    same_weights = all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values()))
    with torch.no_grad():
        same_out = torch.equal(a(x), b(x)) and torch.equal(a(x), a(x))
    ok = same_weights and same_out
    return Finding("determinism", "pass" if ok else "fail",
                   "same seed, same bits" if ok else f"weights equal: {same_weights}, outputs equal: {same_out}")


def save_load(name, params) -> Finding:
    model = build(name, params, seed=4)
    x = _tokens()
    limit = model.layout.position_limit()
    with torch.no_grad():
        model(_tokens(1, min(2 * T, limit or 2 * T)))  # grow any table first, as a run does before it saves
        before = model(x)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    fresh = build(name, params, seed=5)
    try:
        fresh.load_state_dict(load(save(state)))
    except RuntimeError as e:
        return Finding("save/load", "fail", str(e).splitlines()[0])
    with torch.no_grad():
        after = fresh(x)
    ok = torch.equal(before, after)
    return Finding("save/load", "pass" if ok else "fail",
                   "safetensors round trip, same outputs" if ok else "outputs differ after loading")


def gradients(name, params) -> Finding:
    """Every learned parameter of the scheme gets a gradient within two steps (one step may not
    reach a parameter behind a zero-initialized one)."""
    model = build(name, params).train()
    named = [(n, p) for n, p in model.layout.named_parameters() if p.requires_grad]
    if not named:
        return Finding("gradients", "skip", "no learned parameters")
    x = _tokens()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    reached: set[str] = set()
    for _ in range(2):
        opt.zero_grad()
        loss = model(x, targets=torch.roll(x, -1, 1)).mean()
        loss.backward()
        if not torch.isfinite(loss):
            return Finding("gradients", "fail", "non-finite loss")
        reached |= {n for n, p in named if p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum()}
        opt.step()
    dead = [n for n, _ in named if n not in reached]
    if dead:
        return Finding("gradients", "fail", f"no gradient reaches {', '.join(dead)}")
    return Finding("gradients", "pass", f"{len(named)} parameter tensors get gradients")


def bfloat16(name, params) -> Finding:
    model = build(name, params)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(_tokens())
    ok = bool(torch.isfinite(out).all())
    return Finding("bfloat16", "pass" if ok else "fail", "finite under bfloat16 autocast" if ok else "non-finite outputs")


def compiled_graph(name, params) -> Finding:
    import torch._dynamo

    model = build(name, params).train()
    x = _tokens(2, T)
    model.reserve_positions(T, T)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model)(x, None, torch.roll(x, -1, 1))
    torch._dynamo.reset()
    if explained.graph_count == 1 and explained.graph_break_count == 0:
        return Finding("compiled graph", "pass", "one graph, no break")
    reasons = "; ".join(dict.fromkeys(str(b.reason).splitlines()[0] for b in explained.break_reasons))
    return Finding("compiled graph", "warn", f"{explained.graph_count} graphs: {reasons[:300]}")


@contextlib.contextmanager
def checked_flex(checked: list):
    """FlexAttention on this device (a CPU too) as CUDA trains it, up to the kernel: compiled with
    a backend that runs the dense reference and, before handing back each backward graph, applies
    to its FlexAttention joint graphs the check CUDA's compiler makes before generating a kernel
    (torch._inductor's validate_joint_graph). Each graph checked is appended to `checked`."""
    import torch.nn.attention.flex_attention as flex_module
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    from torch._inductor.kernel.flex.flex_attention import validate_joint_graph

    def backward(gm, example_inputs):
        for node in gm.graph.nodes:
            if node.op == "call_function" and "flex_attention_backward" in str(node.target):
                for arg in node.args:
                    if isinstance(arg, torch.fx.Node) and arg.op == "get_attr":
                        validate_joint_graph(getattr(gm, arg.target).graph)
                        checked.append(arg.target)
        return make_boxed_func(gm)

    backend = aot_autograd(fw_compiler=lambda gm, _: make_boxed_func(gm), bw_compiler=backward)
    saved = flex_module._validate_device, attention._compiled_flex
    flex_module._validate_device = lambda *args: None  # a CPU refuses the backward before tracing
    attention._compiled_flex = lambda: torch.compile(attention._flex(), backend=backend, dynamic=False)
    torch._dynamo.reset()
    try:
        yield
    finally:
        flex_module._validate_device, attention._compiled_flex = saved
        torch._dynamo.reset()


def flex_backward(name, params) -> Finding:
    model = build(name, params).train()
    if "flex" not in {model.layout.backend(i, "cuda") for i in range(len(model.blocks))}:
        return Finding("flex backward", "skip", "no layer takes FlexAttention on CUDA")
    if not attention.flex_available():
        return Finding("flex backward", "skip", "no FlexAttention in this torch")
    reference = copy.deepcopy(model)
    model.backend, reference.backend = "flex", "explicit"
    x = _tokens(2, T)
    checked: list = []
    try:
        with checked_flex(checked), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model(x, targets=x).mean().backward()
    except NotImplementedError as e:
        return Finding("flex backward", "fail", first_line(e))
    reference(x, targets=x).mean().backward()
    gap = max((float((a.grad - b.grad).abs().max()) for a, b in zip(model.parameters(), reference.parameters())
               if a.grad is not None and b.grad is not None), default=0.0)
    lost = [n for (n, a), b in zip(model.named_parameters(), reference.parameters())
            if (a.grad is None) != (b.grad is None)]
    if lost or gap > 1e-4:
        return Finding("flex backward", "fail", f"gradients differ from the explicit path: {lost or f'{gap:.1e}'}")
    return Finding("flex backward", "pass", f"{len(checked)} backward graphs pass CUDA's check; gradients {gap:.1e}")


def cost(name, params, repeats: int = 5) -> Finding:
    """Forward+backward seconds at each length, the medians as ratios to none and rope, measured
    interleaved in this run."""
    def step_time(model, t):
        x = _tokens(2, t)
        times = []
        for _ in range(repeats + 1):
            model.zero_grad(set_to_none=True)
            began = time.perf_counter()
            model(x, targets=x).mean().backward()
            times.append(time.perf_counter() - began)
        return statistics.median(times[1:])

    def small(n, train_len=COST_LENGTHS[0]):
        return build(n, params if n == name else None, d_model=64, n_heads=4, n_layers=2, train_len=train_len).train()

    models = {n: small(n) for n in dict.fromkeys([name, "none", "rope"])}
    lengths, inside = cost_lengths(models[name].layout.position_limit())
    if inside:  # a finite table: one as long as the longer length, if the scheme sizes it by the training length
        models[name] = small(name, COST_LENGTHS[-1])
        lengths, inside = cost_lengths(models[name].layout.position_limit())
    if not lengths:
        return Finding("cost", "skip", inside)
    ratios = []
    for t in lengths:
        times = {n: step_time(m, t) for n, m in models.items()}
        ratios.append((t, times[name] / times["none"], times[name] / times["rope"]))
    text = "; ".join(f"{t} tokens: {a:.2f}x none, {b:.2f}x rope" for t, a, b in ratios)
    return Finding("cost", "warn" if ratios[-1][2] > 10 else "pass", text + (f" ({inside})" if inside else ""))


def cost_lengths(limit: int | None) -> tuple[tuple[int, ...], str]:
    """The lengths to time a scheme at, and what a finite table changed: COST_LENGTHS where its
    positions reach; inside a shorter table, its last position and a quarter of it; none (and
    the reason) for a table under 32 positions."""
    if limit is None or limit >= COST_LENGTHS[-1]:
        return COST_LENGTHS, ""
    if limit < 32:
        return (), f"its table holds {limit} positions, too few to time"
    lengths = tuple(n for n in COST_LENGTHS if n <= limit) or (limit // 4, limit)
    return lengths, f"inside its table of {limit} positions"


CHECKS: dict[str, Callable[[str, dict], Finding]] = {
    "causality": causality, "translation": translation, "past training length": past_training_length,
    "paths agree": paths_agree, "batch independence": batch_independence, "determinism": determinism,
    "save/load": save_load, "gradients": gradients, "bfloat16": bfloat16, "compiled graph": compiled_graph,
    "flex backward": flex_backward, "cost": cost,
}


def check(name: str, params: dict[str, Any] | None = None, skip: tuple[str, ...] = ()) -> list[Finding]:
    """Every property of `name` but those in `skip`. A property that raises is a fail naming the
    error: a check must never stop at the first broken scheme."""
    unknown = set(skip) - set(CHECKS)
    if unknown:
        raise PosbenchError(f"unknown properties to skip: {', '.join(sorted(unknown))} (of {', '.join(CHECKS)})")
    build(name, params)  # an unknown scheme or a bad parameter: one line before anything runs
    out = []
    for prop, fn in CHECKS.items():
        if prop in skip:
            continue
        try:
            out.append(fn(name, params))
        except Exception as e:  # the scheme's own code failed: that is the finding, a plug-in's by file and line
            last = str(e).strip().splitlines()[-1] if str(e).strip() else ""
            out.append(Finding(prop, "fail", (plugins.blame(e) or f"{type(e).__name__}: {last}")[:300]))
    return out
