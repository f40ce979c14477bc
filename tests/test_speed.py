"""posbench.timing (`posbench speed`) on tiny sizes: rows, ratios, keyed CSV, plot, failures as rows, bad input."""

import pytest
import torch
from rich.console import Console

from posbench import attention, layout, results
from posbench import timing as speed
from posbench.errors import PosbenchError
from posbench.schemes import SCHEMES

TINY = dict(lengths=[16, 32], batch_size=1, heads=2, head_dim=8, repeats=2)


@pytest.fixture(autouse=True)
def quick_timing(monkeypatch):
    """One warm-up call and one call per block, on one thread (tiny ops on two threads of a busy
    machine wait on each other): the numbers are noise, the plumbing is not."""
    monkeypatch.setattr(speed, "WARMUP", 1)
    monkeypatch.setattr(speed, "MIN_BLOCK_S", 0.0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("speed")


def test_rows_for_every_scheme_length_and_pass_with_none_as_baseline(out_dir):
    rows = speed.run_speed(schemes=["rope", "alibi"], device="cpu", out_dir=out_dir, **TINY)
    assert len(rows) == 3 * 2 * 2  # none joins uninvited
    assert {(r["scheme"], r["seq_len"], r["pass"]) for r in rows} == {
        (s, n, p) for s in ("none", "rope", "alibi") for n in (16, 32) for p in speed.PASSES}
    for r in rows:
        assert r["status"] == "ok", r
        assert r["median_ms"] > 0 and r["iqr_ms"] >= 0 and r["peak_mem_mb"] > 0
        assert r["tflops"] > 0 and r["tokens_per_second"] > 0
        assert r["device"] == "cpu" and r["dtype"] == "float32"
        if r["scheme"] == "none":
            assert r["ratio_vs_none"] == 1.0
        else:
            none = next(b for b in rows if b["scheme"] == "none" and b["pass"] == r["pass"]
                        and b["seq_len"] == r["seq_len"])
            assert r["ratio_vs_none"] == pytest.approx(r["median_ms"] / none["median_ms"])
    by_scheme = {r["scheme"]: r["backend"] for r in rows}
    assert by_scheme == {"none": "sdpa-causal", "rope": "sdpa-causal", "alibi": "sdpa-bias"}

    assert (out_dir / "speed.png").stat().st_size > 0
    written = results.read_rows(results.table_path(out_dir, "speed"))
    assert len(written) == len(rows)


def test_repeated_run_replaces_rows_instead_of_adding(out_dir):
    speed.run_speed(schemes=["rope", "alibi"], device="cpu", out_dir=out_dir, **TINY)
    speed.run_speed(schemes=["rope"], device="cpu", out_dir=out_dir, **TINY)
    written = results.read_rows(results.table_path(out_dir, "speed"))
    keys = [tuple(r[k] for k in results.TABLES["speed"]["key"]) for r in written]
    assert len(keys) == len(set(keys)) == 12


def test_every_registered_scheme_runs_through_the_harness():
    rows = speed.run_speed(schemes=None, device="cpu", out_dir=None,
                           **{**TINY, "lengths": [24], "repeats": 1})
    assert {r["scheme"] for r in rows} == set(SCHEMES)
    bad = [(r["scheme"], r["pass"], r["reason"]) for r in rows if r["status"] != "ok"]
    assert not bad
    limited = {r["scheme"] for r in rows if r["reason"]}
    assert limited == {n for n, cls in SCHEMES.items()
                       if cls.position_limit is not SCHEMES["none"].position_limit}


def test_bfloat16_autocast():
    rows = speed.run_speed(schemes=["alibi"], dtype="bfloat16", device="cpu", out_dir=None,
                           backward=False, **{**TINY, "lengths": [16], "repeats": 1})
    assert [r["pass"] for r in rows] == ["fwd", "fwd"]
    assert all(r["status"] == "ok" and r["dtype"] == "bfloat16" for r in rows)


def test_a_scheme_that_fails_gets_rows_with_the_reason(monkeypatch):
    """rope cannot be built at an odd head dim; learned (its table cut short here) stops at the
    length past its table; `none` still runs everywhere."""
    monkeypatch.setattr(SCHEMES["learned"], "position_limit", lambda self: 20)
    rows = speed.run_speed(schemes=["rope", "learned"], device="cpu", out_dir=None,
                           **{**TINY, "head_dim": 7, "repeats": 1})
    status = {(r["scheme"], r["seq_len"], r["pass"]): (r["status"], r["reason"]) for r in rows}
    for p in speed.PASSES:
        assert status[("none", 32, p)][0] == "ok"
        assert status[("learned", 16, p)][0] == "ok"
        assert status[("learned", 32, p)] == ("unsupported", status[("learned", 32, p)][1])
        assert "beyond its table" in status[("learned", 32, p)][1]
        assert status[("rope", 16, p)][0] == "unsupported"
        assert "even head dimension" in status[("rope", 16, p)][1]
    assert all("ratio_vs_none" not in r for r in rows if r["status"] != "ok")


@pytest.mark.parametrize("kwargs, message", [
    ({"schemes": ["rop"]}, "did you mean 'rope'"),
    ({"schemes": []}, "empty"),
    ({"lengths": [16, 1]}, "lengths must be >= 2"),
    ({"lengths": ["x"]}, "bad lengths"),
    ({"dtype": "float16"}, "unknown dtype"),
    ({"device": "tpu"}, "unknown device"),
    ({"heads": 0}, "heads must be >= 1"),
    ({"repeats": 0}, "repeats must be >= 1"),
    ({"compile": "yes"}, "unknown compile setting"),
])
def test_bad_input_is_one_clear_error(kwargs, message):
    with pytest.raises(PosbenchError, match=message):
        speed.run_speed(**{**TINY, "out_dir": None, **kwargs})


def traced_by_dynamo(monkeypatch):
    """torch.compile as training calls it, but with dynamo's eager backend (seconds on CPU, not
    inductor's minutes): what is compiled is recorded."""
    compiled = []
    real = torch.compile

    def compile(module, **kwargs):
        compiled.append(module)
        return real(module, backend="eager", **kwargs)

    monkeypatch.setattr(torch, "compile", compile)
    return compiled


def test_rows_say_compiled_or_eager_and_auto_is_eager_on_cpu(monkeypatch):
    """compile=auto leaves CPU eager, as training does; compile=on compiles every scheme's layer
    (one graph per length and pass, within the warm-up) and gives the same outputs as eager."""
    compiled = traced_by_dynamo(monkeypatch)
    small = {**TINY, "lengths": [16], "repeats": 1}
    rows = speed.run_speed(schemes=["t5"], device="cpu", out_dir=None, backward=False, **small)
    assert {r["compile"] for r in rows} == {"off"} and not compiled
    rows = speed.run_speed(schemes=["rope", "t5"], device="cpu", out_dir=None, compile="on", **small)
    assert {(r["scheme"], r["compile"], r["status"]) for r in rows} == {
        (s, "on", "ok") for s in ("none", "rope", "t5")}
    assert len(compiled) == 3
    layer = compiled[-1]  # t5's, its position bound reserved
    assert layer.layout.schemes[0].position_bound == 16
    idx, pos = torch.randint(0, speed.VOCAB, (1, 16)), torch.arange(16)
    with torch.no_grad():
        assert torch.allclose(torch.compile(layer, dynamic=False)(idx, pos), layer(idx, pos), atol=1e-6)


def test_a_layer_that_fails_to_compile_is_timed_eager_and_says_so(monkeypatch, capsys):
    def refuses(module, **kwargs):
        def call(*args, **kw):
            raise RuntimeError("the compiler refused")
        return call

    monkeypatch.setattr(torch, "compile", refuses)
    rows = speed.run_speed(schemes=["alibi"], device="cpu", out_dir=None, compile="on",
                           **{**TINY, "repeats": 1})
    assert {(r["compile"], r["status"]) for r in rows} == {("fallback", "ok")}
    assert "the compiler refused" in capsys.readouterr().err


def test_peak_tracker_counts_live_storages():
    with speed.PeakTracker() as tracker:
        a = torch.ones(1000)  # 4000 bytes
        b = a * 2  # 4000 more
        view = b[:10]  # a view holds nothing new
        del a
        c = b + 1  # the freed 4000 come back off first
    assert tracker.peak == 8000
    assert tracker.live == 8000
    del view, b, c


def test_attention_flops():
    assert speed.attention_flops(2, 8, 256, 64, "fwd") == 2 * 2 * 8 * 256**2 * 64
    assert speed.attention_flops(2, 8, 256, 64, "fwd+bwd") == 3.5 * 2 * 2 * 8 * 256**2 * 64


def test_table_shows_every_scheme_and_length():
    rows = speed.run_speed(schemes=["t5"], device="cpu", out_dir=None, **{**TINY, "repeats": 1})
    console = Console(record=True, width=200)
    speed.print_speed(rows, console)
    text = console.export_text()
    assert "fwd+bwd" in text and "sdpa-bias" in text and "1.00x" in text
    for name in ("none", "t5", "16", "32"):
        assert name in text


def test_measures_the_backend_the_model_uses():
    layer = speed.SchemeLayer(layout.build("alibi", speed.Dims(16, 2, 1, 50, 16, 16)),
                              speed.ModelConfig(vocab_size=speed.VOCAB, d_model=16, n_layers=1,
                                                n_heads=2))
    scheme = layer.layout.schemes[0]
    assert layer.backend("cpu") == attention.choose_backend(scheme, "cpu") == "sdpa-bias"
    assert layer.backend("cuda") == attention.choose_backend(scheme, "cuda")


def test_schemes_take_turns_block_by_block(monkeypatch):
    """Every scheme of a (length, pass) times one block per round, so a slow spell of the machine
    lands on all of them; a scheme that fails becomes its own row and the others go on."""
    import itertools
    import time

    monkeypatch.setattr(speed, "WARMUP", 2)
    monkeypatch.setattr(speed, "MIN_BLOCK_S", 0.004)
    order = []

    def sleeper(name, seconds):
        def call():
            order.append(name)
            time.sleep(seconds)
        return call

    def broken():
        order.append("c")
        raise RuntimeError("kernel refused")

    calls = {"a": sleeper("a", 0.001), "b": sleeper("b", 0.002), "c": broken}
    out = speed._measure(calls, torch.device("cpu"), repeats=3)
    runs = [name for name, _ in itertools.groupby(order)]
    # warm-ups (a, a, b, b, one failing c), then 3 rounds of a-block, b-block, then each peak call
    assert runs == ["a", "b", "c"] + ["a", "b"] * 3 + ["a", "b"]
    assert out["c"] == {"status": "failed", "reason": "RuntimeError: kernel refused"}
    assert out["a"]["status"] == out["b"]["status"] == "ok"
    assert out["a"]["median_ms"] > 0.95 and out["b"]["median_ms"] > 1.9  # per call, not per block


def test_every_api_name_stays_the_function_once_every_module_is_imported():
    """A submodule named like an API function would replace it on the package once imported
    (`posbench.speed` was the timing module after a grid ran): no module takes those names."""
    import importlib
    import pkgutil

    import posbench

    for module in pkgutil.walk_packages(posbench.__path__, "posbench."):
        importlib.import_module(module.name)
    for name in posbench.API:
        assert callable(getattr(posbench, name)), name
        assert getattr(posbench, name).__module__ == f"posbench.commands.{name}", name


def test_the_gpu_table_in_gpu_md_is_written_from_results_speed():
    from posbench import gpu_table

    assert gpu_table.current() == gpu_table.markdown(), \
        "posbench/docs/gpu.md drifted from results/speed/speed.csv: python -m posbench.gpu_table rewrites it"


def test_the_gpu_table_shows_each_row_and_the_targets_verdicts(tmp_path):
    """Rows as `posbench speed` writes them to CSV and reads them back: CPU rows are left out, each
    CUDA row is a cell, and each target is met or missed at each length."""
    from posbench import gpu_table

    cpu = speed.run_speed(schemes=["rope"], device="cpu", out_dir=tmp_path, backward=False,
                          **{**TINY, "lengths": [16], "repeats": 1})
    base = {**cpu[0], "device": "cuda", "device_name": "NVIDIA H200", "dtype": "bfloat16", "compile": "on"}
    cuda = [{**base, "scheme": s, "backend": b, "pass": p, "median_ms": ms, "ratio_vs_none": ms / 2.0}
            for s, b, p, ms in [("none", "sdpa-causal", "fwd", 2.0), ("none", "sdpa-causal", "fwd+bwd", 2.0),
                                ("rope", "sdpa-causal", "fwd", 2.2), ("t5", "flex", "fwd+bwd", 5.0)]]
    results.merge_rows(tmp_path, "speed", cuda)
    text = gpu_table.markdown(results.read_rows(results.table_path(tmp_path, "speed")))
    assert "No GPU measurement" not in text and "| none | sdpa-causal | off |" not in text
    assert "NVIDIA H200, bfloat16, batch 1, 2 heads of 8" in text
    assert "| scheme | path | compile | fwd 16 | fwd+bwd 16 |" in text
    assert "| rope | sdpa-causal | on | 2.2 (1.10x) |  |" in text
    assert "| t5 | flex | on |  | 5 (2.50x) |" in text
    assert "- rope fwd within 1.2x: 16: 1.10x, met" in text
    assert "- t5 fwd+bwd within 2x: 16: 2.50x, missed" in text
    assert "stickbreaking" not in text  # no row, no verdict
    assert "No GPU measurement" in gpu_table.markdown([])
