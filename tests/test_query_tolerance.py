"""Every bracket wider than its tolerance says so, with advice that narrows it; delta
queries at huge mu (sqrt(T) / sigma ~ 1e4) answer instead of overflowing."""

from __future__ import annotations

import math
import re
import warnings

import mpmath as mp
import pytest

import fdp


def _delta_query(acc: fdp.PLDAccountant, epsilon: float) -> tuple[tuple[float, float], list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bounds = acc.get_delta_bounds(epsilon)
    return bounds, [str(w.message) for w in caught if issubclass(w.category, UserWarning)]


def _advised(acc: fdp.PLDAccountant, message: str) -> fdp.PLDAccountant:
    """The same accountant with the setting the warning names."""
    name, value = re.search(r"(grid_spacing|max_refinements|grid_scale|max_points)=([0-9.e+-]+)", message).groups()
    settings = {k: getattr(acc, k) for k in ("grid_spacing", "grid_scale", "epsilon_rtol", "max_refinements",
                                              "max_points")}
    settings[name] = int(value) if name in ("max_refinements", "max_points") else float(value)
    new = fdp.PLDAccountant(**settings)
    for mechanism, steps in acc.events:
        new.compose(mechanism, steps)
    return new


def _mixed(**settings) -> fdp.PLDAccountant:
    acc = fdp.PLDAccountant(**settings).compose(fdp.RandomizedResponse(epsilon=0.3), 10)
    return acc.compose(fdp.Gaussian(noise_multiplier=3.0), 20)


def _subsampled(**settings) -> fdp.PLDAccountant:
    return fdp.PLDAccountant(**settings).compose(fdp.Gaussian(noise_multiplier=1.0, sampling_rate=0.1), 100)


@pytest.mark.parametrize("make, epsilon", [
    (lambda: _subsampled(grid_spacing=0.5), 1.0),  # 28 % wide, silent before
    (lambda: _mixed(max_refinements=1), 5.0),  # RR atoms off the Gaussians' grid
], ids=["fixed-grid", "refinements"])
def test_a_wide_delta_bracket_warns_and_its_advice_narrows_it(make, epsilon):
    acc = make()
    (lo, hi), messages = _delta_query(acc, epsilon)
    assert hi - lo > acc.epsilon_rtol * hi
    assert len(messages) == 1 and "delta bounds" in messages[0]
    assert "narrow it with" in messages[0] or "try a finer grid" in messages[0]
    (lo2, hi2), _ = _delta_query(_advised(acc, messages[0]), epsilon)
    assert hi2 - lo2 < 0.5 * (hi - lo)
    assert max(lo, lo2) <= min(hi, hi2)  # both are brackets of the same truth


def test_atoms_off_the_grid_are_warned_of_with_a_setting_that_narrows_them():
    """RR(0.3) x 10 + Gaussian(3) x 20 at eps = 5: the merging side moved 8.7e-5, then
    3.5e-4 of a 6.4e-4 gap as h halved; the first small move stopped its refinement,
    leaving [0.00953, 0.01007] (5.4 %) in silence. The warning now names a finer grid,
    which narrows it."""
    acc = _mixed()
    (lo, hi), messages = _delta_query(acc, 5.0)
    assert messages and "grid_scale=0.0025" in messages[0]
    (lo2, hi2), messages = _delta_query(_advised(acc, messages[0]), 5.0)
    assert not messages and hi2 - lo2 < 0.2 * (hi - lo)


def test_a_lower_bound_still_zero_is_refined_on():
    """Laplace(10), one step, delta(0.099) ~ 5e-4: the lower bound stays 0 until h resolves
    the 0.001 between eps and the top loss 0.1; an unchanged 0 stopped the refinement
    (a lower bound of 0, a warning that no setting helps)."""
    (lo, hi), messages = _delta_query(fdp.PLDAccountant().compose(fdp.Laplace(scale=10.0), 1), 0.099)
    exact = -math.expm1((0.099 - 0.1) / 2)
    assert 0.25 * exact < lo <= exact <= hi and not messages


def test_a_delta_bracket_of_a_heavy_tail_is_not_silent():
    """JL(2, r = 100), one step, delta(5) ~ 5.6e-17 came out [3.19e-17, 2.39e-16] with no
    warning, while the epsilon query on the same accountant warned."""
    acc = fdp.PLDAccountant().compose(fdp.JL(noise_multiplier=2.0, jl_projections=100, sampling_rate=1.0), 1)
    (lo, hi), messages = _delta_query(acc, 5.0)
    assert lo <= hi
    if hi - lo > acc.epsilon_rtol * hi:
        assert messages and "delta bounds" in messages[0]


@pytest.mark.parametrize("make, epsilon", [
    (lambda: fdp.PLDAccountant().compose(fdp.Gaussian(noise_multiplier=1.1, sampling_rate=256 / 60000), 14100), 2.0),
    (lambda: fdp.PLDAccountant().compose(fdp.Gaussian(noise_multiplier=2.0), 10), 1.0),
    (lambda: fdp.PLDAccountant().compose(fdp.Laplace(scale=2.0), 5), 0.5),
])
def test_tight_delta_brackets_are_silent(make, epsilon):
    (lo, hi), messages = _delta_query(make(), epsilon)
    assert not messages and lo <= hi


def _mu_gdp_delta(mu: float, epsilon: float) -> mp.mpf:
    """delta(eps) of mu-GDP: Phi(-eps / mu + mu / 2) - e^eps Phi(-eps / mu - mu / 2)."""
    with mp.workdps(60):
        mu, eps = mp.mpf(mu), mp.mpf(epsilon)
        return mp.ncdf(-eps / mu + mu / 2) - mp.e**eps * mp.ncdf(-eps / mu - mu / 2)


@pytest.mark.parametrize("sigma, steps, epsilon", [
    (0.05, 10**6, 10.0),  # mu = 2e4: OverflowError "int too big to convert" before
    (0.1, 10**7, 10.0),
    (0.05, 10**6, 1e6),
    (0.01, 10**5, 100.0),
])
def test_delta_at_huge_mu_brackets_the_closed_form(sigma, steps, epsilon):
    acc = fdp.PLDAccountant().compose(fdp.Gaussian(noise_multiplier=sigma), steps)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lo, hi = acc.get_delta_bounds(epsilon)
    exact = _mu_gdp_delta(math.sqrt(steps) / sigma, epsilon)
    assert mp.mpf(lo) <= exact <= mp.mpf(hi)
    assert lo > 0.99  # the truth is 1 - 1e-(huge)
