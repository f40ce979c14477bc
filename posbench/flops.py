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

# Dense peak FLOP/s from the vendors' data sheets (no structured sparsity), by the precision the
# matmuls run in (`peak_precision`): "bf16", "tf32" (float32 matmuls on tensor cores), "fp32".
# Matched by substring of torch.cuda.get_device_name, first match wins: specific names first.
PEAK_FLOPS: list[tuple[str, dict[str, float]]] = [
    ("H100 PCIe", {"bf16": 756e12, "tf32": 378e12, "fp32": 51e12}),
    ("H100 NVL", {"bf16": 835e12, "tf32": 418e12, "fp32": 60e12}),
    ("H100", {"bf16": 989e12, "tf32": 495e12, "fp32": 67e12}),  # SXM
    ("H200", {"bf16": 989e12, "tf32": 495e12, "fp32": 67e12}),  # SXM; GH200 alike
    ("A100", {"bf16": 312e12, "tf32": 156e12, "fp32": 19.5e12}),
    ("L40S", {"bf16": 362e12, "tf32": 183e12, "fp32": 91.6e12}),
    ("L4", {"bf16": 121e12, "tf32": 60e12, "fp32": 30.3e12}),
]
TF32_CAPABILITY = (8, 0)  # Ampere: the first tensor cores that take float32 inputs as TF32


def matmul_params(model: nn.Module) -> int:
    """N of 6N: the weights of every nn.Linear in the model."""
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))


def training_flops_per_token(model: nn.Module, n_layers: int, d_model: int, train_len: int) -> float:
    """6 N + 6 T d per layer, scaled by the share of causal pairs the layer's span keeps (module
    docstring), and by m where the layer's scheme attends with m H heads (its heads hook: rope-pp
    ec); a model without a layout attends in full with H heads."""
    lay = getattr(model, "layout", None)
    spans = getattr(lay, "spans", None) or [None] * n_layers
    heads = [lay.heads(i) for i in range(len(spans))] if hasattr(lay, "heads") else [1] * len(spans)
    return 6.0 * matmul_params(model) + 6.0 * train_len * d_model * sum(
        kept_pairs(s, train_len) * m for s, m in zip(spans, heads))


def kept_pairs(span, train_len: int) -> float:
    """The share of the causal (query, key) pairs at train_len that a span (posbench.attention.Span)
    keeps: 1 for full attention and for a window or chunk as long as the sequence."""
    if span is None:
        return 1.0
    return float(span.visible(train_len, "cpu").sum()) / (train_len * (train_len + 1) / 2)


def peak_precision(device: torch.device, dtype: str) -> str:
    """The precision a training step's matmuls run in on this device: "bf16" for a bfloat16 run
    (autocast), "tf32" for float32 when `torch.get_float32_matmul_precision()` is "high" or
    "medium" (CUDA then lets cuBLAS round float32 inputs to TF32) on a GPU with TF32 tensor cores,
    "fp32" otherwise; "" on a CPU, whose peak is unknown."""
    if device.type != "cuda":
        return ""
    if dtype == "bfloat16":
        return "bf16"
    if (torch.get_float32_matmul_precision() in ("high", "medium")
            and torch.cuda.get_device_capability(device) >= TF32_CAPABILITY):
        return "tf32"
    return "fp32"


def mfu_peak(device: torch.device, dtype: str) -> tuple[str, float | None]:
    """(precision, dense peak FLOP/s) that MFU divides by: `peak_precision` and the device's peak
    in it, or ("", None) where the device is not in the table (every CPU, unlisted GPUs)."""
    precision = peak_precision(device, dtype)
    if not precision:
        return "", None
    name = torch.cuda.get_device_name(device)
    for pattern, peaks in PEAK_FLOPS:
        if pattern in name:
            return precision, peaks[precision]
    return "", None
