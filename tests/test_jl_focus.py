"""A query's focus refines the JL Z-partition where single steps decide the answer.

Reference: the Z-quadrature of delta (fdp.JL.delta, refined around the step of the
integrand; it matches mpmath to ~1e-15 there, see test_jl_second_order.py).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_budget import examples

import fdp
from fdp.mechanisms.random_sensitivity.cells import FOCUS_MIN_MU, FOCUS_REL, focus_window, partition
from fdp.mechanisms.random_sensitivity.laws import ChiLaw
from fdp.pld.cells import Direction, Grid
from fdp.pld.discretise import discretise_optimistic, discretise_pessimistic


def _mu(loss, p):
    return math.sqrt(2 * (loss - math.log(p)))


def test_focus_window_covers_the_components_that_reach_the_focus():
    sigma, p = 0.6, 0.01
    a, b = 1e4, 2e4
    z_a, z_b = focus_window((a, b), sigma, p, Direction.REMOVE)
    assert z_a < sigma * _mu(a, p) and sigma * _mu(b, p) < z_b
    # ... with the margin of the noise (+-6 in mu) and of the other steps (1 %), not much more
    lo, hi = sigma * (_mu(a, p) * 0.99 - 6), sigma * (_mu(b, p) * 1.01 + 6)
    assert lo * 2 ** (-1 / 64) <= z_a <= lo and hi <= z_b <= hi * 2 ** (1 / 64)
    # p = 1: both directions are the same mechanism
    assert focus_window((a, b), sigma, 1.0, Direction.ADD) == focus_window((a, b), sigma, 1.0, Direction.REMOVE)


@pytest.mark.parametrize("focus,p,direction", [
    (None, 0.01, Direction.REMOVE),
    ((1e4, 2e4), 0.01, Direction.ADD),  # add's loss is below -log(1 - p): no Z reaches 1e4
    ((10.0, 20.0), 0.01, Direction.REMOVE),  # mu ~ 7: the bulk, smooth on the cells' scale
    ((math.nan, 1e4), 0.01, Direction.REMOVE),
    ((2e4, 1e4), 0.01, Direction.REMOVE),
])
def test_no_focus_where_there_is_nothing_to_refine(focus, p, direction):
    assert focus_window(focus, 0.6, p, direction) is None


def test_focused_partition_is_fine_in_the_window_and_keeps_all_mass():
    law, sigma, p = ChiLaw(2), 0.6, 0.01
    z_focus = focus_window((2e4, 2.05e4), sigma, p, Direction.REMOVE)
    edges, weights = partition(law, sigma, p, 1e4, z_focus)
    assert np.all(np.diff(edges) > 0)
    assert weights.sum() == pytest.approx(1.0, abs=1e-12)
    inside = (edges[:-1] >= z_focus[0]) & (edges[1:] <= z_focus[1])
    assert inside.sum() > 100
    assert np.all(edges[1:][inside] / edges[:-1][inside] <= 1 + FOCUS_REL * (1 + 1e-6))


@settings(max_examples=examples(8), deadline=None)
@given(r=st.sampled_from([1, 2, 3]), p=st.sampled_from([1.0, 0.05, 0.003]),
       a=st.floats(3e3, 5e4), width=st.floats(0.0, 0.2))
def test_focused_cells_bracket_delta_and_are_tight_in_the_focus(r, p, a, width):
    b = a * (1 + width)
    m = fdp.JL(noise_multiplier=0.6, jl_projections=r, sampling_rate=p)
    grid = Grid.covering(-1.0, 3 * b, 4.0)
    eps = np.array([0.5 * a, a, 0.5 * (a + b), b, 2 * b])
    exact = m.delta(eps, Direction.REMOVE)
    brackets = {}
    for focus in (None, (a, b)):
        hi = discretise_pessimistic(m.loss_cells(Direction.REMOVE, grid, pessimistic=True, focus=focus))
        lo = discretise_optimistic(m.loss_cells(Direction.REMOVE, grid, pessimistic=False, focus=focus))
        d_hi = np.array([float(hi.delta(e)) for e in eps])
        d_lo = np.array([float(lo.delta(e)) for e in eps])
        assert np.all(d_hi >= exact * (1 - 1e-12)) and np.all(d_lo <= exact * (1 + 1e-12))
        brackets[focus] = (d_hi - d_lo) / exact
    if _mu(a, p) >= FOCUS_MIN_MU:  # narrower in the focus; far narrower where mu >> 1 / FOCUS_REL^(1/2)
        assert np.all(brackets[(a, b)][1:4] < brackets[None][1:4])
        if _mu(a, p) >= 150:
            assert np.all(brackets[(a, b)][1:4] < brackets[None][1:4] / 3)


@pytest.mark.parametrize("rtol,focused", [(0.05, False), (1e-3, True)])
def test_a_focused_pass_runs_only_when_the_bracket_misses_the_tolerance(monkeypatch, rtol, focused):
    """One JL step (r = 2, p = 0.05) at delta = 1e-7: the first pass ends ~0.6 % wide, so
    a focused pass (grids cut above the bracket, cells refined in it) follows at the
    default tolerance and is skipped at a 5 % one (it would cost a pass for nothing)."""
    foci = []
    original = fdp.PLDAccountant._epsilon_pass

    def recorded(self, *args, **kwargs):
        foci.append(kwargs.get("focus", args[4] if len(args) > 4 else None))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(fdp.PLDAccountant, "_epsilon_pass", recorded)
    acc = fdp.PLDAccountant(epsilon_rtol=rtol).compose(
        fdp.JL(noise_multiplier=0.6, jl_projections=2, sampling_rate=0.05), steps=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        lo, hi = acc.get_epsilon_bounds(1e-7)
    assert foci[0] is None
    assert any(f is not None for f in foci) == focused
    assert hi - lo <= rtol * hi


def test_a_capped_grid_stops_at_the_cap_and_gets_finer():
    from fdp.pld.plan import CAP_MARGIN, grid_plan, query_cap

    events = [(fdp.JL(noise_multiplier=0.6, jl_projections=2, sampling_rate=0.01), 100)]
    kwargs = dict(grid_spacing=None, grid_scale=0.04, max_points=1 << 23)
    acc = fdp.PLDAccountant().compose(*events[0])
    full = grid_plan(events, Direction.REMOVE, 1e-9, 0, sd=acc._moments(Direction.REMOVE, 1e-9), **kwargs)
    cap = query_cap((1e5, 1.2e5))
    assert cap == 1.2e5 + CAP_MARGIN and query_cap(None) is None
    capped = grid_plan(events, Direction.REMOVE, 1e-9, 0, sd=acc._moments(Direction.REMOVE, 1e-9, cap),
                       cap=cap, **kwargs)
    top = lambda g: (g.offset + g.n) * g.h  # noqa: E731
    assert top(full.grids[0]) > 10 * cap  # the heavy tail's range, far above the answer
    assert cap <= top(capped.grids[0]) <= cap + capped.h
    assert capped.h < full.h / 5  # 1.65 against 11.9


def test_delta_and_epsilon_queries_agree_on_a_heavy_tail():
    """JL r = 2, T = 100: delta(1e5) is bracketed within 0.1 % (it was [6e-9, 1.0]),
    and the epsilon query at either end of that bracket lands on the right side of 1e5."""
    acc = fdp.PLDAccountant().compose(fdp.JL(noise_multiplier=0.6, jl_projections=2, sampling_rate=0.01), steps=100)
    d_lo, d_hi = acc.get_delta_bounds(1e5)
    assert 0 < d_hi - d_lo <= 1e-3 * d_hi
    # delta(1e5) <= d_hi, so eps(d_hi) <= 1e5; delta(1e5) >= d_lo, so eps(d_lo) >= 1e5
    assert acc.get_epsilon_bounds(d_hi)[0] <= 1e5 <= acc.get_epsilon_bounds(d_lo)[1]


def _mu_gdp_delta(mu: float, eps: float) -> float:
    import mpmath as mp

    with mp.workdps(40):
        mu, eps = mp.mpf(mu), mp.mpf(eps)
        return float(mp.ncdf(-eps / mu + mu / 2) - mp.e**eps * mp.ncdf(-eps / mu - mu / 2))


@settings(max_examples=examples(25), deadline=None)
@given(sigma=st.floats(0.3, 2.0), steps=st.integers(2, 30), eps=st.floats(0.0, 4.0), b=st.floats(-39.5, 0.0))
def test_any_cap_keeps_both_bounds_of_a_gaussian(sigma, steps, eps, b):
    """Cutting the grids at ANY cap (here 0.5 to 40, often below the answer) is sound:
    pessimistic delta >= the mu-GDP closed form >= optimistic delta."""
    acc = fdp.PLDAccountant().compose(fdp.Gaussian(noise_multiplier=sigma), steps=steps)
    focus = (b, b)  # cap = b + 40
    exact = _mu_gdp_delta(math.sqrt(steps) / sigma, eps)
    hi = float(acc._side(Direction.REMOVE, True, 1e-15, 0, 0.0, focus).delta(eps))
    lo = float(acc._side(Direction.REMOVE, False, 1e-15, 0, 0.0, focus).delta(eps))
    assert lo <= exact * (1 + 1e-9) + 1e-14 and exact <= hi * (1 + 1e-9) + 1e-14


@settings(max_examples=examples(10), deadline=None)
@given(r=st.sampled_from([1, 2, 5]), p=st.sampled_from([1.0, 0.02]), eps=st.floats(0.0, 3e3),
       b=st.floats(-39.0, 5e3))
def test_any_cap_and_focus_keep_both_bounds_of_one_jl_step(r, p, eps, b):
    m = fdp.JL(noise_multiplier=0.7, jl_projections=r, sampling_rate=p)
    acc = fdp.PLDAccountant().compose(m, steps=1)
    exact = float(m.delta(eps, Direction.REMOVE))
    for focus in ((b, b), (b, b + 100.0)):
        hi = float(acc._side(Direction.REMOVE, True, 1e-12, 0, 0.0, focus).delta(eps))
        lo = float(acc._side(Direction.REMOVE, False, 1e-12, 0, 0.0, focus).delta(eps))
        assert lo <= exact * (1 + 1e-9) + 1e-15 and exact <= hi * (1 + 1e-9) + 1e-15


def test_a_focus_beyond_float_range_is_no_focus_and_the_query_answers():
    """eps = 1e308 overflowed 2 (eps - log p) in the focus window (a red team's find)."""
    assert focus_window((1e308, 1e308), 0.6, 0.01, Direction.REMOVE) is None
    lo, hi = fdp.PLDAccountant().compose(fdp.JL(noise_multiplier=0.6, jl_projections=2, sampling_rate=0.01),
                                         steps=1).get_delta_bounds(1e308)
    assert lo == 0.0 and 0.0 <= hi < 1e-12


def test_an_infinite_upper_side_is_still_tilted():
    """Its round-off shift reads 0 at eps = inf (the charge sits in p_inf, clipped at 1), so
    with tilts chosen per side it was no longer tilted and the bound stayed inf (a red
    team's find; before per-side tilts, and now, the tilted pass brings it to ~1.05e11)."""
    acc = fdp.PLDAccountant().compose(
        fdp.JL(noise_multiplier=1.3365593465290988, jl_projections=3, sampling_rate=0.01), steps=213)
    with pytest.warns(UserWarning, match="wider than the relative tolerance"):
        lo, hi = acc.get_epsilon_bounds(1.1699318022581615e-12)
    assert 0 < lo <= hi < math.inf
