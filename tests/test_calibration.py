"""fdp.calibrate_noise_multiplier: the result meets the target, is minimal up to
the tolerance, matches the mu-GDP closed form at p = 1, orders JL above Gaussian,
and bad input raises a ValueError naming the argument."""

from __future__ import annotations

import contextlib
import math
import re

import numpy as np
import pytest
from scipy.optimize import brentq

import fdp
from fdp.calibration import MAX_NOISE_MULTIPLIER, MIN_NOISE_MULTIPLIER
from fdp.tradeoff.gaussian import gaussian_delta

DELTA = 1e-5


def _eps_up(mech, steps, delta=DELTA, accountant=None):
    acc = accountant if accountant is not None else fdp.PLDAccountant()
    return acc.compose(mech, steps=steps).get_epsilon(delta)


@pytest.mark.parametrize(
    ("target", "steps", "p"),
    [(2.0, 1000, 0.01), (1.0, 200, 0.05), (8.0, 50, 1.0), (0.5, 1, 1.0)],
)
def test_meets_target_and_is_minimal(target, steps, p):
    tol = 1e-3
    sigma = fdp.calibrate_noise_multiplier(
        target_epsilon=target, delta=DELTA, steps=steps, sampling_rate=p, tolerance=tol
    )
    assert MIN_NOISE_MULTIPLIER < sigma < MAX_NOISE_MULTIPLIER
    assert _eps_up(fdp.Gaussian(noise_multiplier=sigma, sampling_rate=p), steps) <= target
    # the search's lower end lo >= sigma / (1 + tol) missed the target; a bit less noise misses it too
    below = sigma * (1.0 - tol)
    assert _eps_up(fdp.Gaussian(noise_multiplier=below, sampling_rate=p), steps) > target


@pytest.mark.parametrize(("target", "steps"), [(1.0, 100), (3.0, 1000), (0.3, 10)])
def test_matches_mu_gdp_closed_form_without_subsampling(target, steps):
    # T Gaussian steps at p = 1 are exactly mu-GDP with mu = sqrt(T) / sigma
    # (Dong-Roth-Su, arXiv:1905.02383v3, composition section), whose delta(eps)
    # is Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) (primal-dual section).
    mu_star = brentq(lambda mu: float(gaussian_delta(target, mu)) - DELTA, 1e-6, 100.0, xtol=1e-14)
    sigma_exact = math.sqrt(steps) / mu_star
    tol = 1e-3
    acc = fdp.PLDAccountant()
    sigma = fdp.calibrate_noise_multiplier(
        target_epsilon=target, delta=DELTA, steps=steps, sampling_rate=1.0, tolerance=tol,
        accountant=acc,
    )
    # the certified eps is >= the exact one, so sigma >= sigma_exact; it exceeds it by at
    # most the tolerance plus the accountant's slack (epsilon_rtol, eps ~ 1/sigma)
    assert sigma >= sigma_exact * (1.0 - 1e-12)
    assert sigma <= sigma_exact * (1.0 + tol + 2.0 * acc.epsilon_rtol)


def test_jl_needs_at_least_the_gaussian_noise():
    r = 30
    # JL's epsilon is above the Gaussian one at these settings (a measured fact: its Z
    # is random and heavy-tailed, docs/jl.md), so its calibrated sigma is at least the Gaussian one. A coarse accountant keeps this
    # fast; the JL upper bound is dominated by its Z-quadrature, not by the grid.
    def coarse():
        return fdp.PLDAccountant(max_refinements=0, grid_scale=0.2)

    kwargs = dict(target_epsilon=5.0, delta=DELTA, steps=10, sampling_rate=1.0, tolerance=2e-2)
    gauss = fdp.calibrate_noise_multiplier(accountant=coarse(), **kwargs)
    jl = fdp.calibrate_noise_multiplier(mechanism="jl", jl_projections=r, accountant=coarse(), **kwargs)
    assert jl >= gauss
    acc = coarse().compose(fdp.JL(noise_multiplier=jl, jl_projections=r), steps=10)
    assert acc.get_epsilon(DELTA) <= 5.0


def test_callable_mechanism_and_accountant_template():
    acc = fdp.PLDAccountant(epsilon_rtol=1e-2)
    acc.compose(fdp.Gaussian(noise_multiplier=2.0, sampling_rate=0.02), steps=100)
    before = acc.to_json()

    def make(sigma):
        return fdp.Gaussian(noise_multiplier=sigma, sampling_rate=0.02)

    sigma = fdp.calibrate_noise_multiplier(
        target_epsilon=2.0, delta=DELTA, steps=300, mechanism=make, accountant=acc, tolerance=1e-2
    )
    assert acc.to_json() == before  # the template is not modified
    # the recorded 100 steps count against the budget
    total = fdp.PLDAccountant.from_json(before).compose(make(sigma), steps=300)
    assert total.get_epsilon(DELTA) <= 2.0
    alone = fdp.calibrate_noise_multiplier(
        target_epsilon=2.0, delta=DELTA, steps=300, sampling_rate=0.02, tolerance=1e-2,
        accountant=fdp.PLDAccountant(epsilon_rtol=1e-2),
    )
    assert sigma > alone


def test_more_budget_needs_less_noise():
    sigmas = [
        fdp.calibrate_noise_multiplier(
            target_epsilon=eps, delta=DELTA, steps=100, sampling_rate=0.1, tolerance=1e-2
        )
        for eps in (0.5, 1.0, 4.0)
    ]
    assert sigmas[0] > sigmas[1] > sigmas[2]


def test_unreachable_target_raises():
    with pytest.raises(ValueError, match=r"target_epsilon=1e-06 is unreachable .*noise_multiplier=1e\+06"):
        fdp.calibrate_noise_multiplier(target_epsilon=1e-6, delta=1e-10, steps=1000, sampling_rate=1.0)


def test_target_met_at_the_smallest_sigma_warns():
    with pytest.warns(UserWarning, match=r"already met at noise_multiplier=0.01"):
        sigma = fdp.calibrate_noise_multiplier(
            target_epsilon=1e5, delta=DELTA, steps=1, sampling_rate=1.0
        )
    assert sigma == MIN_NOISE_MULTIPLIER


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"target_epsilon": 0.0}, r"target_epsilon must be in \(0, inf\); got 0.0"),
        ({"target_epsilon": -1.0}, r"target_epsilon must be in \(0, inf\)"),
        ({"target_epsilon": float("nan")}, r"target_epsilon must be a finite number .*; got nan"),
        ({"target_epsilon": float("inf")}, r"target_epsilon must be a finite number"),
        ({"target_epsilon": np.float64("nan")}, r"target_epsilon .*; got nan$"),
        ({"delta": 0.0}, r"delta must be in \(0, 1\); got 0.0"),
        ({"delta": 1.0}, r"delta must be in \(0, 1\)"),
        ({"delta": float("nan")}, r"delta must be a finite number"),
        ({"steps": 0}, r"steps must be an integer in \[1, "),
        ({"steps": 2.5}, r"steps must be an integer .*; got 2.5"),
        ({"steps": 10**12}, r"steps must be an integer in \[1, "),
        ({"sampling_rate": 0.0}, r"sampling_rate must be in \(0, 1\]; got 0.0"),
        ({"sampling_rate": 1.5}, r"sampling_rate must be in \(0, 1\]"),
        ({"sampling_rate": None}, r"sampling_rate is required with mechanism='gaussian'"),
        ({"tolerance": 0.0}, r"tolerance must be in \[1e-09, 0.5\]; got 0.0"),
        ({"tolerance": 0.9}, r"tolerance must be in \[1e-09, 0.5\]"),
        ({"mechanism": "laplace"}, r"mechanism must be one of 'gaussian', 'jl' .*; got 'laplace'"),
        ({"mechanism": 3}, r"mechanism must be one of"),
        ({"mechanism": "jl"}, r"jl_projections is required with mechanism='jl'"),
        ({"mechanism": "jl", "jl_projections": 0}, r"jl_projections must be an integer in \[1, "),
        ({"jl_projections": 5}, r"jl_projections is only used with mechanism='jl'"),
        ({"mechanism": lambda s: fdp.Gaussian(noise_multiplier=s)},
         r"sampling_rate must be left out \(None\) when mechanism is a callable"),
        ({"mechanism": lambda s: s, "sampling_rate": None},
         r"mechanism must be 'gaussian', 'jl' or a callable sigma -> fdp.Mechanism; the callable returned float"),
        ({"accountant": "pld"}, r"accountant must be an fdp.PLDAccountant or None; got str"),
    ],
)
def test_bad_input(kwargs, match):
    args = dict(target_epsilon=1.0, delta=DELTA, steps=10, sampling_rate=0.5)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        fdp.calibrate_noise_multiplier(**args)


def test_arguments_are_keyword_only():
    with pytest.raises(TypeError):
        fdp.calibrate_noise_multiplier(1.0, DELTA, 10, 0.5)  # type: ignore[misc]


@contextlib.contextmanager
def _counting_runs():
    """Records one entry per accountant run (``PLDAccountant.get_epsilon`` call)."""
    runs: list[float] = []
    original = fdp.PLDAccountant.get_epsilon

    def counting(self, delta):
        runs.append(delta)
        return original(self, delta)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fdp.PLDAccountant, "get_epsilon", counting)
        yield runs


def test_progress_reports_each_probe_on_stderr(capsys):
    with _counting_runs() as runs:
        sigma = fdp.calibrate_noise_multiplier(target_epsilon=2.0, delta=1e-5, steps=500,
                                               sampling_rate=0.02, progress=True)
    # a tqdm counter: one refresh per accountant run, each with the bracket so far
    err = capsys.readouterr().err
    pattern = re.compile(r"calibrate_noise_multiplier: (\d+)run.*sigma in \[([^,]+), ([^\]]+)\]")
    shown = [m.groups() for m in map(pattern.search, re.split(r"[\r\n]", err)) if m]
    counts = [int(n) for n, _, _ in shown]
    assert sorted(set(counts)) == counts[:len(set(counts))] == list(range(1, len(runs) + 1))
    assert len(runs) >= 3  # bracketing and shrinking: one update per accountant run
    lo, hi = float(shown[-1][1]), float(shown[-1][2])
    assert lo < sigma == pytest.approx(hi, rel=1e-5)
    fdp.calibrate_noise_multiplier(target_epsilon=2.0, delta=1e-5, steps=500, sampling_rate=0.02)
    assert capsys.readouterr().err == ""  # silent by default


def test_warning_points_at_the_caller():
    with pytest.warns(UserWarning, match="already met") as record:
        fdp.calibrate_noise_multiplier(target_epsilon=1e6, delta=0.5, steps=1, sampling_rate=1e-6)
    assert record[0].filename == __file__


def _mu_gdp_sigma(target: float, delta: float, steps: int) -> float:
    """sigma with delta(target; mu = sqrt(T)/sigma) = delta exactly, in mpmath (50 digits):
    float64 differences of Phi lose the tiny deltas."""
    import mpmath as mp

    mp.mp.dps = 50

    def log_gap(log_mu):
        mu = mp.e ** log_mu
        d = mp.ncdf(-target / mu + mu / 2) - mp.e ** target * mp.ncdf(-target / mu - mu / 2)
        return mp.log(d) - mp.log(delta)

    lo, hi = mp.mpf(-6), mp.mpf(6)  # log_gap increases in log mu: bisection
    assert log_gap(lo) < 0 < log_gap(hi)
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if log_gap(mid) < 0 else (lo, mid)
    return float(mp.sqrt(steps) / mp.e ** ((lo + hi) / 2))


@pytest.mark.parametrize(("target", "delta", "steps"), [(2.0, 1e-12, 100), (8.0, 1e-30, 100), (10.0, 1e-100, 100)])
def test_tiny_delta_matches_the_closed_form(target, delta, steps):
    """At delta = 1e-30 the search used to call a reachable target unreachable (every
    probe refused by the accountant counted as a miss); now it finds the mu-GDP sigma."""
    sigma_exact = _mu_gdp_sigma(target, delta, steps)
    tol = 1e-3
    sigma = fdp.calibrate_noise_multiplier(target_epsilon=target, delta=delta, steps=steps,
                                           sampling_rate=1.0, tolerance=tol)
    assert sigma_exact * (1.0 - 1e-9) <= sigma <= sigma_exact * (1.0 + tol + 2e-3)


def test_tiny_delta_subsampled_meets_and_is_minimal():
    target, delta, steps, p, tol = 3.0, 1e-30, 1000, 0.01, 1e-3
    sigma = fdp.calibrate_noise_multiplier(target_epsilon=target, delta=delta, steps=steps,
                                           sampling_rate=p, tolerance=tol)
    assert _eps_up(fdp.Gaussian(noise_multiplier=sigma, sampling_rate=p), steps, delta) <= target
    assert _eps_up(fdp.Gaussian(noise_multiplier=sigma * (1 - tol), sampling_rate=p), steps, delta) > target


def test_certified_epsilon_is_monotone_in_sigma_at_tiny_delta():
    """What the bisection relies on: the probed upper bound never rises with sigma."""
    sigmas = np.geomspace(1.6, 1.75, 12)
    eps = [_eps_up(fdp.Gaussian(noise_multiplier=s, sampling_rate=0.01), 1000, 1e-30) for s in sigmas]
    assert all(b < a for a, b in zip(eps, eps[1:]))


def test_delta_below_the_accountants_floor_is_refused_up_front():
    with pytest.raises(ValueError, match="smallest delta the accountant certifies"):
        fdp.calibrate_noise_multiplier(target_epsilon=1.0, delta=1e-300, steps=10, sampling_rate=1.0)


def _counting(make):
    calls: list[float] = []

    def factory(sigma: float):
        calls.append(sigma)
        return make(sigma)

    return factory, calls


def test_interpolated_search_needs_few_accountant_runs():
    """eps ~ 1/sigma: interpolating log eps in log sigma closes a 1e-3 bracket in a few
    probes (plain bisection from the first bracket took 10 to 11)."""
    factory, calls = _counting(lambda s: fdp.Gaussian(noise_multiplier=s, sampling_rate=0.01))
    sigma = fdp.calibrate_noise_multiplier(target_epsilon=2.0, delta=DELTA, steps=1000, mechanism=factory)
    probes = len(calls) - 1  # the first call only checks what the callable returns
    assert probes <= 7
    assert _eps_up(fdp.Gaussian(noise_multiplier=sigma, sampling_rate=0.01), 1000) <= 2.0
    assert _eps_up(fdp.Gaussian(noise_multiplier=sigma / 1.001, sampling_rate=0.01), 1000) > 2.0


def test_search_still_brackets_a_staircase_epsilon():
    """A hostile eps(sigma): constant on steps of sigma (the mechanism uses sigma rounded
    down to a multiple of 0.25), so interpolation is meaningless. The safeguard
    bisections still close the bracket: the result meets the target, sigma / (1 + tol)
    does not, in a bounded number of probes."""
    def make(s):
        return fdp.Gaussian(noise_multiplier=max(0.25 * math.floor(s / 0.25), 0.25), sampling_rate=1.0)

    factory, calls = _counting(make)
    tol = 1e-3
    sigma = fdp.calibrate_noise_multiplier(target_epsilon=3.0, delta=DELTA, steps=10, mechanism=factory,
                                           tolerance=tol)
    assert len(calls) < 60
    acc = fdp.PLDAccountant
    assert acc().compose(make(sigma), steps=10).get_epsilon(DELTA) <= 3.0
    assert acc().compose(make(sigma / (1 + tol)), steps=10).get_epsilon(DELTA) > 3.0


@pytest.mark.parametrize("r, target", [(10, 8.0), (3, 20.0)])
def test_jl_search_starts_within_a_factor_two_of_the_answer(r, target):
    """The first sigma probed for fdp.JL is within 2x of where the certified epsilon
    crosses the target (the mu-GDP start alone was 0.45x at r = 10 and 0.03x at r = 3,
    where the first probe, far into the heavy tail, also costs the most)."""
    from fdp.calibration import _start

    p, steps, delta = 256 / 25000, 1465, 1e-5
    start = _start(target, delta, steps, p, r)

    def eps(sigma):
        mech = fdp.JL(noise_multiplier=sigma, jl_projections=r, sampling_rate=p)
        return fdp.PLDAccountant(max_refinements=0).compose(mech, steps=steps).get_epsilon_bounds(delta)

    assert eps(start / 2)[0] > target  # a lower bound above the target: start / 2 misses it
    assert eps(2 * start)[1] <= target  # an upper bound below: 2 start meets it


def test_a_crossing_next_to_a_bracket_end_is_probed_there():
    """JL r = 5 at the seed's setting, target 20: the third probe misses by 0.4 % and the
    interpolated crossing lies 0.17 % above it, inside the 5 % margin the search used to
    keep from the bracket's ends; probing 5 % in cost a sixth accountant run. Now five."""
    with _counting_runs() as runs:
        sigma = fdp.calibrate_noise_multiplier(target_epsilon=20.0, delta=1e-5, steps=1465,
                                               sampling_rate=256 / 25000, mechanism="jl", jl_projections=5)
    assert len(runs) <= 5
    jl = fdp.JL(noise_multiplier=sigma, sampling_rate=256 / 25000, jl_projections=5)
    assert fdp.PLDAccountant().compose(jl, steps=1465).get_epsilon(1e-5) <= 20.0


def test_a_far_extrapolated_crossing_is_a_bounded_step_not_an_overflow():
    """A near-flat line through two probes extrapolates the crossing to |log sigma| ~ 1e15;
    the step is capped at max(factor^2, 3) (exp of the raw distance overflowed)."""
    from fdp.calibration import _bracket_step

    assert _bracket_step(-2.3e15, -4.07, -1.0, 1.4641, 1e-3) == 3.0
    assert _bracket_step(2.3e15, 0.0, 1.0, 2.0, 1e-3) == 4.0
    assert _bracket_step(-4.0 - math.log(1.5), -4.0, -1.0, 1.1, 1e-3) == pytest.approx(1.5 * 1.02)
