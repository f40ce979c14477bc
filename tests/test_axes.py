"""Grid axes ([axes] in a task file): each point a run named by its settings, through `posbench run`,
--workers and --shard."""

import pytest

from posbench import config, results, workers
from posbench.cli import main
from posbench.grid import grid, run_task
from conftest import TINY_TASK

AXES = """
[axes]
size = [{{model = {{d_model = 16, n_layers = 1, n_heads = 2}}, train = {{lr = 4e-3}}}},
        {{model = {{d_model = 32, n_layers = 2, n_heads = 2}}}}]
"train.steps" = [2, 4]
"""


def task_text(corpus, axes=AXES, schemes='["none", "rope"]', seeds="[0]"):
    return f'version = 1\nname = "axes"\nschemes = {schemes}\nseeds = {seeds}\n' + TINY_TASK.format(corpus=corpus) + \
        axes.format(corpus=corpus)


@pytest.fixture
def task_file(corpus_dir, tmp_path):
    path = tmp_path / "axes.toml"
    path.write_text(task_text(corpus_dir))
    return path


def plain_file(corpus_dir, tmp_path, d, layers, lr, steps):
    """The same settings as one point of AXES, written without axes."""
    text = task_text(corpus_dir, axes="").replace("d_model = 32", f"d_model = {d}").replace(
        "n_layers = 1", f"n_layers = {layers}").replace("steps = 4", f"steps = {steps}").replace(
        "[train]", f"[train]\nlr = {lr}")
    path = tmp_path / f"plain-{d}-{steps}.toml"
    path.write_text(text.replace('name = "axes"', 'name = "plain"'))
    return path


def test_axes_cross_schemes_and_seeds_with_the_run_ids_of_their_settings(task_file, corpus_dir, tmp_path):
    task = config.load_task(str(task_file))
    specs = grid(task)
    assert len(specs) == 2 * 2 * 2  # size x steps x schemes
    assert len({s.run_id for s in specs}) == 8
    assert {(s.model.d_model, s.model.n_layers, s.train.steps) for s in specs} == {
        (16, 1, 2), (16, 1, 4), (32, 2, 2), (32, 2, 4)}
    assert {s.train.lr for s in specs if s.model.d_model == 16} == {4e-3}
    assert {s.train.lr for s in specs if s.model.d_model == 32} == {task.train.lr}
    # a point's run_id is that of a file that writes its settings without axes: the file does not name it
    plain = grid(config.load_task(str(plain_file(corpus_dir, tmp_path, 16, 1, 4e-3, 2))))
    assert {s.run_id for s in plain} <= {s.run_id for s in specs}


def test_a_task_without_axes_keeps_its_grid(corpus_dir, tmp_path):
    path = tmp_path / "t.toml"
    path.write_text(task_text(corpus_dir, axes=""))
    task = config.load_task(str(path))
    assert [(s.model, s.train) for s in grid(task)] == [(task.model, task.train)] * 2


@pytest.mark.parametrize("axes, message", [
    ('[axes]\nsize = [{data = {spec = "x"}}]\n', "sets knobs of model or train"),
    ('[axes]\nwidth = [16, 32]\n', "named after its knob"),
    ('[axes]\n"model.d_model" = []\n', "is empty"),
    ('[axes]\n"model.d_model" = [16, 16]\n', "give the same run"),
    ('[axes]\n"train.eval_interval" = [10, 20]\n', "not eval_interval, eval_windows, checkpoint_interval, compile, tracker"),
    ('[axes]\n"model.d_model" = [16]\nsize = [{model = {d_model = 32}}]\n', "two axes set model.d_model"),
    ('[axes]\n"model.d_model" = [33]\n', "not divisible by n_heads"),
    ('[axes]\n"train.stepz" = [2]\n', "stepz"),
    ('[axes]\n"train.steps" = [-1]\n', "train.steps"),
    ('[axes]\nsize = 3\n', "axes.size must be a list"),
])
def test_bad_axes_are_one_line(corpus_dir, tmp_path, capsys, axes, message):
    path = tmp_path / "bad.toml"
    path.write_text(task_text(corpus_dir, axes=axes.replace("{", "{{").replace("}", "}}")))
    assert main(["run", str(path), "--no-speed", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_dotted_keys_inside_axes_read_as_the_quoted_form(corpus_dir, tmp_path):
    path = tmp_path / "dotted.toml"
    path.write_text(task_text(corpus_dir, axes='[axes]\ntrain.steps = [2, 4]\n'))
    assert config.load_task(str(path)).axes == {"train.steps": (2, 4)}


RUN_COLUMNS = ("scheme", "seed", "steps", "d_model", "n_layers", "n_heads", "lr", "non_embedding_params", "n_params",
               "tokens", "status")


def rows(out, table, columns):
    return {r["run_id"] + "|" + r.get("eval_len", ""): tuple(r[c] for c in columns)
            for r in results.read_rows(results.table_path(out, table))}


@pytest.mark.slow
def test_axes_run_through_workers_and_shards_with_the_axis_in_the_rows(task_file, tmp_path, one_thread):
    task = config.load_task(str(task_file))
    done = workers.run_task(task, tmp_path / "w", device="cpu", speed=False, workers=2, log=lambda m: None)
    assert done["trained"] == 8 and done["evaluated"] == 8 and done["failed"] == []
    run_task(task, tmp_path / "s1", (1, 2), device="cpu", speed=False)
    run_task(task, tmp_path / "s2", (2, 2), device="cpu", speed=False)
    assert main(["report", str(tmp_path / "s1"), "--merge", str(tmp_path / "s2")]) == 0
    runs = rows(tmp_path / "w", "runs", RUN_COLUMNS)
    assert runs == rows(tmp_path / "s1", "runs", RUN_COLUMNS) and len(runs) == 8
    by_size = {(r[3], r[4]): r for r in runs.values()}
    assert set(by_size) == {("16", "1"), ("32", "2")}
    assert {r[2] for r in runs.values()} == {"2", "4"}
    assert {(r[3], r[6]) for r in runs.values()} == {("16", "0.004"), ("32", str(task.train.lr))}
    # 12 L d^2 for a plain block, and a few per cent more for its layer norms
    for (d, layers), row in by_size.items():
        assert 12 * int(layers) * int(d) ** 2 <= int(row[7]) < 1.1 * 12 * int(layers) * int(d) ** 2 < int(row[8])
    assert {r[0] for r in rows(tmp_path / "w", "extrapolation", ("eval_len",)).values()} >= {"16", "32"}
    assert rows(tmp_path / "w", "extrapolation", ("loss",)) == rows(tmp_path / "s1", "extrapolation", ("loss",))


def test_the_gpu_scaling_task_spans_its_sizes():
    task = config.load_task("scaling-gpu")
    sizes = sorted({(s.model.d_model, s.model.n_layers) for s in grid(task)})
    assert len(sizes) == 4 and len(grid(task)) == 4 * 6 * 3
    n = [12 * layers * d * d for d, layers in sizes]
    assert 20e6 < n[0] and n[-1] < 200e6 and n[-1] / n[0] > 6
    assert all(s.model.d_model // s.model.n_heads == 64 for s in grid(task))
    rates = [s.train.lr for s in sorted(grid(task), key=lambda s: s.model.d_model)]
    assert rates == sorted(rates, reverse=True)  # the rule: inversely with the width


@pytest.mark.slow
def test_the_gpu_scaling_task_runs_at_tiny_settings_on_a_named_corpus(corpus_dir, tmp_path, capsys):
    """tasks/scaling-gpu.toml with its sizes, lengths and budget cut to a CPU's, on --data files:."""
    text = config.find_task("scaling-gpu").read_text()
    text = text[:text.index("[axes]")].replace("train_len = 512", "train_len = 16").replace(
        "steps = 2000", "steps = 2").replace("batch_size = 64", "batch_size = 2").replace(
        "lengths = [512, 1024, 2048, 4096, 8192]", "lengths = [16, 32]").replace("65536", "64").replace(
        'tokenizer = "bpe"', 'tokenizer = "bytes"').replace('dtype = "bfloat16"', 'dtype = "float32"')
    text += '[axes]\nsize = [{model = {d_model = 16, n_layers = 1, n_heads = 2}}, {model = {d_model = 32, n_layers = 2, n_heads = 2}}]\n'
    path = tmp_path / "scaling-gpu-tiny.toml"
    path.write_text(text)
    out = tmp_path / "out"
    assert main(["run", str(path), "--data", f"files:{corpus_dir}", "--schemes", "rope,alibi", "--seeds", "0",
                 "--device", "cpu", "--no-speed", "--out", str(out)]) == 0
    runs = results.read_rows(out / "runs.csv")
    assert len(runs) == 4 and {r["d_model"] for r in runs} == {"16", "32"}
    assert {r["corpus"] for r in runs} and all(r["status"] == "ok" for r in runs)
    ext = results.read_rows(out / "extrapolation.csv")
    assert {r["scaling"] for r in ext if r["scheme"] == "rope"} == {"none", "yarn"}
