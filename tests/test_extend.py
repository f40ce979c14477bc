"""Extension by fine-tuning (posbench/docs/extension.md): rescalings against their references, PoSE's
positions, Self-Extend's and ReRoPE's logit maps against hand-computed relative positions, equal
budgets, children as runs (resume, missing parents, bad pairings) and the commands end to end."""

import dataclasses
import json
import math

import pytest
import torch

from conftest import TINY_MODEL, TINY_PASSKEY, TINY_TASK, TINY_TRAIN, tiny_model
from posbench import config, extending, layout, results
from posbench.cli import main
from posbench.errors import PosbenchError
from posbench.positions import pose_positions
from posbench.policies import RopeScaling
from posbench.policies.frequencies import rope_frequencies
from posbench.policies.two_maps import self_extend_positions
from posbench.runs import RunSpec, build_model, load_parent, load_trained
from posbench.training import train

pytestmark = pytest.mark.slow  # end to end: the fast tier (-m 'not slow') leaves it out

D, BASE, L = 8, 10000.0, 64
INV = [BASE ** (-2 * t / D) for t in range(D // 2)]
EXTEND = config.ExtendConfig(target_len=32, steps=(2,), lr=1e-3, warmup=1, population=4, parents=2,
                             iterations=1, search_windows=2)


def test_longrope_matches_transformers_with_given_factors():
    """transformers' `_compute_longrope_parameters`: inv_t = 1 / (ext_t base^(2t/d)), attention
    factor sqrt(1 + ln f / ln L_orig); f = 4, L_orig = 64: sqrt(1 + 1/3)."""
    factors = (1.0, 1.5, 2.0, 4.0)
    inv, m = rope_frequencies(D, BASE, L, RopeScaling("longrope", 4.0, factors=factors), 256)
    assert inv.tolist() == pytest.approx([1.0, 0.1 / 1.5, 0.01 / 2, 0.001 / 4])
    assert m == pytest.approx(1.1547005383792515)
    pi, _ = rope_frequencies(D, BASE, L, RopeScaling("pi", 4.0), 256)
    same, _ = rope_frequencies(D, BASE, L, RopeScaling("longrope", 4.0, factors=(4.0,) * 4), 256)
    assert same.tolist() == pytest.approx(pi.tolist())  # lambda = s is PI (the factor aside)


def test_longrope_is_long_factors_only_and_says_so(capsys):
    """posbench's longrope applies its searched factors, and the attention factor, at every
    length, windows up to the parent's L included (transformers would take short_factor there);
    the catalogue and `extend --help` name the variant."""
    from posbench.catalogue import catalogue

    factors = (1.0, 1.5, 2.0, 4.0)
    scaling = RopeScaling("longrope", 4.0, factors=factors)
    long = rope_frequencies(D, BASE, L, scaling, 256)
    for length in (8, L // 2, L):
        inv, m = rope_frequencies(D, BASE, L, scaling, length)
        assert inv.tolist() == long[0].tolist() and m == long[1] == pytest.approx(1.1547005383792515)
    rope = tiny_model("rope", train_len=L)
    rope.layout.schemes[0].set_trained_scaling(scaling)
    cos, _ = rope.layout.schemes[0].angles(torch.arange(L // 2))  # a window of L/2 tokens
    want = torch.arange(L // 2, dtype=torch.float64)[:, None] * long[0][None]
    assert torch.allclose(cos, (want.cos() * long[1]).float())
    notes = next(r["notes"] for r in catalogue() if r["name"] == "rope")
    assert "longrope is long-factors-only" in notes and "short_factor" in notes
    assert main(["extend", "--help"]) == 0
    assert "long-factors-only" in " ".join(capsys.readouterr().out.split())


def test_longrope_seeds_reproduce_pi_ntk_and_yarn():
    """The search's seeds, as factors, give the frequencies of PI, NTK and YaRN at s = 4."""
    seeds = extending.seed_factors(D // 2, BASE, L, 4.0)
    for kind in ("pi", "ntk", "yarn"):
        want, _ = rope_frequencies(D, BASE, L, RopeScaling(kind, 4.0), 256)
        got = torch.tensor(INV, dtype=torch.float64) / torch.tensor(seeds[kind], dtype=torch.float64)
        assert got.tolist() == pytest.approx(want.tolist(), rel=1e-9), kind


def test_search_keeps_factors_on_the_grid_and_non_decreasing():
    calls = []

    def fitness(factors):  # best near lambda = (1, 2, 3, 4)
        calls.append(factors)
        return sum((f - t) ** 2 for f, t in zip(factors, (1, 2, 3, 4)))

    settings = {"population": 8, "parents": 4, "mutation": 0.5, "iterations": 5}
    found = extending.Search(fitness, 4, 4.0, settings, seed=0).run(extending.seed_factors(4, BASE, L, 4.0))
    assert found["evaluations"] == len(set(calls)) <= 8 + 5 * 8
    for factors in calls:
        assert list(factors) == sorted(factors) and 1.0 <= factors[0] and factors[-1] <= 5.0
        assert all(abs(f * 100 - round(f * 100)) < 1e-6 for f in factors)
    assert found["loss"] <= min(found["seed_losses"].values())


def test_pose_positions_cover_the_target():
    gen = torch.Generator().manual_seed(0)
    seen = set()
    for _ in range(10_000):
        pos, first = pose_positions(16, 64, gen)
        assert pos[0] == 0 and bool((pos[1:] > pos[:-1]).all()) and int(pos.max()) <= 63
        assert 1 <= first <= 8 and pos[:first].tolist() == list(range(first))  # chunk 0 at 0..l_0 - 1
        assert (pos[first:] - pos[first]).tolist() == list(range(16 - first))  # chunk 1 contiguous
        seen |= set((pos[:, None] - pos[None, :]).flatten().tolist())
    assert set(range(1, 64)) <= seen


def rope_logits_at(q, k, rel, inv):
    """Hand reference: q_i . R(rel_ij) k_j per pair, for a (T, T) relative position matrix."""
    t = q.shape[0]
    out = torch.zeros(t, t, dtype=torch.float64)
    half = q.shape[1] // 2
    for i in range(t):
        for j in range(t):
            angle = rel[i][j] * inv
            c, s = angle.cos(), angle.sin()
            q1, q2, k1, k2 = q[i, :half], q[i, half:], k[j, :half], k[j, half:]
            out[i, j] = (q1 * (c * k1 + s * k2) + q2 * (c * k2 - s * k1)).sum()  # q . R(-rel) k
    return out


def two_map_logits(kind, **settings):
    model = tiny_model("rope", train_len=16)  # head dim 8
    scheme = model.layout.schemes[0]
    scheme.set_scaling(RopeScaling(kind, **settings))
    torch.manual_seed(1)
    q, k = torch.randn(1, 1, 8, 8, dtype=torch.float64), torch.randn(1, 1, 8, 8, dtype=torch.float64)
    got = scheme.logits(q.float(), k.float(), torch.arange(8), None, 0)[0, 0].double() * math.sqrt(8)
    inv = torch.tensor([BASE ** (-2 * t / 8) for t in range(4)], dtype=torch.float64)
    return got, q[0, 0], k[0, 0], inv, scheme


def test_self_extend_maps_positions_as_the_reference():
    """G = 2, W = 4: beyond the window a query at i reads floor(i/2) + 4 - 2, a key floor(j/2)."""
    assert [t.tolist() for t in self_extend_positions(torch.arange(8), 2, 4)] == [
        [2, 2, 3, 3, 4, 4, 5, 5], [0, 0, 1, 1, 2, 2, 3, 3]]
    rel = [[0] * 8 for _ in range(8)]
    hand = {4: [4], 5: [4, 4], 6: [5, 5, 4], 7: [5, 5, 4, 4]}  # far entries, row by row (j < i - 3)
    for i in range(8):
        for j in range(i + 1):
            rel[i][j] = i - j if i - j < 4 else hand[i][j]
    got, q, k, inv, _ = two_map_logits("self-extend", group=2, window=4)
    want = rope_logits_at(q, k, rel, inv)
    causal = torch.ones(8, 8, dtype=torch.bool).tril()
    assert torch.allclose(got[causal], want[causal], atol=1e-4)


def test_self_extend_keeps_merged_positions_below_the_training_length():
    """For T <= (L - W) G + W every merged relative position is < L (L = 16, W = 4, G = 2: 28)."""
    pos = torch.arange(28)
    qpos, kpos = self_extend_positions(pos, 2, 4)
    rel = torch.where(pos[:, None] - pos[None, :] < 4, pos[:, None] - pos[None, :], qpos[:, None] - kpos[None, :])
    assert int(rel.tril().max()) < 16


@pytest.mark.parametrize("train_len, window", [(16, 8), (20, 8), (36, 8), (60, 16), (100, 24), (130, 32),
                                               (512, 128)])
def test_self_extend_defaults_work_at_every_training_length(train_len, window):
    """G = 8, W = 0 (the defaults): W is train_len / 4 to the nearest multiple of G, at least G, and
    the model runs finite at 4x; ReRoPE's default w stays train_len // 4."""
    assert RopeScaling("self-extend").neighbour_window(train_len) == window
    assert RopeScaling("rerope").neighbour_window(train_len) == train_len // 4
    model = tiny_model("rope", train_len=train_len)
    model.layout.set_scaling(RopeScaling("self-extend"))
    with torch.no_grad():
        assert torch.isfinite(model(torch.randint(0, 50, (1, 4 * train_len)))).all()


def test_rerope_clips_and_leaky_rerope_compresses():
    """w = 3: relative positions min(i - j, 3); leaky k = 2: 3 + (i - j - 3) / 2 beyond w; k = 1 is RoPE."""
    def rel(f):
        return [[f(i - j) if j <= i else 0 for j in range(8)] for i in range(8)]

    causal = torch.ones(8, 8, dtype=torch.bool).tril()
    for settings, f in (({"window": 3}, lambda r: min(r, 3)),
                        ({"window": 3, "leak": 2.0}, lambda r: r if r < 3 else 3 + (r - 3) / 2),
                        ({"window": 3, "leak": 1.0}, lambda r: r)):
        got, q, k, inv, _ = two_map_logits("rerope", **settings)
        assert torch.allclose(got[causal], rope_logits_at(q, k, rel(f), inv)[causal], atol=1e-4), settings


def test_two_map_policies_take_the_explicit_path_and_equal_rope_inside_the_window():
    model = tiny_model("rope", train_len=16)
    x = torch.randint(0, 50, (2, 12))
    plain = model(x)
    model.layout.set_scaling(RopeScaling("self-extend", group=2, window=16))
    assert model.layout.backends("cpu") == "explicit"
    assert torch.allclose(model(x), plain, atol=1e-5)  # every i - j < W
    model.layout.set_scaling(RopeScaling())
    assert model.layout.backends("cpu") == "sdpa-causal"
    with pytest.raises(PosbenchError, match="divisible by the group"):
        model.layout.set_scaling(RopeScaling("self-extend", group=3, window=16))


@pytest.fixture(scope="module")
def parent(tiny_data, tmp_path_factory):
    """A finished tiny rope parent at 16 tokens."""
    runs = tmp_path_factory.mktemp("parent")
    spec = RunSpec("rope", data=tiny_data, model=TINY_MODEL, train=TINY_TRAIN, task="test")
    train(spec, runs, device="cpu", progress=False)
    return runs, spec


def test_children_get_equal_tokens_and_their_own_run_ids(parent):
    _, spec = parent
    cfg = dataclasses.replace(EXTEND, steps=(3,))
    children = {m: extending.child_spec(spec, m, 3, cfg) for m in ("plain", "pi", "yarn", "longrope", "pose+yarn")}
    tokens = {m: c.train.steps * c.train.batch_size * c.train.train_len for m, c in children.items()}
    assert set(tokens.values()) == {3 * TINY_TRAIN.batch_size * 32}
    assert children["pose+yarn"].train.train_len == 16 and children["pose+yarn"].train.steps == 6
    assert len({c.run_id for c in children.values()} | {spec.run_id}) == 6
    assert children["pi"].train.lr == cfg.lr and children["pi"].train.schedule == "constant"
    assert children["pi"].original_len == 16 and children["pi"].train.weight_decay == spec.train.weight_decay


def test_a_child_at_step_zero_is_its_parent_under_its_rescaling(parent, tiny_data):
    """`plain` before any step is the parent; `pi` is the parent evaluated with pi at s = 2."""
    runs, spec = parent
    _, parent_model, vocab = load_trained(runs / spec.run_id)
    x = torch.randint(0, vocab, (2, 32))
    for method, scaling in (("plain", RopeScaling()), ("pi", RopeScaling("pi", 2.0)),
                            ("yarn", RopeScaling("yarn", 2.0))):
        child = extending.child_spec(spec, method, 2, EXTEND)
        model = build_model(child, vocab)
        load_parent(model, child, runs)
        parent_model.layout.set_scaling(scaling)
        assert torch.equal(model.eval()(x), parent_model(x)), method
    parent_model.layout.set_scaling(RopeScaling())


def test_a_child_resumes_exactly_and_evaluates_with_its_method(parent, tmp_path):
    import shutil

    runs, spec = parent
    for name in ("whole", "split"):
        shutil.copytree(runs, tmp_path / name)
    child = extending.child_spec(spec, "pose+yarn", 2, EXTEND)  # 4 steps of rows of 16
    whole = train(child, tmp_path / "whole", device="cpu", progress=False).row
    part = train(child, tmp_path / "split", device="cpu", progress=False, stop_after=2)
    assert part.row["status"] == "partial"
    resumed = train(child, tmp_path / "split", device="cpu", progress=False, resume=True).row
    assert resumed["final_train_loss"] == whole["final_train_loss"]
    assert resumed["final_val_loss"] == whole["final_val_loss"]
    assert (resumed["parent_run"], resumed["extend_method"], resumed["extend_len"]) == (spec.run_id, "pose+yarn", 32)
    loaded, model, _ = load_trained(tmp_path / "split" / child.run_id)
    assert loaded == child and model.layout.schemes[0].scaling == RopeScaling("yarn", 2.0)


def test_a_deleted_parent_is_one_line(parent, tmp_path):
    _, spec = parent
    child = extending.child_spec(spec, "plain", 2, EXTEND)
    with pytest.raises(PosbenchError, match="parent run .* is missing or unfinished"):
        train(child, tmp_path, device="cpu", progress=False)


# [extend] keys of the tiny tasks: two steps, a LongRoPE search of 4 + 4 candidates
EXTEND_SETTINGS = """steps = [2]
lr = 1e-3
warmup = 1
population = 4
parents = 2
iterations = 1
"""


def write_task(path, corpus, methods='rope = ["plain", "pose+yarn"]'):
    path.write_text('version = 1\nname = "tiny"\nschemes = ["rope"]\n'
                    + TINY_TASK.format(corpus=corpus).replace("[eval]", f"""[extend]
target_len = 32
{EXTEND_SETTINGS}search_windows = 2
[extend.methods]
{methods}
[eval]""") + 'rope_scaling = ["none", "self-extend", "rerope"]\nself_extend_group = 2\nself_extend_window = 4\n')
    return path


def test_extend_command_end_to_end(parent, corpus_dir, tmp_path, capsys):
    import shutil

    runs = tmp_path / "runs"
    shutil.copytree(parent[0], runs)
    task = write_task(tmp_path / "tiny.toml", corpus_dir)
    args = ["extend", "--runs-dir", str(runs), "--task", str(task), "--device", "cpu"]
    assert main([*args, "--method", "plain,pi,yarn,longrope,pose+yarn"]) == 0
    rows = [r for r in results.read_rows(runs / "runs.csv") if r["parent_run"]]
    assert {r["extend_method"] for r in rows} == {"plain", "pi", "yarn", "longrope", "pose+yarn"}
    assert {r["tokens"] for r in rows} == {str(2 * 4 * 32)} and all(float(r["train_seconds"]) > 0 for r in rows)
    longrope = next(r for r in rows if r["extend_method"] == "longrope")
    factors = load_trained(runs / longrope["run_id"])[0].extension.factors
    assert len(factors) == 4 and list(factors) == sorted(factors)
    assert main(["extrapolate", "--runs-dir", str(runs), "--task", str(task), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "rope>yarn@32:2" in out and "rope>plain@32:2+self-extend" in out and "rope>pi@32:2+" not in out
    ext = results.read_rows(runs / "extrapolation.csv")
    assert {r["extend_method"] for r in ext} == {"", "plain", "pi", "yarn", "longrope", "pose+yarn"}
    assert {r["train_len"] for r in ext} == {"16"}
    from posbench.pairing import paired

    assert paired(runs, "rope>yarn@32:2", "rope>pi@32:2", (32,))[0]["seeds"] == 1
    from posbench.tables import table

    text = table("extend", runs, lengths="16,32", pairs="yarn:pi,plain:parent")
    assert "| rope>pi@32:2 | 1 | 256 | " in text  # a child: its fine-tuning tokens
    assert "| rope>yarn@32:2 vs rope>pi@32:2 | 1 | 1.000 [" in text and "| rope>plain@32:2 vs rope | 1 | " in text
    assert main([*args, "--method", "plain"]) == 0  # finished children are skipped
    assert "already fine-tuned" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--method", "pi", "--scheme", "alibi"], "no finished parent run of alibi"),
    (["--method", "yarn", "--target-len", "16"], "must exceed the parent's training length 16"),
    (["--method", "pose+yarn", "--steps", "1", "--target-len", "24"], "not a whole number of steps"),
    (["--method", "yran"], "did you mean 'yarn'"),
    (["--method", "plain", "--tracker", "tensorbord"], "did you mean 'tensorboard'"),
])
def test_bad_extensions_are_one_line(parent, tmp_path, capsys, argv, message):
    runs, _ = parent
    assert main(["extend", "--runs-dir", str(runs), "--device", "cpu", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_children_log_to_the_tracker_asked_for(parent, tmp_path):
    pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed")
    import shutil

    runs = tmp_path / "runs"
    shutil.copytree(parent[0], runs)
    assert main(["extend", "--runs-dir", str(runs), "--device", "cpu", "--method", "plain", "--target-len", "32",
                 "--steps", "1", "--tracker", "tensorboard"]) == 0
    child = next(r for r in results.read_rows(runs / "runs.csv") if r["extend_method"] == "plain")
    assert list((runs / "tensorboard" / "test" / child["run_id"]).glob("events.out.tfevents.*"))


def test_non_rope_parents_take_plain_only(tiny_data, tmp_path, capsys):
    spec = RunSpec("alibi", data=tiny_data, model=TINY_MODEL, train=TINY_TRAIN, task="test")
    train(spec, tmp_path, device="cpu", progress=False)
    assert main(["extend", "--runs-dir", str(tmp_path), "--method", "pi", "--target-len", "32"]) == 2
    assert "alibi has no RoPE layer to rescale" in capsys.readouterr().err
    unfinished = RunSpec("rope", data=tiny_data, model=TINY_MODEL, train=TINY_TRAIN, task="test")
    train(unfinished, tmp_path, device="cpu", progress=False, stop_after=1)
    assert main(["extend", "--runs-dir", str(tmp_path), "--method", "plain", "--scheme", "rope"]) == 2
    assert "is unfinished: continue it with --resume" in capsys.readouterr().err


def test_task_pairings_are_checked_when_the_task_loads(corpus_dir, tmp_path):
    task = write_task(tmp_path / "bad.toml", corpus_dir, methods='alibi = ["yarn"]')
    with pytest.raises(PosbenchError, match="alibi has no RoPE layer"):
        config.load_task(str(task))


def test_run_extends_after_training(corpus_dir, tmp_path):
    from posbench.grid import run_task

    task = config.load_task(str(write_task(tmp_path / "tiny.toml", corpus_dir)))
    done = run_task(task, tmp_path / "out", device="cpu", speed=False)
    assert done["trained"] == 1 and done["evaluated"] == 3 and not done["failed"]
    ext = results.read_rows(tmp_path / "out" / "extrapolation.csv")
    assert {r["extend_method"] for r in ext} == {"", "plain", "pose+yarn"}
    again = run_task(task, tmp_path / "out", device="cpu", speed=False)
    assert again["evaluated"] == 0 and again["skipped_eval"] == 3


PROBE_TASK = """
version = 1
name = "tinypasskey"
schemes = ["rope"]
""" + TINY_PASSKEY + """stop_accuracy = 0.5
[extend]
target_len = 64
""" + EXTEND_SETTINGS + """[extend.methods]
rope = ["plain", "yarn", "longrope", "pose+yarn"]
[probes]
names = ["passkey"]
lengths = [32, 64]
trials = 2
"""


def test_a_probe_parent_extends_on_its_examples_and_its_children_are_probed(tmp_path):
    from posbench.grid import run_task

    path = tmp_path / "tinypasskey.toml"
    path.write_text(PROBE_TASK)
    done = run_task(config.load_task(str(path)), tmp_path / "out", device="cpu", speed=False)
    assert done["trained"] == 1 and done["evaluated"] == 0 and done["probes"] == 5 and not done["failed"]
    runs = {r["extend_method"]: r for r in results.read_rows(tmp_path / "out" / "runs.csv")}
    assert set(runs) == {"", "plain", "yarn", "longrope", "pose+yarn"}
    child = load_trained(tmp_path / "out" / runs["yarn"]["run_id"])[0]
    assert child.train.train_len == 64 and child.train.stop_accuracy == 0.0  # no early stop: the whole budget
    pose = load_trained(tmp_path / "out" / runs["pose+yarn"]["run_id"])[0]
    assert pose.train.train_len == 32 and pose.train.steps == 4
    assert {r["tokens"] for m, r in runs.items() if m} == {str(2 * 2 * 64)}
    rows = results.read_rows(tmp_path / "out" / "probes.csv")
    assert {(r["extend_method"], r["eval_len"]) for r in rows} == {(m, n) for m in runs for n in ("32", "64")}
    assert {r["train_len"] for r in rows} == {"32"} and not (tmp_path / "out" / "extrapolation.csv").exists()
    search = json.loads((tmp_path / "out" / runs["longrope"]["run_id"] / "search.json").read_text())
    assert search["evaluations"] >= 4 and math.isfinite(search["loss"])  # scored on passkey examples of 64


def test_probe_examples_take_pose_positions_up_to_the_target():
    from posbench.batches import ProbeExamples
    from posbench.probes import parse_probe

    source = ProbeExamples(parse_probe("passkey"), dataclasses.replace(TINY_TRAIN, train_len=32, batch_size=4), 128)
    seen = set()
    for _ in range(20):
        pos = source.sample(torch.Generator().manual_seed(len(seen))).positions
        assert pos[0] == 0 and pos.shape == (32,) and bool((pos.diff() > 0).all()) and int(pos[-1]) < 128
        seen.add(int(pos[-1]))
    assert max(seen) > 64


def test_drope_child_is_nope_on_the_parents_weights_at_the_parents_length(parent):
    """DroPE: every RoPE layer becomes NoPE, the parent's tokens at L in L'/L as many steps, the
    reference's optimizer settings (its own lr and schedule, no weight decay); at step zero the
    child is the parent with every rotation the identity (cos 1, sin 0), as the reference's."""
    runs, spec = parent
    cfg = dataclasses.replace(EXTEND, steps=(3,), drope_lr=5e-4)
    child = extending.child_spec(spec, "drope", 3, cfg)
    yarn = extending.child_spec(spec, "yarn", 3, cfg)
    assert child.scheme == "none" and child.params == {} and child.original_len == 16
    assert (child.train.train_len, child.train.steps) == (16, 6)
    assert child.train.steps * child.train.train_len == yarn.train.steps * yarn.train.train_len
    assert (child.train.lr, child.train.schedule, child.train.weight_decay) == (5e-4, "cosine", 0.0)
    _, parent_model, vocab = load_trained(runs / spec.run_id)
    model = build_model(child, vocab)
    load_parent(model, child, runs)
    x = torch.randint(0, vocab, (2, 16))
    rope = parent_model.layout.schemes[0]
    rope.angles = lambda pos: (torch.ones(len(pos), rope.rotary_dim // 2), torch.zeros(len(pos), rope.rotary_dim // 2))
    assert torch.equal(model.eval()(x), parent_model(x))
    assert layout.without_rope("rnope-swa") == "none@w*3/none" and layout.without_rope("rope:base=500") == "none"
    assert layout.without_rope("p-rope+logn/alibi") == "none+logn/alibi"


def test_drope_end_to_end_and_only_for_rope_parents(parent, corpus_dir, tmp_path, capsys):
    """`extend --method drope` writes a child that `extrapolate` evaluates past its length; a
    parent without RoPE is one line."""
    import shutil

    runs = tmp_path / "runs"
    shutil.copytree(parent[0], runs)
    task = write_task(tmp_path / "tiny.toml", corpus_dir, methods='rope = ["drope"]')
    args = ["extend", "--runs-dir", str(runs), "--task", str(task), "--device", "cpu"]
    assert main([*args, "--method", "drope", "--drope-lr", "3e-4"]) == 0
    child = next(r for r in results.read_rows(runs / "runs.csv") if r["extend_method"] == "drope")
    assert child["scheme"] == "none" and child["status"] == "ok" and child["tokens"] == str(2 * 4 * 32)
    assert load_trained(runs / child["run_id"])[0].train.lr == 3e-4
    assert main(["extrapolate", "--runs-dir", str(runs), "--task", str(task), "--device", "cpu"]) == 0
    assert "none>drope@32:2" in capsys.readouterr().out
    rows = [r for r in results.read_rows(runs / "extrapolation.csv") if r["extend_method"] == "drope"]
    assert {r["eval_len"] for r in rows} == {"16", "32"} and {r["train_len"] for r in rows} == {"16"}
    alibi = RunSpec("alibi", data=parent[1].data, model=TINY_MODEL, train=TINY_TRAIN, task="test")
    train(alibi, tmp_path / "alibi", device="cpu", progress=False)
    assert main(["extend", "--runs-dir", str(tmp_path / "alibi"), "--method", "drope", "--target-len", "32"]) == 2
    assert "alibi has no RoPE layer to rescale: method 'drope'" in capsys.readouterr().err
