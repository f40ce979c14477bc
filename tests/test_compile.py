"""The compiled training forward (posbench.device.TrainingForward): one graph per scheme, with no
read of a position back from the device, and no recompilation within a run or across the runs of
a grid. Traced with dynamo's eager backend, which runs on CPU in seconds; tests/test_train.py
compares compiled (inductor) and eager loss curves."""

import dataclasses

import pytest
import torch
import torch._dynamo

from conftest import TINY_TRAIN, tiny_model
from posbench import batches, layout
from posbench.positions import sorted_draw, training_bound
from posbench.schemes import SCHEMES
from posbench.schemes.base import PositionLimitError
from posbench.device import TrainingForward

pytestmark = pytest.mark.slow  # a graph traced per scheme, seconds each: the fast tier (-m 'not slow') leaves it out
T, BOUND = 16, 64
# learned and tupe hold a table of max_position (T) rows; recurrent integrates its positions step
# by step, which dynamo unrolls (23 s at 64): these take the bound T.
AT_T = ("learned", "tupe", "recurrent")
NAMES = sorted(SCHEMES) + sorted(layout.PRESETS) + ["rope+sink", "none+gate"]


def reserved(name: str):
    model = tiny_model(name, train_len=T).train()
    bound = T if name in AT_T else BOUND
    model.reserve_positions(bound, T)
    return model, bound


@pytest.mark.parametrize("name", NAMES)
def test_compiled_training_forward_is_one_graph_equal_to_eager(name):
    """Every scheme and preset, at 0..T-1 and at a sorted draw below the bound: dynamo traces the
    training forward as one graph (a max(pos) read back, as `int(pos.max())` in a table lookup,
    would split it and wait for the device each step), and the traced forward gives eager's
    losses."""
    model, bound = reserved(name)
    x = torch.randint(0, 50, (2, T), generator=torch.Generator().manual_seed(0))
    for pos in (None, sorted_draw(bound, T, torch.Generator().manual_seed(1))):
        torch._dynamo.reset()
        explained = torch._dynamo.explain(model)(x, pos, x)
        assert explained.graph_break_count == 0, [r.reason.splitlines()[0] for r in explained.break_reasons]
        torch._dynamo.reset()
        traced = torch.compile(model, backend="eager", dynamic=False)
        assert torch.allclose(traced(x, pos, x), model(x, pos, x), atol=1e-6)


def test_reserving_positions_past_a_table_is_refused_before_training():
    """The bound is checked eagerly, with the scheme's own message: inside a compiled graph an
    index past the table would fail on the device, far from its cause."""
    model = tiny_model("learned", train_len=T)
    with pytest.raises(PositionLimitError, match="position 63 is beyond its table of 16"):
        model.reserve_positions(BOUND, T)


def test_reserved_tables_hold_the_bound_and_eager_reads_positions():
    """reserve_positions grows tables to the bound (so the graph never rebuilds one), and outside
    a compiled graph a scheme still reads its positions: an eager forward past the bound of a
    learned table fails with the scheme's message, as before."""
    model, _ = reserved("rope")
    scheme = model.layout.schemes[0]
    assert scheme.position_bound == BOUND
    assert all(table.table.shape[0] >= BOUND for table in scheme._tables.values())
    learned, _ = reserved("learned")
    with pytest.raises(PositionLimitError):
        learned(torch.zeros(1, 2, dtype=torch.long), torch.tensor([0, T]))


def test_a_grid_compiles_each_run_once_without_recompiling(monkeypatch):
    """Runs of a grid share a process: each TrainingForward starts from an empty dynamo cache,
    so a ninth scheme still compiles (torch's limit of 8 entries per frame would send it back
    to eager unnoticed), and steps at new drawn positions reuse the run's one graph."""
    compile_ = torch.compile
    monkeypatch.setattr(torch, "compile", lambda net, **kw: compile_(net, backend="eager", **kw))
    names = ["none", "rope", "alibi", "t5", "kerple", "fire", "xl", "sinusoidal", "sandwich", "rnope-swa"]
    x = torch.randint(0, 50, (2, T))
    with torch._dynamo.config.patch(error_on_recompile=True):
        for name in names:
            model = tiny_model(name, train_len=T).train()
            net = TrainingForward(model, "on", torch.device("cpu"))
            assert net.status == "on"
            model.reserve_positions(BOUND, T)
            for step in range(3):
                pos = sorted_draw(BOUND, T, torch.Generator().manual_seed(step))
                net(x, pos, targets=x).mean().backward()


def test_every_batch_position_is_below_its_source_bound(tiny_data):
    """The bound a source declares holds its batches: plain, randomized, PoSE and probe examples."""
    from posbench.data import load_tokens

    data = load_tokens(tiny_data)
    t = dataclasses.replace(TINY_TRAIN, randomize_positions=True, randomize_max=40)
    sources = [batches.LMWindows(data.train, data.valid, TINY_TRAIN),
               batches.LMWindows(data.train, data.valid, t),
               batches.PoseWindows(data.train, data.valid, TINY_TRAIN, 48)]
    assert [s.bound for s in sources] == [T, 40, 48] == [training_bound(TINY_TRAIN), 40, 48]
    gen = torch.Generator().manual_seed(0)
    for source in sources:
        seen = 0
        for _ in range(20):
            pos = source.sample(gen).positions
            seen = max(seen, T if pos is None else int(pos.max()) + 1)
        assert T <= seen <= source.bound
    assert seen > 2 * T  # PoSE reaches past the window


@pytest.mark.parametrize("name", ["alibi", "t5", "kerple", "fire", "fox", "stickbreaking", "rope@w", "rnope-swa"])
def test_compiled_flex_forward_is_one_graph(name):
    """The FlexAttention path that CUDA takes (score_mod, gates, a window's BlockMask), traced
    forward on CPU, where FlexAttention has no backward: one graph, as on the SDPA paths."""
    import warnings

    from posbench.model import ModelConfig, Transformer
    from posbench.schemes import Dims

    depth = max(2, len(layout.parse(name).pattern))
    dims = Dims(d_model=64, n_heads=4, n_layers=depth, vocab_size=50, train_len=64, max_position=64)
    torch.manual_seed(0)
    model = Transformer(ModelConfig(50, 64, depth, 4), layout.build(name, dims)).train()
    model.backend = "flex"  # head dim 16: FlexAttention's smallest
    model.reserve_positions(BOUND, 64)
    x = torch.randint(0, 50, (2, 64))
    torch._dynamo.reset()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager FlexAttention on CPU warns that it is unfused
        explained = torch._dynamo.explain(model)(x, None, x)
    assert explained.graph_break_count == 0, [r.reason.splitlines()[0] for r in explained.break_reasons]


# rope+sink: the log-sum-exp FlexAttention returns, which inductor's CPU kernel does not give (so
# the test above cannot compile it on CPU)
@pytest.mark.parametrize("name", ["alibi", "fox", "rnope-swa", "rope+sink", "alibi+sink+gate"])
def test_flex_traces_inside_the_compiled_model(name):
    """In a compiled model FlexAttention is traced with the graph around it (no nested
    torch.compile, which set compiler config inside the trace: a graph break in torch 2.15) and
    gives the explicit path's output. aot_eager: AOT autograd's graph run eagerly, since
    inductor's CPU FlexAttention kernel does not lower inside a larger graph (on CUDA the Triton
    kernel does; tests/test_train.py trains so there)."""
    import warnings

    from posbench.model import ModelConfig, Transformer
    from posbench.schemes import Dims

    depth = max(2, len(layout.parse(name).pattern))
    dims = Dims(d_model=64, n_heads=4, n_layers=depth, vocab_size=50, train_len=64, max_position=64)
    torch.manual_seed(0)
    model = Transformer(ModelConfig(50, 64, depth, 4), layout.build(name, dims)).eval()
    model.reserve_positions(64, 64)
    x = torch.randint(0, 50, (2, 64))
    torch._dynamo.reset()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager FlexAttention on CPU warns that it is unfused
        model.backend = "explicit"
        want = model(x, None, x)
        model.backend = "flex"
        with torch._dynamo.config.patch(error_on_recompile=True):
            got = torch.compile(model, backend="aot_eager", dynamic=False, fullgraph=True)(x, None, x)
    assert torch.allclose(got, want, atol=1e-4), (got - want).abs().max()
