"""The one model every scheme shares: a small pre-norm decoder-only Transformer (GELU MLP,
untied output head). Its layout (posbench.layout) says what each layer does: a scheme plugs in
through its hooks (posbench.schemes.base), a span, a temperature and a sink through the
attention call, an output gate (posbench.modifiers) on the attention's output;
nothing else changes, so two rows of a table differ only in the layout.

The head is untied: the input table is where absolute schemes add their vectors, so its scale
(unit variance, like the sinusoids it is summed with) is chosen for that, not for the output.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from posbench import attention
from posbench.config import ModelConfig
from posbench.layout import LayerPlan, ModelLayout


class Attention(nn.Module):
    """`heads`: m of the layer's scheme's heads hook (posbench.schemes.base): m H attention heads
    over the H keys and values, and an output projection m d -> d; 1 (H heads, d -> d) otherwise."""

    def __init__(self, cfg: ModelConfig, layer: int, heads: int = 1):
        super().__init__()
        self.layer = layer
        self.n_heads = cfg.n_heads
        self.heads = heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(heads * cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x, plan: LayerPlan):
        b, t, d = x.shape
        scheme, ctx = plan.scheme, plan.ctx
        q, k, v = self.qkv(x).view(b, t, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        # q, k, v: (B, H, T, D)
        content = scheme.content(x, self.layer) if "content" in scheme.hooks else None
        if "qk" in scheme.hooks:
            args = (q, k, ctx.pos, ctx.shared, self.layer)
            q, k = scheme.rotate(*args) if content is None else scheme.rotate(*args, content)
        sink, factor = plan.sink, plan.factor
        if "heads" in scheme.hooks:  # m H attention heads: each value head, sink and temperature read m times
            m = scheme.attention_heads()
            v = v.repeat_interleave(m, dim=1)
            sink = None if sink is None else sink.repeat_interleave(m)
            if factor is not None and factor.dim() == 3:  # (H, T, 1)
                factor = factor.repeat_interleave(m, dim=0)
        if factor is not None:  # the layer's temperature
            q = q * factor.to(q.dtype)
        gate = scheme.gate(x, self.layer) if "gate" in scheme.hooks else None  # (B, H, T)
        turned = "vo" in scheme.hooks
        if turned:
            args = (ctx.pos, ctx.shared, self.layer) + (() if content is None else (content,))
            v = scheme.turn_values(v, *args)
        y = attention.attend(q, k, v, scheme, ctx, self.layer, gate, content, sink)  # (B, H, T, D)
        if turned:
            y = scheme.turn_output(y, *args)
        if plan.out_gate is not None:
            y = plan.out_gate(x, y)
        return self.proj(y.transpose(1, 2).reshape(b, t, self.heads * d))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, heads: int = 1):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = Attention(cfg, layer, heads)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model),
            nn.GELU(),
            nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model),
        )

    def forward(self, x, plan: LayerPlan):
        x = x + self.attn(self.ln1(x), plan)
        return x + self.mlp(self.ln2(x))


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig, layout: ModelLayout):
        super().__init__()
        self.cfg = cfg
        self.tok = None if layout.owns_token_embedding else nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, i, layout.heads(i)) for i in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self._init_weights()
        # The schemes and temperatures initialize their own parameters: attached after the
        # generic init (and last, so a one-scheme model's parameters come in their old order).
        self.layout = layout
        self.backend: str | None = None  # None: chosen per layer from its scheme, span and device
        self.register_load_state_dict_pre_hook(_one_scheme_keys)

    def _init_weights(self):
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif "ln" in name:
                nn.init.ones_(p)
            elif name == "tok.weight":
                nn.init.normal_(p, std=1.0)
            else:
                std = 0.02
                if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):
                    std /= math.sqrt(2 * self.cfg.n_layers)  # residual branches (GPT-2)
                nn.init.normal_(p, std=std)

    def forward(self, idx: torch.Tensor, pos: torch.Tensor | None = None,
                targets: torch.Tensor | None = None) -> torch.Tensor:
        """idx (B, T) token ids, pos (T,) positions (default 0..T-1) -> logits (B, T, V), or with
        `targets` (B, T) the cross-entropy of every prediction (B, T) in float32."""
        t = idx.shape[1]
        if pos is None:
            pos = torch.arange(t, device=idx.device)
        x = self.layout.embed(self.tok, idx, pos)  # (B, T, d)
        for block, plan in zip(self.blocks, self.layout.plan(pos, self.backend)):
            x = block(x, plan)
        logits = self.head(self.ln_f(x))  # (B, T, V)
        if targets is None:
            return logits
        # Rows of (B T, V): log-softmax over a contiguous last dimension is 2.5x faster on CPU
        # than over the class dimension of (B, V, T).
        flat = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="none")
        return flat.view(targets.shape)

    def reserve_positions(self, bound: int, length: int) -> None:
        """Every training position of the run is below `bound`, in windows of `length`
        (`reserve_positions`)."""
        reserve_positions(self, self.layout.schemes, bound, length)

    def token_losses(self, idx, targets, pos=None) -> torch.Tensor:
        """Cross-entropy of every next-token prediction, (B, T), in float32."""
        return self(idx, pos, targets)


@torch.no_grad()
def reserve_positions(net: nn.Module, schemes, bound: int, length: int) -> None:
    """Check each scheme's limits and grow its tables to `bound` here, eagerly, with one forward of
    `net` (idx (B, T), pos (T,)) whose positions span 0..bound-1; a compiled forward then reads the
    bound instead of max(pos) (tables.position_count: a device sync and a graph break each) and
    never rebuilds a table (a recompile)."""
    for scheme in schemes:
        scheme.position_bound = None  # the check below reads the positions themselves
    device = next(net.parameters()).device
    pos = torch.cat([torch.arange(length - 1), torch.tensor([bound - 1])]).to(device)
    net(torch.zeros(1, length, dtype=torch.long, device=device), pos)
    for scheme in schemes:
        scheme.position_bound = bound


def _one_scheme_keys(module, state_dict, prefix, *args):
    """Weights saved when the model held one scheme as `scheme` load into layout.schemes.0."""
    old = prefix + "scheme."
    for key in [k for k in state_dict if k.startswith(old)]:
        state_dict[prefix + "layout.schemes.0." + key[len(old):]] = state_dict.pop(key)


def non_embedding_params(model: Transformer) -> int:
    """The parameters outside the token table, the output head and any position table (every
    nn.Embedding): N of the scaling laws of Kaplan et al. (2020), 12 L d^2 for a plain block."""
    skip = {id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()}
    skip |= {id(p) for p in model.head.parameters()}
    return sum(p.numel() for p in model.parameters() if id(p) not in skip)
