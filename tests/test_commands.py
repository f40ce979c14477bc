"""The command layer: every command is a function of the Python API and a command of the command
line, built from one declaration; commands.md is written from them."""

import dataclasses
import inspect

import pytest
import typer

import posbench
import posbench.api
from posbench import commands, config
from posbench.commands import options, reference
from posbench.errors import PosbenchError
from posbench.knobs import knob
from posbench.schemes.base import positive


def test_every_command_is_an_api_function_and_a_command():
    from posbench.cli import app

    group = typer.main.get_command(app)
    assert set(group.commands) == set(commands.NAMES) == {*posbench.API, "schemes"}
    for name in commands.NAMES:
        assert getattr(posbench.api, name).__wrapped__ is getattr(commands.module(name), name)
        assert name == "schemes" or getattr(posbench, name) is getattr(posbench.api, name)
        cli_options = {p.name for p in group.commands[name].params}
        api_keywords = set(inspect.signature(getattr(posbench.api, name)).parameters) - set(options.API_ONLY)
        assert cli_options == api_keywords, name


def test_the_command_reference_is_written_from_the_commands():
    assert reference.current() == reference.markdown(), \
        "posbench/docs/commands.md drifted: python -m posbench.commands.reference rewrites it"


def test_shared_options_are_declared_once():
    """The options several commands share mean one thing and read one way (posbench.commands.options)."""
    from posbench.cli import app

    group = typer.main.get_command(app)
    helps = {}
    for name, command in group.commands.items():
        for p in command.params:
            if p.param_type_name == "option" and p.name in ("task", "device", "runs_dir", "schemes", "out"):
                helps.setdefault(p.name, {}).setdefault(p.help, []).append(name)
    # paired and table name a task only to filter runs by it: `--task` means the task's settings elsewhere
    assert set(helps["task"]) == {options.Task.__metadata__[0].help, "only runs of this task (when a directory "
                                  "holds several)", "probes: only runs of this task"}
    for option in ("device", "runs_dir", "schemes"):
        assert len(helps[option]) == 1, helps[option]
    assert len(helps["out"]) <= 2  # inspect's has a default folder of its own
    assert len(helps["schemes"][options.Schemes.__metadata__[0].help]) >= 5


def test_a_new_config_field_is_a_flag_a_keyword_and_a_documented_option(monkeypatch):
    """One field added to EvalConfig appears on the command line, in the API and in the reference."""

    @dataclasses.dataclass(frozen=True)
    class Wider(config.EvalConfig):
        window_bonus: float = knob(1.5, "a knob added for this test", positive, flag=True)

    from posbench.commands.extrapolate import extrapolate

    from posbench import cli

    fn = options.takes(Wider)(extrapolate.__wrapped__)
    assert inspect.signature(fn).parameters["window_bonus"].default is None  # the API's keyword
    changed = options.settings(Wider(), {"window_bonus": 3.0, "lengths": "32,64"})
    assert (changed.window_bonus, changed.lengths) == (3.0, (32, 64))
    with pytest.raises(PosbenchError, match="window_bonus must be > 0, got -1.0"):
        options.settings(Wider(), {"window_bonus": -1.0})
    monkeypatch.setattr(commands.module("extrapolate"), "extrapolate", fn)
    app = cli.build()
    cmd = typer.main.get_command(app).commands["extrapolate"]
    flag = next(p for p in cmd.params if p.name == "window_bonus")  # the command line's flag
    assert flag.opts == ["--window-bonus"] and flag.help == "a knob added for this test"
    assert "| `--window-bonus` |  | a knob added for this test |" in reference.markdown(app)  # the manual


def test_an_unknown_keyword_gets_a_suggestion():
    with pytest.raises(PosbenchError, match="did you mean 'lengths'"):
        posbench.extrapolate(lenghts=[64])


def test_a_wrongly_typed_keyword_is_one_line():
    with pytest.raises(PosbenchError, match="posbench.train: steps must be an integer, got 'abc'"):
        posbench.train("rope", steps="abc")


@pytest.mark.parametrize("call, message", [
    (lambda: posbench.train("rope", seeds=1.5), "posbench.train: seeds must be a string"),
    (lambda: posbench.train("rope", runs_dir=12345), "posbench.train: runs_dir must be a path (str or pathlib.Path), "
                                                     "got 12345"),
    (lambda: posbench.train(5, steps=1), "posbench.train: scheme must be a string"),
    (lambda: posbench.train(), "posbench.train: missing a required argument: 'scheme'"),
    (lambda: posbench.train("rope", "quick"), "posbench.train: too many positional arguments"),
    (lambda: posbench.train("rope", steps=1.5), "posbench.train: steps must be an integer, got 1.5"),
    (lambda: posbench.train("rope", resume="yes"), "posbench.train: resume must be True or False, got 'yes'"),
    (lambda: posbench.table("headline", "results", seedz=True), "unknown keyword of posbench.table 'seedz'; did you "
                                                               "mean 'seeds'"),
    (lambda: posbench.table("headline", 5), "posbench.table: directory must be a path or a list of paths, got 5"),
    (lambda: posbench.extrapolate(lengths=[True]), "posbench.extrapolate: lengths must be a string"),
    (lambda: posbench.api.schemes(format="jsn"), "did you mean 'json'"),
])
def test_every_argument_of_the_api_is_typed_as_its_flag(call, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(PosbenchError, match=message.replace("(", r"\(").replace(")", r"\)")):
        call()
    assert not list(tmp_path.iterdir())


def test_an_api_list_is_refused_as_its_text_is_and_no_row_is_rewritten(tmp_path, monkeypatch):
    """lengths=[32.5] is `--lengths 32.5`, refused before any run is scored (int(32.5) scored the
    32-token rows again, at the task's default number of tokens)."""
    from posbench import readings

    monkeypatch.setattr(readings, "extrapolate", lambda *args, **kwargs: pytest.fail("scored"))
    for lengths in ([32.5], [32.0], "64.5"):
        with pytest.raises(PosbenchError, match="expected comma-separated integers"):
            posbench.extrapolate(lengths=lengths, runs_dir=tmp_path)
    with pytest.raises(PosbenchError, match=r"bad lengths \[32.5\]"):
        config.parse_list([32.5], int, "lengths")


def test_list_options_take_a_list_or_comma_separated_text():
    cfg = config.EvalConfig()
    assert options.settings(cfg, {"lengths": [32, 64]}) == options.settings(cfg, {"lengths": "32, 64"})
    with pytest.raises(PosbenchError, match="expected comma-separated integers"):
        options.settings(cfg, {"lengths": "32,x"})
    assert options.names(["rope,alibi", "t5"]) == ("rope", "alibi", "t5")


def test_declared_ranges_check_task_files_and_flags_alike():
    with pytest.raises(PosbenchError, match="stop_accuracy must be in 0..1"):
        config.replace(config.TrainConfig(), stop_accuracy=2.0)
    with pytest.raises(PosbenchError, match="did you mean 'sliding'"):
        config.replace(config.EvalConfig(), mode="slidin")
    with pytest.raises(PosbenchError, match="yarn_alpha \\(40.0\\) must be below yarn_beta"):
        config.replace(config.ExtendConfig(), yarn_alpha=40.0)
    with pytest.raises(PosbenchError, match="d_model 30 is not divisible by n_heads 4"):
        config.replace(config.ModelConfig(), d_model=30)


def test_every_command_option_has_help():
    from posbench.cli import app

    for name, command in typer.main.get_command(app).commands.items():
        for p in command.params:
            if p.param_type_name == "option" and p.name != "help":
                assert p.help, f"{name} {p.opts[0]}"
