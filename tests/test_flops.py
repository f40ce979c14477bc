import torch

from posbench import flops
from posbench.model import ModelConfig
from posbench.training import RunSpec, build_model


def test_training_flops_match_a_hand_count():
    """The quick model: per layer q, k, v, out (4 d^2) and the MLP (2 x 4 d^2), then the head d V;
    6 N plus causal attention 6 L T d."""
    d, layers, vocab, t = 128, 4, 2048, 64
    model = build_model(RunSpec(scheme="rope", model=ModelConfig(d_model=d, n_layers=layers)), vocab)
    n = layers * 12 * d * d + d * vocab
    assert flops.matmul_params(model) == n == 1_048_576
    assert flops.training_flops_per_token(model, layers, d, t) == 6 * n + 6 * layers * t * d
    # Learned tables and T5's buckets are lookups: not counted.
    for scheme in ("learned", "t5"):
        other = build_model(RunSpec(scheme=scheme, model=ModelConfig(d_model=d, n_layers=layers)), vocab)
        assert flops.matmul_params(other) == n


def test_peak_known_for_listed_gpus_only(monkeypatch):
    assert flops.peak_flops(torch.device("cpu"), "bfloat16") is None
    names = {"NVIDIA H100 80GB HBM3": 989e12, "NVIDIA H100 PCIe": 756e12, "NVIDIA H200": 989e12,
             "NVIDIA A100-SXM4-80GB": 312e12, "NVIDIA GeForce GTX 1080": None}
    for name, peak in names.items():
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None, name=name: name)
        assert flops.peak_flops(torch.device("cuda"), "bfloat16") == peak, name
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-40GB")
    assert flops.peak_flops(torch.device("cuda"), "float32") == 19.5e12
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "high")
    assert flops.peak_flops(torch.device("cuda"), "float32") == 156e12  # TF32 tensor cores
