"""Scheme parameters: each declares its valid values beside its default, and a value outside them
is one line before anything is built or written; inside them, a model built with it is finite."""

import pytest
import torch

from conftest import tiny_model
from posbench.errors import PosbenchError
from posbench.schemes import SCHEMES, Scheme, at_least, between, one_of, positive, register
from posbench.schemes.base import MAX_INT, coerce_params

HUGE = {int: MAX_INT, float: float(MAX_INT)}  # the largest any parameter may be
NUMERIC = [(name, key) for name in sorted(SCHEMES) for key, value in SCHEMES[name].defaults.items()
           if type(value) in HUGE]


@pytest.mark.parametrize("name, key", NUMERIC)
def test_every_numeric_parameter_is_refused_or_finite_at_extremes(name, key):
    """0, -1 and a huge value: refused with one PosbenchError, or accepted and a forward is finite."""
    kind = type(SCHEMES[name].defaults[key])
    for value in (kind(0), kind(-1), HUGE[kind]):
        try:
            model = tiny_model(name, **{key: value})
        except PosbenchError as e:
            assert "\n" not in str(e) and key in str(e), (value, e)
            continue
        with torch.no_grad():
            out = model(torch.randint(0, 50, (1, 16)))
        assert torch.isfinite(out).all(), f"{name}: {key}={value} accepted, but the forward is not finite"


@pytest.mark.parametrize("scheme, key", [("rope", "base"), ("xpos", "gamma"), ("fire", "c"), ("fire", "L")])
def test_a_float_beyond_the_bound_is_refused_even_where_the_range_is_open(scheme, key):
    with pytest.raises(PosbenchError, match=f"parameter {key} of scheme '{scheme}' is too large: 1e\\+300"):
        coerce_params(SCHEMES[scheme], {key: "1e300"})


@pytest.mark.parametrize("name", sorted(n for n in SCHEMES if SCHEMES[n].plugin_source is None))
def test_every_built_in_parameter_declares_its_range(name):
    cls = SCHEMES[name]
    undeclared = [k for k, v in cls.defaults.items() if not isinstance(v, bool) and k not in cls.ranges]
    assert not undeclared, f"{name}: no range for {undeclared}"


@pytest.mark.parametrize("scheme, param, message", [
    ("fope", "sigma=-1", "parameter sigma of scheme 'fope' must be in [0, 10], got -1.0"),
    ("dape", "width=0", "parameter width of scheme 'dape' must be in [1, 65536], got 0"),
    ("dape", "width=-4", "parameter width of scheme 'dape' must be in [1, 65536], got -4"),
    ("pope", "base=-10000", "parameter base of scheme 'pope' must be > 1, got -10000.0"),
    ("resonance", "base=-1", "parameter base of scheme 'resonance' must be > 1, got -1.0"),
    ("dape", "base=kerpel", "unknown value for parameter base of scheme 'dape': 'kerpel'; did you mean 'kerple'? "
     "(known: alibi, fire, kerple)"),
])
def test_a_parameter_out_of_range_is_one_line_and_writes_nothing(scheme, param, message, tiny_data, tmp_path,
                                                                  capsys):
    from posbench.cli import main

    runs = tmp_path / "runs"
    args = ["train", "--scheme", scheme, "--param", param, "--data", tiny_data.spec, "--tokenizer", "bytes",
            "--steps", "1", "--runs-dir", str(runs)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [f"error: {message}"]
    assert not runs.exists() or not list(runs.iterdir())


def test_a_plugin_declares_ranges_as_the_built_ins_do():
    @register
    class Damped(Scheme):
        name = "test-damped"
        family = "bias"
        hooks = ("bias",)
        defaults = {"rate": 0.5, "taps": 4, "mode": "exp"}
        ranges = {"rate": positive, "taps": at_least(1), "mode": one_of("exp", "linear")}

        def bias_fn(self, h, qpos, kpos):
            return -self.p["rate"] * (qpos - kpos).float()

    try:
        assert coerce_params(Damped, {"rate": "2", "taps": "1"}) == {"rate": 2.0, "taps": 1, "mode": "exp"}
        with pytest.raises(PosbenchError, match=r"parameter rate of scheme 'test-damped' must be > 0, got 0.0"):
            coerce_params(Damped, {"rate": "0"})
        with pytest.raises(PosbenchError, match=r"taps of scheme 'test-damped' must be >= 1, got -1"):
            coerce_params(Damped, {"taps": -1})
        with pytest.raises(PosbenchError, match=r"did you mean 'linear'"):
            coerce_params(Damped, {"mode": "linaer"})
    finally:
        SCHEMES.pop("test-damped")


@pytest.mark.parametrize("ranges, message", [
    ({"rte": positive}, "declares a range for 'rte', which is not one of its parameters"),
    ({"rate": (0, 1)}, "the range of rate must be a posbench.schemes.Range"),
    ({"rate": between(1, 2)}, r"the default rate=0.5 is outside its range \(must be in \[1, 2\]\)"),
])
def test_register_refuses_a_range_it_cannot_use(ranges, message):
    with pytest.raises(PosbenchError, match=message):
        register(type("Bad", (Scheme,), {"name": "test-bad", "family": "bias", "defaults": {"rate": 0.5},
                                         "ranges": ranges}))
    assert "test-bad" not in SCHEMES
