"""Golden logs (posbench.golden): a run compares to the bit on the golden's machine kind, so one
ulp of one initial weight fails it; on another kind it compares within the tolerance."""

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from posbench import golden, training
from posbench.config import TrainConfig
from posbench.data import DataConfig
from posbench.model import ModelConfig
from posbench.runs import RunSpec

pytestmark = pytest.mark.slow  # end to end: the fast tier (-m 'not slow') leaves it out

ROOT = Path(__file__).parents[1]
TINY = RunSpec("rope", data=DataConfig("mqar"), model=ModelConfig(d_model=16, n_layers=1, n_heads=2),
               train=TrainConfig(train_len=32, steps=12, batch_size=4, warmup=2, eval_interval=6,
                                 checkpoint_interval=6), task="golden")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("golden") / "tiny.json"
    golden.record(TINY, path, "tiny")
    return path


def one_ulp_off(monkeypatch):
    """Every model built from now on has its first attention weight one ulp above its draw."""
    build = training.build_model

    def perturbed(spec, vocab):
        model = build(spec, vocab)
        with torch.no_grad():
            w = model.blocks[0].attn.qkv.weight.view(-1)
            w[0] = torch.nextafter(w[0], torch.tensor(math.inf))
        return model

    monkeypatch.setattr(training, "build_model", perturbed)


def test_the_unchanged_run_matches_to_the_bit(recorded):
    raw = json.loads(recorded.read_text())
    assert len(raw["log"]) == 12 and raw["log"][5]["val_accuracy"] is not None and "seconds" not in raw["log"][0]
    verdict = golden.check(recorded)
    assert verdict.ok and verdict.exact, verdict.line
    assert "exact, this machine is of the golden's kind" in verdict.line


def test_one_ulp_of_one_initial_weight_fails_the_exact_comparison(recorded, monkeypatch):
    one_ulp_off(monkeypatch)
    verdict = golden.check(recorded)
    assert verdict.exact and not verdict.ok
    # In 12 steps the float32 losses round alike; the final weights do not.
    assert "FAILED: every logged value is equal, but the final weights differ" in verdict.line
    assert "refresh" in verdict.line


def test_another_machine_kind_compares_within_the_tolerance(recorded, tmp_path, monkeypatch):
    raw = json.loads(recorded.read_text())
    raw["machine"].update(kind="avx2x2-00000000", detail="another CPU")
    other = tmp_path / "other.json"
    other.write_text(json.dumps(raw))
    one_ulp_off(monkeypatch)  # last bits differ, as on another kind: within the tolerance
    verdict = golden.check(other)
    assert verdict.ok and not verdict.exact and "within tolerance" in verdict.line and "another CPU" in verdict.line
    found = raw["log"][5]["val_accuracy"]
    raw["log"][5]["val_accuracy"] = found + 0.08 if found < 0.5 else found - 0.08  # 8 points: within it
    other.write_text(json.dumps(raw))
    assert golden.check(other).ok
    raw["log"][5]["val_accuracy"] = found + 0.12 if found < 0.5 else found - 0.12  # 12 points: beyond it
    other.write_text(json.dumps(raw))
    verdict = golden.check(other)
    assert not verdict.ok and "step 6 val_accuracy" in verdict.line
    raw["log"][5]["val_accuracy"] = found
    raw["log"][7]["loss"] *= 1 + 2 * golden.TOLERANCE["loss"]  # beyond it
    other.write_text(json.dumps(raw))
    verdict = golden.check(other)
    assert not verdict.ok and "step 8 loss" in verdict.line
    raw["log"].pop()  # a log of another length fails on every kind
    other.write_text(json.dumps(raw))
    assert "11 steps" in golden.check(other).line


def test_the_script_checks_a_folder_and_refuses_a_damaged_file(recorded, tmp_path, capsys):
    folder = tmp_path / "golden"
    folder.mkdir()
    (folder / "tiny.json").write_text(recorded.read_text())
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "golden.py"), "check", "--dir", str(folder)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "golden tiny" in done.stdout and "exact" in done.stdout, done.stderr
    loader = importlib.util.spec_from_file_location("golden_script", ROOT / "scripts" / "golden.py")
    script = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(script)
    assert script.main(["check", "--dir", str(folder), "--only", "nope"]) == 2
    assert "no golden run 'nope'" in capsys.readouterr().err
    (folder / "tiny.json").write_text('{"name": "tiny"}')
    assert script.main(["check", "--dir", str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unreadable golden file" in err
    assert script.main(["check", "--dir", str(tmp_path / "nowhere")]) == 2
    assert "no golden files" in capsys.readouterr().err


def test_the_committed_golden_files_are_the_golden_runs():
    """results/baseline/golden holds one file per golden run, of that run's spec (a change of the
    specs needs a refresh), made on a named machine kind."""
    folder = ROOT / "results" / "baseline" / "golden"
    assert sorted(p.stem for p in folder.glob("*.json")) == sorted(golden.GOLDEN)
    for name, spec in golden.GOLDEN.items():
        raw = golden.load(folder / f"{name}.json")
        assert raw["spec"] == json.loads(json.dumps(spec.to_json())) and raw["run_id"] == spec.run_id
        assert len(raw["log"]) == spec.train.steps and raw["machine"]["kind"] and raw["machine"]["torch"]
