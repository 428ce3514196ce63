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


def fewest_jl_projections(*, steps: int, target_epsilon: float, delta: float,
                          noise_multiplier: float | None = None, sampling_rate: float | None = None,
                          mechanism: Callable[[int], Any] | None = None, limit: Any = None,
                          progress: Callable[[int, bool], Any] | None = None) -> int:
    """The smallest r whose DP-SGD-JL run (``steps`` steps of ``fdp.JL(noise_multiplier, r,
    sampling_rate)``) has a certified epsilon <= ``target_epsilon`` at ``delta``.

    Doubles r from 8 until one meets the target, then bisects (epsilon falls as r grows).
    An r whose setting the accountant refuses (it cannot certify it, e.g. random
    allocation of a heavy JL step) counts as missing the target, so the r returned is
    always certified.

    Args:
      steps: T >= 1, the events composed (steps; epochs of random allocation).
      target_epsilon: the budget, > 0.
      delta: delta in (0, 1).
      noise_multiplier: sigma > 0, with ``sampling_rate``: the Poisson-subsampled
        ``fdp.JL``.
      sampling_rate: Poisson rate p in (0, 1].
      mechanism: instead of those two, a callable ``r -> fdp.Mechanism`` for another
        sampling of the JL step (e.g. ``lambda r: fdp.RandomAllocation(fdp.JL(
        noise_multiplier=1.0, jl_projections=r), steps_per_epoch=235)``).
      limit: with ``mechanism``, optionally its r -> infinity limit (the same sampling of
        the Gaussian): checked first, so an unreachable target fails at once.
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
    steps = check_integer("steps", steps, low=1)
    target = check_real("target_epsilon", target_epsilon, low=0.0, low_inclusive=False)
    delta = check_delta(delta)
    make, limit, where = _jl_family(noise_multiplier, sampling_rate, mechanism, limit)
    if limit is not None and _epsilon_upper(limit, steps, delta) > target:
        raise ValueError(f"target_epsilon={target:g} is unreachable: even the Gaussian (r -> infinity) "
                         f"misses it{where}; raise noise_multiplier or target_epsilon")
    refusals: list[str] = []

    def meets(r: int) -> bool:
        try:
            ok = _epsilon_upper(make(r), steps, delta) <= target
        except ValueError as refusal:  # the accountant cannot certify this r
            refusals.append(f"at jl_projections={r}: {refusal}")
            ok = False
        if progress is not None:
            progress(r, ok)
        return ok

    hi = 8
    while not meets(hi):
        if hi >= MAX_JL_PROJECTIONS:
            why = f" (the last refusal {refusals[-1]})" if refusals else ""
            raise ValueError(f"target_epsilon={target:g} is unreachable: no jl_projections <= "
                             f"{MAX_JL_PROJECTIONS} meets it{where}{why}")
        hi *= 2
    lo = hi // 2 if hi > 8 else 0  # misses at lo (or lo = 0)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if meets(mid) else (mid, hi)
    return hi


def _jl_family(noise_multiplier: Any, sampling_rate: Any, mechanism: Any,
               limit: Any) -> tuple[Callable[[int], Any], Any, str]:
    """(r -> mechanism, its r -> infinity limit or None, words for messages)."""
    from fdp.mechanisms.base import Mechanism
    from fdp.mechanisms.gaussian import Gaussian
    from fdp.mechanisms.jl import JL

    if mechanism is not None:
        if noise_multiplier is not None or sampling_rate is not None:
            raise ValueError("give either mechanism (a callable r -> fdp.Mechanism) or noise_multiplier and "
                             "sampling_rate, not both")
        if not callable(mechanism):
            raise ValueError(f"mechanism must be a callable r -> fdp.Mechanism; got {mechanism!r}")
        if limit is not None and not isinstance(limit, Mechanism):
            raise ValueError(f"limit must be an fdp mechanism (the r -> infinity limit); got {limit!r}")
        return mechanism, limit, ""
    if noise_multiplier is None or sampling_rate is None:
        raise ValueError("fewest_jl_projections needs noise_multiplier and sampling_rate (Poisson-subsampled "
                         "fdp.JL), or mechanism= (a callable r -> fdp.Mechanism) for another sampling")
    if limit is not None:
        raise ValueError("limit goes with mechanism=; with noise_multiplier it is the Gaussian, checked anyway")
    sigma = check_real("noise_multiplier", noise_multiplier, low=0.0, low_inclusive=False)
    p = check_sampling_rate(sampling_rate)
    return (lambda r: JL(noise_multiplier=sigma, jl_projections=r, sampling_rate=p),
            Gaussian(noise_multiplier=sigma, sampling_rate=p), f" at noise_multiplier={sigma:g}")


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
