"""Model FLOPs of a training step and the utilization they reach on a device of known peak.

Training FLOPs per token (the model's arithmetic, not the hardware's: recomputation in a fused
backward is not counted, the usual definition of MFU, Chowdhery et al. 2022, arXiv:2204.02311):

    6 N  +  6 L T d

N counts the weights of the matrix multiplications (every nn.Linear: attention projections, MLP,
output head; for the quick model 12 L d^2 + d V). Embedding tables are lookups and biases and norms
are additions, so they are left out. 6 = 2 (multiply-add) x 3 (forward, and a backward twice as
costly). Attention's scores and weighted sum add 2 x 2 T d per token and layer in the forward for
all T keys; causal masking halves that to 2 T d, times 3 for the backward: 6 L T d, the causal form
of PaLM's 12 L T d. A layer whose span is a sliding window or a chunk (posbench.layout) computes
only the (query, key) pairs of its span, so its 6 T d is scaled by the share of the causal mask's
T (T + 1) / 2 pairs that the span keeps: a window of w keys at T >> w costs about w / (T / 2) of a
full layer.

The tokens these FLOPs are per are every position the model computed on: padding included (the
ends of a probe's shorter examples), not only the targets that carry loss.
"""

from __future__ import annotations

import torch
from torch import nn

# Dense peak FLOP/s from the vendors' data sheets (no structured sparsity), by compute dtype.
# "tf32" is float32 matmuls on tensor cores (torch.set_float32_matmul_precision("high")).
# Matched by substring of torch.cuda.get_device_name, first match wins: specific names first.
PEAK_FLOPS: list[tuple[str, dict[str, float]]] = [
    ("H100 PCIe", {"bfloat16": 756e12, "tf32": 378e12, "float32": 51e12}),
    ("H100 NVL", {"bfloat16": 835e12, "tf32": 418e12, "float32": 60e12}),
    ("H100", {"bfloat16": 989e12, "tf32": 495e12, "float32": 67e12}),  # SXM
    ("H200", {"bfloat16": 989e12, "tf32": 495e12, "float32": 67e12}),  # SXM; GH200 alike
    ("A100", {"bfloat16": 312e12, "tf32": 156e12, "float32": 19.5e12}),
    ("L40S", {"bfloat16": 362e12, "tf32": 183e12, "float32": 91.6e12}),
    ("L4", {"bfloat16": 121e12, "tf32": 60e12, "float32": 30.3e12}),
]


def matmul_params(model: nn.Module) -> int:
    """N of 6N: the weights of every nn.Linear in the model."""
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))


def training_flops_per_token(model: nn.Module, n_layers: int, d_model: int, train_len: int) -> float:
    """6 N + 6 T d per layer, scaled by the share of causal pairs the layer's span keeps (module
    docstring); a model without a layout attends in full."""
    spans = getattr(getattr(model, "layout", None), "spans", None) or [None] * n_layers
    return 6.0 * matmul_params(model) + 6.0 * train_len * d_model * sum(kept_pairs(s, train_len) for s in spans)


def kept_pairs(span, train_len: int) -> float:
    """The share of the causal (query, key) pairs at train_len that a span (posbench.attention.Span)
    keeps: 1 for full attention and for a window or chunk as long as the sequence."""
    if span is None:
        return 1.0
    return float(span.visible(train_len, "cpu").sum()) / (train_len * (train_len + 1) / 2)


def peak_flops(device: torch.device, dtype: str) -> float | None:
    """The device's dense peak for the training dtype, or None where it is not in the table (every
    CPU, unlisted GPUs)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    kind = dtype
    if dtype == "float32" and torch.get_float32_matmul_precision() != "highest":
        kind = "tf32"
    for pattern, peaks in PEAK_FLOPS:
        if pattern in name:
            return peaks[kind]
    return None
