"""The `fla` attention path: flash-linear-attention's Triton kernels (`pip install
"posbench[fla]"`: flash-linear-attention and fla-core 0.6.0) for the schemes whose reference
implementation on a GPU they are. Chosen on CUDA where the package imports, for a layer of full
causal span without a sink; elsewhere these schemes keep the explicit path, which the kernels are
tested against (tests/test_fla.py: fla's own PyTorch references on CPU, the kernels on CUDA).

How posbench's quantities map onto fla's arguments (fla lays tensors out (B, T, H, D), posbench
(B, H, T, D); `scale` is the scheme's qk_scale, 1/sqrt(D)):

- stickbreaking: `parallel_stickbreaking_attn(q, k, v, scale, attend_current=False)` returns the
  output and each query's remainder 1 - sum_j A_ij, which posbench gives to the query's own value:
  out = o + rem v_i (the reference's convention, posbench.schemes.stickbreaking).
- fox: `parallel_forgetting_attn(q, k, v, g, scale)` takes the per-token log forget gates g (<= 0)
  and adds cumsum(g)_i - cumsum(g)_j to the scaled logits unscaled; posbench's gate hook gives
  c = cumsum(log f), so g is c's first differences (c_0 for the first token).
- path, path-fox: `parallel_path_attn(q, k, v, w, beta, g, scale)` scales the content logits and
  the gate together, scale (A_ij + G_i - G_j); posbench adds its gate c (already scaled for
  path-fox's default scaled_gate=true) after scaling, so g is c's differences divided by scale.
  w (unit rows) and beta in (0, 2) are the scheme's content hook's; w, beta and g go in float32,
  as the kernel requires, whatever the dtype of q, k and v.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch

BACKEND = "fla"
SCHEMES = ("stickbreaking", "fox", "path", "path-fox")


@functools.cache
def available() -> bool:
    try:
        import fla.ops  # noqa: F401
    except Exception:  # noqa: BLE001 - not installed, or no Triton for this machine
        return False
    return True


def supports(scheme) -> bool:
    return scheme.name in SCHEMES


def kernels() -> dict[str, Callable[..., Any]]:
    """fla's kernels by operation."""
    from fla.ops.forgetting_attn import parallel_forgetting_attn
    from fla.ops.path_attn import parallel_path_attn
    from fla.ops.stickbreaking_attn import parallel_stickbreaking_attn

    return {"stickbreaking": parallel_stickbreaking_attn, "forgetting": parallel_forgetting_attn,
            "path": parallel_path_attn}


def log_gates(c: torch.Tensor) -> torch.Tensor:
    """Per-token log gates g (B, H, T) whose running sum is c (B, H, T)."""
    return torch.diff(c, dim=-1, prepend=torch.zeros_like(c[..., :1]))


def attend(q, k, v, scheme, gate: torch.Tensor | None = None, content: Any = None,
           ops: dict[str, Callable[..., Any]] | None = None) -> torch.Tensor:
    """q, k, v (B, H, T, D) -> (B, H, T, D) through fla's kernel for the scheme (module docstring);
    `ops` replaces the kernels (tests pass fla's PyTorch references)."""
    ops = ops or kernels()
    scale = scheme.qk_scale

    def fla_layout(x):  # (B, H, T, ...) -> (B, T, H, ...)
        return x.transpose(1, 2).contiguous()

    qt, kt, vt = fla_layout(q), fla_layout(k), fla_layout(v)
    if scheme.name == "stickbreaking":
        out, rem = ops["stickbreaking"](qt, kt, vt, scale=scale, attend_current=False)
        out = out + rem.unsqueeze(-1).to(vt.dtype) * vt
    elif scheme.name == "fox":
        out = ops["forgetting"](qt, kt, vt, fla_layout(log_gates(gate)), scale=scale)
    else:  # path, path-fox
        w, beta = content
        g = torch.zeros_like(beta) if gate is None else log_gates(gate) / scale
        # fla keeps PaTH's Householder vectors, their strengths and the gate in float32 whatever
        # q, k and v are (its kernel refuses others: bfloat16 would cost the products' precision).
        out = ops["path"](qt, kt, vt, fla_layout(w).float(), fla_layout(beta).float(),
                          fla_layout(g).float(), scale=scale)
        out = out[0] if isinstance(out, tuple) else out  # the kernel also returns its key cache
    return out.transpose(1, 2).to(v.dtype)
