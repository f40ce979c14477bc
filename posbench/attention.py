"""The attention paths, chosen from a scheme's hooks (DESIGN.md, Model):

- ``sdpa-causal``: input/qk/mixer schemes: F.scaled_dot_product_attention(is_causal=True), flash on
  a GPU.
- ``flex``: content-independent biases on CUDA: FlexAttention with the scheme's ``bias_fn`` as
  score_mod and a causal BlockMask (compiled once; recompiled per length, dtype and scheme).
- ``sdpa-bias``: content-independent biases elsewhere: SDPA with an (H, T, T) float mask, built
  once per forward and shared by the layers.
- ``explicit``: content-dependent terms (logits/values hooks): the scores materialized, then
  softmax. It is also the reference every other path is tested against.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

BACKENDS = ("sdpa-causal", "sdpa-bias", "flex", "explicit")


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


def choose_backend(scheme, device: torch.device | str) -> str:
    hooks = set(scheme.hooks)
    if hooks & {"logits", "values"}:
        return "explicit"
    if "bias" in hooks:
        on_cuda = torch.device(device).type == "cuda"
        flex = on_cuda and flex_available() and flex_supports(scheme)
        return "flex" if flex else "sdpa-bias"
    return "sdpa-causal"


@dataclass
class AttnContext:
    """What every layer of one forward shares: computed once, before the first block."""

    pos: torch.Tensor  # (T,)
    backend: str
    shared: Any = None  # scheme.prepare(pos)
    bias: torch.Tensor | None = None  # (H, T, T), the explicit path's materialized bias
    mask: torch.Tensor | None = None  # (H, T, T) float32, bias with -inf above the diagonal
    score_mod: Any = None
    block_mask: Any = None
    _masks: dict = field(default_factory=dict, init=False, repr=False)  # mask per compute dtype

    def sdpa_mask(self, dtype: torch.dtype) -> torch.Tensor:
        """The float mask in `dtype` (SDPA wants the query's), cast once per forward."""
        if dtype not in self._masks:
            self._masks[dtype] = self.mask.to(dtype)
        return self._masks[dtype]


def causal_mask(t: int, device) -> torch.Tensor:
    """(T, T) bool, True where key j > query i (not allowed)."""
    return torch.ones(t, t, dtype=torch.bool, device=device).triu(1)


# Each (length, dtype, scheme, grad mode) is its own compiled entry; the default limit of 8
# would send a benchmark over several schemes and lengths back to eager FlexAttention, which
# materializes the full score matrix, without an error.
FLEX_RECOMPILE_LIMIT = 256


@functools.cache
def _compiled_flex():
    import torch._dynamo.config
    from torch.nn.attention.flex_attention import flex_attention

    dynamo = torch._dynamo.config
    dynamo.recompile_limit = max(dynamo.recompile_limit, FLEX_RECOMPILE_LIMIT)
    dynamo.accumulated_recompile_limit = max(dynamo.accumulated_recompile_limit,
                                             FLEX_RECOMPILE_LIMIT)
    return torch.compile(flex_attention, dynamic=False)


@functools.lru_cache(maxsize=16)
def _causal_block_mask(t: int, device: str):
    from torch.nn.attention.flex_attention import create_block_mask

    return create_block_mask(lambda b, h, q, k: q >= k, None, None, t, t, device=device)


def prepare(scheme, pos: torch.Tensor, backend: str) -> AttnContext:
    ctx = AttnContext(pos=pos, backend=backend, shared=scheme.prepare(pos))
    if "bias" in scheme.hooks:
        if backend == "flex":
            fn = scheme.bias_fn

            def score_mod(score, b, h, q_idx, kv_idx):
                return score + fn(h, pos[q_idx], pos[kv_idx])

            ctx.score_mod = score_mod
            ctx.block_mask = _causal_block_mask(pos.shape[0], str(pos.device))
        elif backend == "sdpa-bias":  # only the mask is kept: at long lengths (H, T, T) is large
            bias = scheme.bias(pos, ctx.shared).float()
            ctx.mask = bias.masked_fill(causal_mask(pos.shape[0], pos.device), float("-inf"))
        else:
            ctx.bias = scheme.bias(pos, ctx.shared)
    return ctx


def attend(q, k, v, scheme, ctx: AttnContext, layer: int) -> torch.Tensor:
    """q, k, v (B, H, T, D) -> (B, H, T, D), causal."""
    backend = ctx.backend
    scale = scheme.qk_scale
    if backend == "sdpa-causal":
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    if backend == "sdpa-bias":
        mask = ctx.sdpa_mask(q.dtype)  # (H, T, T)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    if backend == "flex":
        return _compiled_flex()(
            q, k, v, score_mod=ctx.score_mod, block_mask=ctx.block_mask, scale=scale
        )
    return explicit_attention(q, k, v, scheme, ctx, layer)


def explicit_attention(q, k, v, scheme, ctx: AttnContext, layer: int) -> torch.Tensor:
    if "logits" in scheme.hooks:
        scores = scheme.logits(q, k, ctx.pos, ctx.shared, layer)  # (B, H, T, T)
    else:
        scores = (q @ k.transpose(-1, -2)) * scheme.qk_scale
    if "bias" in scheme.hooks:
        bias = ctx.bias if ctx.bias is not None else scheme.bias(ctx.pos, ctx.shared)
        scores = scores + bias
    t = q.shape[-2]
    scores = scores.float().masked_fill(causal_mask(t, q.device), float("-inf"))
    attn = scores.softmax(dim=-1).to(v.dtype)
    out = attn @ v
    if "values" in scheme.hooks:
        out = out + scheme.values(attn, ctx.pos, ctx.shared, layer)
    return out

