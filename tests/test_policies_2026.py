"""The eval-time RoPE policies freq-band, dpe and dope (posbench/docs/extension.md): each one's
defining property, DPE's position map against numbers worked by hand from the reference code's
formula, DoPE's truncated matrix entropy against a hand-computed value, refusals in one line, and
`extrapolate --rope-scaling dpe,dope,freq-band` end to end on a trained run and a pretrained model."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import TINY_MODEL, TINY_TRAIN, tiny_model
from posbench import results
from posbench.cli import main
from posbench.errors import PosbenchError
from posbench.runs import RunSpec
from posbench.schemes.dope import DOPE_SEED, dope_qk, flagged_count, gaussian_like, noisy_heads, truncated_entropy
from posbench.policies import RopeScaling
from posbench.policies.dpe import detect_dpe_scales, dpe_candidates, dpe_default
from posbench.policies.frequencies import freq_band, rope_frequencies
from posbench.policies.two_maps import dpe_pair_scales, dpe_positions, two_map_scores
from posbench.training import train

BASE = 10000.0
INV = BASE ** -(torch.arange(0, 8, 2, dtype=torch.float64) / 8)  # head dim 8: 1, 0.1, 0.01, 0.001


def pair_dots(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """q, k (..., D) half-split -> (..., D/2) the dot product of each pair."""
    h = q.shape[-1] // 2
    return q[..., :h] * k[..., :h] + q[..., h:] * k[..., h:]


# ---- freq-band -------------------------------------------------------------------------------

def test_freq_band_leaves_pairs_longer_than_the_training_length_unrotated():
    """L = 16: wavelengths 2 pi / theta = 6.3, 62.8, 628, 6283: pair 0 alone keeps its frequency;
    cutoff 10 (160 tokens) keeps pairs 0 and 1."""
    inv, mscale = rope_frequencies(8, BASE, 16, RopeScaling("freq-band"), 64)
    assert inv.tolist() == [1.0, 0.0, 0.0, 0.0] and mscale == 1.0
    assert freq_band(INV, 16, 10.0).tolist() == [1.0, 0.1, 0.0, 0.0]
    assert RopeScaling("freq-band").label == "freq-band"
    assert RopeScaling("freq-band", cutoff=0.5).label == "freq-band(cutoff=0.5)"


def test_freq_band_keeps_q_dot_k_of_high_pairs_and_drops_position_from_low_ones():
    """Per pair, q_m . k_n under freq-band: the kept pair equals plain RoPE's, the others equal the
    unrotated q . k at every (m, n)."""
    scheme = tiny_model("rope", train_len=16).layout.schemes[0]
    torch.manual_seed(0)
    q, k = torch.randn(1, 1, 40, 8), torch.randn(1, 1, 40, 8)
    pos = torch.arange(40)
    plain = scheme.rotate(q, k, pos, scheme.prepare(pos), 0)
    scheme.set_scaling(RopeScaling("freq-band"))
    assert scheme.hooks == ("qk",)  # the sdpa path: only the frequencies change
    band = scheme.rotate(q, k, pos, scheme.prepare(pos), 0)
    dots = lambda qk: pair_dots(qk[0][0, 0, :, None], qk[1][0, 0, None, :])  # noqa: E731  (Tq, Tk, pairs)
    assert torch.allclose(dots(band)[..., 0], dots(plain)[..., 0], atol=1e-5)
    unrotated = pair_dots(q[0, 0, :, None], k[0, 0, None, :])
    assert torch.allclose(dots(band)[..., 1:], unrotated[..., 1:], atol=1e-5)
    assert not torch.allclose(dots(plain)[..., 1:], unrotated[..., 1:], atol=1e-3)


# ---- dpe -------------------------------------------------------------------------------------

# LuLuLuyi/DPE `dpe_flash_forward` (dpe_for_llama.py), prefill: query positions
# `query_position // i + _re_window_size - _re_window_size / i`, key positions `key_position // i`,
# per group of 8 pairs, with config/dpe_config.yaml's Meta-Llama-3-8B-Instruct settings
# (local_window_size 1024, scale_factors [2, 8, 2, 8, 32, 32, 32, 4]). Worked by hand for the query
# at 5000 and the key at 100:
#   s = 2:  5000 // 2 + 1024 - 512 = 3012, 100 // 2 = 50   -> 2962
#   s = 8:  5000 // 8 + 1024 - 128 = 1521, 100 // 8 = 12   -> 1509
#   s = 32: 5000 // 32 + 1024 - 32 = 1148, 100 // 32 = 3   -> 1145
#   s = 4:  5000 // 4 + 1024 - 256 = 2018, 100 // 4 = 25   -> 1993
LLAMA3_SCALES = (2, 8, 2, 8, 32, 32, 32, 4)
LLAMA3_REL = [2962, 1509, 2962, 1509, 1145, 1145, 1145, 1993]


def test_dpe_positions_match_the_reference_formula_worked_by_hand():
    scales = dpe_pair_scales(LLAMA3_SCALES, 64)
    assert scales.tolist() == [s for s in LLAMA3_SCALES for _ in range(8)]  # pair t in group t // 8
    q, _ = dpe_positions(torch.tensor([5000]), scales, 1024)
    _, k = dpe_positions(torch.tensor([100]), scales, 0)
    rel = (q - k)[0]
    assert rel.tolist() == [r for r in LLAMA3_REL for _ in range(8)]
    assert q[0, :8].tolist() == [3012.0] * 8 and k[0, -8:].tolist() == [25.0] * 8


def test_dpe_detection_settings_are_the_reference_scripts():
    """run_niah_detect.sh at TEST_MAX_LENGTH 131072, PRETRAIN_LENGTH 8192, W 1024: the groups not
    under test at 131072 / 8192 * 2 = 32, the group under test at 1, 2, 4, ..., 128."""
    assert dpe_default(131072, 8192) == 32.0
    assert dpe_candidates(131072, 1024) == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0]
    assert RopeScaling("dpe").neighbour_window(8192) == 1024
    assert dpe_candidates(16, 32) == [1.0]


def per_pair_logits(q, k, rel, inv):
    """Hand reference: q_i . R(rel[i][j][t]) k_j, a relative position per pair t."""
    t, h = q.shape[0], q.shape[1] // 2
    out = torch.zeros(t, t, dtype=torch.float64)
    for i in range(t):
        for j in range(i + 1):
            angle = torch.tensor(rel[i][j], dtype=torch.float64) * inv
            c, s = angle.cos(), angle.sin()
            q1, q2, k1, k2 = q[i, :h], q[i, h:], k[j, :h], k[j, h:]
            out[i, j] = (q1 * (c * k1 + s * k2) + q2 * (c * k2 - s * k1)).sum()
    return out


def test_dpe_scores_read_each_groups_scaled_positions_beyond_the_window():
    """Scales (1, 2, 4, 4), W = 4, 10 positions: i - j inside the window; beyond it pair t reads
    floor(i / s_t) + 4 - 4 / s_t - floor(j / s_t), written out by hand for two entries."""
    scales = (1.0, 2.0, 4.0, 4.0)
    scaling = RopeScaling("dpe", window=4, scales=scales)

    def rel(i, j):
        if i - j < 4:
            return [i - j] * 4
        return [math.floor(i / s) + 4 - 4 / s - math.floor(j / s) for s in scales]

    assert rel(9, 2) == [7, 4 + 4 - 2 - 1, 2 + 4 - 1 - 0, 2 + 4 - 1 - 0]
    torch.manual_seed(3)
    q, k = torch.randn(10, 8, dtype=torch.float64), torch.randn(10, 8, dtype=torch.float64)
    pos = torch.arange(10)
    got = two_map_scores(q[None, None], k[None, None], pos, pos, INV, scaling, 4)[0, 0]
    want = per_pair_logits(q, k, [[rel(i, j) for j in range(10)] for i in range(10)], INV)
    causal = torch.ones(10, 10, dtype=torch.bool).tril()
    assert torch.allclose(got[causal], want[causal], atol=1e-9)


def test_dpe_at_scale_one_is_rope_and_labels_name_given_settings():
    model = tiny_model("rope", train_len=16)
    x = torch.randint(0, 50, (2, 40))
    with torch.no_grad():
        plain = model(x)
        model.layout.set_scaling(RopeScaling("dpe", scales=(1.0,) * 4))
        assert model.layout.backends("cpu") == "explicit"
        assert torch.allclose(model(x), plain, atol=1e-5)
        model.layout.set_scaling(RopeScaling("dpe"))  # nothing detected: every group at 2 L / L_train
        assert torch.isfinite(model(x)).all()
    assert RopeScaling("dpe").label == "dpe"
    assert RopeScaling("dpe", scales=(2.0, 8.0), detected=True).label == "dpe"
    assert RopeScaling("dpe", groups=4, window=8, scales=(2.0, 8.0)).label == "dpe(groups=4,window=8,scales=2-8)"


def test_dpe_detection_tries_one_group_at_a_time_and_keeps_the_least_loss():
    """A loss that is least at scales (4, 1, 2, 8): each group's trial keeps the others at
    2 L / L_train = 8 (L = 64, L_train = 16) and the group finds its own; no trial is scored twice."""
    best, tried = (4.0, 1.0, 2.0, 8.0), []

    def loss(s: RopeScaling) -> float:
        tried.append(s.scales)
        return sum(abs(math.log2(a) - math.log2(b)) for a, b in zip(s.scales, best))

    found = detect_dpe_scales(loss, RopeScaling("dpe", groups=4), 4, 64, 16)
    assert found.scales == best and found.detected and found.label == "dpe(groups=4)"
    assert tried[0] == (1.0, 8.0, 8.0, 8.0) and tried[-1] == (8.0, 8.0, 8.0, 32.0)
    # W = 16 // 8 = 2: scales 1 .. 32; the trial with every group at the default 8 is scored once, not 4 times
    assert len(tried) == 4 * len(dpe_candidates(64, 2)) - 3 and len(set(tried)) == len(tried)
    given = RopeScaling("dpe", scales=(2.0,))
    assert detect_dpe_scales(loss, given, 4, 64, 16) is given


# ---- dope ------------------------------------------------------------------------------------

def test_truncated_matrix_entropy_by_hand():
    """K = [[1, 0], [0, 1], [1, 0]]: the eigenvalues of K K^T are 2, 1, 0, over the trace
    p = (2/3, 1/3, 0), H = -(2/3 ln 2/3 + 1/3 ln 1/3) = ln 3 - (2/3) ln 2 = 0.636514; truncated
    to r = 1: -(2/3) ln(2/3) = 0.270310 (UNComp's normalization: by the whole trace); a rank-one
    matrix: 0; the identity of size 4: ln 4, and ln 4 / 2 at r = 2."""
    k = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    assert float(truncated_entropy(k, 32)) == pytest.approx(0.636514168, abs=1e-8)
    assert float(truncated_entropy(k, 1)) == pytest.approx(0.270310072, abs=1e-8)
    assert float(truncated_entropy(torch.eye(4), 2)) == pytest.approx(math.log(4) / 2)
    assert float(truncated_entropy(torch.ones(5, 3), 32)) == pytest.approx(0.0, abs=1e-12)
    assert float(truncated_entropy(torch.eye(4), 32)) == pytest.approx(math.log(4))


def keys_with_one_rank_one_head():
    """q, k (2, 4, 12, 8): head 2's keys are rank one (lowest entropy), the others random."""
    torch.manual_seed(0)
    q, k = torch.randn(2, 4, 12, 8), torch.randn(2, 4, 12, 8)
    k[:, 2] = torch.randn(2, 12, 1) * torch.randn(1, 1, 8)
    return q, k


def test_dope_replaces_the_noisy_heads_by_seeded_gaussians_and_leaves_the_others():
    q, k = keys_with_one_rank_one_head()
    assert noisy_heads(k, 0.125, 32).tolist() == [False, False, True, False]
    new_q, new_k, flagged = dope_qk(q, k, 0.125, 32, layer=3)
    keep = ~flagged
    assert torch.equal(new_q[:, keep], q[:, keep]) and torch.equal(new_k[:, keep], k[:, keep])
    g = torch.Generator().manual_seed(DOPE_SEED + 3)
    noise_q, noise_k = gaussian_like(q, g), gaussian_like(k, g)
    assert torch.equal(new_q[:, 2], noise_q[:, 2]) and torch.equal(new_k[:, 2], noise_k[:, 2])
    assert new_k[:, 2].std() == pytest.approx(float(k[:, 2].std()), rel=0.3)  # the std of the keys it replaces
    again = dope_qk(q, k, 0.125, 32, layer=3)
    assert torch.equal(again[0], new_q) and torch.equal(again[1], new_k)  # the same every time
    assert flagged_count(0.5, 4) == 2 and flagged_count(0.1, 4) == 1 and flagged_count(0.0, 4) == 0
    assert torch.equal(dope_qk(q, k, 0.0, 32, 0)[1], k)


def test_dope_logits_are_gaussian_for_the_noisy_head_and_rope_for_the_others():
    """Through the RoPE scheme's logits hook: the flagged head's scores are those of its Gaussian q
    and k, every other head's are plain RoPE's."""
    model = tiny_model("rope", train_len=16)
    scheme = model.layout.schemes[0]
    q, k = keys_with_one_rank_one_head()
    pos = torch.arange(12)
    plain_q, plain_k = scheme.rotate(q, k, pos, scheme.prepare(pos), 0)
    plain = plain_q @ plain_k.transpose(-1, -2) * scheme.qk_scale
    scheme.set_scaling(RopeScaling("dope"))
    assert scheme.hooks == ("logits",) and model.layout.backends("cpu") == "explicit"
    got = scheme.logits(q, k, pos, scheme.prepare(pos), 1)
    flagged = noisy_heads(plain_k, 0.125, 32)
    assert flagged.tolist() == [False, False, True, False]  # RoPE keeps a rank-one K's entropy near 0
    assert torch.allclose(got[:, ~flagged], plain[:, ~flagged], atol=1e-5)
    noisy_q, noisy_k, _ = dope_qk(plain_q, plain_k, 0.125, 32, 1)
    assert torch.allclose(got[:, 2], (noisy_q @ noisy_k.transpose(-1, -2))[:, 2] * scheme.qk_scale, atol=1e-5)
    assert not torch.allclose(got[:, 2], plain[:, 2], atol=1e-2)
    assert RopeScaling("dope").label == "dope" and RopeScaling("dope", heads=0.25, rank=8).label == "dope(heads=0.25,rank=8)"


# ---- refusals and end to end ------------------------------------------------------------------

def test_bad_settings_are_one_line(tmp_path, capsys):
    model = tiny_model("rope", train_len=16)  # 4 rotary pairs
    with pytest.raises(PosbenchError, match="dpe: 5 scales for 4 rotary pairs"):
        model.layout.set_scaling(RopeScaling("dpe", scales=(2.0,) * 5))
    with pytest.raises(PosbenchError, match="did you mean 'dope'"):
        RopeScaling("doep")
    for argv in (["--rope-scaling", "freq-bnd"], ["--rope-scaling", "dope", "--dope-heads", "2"],
                 ["--rope-scaling", "dpe", "--dpe-scales", "0.5"]):
        assert main(["extrapolate", "--runs-dir", str(tmp_path), "--lengths", "32", *argv]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 3 and all(line.startswith("error: ") for line in lines), lines


@pytest.mark.slow
def test_extrapolate_writes_rows_of_each_policy(tiny_data, tmp_path, capsys):
    """A tiny rope run and an alibi run: rope gets finite rows under dpe (scales detected on
    validation windows, said in the reason), dope and freq-band at every length; alibi none only."""
    runs = tmp_path / "runs"
    for scheme in ("rope", "alibi"):
        train(RunSpec(scheme, data=tiny_data, model=TINY_MODEL, train=TINY_TRAIN), runs, device="cpu", progress=False)
    assert main(["extrapolate", "--runs-dir", str(runs), "--lengths", "16,32", "--tokens", "64", "--rope-scaling",
                 "none,dpe,dope,freq-band", "--device", "cpu"]) == 0
    out = capsys.readouterr()
    assert "alibi take none" in out.out + out.err
    rows = results.read_rows(runs / "extrapolation.csv")
    rope = {(r["scaling"], r["eval_len"]): r for r in rows if r["scheme"] == "rope"}
    assert set(rope) == {(s, n) for s in ("none", "dpe", "dope", "freq-band") for n in ("16", "32")}
    assert all(r["status"] == "ok" and math.isfinite(float(r["ppl"])) for r in rope.values())
    assert rope[("dpe", "32")]["reason"].startswith("dpe scales ") and "detected" in rope[("dpe", "32")]["reason"]
    assert rope[("dope", "32")]["backend"] == "explicit" and rope[("freq-band", "32")]["backend"] != "explicit"
    assert {r["scaling"] for r in rows if r["scheme"] == "alibi"} == {"none"}


@pytest.mark.slow
def test_probes_of_a_trained_run_detect_dpe_on_the_prompt(tmp_path):
    from posbench.config import TrainConfig
    from posbench.data import DataConfig
    from posbench.model import ModelConfig

    runs = tmp_path / "runs"
    train(RunSpec("rope", data=DataConfig(spec="passkey"), model=ModelConfig(d_model=16, n_layers=1, n_heads=2),
                  train=TrainConfig(train_len=32, steps=2, batch_size=2, warmup=1, eval_interval=2)),
          runs, device="cpu", progress=False)
    assert main(["probe", "--runs-dir", str(runs), "--probe", "passkey", "--lengths", "32,64", "--trials", "2",
                 "--rope-scaling", "none,dpe,dope,freq-band", "--device", "cpu"]) == 0
    probes = results.read_probes(runs)
    assert {(p["scaling"], p["eval_len"]) for p in probes} == {
        (s, n) for s in ("none", "dpe", "dope", "freq-band") for n in ("32", "64")}
    assert all(p["reason"].startswith("dpe scales ") for p in probes if p["scaling"] == "dpe")


# ---- pretrained models -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """The tiny local Llama of test_pretrained (context 32, head dim 8, 4 heads on 2 key-value heads)."""
    pytest.importorskip("transformers", reason="the pretrained extra (transformers) is not installed")
    from posbench import pretrained
    from tests.test_pretrained import build

    folder = tmp_path_factory.mktemp("llama") / "tiny-llama"
    build(folder)
    return folder, pretrained.load(f"hf:{folder}")


def llama_logits(m, x: torch.Tensor) -> torch.Tensor:
    m.rotary.length = x.shape[1]
    with torch.no_grad():
        return m.model(x).logits


def per_pair_attention(rel):
    """transformers attention whose scores are q_i . R(rel[i][j][t]) k_j per pair t (q, k unrotated)."""
    def attend(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        groups = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(groups, 1).double(), value.repeat_interleave(groups, 1).double()
        t = query.shape[2]
        scores = torch.full((*query.shape[:2], t, t), -math.inf, dtype=torch.float64)
        for b in range(query.shape[0]):
            for h in range(query.shape[1]):
                hand = per_pair_logits(query[b, h].double(), key[b, h], rel, INV) * scaling
                scores[b, h] = hand.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), -math.inf)
        return (scores.softmax(-1) @ value).transpose(1, 2).to(query.dtype).contiguous(), None

    return attend


@pytest.mark.slow
def test_pretrained_dpe_reads_its_per_pair_map(llama, monkeypatch):
    """Blocks of 3 queries through the whole model: DPE's logits (scales 1, 2, 4, 4, W = 4) equal those
    of attention over the map written per pair as in the reference."""
    from transformers import AttentionInterface

    from posbench import pretrained

    _, m = llama
    scales = (1.0, 2.0, 4.0, 4.0)
    rel = [[[i - j] * 4 if i - j < 4 else [math.floor(i / s) + 4 - 4 / s - math.floor(j / s) for s in scales]
            for j in range(10)] for i in range(10)]
    x = torch.randint(0, 30, (1, 10))
    AttentionInterface.register("hand_dpe", per_pair_attention(rel))
    m.set_scaling(RopeScaling("dpe", window=4, scales=scales))
    monkeypatch.setattr(pretrained.attention, "ATTN_BYTES", 4 * 4 * 10 * 3)
    got = llama_logits(m, x)
    m.model.set_attn_implementation("hand_dpe")  # the identity rotary stays: q, k unrotated
    want = llama_logits(m, x)
    m.set_scaling(RopeScaling())
    assert (got - want).abs().max() < 1e-5
    assert (llama_logits(m, x) - want).abs().max() > 1e-4


@pytest.mark.slow
def test_pretrained_freq_band_and_dope(llama):
    """freq-band: the rotary's cos 1 and sin 0 on the pairs longer than the context (32: pairs 1..3);
    dope with no head flagged is the model itself, with its default flags another."""
    _, m = llama
    x = torch.randint(0, 30, (1, 40))
    plain = llama_logits(m, x)
    m.set_scaling(RopeScaling("freq-band"))
    cos, sin = m.rotary(torch.zeros(1), torch.arange(40)[None])
    assert torch.equal(cos[0, :, [1, 2, 3, 5, 6, 7]], torch.ones(40, 6)) and not sin[0, :, [1, 2, 3]].any()
    assert (llama_logits(m, x) - plain).abs().max() > 1e-5
    m.set_scaling(RopeScaling("dope", heads=0.0))
    assert m.backend == "sdpa" and (llama_logits(m, x) - plain).abs().max() < 1e-5
    m.set_scaling(RopeScaling("dope"))
    flagged = llama_logits(m, x)
    assert torch.isfinite(flagged).all() and (flagged - plain).abs().max() > 1e-4
    assert torch.equal(llama_logits(m, x), flagged)  # seeded: the same noise every time
    m.set_scaling(RopeScaling())


@pytest.mark.slow
def test_pretrained_commands_under_the_new_policies(llama, tmp_path):
    from tests.conftest import pretrained_task

    folder, _ = llama
    task = pretrained_task(folder, tmp_path)
    out = tmp_path / "out"
    assert main(["extrapolate", "--task", str(task), "--rope-scaling", "none,dpe,dope,freq-band", "--out", str(out)]) == 0
    rows = {(r["scaling"], r["eval_len"]): r for r in results.read_rows(out / "extrapolation.csv")}
    assert set(rows) == {(s, n) for s in ("none", "dpe", "dope", "freq-band") for n in ("32", "64")}
    assert all(r["status"] == "ok" and math.isfinite(float(r["ppl"])) for r in rows.values())
    assert "detected" in rows[("dpe", "64")]["reason"] and rows[("dope", "32")]["reason"] == ""
    assert main(["probe", "--task", str(task), "--probe", "passkey", "--lengths", "400", "--trials", "1",
                 "--rope-scaling", "dpe,dope", "--out", str(out)]) == 0
    probes = results.read_probes(out)
    assert {p["scaling"] for p in probes} == {"dpe", "dope"}
    assert all(p["reason"].startswith("dpe scales ") for p in probes if p["scaling"] == "dpe")
