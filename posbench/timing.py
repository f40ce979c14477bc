"""`posbench speed`: what each scheme's attention costs, forward and forward+backward, at each
length, beside `none` timed in the same run (posbench/docs/gpu.md, Attention cost).

One timed call is the scheme's attention layer on the path `Transformer.forward` takes: the token
embedding (the model's table, or the scheme's own), the scheme's input and mixer hooks,
`check_positions`, the layout's plan (once per forward: RoPE angles, the masks, FlexAttention's
score_mod and BlockMask, temperatures), then one `model.Attention` (qkv projection, qk hook,
temperature, the attention path with any logits/values hooks, output projection). No LayerNorm,
MLP or output head, so the differences between rows are the schemes'.

A preset or layout runs one period of its pattern (rnope-swa: 3 windowed layers and 1 full), one
`model.Attention` per layer, each fed the previous one's output; its median_ms, iqr_ms, tflops
and tokens_per_second are per layer (the period's time over its layers), so its row compares
with a scheme's as the mean cost of one of its layers; peak_mem_mb is the period's. Spans given
no size are a quarter of `train_len` (the shortest length unless given). On CPU a
windowed or chunked layer takes the bool-mask SDPA path (`sdpa-mask`), which computes every score
and masks it: it costs what full attention costs. On CUDA it takes FlexAttention, whose
BlockMask skips the blocks outside the span, so its cost grows linearly with the length.

- Timing: `WARMUP` calls of every scheme first (compilation included; the last one sizes its
  blocks to last at least `MIN_BLOCK_S`), then `repeats` rounds in which every scheme of the
  same length and pass times one block in turn; median_ms and iqr_ms are per call, over the
  blocks. Taking turns block by block puts a slow spell of the machine (another process, the
  allocator returning a previous scheme's memory) on every scheme alike instead of on whichever
  was being timed, so ratio_vs_none stays honest. CUDA: CUDA events around each block. CPU:
  perf_counter around each block, at torch's current thread count.
- `fwd` runs under torch.no_grad(), as evaluation does; `fwd+bwd` runs the forward with autograd,
  then the gradients of every parameter by torch.autograd.grad (none accumulate between calls).
  FLOATER-style schemes whose position table depends on learned weights pay for rebuilding it
  here, which is their real training cost.
- bfloat16 is autocast, as in training.
- compile: as the training forward (`posbench.device.TrainingForward`): `auto` compiles each
  scheme's layer with torch.compile on CUDA (fixed shapes, one graph per length and pass, its
  compilation inside the warm-up) and not on CPU; `on` and `off` force it. A compiled layer first
  reserves its position bound (the longest length), as a compiled training run does, so the graph
  reads the bound instead of max(pos). A layer that fails to compile is timed eager. Every row
  says which in `compile` (on, off, fallback) and the attention path in `backend`.
- tflops: causal attention FLOPs, 2 B H N^2 D forward (half of 4 B H N^2 D; H doubled in a layer
  whose scheme attends with 2H heads, rope-pp ec) and 3.5 times that forward+backward (backward
  about 2.5x), over the measured time. The time includes projections and hooks, so this is a
  lower bound on the kernel's own rate, comparable across schemes.
- peak_mem_mb: the most memory held by tensors allocated during one call, above what was held
  before it (parameters, inputs and cached position tables excluded). CUDA:
  torch.cuda.max_memory_allocated. CPU: the allocator keeps no peak, so one extra, untimed call
  runs under `PeakTracker`, which adds the storage each op creates and subtracts it when freed.
- `learned` and `tupe` have a position table: it is built with max_position = the longest length
  (the reason column says so), so every length runs.
"""

from __future__ import annotations

import dataclasses
import math
import platform
import statistics
import time
import weakref
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from posbench import layout, results
from posbench.config import COMPILE, DTYPES, ModelConfig, check_lengths, parse_int_list, parse_list
from posbench.errors import PosbenchError, did_you_mean
from posbench.model import Attention, reserve_positions
from posbench.schemes import SCHEMES, Dims
from posbench.device import TrainingForward, autocast, resolve_device

PASSES = ("fwd", "fwd+bwd")
BASELINE = "none"
VOCAB = 256
WARMUP = 2
MIN_BLOCK_S = 0.02
BACKWARD_FLOPS = 2.5  # backward / forward, for causal attention


class SchemeLayer(nn.Module):
    """The attention layers of one period of a layout (one layer for a scheme) and everything
    their schemes add, in `Transformer.forward`'s order."""

    def __init__(self, model_layout: layout.ModelLayout, cfg: ModelConfig):
        super().__init__()
        self.layout = model_layout
        self.tok = None if model_layout.owns_token_embedding else nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.attns = nn.ModuleList(Attention(cfg, layer=i, heads=model_layout.heads(i)) for i in range(cfg.n_layers))

    def forward(self, idx: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """idx (B, T), pos (T,) -> (B, T, d)."""
        x = self.layout.embed(self.tok, idx, pos)  # (B, T, d)
        for attn, plan in zip(self.attns, self.layout.plan(pos)):
            x = attn(x, plan)
        return x

    def backend(self, device) -> str:
        return self.layout.backends(device)

    def reserve_positions(self, bound: int, length: int) -> None:
        reserve_positions(self, self.layout.schemes, bound, length)


class PeakTracker(TorchDispatchMode):
    """Bytes held by the tensors allocated inside the mode: each op's new storages are added and
    subtracted again when freed; `peak` is the most held at once."""

    def __init__(self):
        super().__init__()
        self.live = 0
        self.peak = 0
        self._held: dict[int, int] = {}

    def _free(self, key: int) -> None:
        self.live -= self._held.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            key, size = storage.data_ptr(), storage.nbytes()
            if size == 0 or key in self._held:  # views and in-place results hold nothing new
                continue
            self._held[key] = size
            self.live += size
            self.peak = max(self.peak, self.live)
            weakref.finalize(storage, self._free, key)
        return out


def attention_flops(batch: int, heads: int, seq_len: int, head_dim: int, pass_: str) -> float:
    forward = 2.0 * batch * heads * seq_len**2 * head_dim  # causal: half of 4 B H N^2 D
    return forward * (1 + BACKWARD_FLOPS) if pass_ == "fwd+bwd" else forward


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {torch.get_num_threads()} threads"


def _validate(schemes, lengths, batch_size, heads, head_dim, dtype, repeats, train_len, compile):
    if isinstance(schemes, str):  # "none,rope", as typed
        schemes = list(parse_list(schemes, str, "schemes"))
    if isinstance(lengths, str):
        lengths = parse_int_list(lengths)
    names = list(SCHEMES) if schemes is None else [layout.check(name) for name in schemes]
    if not names:
        raise PosbenchError("the scheme list is empty")
    names = [BASELINE] + sorted(set(names) - {BASELINE}, key=names.index)
    try:
        lengths = [int(n) for n in lengths]
    except (TypeError, ValueError):
        raise PosbenchError(f"bad lengths {lengths!r}: expected integers") from None
    check_lengths(lengths)
    for what, value in (("batch size", batch_size), ("heads", heads), ("head dim", head_dim),
                        ("repeats", repeats), ("train length", train_len or 1)):
        if int(value) < 1:
            raise PosbenchError(f"{what} must be >= 1, got {value}")
    if dtype not in DTYPES:
        raise did_you_mean(dtype, DTYPES, "dtype")
    if compile not in COMPILE:
        raise did_you_mean(compile, COMPILE, "compile setting")
    return names, sorted(set(lengths))


def run_speed(
    schemes: Iterable[str] | None = None,
    lengths: Iterable[int] = (256, 512, 1024, 2048),
    batch_size: int = 1,
    heads: int = 8,
    head_dim: int = 64,
    dtype: str = "float32",
    device: str = "auto",
    backward: bool = True,
    repeats: int = 10,
    out_dir: Path | str | None = "runs",
    train_len: int | None = None,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    compile: str = "auto",
) -> list[dict[str, Any]]:
    """Time every scheme (None: the whole registry; `none` always joins) at every length,
    forward and, with `backward`, forward+backward. Returns the rows; with `out_dir`, merges them
    into out_dir/speed.csv and draws this run's rows in out_dir/speed.png. `train_len` (default:
    the shortest length) is what the schemes are told they were trained at; `on_row` sees each
    row as it is measured (its ratio_vs_none comes at the end). `compile` (auto, on, off) as
    training's: auto compiles on CUDA (module docstring)."""
    names, lengths = _validate(schemes, lengths, batch_size, heads, head_dim, dtype, repeats,
                               train_len, compile)
    dev = resolve_device(device)
    passes = PASSES if backward else PASSES[:1]
    cfg = ModelConfig(vocab_size=VOCAB, d_model=heads * head_dim, n_layers=1, n_heads=heads)
    dims = Dims(d_model=cfg.d_model, n_heads=heads, n_layers=1, vocab_size=VOCAB,
                train_len=train_len or lengths[0], max_position=lengths[-1])
    base = {"device": dev.type, "device_name": device_name(dev), "dtype": dtype,
            "batch": batch_size, "heads": heads, "head_dim": head_dim,
            **{k: v for k, v in results.provenance(dev.type, dtype).items()
               if k in results.TABLES["speed"]["columns"]}}

    layers, nets = _build(names, cfg, dims, dev, compile, lengths)
    rows = []
    for n in lengths:
        gen = torch.Generator().manual_seed(n)
        idx = torch.randint(0, VOCAB, (batch_size, n), generator=gen).to(dev)
        pos = torch.arange(n, device=dev)
        grad_out = torch.randn(batch_size, n, cfg.d_model, generator=gen).to(dev)
        for pass_ in passes:
            for net in nets.values():  # a new graph: its compilation may fail, and fall back
                net.proven = net.status != "on"
            calls = {name: _call(net, idx, pos, grad_out, pass_, dtype) for name, net in nets.items()}
            with _cache_room(len(calls)):
                measured = _measure(calls, dev, repeats)
            for name in names:
                row = {**base, "scheme": name, "pass": pass_, "seq_len": n}
                row.update(_measured_row(layers[name], nets.get(name), measured.get(name), dev, dims, pass_,
                                         batch_size, n))
                rows.append(row)
                if on_row is not None:
                    on_row(row)
    _add_ratios(rows)
    if out_dir is not None:
        results.merge_rows(out_dir, "speed", rows)
        plot_speed(rows, Path(out_dir) / "speed.png")
    return rows


def _build(names, cfg: ModelConfig, dims: Dims, dev, compile: str, lengths) -> tuple[dict, dict]:
    """Each scheme's layer (one period of its layout; the exception where it cannot be built at
    these sizes: rows, not a crash) and its forward, compiled or not as training's."""
    layers: dict[str, SchemeLayer | Exception] = {}
    for name in names:
        torch.manual_seed(0)
        depth = len(layout.parse(name).pattern)  # one period
        try:
            built = layout.build(name, dataclasses.replace(dims, n_layers=depth))
            layers[name] = SchemeLayer(built, dataclasses.replace(cfg, n_layers=depth)).to(dev)
        except Exception as e:  # reported in the scheme's rows
            layers[name] = e
    nets: dict[str, TrainingForward] = {}
    for name, layer in layers.items():  # every layer before any call: each one resets dynamo
        if not isinstance(layer, Exception):
            nets[name] = TrainingForward(layer, compile, dev)
            if nets[name].status == "on":
                layer.reserve_positions(lengths[-1], lengths[0])
    return layers, nets


def _measured_row(layer, net, measured, dev, dims: Dims, pass_: str, batch_size: int, n: int) -> dict[str, Any]:
    """A speed row's measured columns for one scheme at one length and pass: its path, compile
    state and time per layer, with throughput when it ran, or why it did not."""
    if isinstance(layer, Exception):
        return {"backend": "", "compile": "", **_failure(layer)}
    row = {"backend": layer.backend(dev), "compile": net.status, **_per_layer(measured, len(layer.attns))}
    if row["status"] == "ok":
        row["reason"] = _note(layer.layout, dims)
        seconds = row["median_ms"] / 1e3
        # a layer with the heads hook (rope-pp ec) attends with m H heads: the period's mean
        heads = dims.n_heads * sum(map(layer.layout.heads, range(len(layer.attns)))) / len(layer.attns)
        row["tflops"] = attention_flops(batch_size, heads, n, dims.d_model // dims.n_heads, pass_) / seconds / 1e12
        row["tokens_per_second"] = batch_size * n / seconds
    return row


def _per_layer(measured: dict[str, Any], layers: int) -> dict[str, Any]:
    """A period's times over its layers (module docstring)."""
    if measured.get("status") != "ok":
        return measured
    return {**measured, "median_ms": measured["median_ms"] / layers,
            "iqr_ms": measured["iqr_ms"] / layers}


def _note(model_layout: layout.ModelLayout, dims: Dims) -> str:
    if model_layout.position_limit() is None:
        return ""
    return f"position table built with max_position={dims.max_position} (the longest length)"


def _failure(e: BaseException) -> dict[str, str]:
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    if isinstance(e, torch.OutOfMemoryError) or "out of memory" in text.lower() \
            or "can't allocate memory" in text.lower():
        return {"status": "oom", "reason": text}
    if isinstance(e, PosbenchError):  # the scheme declines: e.g. a position past its table
        return {"status": "unsupported", "reason": text}
    return {"status": "failed", "reason": f"{type(e).__name__}: {text}"}


def _cache_room(graphs: int):
    """Room in dynamo's cache for one compiled graph of every scheme at one length and pass: the
    layers share `SchemeLayer.forward`, whose entries would otherwise stop at torch's limit of 8
    and leave the later schemes eager. Earlier lengths' entries are never called again."""
    import torch._dynamo

    limit = max(torch._dynamo.config.cache_size_limit, 2 * graphs + 8)
    return torch._dynamo.config.patch(cache_size_limit=limit, accumulated_cache_size_limit=max(
        torch._dynamo.config.accumulated_cache_size_limit, 64 * limit))


def _call(net: TrainingForward, idx, pos, grad_out, pass_, dtype) -> Callable[[], Any]:
    """One timed call of the layer through `net` (compiled or eager); the first call that compiles
    falls back to eager if the compiler fails, as in training."""
    dev = idx.device
    params = [p for p in net.net.parameters() if p.requires_grad]
    grad_out = grad_out.to(torch.bfloat16 if dtype == "bfloat16" else torch.float32)  # as y

    def fwd():
        with torch.no_grad(), autocast(dev, dtype):
            return net(idx, pos)

    def fwd_bwd():
        with autocast(dev, dtype):
            y = net(idx, pos)  # (B, T, d)
        return torch.autograd.grad(y, params, grad_out.to(y.dtype), allow_unused=True)

    step = fwd if pass_ == "fwd" else fwd_bwd
    return lambda: net.first_step(step)


def _measure(calls: dict[str, Callable[[], Any]], dev: torch.device,
             repeats: int) -> dict[str, dict[str, Any]]:
    """Per scheme: status, median_ms, iqr_ms, peak_mem_mb; or status and reason if its call
    fails (out of memory, a position past a table). The schemes take turns, one block each per
    round (module docstring)."""
    number: dict[str, int] = {}
    times: dict[str, list[float]] = {}
    out: dict[str, dict[str, Any]] = {}

    def failed(name: str, e: Exception) -> None:
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        out[name] = _failure(e)
        number.pop(name, None)

    for name, call in calls.items():
        try:
            number[name] = _warm_up(call, dev)
            times[name] = []
        except Exception as e:
            failed(name, e)
    for _ in range(repeats):
        for name in list(number):
            try:
                times[name].append(_block(calls[name], dev, number[name]))
            except Exception as e:
                failed(name, e)
    for name in list(number):
        try:
            peak = _peak_bytes(calls[name], dev)
        except Exception as e:
            failed(name, e)
            continue
        ts = times[name]
        q1, _, q3 = statistics.quantiles(ts, n=4) if len(ts) > 1 else (ts[0],) * 3
        out[name] = {"status": "ok", "median_ms": statistics.median(ts) * 1e3,
                     "iqr_ms": (q3 - q1) * 1e3, "peak_mem_mb": peak / 2**20}
    return out


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _warm_up(call: Callable[[], Any], dev: torch.device) -> int:
    """Run `WARMUP` calls; return how many calls make a block of at least `MIN_BLOCK_S`, sized
    on the last one."""
    for _ in range(WARMUP - 1):
        call()
    _sync(dev)
    began = time.perf_counter()
    call()
    _sync(dev)
    once = max(time.perf_counter() - began, 1e-9)
    return max(1, math.ceil(MIN_BLOCK_S / once))


def _block(call: Callable[[], Any], dev: torch.device, number: int) -> float:
    """Seconds per call over one block of `number` calls."""
    if dev.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(number):
            call()
        end.record()
        torch.cuda.synchronize(dev)
        return start.elapsed_time(end) / 1e3 / number
    began = time.perf_counter()
    for _ in range(number):
        call()
    return (time.perf_counter() - began) / number


def _peak_bytes(call: Callable[[], Any], dev: torch.device) -> int:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        before = torch.cuda.memory_allocated(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        call()
        torch.cuda.synchronize(dev)
        return torch.cuda.max_memory_allocated(dev) - before
    with PeakTracker() as tracker:
        call()
    return tracker.peak


def _add_ratios(rows: list[dict[str, Any]]) -> None:
    """ratio_vs_none: median / the median of `none` at the same pass and length (same run, so
    the same device, dtype and sizes)."""
    baseline = {(r["pass"], r["seq_len"]): r["median_ms"] for r in rows
                if r["scheme"] == BASELINE and r["status"] == "ok"}
    for r in rows:
        ref = baseline.get((r["pass"], r["seq_len"]))
        if r["status"] == "ok" and ref:
            r["ratio_vs_none"] = r["median_ms"] / ref


def _by_pass(rows):
    out: dict[str, dict[str, dict[int, dict]]] = {}
    for r in rows:
        out.setdefault(r["pass"], {}).setdefault(r["scheme"], {})[int(r["seq_len"])] = r
    return out


def speed_tables(rows: list[dict[str, Any]]) -> list:
    """One rich table per pass: schemes x lengths, median ms and the ratio to `none`."""
    from rich.table import Table

    tables = []
    for pass_, by_scheme in _by_pass(rows).items():
        first = next(iter(next(iter(by_scheme.values())).values()))
        lengths = sorted({n for cells in by_scheme.values() for n in cells})
        table = Table(title=f"{pass_}: median ms (ratio to none), {first['device']} "
                            f"{first['dtype']}, batch {first['batch']}, {first['heads']} heads x "
                            f"{first['head_dim']}")
        table.add_column("scheme")
        table.add_column("backend")
        table.add_column("compile")
        for n in lengths:
            table.add_column(str(n), justify="right")
        for scheme, cells in by_scheme.items():
            first = next(iter(cells.values()))
            table.add_row(scheme, first["backend"], first.get("compile", ""),
                          *(_cell(cells.get(n)) for n in lengths))
        tables.append(table)
    return tables


def _cell(row) -> str:
    if row is None:
        return ""
    if row["status"] != "ok":
        return row["status"]
    ratio = row.get("ratio_vs_none")
    return f"{row['median_ms']:.3g} ({ratio:.2f}x)" if ratio else f"{row['median_ms']:.3g}"


def print_speed(rows: list[dict[str, Any]], console=None) -> None:
    from rich.console import Console

    console = console or Console()
    for table in speed_tables(rows):
        console.print(table)


def plot_speed(rows: list[dict[str, Any]], path: Path | str) -> Path:
    """Time against length per scheme, log-log, one panel per pass."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    by_pass = _by_pass(rows)
    fig, axes = plt.subplots(1, len(by_pass), figsize=(6.5 * len(by_pass), 5), squeeze=False)
    styles = ["-", "--", ":", "-."]
    colors = plt.get_cmap("tab20").colors
    for ax, (pass_, by_scheme) in zip(axes[0], by_pass.items()):
        for i, (scheme, cells) in enumerate(by_scheme.items()):
            ok = sorted((n, r["median_ms"]) for n, r in cells.items() if r["status"] == "ok")
            if not ok:
                continue
            xs, ys = zip(*ok)
            baseline = scheme == BASELINE
            ax.plot(xs, ys, marker="o", markersize=3, label=scheme,
                    color="black" if baseline else colors[i % len(colors)],
                    linestyle="-" if baseline else styles[(i // len(colors)) % len(styles)],
                    linewidth=2.2 if baseline else 1.2)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        lengths = sorted({n for cells in by_scheme.values() for n in cells})
        ax.set_xticks(lengths, [str(n) for n in lengths])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.set_xlabel("sequence length")
        ax.set_ylabel("median ms per call")
        ax.set_title(pass_)
        ax.grid(True, which="both", alpha=0.3)
    first = rows[0]
    fig.suptitle(f"attention layer time, {first['device']} {first['dtype']}, batch {first['batch']}, "
                 f"{first['heads']} heads x {first['head_dim']}")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center right", fontsize=8)
    fig.tight_layout(rect=(0, 0, 0.86, 1))
    return results.save_figure(fig, path, 120)
