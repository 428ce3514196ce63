"""fdp._validation: every helper accepts valid input and rejects bad input with a
ValueError that names the argument, the value and the allowed range."""

from __future__ import annotations

import numpy as np
import pytest

import fdp
from fdp._validation import (
    check_array,
    check_delta,
    check_integer,
    check_probability,
    check_real,
    check_sampling_rate,
    describe_interval,
    format_value,
)

NAN, INF = float("nan"), float("inf")


def test_describe_interval():
    assert describe_interval(0, 1, True, False) == "[0, 1)"
    assert describe_interval(None, 2.5, True, True) == "(-inf, 2.5]"
    assert describe_interval(0.0, None, False, True) == "(0, inf)"


@pytest.mark.parametrize("value", [0, 1.5, np.float32(2.0), np.int64(3), np.array(4.0)])
def test_check_real_accepts_real_scalars(value):
    out = check_real("x", value)
    assert isinstance(out, float) and out == float(value)


@pytest.mark.parametrize(
    ("value", "kwargs", "match"),
    [
        (NAN, {}, r"x must be a finite number in \(-inf, inf\); got nan"),
        (INF, {}, r"x must be a finite number .*; got inf"),
        (-INF, {"low": 0.0}, r"x must be a finite number in \[0, inf\); got -inf"),
        (True, {}, r"x must be a real number .*; got True"),
        ("1.0", {}, r"x must be a real number .*; got '1.0'"),
        (None, {}, r"x must be a real number"),
        (1 + 2j, {}, r"x must be a real number"),
        (np.array([1.0, 2.0]), {}, r"x must be a real number"),
        (-0.5, {"low": 0.0}, r"x must be in \[0, inf\); got -0.5"),
        (0.0, {"low": 0.0, "low_inclusive": False}, r"x must be in \(0, inf\); got 0.0"),
        (2.0, {"high": 1.0}, r"x must be in \(-inf, 1\]; got 2.0"),
        (1.0, {"high": 1.0, "high_inclusive": False}, r"x must be in \(-inf, 1\); got 1.0"),
    ],
)
def test_check_real_rejects(value, kwargs, match):
    with pytest.raises(ValueError, match=match):
        check_real("x", value, **kwargs)


def test_check_real_allow_inf():
    assert check_real("t", INF, allow_inf=True) == INF
    with pytest.raises(ValueError, match=r"t must be in \(-inf, 0\]"):
        check_real("t", INF, high=0.0, allow_inf=True)
    with pytest.raises(ValueError, match=r"got nan"):
        check_real("t", NAN, allow_inf=True)


def test_check_integer():
    assert check_integer("n", 5) == 5
    assert check_integer("n", 5.0) == 5
    assert check_integer("n", np.int32(7), low=1) == 7
    for bad in (5.5, True, NAN, INF, "3", None):
        with pytest.raises(ValueError, match=r"n must be an integer"):
            check_integer("n", bad)
    with pytest.raises(ValueError, match=r"n must be an integer in \[1, 10\]; got 0"):
        check_integer("n", 0, low=1, high=10)


def test_probability_sampling_rate_delta():
    assert check_probability("p", 0.0) == 0.0 and check_probability("p", 1.0) == 1.0
    with pytest.raises(ValueError, match=r"p must be in \(0, 1\]; got 0.0"):
        check_probability("p", 0.0, allow_zero=False)
    with pytest.raises(ValueError, match=r"p must be in \[0, 1\); got 1.0"):
        check_probability("p", 1.0, allow_one=False)
    assert check_sampling_rate(1.0) == 1.0
    with pytest.raises(ValueError, match=r"sampling_rate must be in \(0, 1\]; got 0"):
        check_sampling_rate(0)
    with pytest.raises(ValueError, match=r"q must be a finite number in \(0, 1\]; got nan"):
        check_sampling_rate(NAN, name="q")
    assert check_delta(1e-5) == 1e-5
    for bad in (0.0, 1.0, -1e-9, 1.5):
        with pytest.raises(ValueError, match=r"delta must be in \(0, 1\)"):
            check_delta(bad)


# check_array reports the first bad entry as a Python number ("got nan"), never
# with the NumPy >= 2 repr of a NumPy scalar ("got np.float64(nan)").


def test_check_array():
    out = check_array("a", [0.0, 0.5, 1.0], low=0.0, high=1.0)
    assert out.dtype == np.float64 and out.shape == (3,)
    assert check_array("a", 0.25).shape == ()
    with pytest.raises(ValueError, match=r"a must be finite numbers in \[0, 1\]; got nan"):
        check_array("a", [0.1, NAN], low=0.0, high=1.0)
    with pytest.raises(ValueError, match=r"a must be finite numbers in \[0, 1\]; got 1.5"):
        check_array("a", [[0.1, 1.5]], low=0.0, high=1.0)
    with pytest.raises(ValueError, match=r"a must be finite numbers .*; got inf"):
        check_array("a", [INF])
    assert check_array("a", [INF, -INF], allow_inf=True).shape == (2,)
    with pytest.raises(ValueError, match=r"a must be numbers in .*; got nan"):
        check_array("a", [NAN], allow_inf=True)
    with pytest.raises(ValueError, match=r"a must be finite numbers in \(0, 1\); got 0.0"):
        check_array("a", [0.0], low=0.0, high=1.0, low_inclusive=False, high_inclusive=False)
    with pytest.raises(ValueError, match=r"a must be a 1-dimensional array; got shape \(2, 2\)"):
        check_array("a", np.zeros((2, 2)), ndim=1)
    with pytest.raises(ValueError, match=r"a must be real numbers"):
        check_array("a", ["x", "y"])
    with pytest.raises(ValueError, match=r"a must be real numbers"):
        check_array("a", [1.0, [2.0, 3.0]])


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (np.float64("nan"), "nan"),
        (np.float32(1.5), "1.5"),
        (np.float64("-inf"), "-inf"),
        (np.int64(3), "3"),
        (np.array(2.0), "2.0"),
        (np.bool_(True), "True"),
        (np.str_("abc"), "'abc'"),
        ([np.float64(1.0), "x"], "[1.0, 'x']"),
        (0.25, "0.25"),
        ("1.0", "'1.0'"),
        (None, "None"),
    ],
)
def test_format_value_shows_python_numbers(value, text):
    assert format_value(value) == text


def test_format_value_shortens_long_values():
    assert len(format_value(np.arange(1000.0))) <= 80
    assert len(format_value("x" * 1000)) <= 80
    assert len(format_value(list(range(1000)))) <= 80


def _message(fn, *args, **kwargs) -> str:
    with pytest.raises(ValueError) as info:
        fn(*args, **kwargs)
    return str(info.value)


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (lambda: check_array("alpha", np.array([0.5, np.nan]), low=0.0, high=1.0),
         "alpha must be finite numbers in [0, 1]; got nan"),
        (lambda: check_array("alpha", np.array([0.5, 1.5]), low=0.0, high=1.0),
         "alpha must be finite numbers in [0, 1]; got 1.5"),
        (lambda: check_array("x", np.array(["a", "b"], dtype=object)),
         "x must be real numbers in (-inf, inf); got ['a', 'b']"),
        (lambda: check_real("sigma", np.float64("nan"), low=0.0, low_inclusive=False),
         "sigma must be a finite number in (0, inf); got nan"),
        (lambda: check_real("sigma", np.float64(-1.0), low=0.0, low_inclusive=False),
         "sigma must be in (0, inf); got -1.0"),
        (lambda: check_real("sigma", np.array([1.0])), "sigma must be a real number in (-inf, inf); got [1.]"),
        (lambda: check_integer("steps", np.int64(0), low=1), "steps must be an integer in [1, inf); got 0"),
        (lambda: check_integer("steps", np.float64(2.5)), "steps must be an integer in (-inf, inf); got 2.5"),
        (lambda: check_probability("p", np.float32(2.0)), "p must be in [0, 1]; got 2.0"),
        (lambda: check_delta(np.float64(0.0)), "delta must be in (0, 1); got 0.0"),
    ],
)
def test_messages_never_show_numpy_reprs(call, expected):
    msg = _message(call)
    assert msg.startswith(expected), msg
    assert "np." not in msg and "float64" not in msg and "int64" not in msg, msg


# ----------------------------------------------------- the accountant's settings and JSON
@pytest.mark.parametrize("spacing", [1e-20, 0.0, 1e300, NAN, INF])
def test_grid_spacing_out_of_the_planners_range_is_refused_at_construction(spacing):
    """1e-20 overflowed the grid's integer offsets (OverflowError) and 1e300 its points (a
    NaN grid index): grid_spacing must lie in [1e-9 (the automatic grid's floor), 1e292]."""
    import fdp

    msg = _message(fdp.PLDAccountant, grid_spacing=spacing)
    assert msg.startswith("grid_spacing must be") and "[1e-09, 1e+292]" in msg, msg


def test_a_grid_spacing_too_fine_for_the_losses_is_refused_with_the_spacing_that_works():
    import fdp

    acc = fdp.PLDAccountant(grid_spacing=1e-9).compose(fdp.RandomizedResponse(epsilon=1e10), 10)
    msg = _message(acc.get_epsilon_bounds, 1e-5)
    assert msg.startswith("grid_spacing must be at least 2.22e-06") and "got 1e-09" in msg, msg


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[]", "not an fdp.PLDAccountant JSON document"),
        ("null", "not an fdp.PLDAccountant JSON document"),
        ("{}", "not an fdp.PLDAccountant JSON document"),
        ("{", "text must be a JSON document"),
        ('{"format": "fdp.PLDAccountant/1"}', '"events" must be a list'),
        ('{"format": "fdp.PLDAccountant/1", "events": 3}', '"events" must be a list'),
        ('{"format": "fdp.PLDAccountant/1", "events": [], "grid_spacng": 1}', "unknown keys ['grid_spacng']"),
        ('{"format": "fdp.PLDAccountant/1", "events": [3]}', 'events[0]: must be an object with the keys'),
        ('{"format": "fdp.PLDAccountant/1", "events": [{"mechanism": {"kind": "gaussian", "noise_multiplier": 1},'
         ' "steps": -2}]}', "events[0]: steps must be an integer in [1, "),
        ('{"format": "fdp.PLDAccountant/1", "events": [{"mechanism": [1], "steps": 2}]}',
         'events[0]: mechanism must be a dict with a "kind" key; got [1]'),
        ('{"format": "fdp.PLDAccountant/1", "events": [{"mechanism": {"kind": ["x"]}, "steps": 2}]}',
         "events[0]: unknown mechanism kind ['x']"),
        ('{"format": "fdp.PLDAccountant/1", "events": [{"mechanism": {"kind": "gaussian"}, "steps": 2}]}',
         "events[0]: a 'gaussian' mechanism takes the keys ['noise_multiplier', 'sampling_rate'] "
         "(required: ['noise_multiplier']); got missing ['noise_multiplier']"),
        ('{"format": "fdp.PLDAccountant/1", "events": [{"mechanism": {"kind": "laplace", "scale": 1, "b": 2},'
         ' "steps": 2}]}', "events[0]: a 'laplace' mechanism takes the keys"),
        ('{"format": "fdp.PLDAccountant/1", "events": [{"mechanism": {"kind": "from_delta", '
         '"delta_of_epsilon": "x"}, "steps": 2}]}', "events[0]: a 'from_delta' mechanism: delta_of_epsilon"),
    ],
)
def test_from_json_says_what_is_wrong_with_a_document(text, expected):
    """'[]' and 'null' raised AttributeError, a missing "events" KeyError, a bad event or
    mechanism dict TypeError or AttributeError."""
    import fdp

    msg = _message(fdp.PLDAccountant.from_json, text)
    assert msg.startswith(expected), msg


@pytest.mark.parametrize("tail_mass", [0.0, -1.0, 1.0, 2.0, NAN, INF])
def test_composed_pld_names_a_tail_mass_out_of_range(tail_mass):
    """Before: 'math domain error' (0, -1, NaN) or an unrelated 'privacy loss of inf'
    message (2.0); now the argument, its value and the range."""
    accountant = fdp.PLDAccountant().compose(fdp.Gaussian(noise_multiplier=1.0), steps=2)
    with pytest.raises(ValueError, match=r"tail_mass must be .*\(0, 1\)"):
        accountant.composed_pld(tail_mass=tail_mass)


@pytest.mark.parametrize("wrap", [lambda deep: deep,
                                  lambda deep: '{"format": "fdp.PLDAccountant/1", "events": %s}' % deep])
def test_from_json_of_brackets_nested_too_deep_is_a_value_error(wrap):
    """Was a RecursionError from the JSON decoder."""
    with pytest.raises(ValueError, match="nested less deeply"):
        fdp.PLDAccountant.from_json(wrap("[" * 100_000 + "]" * 100_000))


@pytest.mark.parametrize("value", [10**400, -(10**400)])
def test_an_int_beyond_float64_is_a_value_error_naming_the_argument(value):
    """Was OverflowError ('int too large to convert to float') in every real argument."""
    with pytest.raises(ValueError, match="noise_multiplier must be a finite number .*float64"):
        fdp.Gaussian(noise_multiplier=value)
    with pytest.raises(ValueError, match="x must be a finite number"):
        check_real("x", value, low=0.0, high=1.0)
