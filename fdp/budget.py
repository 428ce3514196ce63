"""Budget questions besides the noise multiplier: the fewest JL projections, the most steps.

Both search a quantity the certified upper bound on epsilon is monotone in, so a
doubling bracket and a bisection find the extreme value that meets the budget:

* :func:`fewest_jl_projections`: epsilon of the JL mechanism falls as r grows (its
  sensitivity Z = 1/sqrt(chi2_r / r) concentrates at 1; docs/jl.md), towards the
  Gaussian's, the r -> infinity limit;
* :func:`most_steps`: epsilon grows with the number of composed steps (composition
  only adds privacy loss).

(:func:`fdp.calibrate_noise_multiplier` answers the third question, the noise.)
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

from fdp._validation import check_delta, check_integer, check_real, check_sampling_rate

__all__ = ["MAX_JL_PROJECTIONS", "fewest_jl_projections", "most_steps"]

#: Largest r searched by :func:`fewest_jl_projections`.
MAX_JL_PROJECTIONS = 1 << 14


def _epsilon_upper(mechanism: Any, steps: int, delta: float) -> float:
    from fdp.accountant import PLDAccountant

    with warnings.catch_warnings():  # a probe's bracket width is not the question here
        warnings.simplefilter("ignore", UserWarning)
        return PLDAccountant().compose(mechanism, steps=steps).get_epsilon(delta)


def fewest_jl_projections(*, noise_multiplier: float, sampling_rate: float, steps: int, target_epsilon: float,
                          delta: float, progress: Callable[[int, bool], Any] | None = None) -> int:
    """The smallest r whose DP-SGD-JL run (``steps`` steps of ``fdp.JL(noise_multiplier, r,
    sampling_rate)``) has a certified epsilon <= ``target_epsilon`` at ``delta``.

    Doubles r from 8 until one meets the target, then bisects.

    Args:
      noise_multiplier: sigma > 0.
      sampling_rate: Poisson rate p in (0, 1].
      steps: T >= 1.
      target_epsilon: the budget, > 0.
      delta: delta in (0, 1).
      progress: optional callable, called with (r, meets) after each probe.

    Raises:
      ValueError: an argument out of range; or the target is unreachable: the Gaussian
        itself (r -> infinity) misses it ("raise noise_multiplier or target_epsilon"), or no
        r <= :data:`MAX_JL_PROJECTIONS` meets it.

    Examples:
      >>> import fdp
      >>> fdp.fewest_jl_projections(noise_multiplier=1.5, sampling_rate=0.01, steps=1000,
      ...                           target_epsilon=2.0, delta=1e-5)
    """
    from fdp.mechanisms.gaussian import Gaussian
    from fdp.mechanisms.jl import JL

    sigma = check_real("noise_multiplier", noise_multiplier, low=0.0, low_inclusive=False)
    p = check_sampling_rate(sampling_rate)
    steps = check_integer("steps", steps, low=1)
    target = check_real("target_epsilon", target_epsilon, low=0.0, low_inclusive=False)
    delta = check_delta(delta)
    if _epsilon_upper(Gaussian(noise_multiplier=sigma, sampling_rate=p), steps, delta) > target:
        raise ValueError(f"target_epsilon={target:g} is unreachable: even the Gaussian (r -> infinity) "
                         f"misses it at noise_multiplier={sigma:g}; raise noise_multiplier or target_epsilon")

    def meets(r: int) -> bool:
        ok = _epsilon_upper(JL(noise_multiplier=sigma, jl_projections=r, sampling_rate=p), steps, delta) <= target
        if progress is not None:
            progress(r, ok)
        return ok

    hi = 8
    while not meets(hi):
        if hi >= MAX_JL_PROJECTIONS:
            raise ValueError(f"target_epsilon={target:g} is unreachable: no jl_projections <= "
                             f"{MAX_JL_PROJECTIONS} meets it at noise_multiplier={sigma:g}")
        hi *= 2
    lo = hi // 2 if hi > 8 else 0  # misses at lo (or lo = 0)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if meets(mid) else (mid, hi)
    return hi


def most_steps(mechanism: Any, *, target_epsilon: float, delta: float, unit: int = 1) -> int:
    """The largest k such that k * ``unit`` steps of ``mechanism`` have a certified epsilon
    <= ``target_epsilon`` at ``delta`` (``unit``: steps per epoch, to count whole epochs;
    1 for steps).

    Raises:
      ValueError: an argument out of range; or unreachable: even one unit misses the
        target, or more units meet it than the accountant composes (the mechanism leaks
        almost nothing).

    Examples:
      >>> import fdp
      >>> fdp.most_steps(fdp.Gaussian(noise_multiplier=1.1, sampling_rate=256 / 60000),
      ...                target_epsilon=2.0, delta=1e-5, unit=235)   # whole epochs of MNIST
    """
    from fdp.accountant import MAX_STEPS
    from fdp.mechanisms.base import Mechanism

    if not isinstance(mechanism, Mechanism):
        raise ValueError(f"mechanism must be an fdp mechanism (e.g. fdp.Gaussian); got {mechanism!r}")
    target = check_real("target_epsilon", target_epsilon, low=0.0, low_inclusive=False)
    delta = check_delta(delta)
    unit = check_integer("unit", unit, low=1, high=MAX_STEPS)

    def meets(k: int) -> bool:
        return _epsilon_upper(mechanism, k * unit, delta) <= target

    if not meets(1):
        raise ValueError(f"target_epsilon={target:g} is unreachable: even {unit} step(s) give a larger epsilon")
    lo, hi = 1, 2
    while meets(hi):
        lo, hi = hi, hi * 2
        if hi * unit > MAX_STEPS:
            raise ValueError(f"target_epsilon={target:g} is unreachable as a limit: it is met for more than "
                             f"{lo * unit} steps, and the accountant composes at most {MAX_STEPS:.0e} (the "
                             "mechanism leaks almost nothing)")
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if meets(mid) else (lo, mid)
    return lo
