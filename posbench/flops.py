"""Model FLOPs of a training step and the utilization they reach on a device of known peak.

Training FLOPs per token (the model's arithmetic, not the hardware's: recomputation in a fused
backward is not counted, the usual definition of MFU, Chowdhery et al. 2022, arXiv:2204.02311):

    6 N  +  6 L T d

N counts the weights of the matrix multiplications (every nn.Linear: attention projections, MLP,
output head; for the quick model 12 L d^2 + d V). Embedding tables are lookups and biases and norms
are additions, so they are left out. 6 = 2 (multiply-add) x 3 (forward, and a backward twice as
costly). Attention's scores and weighted sum add 2 x 2 T d per token and layer in the forward for
all T keys; causal masking halves that to 2 T d, times 3 for the backward: 6 L T d, the causal form
of PaLM's 12 L T d. Layers whose span is a window or a chunk attend to fewer keys: for them the
term is an upper bound.
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
    """6 N + 6 L T d (module docstring)."""
    return 6.0 * matmul_params(model) + 6.0 * n_layers * train_len * d_model


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
