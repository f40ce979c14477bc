"""The attention paths, chosen from a scheme's hooks and a layer's span (posbench/docs/model.md):

- ``sdpa-causal``: input/qk/mixer schemes over full causal attention:
  F.scaled_dot_product_attention(is_causal=True), flash on a GPU.
- ``flex``: content-independent biases, per-token gates, a window or chunk span, or a learned sink
  (posbench.modifiers), on CUDA:
  FlexAttention with the scheme's ``bias_fn`` (and a gate's c_i - c_j) as score_mod and a
  BlockMask built from the span's ``mask_mod``, so a windowed or chunked layer skips every block
  outside its span (compiled once; recompiled per length, dtype and scheme).
- ``sdpa-bias``: content-independent biases elsewhere: SDPA with an (H, T, T) float mask (the bias,
  -inf outside the span), built once per forward and shared by the layers; per-token gates: a
  (B, H, T, T) float mask c_i - c_j built per layer, since each layer has its own gates.
- ``sdpa-mask``: a window or chunk span without a bias elsewhere: SDPA with a (T, T) bool mask.
  It computes every score and discards those outside the span: the cost of full attention.
- ``fla``: stick-breaking, FoX and PaTH on CUDA where flash-linear-attention is installed (the
  `fla` extra), over full causal attention without a sink: its Triton kernels (posbench.fla_path).
- ``explicit``: content-dependent terms (logits/values hooks) and weights other than softmax (the
  weights hook): the scores materialized, then softmax or the scheme's weights. It is also the
  reference every other path is tested against.

A learned sink (one more softmax column per head) is the extra column itself on the explicit
path, out * sigmoid(lse - sink) from FlexAttention's log-sum-exp on the flex path, and on the SDPA
paths one zero key and value whose mask entry is the sink (a float mask, so a full-span sink
layer takes sdpa-mask, not sdpa-causal, off CUDA).

Contexts are built once per forward for each distinct (scheme, span, path) and shared by its layers.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from posbench import fla_path

BACKENDS = ("sdpa-causal", "sdpa-mask", "sdpa-bias", "flex", "explicit", "fla")


@dataclass(frozen=True)
class Span:
    """Which keys a query sees, by token index i (query) and j (key) inside the window: full
    causal (j <= i), a sliding window of `size` (i - size < j <= i) or chunks of `size`
    (floor(i / size) == floor(j / size) and j <= i). Indices, not positions: a span bounds how
    many keys a layer reads, whatever positions the scheme is given."""

    kind: str = "full"
    size: int = 0

    def allowed(self, i, j):
        """Elementwise on broadcastable index tensors: True where query i may see key j. The
        same function is FlexAttention's mask_mod and builds the SDPA and explicit masks."""
        causal = i >= j
        if self.kind == "window":
            return causal & (i - j < self.size)
        if self.kind == "chunk":
            return causal & (i // self.size == j // self.size)
        return causal

    def visible(self, t: int, device) -> torch.Tensor:
        """(T,) the number of keys each query index sees."""
        i = torch.arange(t, device=device)
        if self.kind == "window":
            return (i + 1).clamp(max=self.size)
        if self.kind == "chunk":
            return i % self.size + 1
        return i + 1

    def mask(self, t: int, device) -> torch.Tensor:
        """(T, T) bool, True where allowed."""
        i = torch.arange(t, device=device)
        return self.allowed(i[:, None], i[None, :])


FULL = Span()

# Who sees each explicit layer's weights (posbench.attention_measures); None: nobody. A plain
# global, not a ContextVar: a compiled forward reads it as a guarded constant, without a break.
_observer = None


@contextlib.contextmanager
def observe(fn):
    """Within the block, every explicit-path layer calls fn(layer, attn) with its weights
    attn (B, H, T, T) over the window's keys (a learned sink's column left out); force the
    explicit path (model.backend = "explicit") for every layer to see them all."""
    global _observer
    before, _observer = _observer, fn
    try:
        yield
    finally:
        _observer = before


def flex_available() -> bool:
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


FLEX_MIN_HEAD_DIM = 16  # the CUDA kernel's matmul tiles; smaller heads raise "NYI"


def flex_supports(scheme) -> bool:
    """What FlexAttention (torch <= 2.13) can run; the rest keeps the float mask: head dims below
    16, and a learnable 0-dim tensor captured by score_mod (meta-pytorch/attention-gym#171: eager
    backward, compiled forward and backward fail; a (1,)-shaped parameter read as p[0] works)."""
    if scheme.head_dim < FLEX_MIN_HEAD_DIM:
        return False
    return not any(p.dim() == 0 and p.requires_grad for p in scheme.parameters())


def choose_backend(scheme, device: torch.device | str, span: Span = FULL, sink: bool = False) -> str:
    """The path of a layer with this scheme and span (and a learned sink or not)."""
    hooks = set(scheme.hooks)
    if (fla_path.supports(scheme) and span == FULL and not sink and torch.device(device).type == "cuda"
            and fla_path.available()):
        return fla_path.BACKEND
    if hooks & {"logits", "values", "weights"}:
        return "explicit"
    biased = bool(hooks & {"bias", "gate"})
    if biased or span != FULL or sink:
        on_cuda = torch.device(device).type == "cuda"
        if on_cuda and flex_available() and flex_supports(scheme):
            return "flex"
        return "sdpa-bias" if biased else "sdpa-mask"
    return "sdpa-causal"


@dataclass
class AttnContext:
    """What every layer of one forward shares: computed once, before the first block."""

    pos: torch.Tensor  # (T,)
    backend: str
    # No default: torch 2.11's compiler cannot take a Span from the __init__ defaults (a graph
    # break in every compiled forward).
    span: Span
    shared: Any = None  # scheme.prepare(pos)
    bias: torch.Tensor | None = None  # (H, T, T), the explicit path's materialized bias
    # sdpa-bias: (H, T, T) float32, bias with -inf outside the span (a gate without a bias:
    # (T, T) bool, True inside the span); sdpa-mask: (T, T) bool; explicit: (T, T) bool, True
    # outside the span
    mask: torch.Tensor | None = None
    score_mod: Any = None
    block_mask: Any = None
    _masks: dict = field(default_factory=dict, init=False, repr=False)  # mask per compute dtype

    def sdpa_mask(self, dtype: torch.dtype) -> torch.Tensor:
        """The float mask in `dtype` (SDPA wants the query's), cast once per forward; a bool
        mask as it is."""
        if self.mask.dtype == torch.bool:
            return self.mask
        if dtype not in self._masks:
            self._masks[dtype] = self.mask.to(dtype)
        return self._masks[dtype]


# Each (length, dtype, scheme, grad mode) is its own compiled entry; the default limit of 8
# would send a benchmark over several schemes and lengths back to eager FlexAttention, which
# materializes the full score matrix, without an error.
FLEX_RECOMPILE_LIMIT = 256


def _flex():
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention


@functools.cache
def _compiled_flex():
    import torch._dynamo.config

    dynamo = torch._dynamo.config
    dynamo.recompile_limit = max(dynamo.recompile_limit, FLEX_RECOMPILE_LIMIT)
    dynamo.accumulated_recompile_limit = max(dynamo.accumulated_recompile_limit,
                                             FLEX_RECOMPILE_LIMIT)
    return torch.compile(_flex(), dynamic=False)


@functools.lru_cache(maxsize=16)
def block_mask(span: Span, t: int, device: str):
    """The span's BlockMask: blocks wholly outside it are never computed."""
    from torch.nn.attention.flex_attention import create_block_mask

    def mask_mod(b, h, q_idx, kv_idx):
        return span.allowed(q_idx, kv_idx)

    return create_block_mask(mask_mod, None, None, t, t, device=device)


def prepare(scheme, pos: torch.Tensor, backend: str, span: Span = FULL,
            shared: Any = None) -> AttnContext:
    """The context of the layers with this scheme and span; `shared`: scheme.prepare(pos) when
    the caller already has it (a scheme used with several spans prepares once)."""
    shared = scheme.prepare(pos) if shared is None else shared
    ctx = AttnContext(pos=pos, backend=backend, shared=shared, span=span)
    t = pos.shape[0]
    if backend == "flex":
        if "bias" in scheme.hooks:
            fn = scheme.flex_bias(pos)

            def score_mod(score, b, h, q_idx, kv_idx):
                return score + fn(h, pos[q_idx], pos[kv_idx])

            ctx.score_mod = score_mod
        ctx.block_mask = block_mask(span, t, str(pos.device))
    elif backend == "sdpa-bias" and "bias" in scheme.hooks:
        # only the mask is kept: at long lengths (H, T, T) is large
        bias = scheme.bias(pos, ctx.shared).float()
        ctx.mask = bias.masked_fill(~span.mask(t, pos.device), float("-inf"))
    elif backend in ("sdpa-bias", "sdpa-mask"):
        ctx.mask = span.mask(t, pos.device)
    elif backend == "explicit":
        ctx.mask = ~span.mask(t, pos.device)
        if "bias" in scheme.hooks:
            ctx.bias = scheme.bias(pos, ctx.shared)
    return ctx


def gate_bias(c: torch.Tensor) -> torch.Tensor:
    """A per-token gate's logit term: c (B, H, T) -> c_i - c_j, (B, H, T, T)."""
    return c[..., :, None] - c[..., None, :]


def gated_score_mod(c: torch.Tensor, inner):
    """FlexAttention's score_mod for a gate c (B, H, T), after `inner` (the bias's, or None). A
    new closure each layer and forward: the compiled kernel takes c as an input, not a constant.
    The keys read a copy of c: CUDA's compiled backward refuses a tensor that needs gradients
    indexed twice in one score_mod (Scheme.flex_bias_fn)."""
    c_key = c.clone()

    def score_mod(score, b, h, q_idx, kv_idx):
        if inner is not None:
            score = inner(score, b, h, q_idx, kv_idx)
        return score + (c[b, h, q_idx] - c_key[b, h, kv_idx])

    return score_mod


def attend(q, k, v, scheme, ctx: AttnContext, layer: int,
           gate: torch.Tensor | None = None, content: Any = None,
           sink: torch.Tensor | None = None) -> torch.Tensor:
    """q, k, v (B, H, T, D) -> (B, H, T, D), over the context's span; `gate`: this layer's
    per-token gate c (B, H, T) float32 (the gate hook), added to the logits as c_i - c_j;
    `content`: what this layer's content hook read of its input, for the logits hook; `sink`:
    this layer's learned sink logits (H,), one more softmax column with a zero value."""
    backend = ctx.backend
    scale = scheme.qk_scale
    if backend == "sdpa-causal" and sink is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    if backend in ("sdpa-causal", "sdpa-bias", "sdpa-mask"):
        # (H, T, T) float or (T, T) bool; a forced sdpa-causal with a sink builds its mask
        mask = ctx.sdpa_mask(q.dtype) if ctx.mask is not None else ctx.span.mask(q.shape[-2], q.device)
        if gate is not None:
            bias = gate_bias(gate)
            bias = bias.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else bias + mask
            mask = bias.to(q.dtype)
        if sink is not None:
            mask = sink_column(mask, sink, q.dtype)
            k, v = F.pad(k, (0, 0, 0, 1)), F.pad(v, (0, 0, 0, 1))  # the sink's zero key and value
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    if backend == "flex":
        score_mod = ctx.score_mod if gate is None else gated_score_mod(gate, ctx.score_mod)
        # Inside a compiled model (training) FlexAttention compiles with the graph around it;
        # a nested torch.compile would set compiler config from inside the trace (a graph break
        # in torch 2.15) and trace the cache wrapper of _compiled_flex anew.
        flex = _flex() if torch.compiler.is_compiling() else _compiled_flex()
        if sink is None:
            return flex(q, k, v, score_mod=score_mod, block_mask=ctx.block_mask, scale=scale)
        return with_sink(*flex_with_lse(flex, q, k, v, score_mod, ctx.block_mask, scale), sink)
    if backend == fla_path.BACKEND:
        return fla_path.attend(q, k, v, scheme, gate, content)
    return explicit_attention(q, k, v, scheme, ctx, layer, gate, content, sink)


def flex_with_lse(flex, q, k, v, score_mod, block_mask, scale) -> tuple[torch.Tensor, torch.Tensor]:
    """FlexAttention's output and each row's log-sum-exp (B, H, T): torch >= 2.9 asks for it with
    `return_aux` (`return_lse` is deprecated there), torch 2.5-2.8 with `return_lse`."""
    try:
        from torch.nn.attention.flex_attention import AuxRequest
    except ImportError:
        return flex(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale, return_lse=True)
    out, aux = flex(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale,
                    return_aux=AuxRequest(lse=True))
    return out, aux.lse


def sink_column(mask: torch.Tensor, sink: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """An SDPA mask with the sink as one more key: mask (T, T) bool or (..., T, T) float, sink
    (H,) -> (..., H, T, T + 1) float, the last column the sink's logit."""
    if mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, float("-inf"))
    if mask.dim() == 2:
        mask = mask.expand(sink.shape[0], *mask.shape)  # (H, T, T)
    column = sink.to(dtype)[:, None, None].expand(*mask.shape[:-1], 1)
    return torch.cat([mask, column], dim=-1)


def with_sink(out: torch.Tensor, lse: torch.Tensor, sink: torch.Tensor) -> torch.Tensor:
    """The output with the sink column, from the output without it, out (B, H, T, D), and the
    log-sum-exp of each row's logits, lse (B, H, T): the weights shrink by
    sum / (sum + exp(sink)) = sigmoid(lse - sink)."""
    return out * torch.sigmoid(lse.float() - sink.float()[:, None])[..., None].to(out.dtype)


def explicit_attention(q, k, v, scheme, ctx: AttnContext, layer: int,
                       gate: torch.Tensor | None = None, content: Any = None,
                       sink: torch.Tensor | None = None) -> torch.Tensor:
    if "logits" in scheme.hooks:
        args = (q, k, ctx.pos, ctx.shared, layer)
        scores = scheme.logits(*args) if content is None else scheme.logits(*args, content)
        # scores: (B, H, T, T)
    else:
        scores = (q @ k.transpose(-1, -2)) * scheme.qk_scale
    if "bias" in scheme.hooks:
        bias = ctx.bias if ctx.bias is not None else scheme.bias(ctx.pos, ctx.shared)
        scores = scores + bias
    scores = scores.float()
    if gate is not None:
        scores = scores + gate_bias(gate)
    own = ctx.backend == "explicit"  # another path's context holds its own kind of mask
    blocked = ctx.mask if own else ~ctx.span.mask(q.shape[-2], q.device)
    scores = scores.masked_fill(blocked, float("-inf"))
    if "weights" in scheme.hooks:
        attn = scheme.weights(scores).to(v.dtype)
    elif sink is not None:
        column = sink.float()[:, None, None].expand(*scores.shape[:-1], 1)
        attn = torch.cat([scores, column], dim=-1).softmax(dim=-1)[..., :-1].to(v.dtype)
    else:
        attn = scores.softmax(dim=-1).to(v.dtype)
    if _observer is not None:
        _observer(layer, attn)
    out = attn @ v
    if "values" in scheme.hooks:
        out = out + scheme.values(attn, ctx.pos, ctx.shared, layer)
    return out

