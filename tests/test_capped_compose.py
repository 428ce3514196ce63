"""fdp.pld.capped_compose: composition with the partial sums cut at a query's cap.

References: exact rational convolution (fractions) weighed in 50-digit mpmath, and the
mu-GDP closed form. The cut is sound at ANY cap (also below the answer), so the caps
drawn here are anywhere; only tightness needs the margin of 40.
"""

from __future__ import annotations

import math
import warnings
from fractions import Fraction

import mpmath as mp
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis_budget import examples

import fdp
from fdp.pld.capped_compose import compose_capped, compose_for_query
from fdp.pld.cells import Direction, Grid
from fdp.pld.compose import compose
from fdp.pld.discretise import discretise_optimistic, discretise_pessimistic
from fdp.pld.pmf import DiscretePLD


def _exact_delta(pmf: np.ndarray, offset: int, p_inf: float, h: float, steps: int, eps: float) -> float:
    """delta(eps) of the exact ``steps``-fold composition: rational convolution, 50 digits."""
    x = [Fraction(float(v)) for v in pmf]
    inf = Fraction(float(p_inf))
    total, total_inf = [Fraction(1)], Fraction(0)
    for _ in range(steps):
        conv = [Fraction(0)] * (len(total) + len(x) - 1)
        for i, a in enumerate(total):
            if a:
                for j, b in enumerate(x):
                    conv[i + j] += a * b
        total_inf = total_inf * (sum(x) + inf) + inf * sum(total)
        total = conv
    with mp.workdps(50):
        acc = mp.mpf(total_inf.numerator) / total_inf.denominator
        for k, mass in enumerate(total):
            loss = mp.mpf(steps * offset + k) * mp.mpf(h)
            if mass and loss > eps:
                acc += mp.mpf(mass.numerator) / mass.denominator * (1 - mp.e ** (mp.mpf(eps) - loss))
        return float(acc)


@settings(max_examples=examples(40), deadline=None)
@given(seed=st.integers(0, 2**32 - 1), steps=st.integers(2, 7), size=st.integers(2, 12),
       offset=st.integers(-6, 3), cap_at=st.floats(-0.2, 1.2), eps_at=st.floats(0.0, 1.0),
       p_inf=st.sampled_from([0.0, 1e-3]))
def test_both_bounds_hold_against_exact_enumeration_at_any_cap(seed, steps, size, offset, cap_at, eps_at, p_inf):
    rng = np.random.default_rng(seed)
    pmf = rng.random(size) ** 3
    pmf *= (1 - p_inf) / pmf.sum()
    h = 0.25
    pld = DiscretePLD(h=h, offset=offset, pmf=pmf, p_inf=p_inf)
    lo_support, hi_support = steps * offset * h, steps * (offset + size - 1) * h
    cap = lo_support + cap_at * (hi_support - lo_support)
    eps = max(0.0, min(cap, lo_support + eps_at * (hi_support - lo_support)))
    exact = _exact_delta(pmf, offset, p_inf, h, steps, eps)
    upper = float(compose_capped([(pld, steps)], cap, pessimistic=True, max_points=1 << 20).delta(eps))
    lower = float(compose_capped([(pld, steps)], cap, pessimistic=False, max_points=1 << 20).delta(eps))
    assert lower <= exact <= upper
    top_one = (offset + size - 1) * h
    if cap >= max(top_one, steps * top_one):  # no partial sum reaches above the cap: only round-off
        assert upper - lower <= 1e-12


def _mu_gdp_delta(mu: float, eps: float) -> float:
    with mp.workdps(40):
        mu, eps = mp.mpf(mu), mp.mpf(eps)
        return float(mp.ncdf(-eps / mu + mu / 2) - mp.e**eps * mp.ncdf(-eps / mu - mu / 2))


def _gaussian_steps(sigma: float, h: float = 2e-3) -> tuple[DiscretePLD, DiscretePLD]:
    m = fdp.Gaussian(noise_multiplier=sigma)
    lo, hi = m.loss_range(Direction.REMOVE, 1e-16)
    offset = math.floor(lo / h)
    grid = Grid(h=h, offset=offset, n=math.ceil(hi / h) - offset)
    cells = m.loss_cells(Direction.REMOVE, grid, pessimistic=True)
    return discretise_pessimistic(cells), discretise_optimistic(cells)


@settings(max_examples=examples(20), deadline=None)
@example(sigma=0.75, steps=44, eps=0.0, margin=40.0)  # delta ~ 1: the relative charge counts (CI)
@given(sigma=st.floats(0.5, 3.0), steps=st.integers(2, 200), eps=st.floats(0.0, 6.0), margin=st.floats(-3.0, 45.0))
def test_both_bounds_hold_for_composed_gaussians_and_tighten_with_the_margin(sigma, steps, eps, margin):
    up, down = _gaussian_steps(sigma)
    cap = eps + margin
    exact = _mu_gdp_delta(math.sqrt(steps) / sigma, eps)
    upper_pld = compose_capped([(up, steps)], cap, pessimistic=True, max_points=1 << 22)
    lower_pld = compose_capped([(down, steps)], cap, pessimistic=False, max_points=1 << 22)
    upper, lower = float(upper_pld.delta(eps)), float(lower_pld.delta(eps))
    assert lower <= exact * (1 + 1e-9) + 1e-14 and exact <= upper * (1 + 1e-9) + 1e-14
    if margin >= 40:  # the cut costs <= e^-40 per partial sum: the discretisation's width and the round-off
        plain_hi = float(compose([(up, steps)], pessimistic=True).delta(eps))
        plain_lo = float(compose([(down, steps)], pessimistic=False).delta(eps))
        # round-off: the chain's l1 bound (shifted out) and the final summation's relative charge
        round_off = upper_pld.round_off + lower_pld.round_off + (upper_pld.rel_error + lower_pld.rel_error) * upper
        assert upper - lower <= 2 * (plain_hi - plain_lo) + round_off + 1e-12


def _heavy_tail(points: int = 3000, h: float = 1.0) -> DiscretePLD:
    """Mass ~ k^-1.2 on losses 0..points-1 (a polynomial tail, like the JL mechanism's)."""
    k = np.arange(points, dtype=np.float64)
    pmf = (k + 1.0) ** -1.2
    return DiscretePLD(h=h, offset=0, pmf=pmf / pmf.sum())


def test_a_query_gets_the_capped_composition_where_the_window_does_not_fit():
    """10 heavy-tailed steps need 30,000 points; at max_points = 8,192 compose cuts its
    window and charges the Chernoff bound there. The capped composition fits (cap 140)."""
    pld = _heavy_tail()
    focus, cap = (100.0, 100.0), 140.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = compose([(pld, 10)], pessimistic=True, max_points=8192)
        chosen = compose_for_query([(pld, 10)], focus, cap, pessimistic=True, tail_mass=1e-15, max_points=8192)
    capped = compose_capped([(pld, 10)], cap, pessimistic=True, max_points=8192)
    assert chosen is not plain and chosen.delta(100.0) == capped.delta(100.0)
    exact_lower = float(compose([(pld, 10)], pessimistic=False, max_points=1 << 16).delta(100.0))
    assert exact_lower <= capped.delta(100.0) <= exact_lower + 1e-9  # plain: 8e-3 above it
    assert plain.delta(100.0) - exact_lower > 1e-3
    # no query, or a window that fits: compose itself
    assert compose_for_query([(pld, 10)], None, None, pessimistic=True, tail_mass=1e-15,
                             max_points=8192).delta(100.0) == plain.delta(100.0)
    roomy = compose_for_query([(pld, 10)], focus, cap, pessimistic=True, tail_mass=1e-15, max_points=1 << 16)
    assert roomy.delta(100.0) == compose([(pld, 10)], pessimistic=True, max_points=1 << 16).delta(100.0)


def test_inputs_with_charges_or_mixed_spacings_are_refused():
    pld = _heavy_tail(10)
    charged = compose([(pld, 2)], pessimistic=True)
    with pytest.raises(ValueError, match="single-step PLDs without charges"):
        compose_capped([(charged, 2)], 5.0, pessimistic=True, max_points=1000)
    with pytest.raises(ValueError, match="same grid spacing"):
        compose_capped([(pld, 2), (_heavy_tail(10, h=0.5), 1)], 5.0, pessimistic=True, max_points=1000)
    with pytest.raises(ValueError, match="more than max_points=10"):
        compose_capped([(pld, 4)], 1e9, pessimistic=True, max_points=10)


def test_a_heavy_tailed_delta_query_whose_window_does_not_fit_gets_a_finite_upper_bound():
    """JL r = 3, p = 0.01, 44 steps at eps = 4e5: the focused pass's window of 44 capped
    heavy tails needs more than max_points; the upper bound was 0.85 (the tilted window's
    charge), now it is a few times the truth, which lies above delta of one step."""
    mech = fdp.JL(noise_multiplier=0.7573823938936274, jl_projections=3, sampling_rate=0.01)
    lower, upper = fdp.PLDAccountant().compose(mech, steps=44).get_delta_bounds(4e5)
    one_step = float(mech.delta(4e5))  # a lower bound on the composition's delta (post-processing)
    assert 0 < one_step <= upper < 1e-7
    assert lower <= upper
