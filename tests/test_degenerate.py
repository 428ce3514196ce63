"""Degenerate and boundary cases of the accountant (issue 12, items 2, 3 and 7)."""

from __future__ import annotations

import math
import warnings

import mpmath
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis_budget import examples
from scipy import stats

import fdp
from fdp.pld.cells import Direction, Grid
from fdp.pld.discretise import discretise_optimistic, discretise_pessimistic

NULLS = [fdp.FromDistributions([0.5, 0.5], [0.5, 0.5]), fdp.RandomizedResponse(epsilon=0.0),
         fdp.RandomizedResponse(epsilon=0.0, sampling_rate=0.3)]


@pytest.mark.parametrize("null", NULLS, ids=["from_distributions", "rr0", "rr0_subsampled"])
def test_mechanisms_with_zero_privacy_loss_are_exact_no_ops(null):
    """Composed 1e10 times beside a Gaussian they moved eps (by 1 % in delta at 1e-4, and
    to inf at 1e-9): now the answers are identical to the Gaussian's alone."""
    assert null.is_null()
    gaussian = fdp.Gaussian(noise_multiplier=1.0, sampling_rate=0.01)
    alone = fdp.PLDAccountant().compose(gaussian, 1000)
    with_null = fdp.PLDAccountant().compose(gaussian, 1000).compose(null, 10**10)
    for delta in (1e-4, 1e-9):
        assert with_null.get_epsilon_bounds(delta) == alone.get_epsilon_bounds(delta)
    assert with_null.get_delta_bounds(1.0) == alone.get_delta_bounds(1.0)


@pytest.mark.parametrize("null", NULLS, ids=["from_distributions", "rr0", "rr0_subsampled"])
def test_a_null_mechanism_alone_spends_nothing(null):
    acc = fdp.PLDAccountant().compose(null, 10**10)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # [0, 1e-24] is not "wider than the tolerance"
        lo, hi = acc.get_epsilon_bounds(1e-9)
    assert lo == 0.0 and hi < 1e-12
    assert acc.get_delta_bounds(0.0)[1] < 1e-12


def test_a_mechanism_that_is_not_null_is_not_skipped():
    assert not fdp.RandomizedResponse(epsilon=1e-12).is_null()
    assert not fdp.FromDistributions([0.5, 0.5], [0.5 + 1e-15, 0.5 - 1e-15]).is_null()
    assert not fdp.Gaussian(noise_multiplier=1e6).is_null()


@pytest.mark.parametrize("sigma, steps", [(0.1, 1000), (0.5, 300)])
def test_delta_near_one_is_never_under_reported(sigma, steps):
    """The truth 1 - 2 Phi(-mu / 2) is 1.0 in float64 here: the upper bound must be 1.0 too
    (it was 1 - 5.7e-12), and the lower bound must not exceed it."""
    mu = math.sqrt(steps) / sigma
    truth = 1 - 2 * mpmath.ncdf(-mpmath.mpf(mu) / 2)
    acc = fdp.PLDAccountant().compose(fdp.Gaussian(noise_multiplier=sigma), steps)
    lo, hi = acc.get_delta_bounds(0.0)
    assert mpmath.mpf(lo) <= truth <= mpmath.mpf(hi)
    assert hi == 1.0


def test_tradeoff_of_a_plain_gaussian_composition_is_a_valid_curve():
    """sigma ~ 1.96, T = 125 raised "Q-masses sum to 1.0072 > 1"."""
    acc = fdp.PLDAccountant().compose(fdp.Gaussian(noise_multiplier=1.96), 125)
    curve = acc.tradeoff()
    mu = math.sqrt(125) / 1.96
    for alpha in (1e-6, 1e-3, 0.1, 0.5):
        # a lower bound on the Gaussian tradeoff curve G_mu(alpha) = Phi(Phi^-1(1 - alpha) - mu)
        exact = float(stats.norm.cdf(stats.norm.isf(alpha) - mu))
        assert 0.0 <= float(curve(alpha)) <= exact + 1e-9


def test_tradeoff_with_fft_noise_in_the_left_tail_is_a_valid_curve():
    """sigma = 0.6033, p = 0.01, T = 665 raised "Q-masses sum to 1.00000005 > 1": the
    curve was built from the composed atoms, whose FFT noise at losses near -20 is
    multiplied by e^20 in the Q-masses. It is now the envelope of the lines
    1 - delta_hi(eps) - e^eps alpha of the certified profile: valid by construction."""
    acc = fdp.PLDAccountant().compose(fdp.Gaussian(noise_multiplier=0.6033, sampling_rate=0.01), 665)
    curve = acc.tradeoff()
    alpha = np.linspace(0.0, 1.0, 201)
    beta = curve(alpha)
    assert np.all((beta >= 0.0) & (beta <= 1.0 - alpha + 1e-15)) and np.all(np.diff(beta) <= 0.0)
    # the delta the curve implies (its conjugate) is an upper bound: above the certified
    # lower bound on the truth, and close to the certified upper bound
    for eps in (0.5, 1.0, 2.0):
        lo, hi = acc.get_delta_bounds(eps)
        implied = float(curve.delta(eps))
        assert lo <= implied <= hi * (1 + 2e-3)


@given(sigma=st.floats(0.5, 5.0), steps=st.integers(1, 2000), p=st.sampled_from([1.0, 0.1, 0.01]))
@settings(max_examples=examples(20), deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_tradeoff_is_always_a_valid_lower_bound_search(sigma, steps, p):
    """A random search over Gaussian compositions: the curve is valid, and at p = 1 it
    lies below the exact mu-GDP curve G_mu(alpha) = Phi(Phi^-1(1 - alpha) - mu)."""
    acc = fdp.PLDAccountant().compose(fdp.Gaussian(noise_multiplier=sigma, sampling_rate=p), steps)
    curve = acc.tradeoff()
    alpha = np.concatenate([[0.0, 1e-9, 1e-6], np.linspace(1e-3, 1.0, 60)])
    beta = curve(alpha)
    assert np.all((beta >= 0.0) & (beta <= 1.0 - alpha + 1e-15)) and np.all(np.diff(beta) <= 1e-15)
    if p == 1.0:
        mu = math.sqrt(steps) / sigma
        exact = stats.norm.cdf(stats.norm.isf(alpha) - mu)
        assert np.all(beta <= exact + 1e-12)


def test_the_profile_on_the_grid_is_the_bound_at_every_grid_point():
    """DiscretePLD.profile_on_grid (O(n), used by tradeoff) against delta() point by point."""
    acc = fdp.PLDAccountant().compose(fdp.Gaussian(noise_multiplier=0.8, sampling_rate=0.05), 300)
    for pessimistic in (True, False):
        pld = acc.composed_pld("remove", pessimistic=pessimistic)
        eps, delta = pld.profile_on_grid()
        pick = np.linspace(0, eps.size - 1, 300).astype(int)
        direct = pld.delta(eps[pick])
        # the two sum in different orders: equal to 1e-9 relative even at delta ~ 1e-12
        np.testing.assert_allclose(delta[pick], direct, rtol=1e-9, atol=1e-300)
        # the recursion's round-off factor is applied on the safe side
        assert np.all(delta[pick] >= direct) if pessimistic else np.all(delta[pick] <= direct)


def test_an_infinite_loss_atom_above_delta_gives_infinite_lower_and_upper_bounds():
    """P puts 1 - 0.999^3 ~ 3e-3 where Q has none after 3 steps: eps(1e-4) is +inf exactly,
    and both ends of the bracket must say so (a lower bound of 0 would be valid but useless)."""
    acc = fdp.PLDAccountant().compose(fdp.FromDistributions([0.999, 0.001], [1.0, 0.0]), steps=3)
    with pytest.warns(UserWarning, match="is inf"):
        assert acc.get_epsilon_bounds(1e-4) == (math.inf, math.inf)


@pytest.mark.parametrize("c, steps", [(0.3, 1), (0.3, 10), (0.01, 1000), (1.7, 7)])
def test_a_point_mass_pld_composes_exactly(c, steps):
    """P = (1, 0), Q = (e^-c, 1 - e^-c): removing has the single loss c, so T steps have
    the single loss Tc and delta(eps) = (1 - e^{eps - Tc})_+; adding puts 1 - e^{-Tc}
    at +inf. Both sides of both directions reproduce these to within the FFT's
    round-off charge (~1e-12 per step): the grid spacing is chosen so that a grid point
    is the atom's loss itself (before, it was one ulp off and the lower bound rounded
    the atom down a whole cell: an error of ~h = 1e-9 at T = 1, 1e-6 at T = 1000)."""
    m = fdp.FromDistributions([1.0, 0.0], [math.exp(-c), -math.expm1(-c)])
    acc = fdp.PLDAccountant().compose(m, steps)
    for eps in (0.0, 0.5 * steps * c, 0.99 * steps * c):
        exact = -math.expm1(eps - steps * c)
        lo = float(acc.composed_pld("remove", pessimistic=False).delta(eps))
        hi = float(acc.composed_pld("remove", pessimistic=True).delta(eps))
        assert lo <= exact <= hi and hi - lo <= 1e-12 * steps
        lo, hi = acc.get_delta_bounds(eps)
        exact_add = -math.expm1(-steps * c)
        assert lo <= max(exact, exact_add) <= hi and hi - lo <= 1e-12 * steps


@pytest.mark.parametrize("mech", [fdp.JL(noise_multiplier=2.2752, jl_projections=4),
                                  fdp.Gaussian(noise_multiplier=0.02)], ids=["jl_p1", "gaussian_sigma_0.02"])
@pytest.mark.parametrize("direction", list(Direction))
def test_cells_of_a_grid_that_ends_beyond_loss_709_have_no_nan(mech, direction):
    """e^ell of the grid's end overflowed and met a tail with no Q-mass: inf * 0 = nan in
    the right tail's excess (and the left tail's deficit), which the merging sweep turned
    into a ZeroDivisionError (found by a red team: get_delta_bounds(40.1) of a Gaussian
    composed with JL r = 4 at p = 1 crashed)."""
    lo, hi = mech.loss_range(direction, 1e-12)
    grid = Grid.covering(min(lo, -1.0), max(hi, 2000.0), 1.0)
    for pessimistic in (True, False):
        cells = mech.loss_cells(direction, grid, pessimistic=pessimistic)
        for name in ("p_left", "d_left", "p_right", "u_right", "p_inf"):
            assert not math.isnan(getattr(cells, name)), name
        pld = (discretise_pessimistic if pessimistic else discretise_optimistic)(cells)
        assert np.all(np.isfinite(pld.pmf)) and math.isfinite(float(pld.delta(1.0)))


def test_gaussian_composed_with_jl_at_p1_answers_a_delta_query():
    acc = fdp.PLDAccountant().compose(fdp.Gaussian(noise_multiplier=6.4919, sampling_rate=0.1), steps=68)
    acc.compose(fdp.JL(noise_multiplier=2.2752, jl_projections=4), steps=14)
    lo, hi = acc.get_delta_bounds(40.13)
    assert 0 < lo <= hi < 1e-3
    # and the epsilon query lands on the right side of 40.13 at both ends
    assert acc.get_epsilon_bounds(hi)[0] <= 40.13 <= acc.get_epsilon_bounds(lo)[1]
