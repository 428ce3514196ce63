"""The PLD accountant against closed forms, peers and its own invariants."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import optimize, special

import fdp
from fdp.mechanisms.gaussian import subsampled_gaussian_delta
from fdp.pld.cells import Direction, Grid
from fdp.pld.discretise import discretise_optimistic, discretise_pessimistic


def gdp_delta(eps: float, mu: float) -> float:
    """mu-GDP delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) (Dong-Roth-Su Cor. 2.13)."""
    a = special.log_ndtr(-eps / mu + mu / 2)
    b = eps + special.log_ndtr(-eps / mu - mu / 2)
    return float(np.exp(a) * -np.expm1(b - a))


def gdp_epsilon(delta: float, mu: float) -> float:
    return optimize.brentq(lambda e: gdp_delta(e, mu) - delta, 0.0, 50 * mu + 50 * mu * mu, xtol=1e-13)


@pytest.mark.parametrize("sigma,steps", [(1.0, 1), (2.0, 50), (5.0, 1000), (0.7, 3)])
def test_composed_gaussian_brackets_sqrt_t_gdp(sigma, steps):
    acc = fdp.PLDAccountant().compose(fdp.Gaussian(noise_multiplier=sigma), steps=steps)
    mu = math.sqrt(steps) / sigma
    for delta in (1e-3, 1e-6, 1e-9):
        lo, hi = acc.get_epsilon_bounds(delta)
        exact = gdp_epsilon(delta, mu)
        assert lo <= exact <= hi
        assert hi - lo <= 2e-3 * hi
    for eps in (0.0, 0.5, 2.0):
        dlo, dhi = acc.get_delta_bounds(eps)
        exact = gdp_delta(eps, mu)
        assert dlo <= exact * (1 + 1e-9) + 1e-15
        assert exact <= dhi * (1 + 1e-9) + 1e-15


@pytest.mark.parametrize("p", [1.0, 0.3, 0.01])
@pytest.mark.parametrize("direction", list(Direction))
def test_single_step_discretisations_bracket_exact_delta(p, direction):
    """Pessimistic >= exact >= optimistic for every eps, on and off the grid."""
    mech = fdp.Gaussian(noise_multiplier=0.9, sampling_rate=p)
    lo, hi = mech.loss_range(direction, 1e-18)
    grid = Grid.covering(lo, hi, 0.01)
    cells = mech.loss_cells(direction, grid, pessimistic=True)
    pess, opt = discretise_pessimistic(cells), discretise_optimistic(cells)
    assert pess.pmf.sum() + pess.p_inf == pytest.approx(1.0, abs=1e-12)
    eps = np.linspace(-1.0, 4.0, 137)  # mostly off-grid
    exact = subsampled_gaussian_delta(eps, mech.mu, p, direction)
    assert np.all(pess.delta(eps) >= exact - 1e-14)
    assert np.all(opt.delta(eps) <= exact + 1e-14)
    # and they are tight, even on this coarse grid (h = 0.01 is the width of the
    # whole p = 0.01 loss distribution; the merging bound is the looser one there)
    assert np.max(pess.delta(eps) - exact) < 1e-3
    assert np.max(exact - opt.delta(eps)) < 5e-3


def test_remove_and_add_are_both_accounted():
    """With subsampling the two directions differ; the accountant reports the max."""
    mech = fdp.Gaussian(noise_multiplier=0.8, sampling_rate=0.05)
    acc = fdp.PLDAccountant().compose(mech, steps=20)
    delta = 1e-6
    rem = acc.composed_pld("remove", tail_mass=1e-9).epsilon(delta)
    add = acc.composed_pld("add", tail_mass=1e-9).epsilon(delta)
    assert rem != pytest.approx(add, rel=1e-3)
    assert acc.get_epsilon(delta) == pytest.approx(max(rem, add), rel=1e-3)
    # single step: remove dominates for eps > 0, add for eps < 0 (the hockey stick of
    # the reversed pair); the composed curve needs both
    eps = np.array([-0.5, -0.03, 0.03, 0.5])
    d_rem = mech.delta(eps, Direction.REMOVE)
    d_add = mech.delta(eps, Direction.ADD)
    assert np.all(d_add[:2] > d_rem[:2])
    assert np.all(d_rem[2:] > d_add[2:])


def test_upper_bound_never_below_lower_and_monotone_in_steps():
    mech = fdp.Gaussian(noise_multiplier=1.0, sampling_rate=0.02)
    previous = 0.0
    for steps in (1, 10, 100, 1000):
        lo, hi = fdp.PLDAccountant().compose(mech, steps=steps).get_epsilon_bounds(1e-5)
        assert lo <= hi
        assert hi >= previous
        previous = hi


def test_monotone_in_sampling_rate_and_noise():
    def eps(sigma, p):
        return fdp.PLDAccountant().compose(fdp.Gaussian(noise_multiplier=sigma, sampling_rate=p), steps=200).get_epsilon(1e-5)

    assert eps(1.0, 0.01) < eps(1.0, 0.02) < eps(1.0, 0.05)
    assert eps(2.0, 0.02) < eps(1.0, 0.02) < eps(0.8, 0.02)


def test_heterogeneous_composition_is_commutative():
    a = fdp.Gaussian(noise_multiplier=1.0, sampling_rate=0.01)
    b = fdp.Gaussian(noise_multiplier=2.0, sampling_rate=0.1)
    ab = fdp.PLDAccountant().compose(a, steps=300).compose(b, steps=50)
    ba = fdp.PLDAccountant().compose(b, steps=50).compose(a, steps=300)
    lo1, hi1 = ab.get_epsilon_bounds(1e-6)
    lo2, hi2 = ba.get_epsilon_bounds(1e-6)
    assert max(lo1, lo2) <= min(hi1, hi2)
    # and composing in pieces equals composing at once
    pieces = fdp.PLDAccountant().compose(a, steps=100).compose(a, steps=200)
    assert pieces.get_epsilon(1e-6) == pytest.approx(fdp.PLDAccountant().compose(a, steps=300).get_epsilon(1e-6), rel=1e-12)


def test_json_round_trip():
    acc = fdp.PLDAccountant(grid_scale=0.03).compose(fdp.Gaussian(noise_multiplier=1.1, sampling_rate=0.01), steps=100)
    again = fdp.PLDAccountant.from_json(acc.to_json())
    assert again.events == acc.events
    assert again.get_epsilon(1e-5) == acc.get_epsilon(1e-5)
    with pytest.raises(ValueError, match="format"):
        fdp.PLDAccountant.from_json('{"format": "other"}')


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda a: a.get_epsilon(float("nan")), "delta"),
        (lambda a: a.get_epsilon(0.0), "delta"),
        (lambda a: a.get_epsilon(1.0), "delta"),
        (lambda a: a.get_delta(-1.0), "epsilon"),
        (lambda a: a.get_delta(float("inf")), "epsilon"),
        (lambda a: a.compose(fdp.Gaussian(noise_multiplier=1.0), steps=0), "steps"),
        (lambda a: a.compose(fdp.Gaussian(noise_multiplier=1.0), steps=10**12), "steps"),
        (lambda a: a.compose("gaussian", steps=1), "mechanism"),
    ],
)
def test_bad_input_raises_value_error(call, match):
    acc = fdp.PLDAccountant().compose(fdp.Gaussian(noise_multiplier=1.0), steps=1)
    with pytest.raises(ValueError, match=match):
        call(acc)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"noise_multiplier": 0.0}, "noise_multiplier"),
        ({"noise_multiplier": -1.0}, "noise_multiplier"),
        ({"noise_multiplier": float("nan")}, "noise_multiplier"),
        ({"noise_multiplier": 1.0, "sampling_rate": 0.0}, "sampling_rate"),
        ({"noise_multiplier": 1.0, "sampling_rate": 1.5}, "sampling_rate"),
    ],
)
def test_gaussian_validates(kwargs, match):
    with pytest.raises(ValueError, match=match):
        fdp.Gaussian(**kwargs)


def test_empty_accountant_is_refused():
    with pytest.raises(ValueError, match="compose"):
        fdp.PLDAccountant().get_epsilon(1e-5)


@pytest.mark.parametrize(
    "sigma, p, steps",
    [(1e-6, 1.0, 10), (1e-6, 0.01, 10), (1e6, 1.0, 10), (1e6, 0.01, 10), (1.0, 1e-12, 1000)],
)
def test_extreme_parameters_give_finite_bracketing_answers(sigma, p, steps):
    lo, hi = fdp.PLDAccountant().compose(fdp.Gaussian(noise_multiplier=sigma, sampling_rate=p), steps=steps).get_epsilon_bounds(1e-5)
    assert np.isfinite(lo) and np.isfinite(hi) and 0.0 <= lo <= hi
    if p == 1.0:
        mu = math.sqrt(steps) / sigma
        exact = 0.0 if gdp_delta(0.0, mu) <= 1e-5 else gdp_epsilon(1e-5, mu)
        assert lo <= exact * (1 + 1e-9) and exact <= hi * (1 + 1e-9)


def test_screening_keeps_both_directions_sound():
    """The add direction leads at small eps for subsampled Gaussians: bounds must still bracket
    the single-step exact value, whichever direction the coarse screen picks."""
    mech = fdp.Gaussian(noise_multiplier=0.8, sampling_rate=0.05)
    acc = fdp.PLDAccountant().compose(mech, steps=1)
    for delta in (1e-2, 1e-4, 1e-7):
        exact = optimize.brentq(
            lambda e: max(float(mech.delta(e, Direction.REMOVE)), float(mech.delta(e, Direction.ADD))) - delta,
            0.0, 30.0, xtol=1e-12)
        lo, hi = acc.get_epsilon_bounds(delta)
        assert lo <= exact * (1 + 1e-9) and exact <= hi * (1 + 1e-9)


def test_bounds_wider_than_asked_come_with_a_warning_that_says_what_to_do():
    acc = fdp.PLDAccountant(grid_spacing=0.01).compose(
        fdp.Gaussian(noise_multiplier=0.8, sampling_rate=0.01), steps=10000)
    with pytest.warns(UserWarning, match="grid_spacing") as record:
        lo, hi = acc.get_epsilon_bounds(1e-6)
    assert lo < hi < math.inf
    assert "max_refinements" not in str(record[0].message)  # a fixed grid is never refined
    # the automatic grid, held to a tolerance it cannot reach without refinement
    auto = fdp.PLDAccountant(max_refinements=0, epsilon_rtol=1e-7).compose(
        fdp.Gaussian(noise_multiplier=0.8, sampling_rate=0.01), steps=10000)
    with pytest.warns(UserWarning, match="max_refinements") as record:
        auto.get_epsilon_bounds(1e-6)
    assert "accountant=" in str(record[0].message)


def test_an_infinite_upper_bound_is_explained():
    # P-mass 1e-3 where Q has none: every delta below it has epsilon = inf
    mech = fdp.FromDistributions([0.999, 0.001], [1.0, 0.0])
    acc = fdp.PLDAccountant().compose(mech, steps=3)
    with pytest.warns(UserWarning, match="is inf"):
        lo, hi = acc.get_epsilon_bounds(1e-5)
    assert hi == math.inf


def test_a_fixed_grid_too_fine_for_the_loss_range_still_gives_a_sound_bound():
    """The step grid is cut (mass above it to +inf) instead of refusing or allocating > 4M points."""
    mech = fdp.Gaussian(noise_multiplier=0.5, sampling_rate=1.0)
    acc = fdp.PLDAccountant(grid_spacing=1e-7).compose(mech, steps=1)
    with pytest.warns(UserWarning):
        lo, hi = acc.get_epsilon_bounds(1e-5)
    exact = gdp_epsilon(1e-5, 2.0)
    assert lo <= exact <= hi


@pytest.mark.parametrize("max_points", [600, 5000])
def test_fft_composition_brackets_exact_convolution_when_the_window_is_cut(max_points: int) -> None:
    """A heavy upper tail forces the window to be cut at max_points: the pessimistic
    PLD charges the cut mass to +inf, the optimistic one lets it wrap to smaller
    losses (only lowering delta); both must bracket the exact (direct) convolution."""
    from fdp.pld.compose import compose
    from fdp.pld.pmf import DiscretePLD

    h, offset = 0.01, -20
    k = np.arange(2000) + offset
    # a valid PLD shape: most mass near zero, a polynomial tail to large losses
    pmf = np.where(k <= 0, np.exp(-0.5 * ((k + 5) / 4.0) ** 2), 0.02 * (np.abs(k) + 1.0) ** -1.5)
    pmf /= pmf.sum()
    pld = DiscretePLD(h=h, offset=offset, pmf=pmf)
    steps = 3
    exact = pmf
    for _ in range(steps - 1):
        exact = np.convolve(exact, pmf)
    exact_pld = DiscretePLD(h=h, offset=steps * offset, pmf=exact)
    upper = compose([(pld, steps)], pessimistic=True, tail_mass=1e-12, max_points=max_points)
    lower = compose([(pld, steps)], pessimistic=False, tail_mass=1e-12, max_points=max_points)
    assert upper.pmf.size <= max_points and lower.pmf.size <= max_points
    eps = np.linspace(0.0, 50.0, 101)
    truth = exact_pld.delta(eps)
    assert np.all(upper.delta(eps) >= truth - 1e-12)
    assert np.all(lower.delta(eps) <= truth + 1e-12)
    if max_points == 600:  # cut: the wrapped tail is not charged to the lower bound
        assert upper.p_inf > 1e-3
        assert lower.delta(1.0) > 0.5 * truth[2]


@pytest.mark.parametrize("h", [5.42e-5, 2e-4, 1e-3])
@pytest.mark.parametrize("direction", list(Direction))
def test_merging_junction_stays_below_exact_delta(h, direction):
    """At p = 0.001 the loss density rises over a few cells from its hard edge, where the
    two merging sweeps meet; the leftover carry is balanced against placed atoms there
    (not rounded down). Every such merge must keep delta below the exact one."""
    mech = fdp.Gaussian(noise_multiplier=1.0, sampling_rate=0.001)
    lo, hi = mech.loss_range(direction, 1e-18)
    cells = mech.loss_cells(direction, Grid.covering(lo, hi, h), pessimistic=False)
    opt = discretise_optimistic(cells)
    eps = np.concatenate([np.linspace(-2e-3, 2e-3, 101), np.geomspace(1e-3, 5.0, 60)])
    exact = subsampled_gaussian_delta(eps, mech.mu, 0.001, direction)
    assert np.all(opt.delta(eps) <= exact * (1 + 1e-12) + 1e-16)
    assert opt.pmf.sum() <= 1.0 + 1e-12


def test_merging_lower_bound_needs_no_refinement_at_long_horizons():
    """q = 0.001, sigma = 1, T = 1e5 (the fourth setting of benchmarks/accountant.py): with the junction
    balanced, the automatic grid's lower bound is within 0.1 % of its upper bound
    (it was 0.3 % when the leftover carry was rounded down: 5e-8 of mean loss a step)."""
    from fdp.pld.queries import tail_budget as _tail_budget

    acc = fdp.PLDAccountant(max_refinements=0).compose(
        fdp.Gaussian(noise_multiplier=1.0, sampling_rate=0.001), 100_000)
    lower, upper = acc.get_epsilon_bounds(1e-6)  # the automatic grid only (tilted: round-off ~0)
    finer_upper = acc._side(Direction.REMOVE, True, _tail_budget(1e-6), 2).epsilon(1e-6)
    assert lower <= finer_upper  # a finer grid's upper bound is still above the lower one
    assert upper - lower <= 1e-3 * upper


def test_delta_bounds_are_refined_to_the_epsilon_tolerance():
    """q = 0.01024, sigma = 0.6, T = 1465: refined, the upper curve reaches the lower
    bound within epsilon_rtol * eps of eps, i.e. about the width of the epsilon
    bracket, and the refined bracket is never wider than a fixed grid's."""
    acc = fdp.PLDAccountant().compose(fdp.Gaussian(noise_multiplier=0.6, sampling_rate=256 / 25000), 1465)
    eps_lo, eps_hi = acc.get_epsilon_bounds(1e-5)
    lo, hi = acc.get_delta_bounds(eps_hi)
    assert lo <= 1e-5 * (1 + 1e-9) and hi >= lo  # eps_hi is certified at delta = 1e-5
    assert (hi - lo) / hi < 0.02
    fixed = fdp.PLDAccountant(grid_spacing=acc._plan(Direction.REMOVE, 1e-15, 0).h)
    fixed.compose(fdp.Gaussian(noise_multiplier=0.6, sampling_rate=256 / 25000), 1465)
    flo, fhi = fixed.get_delta_bounds(eps_hi)  # a fixed grid is not refined
    assert flo <= hi and lo <= fhi and (fhi - flo) >= (hi - lo)
