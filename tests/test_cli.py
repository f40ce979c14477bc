"""End-to-end CLI tests on tiny settings; user errors are one line on stderr, never a traceback."""

import json
import subprocess
import sys

import pytest

from posbench.cli import main
from posbench import results


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "posbench", *args], capture_output=True, text=True, timeout=300)


TINY = ["--train-len", "16", "--steps", "4", "--batch-size", "4", "--d-model", "32", "--layers", "1",
        "--heads", "2", "--tokenizer", "bytes", "--device", "cpu"]


@pytest.mark.slow
@pytest.mark.parametrize("args, message", [
    (["train", "--scheme", "rpoe"], "did you mean 'rope'"),
    (["train", "--scheme", "rope", "--steps", "0"], "steps must be > 0"),
    (["train", "--scheme", "rope", "--steps", "many"], "Invalid value for '--steps'"),
    (["train", "--scheme", "rope", "--data", "files:/no/such/dir/*.txt"], "no readable files"),
    (["train", "--scheme", "rope", "--param", "bsae=5"], "did you mean 'base'"),
    (["train", "--scheme", "rope", "--task", "qiuck"], "did you mean 'quick'"),
    (["train", "--scheme", "rope", "--compile", "of"], "did you mean 'off'"),
    (["schemes", "--format", "xml"], "Invalid value for '--format'"),
])
def test_bad_input_one_line_no_traceback(args, message):
    proc = run_cli(*args)
    assert proc.returncode != 0
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_help_imports_no_torch():
    """`posbench --help` and every command's --help answer without importing torch (it loads when a
    command computes): asserted in a fresh interpreter, which imports the command line and renders
    every help page."""
    code = ("import contextlib, io, sys\n"
            "from posbench import cli, commands\n"
            "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
            "    codes = [cli.main(['--help'])] + [cli.main([name, '--help']) for name in commands.NAMES]\n"
            "assert set(codes) == {0}, codes\n"
            "assert out.getvalue().count('Usage:') == len(commands.NAMES) + 1\n"
            "print(sorted(m for m in sys.modules if m.partition('.')[0] == 'torch')[:5])\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", f"torch imported by --help: {proc.stdout}"


def test_schemes_formats(capsys):
    assert main(["schemes", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    names = {r["name"] for r in rows}
    assert {"none", "learned", "sinusoidal", "rope", "alibi", "t5"} <= names
    assert all(r["reference"] and r["family"] for r in rows)
    assert main(["schemes", "--format", "csv"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("name,family,hooks") and len(out) == len(rows) + 1
    assert main(["schemes"]) == 0
    assert "rope" in capsys.readouterr().out


def test_schemes_lists_every_rope_policy(capsys):
    """`posbench schemes --policies`: every policy --rope-scaling (and extend's longrope) takes, each
    with a formula, a reference and settings that are extrapolate's own flags."""
    import typer

    from posbench.cli import app
    from posbench.policies import POLICIES

    assert main(["schemes", "--policies", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["policy"] for r in rows] == list(POLICIES)
    assert {"freq-band", "dpe", "dope", "yarn", "self-extend", "longrope"} <= set(POLICIES)
    assert all(r["formula"] and r["reference"] and r["source"] == "built-in" for r in rows)
    flags = {o for p in typer.main.get_command(app).commands["extrapolate"].params for o in p.opts}
    named = {w.strip(";,") for r in rows for w in r["settings"].split() if w.startswith("--")}
    assert named and named <= flags, named - flags
    assert main(["schemes", "--policies", "--format", "markdown"]) == 0
    out = capsys.readouterr().out
    assert "\n| policy | formula | reference | settings | source |\n" in out
    assert all(f"\n## {name}\n" in out for name in POLICIES)
    assert main(["schemes", "--policies"]) == 0
    assert "RoPE policies" in capsys.readouterr().out


def test_train_end_to_end(corpus_dir, tmp_path, capsys):
    args = ["train", "--scheme", "alibi", "--data", f"files:{corpus_dir}", "--runs-dir", str(tmp_path), *TINY]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "validation loss" in out and "unigram model" in out
    rows = results.read_rows(tmp_path / "runs.csv")
    assert [r["scheme"] for r in rows] == ["alibi"] and rows[0]["backend"] == "sdpa-bias"
    assert rows[0]["compile"] == "off" and float(rows[0]["model_flops_per_second"]) > 0
    assert rows[0]["mfu"] == ""  # no known peak for a CPU
    assert main(args + ["--resume"]) == 0
    assert "already trained" in capsys.readouterr().out
    assert len(results.read_rows(tmp_path / "runs.csv")) == 1


@pytest.mark.slow
def test_train_corrupt_checkpoint_cli(corpus_dir, tmp_path):
    args = ["train", "--scheme", "rope", "--data", f"files:{corpus_dir}", "--runs-dir", str(tmp_path), *TINY]
    assert main(args) == 0
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    (run_dir / "checkpoint.safetensors").write_bytes(b"not a checkpoint")
    (run_dir / "model.safetensors").unlink()
    proc = run_cli(*args, "--resume")
    assert proc.returncode == 2 and "corrupt checkpoint" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_speed_end_to_end(tmp_path, capsys):
    args = ["speed", "--schemes", "alibi,rope", "--lengths", "16,32", "--heads", "2", "--head-dim", "8",
            "--repeats", "2", "--device", "cpu", "--out", str(tmp_path)]
    assert main(args) == 0
    assert "ratio to none" in capsys.readouterr().out
    rows = results.read_rows(tmp_path / "speed.csv")
    assert len(rows) == 3 * 2 * 2  # none joins; two lengths; fwd and fwd+bwd
    assert all(float(r["ratio_vs_none"]) == 1.0 for r in rows if r["scheme"] == "none")
    assert (tmp_path / "speed.png").exists()
    assert main(args) == 0 and len(results.read_rows(tmp_path / "speed.csv")) == 12  # keyed: no duplicates
    assert main(["speed", "--schemes", "alibbi"]) == 2


@pytest.mark.slow
def test_layouts_train_extrapolate_and_speed_end_to_end(corpus_dir, tmp_path, capsys):
    """A preset and a free-form layout go through train, extrapolate and speed; rows name them."""
    common = ["--data", f"files:{corpus_dir}", "--runs-dir", str(tmp_path), *TINY, "--layers", "4"]
    assert main(["train", "--scheme", "rnope-swa", *common]) == 0
    assert main(["train", "--scheme", "rope:base=500@c8/none+logn", *common]) == 0
    runs = {r["scheme"]: r for r in results.read_rows(tmp_path / "runs.csv")}
    assert set(runs) == {"rnope-swa", "rope:base=500.0@c8/none+logn"}
    assert runs["rnope-swa"]["params"] == "rope@w4*3/none"
    assert runs["rnope-swa"]["backend"] == "sdpa-mask+sdpa-causal"
    assert main(["extrapolate", "--runs-dir", str(tmp_path), "--lengths", "16,32", "--tokens", "64",
                 "--scheme", "rnope-swa,rope:base=500@c8/none+logn", "--device", "cpu"]) == 0
    rows = results.read_rows(tmp_path / "extrapolation.csv")
    assert {r["scheme"] for r in rows} == set(runs) and len(rows) == 4
    assert all(r["status"] == "ok" for r in rows)
    capsys.readouterr()
    assert main(["speed", "--schemes", "rnope-swa", "--lengths", "16", "--heads", "2", "--head-dim", "8",
                 "--repeats", "1", "--no-backward", "--device", "cpu", "--out", str(tmp_path)]) == 0
    speed_rows = {r["scheme"]: r for r in results.read_rows(tmp_path / "speed.csv")}
    assert speed_rows["rnope-swa"]["backend"] == "sdpa-mask+sdpa-causal"
    assert main(["train", "--scheme", "rope@w4@c4", *common]) == 2
    assert "more than one span" in capsys.readouterr().err
