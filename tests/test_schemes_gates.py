"""Forget gates and stick-breaking: `fox` adds c_i - c_j with c the running sum
of log forget gates read from each layer's input; `stickbreaking` replaces softmax. Both read no
positions; each is checked against a direct loop over the formula."""

import copy
import math
import warnings

import pytest
import torch
import torch.nn.functional as F

from conftest import tiny_model
from posbench import attention, results
from posbench.attention import Span
from posbench.cli import main
from posbench.schemes import SCHEMES, Dims
from posbench.schemes.stickbreaking import stick_breaking

B, H, D, T = 2, 2, 16, 11
SPANS = [Span(), Span("window", 4), Span("chunk", 5)]


def fox_scheme(seed: int = 0):
    torch.manual_seed(seed)
    scheme = SCHEMES["fox"](Dims(H * D, H, 2, 50, T, T))
    with torch.no_grad():  # gates well away from 1/2, different per head and token
        scheme.gate_weight.normal_(0, 0.5)
        scheme.gate_bias.normal_(1, 1)
    return scheme


def naive_fox(q, k, v, x, scheme, layer, span):
    """Softmax over allowed keys of q.k / sqrt(D) + sum_{j < m <= i} log f_m, f per token."""
    w, b = scheme.gate_weight[layer], scheme.gate_bias[layer]
    out = torch.zeros_like(q)
    for bi in range(q.shape[0]):
        for h in range(q.shape[1]):
            f = [torch.sigmoid(w[h] @ x[bi, t] + b[h]) for t in range(q.shape[2])]
            for i in range(q.shape[2]):
                keys = [j for j in range(i + 1) if span.allowed(i, j)]
                logits = torch.stack([
                    q[bi, h, i] @ k[bi, h, j] / math.sqrt(q.shape[-1])
                    + sum((torch.log(f[m]) for m in range(j + 1, i + 1)), torch.tensor(0.0))
                    for j in keys])
                attn = logits.softmax(0)
                out[bi, h, i] = sum(a * v[bi, h, j] for a, j in zip(attn, keys))
    return out


@pytest.mark.parametrize("span", SPANS)
@pytest.mark.parametrize("backend", ["explicit", "sdpa-bias"])
def test_fox_equals_a_double_loop(span, backend):
    scheme = fox_scheme()
    x = torch.randn(B, T, H * D)
    q, k, v = (torch.randn(B, H, T, D) for _ in range(3))
    with torch.no_grad():
        gate = scheme.gate(x, 1)
        ctx = attention.prepare(scheme, torch.arange(T), backend, span)
        got = attention.attend(q, k, v, scheme, ctx, 1, gate)
        want = naive_fox(q, k, v, x, scheme, 1, span)
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()


@pytest.mark.parametrize("span", SPANS)
def test_fox_score_mod_equals_the_float_mask(span):
    """The score_mod CUDA runs, through eager FlexAttention (forward only on CPU), with a span's
    BlockMask, equals the SDPA path."""
    from torch.nn.attention.flex_attention import flex_attention

    scheme = fox_scheme()
    t = 40
    x, (q, k, v) = torch.randn(B, t, H * D), (torch.randn(B, H, t, D) for _ in range(3))
    pos = torch.arange(t)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager FlexAttention warns that it is unfused
        gate = scheme.gate(x, 0)
        ctx = attention.prepare(scheme, pos, "flex", span)
        score_mod = attention.gated_score_mod(gate, ctx.score_mod)
        got = flex_attention(q, k, v, score_mod=score_mod, block_mask=ctx.block_mask,
                             scale=scheme.qk_scale)
        want = attention.attend(q, k, v, scheme, attention.prepare(scheme, pos, "sdpa-bias", span),
                                0, gate)
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()


def test_backends_chosen():
    fox, sb = (SCHEMES[n](Dims(H * D, H, 2, 50, T, T)) for n in ("fox", "stickbreaking"))
    assert attention.choose_backend(fox, "cuda") == "flex"
    assert attention.choose_backend(fox, "cpu") == attention.choose_backend(fox, "cpu", SPANS[1]) == "sdpa-bias"
    assert attention.choose_backend(SCHEMES["fox"](Dims(4 * 8, 4, 2, 50, T, T)), "cuda") == "sdpa-bias"
    assert {attention.choose_backend(sb, d, s) for d in ("cpu", "cuda") for s in SPANS} == {"explicit"}


def test_fox_with_open_gates_is_nope():
    """f = 1 everywhere (gate bias 40: log f ~ -4e-18) gives the model without gates."""
    fox = tiny_model("fox")
    none = tiny_model("none")
    missing, unexpected = none.load_state_dict(fox.state_dict(), strict=False)
    assert not missing and {k.rsplit(".", 1)[1] for k in unexpected} == {"gate_weight", "gate_bias"}
    x = torch.randint(0, 50, (2, 16))
    with torch.no_grad():
        assert not torch.allclose(fox(x), none(x), atol=1e-4)  # at init f ~ 1/2: a real decay
        fox.layout.schemes[0].gate_bias.fill_(40.0)
        assert torch.allclose(fox(x), none(x), atol=1e-6)


def test_fox_reads_no_positions():
    """Not only a shift: any positions at all give the same outputs."""
    model = tiny_model("fox")
    x = torch.randint(0, 50, (2, 16))
    scattered = torch.tensor([0, 5, 9, 40, 41, 77, 100, 101, 230, 231, 300, 512, 700, 701, 900, 1000])
    with torch.no_grad():
        assert torch.equal(model(x, torch.arange(16)), model(x, scattered))


def test_fox_gradients_reach_every_layers_gate():
    model = tiny_model("fox", n_layers=2).train()
    x = torch.randint(0, 50, (2, 16))
    model.token_losses(x, x).mean().backward()
    scheme = model.layout.schemes[0]
    for p in (scheme.gate_weight, scheme.gate_bias):
        assert p.grad is not None and (p.grad.flatten(1).abs().sum(1) > 0).all()  # each layer's row


@pytest.mark.parametrize("name", ["fox@w5/rope", "fox@c4/fox", "none/stickbreaking@w3"])
def test_in_layouts_every_path_equals_explicit_with_gradients(name):
    """Windowed and chunked layers: the float mask path and the explicit path agree, outputs and
    gradients, and a layer's gate only gets gradients through the layers that use it."""
    torch.manual_seed(1)
    fast = tiny_model(name, train_len=32).train()
    slow = copy.deepcopy(fast)
    slow.backend = "explicit"
    x = torch.randint(0, 50, (2, 19))
    la, lb = fast.token_losses(x, x).mean(), slow.token_losses(x, x).mean()
    la.backward()
    lb.backward()
    assert torch.allclose(la, lb, atol=1e-5)
    for (n, pa), (_, pb) in zip(fast.named_parameters(), slow.named_parameters()):
        assert torch.allclose(pa.grad, pb.grad, atol=1e-5, rtol=1e-4), n
    if name == "fox@w5/rope":
        gate = fast.layout.schemes[0].gate_weight.grad
        assert gate[0].abs().sum() > 0 and gate[1].abs().sum() == 0


def naive_stick_breaking(z, span):
    """From the nearest key outward: each takes sigmoid(z) of the stick that is left; what is left
    after the farthest goes to the query's own token."""
    out = torch.zeros_like(z)
    for row in range(z.shape[0]):
        for i in range(z.shape[-1]):
            stick = 1.0
            for j in range(i - 1, -1, -1):
                if span.allowed(i, j):
                    beta = torch.sigmoid(z[row, i, j])
                    out[row, i, j] = stick * beta
                    stick = stick * (1 - beta)
            out[row, i, i] = stick
    return out


def blocked_scores(z, span):
    return z.masked_fill(~span.mask(z.shape[-1], z.device), float("-inf"))


@pytest.mark.parametrize("span", SPANS)
def test_stick_breaking_equals_a_loop_from_the_nearest_key(span):
    z = torch.randn(3, T, T) * 2
    scheme = SCHEMES["stickbreaking"](Dims(H * D, H, 2, 50, T, T))
    got = scheme.weights(blocked_scores(z, span))
    want = naive_stick_breaking(z, span)
    assert torch.allclose(got, want, atol=1e-6), (got - want).abs().max()
    assert (got[~span.mask(T, "cpu").expand_as(got)] == 0).all()  # causal, and nothing out of span


def test_stick_breaking_weights_sum_to_at_most_one():
    z = blocked_scores(torch.randn(4, 64, 64) * 3, Span())
    broken = stick_breaking(z)
    total = broken.sum(-1)
    assert (broken >= 0).all() and (total <= 1 + 1e-6).all()
    assert total[:, 0].eq(0).all() and (total[:, 1:] > 0).all()  # the first token has no key
    scheme = SCHEMES["stickbreaking"](Dims(H * D, H, 2, 50, 64, 64))
    assert torch.allclose(scheme.weights(z).sum(-1), torch.ones(4, 64), atol=1e-6)


def test_stick_breaking_is_stable_at_long_lengths_with_large_logits():
    t = 1024
    torch.manual_seed(0)
    z = (torch.randn(1, 1, t, t) * 1000).requires_grad_()
    scheme = SCHEMES["stickbreaking"](Dims(H * D, H, 2, 50, 16, 16))
    attn = scheme.weights(blocked_scores(z, Span()))
    (attn * torch.randn_like(attn)).sum().backward()
    assert torch.isfinite(attn).all() and torch.isfinite(z.grad).all()
    assert torch.allclose(attn.sum(-1), torch.ones(1, 1, t), atol=1e-5)
    # sigmoid(z) rounds to 1 at z > 17: the nearest such key takes the whole stick
    first = (z[0, 0, -1, :-1] > 17).nonzero()[-1].item()
    assert attn[0, 0, -1, first].item() == pytest.approx(1.0)


def test_stick_breaking_model_reads_no_positions():
    model = tiny_model("stickbreaking")
    x = torch.randint(0, 50, (2, 16))
    with torch.no_grad():
        assert torch.equal(model(x, torch.arange(16)), model(x, torch.arange(16) * 7 + 3))
        assert torch.isfinite(model(torch.randint(0, 50, (1, 256)))).all()


def test_train_and_extrapolate_to_16x_from_the_command_line(corpus_dir, tmp_path):
    common = ["--data", f"files:{corpus_dir}", "--runs-dir", str(tmp_path), "--train-len", "16",
              "--steps", "3", "--batch-size", "4", "--d-model", "32", "--layers", "1", "--heads", "2",
              "--tokenizer", "bytes", "--device", "cpu"]
    for name in ("fox", "stickbreaking"):
        assert main(["train", "--scheme", name, *common]) == 0
    assert main(["extrapolate", "--runs-dir", str(tmp_path), "--lengths", "16,256", "--tokens", "256",
                 "--device", "cpu"]) == 0
    rows = results.read_rows(tmp_path / "extrapolation.csv")
    assert {(r["scheme"], int(r["eval_len"])) for r in rows} == {
        (s, n) for s in ("fox", "stickbreaking") for n in (16, 256)}
    assert all(r["status"] == "ok" and math.isfinite(float(r["ppl"])) for r in rows)
    backends = {r["scheme"]: r["backend"] for r in results.read_rows(tmp_path / "runs.csv")}
    assert backends == {"fox": "sdpa-bias", "stickbreaking": "explicit"}


def test_cable_equals_fox_with_negated_gate_weights():
    """-softplus(z) = log sigmoid(-z): CABLE with (W, b) is FoX with (-W, -b), through the model."""
    cable = tiny_model("cable")
    fox = tiny_model("fox")
    state = cable.state_dict()
    for key in [k for k in state if k.endswith(("gate_weight", "gate_bias"))]:
        state[key] = state[key] * 0.5 - 0.3  # gates well away from their init, then negated
    cable.load_state_dict(state)
    fox.load_state_dict({k: -v if k.endswith(("gate_weight", "gate_bias")) else v for k, v in state.items()})
    x = torch.randint(0, 50, (2, 16))
    with torch.no_grad():
        assert torch.allclose(cable(x), fox(x), atol=1e-6)
        assert not torch.allclose(cable(x), tiny_model("fox")(x), atol=1e-4)


def test_cable_bias_is_the_papers_sum_of_softplus():
    """bias(i, j) = -sum_{r = j+1..i} softplus(w . x_r + b), per head, <= 0 (axiomlab/Cable)."""
    torch.manual_seed(0)
    scheme = SCHEMES["cable"](Dims(H * D, H, 2, 50, T, T))
    with torch.no_grad():
        scheme.gate_bias.normal_(0, 1)
    x = torch.randn(B, T, H * D)
    with torch.no_grad():
        got = attention.gate_bias(scheme.gate(x, 1))  # (B, H, T, T)
        z = x @ scheme.gate_weight[1].T + scheme.gate_bias[1]  # (B, T, H)
    for i, j in [(0, 0), (5, 2), (10, 0), (7, 6)]:
        want = -F.softplus(z[:, j + 1:i + 1]).sum(1)  # (B, H)
        assert torch.allclose(got[:, :, i, j], want, atol=1e-5)
    assert (got.tril() <= 0).all()
    # at init (b = 0, w small) about -ln 2 per token of distance
    fresh = SCHEMES["cable"](Dims(H * D, H, 2, 50, T, T))
    with torch.no_grad():
        per_token = attention.gate_bias(fresh.gate(x * 0.1, 0))[:, :, T - 1, 0] / (T - 1)
    assert torch.allclose(per_token, torch.full_like(per_token, -math.log(2)), atol=0.01)


@pytest.mark.parametrize("name", ["fox", "cable", "path-fox"])
def test_gate_biases_take_no_weight_decay(name):
    """The gate bias is (layers, heads), 2-D, yet out of weight decay as the references keep it;
    the gate weights, and the model's matrices, decay."""
    from posbench.config import TrainConfig
    from posbench.training import make_optimizer

    model = tiny_model(name)
    opt = make_optimizer(model, TrainConfig(weight_decay=0.1))
    decay = {id(p) for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    scheme = model.layout.schemes[0]
    scheme = getattr(scheme, "forget", scheme)  # path-fox holds fox's gate inside
    assert scheme.gate_bias.dim() == 2 and id(scheme.gate_bias) not in decay
    assert id(scheme.gate_weight) in decay and id(model.head.weight) in decay
    assert sum(len(g["params"]) for g in opt.param_groups) == len(list(model.parameters()))
    with torch.no_grad():  # a step with zero gradients moves decayed tensors only
        scheme.gate_bias.fill_(1.0)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    assert torch.equal(scheme.gate_bias, torch.ones_like(scheme.gate_bias))
