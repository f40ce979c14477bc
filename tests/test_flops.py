import pytest
import torch

from posbench import flops
from posbench.model import ModelConfig
from posbench.runs import RunSpec, build_model


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
    assert flops.mfu_peak(torch.device("cpu"), "bfloat16")[1] is None
    names = {"NVIDIA H100 80GB HBM3": 989e12, "NVIDIA H100 PCIe": 756e12, "NVIDIA H200": 989e12,
             "NVIDIA A100-SXM4-80GB": 312e12, "NVIDIA GeForce GTX 1080": None}
    for name, peak in names.items():
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None, name=name: name)
        assert flops.mfu_peak(torch.device("cuda"), "bfloat16")[1] == peak, name
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-40GB")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert flops.mfu_peak(torch.device("cuda"), "float32")[1] == 19.5e12
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "high")
    assert flops.mfu_peak(torch.device("cuda"), "float32")[1] == 156e12  # TF32 tensor cores


def fake_gpu(monkeypatch, name: str, capability: tuple[int, int], precision: str) -> None:
    """The device-peak lookup as a CUDA machine answers it: its name, compute capability and the
    float32 matmul precision set in torch."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: precision)


@pytest.mark.parametrize(("dtype", "precision", "capability", "label", "peak"), [
    ("float32", "highest", (9, 0), "fp32", 67e12),  # float32 matmuls in full precision
    ("float32", "high", (9, 0), "tf32", 495e12),
    ("float32", "medium", (9, 0), "tf32", 495e12),
    ("float32", "high", (7, 0), "fp32", 67e12),  # a GPU without TF32 runs float32 in full
    ("bfloat16", "highest", (9, 0), "bf16", 989e12),
    ("bfloat16", "high", (9, 0), "bf16", 989e12),
])
def test_mfu_divides_by_the_peak_of_the_precision_used_and_names_it(monkeypatch, dtype, precision,
                                                                    capability, label, peak):
    from posbench.config import TrainConfig
    from posbench.training import compute_rate

    fake_gpu(monkeypatch, "NVIDIA H100 80GB HBM3", capability, precision)
    spec = RunSpec(scheme="rope", model=ModelConfig(d_model=32, n_layers=2, n_heads=2),
                   train=TrainConfig(train_len=16, dtype=dtype))
    model = build_model(spec, 50)
    rate = compute_rate(model, spec, torch.device("cuda"), 1000.0)
    assert rate["mfu_peak"] == label
    assert rate["mfu"] == pytest.approx(rate["model_flops_per_second"] / peak, rel=1e-12)
    assert flops.mfu_peak(torch.device("cuda"), dtype) == (label, peak)


def test_no_peak_no_label(monkeypatch):
    """A CPU, and a GPU the table does not list, have no peak: MFU and its label stay empty."""
    from posbench.training import compute_rate

    spec = RunSpec(scheme="rope", model=ModelConfig(d_model=32, n_layers=2, n_heads=2))
    model = build_model(spec, 50)
    assert compute_rate(model, spec, torch.device("cpu"), 1000.0) | {"model_flops_per_second": 0} == \
        {"model_flops_per_second": 0, "mfu": None, "mfu_peak": ""}
    fake_gpu(monkeypatch, "NVIDIA GeForce GTX 1080", (6, 1), "highest")
    rate = compute_rate(model, spec, torch.device("cuda"), 1000.0)
    assert (rate["mfu"], rate["mfu_peak"]) == (None, "")


def test_runs_csv_records_the_peak_and_reads_a_file_without_the_column(tmp_path):
    """mfu_peak is a runs.csv column; a runs.csv written before it existed still reads (the
    column empty) and takes new rows."""
    from posbench import results

    columns = [c for c in results.TABLES["runs"]["columns"] if c != "mfu_peak"]
    row = {c: "" for c in columns} | {"run_id": "rope-0000000000", "scheme": "rope", "status": "ok",
                                      "mfu": "0.025"}
    (tmp_path / "runs.csv").write_text(",".join(columns) + "\n" + ",".join(row[c] for c in columns) + "\n")
    results.merge_rows(tmp_path, "runs", [{"run_id": "rope-1111111111", "status": "ok", "mfu": 0.5,
                                           "mfu_peak": "bf16"}])
    rows = {r["run_id"]: r for r in results.read_rows(tmp_path / "runs.csv")}
    assert rows["rope-0000000000"]["mfu_peak"] == "" and rows["rope-0000000000"]["mfu"] == "0.025"
    assert rows["rope-1111111111"]["mfu_peak"] == "bf16"
    assert "mfu_peak" in (tmp_path / "runs.csv").read_text().splitlines()[0].split(",")


def test_windowed_layers_count_the_pairs_of_their_span():
    """A layer's attention term is 6 T d times the share of the T (T + 1) / 2 causal pairs its
    span keeps: a window of 8 at T = 64 keeps 8 * 9 / 2 + 56 * 8 = 484 pairs of 2080, chunks of 16
    keep 4 * (16 * 17 / 2) = 544; a full layer keeps them all."""
    d, t, vocab = 32, 64, 50
    model_cfg = ModelConfig(d_model=d, n_layers=4, n_heads=4)

    def per_token(scheme):
        model = build_model(RunSpec(scheme=scheme, model=model_cfg), vocab)
        return flops.training_flops_per_token(model, 4, d, t) - 6 * flops.matmul_params(model)

    assert per_token("rope") == 6 * 4 * t * d
    assert per_token("rope@w8") == pytest.approx(6 * 4 * t * d * 484 / 2080)
    assert per_token("rope@c16") == pytest.approx(6 * 4 * t * d * 544 / 2080)
    # local/global: three window layers and one full layer
    assert per_token("rope@w8*3/none") == pytest.approx(6 * t * d * (3 * 484 / 2080 + 1))
    assert per_token("rope@w64") == per_token("rope")  # a window as long as the sequence is full attention


def test_probe_rows_count_answers_and_padding_apart(tmp_path):
    """tokens (and tokens/s, MFU) count every position computed on; scored_tokens the answer
    tokens and padding_tokens the padded inputs, summed over the very batches the run drew."""
    from posbench import batches, results
    from posbench.config import TrainConfig
    from posbench.data import DataConfig
    from posbench.training import train

    t = TrainConfig(train_len=32, steps=3, batch_size=4, warmup=1, eval_interval=3)
    spec = RunSpec(scheme="rope", data=DataConfig(spec="passkey"), model=ModelConfig(d_model=16, n_layers=1, n_heads=2), train=t)
    row = results.read_rows(train(spec, tmp_path, device="cpu", progress=False).run_dir.parent / "runs.csv")[0]
    source = batches.source_for(spec, None)
    gen = torch.Generator().manual_seed(spec.seed)
    drawn = [source.sample(gen) for _ in range(t.steps)]
    assert int(row["tokens"]) == 3 * 4 * 32
    assert int(row["scored_tokens"]) == sum(int((b.mask > 0).sum()) for b in drawn) < int(row["tokens"])
    assert int(row["padding_tokens"]) == sum(int((b.tokens == 0).sum()) for b in drawn) > 0
    assert float(row["tokens_per_second"]) == pytest.approx(int(row["tokens"]) / float(row["train_seconds"]), rel=1e-4)
    # Interrupted and resumed, the run counts the same tokens (the counts ride in the checkpoint).
    train(spec, tmp_path / "resumed", device="cpu", progress=False, stop_after=2)
    resumed = train(spec, tmp_path / "resumed", device="cpu", progress=False, resume=True).row
    assert (resumed["scored_tokens"], resumed["padding_tokens"]) == (int(row["scored_tokens"]), int(row["padding_tokens"]))


def test_lm_rows_score_every_token(tiny_data, tmp_path):
    from posbench.config import TrainConfig
    from posbench.training import train

    spec = RunSpec(scheme="rope", data=tiny_data, model=ModelConfig(d_model=16, n_layers=1, n_heads=2),
                   train=TrainConfig(train_len=16, steps=2, batch_size=2, warmup=1, eval_interval=2, eval_windows=2))
    row = train(spec, tmp_path, device="cpu", progress=False).row
    assert row["scored_tokens"] == row["tokens"] == 2 * 2 * 16 and row["padding_tokens"] == 0


def test_train_says_what_a_probe_run_computed_on(tmp_path, capsys):
    from posbench.cli import main

    assert main(["train", "--scheme", "rope", "--data", "passkey", "--train-len", "32", "--steps", "2",
                 "--batch-size", "2", "--d-model", "16", "--layers", "1", "--heads", "2", "--device", "cpu",
                 "--runs-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "tokens/s computed on (" in out and "% of them padding" in out and "% answers)" in out
