"""Input validation shared by every public entry point of fdp.

Every check raises :class:`ValueError` whose message names the argument, the
offending value and the allowed range, e.g.::

    ValueError: noise_multiplier must be a finite number in (0, inf); got nan

One module, used everywhere: mechanisms, curves, the accountant and the
TensorFlow adapter all call these helpers instead of re-implementing them.
"""

from __future__ import annotations

import math
import numbers
import reprlib
from typing import Any

import numpy as np

__all__ = [
    "check_real",
    "check_integer",
    "check_probability",
    "check_sampling_rate",
    "check_delta",
    "check_array",
    "describe_interval",
    "format_value",
]


class _ValueRepr(reprlib.Repr):
    """Length-limited repr that shows NumPy numbers as the Python numbers they hold."""

    def __init__(self) -> None:
        super().__init__()
        self.maxstring = 60
        self.maxother = 60
        self.maxlist = self.maxtuple = 6

    def repr1(self, x: Any, level: int) -> str:
        if isinstance(x, np.ndarray) and x.ndim == 0:
            x = x[()]
        if isinstance(x, (bool, np.bool_)):
            return repr(bool(x))
        if isinstance(x, np.generic):
            x = x.item()  # np.float64(nan) -> nan, np.int64(3) -> 3, np.str_('a') -> 'a'
        if isinstance(x, np.ndarray):
            text = np.array2string(x, separator=", ", threshold=6, edgeitems=2)
            return text if len(text) <= 80 else text[:77] + "..."
        return super().repr1(x, level)


_VALUE_REPR = _ValueRepr()


def describe_interval(
    low: float | None, high: float | None, low_inclusive: bool, high_inclusive: bool
) -> str:
    """Render an interval such as ``(0, 1]`` for error messages."""
    lo = "-inf" if low is None else _fmt(low)
    hi = "inf" if high is None else _fmt(high)
    left = "[" if (low is not None and low_inclusive) else "("
    right = "]" if (high is not None and high_inclusive) else ")"
    return f"{left}{lo}, {hi}{right}"


def format_value(value: Any) -> str:
    """Render an offending value for an error message, as a user would type it.

    NumPy scalars and 0-d arrays are shown as the Python number they hold
    (``nan``, ``1.5``, ``7``), never as ``np.float64(nan)`` (the NumPy >= 2
    repr), also inside lists; long values are shortened (``reprlib``).
    """
    return _VALUE_REPR.repr(value)


def _fmt(x: float) -> str:
    if isinstance(x, numbers.Integral):
        return str(int(x))
    return f"{x:g}"


def check_real(
    name: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    low_inclusive: bool = True,
    high_inclusive: bool = True,
    allow_inf: bool = False,
) -> float:
    """Return ``value`` as a float after checking it is a real number in range.

    Args:
      name: the argument name used in the error message.
      value: the value to check; Python/NumPy scalars and 0-d arrays accepted.
      low, high: bounds of the allowed interval (``None`` = unbounded).
      low_inclusive, high_inclusive: whether the bounds themselves are allowed.
      allow_inf: accept +-inf when it lies inside the interval.

    Raises:
      ValueError: not a real scalar, NaN, infinite (unless allowed), or out of range.
    """
    interval = describe_interval(low, high, low_inclusive, high_inclusive)
    if isinstance(value, bool) or not _is_real_scalar(value):
        raise ValueError(f"{name} must be a real number in {interval}; got {format_value(value)}")
    try:
        x = float(value)
    except OverflowError:  # an int beyond float64 (10**400): no computation here can use it
        raise ValueError(f"{name} must be a finite number in {interval} within float64's range "
                         f"(|x| < 1.8e308); got {format_value(value)}") from None
    if math.isnan(x):
        raise ValueError(f"{name} must be a finite number in {interval}; got nan")
    if math.isinf(x) and not allow_inf:
        raise ValueError(f"{name} must be a finite number in {interval}; got {x}")
    too_low = low is not None and (x < low or (x == low and not low_inclusive))
    too_high = high is not None and (x > high or (x == high and not high_inclusive))
    if too_low or too_high:
        raise ValueError(f"{name} must be in {interval}; got {format_value(value)}")
    return x


def _is_real_scalar(value: Any) -> bool:
    if isinstance(value, numbers.Real):
        return True
    if isinstance(value, np.ndarray) and value.ndim == 0 and np.isrealobj(value):
        return value.dtype.kind in "fiu"
    return False


def check_integer(
    name: str, value: Any, *, low: int | None = None, high: int | None = None
) -> int:
    """Return ``value`` as an int after checking it is an integer in ``[low, high]``.

    Floats that are exactly integral (``5.0``) are accepted; ``5.5``, NaN and
    booleans are not.
    """
    interval = describe_interval(low, high, True, True)
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an integer in {interval}; got {format_value(value)}")
    if isinstance(value, numbers.Integral):
        n = int(value)
    elif _is_real_scalar(value) and math.isfinite(float(value)) and float(value).is_integer():
        n = int(float(value))
    else:
        raise ValueError(f"{name} must be an integer in {interval}; got {format_value(value)}")
    if (low is not None and n < low) or (high is not None and n > high):
        raise ValueError(f"{name} must be an integer in {interval}; got {format_value(value)}")
    return n


def check_probability(
    name: str, value: Any, *, allow_zero: bool = True, allow_one: bool = True
) -> float:
    """A probability in [0, 1], with either end optionally excluded."""
    return check_real(
        name, value, low=0.0, high=1.0, low_inclusive=allow_zero, high_inclusive=allow_one
    )


def check_sampling_rate(value: Any, name: str = "sampling_rate") -> float:
    """Poisson sampling rate p in (0, 1]."""
    return check_probability(name, value, allow_zero=False, allow_one=True)


def check_delta(value: Any, name: str = "delta") -> float:
    """A delta of (epsilon, delta)-DP in the open interval (0, 1)."""
    return check_probability(name, value, allow_zero=False, allow_one=False)


def check_array(
    name: str,
    values: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    low_inclusive: bool = True,
    high_inclusive: bool = True,
    allow_inf: bool = False,
    ndim: int | None = None,
) -> np.ndarray:
    """Return ``values`` as a float64 array after checking every entry.

    Scalars become 0-d arrays. Raises ValueError naming the first bad entry.
    """
    interval = describe_interval(low, high, low_inclusive, high_inclusive)
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be real numbers in {interval}; got {format_value(values)}") from None
    if ndim is not None and arr.ndim != ndim:
        raise ValueError(f"{name} must be a {ndim}-dimensional array; got shape {arr.shape}")
    bad = np.isnan(arr)
    if not allow_inf:
        bad |= np.isinf(arr)
    if low is not None:
        bad |= (arr < low) if low_inclusive else (arr <= low)
    if high is not None:
        bad |= (arr > high) if high_inclusive else (arr >= high)
    if np.any(bad):
        first = arr[bad].flat[0]
        what = "finite numbers" if not allow_inf else "numbers"
        raise ValueError(f"{name} must be {what} in {interval}; got {format_value(first)}")
    return arr
