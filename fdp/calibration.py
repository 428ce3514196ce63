"""Noise calibration: the smallest noise multiplier that meets an (eps, delta) target.

Given a privacy target (eps*, delta), a number of steps T and a sampling rate p,
:func:`calibrate_noise_multiplier` returns the smallest noise multiplier sigma
(to a relative ``tolerance``) whose *certified upper bound*

    eps_up(sigma) = PLDAccountant().compose(mechanism(sigma, p), T).get_epsilon(delta)

is at most eps*. The search runs on the upper bound, so the sigma it returns
is one at which the accountant has certified eps <= eps*; it never returns an
unverified value.

Why the search works. The exact epsilon is non-increasing in sigma. With
mu = 1/sigma > mu' = 1/sigma', the map x -> (mu'/mu) x + N(0, 1 - (mu'/mu)^2)
sends N(mu, 1) to N(mu', 1) and N(0, 1) to N(0, 1), so the noisier Gaussian
mechanism is a post-processing of the less noisy one (the same map applied to
each mixture component covers Poisson subsampling, and given Z it covers the
JL mechanism, whose Z is released unchanged); post-processing cannot lower a
tradeoff curve. The certified upper bound follows the exact epsilon up to the
accountant's discretisation slack (``epsilon_rtol``), so the search brackets
the crossing eps_up(sigma) = eps* and shrinks the bracket in log sigma:

    lo < sigma_min <= hi,   eps_up(lo) > eps*,   eps_up(hi) <= eps*,
    stop when hi <= lo (1 + tolerance), return hi.

Each probe is placed where log eps_up, interpolated linearly in log sigma between
the ends, crosses log eps* (eps ~ 1/sigma over most of the range, so this lands
within the tolerance after one or two probes), nudged by tolerance/4; after two probes
in a row that did not halve the bracket comes a plain bisection, so the bracket
shrinks whatever eps_up does.

Both ends are *evaluated* points, so the returned sigma meets the target and
sigma / (1 + tolerance) (or anything below lo) does not, as far as the
certified bound can tell.

Bracketing starts from the mu-GDP guess (Dong-Roth-Su, arXiv:1905.02383v3,
primal-dual section, the corollary for mu-GDP; composition section for
mu = sqrt(T) / sigma at p = 1; the central limit theorem of their SGD section,
mu ~ p sqrt(T (e^{1/sigma^2} - 1)), for p < 1):

    delta = Phi(-eps*/mu* + mu*/2) - e^{eps*} Phi(-eps*/mu* - mu*/2)     (solve for mu*)
    sigma0 = sqrt(T) / mu*                                 (p = 1; exact for Gaussian)
    sigma0 = 1 / sqrt(log(1 + (mu* / (p sqrt(T)))^2))      (p < 1; a heuristic start)

For ``mechanism="jl"`` the start is the larger of that and the heavy-tail guess of
:func:`_jl_tail_guess` (sigma0 = z* / sqrt(2 eps*), P(Z > z*) = delta / (T p)),
which the tail, not the bulk, usually decides; the search then
widens geometrically (factors 1.1, 1.21, 1.46, 2.14, ... in sigma) until
the target is crossed, within [MIN_NOISE_MULTIPLIER, MAX_NOISE_MULTIPLIER].

Notation: eps* = ``target_epsilon``, T = ``steps``, p = ``sampling_rate``,
sigma = noise multiplier (noise std / sensitivity), mu = 1/sigma per step.
"""

from __future__ import annotations

import math
import sys
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from fdp._validation import check_integer, check_real, check_sampling_rate, format_value
from fdp.accountant import MAX_STEPS, PLDAccountant
from fdp.mechanisms.base import Mechanism
from fdp.pld.queries import check_certifiable_delta

__all__ = [
    "calibrate_noise_multiplier",
    "MIN_NOISE_MULTIPLIER",
    "MAX_NOISE_MULTIPLIER",
]

#: Smallest noise multiplier searched. If it already meets the target it is
#: returned (with a warning): it meets the target but may not be the smallest.
MIN_NOISE_MULTIPLIER = 1e-2
#: Largest noise multiplier searched; a target not met there raises ValueError.
MAX_NOISE_MULTIPLIER = 1e6
#: Default relative tolerance on sigma. The accountant's own epsilon has a
#: relative slack of ``epsilon_rtol`` (1e-3 by default) and eps ~ 1/sigma over
#: most of the range, so a finer sigma tolerance would only resolve that slack.
DEFAULT_TOLERANCE = 1e-3

_MECHANISMS = ("gaussian", "jl")


def calibrate_noise_multiplier(
    *,
    target_epsilon: float,
    delta: float,
    steps: int,
    sampling_rate: float | None = None,
    mechanism: str | Callable[[float], Mechanism] = "gaussian",
    jl_projections: int | None = None,
    accountant: PLDAccountant | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
    progress: bool = False,
) -> float:
    """Smallest noise multiplier whose certified epsilon at ``delta`` is <= ``target_epsilon``.

    Bisection in log sigma on the accountant's certified upper bound (see the
    module docstring). All arguments are keyword-only, so eps and delta cannot
    be swapped by position.

    Args:
      target_epsilon: eps* > 0, the privacy budget to meet.
      delta: delta in (0, 1).
      steps: T >= 1, the number of steps (each one run of the mechanism).
      sampling_rate: Poisson sampling rate p in (0, 1]; required for
        ``mechanism="gaussian"`` and ``"jl"`` (1.0 = no subsampling), and must
        be left out for a callable mechanism (which sets its own rate).
      mechanism: ``"gaussian"`` (:class:`fdp.Gaussian`), ``"jl"``
        (:class:`fdp.JL`, needs ``jl_projections``) or a callable
        ``sigma -> fdp.Mechanism`` for any other one-step mechanism whose
        privacy decreases in sigma.
      jl_projections: r >= 1, the number of JL projections; only with
        ``mechanism="jl"``.
      accountant: a :class:`fdp.PLDAccountant` whose settings (grid,
        ``epsilon_rtol``, ...) are used. Mechanisms it has already recorded
        are composed in first, so the result calibrates the ``steps`` new
        steps against the *total* budget. It is not modified. Default: a
        ``PLDAccountant()`` with its sound defaults.
      tolerance: relative tolerance on sigma in [1e-9, 0.5]: the result hi
        and the largest sigma found to miss the target, lo, satisfy
        hi <= lo (1 + tolerance).
      progress: show a tqdm counter of accountant runs on stderr, updated at every
        probed sigma with the bracket so far and the certified epsilon there; each
        probe runs an accountant, a fraction of a second for the Gaussian, ~0.5 s
        for ``fdp.JL`` at r >= 10, about a second at r = 5.

    Returns:
      sigma (float) in [MIN_NOISE_MULTIPLIER, MAX_NOISE_MULTIPLIER] at which
      the accountant certified epsilon(delta) <= target_epsilon. If even
      MIN_NOISE_MULTIPLIER meets the target it is returned with a
      ``UserWarning`` (it meets the target but is not minimal).

    Raises:
      ValueError: an argument out of range (the message names it), or the
        target is unreachable: the certified epsilon at sigma =
        MAX_NOISE_MULTIPLIER still exceeds ``target_epsilon``.

    Examples:
      >>> import fdp
      >>> sigma = fdp.calibrate_noise_multiplier(
      ...     target_epsilon=2.0, delta=1e-5, steps=1000, sampling_rate=0.01)
    """
    eps_target = check_real("target_epsilon", target_epsilon, low=0.0, low_inclusive=False)
    delta = check_certifiable_delta(delta)  # below its floor every probe would fail alike
    steps = check_integer("steps", steps, low=1, high=MAX_STEPS)
    tol = check_real("tolerance", tolerance, low=1e-9, high=0.5)
    if accountant is not None and not isinstance(accountant, PLDAccountant):
        raise ValueError(
            f"accountant must be an fdp.PLDAccountant or None; got {type(accountant).__name__}"
        )
    factory, p, r = _mechanism_factory(mechanism, sampling_rate, jl_projections)
    template = accountant if accountant is not None else PLDAccountant()

    cache: dict[float, float] = {}
    failures: dict[float, str] = {}  # sigma -> why the accountant could not certify it
    from tqdm import tqdm  # a dependency; imported here, not with fdp

    bar = tqdm(desc="calibrate_noise_multiplier", unit="run", disable=not progress, file=sys.stderr,
               mininterval=0.0, miniters=1)
    bracket = [0.0, math.inf]  # largest sigma seen to miss, smallest seen to meet

    def eps_up(sigma: float) -> float:
        """Certified upper bound on epsilon at sigma; inf where the accountant fails."""
        if sigma not in cache:
            try:
                mech = factory(sigma)
            except ValueError as err:
                # refused at this sigma (e.g. random allocation at a small sigma, whose
                # lattice would not fit): missing the target, the safe side
                mech, cache[sigma], failures[sigma] = None, math.inf, str(err)
            if mech is not None:
                if not isinstance(mech, Mechanism):
                    raise ValueError(
                        "mechanism must return an fdp mechanism (e.g. fdp.Gaussian) for each "
                        f"noise multiplier; got {type(mech).__name__} at sigma={sigma:.6g}"
                    )
                acc = _fresh_accountant(template)
                acc.compose(mech, steps=steps)
                try:
                    with warnings.catch_warnings():  # probing sigmas far off the answer is expected
                        warnings.simplefilter("ignore", UserWarning)
                        cache[sigma] = float(acc.get_epsilon(delta))
                except ValueError as err:
                    # the accountant cannot certify this sigma (e.g. a loss range too
                    # wide for its grid): treat it as missing the target (safe side)
                    cache[sigma] = math.inf
                    failures[sigma] = str(err)
            if cache[sigma] <= eps_target:
                bracket[1] = min(bracket[1], sigma)
            else:
                bracket[0] = max(bracket[0], sigma)
            bar.set_postfix_str(f"sigma in [{bracket[0]:.6g}, {bracket[1]:.6g}], "
                                f"eps({sigma:.6g}) = {cache[sigma]:.6g}", refresh=False)
            bar.update(1)
        return cache[sigma]

    def meets(sigma: float) -> bool:
        return eps_up(sigma) <= eps_target

    try:
        guess = _start(eps_target, delta, steps, p, r)
        return _search(meets, eps_up, eps_target, delta, steps, guess, tol, failures)
    finally:
        bar.close()


def _search(meets: Callable[[float], bool], eps_up: Callable[[float], float], eps_target: float,
            delta: float, steps: int, guess: float, tol: float, failures: dict[float, str]) -> float:
    """Bracket [lo, hi] with meets(hi) and not meets(lo), then shrink it in log sigma."""
    seen: list[float] = []  # sigmas in the order probed

    def probe(sigma: float) -> bool:
        seen.append(sigma)
        return meets(sigma)

    def crossing() -> float | None:
        """log sigma where the line through the last two probes' log eps crosses log eps*;
        after one probe, the line of slope -1 (eps ~ 1/sigma) through it."""
        if len(seen) == 1 and 0.0 < eps_up(seen[0]) < math.inf:
            return math.log(seen[0] * eps_up(seen[0]) / eps_target)
        return _crossing(seen[-2:], eps_up, eps_target)

    # ---- bracket [lo, hi] with meets(hi) and not meets(lo): the extrapolated crossing
    # passed by 2 %, in steps of at most a factor 3 (then 1.46^2, 2.14^2, ...), or
    # geometric steps 1.1, 1.21, 1.46, ... where no crossing can be extrapolated
    s0 = min(max(guess, MIN_NOISE_MULTIPLIER), MAX_NOISE_MULTIPLIER)
    factor = 1.1
    if probe(s0):
        hi = s0
        while True:
            if hi <= MIN_NOISE_MULTIPLIER:
                warnings.warn(
                    f"target_epsilon={format_value(eps_target)} is already met at "
                    f"noise_multiplier={MIN_NOISE_MULTIPLIER:g}, the smallest searched; returning it "
                    "(it meets the target but smaller values were not tried)",
                    UserWarning,
                    stacklevel=3,  # the caller of calibrate_noise_multiplier
                )
                return MIN_NOISE_MULTIPLIER
            lo = max(hi / _bracket_step(crossing(), math.log(hi), -1.0, factor, tol), MIN_NOISE_MULTIPLIER)
            if not probe(lo):
                break
            hi, factor = lo, factor * factor
    else:
        lo = s0
        while True:
            if lo >= MAX_NOISE_MULTIPLIER:
                eps_max = eps_up(MAX_NOISE_MULTIPLIER)
                if MAX_NOISE_MULTIPLIER in failures:
                    raise ValueError(
                        f"cannot calibrate: the accountant could not certify noise_multiplier="
                        f"{MAX_NOISE_MULTIPLIER:g} ({failures[MAX_NOISE_MULTIPLIER]})"
                    )
                raise ValueError(
                    f"target_epsilon={format_value(eps_target)} is unreachable at delta={delta:g} "
                    f"with steps={steps}: even noise_multiplier={MAX_NOISE_MULTIPLIER:g} gives a "
                    f"certified epsilon of {eps_max:.6g}. Raise target_epsilon "
                    "or delta, or reduce steps or the sampling rate"
                )
            hi = min(lo * _bracket_step(crossing(), math.log(lo), 1.0, factor, tol), MAX_NOISE_MULTIPLIER)
            if probe(hi):
                break
            lo, factor = hi, factor * factor

    # ---- shrink [lo, hi]; both ends stay evaluated points. After two interpolated
    # probes in a row that did not halve the bracket (in log sigma) comes a bisection,
    # so the bracket at least halves every three probes whatever eps_up does.
    slow = 0
    while hi > lo * (1.0 + tol):
        width = hi / lo
        mid = None if slow >= 2 else _shrink_probe(crossing(), lo, hi, tol)
        if mid is None:
            mid = math.sqrt(lo * hi)
        if not lo < mid < hi:  # float resolution reached
            break
        if probe(mid):
            hi = mid
        else:
            lo = mid
        slow = slow + 1 if slow < 2 and (hi / lo) ** 2 > width else 0
    return hi


def _crossing(sigmas: list[float], eps_up: Callable[[float], float], eps_target: float) -> float | None:
    """log sigma where the line through (log sigma, log eps_up) at the two ``sigmas``
    crosses log eps*; None where that line is undefined or not decreasing."""
    if len(sigmas) < 2:
        return None
    (s1, s2), (e1, e2) = sigmas, (eps_up(sigmas[0]), eps_up(sigmas[1]))
    if not (s1 != s2 and 0.0 < e1 < math.inf and 0.0 < e2 < math.inf):
        return None
    x1, x2 = math.log(s1), math.log(s2)
    g1, g2 = math.log(e1 / eps_target), math.log(e2 / eps_target)
    slope = (g2 - g1) / (x2 - x1)
    if not slope < 0.0:
        return None
    return x2 - g2 / slope


def _bracket_step(x: float | None, x_end: float, direction: float, factor: float, tol: float) -> float:
    """Factor to move from exp(x_end) in ``direction`` (+1 up, -1 down): ``factor``, or
    the extrapolated crossing ``x`` passed by 2 % (at most max(factor^2, 3): a line
    through two points of log eps, which is typically convex in log sigma, reaches eps*
    early, not late; the first step's line of slope -1 overshoots it)."""
    if x is None or not (x - x_end) * direction > 0.0:
        return factor
    most = max(factor * factor, 3.0)
    # the exponent is capped first: a near-flat line extrapolates to |x| ~ 1e15 (exp overflows)
    return min(max(math.exp(min(abs(x - x_end), math.log(most))) * 1.02, 1.0 + tol), most)


def _shrink_probe(x: float | None, lo: float, hi: float, tol: float) -> float | None:
    """The next probe inside (lo, hi): the interpolated crossing ``x`` (eps ~ 1/sigma makes
    it nearly exact), moved by tol/4 towards the end further from it, so that this probe
    or the next closes the bracket, and kept min(5 % of the bracket, tol/4) clear of its
    ends (a crossing next to an end is probed there, not 5 % inside: that cost a probe).
    None (bisect) without a crossing."""
    if x is None:
        return None
    x_lo, x_hi = math.log(lo), math.log(hi)
    x += 0.25 * tol if x_hi - x > x - x_lo else -0.25 * tol
    margin = min(0.05 * (x_hi - x_lo), 0.25 * tol)
    return math.exp(min(max(x, x_lo + margin), x_hi - margin))


def _mechanism_factory(
    mechanism: Any, sampling_rate: Any, jl_projections: Any
) -> tuple[Callable[[float], Mechanism], float, int | None]:
    """(sigma -> Mechanism, p and r (JL; else None) for the initial guess), arguments checked."""
    if callable(mechanism) and not isinstance(mechanism, str):
        if sampling_rate is not None:
            raise ValueError(
                "sampling_rate must be left out (None) when mechanism is a callable: "
                f"the callable sets the mechanism's own rate; got sampling_rate={format_value(sampling_rate)}"
            )
        if jl_projections is not None:
            raise ValueError(
                "jl_projections is only used with mechanism='jl'; "
                f"got jl_projections={format_value(jl_projections)} with a callable mechanism"
            )
        probe = _first_built(mechanism)
        if not isinstance(probe, Mechanism):
            raise ValueError(
                "mechanism must be 'gaussian', 'jl' or a callable sigma -> fdp.Mechanism; "
                f"the callable returned {type(probe).__name__} for sigma=1.0"
            )
        return mechanism, float(probe.sampling_rate), None
    if not isinstance(mechanism, str) or mechanism.lower() not in _MECHANISMS:
        raise ValueError(
            "mechanism must be one of 'gaussian', 'jl' or a callable sigma -> fdp.Mechanism; "
            f"got {format_value(mechanism)}"
        )
    kind = mechanism.lower()
    if sampling_rate is None:
        raise ValueError(
            f"sampling_rate is required with mechanism={kind!r}: a Poisson sampling rate in (0, 1] "
            "(1.0 for no subsampling)"
        )
    p = check_sampling_rate(sampling_rate)
    if kind == "gaussian":
        if jl_projections is not None:
            raise ValueError(
                "jl_projections is only used with mechanism='jl'; "
                f"got jl_projections={format_value(jl_projections)} with mechanism='gaussian'"
            )
        from fdp.mechanisms.gaussian import Gaussian

        return (lambda sigma: Gaussian(noise_multiplier=sigma, sampling_rate=p)), p, None
    if jl_projections is None:
        raise ValueError("jl_projections is required with mechanism='jl': an integer in [1, inf), the r of "
                         "DP-SGD-JL (to find the fewest r for a given noise multiplier instead, use "
                         "fdp.fewest_jl_projections)")
    r = check_integer("jl_projections", jl_projections, low=1, high=10**9)
    from fdp.mechanisms.jl import JL

    return (lambda sigma: JL(noise_multiplier=sigma, jl_projections=r, sampling_rate=p)), p, r


def _first_built(mechanism: Callable[[float], Any]) -> Any:
    """mechanism(sigma) at sigma = 1, or at 10, 100, 1000 where smaller ones are refused
    (random allocation refuses a sigma whose lattice would not fit); the last refusal
    if every one is."""
    for sigma in (1.0, 10.0, 100.0):
        try:
            return mechanism(sigma)
        except ValueError:
            continue
    return mechanism(1000.0)


def _fresh_accountant(template: PLDAccountant) -> PLDAccountant:
    """A new accountant with ``template``'s settings and recorded events (template untouched)."""
    acc = template.fresh()
    for mech, count in template.events:
        acc.compose(mech, steps=count)
    return acc


def _initial_guess(eps: float, delta: float, steps: int, p: float) -> float:
    """sigma0 from the mu-GDP approximation (module docstring); 1.0 if that fails."""
    from scipy.optimize import brentq

    from fdp.tradeoff.gaussian import gaussian_delta

    def gap(mu: float) -> float:
        return float(gaussian_delta(eps, mu)) - delta

    try:
        hi = 1.0
        while gap(hi) <= 0.0:  # delta(eps; mu) increases in mu
            hi *= 2.0
            if hi > 1e6:
                return 1.0
        mu = brentq(gap, 0.0, hi, xtol=1e-12, rtol=1e-10)
        if not mu > 0.0:
            return 1.0
        if p == 1.0:
            return math.sqrt(steps) / mu
        ratio = mu / (p * math.sqrt(steps))
        return 1.0 / math.sqrt(math.log1p(ratio * ratio))
    except (ValueError, ZeroDivisionError, OverflowError):
        return 1.0


def _start(eps: float, delta: float, steps: int, p: float, r: int | None) -> float:
    """The first sigma probed: the mu-GDP guess, or for JL (r projections) the larger of
    it and the heavy-tail guess (the tail, not the bulk, usually decides JL's sigma)."""
    guess = _initial_guess(eps, delta, steps, p)
    return guess if r is None else max(guess, _jl_tail_guess(eps, delta, steps, p, r))


def _jl_tail_guess(eps: float, delta: float, steps: int, p: float, r: int) -> float:
    """sigma0 for fdp.JL from its heavy tail (a heuristic start, never a bound).

    A step whose example is sampled (probability p) with a large Z = 1/sqrt(chi2_r/r)
    has loss ~ Z^2 / (2 sigma^2); if such a step alone decides delta, then
    delta ~ T p P(Z > sigma sqrt(2 eps)), so

        sigma0 = z* / sqrt(2 eps*),   P(Z > z*) = delta / (T p).

    Measured at p = 256/25,000, T = 1,465, delta = 1e-5: 0.9-1.7x the calibrated
    sigma for r = 3..30 (the mu-GDP start is 0.03-0.8x of it)."""
    from fdp.mechanisms.random_sensitivity.laws import ChiLaw

    q = min(delta / (steps * p), 0.5)
    with np.errstate(all="ignore"):
        z = float(ChiLaw(r).isf(np.array(q)))
    return z / math.sqrt(2.0 * eps) if math.isfinite(z) and z > 0.0 else 1.0
