"""The one model every scheme shares: a small pre-norm decoder-only Transformer (GELU MLP,
untied output head). A scheme plugs in through its hooks (posbench.schemes.base) and changes
nothing else, so two rows of a table differ only in the scheme.

The head is untied: the input table is where absolute schemes add their vectors, so its scale
(unit variance, like the sinusoids it is summed with) is chosen for that, not for the output.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from posbench import attention
from posbench.schemes.base import Scheme


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 0  # filled from the tokenizer
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    mlp_ratio: int = 4


def embed_inputs(scheme: Scheme, tok: nn.Embedding | None, idx: torch.Tensor, pos: torch.Tensor):
    """Token embeddings (unless the scheme builds its own), then the scheme's input and mixer
    hooks: what the first block sees, (B, T, d)."""
    scheme.check_positions(pos)
    x = tok(idx) if tok is not None else None
    if "input" in scheme.hooks:
        x = scheme.embed(x, idx, pos)
    if "mixer" in scheme.hooks:
        x = scheme.mix(x)
    return x


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.n_heads = cfg.n_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x, scheme: Scheme, ctx: attention.AttnContext):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        # q, k, v: (B, H, T, D)
        if "qk" in scheme.hooks:
            q, k = scheme.rotate(q, k, ctx.pos, ctx.shared)
        y = attention.attend(q, k, v, scheme, ctx, self.layer)  # (B, H, T, D)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = Attention(cfg, layer)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model),
            nn.GELU(),
            nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model),
        )

    def forward(self, x, scheme, ctx):
        x = x + self.attn(self.ln1(x), scheme, ctx)
        return x + self.mlp(self.ln2(x))


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig, scheme: Scheme):
        super().__init__()
        self.cfg = cfg
        self.tok = None if scheme.owns_token_embedding else nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self._init_weights()
        # The scheme initializes its own parameters; it is attached after the generic init.
        self.scheme = scheme
        self.backend: str | None = None  # None: chosen from the scheme's hooks and the device

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
        scheme = self.scheme
        x = embed_inputs(scheme, self.tok, idx, pos)  # (B, T, d)
        backend = self.backend or attention.choose_backend(scheme, idx.device)
        ctx = attention.prepare(scheme, pos, backend)
        for block in self.blocks:
            x = block(x, scheme, ctx)
        logits = self.head(self.ln_f(x))  # (B, T, V)
        if targets is None:
            return logits
        return F.cross_entropy(logits.float().transpose(1, 2), targets, reduction="none")

    def token_losses(self, idx, targets, pos=None) -> torch.Tensor:
        """Cross-entropy of every next-token prediction, (B, T), in float32."""
        return self(idx, pos, targets)
